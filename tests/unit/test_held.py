"""What a replica keeps of the leases it hands out (services/held.py): the rows of one-step tasks
only, a bounded number, and given back only for a report they would accept."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from agent_reach_controller.domain.records import StepRow, TaskRow
from agent_reach_controller.services.held import HeldLeases
from agent_reach_controller.storage.schema import steps, tasks

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def _task(task_id: str, **values: Any) -> TaskRow:
    row = {
        **dict.fromkeys(tasks.c.keys()),
        "task_id": task_id,
        "trace_id": "0" * 32,
        "status": "running",
        "principal": "svc",
        "source": "api",
        "request": {},
        "context": {},
        "cancel_requested": False,
        "version": 3,
        "created_at": NOW,
        "updated_at": NOW,
        **values,
    }
    return TaskRow.from_mapping(row)


def _step(key: int, task_id: str, **values: Any) -> StepRow:
    row = {
        **dict.fromkeys(steps.c.keys()),
        "id": key,
        "task_id": task_id,
        "step_id": "a",
        "position": 0,
        "trace_id": "0" * 32,
        "tool": "echo.say",
        "tool_version": "1",
        "connector": "echo",
        "args": {},
        "status": "running",
        "attempt": 1,
        "max_attempts": 3,
        "lease_owner": "s1",
        "created_at": NOW,
        "updated_at": NOW,
        **values,
    }
    return StepRow.from_mapping(row)


def test_rows_are_given_back_once_for_a_report_they_accept() -> None:
    held = HeldLeases()
    task, step = _task("t1"), _step(1, "t1")
    held.remember(task, step)
    assert held.take([(1, 1)], "s1") == ({"t1": task}, {1: step})
    assert held.take([(1, 1)], "s1") is None  # forgotten once taken
    assert (held.taken, held.missed, len(held)) == (1, 0, 0)


def test_another_attempt_another_holder_or_a_key_twice_reads_under_the_lock() -> None:
    held = HeldLeases()
    for reported, holder in (([(1, 2)], "s1"), ([(1, 1)], "s2"), ([(1, 1), (1, 1)], "s1")):
        held.remember(_task("t1"), _step(1, "t1"))
        assert held.take(reported, holder) is None
        assert len(held) == 0  # what was kept is forgotten all the same
    assert (held.taken, held.missed) == (0, 3)


def test_a_batch_is_given_back_only_whole() -> None:
    held = HeldLeases()
    held.remember(_task("t1"), _step(1, "t1"))
    assert held.take([(1, 1), (2, 1)], "s1") is None  # step 2 was never kept here
    held.remember(_task("t1"), _step(1, "t1"))
    held.remember(_task("t2"), _step(2, "t2"))
    taken = held.take([(1, 1), (2, 1)], "s1")
    assert taken is not None
    assert sorted(taken[0]) == ["t1", "t2"]
    assert sorted(taken[1]) == [1, 2]


def test_tasks_others_may_change_under_the_rows_are_not_kept() -> None:
    held = HeldLeases()
    kept_not = [
        (_task("t", run_id="r"), _step(1, "t")),  # an agent run's round gains steps
        (_task("t", webhook_url="https://example.invalid/h"), _step(1, "t")),
        (_task("t", cancel_requested=True), _step(1, "t")),
        (_task("t", status="pending"), _step(1, "t")),
        (_task("t"), _step(1, "t", status="ready")),
        (_task("t"), _step(1, "t", connector="model")),
        (_task("t"), _step(1, "other")),
    ]
    for task, step in kept_not:
        held.remember(task, step)
    assert len(held) == 0


def test_the_oldest_lease_makes_room_for_the_newest() -> None:
    held = HeldLeases(capacity=3)
    for key in range(1, 5):
        held.remember(_task(f"t{key}"), _step(key, f"t{key}"))
    assert len(held) == 3
    assert held.get(1) is None
    assert held.get(4) is not None
    # A step leased again replaces what was kept of it, as the newest.
    again = replace(_step(2, "t2"), attempt=2)
    held.remember(_task("t2"), again)
    held.remember(_task("t5"), _step(5, "t5"))
    assert held.get(3) is None
    assert held.get(2) == (_task("t2"), again)
