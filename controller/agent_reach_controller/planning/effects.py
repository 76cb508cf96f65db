"""What a tool call charges against blast-radius caps, and a plan that can never fit its own caps.

A tool declares units per class of side effects (`effects: {payment: 1}`) and its `cost`, each
a number or a CEL expression over the call's arguments (`size(args.rows)`). Units are counted
to a millionth, so 0.1 + 0.2 fits a cap of 0.3. Counting against caps at dispatch is in
`flow/caps.py` (rules) and `state/caps.py` (counters).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_reach_controller.planning.conditions import ConditionError, evaluate_key
from agent_reach_controller.planning.problems import Problem, ProblemCode
from agent_reach_controller.planning.references import find_references, unescape
from agent_reach_controller.tools.catalog import COST, ToolSpec

PRECISION = 6


class UnitsError(Exception):
    """A units expression could not be evaluated to a number >= 0 over a step's arguments."""


def declared(tool: ToolSpec) -> dict[str, float | str]:
    """The units a tool declares per class (its effects, and `cost` when it has one)."""
    units: dict[str, float | str] = dict(tool.effects)
    if tool.cost is not None:
        units[COST] = tool.cost
    return units


def charges_of(tool: ToolSpec, args: Mapping[str, Any]) -> dict[str, float]:
    """Units one call of `tool` with these (resolved) arguments charges, per class (0 left out).

    Raises UnitsError when an expression cannot be evaluated or does not give a number >= 0.
    """
    out: dict[str, float] = {}
    for effect, units in declared(tool).items():
        value = units if isinstance(units, float) else _evaluate(effect, units, args)
        if round(value, PRECISION) > 0:
            out[effect] = round(value, PRECISION)
    return out


def _evaluate(effect: str, source: str, args: Mapping[str, Any]) -> float:
    try:
        value = evaluate_key(source, args)
    except ConditionError as exc:
        raise UnitsError(f"its {effect!r} units could not be computed: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnitsError(f"its {effect!r} units {source!r} gave {value!r:.60}, not a number")
    if not math.isfinite(value) or value < 0:
        raise UnitsError(f"its {effect!r} units {source!r} gave {value!r}, not a number >= 0")
    return float(value)


def known_charges(tool: ToolSpec, args: Mapping[str, Any]) -> dict[str, float]:
    """What a step will charge, as far as it is known before it runs.

    Numbers always; an expression only when the arguments hold no `$step.output` reference
    (and it evaluates). Classes not yet known are left out: this is a lower bound.
    """
    plain = not find_references(args)
    values = unescape(dict(args)) if plain else {}
    out: dict[str, float] = {}
    for effect, units in declared(tool).items():
        value = units if isinstance(units, float) else None
        if isinstance(units, str) and plain:
            # One that fails is refused, with its reason, when it is about to run.
            with contextlib.suppress(UnitsError):
                value = _evaluate(effect, units, values)
        if value is not None and round(value, PRECISION) > 0:
            out[effect] = round(value, PRECISION)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticStep:
    """A step of a submitted plan, as the submit-time cap check sees it."""

    step_id: str
    pointer: str  # the step in the body: "/steps/3", "/tool_calls/0"
    depends_on: Sequence[str]
    conditional: bool  # it has a `when`
    charges: Mapping[str, float]  # known_charges


def cap_problems(steps: Sequence[StaticStep], caps: Mapping[str, float]) -> list[Problem]:
    """One problem per cap the plan's certain steps already exceed, at the step that crosses it.

    Certain: steps without a `when` none of whose dependencies (transitively) has one; every
    one of them runs if the task is to succeed, so a plan they overrun can never succeed.
    Steps are counted in submission order.
    """
    certain = _unconditional(steps)
    used: dict[str, float] = {}
    who: dict[str, list[str]] = {}
    problems: list[Problem] = []
    for step in steps:
        if step.step_id not in certain:
            continue
        for effect, units in step.charges.items():
            if effect not in caps or (effect in who and used[effect] > caps[effect]):
                continue
            used[effect] = round(used.get(effect, 0.0) + units, PRECISION)
            who.setdefault(effect, []).append(step.step_id)
            if used[effect] > caps[effect]:
                names = ", ".join(who[effect][:5]) + (", …" if len(who[effect]) > 5 else "")
                steps_word = "step" if len(who[effect]) == 1 else "steps"
                problems.append(
                    Problem(
                        pointer=step.pointer,
                        code=ProblemCode.CAP_EXCEEDED,
                        detail=f"with this step the plan uses {used[effect]:g} of {effect!r} "
                        f"({steps_word} {names}), over its cap of {caps[effect]:g}",
                    )
                )
    return problems


def _unconditional(steps: Sequence[StaticStep]) -> set[str]:
    """Ids of steps with no `when` on themselves or on any step they depend on (no recursion)."""
    by_id = {s.step_id: s for s in steps}
    plain: dict[str, bool] = {}
    for root in by_id:
        stack = [root]
        entered: set[str] = set()  # a cycle (never in a valid plan) counts as conditional
        while stack:
            step = by_id[stack[-1]]
            if step.step_id in plain:
                stack.pop()
                continue
            entered.add(step.step_id)
            pending = [
                d for d in step.depends_on if d in by_id and d not in plain and d not in entered
            ]
            if pending:
                stack.extend(pending)
                continue
            plain[step.step_id] = not step.conditional and all(
                plain.get(d, False) for d in step.depends_on
            )
            stack.pop()
    return {step_id for step_id, ok in plain.items() if ok}
