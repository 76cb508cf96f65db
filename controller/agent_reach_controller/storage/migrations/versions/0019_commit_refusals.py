"""A function that refuses a commit from inside its statement.

A transaction's commit-time writes and the guards read with them (is the catalogue still at the
revision the plan was checked against? does this submit hold its Idempotency-Key?) are one
statement. A guard that fails calls `agent_reach_refuse(reason)`: the statement fails, so nothing
of it is written, and the COMMIT queued behind it in the same round trip finds the transaction
failed and rolls back. The controller maps the reason to its error (SQLSTATE AR001). Postgres
only: on SQLite, the one writer, the guards are read before the writes.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION agent_reach_refuse(reason text) RETURNS boolean
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION USING ERRCODE = 'AR001', MESSAGE = reason;
        END
        $$
        """
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION agent_reach_refuse(text)")
