"""Verified writes: a write step whose tool declares `verify` runs as a chain of child steps.

`W[0]` writes, `W[1]` reads it back with the check tool; when the tool retries on a mismatch,
`W[2]` writes again (under `W`'s idempotency key, like every write of the chain) only if the
check did not hold, `W[3]` checks that, and so on, `verify.attempts` writes at most. `W` waits on
the chain and never runs: `decide/advance.py` decides each link (a check's arguments from the
write's, whether a rewrite is needed) and then gathers `W` from the last write that ran and its
check: `meta.verified` true or false, and on a mismatch the tool's policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agent_reach_controller.planning.conditions import ConditionError, evaluate_over
from agent_reach_controller.planning.fanout import child_id
from agent_reach_controller.tools.catalog import ToolSpec, Verify

if TYPE_CHECKING:
    from agent_reach_controller.planning.plan import PlannedStep


def split(steps: Iterable[PlannedStep], tool_of: Mapping[str, ToolSpec]) -> list[PlannedStep]:
    """The steps with each verified write's chain added; the write then waits on it alone."""
    out: list[PlannedStep] = []
    chains: list[PlannedStep] = []
    planned = list(steps)
    position = max((s.position for s in planned), default=-1) + 1
    for step in planned:
        check = tool_of[step.tool].verify
        if check is None:
            out.append(step)
            continue
        reader = tool_of[check.tool]
        chain: list[PlannedStep] = []
        for n in range(check.writes):
            after = (chain[-1].step_id,) if chain else ()
            write = replace(
                step,
                step_id=child_id(step.step_id, 2 * n),
                depends_on=(*step.depends_on, *after),
                when=step.when if n == 0 else None,
                position=position,
                key_of=step.step_id,
            )
            read = replace(
                step,
                step_id=child_id(step.step_id, 2 * n + 1),
                tool=reader.name,
                tool_version=reader.version,
                args={},  # made from the write's when it is due (`check_args`)
                depends_on=(write.step_id,),
                when=None,
                position=position + 1,
                retry=None,
                timeouts=None,
                run_at=None,
                delay_s=None,
            )
            chain += [write, read]
            position += 2
        chains += chain
        depends_on = tuple(c.step_id for c in chain)
        out.append(replace(step, depends_on=depends_on, when=None, run_at=None, delay_s=None))
    return out + chains


def link(step_id: str) -> tuple[str, int] | None:
    """(the verified step, n) for its n-th link; None for any other step id."""
    head, bracket, tail = step_id.partition("[")
    if not bracket or not tail.endswith("]") or not tail[:-1].isdigit():
        return None
    return head, int(tail[:-1])


def check_args(check: Verify, write_args: Any, write_output: Any) -> dict[str, Any]:
    """The check's arguments, from the write's; ConditionError if one cannot be computed."""
    scope = {"args": write_args, "output": write_output}
    return {name: evaluate_over(source, scope) for name, source in check.args.items()}


@dataclass(frozen=True, slots=True)
class Verdict:
    holds: bool | None  # None: the condition could not be evaluated
    reason: str


def holds(check: Verify, write_args: Any, write_output: Any, read_output: Any) -> Verdict:
    """Whether the check's condition holds over the write and what was read back."""
    scope = {"args": write_args, "output": write_output, "check": read_output}
    try:
        value = evaluate_over(check.condition, scope)
    except ConditionError as exc:
        return Verdict(None, f"the check's condition could not be evaluated: {exc}")
    if not isinstance(value, bool):
        return Verdict(None, f"the check's condition gave {type(value).__name__}, not bool")
    said = "holds" if value else "does not hold"
    return Verdict(value, f"the check's condition {said}: {check.condition}")
