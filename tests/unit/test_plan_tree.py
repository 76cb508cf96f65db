"""`reach status --watch`: events folded into step states, the tree drawn from depends_on (a
step's parts under it, by what they are), and the event-stream parser."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_reach_cli.plan_tree import (
    SseMessage,
    SseParser,
    TaskState,
    apply_event,
    in_plan_order,
    part_labels,
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


# A verified write that may write twice, and a notification to three targets, as the task view
# lists them: planned steps first, then every part (fan-out parts, then the write's chain).
NOTIFY_ARGS = {"subject": "Umbrella", "message": "$weather.output.summary"}
TARGETS = [
    {"channel": "webhook", "url": "https://phone.example.org/hooks/ann?sig=s3cret"},
    {"channel": "email", "to": "ann@example.org"},
    {"channel": "slack", "url": "https://hooks.slack.example/services/T0/B0/s3cret"},
]
VIEW: dict[str, Any] = {
    "task_id": "t2",
    "status": "running",
    "created_at": "2026-12-01T08:00:00Z",
    "steps": [
        {"step_id": "weather", "tool": "weather.forecast", "depends_on": [], "args": {}},
        {
            "step_id": "remind",
            "tool": "reminder.create",
            "depends_on": ["remind[0]", "remind[1]", "remind[2]", "remind[3]"],
            "args": {"text": "Take an umbrella"},
        },
        {
            "step_id": "tell",
            "tool": "notify",
            "depends_on": ["tell[0]", "tell[1]", "tell[2]"],
            "args": {**NOTIFY_ARGS, "targets": TARGETS},
        },
        *(
            {
                "step_id": f"tell[{n}]",
                "tool": "notify",
                "depends_on": ["weather", "remind"],
                "args": {**NOTIFY_ARGS, "target": target},
            }
            for n, target in enumerate(TARGETS)
        ),
        {
            "step_id": "remind[0]",
            "tool": "reminder.create",
            "depends_on": ["weather"],
            "args": {"text": "Take an umbrella"},
        },
        {"step_id": "remind[1]", "tool": "reminder.get", "depends_on": ["remind[0]"], "args": {}},
        {
            "step_id": "remind[2]",
            "tool": "reminder.create",
            "depends_on": ["weather", "remind[1]"],
            "args": {"text": "Take an umbrella"},
        },
        {"step_id": "remind[3]", "tool": "reminder.get", "depends_on": ["remind[2]"], "args": {}},
    ],
}


def test_parts_are_named_for_what_they_are_and_shown_under_their_step_in_plan_order() -> None:
    state = plan_from(VIEW)
    state.status = "running"
    lines = render_tree(state, now=datetime(2026, 12, 1, 8, 0, 1, tzinfo=UTC), unicode=False)
    assert lines == [
        "task t2 running · 0/10 steps done · 1.00s",
        "`- . weather  weather.forecast  blocked",
        "   `- . remind  reminder.create  blocked",
        "      |- . write (remind[0])  reminder.create  blocked",
        "      |- . read back (remind[1])  reminder.get  blocked",
        "      |- . write #2 (remind[2])  reminder.create  blocked",
        "      |- . read back #2 (remind[3])  reminder.get  blocked",
        "      `- . tell  notify  blocked  (also after weather)",
        "         |- . webhook to phone.example.org (tell[0])  notify  blocked",
        "         |- . email to ann@example.org (tell[1])  notify  blocked",
        "         `- . slack to hooks.slack.example (tell[2])  notify  blocked",
    ]
    assert "s3cret" not in "\n".join(lines)  # a URL's path and query are never shown
    # The ids stay what they are (idempotency keys); an event names the part both ways.
    assert list(state.steps)[:4] == ["weather", "remind", "remind[0]", "remind[1]"]
    assert apply_event(state, event("tell[1]", "failed", at=2, kind="fail")) == (
        "08:00:02.000  email to ann@example.org (tell[1]): blocked → failed (attempt 1, fail)"
    )


def test_a_fan_out_part_is_named_by_its_element_or_numbered() -> None:
    long = "a-rather-long-mailbox-name.for-the-team@example.org"
    steps = [
        {"step_id": "w", "tool": "weather.forecast", "args": {"cities": ["Wuhan", "$x.output"]}},
        {"step_id": "w[0]", "tool": "weather.forecast", "args": {"city": "Wuhan"}},
        {"step_id": "w[1]", "tool": "weather.forecast", "args": {"city": "$x.output"}},
        {"step_id": "n", "tool": "notify", "args": {"targets": [{"channel": "email"}]}},
        {"step_id": "n[0]", "tool": "notify", "args": {"target": {"channel": "email"}}},
        {"step_id": "n[1]", "tool": "notify", "args": {"target": {"channel": "email", "to": long}}},
    ]
    assert part_labels(steps) == {
        "w[0]": "city Wuhan",
        "w[1]": "#1",
        "n[0]": "email",
        "n[1]": f"email to {long}",
    }
    assert [s["step_id"] for s in in_plan_order(reversed(steps))] == [
        "n",
        "n[0]",
        "n[1]",
        "w",
        "w[0]",
        "w[1]",
    ]
