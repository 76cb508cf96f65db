"""`reach status --watch`: events folded into step states, the tree drawn from depends_on, and
the event-stream parser."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_reach_cli.plan_tree import (
    SseMessage,
    SseParser,
    TaskState,
    apply_event,
    plan_from,
    render_tree,
)
from agent_reach_cli.watch_commands import Redraw

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)

TASK = {
    "task_id": "t1",
    "status": "running",
    "created_at": T0.isoformat(),
    "steps": [
        {"step_id": "weather", "tool": "weather.forecast", "depends_on": []},
        {"step_id": "geo", "tool": "geo.lookup", "depends_on": []},
        {"step_id": "remind", "tool": "reminder.create", "depends_on": ["weather", "geo"]},
        {"step_id": "log", "tool": "note.write", "depends_on": ["weather"]},
    ],
}


def event(step: str | None, to: str | None, *, at: float, kind: str = "", attempt: int = 1) -> Any:
    return {
        "id": 1,
        "step_id": step,
        "kind": kind or (to or "x"),
        "from_status": None,
        "to_status": to,
        "attempt": attempt if step else None,
        "data": None,
        "created_at": (T0 + timedelta(seconds=at)).isoformat(),
    }


def state_after(*events: Any) -> TaskState:
    state = plan_from(TASK)
    for e in events:
        apply_event(state, e)
    return state


def test_the_tree_hangs_each_step_under_its_latest_dependency() -> None:
    lines = render_tree(state_after(), now=T0 + timedelta(seconds=1))
    assert lines == [
        "task t1 pending · 0/4 steps done · 1.00s",
        "├─ · weather  weather.forecast  blocked",
        "│  └─ · log  note.write  blocked",
        "└─ · geo  geo.lookup  blocked",
        "   └─ · remind  reminder.create  blocked  (also after weather)",
    ]


def test_states_attempts_and_timings_follow_the_events() -> None:
    state = state_after(
        event(None, "pending", at=0, kind="task_created"),
        event("weather", "ready", at=0, kind="unblock"),
        event("weather", "running", at=1, kind="lease"),
        event(None, "running", at=1, kind="task_status"),
        event("weather", "ready", at=2, kind="retry", attempt=2),
        event("weather", "running", at=3, kind="lease", attempt=2),
        event("weather", "succeeded", at=3.5, kind="succeed", attempt=2),
        event("log", "ready", at=3.5, kind="unblock"),
        event("log", "running", at=4, kind="lease"),
        event("geo", "ready", at=0, kind="unblock"),
        event("geo", "failed", at=5, kind="fail"),
        event("remind", "skipped", at=5, kind="skip"),
    )
    lines = render_tree(state, now=T0 + timedelta(seconds=6), unicode=False)
    assert lines == [
        "task t1 running · 3/4 steps done · 6.00s",
        "|- + weather  weather.forecast  succeeded  attempt 2  0.50s",
        "|  `- > log  note.write  running  attempt 1  2.00s",
        "`- x geo  geo.lookup  failed",
        "   `- - remind  reminder.create  skipped  (also after weather)",
    ]


def test_a_finished_task_shows_its_own_duration() -> None:
    state = state_after(
        event("weather", "running", at=1, kind="lease"),
        event("weather", "succeeded", at=62, kind="succeed"),
        event(None, "succeeded", at=70, kind="task_status"),
    )
    lines = render_tree(state, now=T0 + timedelta(hours=2))
    assert lines[0] == "task t1 succeeded · 1/4 steps done · 1m10s"
    assert lines[1] == "├─ ✓ weather  weather.forecast  succeeded  attempt 1  1m01s"


def test_each_event_is_one_change_line() -> None:
    state = plan_from(TASK)
    assert (
        apply_event(state, event("weather", "running", at=1.25, kind="lease"))
        == "08:00:01.250  weather: blocked → running (attempt 1, lease)"
    )
    assert (
        apply_event(state, event(None, "running", at=2, kind="task_status"))
        == "08:00:02.000  task t1 task_status → running"
    )
    assert (
        apply_event(state, event("weather", None, at=3, kind="result_rejected"))
        == "08:00:03.000  weather: result_rejected (attempt 1, result_rejected)"
    )
    assert state.steps["weather"].status == "running"


def test_the_parser_reads_messages_across_chunks_and_skips_comments() -> None:
    parser = SseParser()
    stream = (
        ': keep-alive\n\nid: 41\nevent: lease\ndata: {"id": 41}\n\n'
        'id: 42\r\nevent: succeed\r\ndata: {"id":\r\ndata: 42}\r\n\r\n'
        'event: end\ndata: {"status": "succeeded"}\n\n'
    )
    messages = [m for i in range(0, len(stream), 7) for m in parser.feed(stream[i : i + 7])]
    assert messages == [
        SseMessage(event="lease", data='{"id": 41}', id="41"),
        SseMessage(event="succeed", data='{"id":\n42}', id="42"),
        SseMessage(event="end", data='{"status": "succeeded"}', id="42"),
    ]
    assert parser.comments == 1
    assert parser.last_id == "42"  # what a reconnect sends as Last-Event-ID


def test_a_terminal_is_redrawn_in_place() -> None:
    out = io.StringIO()
    screen = Redraw(out, unicode=True)
    state = state_after()
    screen.changed(state, ["ignored on a terminal"])
    first = out.getvalue()
    assert first.count("\n") == 5
    assert "\x1b[" not in first
    apply_event(state, event("weather", "running", at=1, kind="lease"))
    screen.changed(state, [])
    again = out.getvalue()[len(first) :]
    assert again.startswith("\x1b[5F\x1b[J")  # up to the first line drawn, clear below
    assert "▶ weather  weather.forecast  running  attempt 1" in again
