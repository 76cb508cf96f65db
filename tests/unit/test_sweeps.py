"""Sweeps are supervised one by one: a sweep that raises, or loses the database, is counted and
runs again, and the others go on as if nothing happened."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy.exc import OperationalError

from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services import sweeps
from agent_reach_controller.services.sweeps import Supervision, Sweep


async def _until(predicate: object, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_a_failing_sweep_does_not_stop_the_others() -> None:
    runs = {"broken": 0, "lost": 0, "healthy": 0}
    outages: list[bool] = []

    async def broken() -> None:
        runs["broken"] += 1
        raise RuntimeError("a bug in one sweep")

    async def lost() -> None:
        runs["lost"] += 1
        raise OperationalError("SELECT 1", {}, ConnectionError("the database went away"))

    async def healthy() -> None:
        runs["healthy"] += 1

    metrics = ControllerMetrics()
    supervision = Supervision(
        failed=metrics.sweep_failed, storage_down=lambda: outages.append(True)
    )
    tasks = sweeps.start(
        [
            Sweep(name="broken", run=broken, every=0.01),
            Sweep(name="lost", run=lost, every=0.01),
            Sweep(name="healthy", run=healthy, every=0.01),
        ],
        supervision,
    )
    try:
        await _until(lambda: min(runs.values()) >= 5)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert all(task.cancelled() for task in tasks)
    assert [t.get_name() for t in tasks] == ["sweep-broken", "sweep-lost", "sweep-healthy"]
    failures = "agent_reach_sweep_failures_total"
    assert metrics.total(failures, sweep="broken") >= 5
    assert metrics.total(failures, sweep="lost") >= 5
    assert metrics.total(failures, sweep="healthy") == 0
    assert len(outages) >= 5  # only the lost database tells the lease keeper
    assert len(outages) <= runs["lost"]


def test_a_sweep_that_scans_the_queue_takes_at_most_its_share_of_the_time() -> None:
    async def nothing() -> None:
        return None

    counting = Sweep(name="queue_depth", run=nothing, every=1.5, share=0.1)
    assert counting.pause_after(0.01) == 1.5  # a cheap count keeps its interval
    assert counting.pause_after(0.6) == pytest.approx(5.4)  # 0.6 s of 6 s: a tenth
    plain = Sweep(name="expired_leases", run=nothing, every=1.5)
    assert plain.pause_after(3.0) == 1.5  # the others never stretch
