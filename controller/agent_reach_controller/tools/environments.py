"""What a tool's steps may do in each environment: who must approve them, where they write.

A task's environment (`dev`, `sandbox` or `prod`) is fixed when it is submitted and stored with
each of its steps; these rules read it from there, so that a step's submit, its approval, its
lease and what its executor is sent all agree:

- `needs_approval`: a `dangerous` tool's steps always wait for a person; in `prod` a `write`
  tool's do too, unless the tool is `exempt_from_prod_approval`.
- `sandbox_refusal`: in `sandbox` a tool that writes runs only against its `sandbox` target.
- `connector_config`: the config the executor is given (in `sandbox`, `sandbox` over `config`).
"""

from __future__ import annotations

from typing import Any

from agent_reach_controller.tools.catalog import ToolSpec


def needs_approval(tool: ToolSpec, environment: str) -> bool:
    """Whether a step of `tool` waits for a person before it may run in `environment`.

    The one answer every part of the approval machinery asks (the request when the step is
    queued, the check when it is leased, whether a fallback may take over), so they agree.
    """
    if tool.risk == "dangerous":
        return True
    return environment == "prod" and tool.risk == "write" and not tool.exempt_from_prod_approval


def sandbox_refusal(tool: ToolSpec, environment: str) -> str | None:
    """Why a step of `tool` may not run in `environment`; None when it may. In `sandbox` a tool
    that writes must say where its writes go there (`sandbox`)."""
    if environment != "sandbox" or tool.risk == "read" or tool.sandbox is not None:
        return None
    return (
        f"tool {tool.name!r} writes and declares no sandbox target: it may not run in the "
        "sandbox environment"
    )


def connector_config(tool: ToolSpec, environment: str) -> dict[str, Any]:
    """The connector config a step of `tool` runs with in `environment`: in `sandbox`, the tool's
    `sandbox` merged over its `config` (a read tool's too, when it declares one)."""
    if environment == "sandbox" and tool.sandbox_config is not None:
        return tool.sandbox_config
    return tool.config
