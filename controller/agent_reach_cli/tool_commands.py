"""`reach tools …`: the tool registry of a running controller (list, show, change, export, import).

reach tools                       the tools you may submit
reach tools create tool.yaml      one tool definition (YAML or JSON; '-' for stdin)
reach tools update tool.yaml      a new version of it (--if-revision N: only if unchanged)
reach tools disable|enable|delete NAME
reach tools export > tools.yaml   the catalogue as a tools file
reach tools import tools.yaml     make the catalogue hold it (--prune, --dry-run)
reach tools import-python acme.tools   add its @tool functions (--print: the YAML only)
reach tools import-mcp URL        add a remote MCP server's tools (--prefix, --header, --print)
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from agent_reach_cli.client_commands import _print, _request, _url, add_client_flags

if TYPE_CHECKING:
    import mcp_types


def _read(path: str) -> str:
    return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")


def _if_match(args: argparse.Namespace) -> dict[str, str]:
    revision = getattr(args, "if_revision", None)
    return {} if revision is None else {"If-Match": f'"{revision}"'}


def _one_tool(path: str) -> dict[str, Any] | None:
    """A single tool definition: a mapping, or a tools file holding exactly one tool."""
    try:
        document = yaml.safe_load(_read(path))
    except (OSError, yaml.YAMLError) as exc:
        print(f"reach: cannot read {path}: {exc}", file=sys.stderr)
        return None
    if isinstance(document, dict) and set(document) == {"tools"}:
        document = document["tools"]
    if isinstance(document, list) and len(document) == 1:
        document = document[0]
    if not isinstance(document, dict):
        print(f"reach: {path} must hold one tool definition (a mapping)", file=sys.stderr)
        return None
    return document


def _done(response: Any) -> int:
    return 2 if response is None else _print(response)


def list_tools(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"format": args.format}
    if args.include_disabled:
        params["include_disabled"] = "true"
    return _done(_request("GET", f"{_url(args)}/v1/tools", args, params=params))


def show(args: argparse.Namespace) -> int:
    return _done(_request("GET", f"{_url(args)}/v1/tools/{args.name}", args))


def history(args: argparse.Namespace) -> int:
    return _done(_request("GET", f"{_url(args)}/v1/tools/{args.name}/versions", args))


def create(args: argparse.Namespace) -> int:
    tool = _one_tool(args.file)
    if tool is None:
        return 2
    return _done(_request("POST", f"{_url(args)}/v1/tools", args, json=tool))


def update(args: argparse.Namespace) -> int:
    tool = _one_tool(args.file)
    if tool is None:
        return 2
    url = f"{_url(args)}/v1/tools/{tool.get('name', '')}"
    return _done(_request("PUT", url, args, json=tool, headers=_if_match(args)))


def switch(args: argparse.Namespace) -> int:
    url = f"{_url(args)}/v1/tools/{args.name}:{args.tools_command}"
    return _done(_request("POST", url, args, headers=_if_match(args)))


def delete(args: argparse.Namespace) -> int:
    url = f"{_url(args)}/v1/tools/{args.name}"
    response = _request("DELETE", url, args, headers=_if_match(args))
    if response is not None and response.status_code == 204:
        print(f"deleted {args.name}")
        return 0
    return _done(response)


def export(args: argparse.Namespace) -> int:
    params = {"include_disabled": "false"} if args.enabled_only else None
    response = _request("GET", f"{_url(args)}/v1/tools:export", args, params=params)
    if response is None:
        return 2
    if not response.is_success:
        return _print(response)
    if args.output:
        Path(args.output).write_text(response.text, encoding="utf-8")
    else:
        sys.stdout.write(response.text)
    return 0


def import_(args: argparse.Namespace) -> int:
    try:
        text = _read(args.file)
    except OSError as exc:
        print(f"reach: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    params = {"prune": str(args.prune).lower(), "dry_run": str(args.dry_run).lower()}
    headers = {"Content-Type": "application/yaml"}
    url = f"{_url(args)}/v1/tools:import"
    return _done(_request("POST", url, args, content=text, headers=headers, params=params))


def import_python(args: argparse.Namespace) -> int:
    """The `@tool` functions of Python modules, as tools of the `python` connector."""
    import importlib

    from agent_reach_connectors.pytools import tools_in

    sys.path.insert(0, str(Path.cwd()))  # modules beside you, as `python -m` finds them
    definitions: list[dict[str, Any]] = []
    for name in args.modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # its own code ran: say what it raised, and stop
            print(f"reach: cannot import {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        found = tools_in(module)
        if not found:
            print(f"reach: {name} defines no @tool function", file=sys.stderr)
            return 2
        definitions += [t.definition() for t in found]
    text = yaml.safe_dump({"tools": definitions}, sort_keys=False, allow_unicode=True)
    if args.print:
        sys.stdout.write(text)
        return 0
    params = {"prune": "false", "dry_run": str(args.dry_run).lower()}
    headers = {"Content-Type": "application/yaml"}
    url = f"{_url(args)}/v1/tools:import"
    return _done(_request("POST", url, args, content=text, headers=headers, params=params))


# `reach tools import-mcp` ------------------------------------------------------------------

_RISKS = ("read", "write", "dangerous")
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_.-]")


def import_mcp(args: argparse.Namespace) -> int:
    """A remote MCP server's tools, as tools of the `mcp` connector, their definitions pinned."""
    from agent_reach_connectors.base import ConnectorError
    from agent_reach_connectors.mcp_client import McpConnector, list_all_tools, read_endpoint

    headers: dict[str, str] = {}
    for line in args.header:
        key, colon, value = line.partition(":")
        if not colon or not key.strip():
            print("reach: each --header must be 'Name: value'", file=sys.stderr)
            return 2
        headers[key.strip()] = value.strip()
        if "${env:" not in value:
            print(
                f"reach: the {key.strip()} header is stored in the catalogue as written; "
                "write a secret as ${env:NAME}, set where executors run",
                file=sys.stderr,
            )
    config: dict[str, Any] = {"url": args.mcp_url, "headers": headers}
    config["allow_hosts"] = args.allow_host
    try:  # ${env:NAME} references in the headers are read from your environment to list
        endpoint = read_endpoint("import-mcp", config, float(args.timeout))
        tools = asyncio.run(
            McpConnector().session(endpoint, lambda session, _: list_all_tools(session))
        )
    except ConnectorError as exc:
        said = exc.message.replace("the tool's allow_hosts", "--allow-host")
        print(f"reach: {said}", file=sys.stderr)
        return 2
    definitions = _mcp_definitions(tools, args, headers)
    if not args.print:
        for definition in definitions:
            refused = _keep_stricter_risk(definition, args)
            if refused is not None:
                return refused
    text = yaml.safe_dump({"tools": definitions}, sort_keys=False, allow_unicode=True)
    if args.print:
        sys.stdout.write(text)
        return 0
    params = {"prune": "false", "dry_run": str(args.dry_run).lower()}
    url = f"{_url(args)}/v1/tools:import"
    answer = _request(
        "POST", url, args, content=text, headers={"Content-Type": "application/yaml"}, params=params
    )
    return _done(answer)


def _mcp_definitions(
    tools: list[mcp_types.Tool], args: argparse.Namespace, headers: dict[str, str]
) -> list[dict[str, Any]]:
    """One `mcp` tool per remote tool: named with the prefix, its risk from its annotations."""
    from agent_reach_connectors.mcp_client import definition_sha256, wire_form

    definitions: list[dict[str, Any]] = []
    taken: set[str] = set()
    for tool in tools:
        wire = wire_form(tool)
        hints = wire.get("annotations") or {}
        name = _mcp_name(args.prefix + tool.name, taken)
        config: dict[str, Any] = {
            "url": args.mcp_url,
            "tool": tool.name,
            "definition_sha256": definition_sha256(wire),
        }
        if headers:
            config["headers"] = dict(headers)
        if args.allow_host:
            config["allow_hosts"] = list(args.allow_host)
        risk = "write"
        if hints.get("readOnlyHint") is True:
            risk = "read"
        elif hints.get("destructiveHint") is True:
            risk = "dangerous"
        definitions.append(
            {
                "name": name,
                "description": (tool.description or "").strip() or f"{tool.name} (MCP tool)",
                "connector": "mcp",
                "config": config,
                "input_schema": tool.input_schema,
                "risk": risk,
                "idempotent": hints.get("idempotentHint") is True,
            }
        )
    return definitions


def _mcp_name(wanted: str, taken: set[str]) -> str:
    """A catalogue name (`^[a-zA-Z][a-zA-Z0-9_.-]{0,127}$`) for `wanted`, unique among `taken`."""
    name = _NOT_IN_NAME.sub("_", wanted)
    if not re.match(r"[a-zA-Z]", name):
        name = f"mcp_{name}"
    name, base, count = name[:128], name[:124], 1
    while name in taken:
        count += 1
        name = f"{base}_{count}"
    taken.add(name)
    return name


def _keep_stricter_risk(definition: dict[str, Any], args: argparse.Namespace) -> int | None:
    """Raise the definition's risk to the catalogue's when an operator set it higher."""
    name = definition["name"]
    answer = _request("GET", f"{_url(args)}/v1/tools/{name}", args)
    if answer is None:
        return 2
    if answer.status_code == 404:
        return None
    if not answer.is_success:
        return _print(answer)
    held = answer.json().get("risk", "read")
    if held in _RISKS and _RISKS.index(held) > _RISKS.index(definition["risk"]):
        print(
            f"reach: {name} keeps risk {held} (the catalogue's); the server hints "
            f"{definition['risk']}",
            file=sys.stderr,
        )
        definition["risk"] = held
    return None


def _list_flags(p: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """`reach tools [list]` flags; `inherited` as in add_client_flags."""
    formats = ["native", "openai_chat", "openai_responses", "anthropic", "mcp", "openai"]
    p.add_argument(
        "--format",
        choices=formats,
        default=argparse.SUPPRESS if inherited else "native",
        help="native definitions, or the tools list a model API takes (openai = openai_chat)",
    )
    p.add_argument(
        "--include-disabled",
        action="store_true",
        default=argparse.SUPPRESS if inherited else False,
        help="(tools you administer)",
    )


def add_parser(sub: Any) -> None:
    """`reach tools` and its subcommands."""
    tools = sub.add_parser(
        "tools",
        help="list the controller's tools, or change them (see `reach tools -h`)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_client_flags(tools)
    _list_flags(tools)
    tools.set_defaults(handler=list_tools)
    commands = tools.add_subparsers(dest="tools_command", metavar="COMMAND")

    def add(name: str, handler: Any, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = commands.add_parser(name, help=help_, description=help_)
        add_client_flags(p, inherited=True)
        p.set_defaults(handler=handler)
        return p

    _list_flags(add("list", list_tools, "the tools you may submit"), inherited=True)
    add("show", show, "one tool as the catalogue holds it").add_argument("name")
    add("history", history, "every change to a tool, newest first").add_argument("name")
    add("create", create, "add a tool from a YAML or JSON file ('-': stdin)").add_argument("file")
    p = add("update", update, "replace a tool's definition from a file (a new version)")
    p.add_argument("file")
    p.add_argument("--if-revision", type=int, help="only if the tool is still at this revision")
    for name, help_ in (
        ("disable", "disable a tool: its queued steps are refused from the next dispatch on"),
        ("enable", "enable a disabled tool"),
        ("delete", "delete a tool (versions stay for the tasks pinned to them)"),
    ):
        p = add(name, delete if name == "delete" else switch, help_)
        p.add_argument("name")
        p.add_argument("--if-revision", type=int, help="only if the tool is still at this revision")
    p = add("export", export, "write the catalogue as a tools YAML file")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    p.add_argument("--enabled-only", action="store_true", help="leave disabled tools out")
    p = add("import", import_, "make the catalogue hold a tools file's definitions")
    p.add_argument("file")
    p.add_argument("--prune", action="store_true", help="delete tools the file does not define")
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    p = add(
        "import-python",
        import_python,
        "add or update the @tool functions of Python modules (importable where executors run)",
    )
    p.add_argument("modules", nargs="+", metavar="MODULE", help="e.g. acme.tools")
    p.add_argument("--print", action="store_true", help="write the tools YAML, change nothing")
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    p = add(
        "import-mcp",
        import_mcp,
        "add or update the tools of a remote MCP server (Streamable HTTP), each pinned to the "
        "definition listed now: a later change makes its calls fail until it is imported again",
    )
    p.add_argument("mcp_url", metavar="URL", help="the server's Streamable HTTP endpoint")
    p.add_argument("--prefix", default="", help="before each remote name, e.g. 'crm.'")
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="sent to the server; write secrets as ${env:NAME}: the executor reads them",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="a non-public host the tools may reach (as allow_hosts; e.g. 10.0.0.5:8080)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to list the tools")
    p.add_argument("--print", action="store_true", help="write the tools YAML, change nothing")
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
