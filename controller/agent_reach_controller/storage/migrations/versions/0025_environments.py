"""Environments: where a task runs (dev, sandbox or prod), fixed when it is submitted.

`tasks.environment` is what the task shows; `steps.environment` is the same value beside each
step, because the rules that read it (which steps wait for approval, which connector config an
executor is sent) decide on step rows alone. Both are new and nullable: replicas of the previous
release keep working, and a NULL reads as `dev`, where their tasks ran.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("environment", sa.String(16)))
    op.add_column("steps", sa.Column("environment", sa.String(16)))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("environment")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("environment")
