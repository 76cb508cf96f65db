"""`reach submit|status|tools`: thin HTTP calls to a running controller."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

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


def describe_task(task: dict[str, Any]) -> str:
    """A task and its steps as a few lines: each step's status and what its receipt says."""
    lines = [f"task {task['task_id']}  {task['status']}  trace {task.get('trace_id', '')}"]
    now = datetime.now(UTC)
    for step in task.get("steps", ()):
        receipt = step.get("receipt") or {}
        detail = receipt.get("data") or (receipt.get("error") or {}).get("message", "")
        shown = json.dumps(detail, ensure_ascii=False) if detail not in ("", None) else ""
        status, run_at = step["status"], step.get("run_at")
        if run_at and status in ("blocked", "ready") and datetime.fromisoformat(run_at) > now:
            status, shown = "scheduled", f"for {run_at}"
        verified = (receipt.get("meta") or {}).get("verified")
        if verified is not None:  # a write read back: did it hold?
            status = f"{status}, {'verified' if verified else 'unverified'}"
        if rows := receipt.get("targets"):  # a fan-out step: one word per target
            shown = ", ".join(_target_said(row) for row in rows)
        lines.append(f"  {step['step_id']:12} {status:18} {shown}".rstrip())
    if task["status"] in ("pending", "running"):
        lines.append(f"  (not over yet: reach status {task['task_id']} --watch follows it)")
    return "\n".join(lines)


def _target_said(row: dict[str, Any]) -> str:
    """One target of a fan-out step's record: `email delivered`, `[2] failed: …`."""
    output = row.get("output") or {}
    name = output.get("channel") or f"[{row.get('target')}]"
    if row.get("status") == "succeeded":
        return f"{name} delivered at {row.get('done_at')}"
    return f"{name} {row.get('status')}: {(row.get('error') or {}).get('message', '')}".rstrip(": ")


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
