"""The checkers catch what they claim to: synthetic histories, one violation at a time."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.faults.checkers import Run, check_all

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TASK, KEY = "task-1", "task-1:s0"


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def ns(seconds: float) -> int:
    return int((T0 + timedelta(seconds=seconds)).timestamp() * 1e9)


def event(
    id_: int,
    kind: str,
    src: str | None,
    dst: str | None,
    attempt: int | None,
    when: float,
    **data: Any,
) -> dict[str, Any]:
    return {
        "task_id": TASK,
        "id": id_,
        "step_id": "s0",
        "event": kind,
        "src": src,
        "dst": dst,
        "attempt": attempt,
        "data": data or None,
        "created_at": at(when),
    }


def clean() -> list[tuple[str, dict[str, Any]]]:
    """One task, one step, leased once, succeeded, one delivery, one effect."""
    output = {"ok": True, "delivery": {"seq": 1, "key": KEY, "executor": "e1"}}
    step = {
        "step_id": "s0",
        "tool": "t",
        "status": "succeeded",
        "attempt": 1,
        "max_attempts": 3,
        "key": KEY,
        "op": "op-0",
        "error": None,
        "output": output,
    }
    return [
        ("tools", {"tools": {"t": {"maximum_attempts": 3, "idempotent": True, "sink": True}}}),
        (
            "submit",
            {
                "key": "k",
                "attempt": 0,
                "outcome": "accepted",
                "status": 202,
                "task_id": TASK,
                "took_ms": 5,
            },
        ),
        ("fault", {"action": "sigkill", "target": "x", "wall": ns(0.5)}),  # recovery from here
        ("listed", {"task_id": TASK, "goal": "k", "status": "succeeded"}),
        (
            "task",
            {
                "task_id": TASK,
                "status": "succeeded",
                "goal": "k",
                "created_at": at(0),
                "steps": [step],
            },
        ),
        ("event", {**event(1, "task_created", None, "pending", None, 0), "step_id": None}),
        ("event", event(2, "unblock", "blocked", "ready", 1, 0)),
        ("event", event(3, "lease", "ready", "running", 1, 1, executor_id="e1")),
        ("event", {**event(4, "task_status", "pending", "running", None, 1), "step_id": None}),
        ("event", event(5, "succeed", "running", "succeeded", 1, 2)),
        ("event", {**event(6, "task_status", "running", "succeeded", None, 2), "step_id": None}),
        (
            "delivery",
            {
                "seq": 1,
                "path": "/p",
                "key": KEY,
                "op": "op-0",
                "at_ns": 1,
                "wall_ns": ns(1.5),
                "executor": "e1",
                "body_hash": "h",
            },
        ),
        ("sink_effects", {"effects": {KEY: 1}}),
    ]


def load(tmp_path: Path, records: list[tuple[str, dict[str, Any]]]) -> Run:
    """Write records as a history file (the format `History` writes) and load it."""
    path = tmp_path / "history.jsonl"
    lines = [
        {"seq": seq, "t": seq, "wall": ns(0), "kind": kind, **fields}
        for seq, (kind, fields) in enumerate(records)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return Run.load(path)


def test_a_clean_history_passes(tmp_path: Path) -> None:
    summary = check_all(load(tmp_path, clean()), recovery_bound_s=5)
    assert summary.count("nothing lost", "steps_succeeded") == 1
    assert "0 lost, 0 duplicate effects, 0 stale completions accepted (0 rejected)" in (
        summary.standard()
    )
    assert summary.recovery_s == pytest.approx(1.5)


Mutation = Callable[[list[tuple[str, dict[str, Any]]]], None]


def replace_event(id_: int, new: dict[str, Any]) -> Mutation:
    def mutate(records: list[tuple[str, dict[str, Any]]]) -> None:
        for i, (kind, fields) in enumerate(records):
            if kind == "event" and fields["id"] == id_:
                records[i] = ("event", new)

    return mutate


def append(kind: str, fields: dict[str, Any]) -> Mutation:
    def mutate(records: list[tuple[str, dict[str, Any]]]) -> None:
        records.append((kind, fields))

    return mutate


def step_status(status: str) -> Mutation:
    def mutate(records: list[tuple[str, dict[str, Any]]]) -> None:
        for kind, fields in records:
            if kind == "task":
                fields["steps"][0]["status"] = status

    return mutate


def set_effects(effects: dict[str, int]) -> Mutation:
    return append("sink_effects", {"effects": effects})


def both(*mutations: Mutation) -> Mutation:
    def mutate(records: list[tuple[str, dict[str, Any]]]) -> None:
        for m in mutations:
            m(records)

    return mutate


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        pytest.param(
            append(
                "submit",
                {
                    "key": "k2",
                    "attempt": 0,
                    "outcome": "accepted",
                    "status": 202,
                    "task_id": "task-gone",
                    "took_ms": 1,
                },
            ),
            "accepted but is not found",
            id="lost-task",
        ),
        pytest.param(step_status("running"), "not terminal", id="step-not-terminal"),
        pytest.param(set_effects({KEY: 2}), "applied 2 times", id="effect-twice"),
        pytest.param(set_effects({}), "has no effect", id="effect-missing"),
        pytest.param(
            both(
                append(
                    "delivery",
                    {
                        "seq": 2,
                        "path": "/p",
                        "key": "other:s0",
                        "op": "op-1",
                        "at_ns": 2,
                        "wall_ns": ns(1.6),
                        "executor": "e1",
                        "body_hash": "h",
                    },
                ),
                set_effects({KEY: 1, "other:s0": 1}),
            ),
            "the downstream applied key other:s0",
            id="effect-without-step",
        ),
        pytest.param(
            both(
                append(
                    "delivery",
                    {
                        "seq": 2,
                        "path": "/p",
                        "key": "other:s0",
                        "op": "op-0",
                        "at_ns": 2,
                        "wall_ns": ns(1.6),
                        "executor": "e1",
                        "body_hash": "h",
                    },
                ),
                set_effects({KEY: 1, "other:s0": 1}),
            ),
            "operation 'op-0' applied under 2 keys",
            id="one-operation-two-effects",
        ),
        pytest.param(
            append(
                "submit",
                {
                    "key": "k",
                    "attempt": 1,
                    "outcome": "accepted",
                    "status": 202,
                    "task_id": "task-2",
                    "took_ms": 1,
                },
            ),
            "answered with 2 task ids",
            id="two-tasks-per-key",
        ),
        pytest.param(
            replace_event(5, event(5, "succeed", "running", "succeeded", 2, 2)),
            "but the lease it ended was attempt 1",
            id="stale-completion",
        ),
        pytest.param(
            replace_event(3, event(3, "lease", "ready", "running", 1, 1, executor_id="e2")),
            "but the last lease (attempt 1) belonged to e2",
            id="output-from-another-executor",
        ),
        pytest.param(
            replace_event(3, event(3, "lease", "ready", "running", 1, 1.8, executor_id="e1")),
            "made before its last lease",
            id="output-from-before-the-lease",
        ),
        pytest.param(
            append("event", event(7, "succeed", "running", "succeeded", 1, 3)),
            "from running, but the step was succeeded",
            id="double-transition",
        ),
        pytest.param(
            replace_event(2, event(2, "unblock", "blocked", "running", 1, 0)),
            "is not a legal transition",
            id="illegal-edge",
        ),
        pytest.param(
            append("tools", {"tools": {"t": {"maximum_attempts": 0, "sink": True}}}),
            "exceeds the tool's maximum",
            id="too-many-attempts",
        ),
        pytest.param(
            append(
                "event", {**event(8, "task_status", "running", "failed", None, 3), "step_id": None}
            ),
            "left terminal status",
            id="task-leaves-terminal",
        ),
        pytest.param(
            append("answer", {"method": "GET", "path": "/x", "status": 500}),
            "answered 500",
            id="server-error",
        ),
        pytest.param(
            append("answer", {"method": "GET", "path": "/x", "status": 503}),
            "without Retry-After",
            id="503-without-retry-after",
        ),
    ],
)
def test_each_violation_is_caught(tmp_path: Path, mutation: Mutation, expected: str) -> None:
    records = clean()
    mutation(records)
    with pytest.raises(AssertionError, match=re.escape(expected)):
        check_all(load(tmp_path, records), recovery_bound_s=5)


def test_a_slow_recovery_is_caught(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"settled 1\.5s after the last fault"):
        check_all(load(tmp_path, clean()), recovery_bound_s=1)


def test_a_tolerated_answer_is_counted_not_failed(tmp_path: Path) -> None:
    records = clean()
    records.append(("answer", {"method": "GET", "path": "/x", "status": 500, "code": "internal"}))
    summary = check_all(
        load(tmp_path, records),
        recovery_bound_s=5,
        tolerate_answer=lambda _, answer: answer.get("code") == "internal",
    )
    assert summary.count("API answers", "tolerated") == 1
