"""The skeleton controller of `make bench-floor` ends every task it accepts.

It is a measuring instrument: a step it loses (handed to a poll that gave up, say) would
stall the bench rather than fail it. Its hand-off to waiting polls is the part worth a check."""

from __future__ import annotations

import psycopg
import pytest

from tests.bench.floor import _load, skeleton
from tests.conftest import POSTGRES_ADMIN


def test_the_skeleton_ends_every_task_while_its_polls_give_up(
    postgres_template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polls that wait 2 ms give up all the time, some while a submit is handing them a step.
    monkeypatch.setenv("AGENT_REACH_BENCH_FLOOR_POLL_WAIT", "0.002")
    with skeleton(POSTGRES_ADMIN) as target:
        rate, *_ = _load(target, 400, 4, within=60)
        with psycopg.connect(target.database_url, autocommit=True) as conn:
            rows = conn.execute("SELECT status, count(*) FROM steps GROUP BY status").fetchall()
    assert rate > 0
    assert dict(rows) == {"succeeded": 400}
