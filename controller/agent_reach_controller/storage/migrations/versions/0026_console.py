"""The web console: sign-in sessions, and the indexes its task list filters walk.

`console_sessions` is new. The three indexes serve `GET /v1/tasks` filtered by status, principal
or tool as keyset walks newest first, so a page costs the same at a million tasks as at a
hundred. Nothing existing changes shape: replicas of the previous release keep working.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("principal", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("roles", _JSON, nullable=False),
        sa.Column("key_id", sa.String(12)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("secret_hash", name="pk_console_sessions"),
    )
    op.create_index("ix_console_sessions_expires_at", "console_sessions", ["expires_at"])
    op.create_index("ix_console_sessions_key_id", "console_sessions", ["key_id"])
    op.create_index("ix_tasks_tenant_status_task_id", "tasks", ["tenant", "status", "task_id"])
    op.create_index(
        "ix_tasks_tenant_principal_task_id", "tasks", ["tenant", "principal", "task_id"]
    )
    op.create_index("ix_steps_tenant_tool_task_id", "steps", ["tenant", "tool", "task_id"])


def downgrade() -> None:
    op.drop_index("ix_steps_tenant_tool_task_id", table_name="steps")
    op.drop_index("ix_tasks_tenant_principal_task_id", table_name="tasks")
    op.drop_index("ix_tasks_tenant_status_task_id", table_name="tasks")
    op.drop_table("console_sessions")
