"""Executor pool tokens and sessions; the poll that took a lease.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "executor_tokens",
        sa.Column("token_id", sa.String(12), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("connectors", _JSON),
        sa.Column("tools", _JSON),
        sa.Column("tenant", sa.String(128)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("token_id", name="pk_executor_tokens"),
    )
    op.create_table(
        "executor_sessions",
        sa.Column("id", sa.String(16), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("lease_key", sa.String(64), nullable=False),
        sa.Column("credential", sa.String(160), nullable=False),
        sa.Column("pool", sa.String(128), nullable=False),
        sa.Column("scope", _JSON, nullable=False),
        sa.Column("executor_id", sa.String(128), nullable=False),
        sa.Column("connectors", _JSON, nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True)),
        sa.Column("end_reason", sa.String(32)),
        sa.PrimaryKeyConstraint("id", name="pk_executor_sessions"),
    )
    op.create_index(
        "ix_executor_sessions_live",
        "executor_sessions",
        ["expires_at"],
        postgresql_where=sa.text("ended_at IS NULL"),
        sqlite_where=sa.text("ended_at IS NULL"),
    )
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("lease_seq", sa.BigInteger()))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("lease_seq")
    op.drop_index("ix_executor_sessions_live", table_name="executor_sessions")
    op.drop_table("executor_sessions")
    op.drop_table("executor_tokens")
