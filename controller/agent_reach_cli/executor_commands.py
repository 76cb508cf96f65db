"""`reach executors create-token|tokens|revoke-token|list`: executor pools and the live fleet.

Like `reach keys`, these work on the database directly, so the first pool needs no API key.
`create-token --offline` touches no database: it prints a token and the provisioning-file entry
(its hash and scope) for `--executor-tokens FILE`, e.g. a Kubernetes Secret.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import yaml

from agent_reach_cli.key_commands import on_database


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return sorted({part.strip() for part in value.split(",") if part.strip()})


async def _with_db(args: argparse.Namespace, use: Any) -> Any:
    """`await use(pool tokens, sessions)` on the database."""
    from datetime import timedelta

    from agent_reach_controller.identity.pools import PoolTokenService
    from agent_reach_controller.services.sessions import SessionService

    def services(db: Any, settings: Any) -> Any:
        liveness = timedelta(seconds=settings.lease_seconds)
        return use(PoolTokenService(db), SessionService(db, liveness=liveness))

    return await on_database(args, services)


def create_token(args: argparse.Namespace) -> int:
    """Print the new token alone on stdout (for `$(…)` and Secrets); the rest on stderr."""
    connectors, tools = _split(args.connectors), _split(args.tools)
    if args.offline:
        return _offline_token(args.name, connectors=connectors, tools=tools, tenant=args.tenant)

    async def make(pools: Any, _: Any) -> Any:
        return await pools.create(
            name=args.name,
            connectors=connectors,
            tools=tools,
            tenant=args.tenant,
            created_by="reach executors create-token",
        )

    info, token = asyncio.run(_with_db(args, make))
    print(token)
    print(
        f"executor token {info.token_id} for pool {info.name}; shown this once, only its hash "
        "is stored. Give it to executors as --token or AGENT_REACH_EXECUTOR_TOKEN.",
        file=sys.stderr,
    )
    return 0


def _offline_token(
    name: str, *, connectors: list[str] | None, tools: list[str] | None, tenant: str | None
) -> int:
    from agent_reach_controller.identity import keys
    from agent_reach_controller.identity.pools import FileToken, token_hash

    token = keys.new_key(keys.POOL_TOKEN_PREFIX).token
    entry = FileToken(
        name=name, sha256=token_hash(token), connectors=connectors, tools=tools, tenant=tenant
    )
    print(token)
    print(
        "add this entry to the controllers' --executor-tokens file (it holds only the hash):\n"
        + yaml.safe_dump({"tokens": [entry.model_dump(exclude_none=True)]}, sort_keys=False),
        file=sys.stderr,
    )
    return 0


def list_tokens(args: argparse.Namespace) -> int:
    async def read(pools: Any, _: Any) -> Any:
        return await pools.list()

    for token in asyncio.run(_with_db(args, read)):
        print(
            json.dumps(
                {
                    "token_id": token.token_id,
                    "name": token.name,
                    "connectors": token.connectors,
                    "tools": token.tools,
                    "tenant": token.tenant,
                    "created_at": token.created_at.isoformat() if token.created_at else None,
                    "revoked_at": token.revoked_at.isoformat() if token.revoked_at else None,
                }
            )
        )
    return 0


def revoke_token(args: argparse.Namespace) -> int:
    async def revoke(pools: Any, _: Any) -> Any:
        return await pools.revoke(args.token_id, by="reach executors revoke-token")

    if not asyncio.run(_with_db(args, revoke)):
        print(f"reach: no live executor token {args.token_id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.token_id}; its executors' steps go back to the queue")
    return 0


def list_executors(args: argparse.Namespace) -> int:
    async def read(_: Any, sessions: Any) -> Any:
        return await sessions.list(live_only=not args.ended)

    found = asyncio.run(_with_db(args, read))
    if args.json:
        for s in found:
            print(
                json.dumps(
                    {
                        "session_id": s.id,
                        "pool": s.pool,
                        "executor_id": s.executor_id,
                        "scope": s.scope,
                        "connectors": s.connectors,
                        "slots": s.slots,
                        "leases": s.leases,
                        "version": s.version,
                        "last_seen_at": s.last_seen_at.isoformat(),
                        "ended_at": s.ended_at.isoformat() if s.ended_at else None,
                    }
                )
            )
        return 0
    print(f"{'SESSION':<13} {'POOL':<16} {'EXECUTOR':<32} {'LEASES':>6}/{'SLOTS':<5} LAST SEEN")
    for s in found:
        print(
            f"{s.id:<13} {s.pool[:16]:<16} {s.executor_id[:32]:<32} {s.leases:>6}/{s.slots:<5} "
            f"{s.last_seen_at:%H:%M:%S}{' ended: ' + str(s.end_reason) if s.ended_at else ''}"
        )
    return 0


def add_parser(sub: Any) -> None:
    """`reach executors …` with its verbs."""
    group = sub.add_parser(
        "executors", help="executor pool tokens and the live fleet (on the database)"
    )
    verbs = group.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, handler, help_ in (
        ("create-token", create_token, "create a pool token and print it once"),
        ("tokens", list_tokens, "list pool tokens (never their secrets)"),
        ("revoke-token", revoke_token, "revoke a token; its executors' steps run elsewhere"),
        ("list", list_executors, "executors connected now: pool, leases, slots, last seen"),
    ):
        p = verbs.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        p.add_argument("--database-url", help="(AGENT_REACH_CONTROLLER_DATABASE_URL)")
        if name == "create-token":
            p.add_argument("--name", required=True, help="the pool")
            p.add_argument("--connectors", help="comma-separated connectors it may run (any)")
            p.add_argument("--tools", help="comma-separated tool patterns, e.g. 'orders.*' (any)")
            p.add_argument("--tenant", help="the one tenant whose steps it may run (any)")
            p.add_argument(
                "--offline",
                action="store_true",
                help="store nothing: print the token and its --executor-tokens file entry",
            )
        elif name == "revoke-token":
            p.add_argument("token_id")
        elif name == "list":
            p.add_argument("--ended", action="store_true", help="include ended sessions")
            p.add_argument("--json", action="store_true", help="one JSON object per line")
