"""Migrations round-trip and match the models, on SQLite and Postgres."""

from __future__ import annotations

import sqlalchemy as sa

from agent_reach_controller.storage import migrate
from agent_reach_controller.storage.check import round_trip
from agent_reach_controller.storage.engine import sync_url


def test_round_trip_and_check(database_url: str) -> None:
    round_trip(database_url)
    engine = sa.create_engine(sync_url(database_url))
    try:
        tables = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"tools", "tasks", "steps", "events", "idempotency_keys"} <= tables


def test_downgrade_removes_everything(database_url: str) -> None:
    migrate.downgrade(database_url)
    engine = sa.create_engine(sync_url(database_url))
    try:
        tables = set(sa.inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()
    assert tables == set()
