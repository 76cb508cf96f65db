"""A task's subject: the end user it acts for, so a caller's own task may use memory's tools.

`tasks.subject` is new and nullable: a caller names it on POST /v1/tasks, and a run's rounds
carry the run's. The rounds already stored get their run's subject here, so memory's tools,
which now read it from the task, act for the same subject as before. A partial index on
(tenant, subject) serves a memory delete's scrub of the subject's tasks; the tasks without a
subject, almost all of them, are not in it.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WITH_SUBJECT = sa.text("subject IS NOT NULL")


def upgrade() -> None:
    op.add_column("tasks", sa.Column("subject", sa.String(256)))
    op.execute(
        "UPDATE tasks SET subject = (SELECT runs.subject FROM runs WHERE runs.run_id = tasks.run_id)"
        " WHERE run_id IS NOT NULL"
    )
    op.create_index(
        "ix_tasks_tenant_subject",
        "tasks",
        ["tenant", "subject"],
        postgresql_where=_WITH_SUBJECT,
        sqlite_where=_WITH_SUBJECT,
    )


def downgrade() -> None:
    op.drop_index("ix_tasks_tenant_subject", table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("subject")
