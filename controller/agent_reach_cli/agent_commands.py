"""`reach agents …`: the agent profiles of a running controller (put, list, show, delete).

reach agents put NAME --file profile.yaml   create or replace a profile (YAML or JSON; '-': stdin)
reach agents [list]                         the agents you may run or administer
reach agents show NAME                      one profile, as YAML that `put` takes back
reach agents delete NAME                    remove it (runs keep the version they pinned)

A refusal is one line on stderr and exit 2, as a controller that cannot be reached is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from agent_reach_cli.client_commands import (
    _url,
    add_client_flags,
    add_subcommand,
    auth_headers,
    refusal,
)
from agent_reach_cli.failures import CommandError


def ask(method: str, path: str, args: argparse.Namespace, **kw: Any) -> httpx.Response:
    """The controller's successful answer to `method path`; anything else is a CommandError.

    `wait`: seconds the server may hold the request, added to the read timeout.
    """
    url = f"{_url(args)}{path}"
    headers = {**kw.pop("headers", {}), **auth_headers(args)}
    timeout = 30.0 + float(kw.pop("wait", 0) or 0)
    try:
        response = httpx.request(method, url, headers=headers, timeout=timeout, **kw)
    except httpx.HTTPError as exc:
        raise CommandError(f"cannot reach the controller at {url}: {exc}") from exc
    if not response.is_success:
        raise CommandError(_refused(response))
    return response


def _refused(response: httpx.Response) -> str:
    """The problem document as one line (without the `reach: ` that failures.run adds)."""
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    lines = [line.strip() for line in refusal(response, body).splitlines()]
    return "; ".join(line for line in lines if line).removeprefix("reach: ")


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=2, ensure_ascii=False))


def _profile(path: str, name: str) -> dict[str, Any]:
    """The PUT body in a file: a profile, or a tools file's `agents:` entry holding one."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    document = yaml.safe_load(text)  # JSON is YAML
    if isinstance(document, dict) and set(document) == {"agents"}:
        document = document["agents"]
    if isinstance(document, list) and len(document) == 1:
        document = document[0]
    if not isinstance(document, dict):
        raise CommandError(f"{path} must hold one agent profile (a mapping)")
    named = document.pop("name", name)
    if named != name:
        raise CommandError(f"{path} names agent {named!r}, not {name!r}")
    return document


def _if_match(args: argparse.Namespace) -> dict[str, str]:
    return {} if args.if_match is None else {"If-Match": f'"{args.if_match}"'}


def put(args: argparse.Namespace) -> int:
    body = _profile(args.file, args.name)
    response = ask("PUT", f"/v1/agents/{args.name}", args, json=body, headers=_if_match(args))
    agent = response.json()
    if args.json:
        print_json(agent)
        return 0
    done = "created" if response.status_code == 201 else "saved"
    print(f"agent {agent['name']} {done}: revision {agent['revision']}, version {agent['version']}")
    return 0


def list_agents(args: argparse.Namespace) -> int:
    agents = ask("GET", "/v1/agents", args).json()["agents"]
    if args.json:
        print_json(agents)
        return 0
    if not agents:
        print("no agents (reach agents put NAME --file profile.yaml adds one)")
    width = max((len(a["name"]) for a in agents), default=0)
    for agent in agents:
        print(_row(agent, width))
    return 0


def _row(agent: dict[str, Any], width: int) -> str:
    profile = agent["profile"]
    state = "" if agent["enabled"] else "  (disabled)"
    tools = ", ".join(profile.get("tools") or []) or "no tools"
    return (
        f"{agent['name']:<{width}}  rev {agent['revision']:<3}  "
        f"{profile['endpoint']['kind']:<16}  {profile['model']}  [{tools}]{state}"
    )


def show(args: argparse.Namespace) -> int:
    agent = ask("GET", f"/v1/agents/{args.name}", args).json()
    if args.json:
        print_json(agent)
        return 0
    state = "" if agent["enabled"] else "  (disabled)"
    print(
        f"# agent {agent['name']}  revision {agent['revision']}  version {agent['version']}{state}"
    )
    sys.stdout.write(yaml.safe_dump(agent["profile"], sort_keys=False, allow_unicode=True))
    return 0


def delete(args: argparse.Namespace) -> int:
    ask("DELETE", f"/v1/agents/{args.name}", args, headers=_if_match(args))
    print(f"deleted agent {args.name} (runs that started keep the version they pinned)")
    return 0


def add_parser(sub: Any) -> None:
    """`reach agents` and its subcommands."""
    agents = sub.add_parser(
        "agents",
        help="agent profiles: the model, tools and limits of agent runs (see `reach agents -h`)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_client_flags(agents)
    agents.add_argument("--json", action="store_true", help="print the answer as JSON")
    agents.set_defaults(handler=list_agents)
    commands = agents.add_subparsers(dest="agents_command", metavar="COMMAND")

    def add(name: str, handler: Any, help_: str) -> argparse.ArgumentParser:
        return add_subcommand(commands, name, handler, help_)

    add("list", list_agents, "the agents you may run or administer")
    add("show", show, "one agent's profile (YAML that `put` takes back)").add_argument("name")
    p = add("put", put, "create or replace an agent's profile from a YAML or JSON file")
    p.add_argument("name")
    p.add_argument("--file", "-f", required=True, help="the profile ('-': stdin)")
    p.add_argument("--if-match", type=int, metavar="REV", help="only if still at this revision")
    p = add("delete", delete, "remove an agent")
    p.add_argument("name")
    p.add_argument("--if-match", type=int, metavar="REV", help="only if still at this revision")
