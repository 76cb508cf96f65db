"""The two submitted shapes (a plan's steps, OpenAI tool calls) read into step drafts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent_reach_controller.planning.limits import PlanLimits, check_size, check_value
from agent_reach_controller.planning.problems import ProblemCode, ProblemCollector, pointer_join
from agent_reach_controller.tools.catalog import EFFECT_CLASS, EFFECT_NAME, MAX_UNITS

P = ProblemCode
_PLAN_KEYS = frozenset(
    {"goal", "steps", "context", "deadline_seconds", "budget", "priority", "caps"}
)
_STEP_KEYS = frozenset(
    {"step_id", "tool", "args", "depends_on", "when", "retry", "timeouts", "priority"}
)
_OPENAI_KEYS = frozenset(
    {"tool_calls", "context", "deadline_seconds", "budget", "priority", "caps"}
)
# The most classes a task's `caps` may name.
MAX_CAPS = 32
# Higher runs first; the same range for a plan's default and a step's own.
PRIORITY_RANGE = (-1000, 1000)
# The longest deadline a task may ask for: 30 days.
MAX_DEADLINE_S = 30 * 24 * 3600.0
_CALL_KEYS = frozenset({"id", "type", "function"})
_FUNCTION_KEYS = frozenset({"name", "arguments"})


@dataclass(slots=True, kw_only=True)
class StepDraft:
    """A step as submitted, before validation; `pointers` locate each field in the body."""

    position: int
    base: str
    step_id: str | None = None
    tool: str | None = None
    args: dict[str, Any] | None = None
    depends_on: list[str] = field(default_factory=list)
    when: str | None = None
    retry: dict[str, Any] | None = None
    timeouts: dict[str, Any] | None = None
    priority: int | None = None
    pointers: dict[str, str] = field(default_factory=dict)
    args_addressable: bool = True


def _type_name(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )


def _unknown_keys(
    raw: dict[str, Any], allowed: frozenset[str], base: str, out: ProblemCollector
) -> None:
    for key in raw:
        if key not in allowed:
            expected = ", ".join(sorted(allowed))
            out.add(
                pointer_join(base, str(key)), P.UNKNOWN_FIELD, f"unknown field; expected {expected}"
            )


def _string(raw: dict[str, Any], key: str, pointer: str, out: ProblemCollector) -> str | None:
    """raw[key] as a string; problems when missing (None returned) or not a string."""
    if key not in raw:
        out.add(pointer, P.MISSING_FIELD, f"{key!r} is required")
        return None
    value = raw[key]
    if not isinstance(value, str):
        out.add(pointer, P.INVALID_TYPE, f"{key!r} must be a string, not {_type_name(value)}")
        return None
    return value


def _object(value: Any, pointer: str, what: str, out: ProblemCollector) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    out.add(pointer, P.INVALID_TYPE, f"{what} must be an object, not {_type_name(value)}")
    return None


def _parse_step(raw: Any, position: int, out: ProblemCollector) -> StepDraft | None:
    base = f"/steps/{position}"
    if not isinstance(raw, dict):
        out.add(base, P.INVALID_TYPE, f"a step must be an object, not {_type_name(raw)}")
        return None
    _unknown_keys(raw, _STEP_KEYS, base, out)
    ptr = {k: f"{base}/{k}" for k in _STEP_KEYS}
    draft = StepDraft(position=position, base=base, pointers=ptr)
    draft.step_id = _string(raw, "step_id", ptr["step_id"], out)
    draft.tool = _string(raw, "tool", ptr["tool"], out)
    draft.args = _object(raw.get("args", {}), ptr["args"], "'args'", out)
    deps = raw.get("depends_on", [])
    if not isinstance(deps, list):
        out.add(ptr["depends_on"], P.INVALID_TYPE, "'depends_on' must be an array of step ids")
    else:
        for index, dep in enumerate(deps):
            if isinstance(dep, str):
                draft.depends_on.append(dep)
            else:
                out.add(
                    f"{ptr['depends_on']}/{index}", P.INVALID_TYPE, "a step id must be a string"
                )
    if raw.get("retry") is not None:
        draft.retry = _object(raw["retry"], ptr["retry"], "'retry'", out)
    if raw.get("priority") is not None:
        draft.priority = read_priority(raw["priority"], ptr["priority"], out)
    if raw.get("timeouts") is not None:
        draft.timeouts = _object(raw["timeouts"], ptr["timeouts"], "'timeouts'", out)
    if raw.get("when") is not None:
        when = raw["when"]
        if isinstance(when, str):
            draft.when = when
        else:
            out.add(ptr["when"], P.INVALID_TYPE, "'when' must be a CEL expression string")
    return draft


def _call_arguments(raw: Any, pointer: str, out: ProblemCollector) -> dict[str, Any] | None:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            out.add(pointer, P.INVALID_ARGUMENTS, f"arguments are not valid JSON: {exc}")
            return None
    return _object(raw, pointer, "arguments", out)


def _parse_call(raw: Any, position: int, out: ProblemCollector) -> StepDraft | None:
    base = f"/tool_calls/{position}"
    if not isinstance(raw, dict):
        out.add(base, P.INVALID_TYPE, f"a tool call must be an object, not {_type_name(raw)}")
        return None
    _unknown_keys(raw, _CALL_KEYS, base, out)
    fn_base = f"{base}/function"
    ptr = {
        "step_id": f"{base}/id",
        "tool": f"{fn_base}/name",
        "args": f"{fn_base}/arguments",
        "depends_on": f"{base}/depends_on",
        "when": f"{base}/when",
    }
    draft = StepDraft(position=position, base=base, pointers=ptr)
    draft.step_id = _string(raw, "id", ptr["step_id"], out)
    if raw.get("type", "function") != "function":
        out.add(f"{base}/type", P.INVALID_TYPE, "only tool calls of type 'function' are supported")
    function = _object(raw.get("function"), fn_base, "'function'", out)
    if function is None:
        return draft
    _unknown_keys(function, _FUNCTION_KEYS, fn_base, out)
    draft.tool = _string(function, "name", ptr["tool"], out)
    arguments = function.get("arguments", "{}")
    draft.args_addressable = not isinstance(arguments, str)
    draft.args = _call_arguments(arguments, ptr["args"], out)
    return draft


def read_body(body: Any, limits: PlanLimits, out: ProblemCollector) -> tuple[str, list[StepDraft]]:
    """The submitted shape and its step drafts; top-level problems go to `out`."""
    if not isinstance(body, dict):
        out.add("", P.INVALID_TYPE, f"a plan must be an object, not {_type_name(body)}")
        return "plan", []
    openai = "tool_calls" in body
    source = "openai" if openai else "plan"
    key, parse = ("tool_calls", _parse_call) if openai else ("steps", _parse_step)
    _unknown_keys(body, _OPENAI_KEYS if openai else _PLAN_KEYS, "", out)
    if key not in body:
        out.add("/steps", P.MISSING_FIELD, "'steps' (or OpenAI 'tool_calls') is required")
        return "plan", []
    items = body[key]
    if not isinstance(items, list):
        out.add(f"/{key}", P.INVALID_TYPE, f"{key!r} must be an array")
        return source, []
    if not items:
        out.add(f"/{key}", P.MISSING_FIELD, f"{key!r} is empty: a plan needs at least one step")
        return source, []
    if len(items) > limits.max_steps:
        detail = f"{len(items):,} steps; the limit is {limits.max_steps:,}"
        out.add(f"/{key}", P.TOO_LARGE, detail)
        return source, []
    drafts = [parse(raw, i, out) for i, raw in enumerate(items)]
    return source, [d for d in drafts if d is not None]


def read_goal(body: Any, limits: PlanLimits, out: ProblemCollector) -> str | None:
    """The plan's goal, if any (OpenAI tool calls have none)."""
    if not isinstance(body, dict) or body.get("goal") is None or "tool_calls" in body:
        return None
    goal = body["goal"]
    if not isinstance(goal, str):
        out.add("/goal", P.INVALID_TYPE, "'goal' must be a string")
        return None
    if len(goal) > limits.max_goal_length:
        out.add(
            "/goal",
            P.TOO_LARGE,
            f"the goal is {len(goal):,} characters; the limit is {limits.max_goal_length:,}",
        )
    return goal


def read_context(body: Any, limits: PlanLimits, out: ProblemCollector) -> dict[str, Any]:
    """The task context ({} when absent), checked for numbers, strings, depth and size."""
    if not isinstance(body, dict) or body.get("context") is None:
        return {}
    context = _object(body["context"], "/context", "'context'", out)
    if context is None:
        return {}
    problems, within_depth = check_value(context, pointer="/context", limits=limits)
    out.extend(problems)
    if within_depth:
        size = check_size(
            context, pointer="/context", limit=limits.max_context_bytes, what="context"
        )
        if size is not None:
            out.extend([size])
    return context


def read_deadline(body: Any, out: ProblemCollector) -> float | None:
    """`deadline_seconds`: the task ends, with receipts, this long after it is accepted."""
    if not isinstance(body, dict) or body.get("deadline_seconds") is None:
        return None
    value = body["deadline_seconds"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        out.add("/deadline_seconds", P.INVALID_TYPE, "'deadline_seconds' must be a number")
        return None
    if not 0 < value <= MAX_DEADLINE_S:
        out.add(
            "/deadline_seconds",
            P.TOO_LARGE if value > 0 else P.INVALID_TYPE,
            f"'deadline_seconds' must be more than 0 and at most {MAX_DEADLINE_S:,.0f}",
        )
        return None
    return float(value)


def read_priority(value: Any, pointer: str, out: ProblemCollector) -> int | None:
    """A priority: an integer in PRIORITY_RANGE (higher is dispatched first)."""
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        out.add(pointer, P.INVALID_TYPE, f"a priority must be an integer from {low} to {high}")
        return None
    return value


def read_budget(body: Any, out: ProblemCollector) -> int | None:
    """`budget.max_attempts`: attempts the whole task may spend, across all its steps."""
    if not isinstance(body, dict) or body.get("budget") is None:
        return None
    budget = _object(body["budget"], "/budget", "'budget'", out)
    if budget is None:
        return None
    _unknown_keys(budget, frozenset({"max_attempts"}), "/budget", out)
    value = budget.get("max_attempts")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        out.add("/budget/max_attempts", P.INVALID_TYPE, "'max_attempts' must be an integer >= 1")
        return None
    return value


def read_caps(body: Any, out: ProblemCollector) -> dict[str, float] | None:
    """`caps`: the most units of each class of side effects the whole task may use."""
    if not isinstance(body, dict) or body.get("caps") is None:
        return None
    caps = _object(body["caps"], "/caps", "'caps'", out)
    if caps is None:
        return None
    if len(caps) > MAX_CAPS:
        out.add("/caps", P.TOO_LARGE, f"{len(caps):,} caps; the limit is {MAX_CAPS}")
        return None
    found: dict[str, float] = {}
    for name, value in caps.items():
        where = pointer_join("/caps", str(name))
        if not isinstance(name, str) or EFFECT_NAME.fullmatch(name) is None:
            out.add(where, P.INVALID_TYPE, f"a cap names a class of effects: {EFFECT_CLASS}")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            out.add(where, P.INVALID_TYPE, f"a cap must be a number, not {_type_name(value)}")
        elif not 0 <= value <= MAX_UNITS:  # NaN fails this too
            out.add(where, P.INVALID_NUMBER, f"a cap must be from 0 to {MAX_UNITS:g}")
        else:
            found[name] = float(value)
    return found or None
