"""Audit checkpoints: retention may remove the oldest sealed audit entries, and only those.

A checkpoint records the seq and hash of the last entry removed; the chain is verified from it as
from a genesis. The audit_log guards now let a DELETE through for sealed rows up to the newest
checkpoint's seq, and still refuse any other DELETE, any TRUNCATE and any UPDATE but a seal.
Checkpoints themselves are append-only.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CONTENT = ("id", "at", "actor", "tenant", "action", "target", "data")


def _postgres_guard(*, checkpoints: bool) -> str:
    allowed = (
        """
        IF OLD.seq IS NOT NULL
           AND OLD.seq <= (SELECT coalesce(max(seq), 0) FROM audit_checkpoints) THEN
            RETURN OLD;
        END IF;"""
        if checkpoints
        else ""
    )
    return f"""
CREATE OR REPLACE FUNCTION audit_log_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN{allowed}
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


_POSTGRES_CHECKPOINTS_GUARD = """
CREATE FUNCTION audit_checkpoints_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_checkpoints is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""

_SQLITE_NO_DELETE = """
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
WHEN {condition}
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: DELETE refused');
END
"""


def upgrade() -> None:
    op.create_table(
        "audit_checkpoints",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("entries", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_checkpoints")),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_postgres_guard(checkpoints=True))
        op.execute(_POSTGRES_CHECKPOINTS_GUARD)
        op.execute(
            "CREATE TRIGGER audit_checkpoints_append_only BEFORE UPDATE OR DELETE ON "
            "audit_checkpoints FOR EACH ROW EXECUTE FUNCTION audit_checkpoints_guard()"
        )
    else:
        op.execute("DROP TRIGGER audit_log_no_delete")
        op.execute(
            _SQLITE_NO_DELETE.format(
                condition="OLD.seq IS NULL OR OLD.seq > "
                "(SELECT coalesce(max(seq), 0) FROM audit_checkpoints)"
            )
        )
        op.execute(
            "CREATE TRIGGER audit_checkpoints_append_only BEFORE UPDATE ON audit_checkpoints "
            "BEGIN SELECT RAISE(ABORT, 'audit_checkpoints is append-only'); END"
        )
        op.execute(
            "CREATE TRIGGER audit_checkpoints_no_delete BEFORE DELETE ON audit_checkpoints "
            "BEGIN SELECT RAISE(ABORT, 'audit_checkpoints is append-only'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_checkpoints_append_only ON audit_checkpoints")
        op.execute("DROP FUNCTION IF EXISTS audit_checkpoints_guard()")
        op.execute(_postgres_guard(checkpoints=False))
    else:
        op.execute("DROP TRIGGER IF EXISTS audit_checkpoints_no_delete")
        op.execute("DROP TRIGGER IF EXISTS audit_checkpoints_append_only")
        op.execute("DROP TRIGGER audit_log_no_delete")
        op.execute(_SQLITE_NO_DELETE.format(condition="1"))
    op.drop_table("audit_checkpoints")
