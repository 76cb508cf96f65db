"""The live tool catalogue: current version per tool, every change, one revision counter.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tool_heads",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.String(16), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_tool_heads"),
    )
    op.create_table(
        "tool_changes",
        sa.Column("revision", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("version", sa.String(16), nullable=True),
        sa.Column("principal", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("revision", name="pk_tool_changes"),
    )
    op.create_index("ix_tool_changes_name", "tool_changes", ["name"])
    catalog_state = op.create_table(
        "catalog_state",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_catalog_state"),
    )
    op.bulk_insert(catalog_state, [{"id": 1, "revision": 0}])


def downgrade() -> None:
    op.drop_table("catalog_state")
    op.drop_index("ix_tool_changes_name", table_name="tool_changes")
    op.drop_table("tool_changes")
    op.drop_table("tool_heads")
