"""Initial schema: tools, tasks, steps, events, idempotency keys.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Written out here rather than imported, so this migration never changes when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def ts(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "tools",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.String(16), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        ts("created_at"),
        sa.PrimaryKeyConstraint("name", "version", name=op.f("pk_tools")),
    )
    op.create_table(
        "tasks",
        sa.Column("task_id", sa.String(36), nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("parent_span_id", sa.String(16), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("principal", sa.String(128), nullable=False),
        sa.Column("goal", sa.Text(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("request", JSON, nullable=False),
        sa.Column("context", JSON, nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
        ts("created_at"),
        ts("updated_at"),
        ts("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_tasks")),
    )
    op.create_index("ix_tasks_status_created_at", "tasks", ["status", "created_at"])
    op.create_index(op.f("ix_tasks_trace_id"), "tasks", ["trace_id"])
    op.create_table(
        "steps",
        sa.Column("id", BIGID, autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(36), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("tool_version", sa.String(16), nullable=False),
        sa.Column("connector", sa.String(64), nullable=False),
        sa.Column("args", JSON, nullable=False),
        sa.Column("resolved_args", JSON, nullable=True),
        sa.Column("depends_on", JSON, nullable=False),
        sa.Column("when_expr", sa.Text(), nullable=True),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        ts("not_before", nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        ts("lease_expires_at", nullable=True),
        sa.Column("idempotency_key", sa.String(160), nullable=False),
        sa.Column("output", JSON, nullable=True),
        sa.Column("error", JSON, nullable=True),
        sa.Column("receipt", JSON, nullable=True),
        ts("created_at"),
        ts("updated_at"),
        ts("started_at", nullable=True),
        ts("finished_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.task_id"],
            name=op.f("fk_steps_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_steps")),
        sa.UniqueConstraint("task_id", "step_id", name=op.f("uq_steps_task_id_step_id")),
    )
    # Partial indexes: the claim query and the lease reaper only ever look at these rows.
    op.create_index(
        "ix_steps_ready",
        "steps",
        ["connector", "id"],
        postgresql_where=sa.text("status = 'ready'"),
        sqlite_where=sa.text("status = 'ready'"),
    )
    op.create_index(
        "ix_steps_running_lease",
        "steps",
        ["lease_expires_at"],
        postgresql_where=sa.text("status = 'running'"),
        sqlite_where=sa.text("status = 'running'"),
    )
    op.create_table(
        "events",
        sa.Column("id", BIGID, autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(36), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("from_status", sa.String(24), nullable=True),
        sa.Column("to_status", sa.String(24), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("data", JSON, nullable=True),
        ts("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_task_id_id", "events", ["task_id", "id"])
    op.create_table(
        "idempotency_keys",
        sa.Column("principal", sa.String(128), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(36), nullable=False),
        ts("created_at"),
        sa.PrimaryKeyConstraint("principal", "key", name=op.f("pk_idempotency_keys")),
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    op.drop_index("ix_events_task_id_id", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_steps_running_lease", table_name="steps")
    op.drop_index("ix_steps_ready", table_name="steps")
    op.drop_table("steps")
    op.drop_index(op.f("ix_tasks_trace_id"), table_name="tasks")
    op.drop_index("ix_tasks_status_created_at", table_name="tasks")
    op.drop_table("tasks")
    op.drop_table("tools")
