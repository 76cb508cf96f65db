"""`reach memory …`: what agents remember about the end users they act for (subjects).

reach memory [subjects]                        your tenant's subjects, with how many memories
reach memory list SUBJECT [--type fact]        a subject's memories, newest first
reach memory search SUBJECT "QUERY"            the ones that match, best first
reach memory put SUBJECT TYPE KEY "TEXT"       remember (the same TYPE and KEY updates it)
reach memory show ID                           one memory: its text, origin and source
reach memory patch ID --text "…" | --pin | …   change it; --confirm trusts a tool-planted one
reach memory forget ID                         delete it for real (runs' copies too)
reach memory forget-subject SUBJECT --yes      delete every memory of a subject

TYPE is one of profile, preference, fact, goal, project, constraint. An entry marked
"untrusted" was written by a run after it read a tool's output: it is never recalled into a
run until a person confirms it. A refusal is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
from typing import Any

from agent_reach_cli.agent_commands import ask, print_json
from agent_reach_cli.client_commands import add_client_flags, add_subcommand
from agent_reach_cli.failures import CommandError

TYPES = ("profile", "preference", "fact", "goal", "project", "constraint")
# The narrowest a listed line is cut to, whatever the terminal says.
MIN_WIDTH = 60


def _json_arg(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"{flag} must be JSON: {exc}") from exc


def _if_match(args: argparse.Namespace) -> dict[str, str]:
    return {} if args.if_match is None else {"If-Match": f'"{args.if_match}"'}


def subjects(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.after:
        params["after"] = args.after
    page = ask("GET", "/v1/memory/subjects", args, params=params).json()
    if args.json:
        print_json(page)
        return 0
    if not page["subjects"]:
        print("no memories")
    width = max((len(s["subject"]) for s in page["subjects"]), default=0)
    for found in page["subjects"]:
        count = found["entries"]
        print(
            f"{found['subject']:<{width}}  {count} memor{'y' if count == 1 else 'ies'}  "
            f"updated {found['updated_at']}"
        )
    if page["next_after"]:
        print(f"(more: reach memory subjects --after {json.dumps(page['next_after'])})")
    return 0


def list_memories(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"subject": args.subject, "limit": args.limit}
    if args.type:
        params["type"] = ",".join(args.type)
    memories = ask("GET", "/v1/memory", args, params=params).json()["memories"]
    return _listed(memories, args, empty=f"no memories of {args.subject}")


def search(args: argparse.Namespace) -> int:
    params = {"subject": args.subject, "q": args.query, "limit": args.limit}
    memories = ask("GET", "/v1/memory/search", args, params=params).json()["memories"]
    return _listed(memories, args, empty=f"nothing of {args.subject} matches")


def _listed(memories: list[dict[str, Any]], args: argparse.Namespace, *, empty: str) -> int:
    if args.json:
        print_json(memories)
        return 0
    if not memories:
        print(empty)
    width = max(shutil.get_terminal_size((100, 24)).columns, MIN_WIDTH)
    for memory in memories:
        print(_cut(memory_line(memory), width))
    return 0


def memory_line(memory: dict[str, Any]) -> str:
    """One memory on a line: id, type:key, its marks, its text."""
    marks = [memory["origin"]]
    if memory["pinned"]:
        marks.append("pinned")
    if memory["untrusted"]:
        marks.append("untrusted")
    if "score" in memory:
        marks.append(f"score {memory['score']:.3g}")
    text = " ".join(memory["text"].split())
    return f"{memory['memory_id']}  {memory['type']}:{memory['key']}  [{', '.join(marks)}]  {text}"


def put(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {
        "subject": args.subject,
        "type": args.type,
        "key": args.key,
        "text": args.text,
    }
    if args.value is not None:
        body["value"] = _json_arg(args.value, "--value")
    if args.pin:
        body["pinned"] = True
    if args.confidence is not None:
        body["confidence"] = args.confidence
    if args.expires_at is not None:
        body["expires_at"] = args.expires_at
    response = ask("POST", "/v1/memory", args, json=body)
    memory = response.json()
    if args.json:
        print_json(memory)
        return 0
    done = "created" if response.status_code == 201 else "saved"
    print(
        f"memory {memory['memory_id']} {done}: {memory['type']}:{memory['key']} of "
        f"{memory['subject']}, version {memory['version']}"
    )
    return 0


def show(args: argparse.Namespace) -> int:
    memory = ask("GET", f"/v1/memory/{args.memory_id}", args).json()
    if args.json:
        print_json(memory)
    else:
        print(describe(memory))
    return 0


def describe(memory: dict[str, Any]) -> str:
    """A memory in a few lines: what it says, where it came from, when it goes."""
    lines = [
        f"memory {memory['memory_id']}  {memory['type']}:{memory['key']}  of {memory['subject']}"
        f"  version {memory['version']}",
        f"  text: {memory['text']}",
    ]
    if memory.get("value") is not None:
        lines.append(f"  value: {json.dumps(memory['value'], ensure_ascii=False)}")
    trust = "  (untrusted: a tool's output planted it)" if memory["untrusted"] else ""
    lines.append(f"  origin: {memory['origin']}{trust}  written by {memory['written_by']}")
    if memory.get("source"):
        lines.append(f"  source: {json.dumps(memory['source'], ensure_ascii=False)}")
    lines.append(
        f"  confidence {memory['confidence']:g}  {'pinned' if memory['pinned'] else 'not pinned'}"
        f"  updated {memory['updated_at']}  expires {memory['expires_at'] or 'never'}"
    )
    return "\n".join(lines)


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if args.text is not None:
        changes["text"] = args.text
    if args.value is not None:
        changes["value"] = _json_arg(args.value, "--value")
    if args.pin is not None:
        changes["pinned"] = args.pin
    if args.confidence is not None:
        changes["confidence"] = args.confidence
    if args.expires_at is not None:
        changes["expires_at"] = None if args.expires_at == "never" else args.expires_at
    if args.confirm:
        changes["origin"] = "user"
    if not changes:
        raise CommandError(
            "nothing to change: give --text, --value, --pin/--unpin, --confidence, "
            "--expires-at or --confirm"
        )
    return changes


def patch(args: argparse.Namespace) -> int:
    changes = _changes(args)
    path = f"/v1/memory/{args.memory_id}"
    memory = ask("PATCH", path, args, json=changes, headers=_if_match(args)).json()
    if args.json:
        print_json(memory)
    else:
        print(describe(memory))
    return 0


def forget(args: argparse.Namespace) -> int:
    ask("DELETE", f"/v1/memory/{args.memory_id}", args)
    if args.json:
        print_json({"forgotten": 1})
    else:
        print(f"forgot memory {args.memory_id}")
    return 0


def forget_subject(args: argparse.Namespace) -> int:
    if not args.yes:
        raise CommandError(
            f"this deletes every memory of {args.subject} for good: add --yes to go on"
        )
    gone = ask("DELETE", "/v1/memory", args, params={"subject": args.subject}).json()
    if args.json:
        print_json(gone)
    else:
        count = gone["forgotten"]
        print(f"forgot {count} memor{'y' if count == 1 else 'ies'} of {args.subject}")
    return 0


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def _add_limit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=argparse.SUPPRESS, help="how many (default 100)")


def add_parser(sub: Any) -> None:
    """`reach memory` and its subcommands."""
    memory = sub.add_parser(
        "memory",
        help="long-term memory: what agents remember about subjects (see `reach memory -h`)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_client_flags(memory)
    memory.add_argument("--json", action="store_true", help="print the answer as JSON")
    memory.add_argument("--limit", type=int, default=100, help="how many (default 100)")
    memory.add_argument("--after", help=argparse.SUPPRESS)
    memory.set_defaults(handler=subjects)
    commands = memory.add_subparsers(dest="memory_command", metavar="COMMAND")

    def add(name: str, handler: Any, help_: str) -> argparse.ArgumentParser:
        return add_subcommand(commands, name, handler, help_)

    p = add("subjects", subjects, "your tenant's subjects, with how many memories each holds")
    _add_limit(p)
    p.add_argument("--after", help="the subject the previous page ended with")
    p = add("list", list_memories, "a subject's memories, newest first")
    p.add_argument("subject")
    p.add_argument("--type", action="append", choices=TYPES, help="only this type (repeatable)")
    _add_limit(p)
    p = add("search", search, "a subject's memories that match a query, best first")
    p.add_argument("subject")
    p.add_argument("query")
    p.add_argument("--limit", type=int, default=10, help="how many (default 10)")
    p = add("put", put, "remember something about a subject (the same TYPE and KEY updates it)")
    p.add_argument("subject")
    p.add_argument("type", choices=TYPES)
    p.add_argument("key")
    p.add_argument("text")
    p.add_argument("--value", metavar="JSON", help="the same as structured JSON")
    p.add_argument("--pin", action="store_true", help="recall it into every run of the subject")
    p.add_argument("--confidence", type=float, metavar="X", help="0 to 1 (default 1)")
    p.add_argument("--expires-at", metavar="TIME", help="forget it then (RFC 3339)")
    add("show", show, "one memory: its text, origin, source and version").add_argument("memory_id")
    p = add("patch", patch, "change a memory (only what is given)")
    p.add_argument("memory_id")
    p.add_argument("--text")
    p.add_argument("--value", metavar="JSON", help="structured JSON ('null': none)")
    pin = p.add_mutually_exclusive_group()
    pin.add_argument("--pin", dest="pin", action="store_const", const=True, default=None)
    pin.add_argument("--unpin", dest="pin", action="store_const", const=False)
    p.add_argument("--confidence", type=float, metavar="X", help="0 to 1")
    p.add_argument("--expires-at", metavar="TIME", help="RFC 3339, or 'never'")
    p.add_argument(
        "--confirm",
        action="store_true",
        help="a person vouches for it: origin user (an untrusted memory becomes trusted)",
    )
    p.add_argument("--if-match", type=int, metavar="VERSION", help="only if still at it")
    add("forget", forget, "delete a memory for real").add_argument("memory_id")
    p = add("forget-subject", forget_subject, "delete every memory of a subject")
    p.add_argument("subject")
    p.add_argument("--yes", action="store_true", help="yes, every one of them, for good")
