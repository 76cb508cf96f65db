"""Indexes for retention: finished tasks by when they finished, idempotency keys by task.

The retention sweep takes the oldest finished tasks in small batches and deletes them with their
steps, events, charges and idempotency keys; these indexes keep each batch a short read.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_tasks_finished_at",
        "tasks",
        ["finished_at"],
        postgresql_where=sa.text("finished_at IS NOT NULL"),
        sqlite_where=sa.text("finished_at IS NOT NULL"),
    )
    op.create_index("ix_idempotency_keys_task_id", "idempotency_keys", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_idempotency_keys_task_id", table_name="idempotency_keys")
    op.drop_index("ix_tasks_finished_at", table_name="tasks")
