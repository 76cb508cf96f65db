"""What a fault scenario records of a run for the checkers: every task, its steps and events as
the API shows them, what the downstream sink received, and the tools it ran."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tests.support.history import History
from tests.support.sink import Sink

if TYPE_CHECKING:
    from tests.faults.harness import Api


def observe(history: History, api: Api, task_ids: Iterable[str] | None = None) -> list[str]:
    """Record every task (all of them, listed through the API, unless ids are given), its steps
    and its events as the REST API shows them; returns the task ids observed."""
    listed: list[dict[str, Any]] = []
    before: str | None = None
    while True:
        query = "/v1/tasks?limit=500" + (f"&before={before}" if before else "")
        page = api.get(query)
        listed += page["tasks"]
        before = page.get("next_before")
        if not before:
            break
    for summary in listed:
        history.record(
            "listed", task_id=summary["task_id"], goal=summary["goal"], status=summary["status"]
        )
    ids = sorted(set(task_ids) if task_ids is not None else {t["task_id"] for t in listed})
    for task_id in ids:
        task = api.get(f"/v1/tasks/{task_id}")
        history.record(
            "task",
            task_id=task_id,
            status=task["status"],
            goal=task["goal"],
            created_at=task["created_at"],
            steps=[
                {
                    "step_id": s["step_id"],
                    "tool": s["tool"],
                    "status": s["status"],
                    "attempt": s["attempt"],
                    "max_attempts": s["max_attempts"],
                    "key": s["idempotency_key"],
                    "op": (s["args"] or {}).get("op"),
                    "error": ((s["receipt"] or {}).get("error") or {}).get("code"),
                    "output": (s["receipt"] or {}).get("data"),
                }
                for s in task["steps"]
            ],
        )
        after = 0
        while True:
            page = api.get(f"/v1/tasks/{task_id}/events?after={after}&limit=5000")["events"]
            for e in page:
                history.record(
                    "event",
                    task_id=task_id,
                    id=e["id"],
                    step_id=e["step_id"],
                    event=e["kind"],
                    src=e["from_status"],
                    dst=e["to_status"],
                    attempt=e["attempt"],
                    data=e["data"],
                    created_at=e["created_at"],
                )
            if len(page) < 5000:
                break
            after = page[-1]["id"]
    history.record("observed", tasks=len(ids))
    return ids


def record_sink(history: History, sink: Sink) -> None:
    """Every delivery the sink received, and the effects it applied per key."""
    for d in sink.requests():
        try:
            op = (d.json() or {}).get("op")
        except (ValueError, AttributeError):
            op = None
        history.record(
            "delivery",
            seq=d.seq,
            path=d.path,
            key=d.key,
            op=op,
            at_ns=int(d.at * 1e9),
            wall_ns=int(d.wall * 1e9),
            executor=d.headers.get("x-executor"),
            body_hash=d.body_hash,
        )
    history.record("sink_effects", effects=sink.effects())


def record_tools(history: History, specs: Sequence[dict[str, Any]], sink_url: str | None) -> None:
    history.record(
        "tools",
        tools={
            s["name"]: {
                "maximum_attempts": s.get("retry", {}).get("maximum_attempts", 3),
                "idempotent": bool(s.get("idempotent", False)),
                "sink": sink_url is not None
                and str(s["config"].get("url", "")).startswith(sink_url),
            }
            for s in specs
        },
    )
