"""A task's plan as a live tree: step states folded from its events, and pure rendering.

Nothing here does I/O: `watch_commands` feeds it the task, the Server-Sent Events and the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agent_reach.states import TERMINAL_STEP_STATES

_DONE = frozenset(s.value for s in TERMINAL_STEP_STATES)
# (symbol per status, tree edges) for terminals that can show Unicode, and for those that cannot.
_MARKS = {
    "succeeded": ("✓", "+"),
    "failed": ("✗", "x"),
    "rejected": ("✗", "x"),
    "cancelled": ("⊘", "/"),
    "skipped": ("○", "-"),
    "running": ("▶", ">"),
    "awaiting_approval": ("?", "?"),
    "outcome_unknown": ("!", "!"),
}
_EDGES = {True: ("├─ ", "└─ ", "│  ", "   "), False: ("|- ", "`- ", "|  ", "   ")}


# --- Server-Sent Events ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SseMessage:
    event: str
    data: str
    id: str | None


@dataclass(slots=True)
class SseParser:
    """The event-stream format (WHATWG HTML, "Server-sent events"), fed text as it arrives."""

    last_id: str | None = None  # the last `id:` seen: what to send back as Last-Event-ID
    comments: int = 0  # heartbeats and other comment lines
    _partial: str = ""
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, text: str) -> list[SseMessage]:
        """The messages completed by this chunk (a partial line waits for the next one)."""
        lines = (self._partial + text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self._partial = lines.pop()
        return [m for m in map(self._line, lines) if m is not None]

    def _line(self, line: str) -> SseMessage | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            message = SseMessage(
                event=self._event or "message", data="\n".join(self._data), id=self.last_id
            )
            self._event, self._data = "", []
            return message
        if line.startswith(":"):
            self.comments += 1
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_id = value
        return None


# --- the task's state -----------------------------------------------------------------------


@dataclass(slots=True)
class StepState:
    step_id: str
    tool: str
    depends_on: tuple[str, ...]
    status: str = "blocked"
    attempt: int = 1
    started_at: datetime | None = None  # of the current attempt (its lease)
    finished_at: datetime | None = None


@dataclass(slots=True)
class TaskState:
    task_id: str
    status: str
    created_at: datetime | None
    steps: dict[str, StepState]  # in plan order
    finished_at: datetime | None = None


def plan_from(task: dict[str, Any]) -> TaskState:
    """The plan of a task (`GET /v1/tasks/{id}`) as it was before its first event."""
    return TaskState(
        task_id=task["task_id"],
        status="pending",
        created_at=_when(task.get("created_at")),
        steps={
            s["step_id"]: StepState(
                step_id=s["step_id"], tool=s["tool"], depends_on=tuple(s.get("depends_on", ()))
            )
            for s in task["steps"]
        },
    )


def apply_event(state: TaskState, event: dict[str, Any]) -> str:
    """Fold one event (an item of the events list) into `state`; the change as one line."""
    at = _when(event.get("created_at"))
    to = event.get("to_status")
    step = state.steps.get(event.get("step_id") or "")
    clock = at.strftime("%H:%M:%S.%f")[:-3] if at else "--:--:--"
    if step is None:
        if to is not None:
            state.status = to
            if to in ("succeeded", "failed", "cancelled"):
                state.finished_at = at
        return f"{clock}  task {state.task_id} {event.get('kind')}" + (f" → {to}" if to else "")
    before = step.status
    if event.get("attempt") is not None:
        step.attempt = int(event["attempt"])
    if to is not None:
        step.status = to
        if to == "running":
            step.started_at, step.finished_at = at, None
        elif to in _DONE:
            step.finished_at = at
        else:
            step.started_at = step.finished_at = None
    move = f"{before} → {to}" if to is not None else str(event.get("kind"))
    return f"{clock}  {step.step_id}: {move} (attempt {step.attempt}, {event.get('kind')})"


# --- rendering ------------------------------------------------------------------------------


def render_tree(state: TaskState, *, now: datetime, unicode: bool = True) -> list[str]:
    """The task as lines: a header, then each step under the dependency it waits on last.

    A step with several dependencies hangs under the one latest in the plan and names the
    others; a step shows its status, attempt and how long its current attempt has taken.
    """
    done = sum(s.status in _DONE for s in state.steps.values())
    end = state.finished_at or now
    took = f" · {_duration(end - state.created_at)}" if state.created_at else ""
    lines = [f"task {state.task_id} {state.status} · {done}/{len(state.steps)} steps done{took}"]
    children, roots = _tree(state)
    tee, last, bar, gap = _EDGES[unicode]

    def walk(step_id: str, prefix: str, is_last: bool) -> None:
        lines.append(prefix + (last if is_last else tee) + _step_line(state, step_id, now, unicode))
        below = children.get(step_id, [])
        for i, child in enumerate(below):
            walk(child, prefix + (gap if is_last else bar), i == len(below) - 1)

    for i, root in enumerate(roots):
        walk(root, "", i == len(roots) - 1)
    return lines


def _tree(state: TaskState) -> tuple[dict[str, list[str]], list[str]]:
    """Each step's children (in plan order) and the roots: a step's parent is the dependency
    that comes latest in the plan (the plan is acyclic, so this is a tree)."""
    order = {step_id: i for i, step_id in enumerate(state.steps)}
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for step in state.steps.values():
        known = [d for d in step.depends_on if d in order]
        if known:
            children.setdefault(max(known, key=order.__getitem__), []).append(step.step_id)
        else:
            roots.append(step.step_id)
    return children, roots


def _step_line(state: TaskState, step_id: str, now: datetime, unicode: bool) -> str:
    step = state.steps[step_id]
    mark = _MARKS.get(step.status, ("·", "."))[0 if unicode else 1]
    parts = [f"{mark} {step.step_id}", step.tool, step.status]
    if step.attempt > 1 or step.started_at is not None:
        parts.append(f"attempt {step.attempt}")
    if step.started_at is not None:
        parts.append(_duration((step.finished_at or now) - step.started_at))
    others = [d for d in step.depends_on if d in state.steps]
    if len(others) > 1:
        order = list(state.steps)
        parent = max(others, key=order.index)
        parts.append("(also after " + ", ".join(d for d in others if d != parent) + ")")
    return "  ".join(parts)


def _duration(span: timedelta) -> str:
    seconds = max(0.0, span.total_seconds())
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _when(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None
