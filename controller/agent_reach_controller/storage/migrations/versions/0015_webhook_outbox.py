"""Webhook outbox: approval requests announced after commit, retried until acknowledged.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING = "delivered_at IS NULL AND given_up_at IS NULL"


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.create_table(
        "webhook_outbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("payload", json, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("given_up_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(300), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_outbox"),
    )
    op.create_index(
        "ix_webhook_outbox_pending",
        "webhook_outbox",
        ["due_at"],
        postgresql_where=sa.text(_PENDING),
        sqlite_where=sa.text(_PENDING),
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_outbox_pending", table_name="webhook_outbox")
    op.drop_table("webhook_outbox")
