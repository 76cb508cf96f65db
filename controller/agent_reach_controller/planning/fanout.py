"""Fan-out steps: one child step per element of a tool's array argument (`ToolSpec.fan_out`).

A fan-out step is split at submit: each element becomes a child `<id>[<n>]` (ids a plan cannot
spell) with the step's dependencies, condition, schedule and policies, and the step itself waits
on its children. It never runs: once every child has ended, `decide/advance.py` gathers their
records into its output and receipt. The array's length is what it is at submit, so the array
must be written out (its elements may still hold references).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agent_reach_controller.planning.problems import Problem, ProblemCode, pointer_join
from agent_reach_controller.planning.references import STEP_ID_PATTERN, parse_reference
from agent_reach_controller.tools.catalog import ToolSpec

if TYPE_CHECKING:
    from agent_reach_controller.planning.plan import PlannedStep

_MAX_ID = 64


def child_id(step_id: str, n: int) -> str:
    return f"{step_id}[{n}]"


def parent_of(step_id: str) -> str | None:
    """The fan-out step a child belongs to; None for any other step."""
    head, bracket, _ = step_id.partition("[")
    return head if bracket else None


def gathers(step_id: str, tool: ToolSpec) -> bool:
    """Whether the step is a fan-out or verified step: it waits on its children, never runs."""
    has_children = tool.fan_out is not None or tool.verify is not None
    return has_children and parent_of(step_id) is None


def problems(step_id: str, tool: ToolSpec, args: Mapping[str, Any], base: str) -> list[Problem]:
    """Why the step cannot be split at submit: its array is a reference, empty or too long."""
    assert tool.fan_out is not None
    over = tool.fan_out.over
    where = pointer_join(base, over)
    items = args.get(over)
    if isinstance(items, str) and parse_reference(items) is not None:
        detail = f"'{over}' must be written out as an array: its length decides the steps at submit"
        return [Problem(pointer=where, code=ProblemCode.INVALID_ARGUMENTS, detail=detail)]
    if not isinstance(items, list):
        return []  # the schema says what is wrong
    if not items:
        detail = f"'{over}' needs at least one element"
        return [Problem(pointer=where, code=ProblemCode.INVALID_ARGUMENTS, detail=detail)]
    if len(items) > tool.fan_out.max:
        detail = f"{len(items)} elements in '{over}'; tool {tool.name!r} takes {tool.fan_out.max}"
        return [Problem(pointer=where, code=ProblemCode.TOO_LARGE, detail=detail)]
    longest = child_id(step_id, len(items) - 1)
    if len(longest) > _MAX_ID or not STEP_ID_PATTERN.match(step_id):
        detail = f"step id {step_id!r:.80} leaves no room for its children's ids ({longest!r:.80})"
        return [Problem(pointer=base, code=ProblemCode.INVALID_STEP_ID, detail=detail)]
    return []


def split(steps: Iterable[PlannedStep], tool_of: Mapping[str, ToolSpec]) -> list[PlannedStep]:
    """The steps with each fan-out step's children added; the step then waits on them alone."""
    out: list[PlannedStep] = []
    children: list[PlannedStep] = []
    planned = list(steps)
    position = max((s.position for s in planned), default=-1) + 1
    for step in planned:
        tool = tool_of[step.tool]
        if tool.fan_out is None:
            out.append(step)
            continue
        mine = [
            replace(step, step_id=child_id(step.step_id, n), args=args, position=position + n)
            for n, args in enumerate(child_args(tool, step.args))
        ]
        position += len(mine)
        children.extend(mine)
        out.append(
            replace(
                step,
                depends_on=tuple(c.step_id for c in mine),
                when=None,
                run_at=None,
                delay_s=None,
            )
        )
    return out + children


def child_args(tool: ToolSpec, args: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    """The arguments of each child, in order."""
    assert tool.fan_out is not None
    over, one = tool.fan_out.over, tool.fan_out.as_
    shared = {k: v for k, v in args.items() if k != over}
    for item in args[over]:
        yield {**shared, one: item}
