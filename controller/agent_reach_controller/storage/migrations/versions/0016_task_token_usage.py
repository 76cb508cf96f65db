"""Model tokens a caller reports per task.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(
            sa.Column("input_tokens", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch.add_column(
            sa.Column("output_tokens", sa.BigInteger(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("output_tokens")
        batch.drop_column("input_tokens")
