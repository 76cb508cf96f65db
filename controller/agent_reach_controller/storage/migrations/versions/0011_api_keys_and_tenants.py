"""API keys, the tenant each task belongs to, and the key that submitted each step.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(12), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("roles", json, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
    )
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(
            sa.Column("tenant", sa.String(128), nullable=False, server_default="default")
        )
    op.create_index("ix_tasks_tenant_task_id", "tasks", ["tenant", "task_id"])
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("key_id", sa.String(12), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("key_id")
    op.drop_index("ix_tasks_tenant_task_id", table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("tenant")
    op.drop_table("api_keys")
