"""Size limits of a plan and the checks of JSON values against them (depth, strings, numbers)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from agent_reach_controller.planning.problems import Problem, ProblemCode, pointer_join


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanLimits:
    """Bounds a submitted plan must respect; sizes in bytes or characters."""

    max_steps: int = 1000
    max_args_bytes: int = 256 * 1024  # per step, canonical JSON, UTF-8
    max_context_bytes: int = 256 * 1024  # canonical JSON, UTF-8
    max_depth: int = 32  # nesting of objects and arrays; the args object itself is depth 1
    max_string_length: int = 64 * 1024  # characters, keys included
    max_condition_length: int = 2 * 1024
    max_goal_length: int = 4 * 1024
    max_problems: int = 1000  # after this many, the report is cut short


DEFAULT_LIMITS = PlanLimits()


def canonical_size(value: Any) -> int:
    """Length in UTF-8 bytes of the canonical JSON of `value` (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8", errors="surrogatepass"))


def _scalar_problem(value: Any, pointer: str, limits: PlanLimits) -> Problem | None:
    if isinstance(value, str):
        if len(value) > limits.max_string_length:
            return Problem(
                pointer=pointer,
                code=ProblemCode.TOO_LARGE,
                detail=f"string of {len(value):,} characters; the limit is "
                f"{limits.max_string_length:,}",
            )
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return Problem(
            pointer=pointer,
            code=ProblemCode.INVALID_NUMBER,
            detail=f"{value!r} is not a JSON number; NaN and Infinity are not allowed",
        )
    if value is None or isinstance(value, bool | int | float):
        return None
    return Problem(
        pointer=pointer,
        code=ProblemCode.INVALID_TYPE,
        detail=f"{type(value).__name__} is not a JSON value",
    )


def _key_problem(key: Any, pointer: str, limits: PlanLimits) -> Problem | None:
    if not isinstance(key, str):
        return Problem(
            pointer=pointer, code=ProblemCode.INVALID_TYPE, detail="keys must be strings"
        )
    if len(key) > limits.max_string_length:
        return Problem(
            pointer=pointer,
            code=ProblemCode.TOO_LARGE,
            detail=f"key of {len(key):,} characters; the limit is {limits.max_string_length:,}",
        )
    return None


def check_value(value: Any, *, pointer: str, limits: PlanLimits) -> tuple[list[Problem], bool]:
    """Problems of a JSON value (NaN/Infinity, long strings, depth, non-JSON types).

    Returns (problems, within_depth); when within_depth is False the value was not fully walked
    and must not be serialised or validated further. Iterative, so hostile depth cannot crash it.
    """
    problems: list[Problem] = []
    within_depth = True
    stack: list[tuple[Any, str, int]] = [(value, pointer, 1)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limits.max_depth:
                within_depth = False
                problems.append(
                    Problem(
                        pointer=where,
                        code=ProblemCode.TOO_LARGE,
                        detail=f"nested deeper than {limits.max_depth} levels",
                    )
                )
                continue
            if isinstance(item, dict):
                for key, child in reversed(list(item.items())):
                    child_pointer = pointer_join(where, str(key))
                    key_problem = _key_problem(key, child_pointer, limits)
                    if key_problem is not None:
                        problems.append(key_problem)
                    stack.append((child, child_pointer, depth + 1))
            else:
                stack.extend(
                    (child, pointer_join(where, i), depth + 1)
                    for i, child in reversed(list(enumerate(item)))
                )
            continue
        problem = _scalar_problem(item, where, limits)
        if problem is not None:
            problems.append(problem)
    return problems, within_depth


def check_size(value: Any, *, pointer: str, limit: int, what: str) -> Problem | None:
    """A too_large problem when the canonical JSON of `value` exceeds `limit` bytes."""
    try:
        size = canonical_size(value)
    except (TypeError, ValueError):  # non-JSON content, already reported by check_value
        return None
    if size <= limit:
        return None
    return Problem(
        pointer=pointer,
        code=ProblemCode.TOO_LARGE,
        detail=f"{what} is {size:,} bytes as JSON; the limit is {limit:,}",
    )
