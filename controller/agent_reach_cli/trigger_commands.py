"""`reach triggers`: save, list, show and delete triggers, and send one a signed event.

A trigger starts a stored plan template when a signed event is POSTed to
/v1/triggers/<name>. The template is a plan whose step arguments and context may hold
`$event` or `$event.<path>` strings:

    reach triggers save orders.new template.json      # prints the secret, once
    reach triggers send orders.new order.json --secret whsec_… --id order-1042

`send` signs as Standard Webhooks prescribe, as any sender would; it needs no API key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from standardwebhooks.webhooks import Webhook

from agent_reach_cli.client_commands import _print, _request, _url, add_client_flags

SECRET_ENV = "AGENT_REACH_TRIGGER_SECRET"


def _document(path: str) -> Any:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return yaml.safe_load(text)  # JSON is YAML


def save(args: argparse.Namespace) -> int:
    try:
        template = _document(args.file)
    except (OSError, yaml.YAMLError) as exc:
        print(f"reach: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    body: dict[str, Any] = {"template": template, "enabled": not args.disabled}
    if args.rotate_secret:
        body["rotate_secret"] = True
    if args.secret:
        body["secret"] = args.secret
    response = _request("PUT", f"{_url(args)}/v1/triggers/{args.name}", args, json=body)
    if response is None:
        return 2
    code = _print(response)
    secret = response.json().get("secret") if response.is_success else None
    if secret:
        print(f"\nThe trigger's secret, shown this once:\n\n  {secret}\n", file=sys.stderr)
    return code


def list_triggers(args: argparse.Namespace) -> int:
    response = _request("GET", f"{_url(args)}/v1/triggers", args)
    return 2 if response is None else _print(response)


def show(args: argparse.Namespace) -> int:
    path = f"/v1/triggers/{args.name}"
    if args.version is not None:
        path += f"/versions/{args.version}"
    response = _request("GET", _url(args) + path, args)
    return 2 if response is None else _print(response)


def delete(args: argparse.Namespace) -> int:
    response = _request("DELETE", f"{_url(args)}/v1/triggers/{args.name}", args)
    if response is None:
        return 2
    if response.status_code == 204:
        print(f"trigger {args.name} deleted (its versions stay for the tasks it started)")
        return 0
    return _print(response)


def send(args: argparse.Namespace) -> int:
    secret = args.secret or os.environ.get(SECRET_ENV)
    if not secret:
        print(f"reach: give --secret or set {SECRET_ENV}", file=sys.stderr)
        return 2
    try:
        body = json.dumps(_document(args.file), separators=(",", ":"))
    except (OSError, yaml.YAMLError) as exc:
        print(f"reach: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    event_id = args.id or f"evt_{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    headers = {
        "Content-Type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(event_id, now, body),
    }
    url = f"{_url(args)}/v1/triggers/{args.name}"
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        print(f"reach: cannot reach the controller at {url}: {exc}", file=sys.stderr)
        return 2
    return _print(response)


def add_parser(sub: Any) -> None:
    """`reach triggers` and its subcommands."""
    triggers = sub.add_parser(
        "triggers",
        help="signed events that start stored plan templates (see `reach triggers -h`)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_client_flags(triggers)
    triggers.set_defaults(handler=list_triggers)
    commands = triggers.add_subparsers(dest="triggers_command", metavar="COMMAND")

    def add(name: str, handler: Any, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = commands.add_parser(name, help=help_, description=help_)
        add_client_flags(p, inherited=True)
        p.set_defaults(handler=handler)
        p.add_argument("name")
        return p

    p = add("save", save, "save a trigger's template from a JSON or YAML file ('-': stdin)")
    p.add_argument("file")
    p.add_argument("--disabled", action="store_true", help="save it, but refuse its events")
    p.add_argument("--secret", help="use this signing secret (whsec_… or ${env:NAME})")
    p.add_argument("--rotate-secret", action="store_true", help="make a new secret")
    p = add("show", show, "a trigger and its live template")
    p.add_argument("--version", type=int, help="a stored version's template instead")
    add("delete", delete, "delete a trigger (its versions stay)")
    p = add("send", send, "send a trigger an event, signed with its secret (no API key)")
    p.add_argument("file", help="the event: a JSON or YAML file ('-': stdin)")
    p.add_argument("--secret", help=f"the trigger's secret ({SECRET_ENV})")
    p.add_argument("--id", help="the event id that deduplicates it (default: a new one)")
    list_p: argparse.ArgumentParser = commands.add_parser("list", help="your tenant's triggers")
    add_client_flags(list_p, inherited=True)
    list_p.set_defaults(handler=list_triggers)
