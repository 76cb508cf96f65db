"""Scheduled steps: the time a step was asked to run at (`run_at`, or the submit plus `delay`).

A blocked step keeps it until its dependencies are done; it is then queued with `not_before` at
that time. New and nullable: replicas of the previous release keep working.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("run_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("run_at")
