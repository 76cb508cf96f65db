"""What every dialect shares: the task options, the reading of a body by its model, replies.

A dialect is one way a caller writes "run these tool calls": a plan of steps, or a model's own
turn as its vendor's SDK dumps it. Each is one module holding one pydantic model of its body,
which is both the validator and the OpenAPI schema, a reader from that model to step drafts, and
the rendering of its replies. Structural problems (a missing call id, a misspelt option) refuse
the request; what is wrong with one call is judged later, call by call (planning/plan.py).
"""

from __future__ import annotations

import difflib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Discriminator, Field, ValidationError

from agent_reach_controller.domain.subjects import MAX_SUBJECT
from agent_reach_controller.planning.problems import (
    Problem,
    ProblemCode,
    ProblemCollector,
    pointer_join,
)
from agent_reach_controller.planning.references import escape
from agent_reach_controller.tools.catalog import EFFECT_CLASS, MAX_UNITS

P = ProblemCode
# The most classes a task's `caps` may name.
MAX_CAPS = 32
# Higher runs first; the same range for a task's default and a step's own.
PRIORITY_RANGE = (-1000, 1000)
# The longest deadline a task may ask for: 30 days.
MAX_DEADLINE_S = 30 * 24 * 3600.0

# Discriminator tags in a union carry this mark: they name a branch, not a field, so they are
# left out of the JSON pointer of a problem (see `read_model`).
TAG = "§"
# The two arms of a vendor's list that mixes calls with other items (see `call_or_other`).
CALL = f"{TAG}call"
OTHER = f"{TAG}other"

Caps = Annotated[
    dict[Annotated[str, Field(pattern=EFFECT_CLASS)], Annotated[float, Field(ge=0, le=MAX_UNITS)]],
    Field(
        max_length=MAX_CAPS,
        description="Blast-radius caps: the most units of each class of side effects (as tools "
        'declare them in `effects`, and `cost`) the whole task may use, e.g. {"payment": 1}. '
        "A step that would go over is not run (cap_exceeded)",
    ),
]


@dataclass(slots=True, kw_only=True)
class StepDraft:
    """A step as submitted, before it is checked against the catalogue; `pointers` locate each
    field in the body, `problems` are what reading this one call found."""

    position: int
    base: str
    step_id: str
    tool: str
    args: dict[str, Any] | None = None
    depends_on: list[str] = field(default_factory=list)
    when: str | None = None
    retry: dict[str, Any] | None = None
    timeouts: dict[str, Any] | None = None
    priority: int | None = None
    run_at: str | None = None
    delay: Any = None
    pointers: dict[str, str] = field(default_factory=dict)
    args_addressable: bool = True
    problems: list[Problem] = field(default_factory=list)


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_attempts: int | None = Field(
        None, ge=1, description="Attempts all steps together may use, first attempts included"
    )


class Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(
        max_length=2048,
        pattern=r"^https?://",
        description="POSTed to once the task ends (`task.finished`, signed as Standard Webhooks "
        "prescribe); its host must be one the operator allows",
    )


class Options(BaseModel):
    """The task's own options, the same in every dialect (beside the dialect's own fields)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    context: dict[str, Any] = Field(
        default_factory=dict,
        description="Facts the task runs with: conditions read them as `context`, grounded "
        "arguments must come from them",
    )
    deadline_seconds: float | None = Field(
        None,
        gt=0,
        le=MAX_DEADLINE_S,
        description="End the task, with receipts, this long after it is accepted",
    )
    budget: Budget | None = None
    priority: int = Field(
        0,
        ge=PRIORITY_RANGE[0],
        le=PRIORITY_RANGE[1],
        description="Dispatch priority of the steps (higher first)",
    )
    caps: Caps | None = None
    webhook: Webhook | None = Field(
        None, description="Announce the task's end here, so nobody need hold a stream open"
    )
    subject: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_SUBJECT,
        description="The end user the task acts for (1-256 characters, no control characters "
        "or surrounding spaces): memory's tools (`memory.save`, `.search`, `.list`, `.forget`) "
        "act for it, and a task without one may not call them",
    )


class OtherItem(BaseModel):
    """An item of a vendor's list that is not a call: kept, not run."""

    model_config = ConfigDict(extra="allow")
    type: str


def call_or_other(call_type: str) -> Discriminator:
    """Tells a vendor's list's calls (items of type `call_type`: the `CALL` arm) from its other
    items (the `OTHER` arm), so a malformed call is refused as a call, never kept as an item."""

    def arm(item: Any) -> str:
        calls = isinstance(item, dict) and item.get("type") == call_type
        return CALL if calls else OTHER

    return Discriminator(arm)


_OPTIONS = tuple(Options.model_fields)
# Options only a plan has: in a model's turn they would be dropped in silence.
_PLAN_ONLY = ("goal",)


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One call's reply, as text for the model: what its receipt says."""

    call_id: str
    text: str
    is_error: bool


class Dialect(ABC):
    """One shape of submission: read into step drafts, answered in its own replies."""

    name: ClassVar[str]
    body: ClassVar[type[Options]]  # the validator and the OpenAPI schema
    calls: ClassVar[str]  # the body's list of calls (or steps)
    # Per-call problems refuse only that call (a failed step with a reply), not the request.
    per_call: ClassVar[bool] = True
    # What a body's calls are, for sentences ("tool call", "tool_use block").
    call_noun: ClassVar[str] = "tool call"
    # The vendor's own fields of the body that are not used (never taken for a misspelt option).
    vendor_fields: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def recognises(self, body: dict[str, Any]) -> bool:
        """Whether an object body is written in this dialect."""

    def misspelt(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        """Keys of a vendor's message that look like a misspelt option: (key, the option); a
        plan's own option (`goal`) comes as (key, key).

        A vendor's own fields are not used and pass unchecked (its SDK adds new ones), so a
        near miss of an option is the one mistake there that must not pass in silence.
        """
        found = [
            (key, key) for key in _PLAN_ONLY if key in body and key not in self.body.model_fields
        ]
        for key in body:
            known = key in self.body.model_fields or key in self.vendor_fields
            if isinstance(key, str) and not known and key not in _PLAN_ONLY:
                close = difflib.get_close_matches(key, _OPTIONS, n=1, cutoff=0.75)
                if close:
                    found.append((key, close[0]))
        return found

    def normalise(self, body: Any) -> tuple[Any, str]:
        """The body its model validates, and the pointer prefix to drop from its problems."""
        return body, ""

    @abstractmethod
    def drafts(self, model: Any, *, prefix: str, out: ProblemCollector) -> list[StepDraft]:
        """The calls of a validated body as step drafts (pointers into the submitted body);
        what refuses the whole request goes to `out`."""

    def goal(self, model: Any) -> str | None:
        return None

    @abstractmethod
    def replies(self, answers: Sequence[Answer]) -> list[dict[str, Any]]:
        """What to append to the conversation for these answers, in this dialect's own shape."""


# Pydantic error types and the problem code each stands for.
_CODES = {
    "missing": P.MISSING_FIELD,
    "extra_forbidden": P.UNKNOWN_FIELD,
    "too_short": P.MISSING_FIELD,
    "too_long": P.TOO_LARGE,
    "less_than": P.TOO_LARGE,
    "less_than_equal": P.TOO_LARGE,
    "greater_than": P.INVALID_NUMBER,
    "greater_than_equal": P.INVALID_NUMBER,
    "finite_number": P.INVALID_NUMBER,
}
_EXPECTED = {
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "an array",
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
}


def type_name(value: Any) -> str:
    """A JSON value's type, as a sentence names it."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )


def read_model(
    model: type[BaseModel], body: Any, out: ProblemCollector, *, prefix: str = ""
) -> Any | None:
    """`body` validated by `model` (strictly: no coercion), or None with every problem in `out`,
    each at its JSON pointer (minus `prefix`) with a stable code."""
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            tokens = [t for t in error["loc"] if not (isinstance(t, str) and t.startswith(TAG))]
            if tokens and tokens[-1] == "[key]":
                tokens.pop()
            pointer = pointer_join("", *tokens)
            shown = tokens
            if prefix and pointer.startswith(prefix):
                pointer, shown = pointer[len(prefix) :], tokens[1:]
            out.add(pointer, *_problem(model, tokens, error, named=bool(shown)))
        return None


def _problem(
    model: type[BaseModel], tokens: list[str | int], error: Any, *, named: bool
) -> tuple[str, str]:
    kind: str = error["type"]
    name = tokens[-1] if tokens and named else None
    label = f"{name!r}" if isinstance(name, str) else "the submission" if name is None else "it"
    if kind == "missing":
        return P.MISSING_FIELD, f"{label} is required"
    if kind == "extra_forbidden":
        allowed = _fields_at(model, tokens[:-1])
        expected = f"; expected {', '.join(sorted(allowed))}" if allowed else ""
        return P.UNKNOWN_FIELD, f"unknown field{expected}"
    if kind == "too_short" and isinstance(error.get("input"), list):
        return P.MISSING_FIELD, f"{label} is empty: at least one is needed"
    if kind in _EXPECTED:
        actual = type_name(error.get("input"))
        return P.INVALID_TYPE, f"{label} must be {_EXPECTED[kind]}, not {actual}"
    message = str(error["msg"]).replace("Input should be", f"{label} must be", 1)
    if kind == "too_long":
        message = f"{label} is too long: {message}"
    return _CODES.get(kind, P.INVALID_TYPE), message


def _fields_at(model: type[BaseModel], tokens: list[str | int]) -> list[str]:
    """The field names of the model at `tokens` inside `model` ([] if it is not a model)."""
    current: Any = model
    for token in tokens:
        current = _inner(current, token)
        if current is None:
            return []
    models = [current] if _is_model(current) else [a for a in get_args(current) if _is_model(a)]
    return list(models[0].model_fields) if len(models) == 1 else []


def _inner(annotation: Any, token: str | int) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Annotated:
        return _inner(args[0], token)
    if args and get_origin(annotation) not in (list, dict):  # Optional / Union: the model arm
        models = [a for a in args if _is_model(a) or get_origin(a) in (list, dict)]
        return _inner(models[0], token) if len(models) == 1 else None
    if isinstance(token, int):
        return args[0] if get_origin(annotation) is list and args else None
    if _is_model(annotation):
        field = annotation.model_fields.get(token)
        return field.annotation if field is not None else None
    if get_origin(annotation) is dict and len(args) == 2:
        return args[1]
    return None


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def call_arguments(raw: Any, draft: StepDraft) -> None:
    """A model's arguments into `draft.args`: a JSON-encoded object (or an object); a problem of
    this call when they are neither. They are data, escaped so that no string of theirs is read
    as a `$step.output` reference: a model (or what it read) must not copy another step's
    output."""
    where = draft.pointers["args"]
    if isinstance(raw, str):
        draft.args_addressable = False
        try:
            raw = json.loads(raw or "{}", parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            draft.problems.append(
                Problem(
                    pointer=where,
                    code=P.INVALID_ARGUMENTS,
                    detail=f"the arguments are not valid JSON: {exc}",
                )
            )
            return
    if not isinstance(raw, dict):
        draft.problems.append(
            Problem(
                pointer=where,
                code=P.INVALID_ARGUMENTS,
                detail=f"the arguments must be a JSON object, not {type_name(raw)}",
            )
        )
        return
    draft.args = escape(raw)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def call_pointers(base: str, *, step_id: str, tool: str, args: str) -> dict[str, str]:
    """The pointers of a model's call: its id, function name and arguments under `base`."""
    return {
        "step_id": f"{base}/{step_id}",
        "tool": f"{base}/{tool}",
        "args": f"{base}/{args}",
        "depends_on": base,
        "when": base,
    }
