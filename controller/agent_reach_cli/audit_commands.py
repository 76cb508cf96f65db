"""`reach audit verify`: check the audit log's hash chain straight from the database."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `reach audit …` on the top-level subcommands."""
    help_ = "the append-only audit log"
    audit = sub.add_parser("audit", help=help_, description=help_)
    actions = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    help_ = "check the hash chain; exit 1 on the first problem found"
    p = actions.add_parser("verify", help=help_, description=help_)
    p.add_argument("--database-url", help="(AGENT_REACH_CONTROLLER_DATABASE_URL)")
    p.add_argument(
        "--anchor",
        metavar="SEQ:HASH",
        help="a head printed by an earlier verify: the chain must still reach it with that hash",
    )
    p.set_defaults(handler=verify)


def _anchor(text: str | None) -> tuple[int, str] | None:
    if text is None:
        return None
    seq, sep, digest = text.partition(":")
    if not sep or not seq.isdigit() or len(digest) != 64:
        raise ValueError("--anchor must be SEQ:HASH (the hash as 64 hex digits)")
    return int(seq), digest.lower()


def _missing_sqlite_file(url: str) -> str | None:
    from agent_reach_controller.storage.engine import sqlite_file

    name = sqlite_file(url)
    return None if name is None or Path(name).exists() else name


def verify(args: argparse.Namespace) -> int:
    from agent_reach_controller.audit import verify as verify_chain
    from agent_reach_controller.settings import ControllerSettings
    from agent_reach_controller.storage.engine import Database

    given: dict[str, Any] = {"database_url": args.database_url} if args.database_url else {}
    url = ControllerSettings(**given).database_url.get_secret_value()
    try:
        anchor = _anchor(args.anchor)
    except ValueError as exc:
        print(f"reach: {exc}", file=sys.stderr)
        return 2
    missing = _missing_sqlite_file(url)
    if missing is not None:
        print(f"reach: no SQLite database at {missing}", file=sys.stderr)
        return 2

    async def run() -> Any:
        db = Database(url, pool_size=1)
        try:
            return await verify_chain(db, anchor=anchor)
        finally:
            await db.close()

    try:
        report = asyncio.run(run())
    except Exception as exc:  # a database that cannot be reached or read
        print(f"reach: cannot read the audit log: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0 if report.ok else 1
