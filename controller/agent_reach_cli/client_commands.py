"""`reach submit|status|tools`: thin HTTP calls to a running controller."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from agent_reach_cli.plan_tree import in_plan_order, part_labels, shown_name

DEFAULT_URL = "http://127.0.0.1:8080"


def add_client_flags(p: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """--url and --api-key. `inherited`: a subcommand of a parser that has them too, whose values
    must survive (argparse lets a subparser's defaults overwrite its parent's)."""
    default = argparse.SUPPRESS if inherited else None
    p.add_argument(
        "--url",
        default=default,
        help="controller REST URL (AGENT_REACH_URL, default http://127.0.0.1:8080)",
    )
    p.add_argument("--api-key", default=default, help="API key (AGENT_REACH_API_KEY)")


def add_subcommand(commands: Any, name: str, handler: Any, help_: str) -> argparse.ArgumentParser:
    """A subcommand of a command group that has the client flags and `--json` itself."""
    p: argparse.ArgumentParser = commands.add_parser(name, help=help_, description=help_)
    add_client_flags(p, inherited=True)
    p.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print it as JSON"
    )
    p.set_defaults(handler=handler)
    return p


def auth_headers(args: argparse.Namespace) -> dict[str, str]:
    """The Authorization header of the key given (--api-key or AGENT_REACH_API_KEY), if any."""
    key = args.api_key or os.environ.get("AGENT_REACH_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _url(args: argparse.Namespace) -> str:
    url: str = args.url or os.environ.get("AGENT_REACH_URL") or DEFAULT_URL
    return url.rstrip("/")


def _print(response: httpx.Response) -> int:
    """The answer as JSON on stdout; a refusal also as a sentence on stderr. 0 if it succeeded."""
    try:
        body: Any = response.json()
        print(json.dumps(body, indent=2, ensure_ascii=False))
    except ValueError:
        body = None
        print(response.text)
    if response.is_success:
        return 0
    print(refusal(response, body), file=sys.stderr)
    return 1


def refusal(response: httpx.Response, body: Any = None) -> str:
    """A refused call as a sentence: the problem's title and detail, each field's complaint,
    and what to do about a missing key."""
    problem = body if isinstance(body, dict) else {}
    title = problem.get("title") or response.reason_phrase or "refused"
    line = f"reach: {response.status_code} {title}"
    if problem.get("detail"):
        line += f": {problem['detail']}"
    for error in problem.get("errors") or ():
        if isinstance(error, dict):
            where = error.get("pointer") or error.get("loc") or ""
            line += f"\n  {where} {error.get('message') or error.get('detail') or ''}".rstrip()
    if response.status_code == 401 and "authorization" not in {
        h.lower() for h in response.request.headers
    }:
        line += "\n  no API key was sent: set AGENT_REACH_API_KEY or pass --api-key"
    return line


# The widest a name or status column grows before a longer one just pushes the line along.
_NAME_COLUMN = (12, 40)
_STATUS_COLUMN = (9, 24)


def describe_task(task: dict[str, Any]) -> str:
    """A task and its steps as a few lines, in plan order: each step's status and what its
    receipt says, a step's parts (fan-out targets, a verified write's writes and read-backs)
    under it by what they are."""
    lines = [f"task {task['task_id']}  {task['status']}  trace {task.get('trace_id', '')}"]
    if isinstance(error := task.get("error"), dict):
        at = f" at step {error['step_id']}" if error.get("step_id") else ""
        said = f"{error.get('code', 'failed')}{at}: {error.get('message', '')}"
        lines.append(f"  error: {said}".rstrip(": "))
    steps = in_plan_order(task.get("steps", ()))
    labels = part_labels(steps)
    rows = [_step_row(step, labels, datetime.now(UTC)) for step in steps]
    name_w = _column([name for name, _, _ in rows], *_NAME_COLUMN)
    status_w = _column([status for _, status, _ in rows], *_STATUS_COLUMN)
    lines += [f"  {n:{name_w}}  {st:{status_w}}  {shown}".rstrip() for n, st, shown in rows]
    if task["status"] in ("pending", "running"):
        lines.append(f"  (not over yet: reach status {task['task_id']} --watch follows it)")
    return "\n".join(lines)


def _step_row(
    step: Mapping[str, Any], labels: Mapping[str, str], now: datetime
) -> tuple[str, str, str]:
    """(name, status, what it says) of one step."""
    receipt = step.get("receipt") or {}
    detail = receipt.get("data") or (receipt.get("error") or {}).get("message", "")
    if isinstance(detail, dict) and "delivered_at" in detail:  # a notification, delivered
        detail = f"delivered at {detail['delivered_at']}"
    shown = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)
    status, run_at = step["status"], _when(step.get("run_at"))
    if run_at and status in ("blocked", "ready") and run_at > now:
        status, shown = "scheduled", f"for {step['run_at']}"
    verified = (receipt.get("meta") or {}).get("verified")
    if verified is not None:  # a write read back: did it hold?
        status = f"{status}, {'verified' if verified else 'unverified'}"
    rows = receipt.get("targets")  # a fan-out step: how many of its parts succeeded
    if rows and any(row.get("status") != "skipped" for row in rows):  # else: why it skipped
        shown = _targets_said(rows, labels)
    label = labels.get(step["step_id"], "")
    name = f"  {shown_name(step['step_id'], label)}" if label else step["step_id"]
    return name, status, shown


def _targets_said(rows: list[dict[str, Any]], labels: Mapping[str, str]) -> str:
    """A fan-out step's record in a line: `1 of 2 succeeded; email to ann@example.org failed`."""
    done = sum(row.get("status") == "succeeded" for row in rows)
    missed = [
        f"{labels.get(str(row.get('step_id'))) or _number(row)} {row.get('status')}"
        for row in rows
        if row.get("status") != "succeeded"
    ]
    return f"{done} of {len(rows)} succeeded" + (f"; {', '.join(missed)}" if missed else "")


def _number(row: Mapping[str, Any]) -> str:
    return f"#{row.get('target')}"


def _column(values: list[str], least: int, most: int) -> int:
    return min(max([least, *map(len, values)]), most)


def _when(value: Any) -> datetime | None:
    """An RFC 3339 time (with `Z` or an offset) as an aware datetime; None if it is not one."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _show_task(response: httpx.Response, args: argparse.Namespace) -> int:
    """A task answer as a summary (or, with --json, the document itself)."""
    if getattr(args, "json", False) or not response.is_success:
        return _print(response)
    try:
        body = response.json()
    except ValueError:
        return _print(response)
    if not isinstance(body, dict) or "task_id" not in body or "steps" not in body:
        return _print(response)
    print(describe_task(body))
    return 0


def _request(method: str, url: str, args: argparse.Namespace, **kw: Any) -> httpx.Response | None:
    headers = {**kw.pop("headers", {}), **auth_headers(args)}
    try:
        return httpx.request(method, url, timeout=kw.pop("timeout", 30.0), headers=headers, **kw)
    except httpx.HTTPError as exc:
        print(f"reach: cannot reach the controller at {url}: {exc}", file=sys.stderr)
        return None


def submit(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    if getattr(args, "subject", None) is not None:
        named = _with_subject(text, args.subject)
        if named is None:
            return 2
        text = named
    headers = {"Content-Type": "application/json"}
    if args.idempotency_key:
        headers["Idempotency-Key"] = args.idempotency_key
    wait = 0.0 if args.no_wait else args.wait
    params = {"wait": wait} if wait else None
    response = _request(
        "POST",
        f"{_url(args)}/v1/tasks",
        args,
        content=text,
        headers=headers,
        params=params,
        timeout=30.0 + wait,
    )
    return 2 if response is None else _show_task(response, args)


def _with_subject(text: str, subject: str) -> str | None:
    """The body with `subject` set (the end user the task acts for); None, said why, when the
    body is not a JSON object or names another subject."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        print(f"reach: --subject needs the body as JSON: {exc}", file=sys.stderr)
        return None
    if not isinstance(body, dict):
        print("reach: --subject needs a body that is a JSON object", file=sys.stderr)
        return None
    if body.get("subject", subject) != subject:
        print(f"reach: the body names subject {body['subject']!r}, not --subject", file=sys.stderr)
        return None
    return json.dumps({**body, "subject": subject})


def status(args: argparse.Namespace) -> int:
    if getattr(args, "watch", False):
        from agent_reach_cli import watch_commands  # it builds on this module

        return watch_commands.watch(args)
    response = _request("GET", f"{_url(args)}/v1/tasks/{args.task_id}", args)
    return 2 if response is None else _show_task(response, args)


def resolve(args: argparse.Namespace) -> int:
    verdict: dict[str, Any] = {"action": args.action, "reason": args.reason or ""}
    if args.by:
        verdict["by"] = args.by
    if args.output is not None:
        try:
            verdict["output"] = json.loads(args.output)
        except ValueError:
            print("reach: --output must be JSON", file=sys.stderr)
            return 2
    url = f"{_url(args)}/v1/tasks/{args.task_id}/steps/{args.step_id}/resolve"
    response = _request("POST", url, args, json=verdict)
    return 2 if response is None else _print(response)


def approve(args: argparse.Namespace) -> int:
    decision: dict[str, Any] = {
        "decision": "reject" if args.reject else "approve",
        "reason": args.reason or "",
    }
    if args.args is not None:
        try:
            decision["args"] = json.loads(args.args)
        except ValueError:
            print("reach: --args must be a JSON object", file=sys.stderr)
            return 2
    url = f"{_url(args)}/v1/tasks/{args.task_id}/steps/{args.step_id}/approval"
    response = _request("POST", url, args, json=decision)
    return 2 if response is None else _print(response)


def trace_export(args: argparse.Namespace) -> int:
    """`reach trace export TASK_ID`: the task's trace as Jaeger's UI uploads it (JSON)."""
    response = _request("GET", f"{_url(args)}/v1/tasks/{args.task_id}/trace", args)
    if response is None:
        return 2
    if not response.is_success:
        return _print(response)
    text = json.dumps(response.json(), indent=1, ensure_ascii=False) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
