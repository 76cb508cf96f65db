"""Plan templates of triggers: `$event` strings, found when a template is saved, filled at a run.

A template is a plan (the `plan` dialect) some of whose strings stand for a part of the event
that starts a run: the whole string `$event` is the event, `$event.order.id` a part of it
(integer segments index lists), with the type the event gives it. `$$event` is the literal text
`$event`. What an event fills into arguments is data: its strings are escaped so that none is
read as a `$step.output` reference, and each step receives the event's very bytes. Only step
arguments and the context are filled; tools, ids, dependencies, conditions and times are the
template's own.

`event` is reserved: no step may be called so. The template's context may hold neither `event`
nor `trigger`, for a run's context holds the event and where it came from there (conditions read
them as `context.event` and `context.trigger`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agent_reach_controller.planning.problems import (
    PlanInvalidError,
    Problem,
    ProblemCode,
    pointer_join,
)
from agent_reach_controller.planning.references import escape, follow, transform

EVENT = "event"
ORIGIN = "trigger"
_EVENT = re.compile(r"^\$event(?P<rest>\..*)?$", re.DOTALL)
_PATH = re.compile(r"^(?:\.[^.]+)+$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class EventReference:
    pointer: str
    path: tuple[str, ...]


def parse(text: str, pointer: str = "") -> EventReference | Problem | None:
    """A string's reading: a reference to the event, a malformed one, or None (plain text)."""
    match = _EVENT.match(text)
    if match is None:
        return None
    rest = match.group("rest") or ""
    if rest and not _PATH.match(rest):
        detail = f"{text[:80]!r}: the path after $event must be .key or .index parts, e.g. .items.0"
        return Problem(pointer=pointer, code=ProblemCode.INVALID_REFERENCE, detail=detail)
    return EventReference(pointer=pointer, path=tuple(rest.split(".")[1:]))


def _strings(value: Any, pointer: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield pointer, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, pointer_join(pointer, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, pointer_join(pointer, index))


def references(value: Any, pointer: str = "") -> tuple[list[EventReference], list[Problem]]:
    """The event references in `value` and the malformed ones (pointers under `pointer`)."""
    found: list[EventReference] = []
    bad: list[Problem] = []
    for where, text in _strings(value, pointer):
        read = parse(text, where)
        if isinstance(read, EventReference):
            found.append(read)
        elif read is not None:
            bad.append(read)
    return found, bad


def is_reference(value: Any) -> bool:
    return isinstance(value, str) and isinstance(parse(value), EventReference)


def fill(template: dict[str, Any], event: Any, origin: dict[str, Any]) -> dict[str, Any]:
    """The plan a run submits: the template with its event references replaced by the event's
    parts, and the event and its `origin` (trigger, version, event id) in the context.
    PlanInvalidError names each part the event lacks, at its place in the template."""
    missing: list[Problem] = []

    def filler(*, as_args: bool) -> Callable[[str, str], Any]:
        def on_string(text: str, pointer: str) -> Any:
            read = parse(text, pointer)
            if not isinstance(read, EventReference):
                return text
            try:
                part = follow(event, read.path, "$event")
            except LookupError as exc:
                problem = Problem(
                    pointer=pointer, code=ProblemCode.MISSING_EVENT_FIELD, detail=exc.args[0]
                )
                missing.append(problem)
                return None
            # In arguments the event's strings are data, never `$step.output` references.
            return escape(part) if as_args else part

        return on_string

    in_args = filler(as_args=True)
    plan = dict(template)
    plan["steps"] = [
        {**step, "args": transform(step["args"], in_args, f"/steps/{i}/args")}
        if isinstance(step, dict) and "args" in step
        else step
        for i, step in enumerate(template.get("steps", []))
    ]
    context = transform(template.get("context") or {}, filler(as_args=False), "/context")
    if missing:
        raise PlanInvalidError(missing)
    plan["context"] = {**context, EVENT: event, ORIGIN: origin}
    return plan
