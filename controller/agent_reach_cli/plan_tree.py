"""A task's plan as a live tree: step states folded from its events, and pure rendering.

Nothing here does I/O: `watch_commands` feeds it the task, the Server-Sent Events and the clock.

A fan-out step and a verified write have parts, child steps whose ids (`tell[0]`, `remind[1]`)
are idempotency keys and say nothing to a reader: they are shown under their step, in plan
order, named for what they are (`email to ann@example.org`, `write`, `read back`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

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


# --- a step's parts ---------------------------------------------------------------------------

# The longest plain value a fan-out part is named by (a longer one is only numbered), and the
# longest email address (RFC 5321's path).
_LONGEST_NAME = 40
_LONGEST_ADDRESS = 254


def part_of(step_id: str) -> tuple[str, int] | None:
    """(its step, n) for the n-th part of a fan-out step or verified write; None otherwise."""
    head, bracket, tail = step_id.partition("[")
    if not bracket or not tail.endswith("]") or not tail[:-1].isdigit():
        return None
    return head, int(tail[:-1])


def part_labels(steps: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """What each part of a step of `steps` (the task view's) is, by its id.

    A verified write's parts are its writes and read-backs, alternately (planning/verify.py);
    they are told from a fan-out step's because a read-back runs the check tool, which is a
    read and so never the write's own tool, while every fan-out part runs its step's tool.
    A fan-out part is named by its element (the one argument its step does not have): a notify
    target as `email to ADDRESS` or `webhook to HOST` (never a URL's path: it may be a secret).
    """
    by_id = {s["step_id"]: s for s in steps}
    parts: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for step in steps:
        found = part_of(step["step_id"])
        if found is not None and found[0] in by_id:
            parts.setdefault(found[0], []).append((found[1], step))
    labels: dict[str, str] = {}
    for head, mine in parts.items():
        parent = by_id[head]
        verified = any(step.get("tool") != parent.get("tool") for _, step in mine)
        for n, step in mine:
            label = _link_label(n) if verified else _element_label(step, parent, n)
            labels[step["step_id"]] = label
    return labels


def in_plan_order(steps: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The steps as planned, each followed by its parts in order (they are stored last)."""
    steps = list(steps)
    ids = {s["step_id"] for s in steps}
    parts: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    top: list[Mapping[str, Any]] = []
    for step in steps:
        found = part_of(step["step_id"])
        if found is not None and found[0] in ids:
            parts.setdefault(found[0], []).append((found[1], step))
        else:
            top.append(step)
    ordered: list[Mapping[str, Any]] = []
    for step in top:
        ordered.append(step)
        ordered += [part for _, part in sorted(parts.get(step["step_id"], ()), key=_first)]
    return ordered


def shown_name(step_id: str, label: str) -> str:
    """A step as people read it: its id, or a part's label with its id (to quote to `reach`)."""
    return f"{label} ({step_id})" if label else step_id


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def _link_label(n: int) -> str:
    """A verified write's n-th part: writes at even n, each followed by its read-back."""
    what = "read back" if n % 2 else "write"
    return what if n < 2 else f"{what} #{n // 2 + 1}"


def _element_label(step: Mapping[str, Any], parent: Mapping[str, Any], n: int) -> str:
    args, shared = step.get("args"), parent.get("args")
    if isinstance(args, Mapping) and isinstance(shared, Mapping):
        own = [name for name in args if name not in shared]
        if len(own) == 1:
            said = _element_said(own[0], args[own[0]])
            if said:
                return said
    return f"#{n}"


def _element_said(name: str, value: Any) -> str | None:
    if isinstance(value, Mapping) and isinstance(value.get("channel"), str):
        to = value.get("to")
        where = to if _plain(to, longest=_LONGEST_ADDRESS) else _host(value.get("url"))
        return f"{value['channel']} to {where}" if where else str(value["channel"])
    if isinstance(value, bool):
        return f"{name} {'true' if value else 'false'}"
    if isinstance(value, int | float):
        return f"{name} {value}"
    host = _host(value)
    if host or _plain(value):
        return f"{name} {host or value}"
    return None


def _plain(value: Any, *, longest: int = _LONGEST_NAME) -> bool:
    """A short one-line string that is not a reference (resolved only when the step runs)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= longest
        and not value.startswith("$")
        and value.isprintable()
    )


def _host(value: Any) -> str | None:
    """A URL's host and port: its path, query and user may hold a secret."""
    if not isinstance(value, str) or "://" not in value:
        return None
    try:
        netloc = urlsplit(value).netloc
    except ValueError:
        return None
    return netloc.rpartition("@")[2] or None


# --- the task's state -----------------------------------------------------------------------


@dataclass(slots=True)
class StepState:
    step_id: str
    tool: str
    depends_on: tuple[str, ...]  # as planned: a part's siblings, a step's own parts left out
    label: str = ""  # what a part is (`write`, `email to …`); "" for a planned step
    part_of: str | None = None  # the step a part belongs to
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
    """The plan of a task (`GET /v1/tasks/{id}`) as it was before its first event: its steps
    in plan order, each followed by its parts."""
    steps = in_plan_order(task["steps"])
    labels = part_labels(steps)
    owner = {
        s["step_id"]: found[0]
        for s in steps
        if s["step_id"] in labels and (found := part_of(s["step_id"])) is not None
    }
    # A step with parts waits on them alone: what it waits on as planned is what they wait on.
    planned: dict[str, list[str]] = {}
    for s in steps:
        if s["step_id"] in owner:
            planned.setdefault(owner[s["step_id"]], []).extend(s.get("depends_on", ()))
    states: dict[str, StepState] = {}
    for s in steps:
        step_id = s["step_id"]
        depends_on = planned.get(step_id, s.get("depends_on", ()))
        mine = owner.get(step_id, step_id)  # a step's own parts, or a part's siblings
        states[step_id] = StepState(
            step_id=step_id,
            tool=s["tool"],
            depends_on=tuple(dict.fromkeys(d for d in depends_on if owner.get(d) != mine)),
            label=labels.get(step_id, ""),
            part_of=owner.get(step_id),
        )
    return TaskState(
        task_id=task["task_id"],
        status="pending",
        created_at=_when(task.get("created_at")),
        steps=states,
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
    name = shown_name(step.step_id, step.label)
    return f"{clock}  {name}: {move} (attempt {step.attempt}, {event.get('kind')})"


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
    """Each step's children (in plan order) and the roots: a part hangs under its step, before
    the steps that wait on it; any other step's parent is the dependency that comes latest in
    the plan (the plan is acyclic, so this is a tree)."""
    order = {step_id: i for i, step_id in enumerate(state.steps)}
    parts: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for step in state.steps.values():
        known = [d for d in step.depends_on if d in order]
        if step.part_of in order:
            parts.setdefault(step.part_of, []).append(step.step_id)
        elif known:
            children.setdefault(max(known, key=order.__getitem__), []).append(step.step_id)
        else:
            roots.append(step.step_id)
    return {s: parts.get(s, []) + children.get(s, []) for s in order}, roots


def _step_line(state: TaskState, step_id: str, now: datetime, unicode: bool) -> str:
    step = state.steps[step_id]
    mark = _MARKS.get(step.status, ("·", "."))[0 if unicode else 1]
    parts = [f"{mark} {shown_name(step.step_id, step.label)}", step.tool, step.status]
    if step.attempt > 1 or step.started_at is not None:
        parts.append(f"attempt {step.attempt}")
    if step.started_at is not None:
        parts.append(_duration((step.finished_at or now) - step.started_at))
    others = [d for d in step.depends_on if d in state.steps]
    if len(others) > 1 and step.part_of is None:
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
    """An RFC 3339 time, with `Z` or an offset; None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
