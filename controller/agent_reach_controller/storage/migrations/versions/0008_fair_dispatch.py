"""Dispatch order: a step's priority and its tenant, with the fair-claim index.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_QUEUED = "status = 'ready'"


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(
            sa.Column("tenant", sa.String(128), nullable=False, server_default="default")
        )
    op.create_index(
        "ix_steps_ready_fair",
        "steps",
        ["tenant", sa.text("priority DESC"), "id"],
        postgresql_where=sa.text(_QUEUED),
        sqlite_where=sa.text(_QUEUED),
    )


def downgrade() -> None:
    op.drop_index("ix_steps_ready_fair", table_name="steps")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("tenant")
        batch.drop_column("priority")
