"""Plan problems: what is wrong with a submitted plan, where (RFC 6901 pointer), in stable codes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class ProblemCode(StrEnum):
    """Stable problem codes; clients may switch on them."""

    INVALID_TYPE = "invalid_type"
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"
    DUPLICATE_STEP_ID = "duplicate_step_id"
    INVALID_STEP_ID = "invalid_step_id"
    UNKNOWN_DEPENDENCY = "unknown_dependency"
    SELF_DEPENDENCY = "self_dependency"
    CYCLE = "cycle"
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_DISABLED = "tool_disabled"
    UNDECLARED_REFERENCE = "undeclared_reference"
    UNKNOWN_REFERENCE = "unknown_reference"
    INVALID_REFERENCE = "invalid_reference"
    INVALID_ARGUMENTS = "invalid_arguments"
    INVALID_CONDITION = "invalid_condition"
    TOO_LARGE = "too_large"
    INVALID_NUMBER = "invalid_number"
    UNGROUNDED_ARGUMENT = "ungrounded_argument"
    CAP_EXCEEDED = "cap_exceeded"
    # A call in a model's turn to a tool its caller may not use (a plan gets 403 instead).
    FORBIDDEN = "forbidden"
    # A trigger's template uses a name a run gives its own meaning (`event`).
    RESERVED = "reserved"
    # A trigger's event lacks a part its template reads (`$event.order.id`).
    MISSING_EVENT_FIELD = "missing_event_field"


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One thing wrong with a submission: a JSON pointer into the body, a code and a sentence."""

    pointer: str
    code: str
    detail: str


class PlanInvalidError(Exception):
    """The plan was rejected; `problems` holds every problem found, in discovery order."""

    def __init__(self, problems: list[Problem]) -> None:
        first = problems[0] if problems else None
        summary = f"{first.pointer or '/'}: {first.detail}" if first else "invalid plan"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"invalid plan: {summary}{more}")
        self.problems = problems


class ProblemCollector:
    """Collects problems up to the limit, after which one closing too_large problem is kept."""

    def __init__(self, limit: int) -> None:
        self.items: list[Problem] = []
        self._limit = limit

    def add(self, pointer: str, code: str, detail: str) -> None:
        """Record one problem (or, once over the limit, the single closing problem)."""
        if len(self.items) < self._limit:
            self.items.append(Problem(pointer=pointer, code=code, detail=detail))
        elif len(self.items) == self._limit:
            detail = f"more than {self._limit} problems; only the first {self._limit} are listed"
            self.items.append(Problem(pointer="", code=ProblemCode.TOO_LARGE, detail=detail))

    def extend(self, problems: list[Problem]) -> None:
        """Record several problems."""
        for p in problems:
            self.add(p.pointer, p.code, p.detail)


def escape_token(token: str | int) -> str:
    """One reference token escaped for a JSON pointer ('~' -> '~0', '/' -> '~1')."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer_join(base: str, *tokens: str | int) -> str:
    """`base` extended by escaped `tokens`: ('/steps/0', 'args', 'a/b') -> '/steps/0/args/a~1b'."""
    return base + "".join("/" + escape_token(t) for t in tokens)


def pointer_from(tokens: Iterable[str | int]) -> str:
    """A pointer from the root made of `tokens`."""
    return pointer_join("", *tokens)
