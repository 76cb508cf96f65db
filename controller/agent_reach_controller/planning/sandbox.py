"""What a submit may not ask of the `sandbox` environment: writes with nowhere safe to go.

A step of a tool that writes (`write` or `dangerous`) runs there only against the tool's own
`sandbox` target (tools/environments.py). A verified write's check must read that target too,
not production, or it could never see the write: its check tool needs a `sandbox` as well.
Each problem points at the step's `tool`, with code `forbidden`: a plan is refused whole (422),
a model's turn refuses only that call.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent_reach_controller.planning.problems import Problem, ProblemCode
from agent_reach_controller.tools.catalog import ToolSpec
from agent_reach_controller.tools.environments import sandbox_refusal


def problems(
    tool: ToolSpec | None, catalog: Mapping[str, ToolSpec], environment: str, *, pointer: str
) -> list[Problem]:
    """Why a step of `tool` may not be submitted in `environment` (none outside `sandbox`, and
    none for an unknown tool: that is a problem of its own)."""
    if tool is None:
        return []
    refusal = sandbox_refusal(tool, environment)
    if refusal is not None:
        return [Problem(pointer=pointer, code=ProblemCode.FORBIDDEN, detail=refusal)]
    check = catalog.get(tool.verify.tool) if tool.verify is not None else None
    if environment == "sandbox" and check is not None and check.sandbox is None:
        detail = (
            f"tool {tool.name!r} verifies its writes with {check.name!r}, which declares no "
            "sandbox target: in the sandbox environment it would read production"
        )
        return [Problem(pointer=pointer, code=ProblemCode.FORBIDDEN, detail=detail)]
    return []
