"""`reach keys create|list|revoke`: API keys, managed where the database is reachable.

Operators run these against the database (like `reach migrate`), so the first key needs no
other key. A created key is printed once; only its hash is stored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from agent_reach.times import rfc3339
from agent_reach_cli.process_commands import _given, prepare_database


async def on_database(args: argparse.Namespace, use: Any) -> Any:
    """`await use(db, settings)` on the database `--database-url` (or the environment) names."""
    from agent_reach_controller.settings import ControllerSettings
    from agent_reach_controller.storage.engine import Database

    settings = ControllerSettings(**_given(args, "database_url"))
    url = settings.database_url.get_secret_value()
    prepare_database(url)
    db = Database(url)
    try:
        return await use(db, settings)
    finally:
        await db.close()


async def _with_keys(args: argparse.Namespace, use: Any) -> Any:
    from agent_reach_controller.identity.service import KeyService

    return await on_database(args, lambda db, _: use(KeyService(db)))


def create(args: argparse.Namespace) -> int:
    from agent_reach_controller.identity.policy import load as load_policy
    from agent_reach_controller.settings import ControllerSettings

    # --policy, else the controller's own (AGENT_REACH_CONTROLLER_POLICY), else the default.
    policy = load_policy(ControllerSettings(**_given(args, "policy")).policy)
    unknown = sorted(set(args.role) - set(policy.roles))
    if unknown:
        print(f"reach: unknown roles: {', '.join(unknown)}", file=sys.stderr)
        return 2

    async def make(keys: Any) -> Any:
        return await keys.create(
            name=args.name, tenant=args.tenant, roles=args.role, created_by="reach keys create"
        )

    info, token = asyncio.run(_with_keys(args, make))
    print(
        f"key {info.key_id} for {info.name} (tenant {info.tenant}, roles {', '.join(info.roles)})"
    )
    print(f"\n  {token}\n\nIt is shown this once; only its hash is stored.")
    return 0


def list_keys(args: argparse.Namespace) -> int:
    async def all_keys(keys: Any) -> Any:
        return await keys.list(tenant=args.tenant)

    for info in asyncio.run(_with_keys(args, all_keys)):
        row = {
            "key_id": info.key_id,
            "name": info.name,
            "tenant": info.tenant,
            "roles": list(info.roles),
            "created_at": rfc3339(info.created_at),
            "revoked_at": rfc3339(info.revoked_at) if info.revoked_at else None,
        }
        print(json.dumps(row))
    return 0


def revoke(args: argparse.Namespace) -> int:
    async def revoke_one(keys: Any) -> Any:
        return await keys.revoke(args.key_id)

    if not asyncio.run(_with_keys(args, revoke_one)):
        print(f"reach: no live key {args.key_id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key_id}")
    return 0


def add_parsers(sub: Any) -> None:
    """`reach keys …` with its three verbs."""
    keys = sub.add_parser("keys", help="create, list or revoke API keys (on the database)")
    verbs = keys.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, handler, help_ in (
        ("create", create, "create a key and print it once"),
        ("list", list_keys, "list keys (never their secrets)"),
        ("revoke", revoke, "revoke a key at once"),
    ):
        p = verbs.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        p.add_argument("--database-url", help="(AGENT_REACH_CONTROLLER_DATABASE_URL)")
        if name == "create":
            p.add_argument("--name", required=True, help="the principal the key stands for")
            p.add_argument("--tenant", default="default", help="its tenant (default: default)")
            p.add_argument(
                "--role", action="append", required=True, help="a role of the policy (repeatable)"
            )
            p.add_argument(
                "--policy",
                help="the policy YAML the controller uses, to check the roles "
                "(AGENT_REACH_CONTROLLER_POLICY)",
            )
        elif name == "list":
            p.add_argument("--tenant", help="only this tenant's keys")
        else:
            p.add_argument("key_id")
