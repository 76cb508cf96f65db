"""`reach status`: a task in plan order, its parts named, which target of a fan-out failed."""

from __future__ import annotations

import re
from typing import Any

from agent_reach_cli.client_commands import describe_task


def _receipt(status: str, data: Any = None, error: str | None = None, **meta: Any) -> Any:
    failed = {"code": "downstream_error", "message": error} if error else None
    return {"status": status, "data": data, "error": failed, "meta": meta}


def _record(n: int, status: str, error: str | None = None) -> dict[str, Any]:
    return {
        "target": n,
        "step_id": f"tell[{n}]",
        "status": status,
        "done_at": "2026-12-01T00:00:08.100Z",
        "error": {"code": "downstream_error", "message": error} if error else None,
        "output": None,
    }


TARGETS = [
    {"channel": "webhook", "url": "https://phone.example.org/hooks/ann?sig=s3cret"},
    {"channel": "email", "to": "ann@example.org"},
    {"channel": "slack", "url": "https://hooks.slack.example/services/T0/B0/s3cret"},
]
NOTE = {"message": "Rain from 07:00"}
REMINDER = {"reminder_id": "rem_1"}
TASK: dict[str, Any] = {
    "task_id": "t1",
    "status": "failed",
    "trace_id": "ab12",
    "finished_at": "2026-12-01T00:00:08.200000+00:00",  # either way of writing UTC is read
    "error": {"code": "partially_done", "message": "1 of 3 targets succeeded", "step_id": "tell"},
    "steps": [
        {"step_id": "remind", "tool": "reminder.create", "status": "succeeded", "args": {},
         "receipt": _receipt("succeeded", REMINDER, verified=True)},
        {"step_id": "tell", "tool": "notify", "status": "failed",
         "args": {**NOTE, "targets": TARGETS},
         "receipt": {**_receipt("failed", error="1 of 3 targets succeeded"),
                     "targets": [_record(0, "succeeded"), _record(1, "failed", "550 no such user"),
                                 _record(2, "cancelled")]}},
        {"step_id": "tell[0]", "tool": "notify", "status": "succeeded",
         "args": {**NOTE, "target": TARGETS[0]},
         "receipt": _receipt("succeeded", {"delivered_at": "2026-12-01T00:00:08.100Z"})},
        {"step_id": "tell[1]", "tool": "notify", "status": "failed",
         "args": {**NOTE, "target": TARGETS[1]},
         "receipt": _receipt("failed", error="550 no such user")},
        {"step_id": "tell[2]", "tool": "notify", "status": "cancelled",
         "args": {**NOTE, "target": TARGETS[2]}, "receipt": None},
        {"step_id": "remind[0]", "tool": "reminder.create", "status": "succeeded", "args": {},
         "receipt": _receipt("succeeded", REMINDER)},
        {"step_id": "remind[1]", "tool": "reminder.get", "status": "succeeded", "args": {},
         "receipt": _receipt("succeeded", REMINDER)},
    ],
}  # fmt: skip


def test_status_names_each_part_and_the_target_that_failed() -> None:
    lines = describe_task(TASK).splitlines()
    assert [re.split(r"\s{2,}", line.strip())[0] for line in lines[2:]] == [
        "remind",
        "write (remind[0])",
        "read back (remind[1])",
        "tell",
        "webhook to phone.example.org (tell[0])",
        "email to ann@example.org (tell[1])",
        "slack to hooks.slack.example (tell[2])",
    ]
    assert lines[0] == "task t1  failed  trace ab12"
    assert lines[1] == "  error: partially_done at step tell: 1 of 3 targets succeeded"
    tell = lines[5].split(maxsplit=2)
    assert tell == [
        "tell",
        "failed",
        "1 of 3 succeeded; email to ann@example.org failed, slack to hooks.slack.example cancelled",
    ]
    assert lines[6].split()[-4:] == ["succeeded", "delivered", "at", "2026-12-01T00:00:08.100Z"]
    assert re.split(r"\s{2,}", lines[7].strip())[1:] == ["failed", "550 no such user"]
    assert "s3cret" not in "\n".join(lines)


def test_a_fan_out_skipped_as_a_whole_says_why() -> None:
    why = "skipped because step 'remind' skipped"
    skipped = {**_record(0, "skipped", why), "done_at": None}
    task = {
        "task_id": "t2",
        "status": "succeeded",
        "steps": [
            {"step_id": "tell", "tool": "notify", "status": "skipped",
             "args": {**NOTE, "targets": TARGETS[1:2]},
             "receipt": {**_receipt("skipped", error=why), "targets": [skipped]}},
            {"step_id": "tell[0]", "tool": "notify", "status": "skipped",
             "args": {**NOTE, "target": TARGETS[1]}, "receipt": _receipt("skipped", error=why)},
        ],
    }  # fmt: skip
    lines = describe_task(task).splitlines()
    assert [re.split(r"\s{2,}", line.strip()) for line in lines[1:]] == [
        ["tell", "skipped", why],
        ["email to ann@example.org (tell[0])", "skipped", why],
    ]
