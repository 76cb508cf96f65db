"""Alembic environment: runs migrations on the connection or URL given by the caller."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import engine_from_config, pool

from agent_reach_controller.storage.schema import metadata

config = context.config
# Indexes with an expression (`priority DESC`) that autogenerate cannot compare: it would see a
# difference on every check. Their migrations are written and reviewed by hand.
_EXPRESSION_INDEXES = frozenset({"ix_steps_ready_fair", "ix_memories_search"})
# Memory's full-text index is one backend's own (0029): a generated tsvector column on Postgres,
# an FTS5 virtual table and its shadow tables on SQLite. SQLAlchemy models neither.
_FULL_TEXT_TABLE = "memories_fts"


def _compared(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    if type_ == "index" and name in _EXPRESSION_INDEXES:
        return False
    if type_ == "table" and (name or "").startswith(_FULL_TEXT_TABLE):
        return False
    return not (type_ == "column" and name == "search" and obj.table.name == "memories")


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            compare_type=True,
            include_object=_compared,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section) or {},
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as conn:
        context.configure(
            connection=conn,
            target_metadata=metadata,
            compare_type=True,
            include_object=_compared,
            render_as_batch=conn.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()


run()
