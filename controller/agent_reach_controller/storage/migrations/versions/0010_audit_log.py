"""The append-only, hash-chained audit log, and the triggers that keep it append-only.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Columns a seal may not change (it only sets seq, prev_hash and hash on a row without a hash).
_CONTENT = ("id", "at", "actor", "tenant", "action", "target", "data")

_POSTGRES_GUARD = f"""
CREATE FUNCTION audit_log_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'audit_log is append-only: DELETE of row % refused', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'audit_log is append-only: TRUNCATE refused'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF OLD.hash IS NOT NULL THEN
        RAISE EXCEPTION 'audit_log row % is sealed: UPDATE refused', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.seq IS NULL OR NEW.prev_hash IS NULL OR NEW.hash IS NULL
       OR {" OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in _CONTENT)} THEN
        RAISE EXCEPTION 'audit_log row %: an UPDATE may only seal it (set seq, prev_hash, hash)', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$
"""

_SQLITE_GUARDS = (
    """
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: DELETE refused');
END
""",
    f"""
CREATE TRIGGER audit_log_seal_only BEFORE UPDATE ON audit_log
WHEN OLD.hash IS NOT NULL OR NEW.seq IS NULL OR NEW.prev_hash IS NULL OR NEW.hash IS NULL
     OR {" OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in _CONTENT)}
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: an UPDATE may only seal an unsealed row');
END
""",
)


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.create_table(
        "audit_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(200), nullable=False),
        sa.Column("data", json, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("prev_hash", sa.String(64), nullable=True),
        sa.Column("hash", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
        sa.UniqueConstraint("seq", name=op.f("uq_audit_log_seq")),
    )
    op.create_index(
        "ix_audit_log_unsealed",
        "audit_log",
        ["id"],
        postgresql_where=sa.text("hash IS NULL"),
        sqlite_where=sa.text("hash IS NULL"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_POSTGRES_GUARD)
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION audit_log_guard()"
        )
        op.execute(
            "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_log_guard()"
        )
    else:
        for statement in _SQLITE_GUARDS:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log")
        op.execute("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_guard()")
    else:
        op.execute("DROP TRIGGER IF EXISTS audit_log_seal_only")
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_delete")
    op.drop_index("ix_audit_log_unsealed", table_name="audit_log")
    op.drop_table("audit_log")
