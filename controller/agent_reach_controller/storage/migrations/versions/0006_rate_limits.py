"""Rate limits: a step's bucket key, GCRA buckets for the Postgres fallback, learned pauses.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("rate_key", sa.String(32), nullable=True))
    op.create_table(
        "rate_buckets",
        sa.Column("bucket", sa.String(200), nullable=False),
        sa.Column("tat", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("bucket", name=op.f("pk_rate_buckets")),
    )
    op.create_table(
        "tool_pauses",
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tool", name=op.f("pk_tool_pauses")),
    )


def downgrade() -> None:
    op.drop_table("tool_pauses")
    op.drop_table("rate_buckets")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("rate_key")
