"""`reach runs …`: agent runs on a running controller (start, show, list, continue, cancel).

reach runs start AGENT "text" --wait 60   start a run; wait up to 60 s for its answer
reach runs show RUN_ID                    where it is, its answer and its conversation
reach runs [list]                         your tenant's runs, newest first
reach runs continue RUN_ID "text"         the next message of a run that ended
reach runs cancel RUN_ID                  stop it

Exit 0: the run succeeded (or is under way and was not waited for); 1: it failed, was cancelled
or was still running when the wait ran out (why, on stderr); 2: the command could not ask.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from typing import Any

from agent_reach_cli.agent_commands import ask, print_json
from agent_reach_cli.client_commands import add_client_flags, add_subcommand
from agent_reach_cli.failures import CommandError

ENDED = frozenset({"succeeded", "failed", "cancelled"})
# The narrowest a conversation line is cut to, whatever the terminal says.
MIN_WIDTH = 60


def _input(text: str) -> str:
    return sys.stdin.read() if text == "-" else text


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    given = {
        "max_rounds": args.max_rounds,
        "input_tokens": args.input_tokens,
        "output_tokens": args.output_tokens,
        "cost": args.cost,
        "deadline": args.deadline,
    }
    return {k: v for k, v in given.items() if v is not None}


def _context(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        context = json.loads(text)
    except ValueError as exc:
        raise CommandError(f"--context must be a JSON object: {exc}") from exc
    if not isinstance(context, dict):
        raise CommandError("--context must be a JSON object")
    return context


def _wait(args: argparse.Namespace) -> dict[str, Any]:
    return {"params": {"wait": args.wait}, "wait": args.wait} if args.wait else {}


def start(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"agent": args.agent, "input": _input(args.input)}
    if args.subject is not None:
        body["subject"] = args.subject
    if (context := _context(args.context)) is not None:
        body["context"] = context
    if limits := _limits(args):
        body["limits"] = limits
    run = ask("POST", "/v1/runs", args, json=body, **_wait(args)).json()
    return _told(run, args)


def show(args: argparse.Namespace) -> int:
    run = ask("GET", f"/v1/runs/{args.run_id}", args, **_wait(args)).json()
    return _told(run, args, conversation=True)


def continue_(args: argparse.Namespace) -> int:
    path = f"/v1/runs/{args.run_id}/messages"
    run = ask("POST", path, args, json={"input": _input(args.input)}, **_wait(args)).json()
    return _told(run, args)


def cancel(args: argparse.Namespace) -> int:
    run = ask("POST", f"/v1/runs/{args.run_id}/cancel", args).json()
    if args.json:
        print_json(run)
    else:
        print(describe_run(run))
    return 0


def list_runs(args: argparse.Namespace) -> int:
    runs = ask("GET", "/v1/runs", args, params={"limit": args.limit}).json()["runs"]
    if args.json:
        print_json(runs)
        return 0
    if not runs:
        print("no runs")
    for run in runs:
        ended = f" ({run['end_reason']})" if run.get("end_reason") else ""
        print(
            f"{run['run_id']}  {run['status'] + ended:<28}  {run['agent']}  "
            f"round {run['round']}  {run['created_at']}"
        )
    return 0


def _told(run: dict[str, Any], args: argparse.Namespace, *, conversation: bool = False) -> int:
    """Print the run (a summary, its conversation too if asked; or JSON); its exit code."""
    if args.json:
        print_json(run)
    else:
        print(describe_run(run))
        if conversation and run.get("messages"):
            print("conversation:")
            width = max(shutil.get_terminal_size((100, 24)).columns, MIN_WIDTH)
            for entry in run["messages"]:
                for line in entry_lines(entry):
                    print(_cut(line, width))
    return _exit_code(run, waited=bool(args.wait))


def _exit_code(run: dict[str, Any], *, waited: bool) -> int:
    status = run["status"]
    if status == "succeeded" or (status not in ENDED and not waited):
        return 0
    if status in ENDED:
        error = run.get("error") or {}
        said = f": {error['message']}" if error.get("message") else ""
        told = f"reach: run {run['run_id']} {status}: {run['end_reason']}{said}"
        print(" ".join(told.split()), file=sys.stderr)  # one line, whatever the message holds
    else:
        print(
            f"reach: run {run['run_id']} is still {status} after the wait "
            f"(reach runs show {run['run_id']} --wait SECONDS)",
            file=sys.stderr,
        )
    return 1


def describe_run(run: dict[str, Any]) -> str:
    """A run in a few lines: where it is, what it used, and its answer."""
    ended = f" ({run['end_reason']})" if run.get("end_reason") else ""
    tokens = run["tokens"]
    subject = f"  for {run['subject']}" if run.get("subject") else ""
    lines = [
        f"run {run['run_id']}  {run['status']}{ended}  agent {run['agent']}{subject}  "
        f"round {run['round']}",
        f"  tokens {tokens['input']} in, {tokens['output']} out, {tokens['cached']} cached  "
        f"cost {run['cost']:g}",
    ]
    if isinstance(error := run.get("error"), dict):
        lines.append(f"  error: {error.get('code', 'failed')}: {error.get('message', '')}")
    if run.get("answer") is not None:
        lines.append(f"answer: {run['answer']}")
    return "\n".join(lines)


def entry_lines(entry: dict[str, Any]) -> list[str]:
    """One conversation entry as lines: `[round] role  what it says` (text, a call, a result)."""
    head = f"  [{entry['round']}] {entry['role']:<9}"
    return [f"{head}  {part}" for part in _parts(entry["message"])] or [head]


def _parts(message: Any) -> list[str]:
    """What a message says, in any endpoint's shape (Chat, Responses, Anthropic)."""
    if not isinstance(message, dict):
        return [_compact(message)]
    kind = message.get("type")
    if kind == "function_call":  # Responses
        return [_call(message.get("name"), message.get("arguments"))]
    if kind == "function_call_output":
        return [_result(message.get("call_id"), message.get("output"))]
    parts = _content(message.get("content"))
    for call in message.get("tool_calls") or ():  # Chat
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        parts.append(_call(function.get("name"), function.get("arguments")))
    if message.get("role") == "tool":
        return [_result(message.get("tool_call_id"), " ".join(parts))]
    return parts


def _content(content: Any) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return [_compact(content)]
    parts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in ("text", "output_text", "input_text"):
            parts.append(str(block.get("text", "")))
        elif kind == "tool_use":  # Anthropic
            parts.append(_call(block.get("name"), block.get("input")))
        elif kind == "tool_result":
            parts.append(_result(block.get("tool_use_id"), " ".join(_content(block["content"]))))
        else:
            parts.append(_compact(block))
    return parts


def _call(name: Any, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:  # not JSON: shown as the model wrote it
            return f"call {name} {arguments}"
    return f"call {name} {_compact(arguments)}"


def _result(call_id: Any, output: Any) -> str:
    return f"result {call_id}: {output if isinstance(output, str) else _compact(output)}"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _cut(line: str, width: int) -> str:
    line = " ".join(line.split()) if "\n" in line else line
    return line if len(line) <= width else line[: width - 1] + "…"


def _add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-rounds", type=int, metavar="N", help="at most N model calls")
    p.add_argument("--input-tokens", type=int, metavar="N", help="a budget of tokens sent")
    p.add_argument("--output-tokens", type=int, metavar="N", help="a budget of tokens received")
    p.add_argument("--cost", type=float, metavar="X", help="a cost budget (the price table's unit)")
    p.add_argument("--deadline", type=float, metavar="SECONDS", help="end the run after this")


def add_parser(sub: Any) -> None:
    """`reach runs` and its subcommands."""
    runs = sub.add_parser(
        "runs",
        help="agent runs: start one, follow it, continue it (see `reach runs -h`)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_client_flags(runs)
    runs.add_argument("--json", action="store_true", help="print the answer as JSON")
    runs.add_argument("--limit", type=int, default=50, help="how many runs (default 50)")
    runs.set_defaults(handler=list_runs)
    commands = runs.add_subparsers(dest="runs_command", metavar="COMMAND")

    def add(name: str, handler: Any, help_: str) -> argparse.ArgumentParser:
        return add_subcommand(commands, name, handler, help_)

    wait_help = "seconds to wait for the run to end (default: do not wait)"
    p = add("start", start, "start an agent run with a message ('-': read it from stdin)")
    p.add_argument("agent")
    p.add_argument("input", metavar="TEXT")
    p.add_argument("--subject", help="the end user the run acts for")
    p.add_argument("--context", metavar="JSON", help="a JSON object the run carries")
    _add_limits(p)
    p.add_argument("--wait", type=float, default=0, metavar="SECONDS", help=wait_help)
    p = add("show", show, "a run: status, tokens, cost, answer and its conversation")
    p.add_argument("run_id")
    p.add_argument("--wait", type=float, default=0, metavar="SECONDS", help=wait_help)
    p = add("list", list_runs, "your tenant's runs, newest first")
    p.add_argument("--limit", type=int, default=argparse.SUPPRESS, help="how many (default 50)")
    p = add("continue", continue_, "the next message of a run that ended ('-': from stdin)")
    p.add_argument("run_id")
    p.add_argument("input", metavar="TEXT")
    p.add_argument("--wait", type=float, default=0, metavar="SECONDS", help=wait_help)
    add("cancel", cancel, "cancel a run").add_argument("run_id")
