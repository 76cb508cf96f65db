"""Approvals of dangerous steps: what was asked and decided, and until when.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WAITING = "status = 'awaiting_approval'"


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("approval", json, nullable=True))
        batch.add_column(sa.Column("decide_by", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_steps_awaiting_decide_by",
        "steps",
        ["decide_by"],
        postgresql_where=sa.text(_WAITING),
        sqlite_where=sa.text(_WAITING),
    )


def downgrade() -> None:
    op.drop_index("ix_steps_awaiting_decide_by", table_name="steps")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("decide_by")
        batch.drop_column("approval")
