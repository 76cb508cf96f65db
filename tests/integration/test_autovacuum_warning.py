"""A controller on a Postgres server without autovacuum says so when it starts.

Nothing then analyses the tables as they grow, and the controller's prepared statements keep the
generic plans Postgres made while the tables were nearly empty: whole-table scans that get slower
with every task stored (BENCHMARKS.md, issue 33 round four). The test asks the server what it
runs with, so it holds on servers with autovacuum on or off.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest

from tests.integration.stack import components_for, write_tools


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "autovacuum_off"]


async def test_a_controller_on_postgres_says_whether_autovacuum_is_off(
    postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    assert row is not None
    with caplog.at_level(logging.WARNING):
        async with components_for(postgres_url, write_tools(tmp_path)):
            pass
    warned = _warnings(caplog)
    assert len(warned) == (1 if row[0] == "off" else 0)
    if warned:
        assert "ANALYZE" in warned[0].getMessage()


async def test_a_controller_on_sqlite_says_nothing(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        async with components_for(sqlite_url, write_tools(tmp_path)):
            pass
    assert _warnings(caplog) == []
