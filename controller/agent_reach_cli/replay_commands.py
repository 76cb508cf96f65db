"""`reach replay ID`: what a task (or an agent run) was asked, what happened, and what the model
was told.

reach replay TASK_ID             the timeline (arguments, attempts, waits, approvals, receipts)
reach replay TASK_ID --dry-run   re-drive the plan on the recorded results; exit 1 on a difference
reach replay TASK_ID --rerun     submit the same request again, live, in the same trace
reach replay RUN_ID              a run's rounds: each model request and reply, its calls' receipts
reach replay RUN_ID --dry-run    read every recorded reply again with today's rules and tools;
                                 exit 1 when a decision would differ (a changed tool, say)
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from agent_reach_cli.client_commands import _print, _request, _url, add_client_flags


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _detail(moment: dict[str, Any]) -> str:
    detail = dict(moment.get("detail") or {})
    error = detail.pop("error", None)
    parts = [f"{k}={_short(v, 60)}" for k, v in detail.items()]
    if isinstance(error, dict):
        parts.insert(0, f"{error.get('code')}: {error.get('message')}")
    return "  ".join(parts)


def format_timeline(replay: dict[str, Any]) -> list[str]:
    """The timeline as lines: time since the first event, step/attempt, what happened."""
    request = replay.get("request") or {}
    lines = [f"task {replay['task_id']}  trace {replay['trace_id']}"]
    if request.get("goal"):
        lines.append(f"goal: {request['goal']}")
    moments = replay.get("timeline") or []
    start = datetime.fromisoformat(moments[0]["at"]) if moments else None
    for moment in moments:
        offset = (datetime.fromisoformat(moment["at"]) - start).total_seconds() if start else 0.0
        where = moment.get("step_id") or "task"
        if moment.get("attempt") and moment.get("step_id"):
            where += f"#{moment['attempt']}"
        status = f" → {moment['status']}" if moment.get("status") else ""
        detail = _detail(moment)
        lines.append(
            f"{offset:+9.3f}s  {where:<16} {moment['kind']}{status}"
            + (f"  {detail}" if detail else "")
        )
    lines.append("what the model was shown:")
    for step in (replay.get("dry_run") or {}).get("steps", []):
        shown = step.get("recorded_message")
        lines.append(f"  {step['step_id']}: {shown if shown is not None else '(nothing yet)'}")
    return lines


def format_dry_run(replay: dict[str, Any]) -> tuple[list[str], bool]:
    """Each step's verdict, and whether the whole run was reproduced."""
    run = replay["dry_run"]
    lines = []
    for step in run["steps"]:
        verdict = "differs" if step["differences"] else "identical"
        lines.append(f"{step['step_id']}: {verdict} ({step['replayed_status']})")
        lines += [f"    - {d}" for d in step["differences"]]
        lines += [f"    note: {n}" for n in step.get("notes", [])]
    if not run["finished"]:
        lines.append("the task has not finished: the dry run stops where it stands")
    lines.append(
        "reproduced: what the model was told is the same, byte for byte"
        if run["identical"]
        else "NOT reproduced"
    )
    return lines, bool(run["identical"])


def format_run(replay: dict[str, Any], *, dry_run: bool) -> tuple[list[str], bool]:
    """A run's rounds (each request, reply and call) or, with `dry_run`, only the verdicts."""
    lines = [
        f"run {replay['run_id']}  agent {replay['agent']}@{replay['agent_version']}  "
        f"{replay['status']} ({replay.get('end_reason') or '-'})"
    ]
    for r in replay["rounds"]:
        lines.append(f"round {r['round']}  task {r.get('task_id') or '-'}")
        if not dry_run:
            sent = (r.get("request") or {}).get("messages") or (r.get("request") or {}).get("input")
            lines.append(f"  asked: {_short(sent[-2:] if sent else None, 160)}")
            lines.append(f"  replied: {_short(r['reply'], 160)}")
            for call in r["calls"]:
                lines.append(
                    f"  call {call['call_id']}: {call['tool']}@{call['tool_version']} "
                    f"{call['status']}  read: {_short(call.get('read'), 100)}"
                )
        lines += [f"  - {d}" for d in r["differences"]]
    lines.append(
        "reproduced: today's rules and tools reach the same decisions"
        if replay["identical"]
        else "NOT reproduced"
    )
    return lines, bool(replay["identical"])


def _run_replay(response: Any, args: argparse.Namespace) -> int:
    """An agent run's replay, printed (exit 1 on a dry run that differs)."""
    if response is None:
        return 2
    if not response.is_success or args.json:
        return _print(response)
    lines, same = format_run(response.json(), dry_run=args.dry_run)
    print("\n".join(lines))
    return 0 if same or not args.dry_run else 1


def replay(args: argparse.Namespace) -> int:
    base = f"{_url(args)}/v1/tasks/{args.task_id}"
    if args.rerun:
        response = _request("POST", f"{base}/rerun", args)
        return 2 if response is None else _print(response)
    response = _request("GET", f"{base}/replay", args)
    if response is None:
        return 2
    if response.status_code == 404:  # not a task: an agent run, perhaps
        ran = _request("GET", f"{_url(args)}/v1/runs/{args.task_id}/replay", args)
        if ran is None or ran.is_success or ran.status_code != 404:
            return _run_replay(ran, args)
    if not response.is_success or args.json:
        return _print(response)
    body = response.json()
    if args.dry_run:
        lines, same = format_dry_run(body)
        print("\n".join(lines))
        return 0 if same else 1
    print("\n".join(format_timeline(body)))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="a task's or a run's timeline; --dry-run re-drives it on recorded results; "
        "--rerun runs a task again",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(handler=replay)
    p.add_argument("task_id", metavar="ID", help="a task's id, or an agent run's")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="no connector is called")
    mode.add_argument("--rerun", action="store_true", help="a new task, live, same trace")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    add_client_flags(p)
