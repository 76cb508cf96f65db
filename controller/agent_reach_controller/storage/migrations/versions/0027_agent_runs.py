"""Agent runs: the runs, their conversations, and the round a task is.

`runs` and `run_messages` are new; `tasks.run_id` is a new nullable column. Nothing existing
changes shape: replicas of the previous release keep working (they never set run_id).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("principal", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(12)),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("agent_version", sa.String(12), nullable=False),
        sa.Column("subject", sa.String(256)),
        sa.Column("context", _JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("end_reason", sa.String(32)),
        sa.Column("round", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("task_id", sa.String(36)),
        sa.Column("limits", _JSON, nullable=False),
        sa.Column("tools", _JSON, nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("cost", sa.Float(), nullable=False, server_default="0"),
        sa.Column("answer", sa.Text()),
        sa.Column("ungrounded_claims", _JSON),
        sa.Column("error", _JSON),
        sa.Column("calls", _JSON, nullable=False),
        sa.Column("turn_start", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("updated_at", _TIME, nullable=False),
        sa.Column("finished_at", _TIME),
        sa.Column("deadline", _TIME),
        sa.PrimaryKeyConstraint("run_id", name="pk_runs"),
    )
    op.create_index("ix_runs_tenant_run_id", "runs", ["tenant", "run_id"])
    op.create_table(
        "run_messages",
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("message", _JSON, nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_run_messages"),
    )
    op.add_column("tasks", sa.Column("run_id", sa.String(36)))


def downgrade() -> None:
    op.drop_column("tasks", "run_id")
    op.drop_table("run_messages")
    op.drop_index("ix_runs_tenant_run_id", table_name="runs")
    op.drop_table("runs")
