"""Long-term memory: what runs learned about a subject, searchable, and deletable for real.

`memories` is new, with its full-text index: a stored tsvector and a GIN index on Postgres, an
FTS5 table keyed by the memory's rowid on SQLite. `memory_keys` holds the audit HMAC key a
deployment did not configure. Nothing existing changes shape.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "memories",
        sa.Column("memory_id", sa.String(36), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("value", _JSON),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False, server_default="1"),
        sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("source", _JSON),
        sa.Column("written_by", sa.String(160), nullable=False),
        sa.Column("mark", sa.String(64), nullable=False),
        sa.Column("embedding", sa.LargeBinary()),
        sa.Column("embedding_model", sa.String(128)),
        sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("updated_at", _TIME, nullable=False),
        sa.Column("expires_at", _TIME),
        sa.PrimaryKeyConstraint("memory_id", name="pk_memories"),
        sa.UniqueConstraint(
            "tenant", "subject", "type", "key", name="uq_memories_tenant_subject_type_key"
        ),
    )
    op.create_index(
        "ix_memories_expires_at",
        "memories",
        ["expires_at"],
        postgresql_where=sa.text("expires_at IS NOT NULL"),
        sqlite_where=sa.text("expires_at IS NOT NULL"),
    )
    op.create_index("ix_memories_tenant_updated_at", "memories", ["tenant", "updated_at"])
    if postgres:
        op.execute(
            "ALTER TABLE memories ADD COLUMN search tsvector GENERATED ALWAYS AS "
            "(to_tsvector('english', key || ' ' || text)) STORED"
        )
        op.execute("CREATE INDEX ix_memories_search ON memories USING gin (search)")
    else:
        op.execute(
            "CREATE VIRTUAL TABLE memories_fts USING fts5(key, text, tokenize = 'porter unicode61')"
        )
    op.create_table(
        "memory_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_memory_keys"),
    )


def downgrade() -> None:
    op.drop_table("memory_keys")
    if op.get_bind().dialect.name != "postgresql":
        op.execute("DROP TABLE memories_fts")
    op.drop_index("ix_memories_tenant_updated_at", table_name="memories")
    op.drop_index("ix_memories_expires_at", table_name="memories")
    op.drop_table("memories")
