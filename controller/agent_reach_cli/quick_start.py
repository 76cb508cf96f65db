"""What `reach dev` prints once it is up: where it listens, a key, and a plan that runs on the
tools it loaded (the umbrella plan only with `--demo`, whose tools it needs)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from agent_reach_cli.demo import umbrella_plan

# An example should not need a person to approve it: reads first, then writes; never dangerous.
_RISK_ORDER = ("read", "write")
# Placeholder values by JSON Schema type, for required arguments without an example.
_PLACEHOLDERS: Mapping[str, Any] = {
    "string": "example",
    "integer": 1,
    "number": 1,
    "boolean": False,
    "array": [],
    "object": {},
}


def example_plan(tools: Iterable[Any], *, demo_mode: bool) -> dict[str, Any] | None:
    """A plan that the loaded `tools` (ToolSpecs) accept: the umbrella plan with the demo's
    tools, else one step of the first enabled tool whose arguments can be filled in validly
    (read tools first); None if there is none."""
    if demo_mode:
        return umbrella_plan("Wuhan")
    candidates = sorted(
        (t for t in tools if t.enabled and t.risk in _RISK_ORDER),
        key=lambda t: (_RISK_ORDER.index(t.risk), t.name),
    )
    for tool in candidates:
        args = example_args(tool.input_schema, grounded=tool.grounded)
        if args is not None:
            return {"steps": [{"step_id": "first", "tool": tool.name, "args": args}]}
    return None


def example_args(schema: Mapping[str, Any], *, grounded: Iterable[str] = ()) -> Any:
    """Arguments that `schema` accepts: each required one from the schema's own example,
    default, const or first enum value, else a placeholder of its type; None if those do not
    validate, or if one must be grounded (taken from the context, which an example has not)."""
    from jsonschema import Draft202012Validator

    required = schema.get("required") or []
    if set(required) & set(grounded):
        return None
    properties = schema.get("properties") or {}
    args = {name: _example_value(properties.get(name)) for name in required}
    return args if Draft202012Validator(schema).is_valid(args) else None


def _example_value(schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return None
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return schema["examples"][0]
    for key in ("default", "const"):
        if key in schema:
            return schema[key]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    return _PLACEHOLDERS.get(kind) if isinstance(kind, str) else None


def print_quick_start(
    base_url: str,
    *,
    api_key: str,
    plan: dict[str, Any] | None,
    tool_names: Iterable[str],
    demo_mode: bool,
    executor: tuple[str, str] | None = None,
) -> None:
    """`plan`: the example to submit (`example_plan`); `executor`: (gRPC address, pool token)
    for executors started by hand against it."""
    names = sorted(tool_names)
    print(
        f"\nAgent-Reach is up: REST {base_url} (OpenAPI at {base_url}/docs)\n"
        f"A dev API key (tenant default, role admin), shown once:\n\n  {api_key}\n\n"
        f"The web console, where you sign in with that key: {base_url}/console\n\n"
        + _submit_example(base_url, api_key=api_key, plan=plan, names=names)
        + (
            "An executor pool token, for more executors started by hand:\n\n"
            f"  reach executor --controller {executor[0]} --token {executor[1]}\n\n"
            if executor is not None
            else ""
        )
        + ("" if demo_mode else "(start with --demo to get the demo tools)\n")
        + "Press Ctrl-C to stop.",
        flush=True,
    )


def _submit_example(base_url: str, *, api_key: str, plan: Any, names: list[str]) -> str:
    if not names:
        return "No tools are loaded: pass --tools FILE, or add one with  reach tools create\n\n"
    if plan is None:
        return (
            f"Tools loaded: {', '.join(names)}.\n"
            "See what one takes with  reach tools show NAME  and submit a plan that calls it.\n\n"
        )
    return (
        "Submit a plan and wait up to 10 s for its receipts:\n\n"
        f"  export AGENT_REACH_API_KEY={api_key}\n"
        f"  curl -s -X POST '{base_url}/v1/tasks?wait=10' -H 'Content-Type: application/json' \\\n"
        '       -H "Authorization: Bearer $AGENT_REACH_API_KEY" \\\n'
        f"       -d {shlex.quote(json.dumps(plan))}\n\n"
    )
