"""Blast-radius caps: a task's own caps, the counters, and what each step was charged.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("caps", json, nullable=True))
    op.create_table(
        "cap_usage",
        sa.Column("scope", sa.String(200), nullable=False),
        sa.Column("effect", sa.String(64), nullable=False),
        sa.Column("bucket", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("used", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", "effect", "bucket", name=op.f("pk_cap_usage")),
    )
    op.create_table(
        "cap_charges",
        sa.Column("step_key", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("task_id", sa.String(36), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("units", json, nullable=False),
        sa.Column("charged_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["step_key"],
            ["steps.id"],
            name=op.f("fk_cap_charges_step_key_steps"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("step_key", "tool", name=op.f("pk_cap_charges")),
    )
    op.create_index("ix_cap_charges_task_id", "cap_charges", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_cap_charges_task_id", table_name="cap_charges")
    op.drop_table("cap_charges")
    op.drop_table("cap_usage")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("caps")
