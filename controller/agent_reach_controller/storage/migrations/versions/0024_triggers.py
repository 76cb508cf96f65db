"""Triggers: named, signed entry points that start a stored plan template with an event.

Two new tables; nothing existing changes, so replicas of the previous release keep working.
Events are deduplicated through `idempotency_keys` (principal `trigger:<name>`, key the event id).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "triggers",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(12)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_triggers"),
    )
    op.create_table(
        "trigger_versions",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("template", _JSON, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", "version", name="pk_trigger_versions"),
    )


def downgrade() -> None:
    op.drop_table("trigger_versions")
    op.drop_table("triggers")
