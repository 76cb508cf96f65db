"""API keys in the database: create (shown once), list, revoke, and authenticate a request.

Authentication is on every request, so a replica remembers a key it has checked for a couple of
seconds; a revoked key stops working everywhere within that time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from agent_reach_controller import audit
from agent_reach_controller.identity import keys
from agent_reach_controller.identity.policy import Action, Policy, Principal
from agent_reach_controller.storage import identity as storage
from agent_reach_controller.storage.engine import Database

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,127}$"
BOOTSTRAP_KEY_ID = "bootstrap"


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyInfo:
    key_id: str
    name: str
    tenant: str
    roles: tuple[str, ...]
    created_at: datetime
    created_by: str
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: storage.ApiKeyRow) -> KeyInfo:
        return cls(
            key_id=row.key_id,
            name=row.name,
            tenant=row.tenant,
            roles=tuple(row.roles),
            created_at=row.created_at,
            created_by=row.created_by,
            revoked_at=row.revoked_at,
        )


class KeyService:
    def __init__(self, db: Database, *, cache_seconds: float = 2.0) -> None:
        self._db = db
        self._cache_seconds = cache_seconds
        # key id -> (until, its record and secret hash, or None for no such key).
        self._cache: dict[str, tuple[float, tuple[KeyInfo, str] | None]] = {}

    async def create(
        self, *, name: str, tenant: str, roles: list[str], created_by: str
    ) -> tuple[KeyInfo, str]:
        """A new key and its token (the only time the token exists outside the caller)."""
        made = keys.new_key()
        now = datetime.now(UTC)
        row = storage.ApiKeyRow(
            key_id=made.key_id,
            secret_hash=made.secret_hash,
            name=name,
            tenant=tenant,
            roles=sorted(set(roles)),
            created_at=now,
            created_by=created_by,
            revoked_at=None,
        )
        async with self._db.transaction() as conn:
            await storage.insert_api_key(conn, row)
            await audit.record(
                conn,
                actor=created_by,
                tenant=tenant,
                action="key.create",
                target=f"key:{made.key_id}",
                data={"name": name, "roles": row.roles},
                now=now,
            )
        return KeyInfo.of(row), made.token

    async def list(self, *, tenant: str | None = None) -> list[KeyInfo]:
        async with self._db.transaction() as conn:
            rows = await storage.list_api_keys(conn, tenant=tenant)
        return [KeyInfo.of(r) for r in rows]

    async def get(self, key_id: str) -> KeyInfo | None:
        found = await self._load(key_id)
        return found[0] if found else None

    async def _load(self, key_id: str) -> tuple[KeyInfo, str] | None:
        """A key's record and its secret's hash, read from the database."""
        async with self._db.transaction() as conn:
            row = await storage.load_api_key(conn, key_id)
        return (KeyInfo.of(row), row.secret_hash) if row else None

    async def revoke(self, key_id: str, *, by: str = "reach keys revoke") -> bool:
        """Revoke a key; False when there is no such live key."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            revoked = await storage.revoke_api_key(conn, key_id, now=now)
            if revoked:
                # Its console sign-ins end with it (they are also checked against the key).
                await storage.delete_console_sessions_of_key(conn, key_id)
                await audit.record(
                    conn,
                    actor=by,
                    tenant=None,
                    action="key.revoke",
                    target=f"key:{key_id}",
                    now=now,
                )
        self._cache.pop(key_id, None)
        return revoked

    async def recent(self, key_id: str) -> KeyInfo | None:
        """A key's record, remembered for a couple of seconds (a revoke here forgets it)."""
        found = await self._remembered(key_id)
        return found[0] if found else None

    async def _remembered(self, key_id: str) -> tuple[KeyInfo, str] | None:
        now = time.monotonic()
        cached = self._cache.get(key_id)
        if cached is None or cached[0] <= now:
            cached = (now + self._cache_seconds, await self._load(key_id))
            self._cache[key_id] = cached
        return cached[1]

    async def authenticate(self, token: str) -> Principal | None:
        """The principal a token stands for, or None (malformed, unknown, wrong or revoked).

        The key's record may be a couple of seconds old; its secret is checked every time.
        """
        parsed = keys.parse(token)
        if parsed is None:
            return None
        key_id, secret = parsed
        found = await self._remembered(key_id)
        if found is None:
            return None
        info, secret_hash = found
        if info.revoked_at is not None or not keys.matches(secret, secret_hash):
            return None
        return Principal(name=info.name, tenant=info.tenant, roles=info.roles, key_id=key_id)


class Grants:
    """Checks, when a step is about to run, that whoever submitted it still may.

    A revoked key, or a policy that no longer grants `submit` on the tool, stops the step.
    """

    def __init__(self, keys: KeyService, policy: Policy) -> None:
        self._keys = keys
        self._policy = policy

    async def refusal(self, key_id: str | None, tool: str) -> str | None:
        """Why a step submitted with this key may not run `tool` now; None when it may."""
        if key_id is None or key_id == BOOTSTRAP_KEY_ID:
            return None
        info = await self._keys.recent(key_id)
        if info is None or info.revoked_at is not None:
            return "not run: the API key that submitted it has been revoked"
        if not self._policy.allows(info.roles, Action.SUBMIT, tool):
            return f"not run: {info.name} may no longer run {tool}"
        return None
