"""Task completion webhooks: where a task's end is announced, and a per-delivery URL.

`tasks.webhook_url` holds the URL a submit named (kept out of the stored request, since it may
carry a token); `webhook_outbox.url` sends a delivery there instead of the approval webhook.
Both columns are new and nullable: replicas of the previous release keep working.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("webhook_url", sa.String(2048)))
    op.add_column("webhook_outbox", sa.Column("url", sa.String(2048)))


def downgrade() -> None:
    with op.batch_alter_table("webhook_outbox") as batch:
        batch.drop_column("url")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("webhook_url")
