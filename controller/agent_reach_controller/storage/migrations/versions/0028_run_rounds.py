"""A run's rounds: an index on the tasks that are rounds of an agent run.

Partial (`run_id IS NOT NULL`): a caller's own tasks, almost all of them, are not in it and cost
it nothing.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROUNDS = sa.text("run_id IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_tasks_run_id",
        "tasks",
        ["run_id"],
        postgresql_where=_ROUNDS,
        sqlite_where=_ROUNDS,
    )


def downgrade() -> None:
    op.drop_index("ix_tasks_run_id", table_name="tasks")
