"""Executor pools: which processes may run steps, and which steps.

A pool is named by a token (`rxt_<token id>_<secret>`, shown once, stored as a SHA-256 like API
keys), by an entry of a provisioning file (only the token's hash, so it can live in a Kubernetes
Secret or a Helm value), or by a client certificate under mutual TLS. The pool's scope bounds
what its sessions may lease: connectors, tool name patterns and one tenant (each: any when unset).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from agent_reach_controller import audit
from agent_reach_controller.identity import keys
from agent_reach_controller.storage import identity as storage
from agent_reach_controller.storage.engine import Database
from agent_reach_controller.storage.sessions import (
    revoke_credential_sessions,
    revoke_token_sessions,
)

log = logging.getLogger(__name__)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
# The credential of a session opened while executor authentication is off (`--executor-auth off`).
ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolScope:
    """What a pool's executors may lease; None in a field means anything."""

    pool: str
    # What authenticated it: a token id, "file:<name>", "cert:<pool>" or "anonymous".
    credential: str
    connectors: tuple[str, ...] | None = None
    tools: tuple[str, ...] | None = None
    tenant: str | None = None

    def refused_connectors(self, names: Iterable[str]) -> list[str]:
        """Those of `names` outside the scope."""
        if self.connectors is None:
            return []
        return [n for n in names if n not in self.connectors]

    def allows_tool(self, tool: str) -> bool:
        return self.tools is None or any(fnmatchcase(tool, p) for p in self.tools)

    def to_json(self) -> dict[str, Any]:
        return {
            "connectors": list(self.connectors) if self.connectors is not None else None,
            "tools": list(self.tools) if self.tools is not None else None,
            "tenant": self.tenant,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, pool: str, credential: str) -> PoolScope:
        connectors, tools = data.get("connectors"), data.get("tools")
        return cls(
            pool=pool,
            credential=credential,
            connectors=tuple(connectors) if connectors is not None else None,
            tools=tuple(tools) if tools is not None else None,
            tenant=data.get("tenant"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolToken:
    """A pool token as listed: never its secret."""

    token_id: str
    name: str
    connectors: tuple[str, ...] | None
    tools: tuple[str, ...] | None
    tenant: str | None
    created_at: datetime | None
    created_by: str
    revoked_at: datetime | None
    # "database", or "file" for tokens provisioned by a file (revoked by editing the file).
    source: str = "database"

    @property
    def scope(self) -> PoolScope:
        credential = self.token_id if self.source == "database" else f"file:{self.name}"
        return PoolScope(
            pool=self.name,
            credential=credential,
            connectors=self.connectors,
            tools=self.tools,
            tenant=self.tenant,
        )

    @classmethod
    def of(cls, row: storage.PoolTokenRow) -> PoolToken:
        return cls(
            token_id=row.token_id,
            name=row.name,
            connectors=_tuple(row.connectors),
            tools=_tuple(row.tools),
            tenant=row.tenant,
            created_at=row.created_at,
            created_by=row.created_by,
            revoked_at=row.revoked_at,
        )


def _tuple(value: Sequence[str] | None) -> tuple[str, ...] | None:
    return tuple(value) if value is not None else None


class FileToken(BaseModel):
    """One pool of a provisioning file: its scope, and the SHA-256 (hex) of its token.

    Without `sha256` the pool has no token and is reachable only by a client certificate.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    connectors: list[str] | None = None
    tools: list[str] | None = None
    tenant: str | None = None

    def token(self) -> PoolToken:
        return PoolToken(
            token_id=f"file:{self.name}",
            name=self.name,
            connectors=_tuple(self.connectors),
            tools=_tuple(self.tools),
            tenant=self.tenant,
            created_at=None,
            created_by="file",
            revoked_at=None,
            source="file",
        )


class TokenFile(BaseModel):
    """`--executor-tokens FILE`: `{"tokens": [...]}` in YAML or JSON."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[FileToken] = Field(default_factory=list)

    @classmethod
    def load(cls, path: Path | None) -> TokenFile:
        if path is None:
            return cls()
        return cls.model_validate(yaml.safe_load(path.read_text()) or {})


class WatchedTokenFile:
    """The provisioning file, read again when it changes (a Kubernetes Secret is updated in
    place): a pool added or removed there counts within a couple of seconds, no restart.

    A file that turns unreadable or invalid keeps the last good contents (and says so).
    """

    def __init__(self, path: Path | None, *, every: float = 2.0) -> None:
        self.path = path
        self._every = every
        self._checked = time.monotonic()
        self._stamp = self._stat()
        self.current = TokenFile.load(path)

    def _stat(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            found = self.path.stat()
        except OSError:
            return None
        return (found.st_mtime_ns, found.st_size)

    def refresh(self) -> list[str]:
        """Re-read the file if it changed; returns the pools it no longer names."""
        now = time.monotonic()
        if self.path is None or now - self._checked < self._every:
            return []
        self._checked = now
        stamp = self._stat()
        if stamp == self._stamp:
            return []
        try:
            fresh = TokenFile.load(self.path)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            log.error(
                "executor tokens file %s is unreadable or invalid (%s); keeping the last good one",
                self.path,
                type(exc).__name__,
                extra={"event": "executor_tokens_invalid"},
            )
            return []
        self._stamp = stamp
        before = {(t.name, t.sha256) for t in self.current.tokens}
        self.current = fresh
        after = {(t.name, t.sha256) for t in fresh.tokens}
        gone = sorted({name for name, _ in before - after} - {name for name, _ in after})
        log.info(
            "executor tokens file %s reloaded: %d pools",
            self.path,
            len(fresh.tokens),
            extra={"event": "executor_tokens_reloaded", "removed": gone},
        )
        return gone


def token_hash(token: str) -> str:
    """What a provisioning file stores for a token: the SHA-256 of the whole token, in hex."""
    return hashlib.sha256(token.strip().encode()).hexdigest()


class PoolTokenService:
    """Pool tokens in the database and in a provisioning file; authenticates executors.

    Executors authenticate on every call, so a replica remembers a database token it has checked
    for a couple of seconds; revoking one also ends its sessions at once (see SessionService).
    """

    def __init__(
        self, db: Database, *, file: WatchedTokenFile | None = None, cache_seconds: float = 2.0
    ) -> None:
        self._db = db
        self._watched = file or WatchedTokenFile(None)
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, tuple[PoolToken, str] | None]] = {}

    async def create(
        self,
        *,
        name: str,
        connectors: Sequence[str] | None = None,
        tools: Sequence[str] | None = None,
        tenant: str | None = None,
        created_by: str,
    ) -> tuple[PoolToken, str]:
        """A new token and its text (the only time the text exists outside the caller)."""
        made = keys.new_key(keys.POOL_TOKEN_PREFIX)
        now = datetime.now(UTC)
        row = storage.PoolTokenRow(
            token_id=made.key_id,
            secret_hash=made.secret_hash,
            name=name,
            connectors=sorted(set(connectors)) if connectors is not None else None,
            tools=sorted(set(tools)) if tools is not None else None,
            tenant=tenant,
            created_at=now,
            created_by=created_by,
            revoked_at=None,
        )
        async with self._db.transaction() as conn:
            await storage.insert_pool_token(conn, row)
            await audit.record(
                conn,
                actor=created_by,
                tenant=tenant,
                action="executor_token.create",
                target=f"executor_token:{made.key_id}",
                data={k: getattr(row, k) for k in ("name", "connectors", "tools", "tenant")},
                now=now,
            )
        return PoolToken.of(row), made.token

    async def list(self) -> list[PoolToken]:
        async with self._db.transaction() as conn:
            rows = await storage.list_pool_tokens(conn)
        return [PoolToken.of(r) for r in rows] + [t.token() for t in self._watched.current.tokens]

    async def revoke(self, token_id: str, *, by: str) -> bool:
        """Revoke a database token and end its sessions; False when there is no such live token.

        Every replica's reaper then re-queues what those sessions held (within a second), and
        their reports and heartbeats are refused from this commit on.
        """
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            revoked = await storage.revoke_pool_token(conn, token_id, now=now)
            if revoked:
                await revoke_token_sessions(conn, token_id, now=now)
                await audit.record(
                    conn,
                    actor=by,
                    tenant=None,
                    action="executor_token.revoke",
                    target=f"executor_token:{token_id}",
                    now=now,
                )
        self._cache.pop(token_id, None)
        return revoked

    async def authenticate(self, token: str) -> PoolScope | None:
        """The scope a token grants, or None (malformed, unknown, wrong or revoked)."""
        token = token.strip()
        digest = token_hash(token)
        await self._reload()
        for entry in self._watched.current.tokens:
            if entry.sha256 is not None and hmac.compare_digest(entry.sha256, digest):
                return entry.token().scope
        parsed = keys.parse(token, keys.POOL_TOKEN_PREFIX)
        if parsed is None:
            return None
        token_id, secret = parsed
        found = await self._remembered(token_id)
        if found is None:
            return None
        info, secret_hash = found
        if info.revoked_at is not None or not keys.matches(secret, secret_hash):
            return None
        return info.scope

    async def pool(self, name: str) -> PoolScope | None:
        """The scope of a pool by name (a client certificate names one): the file's entry, else
        the newest live database token of that name."""
        await self._reload()
        for entry in self._watched.current.tokens:
            if entry.name == name:
                return _as_cert(entry.token().scope)
        async with self._db.transaction() as conn:
            row = await storage.newest_live_pool_token(conn, name)
        return _as_cert(PoolToken.of(row).scope) if row else None

    async def _reload(self) -> None:
        """Pick up a changed provisioning file; a pool removed from it is revoked: its sessions
        end (and their leases go back to the queue) as for a revoked database token."""
        gone = self._watched.refresh()
        if not gone:
            return
        credentials = [f"file:{name}" for name in gone] + [f"cert:{name}" for name in gone]
        async with self._db.transaction() as conn:
            await revoke_credential_sessions(conn, credentials, now=datetime.now(UTC))

    async def _remembered(self, token_id: str) -> tuple[PoolToken, str] | None:
        now = time.monotonic()
        cached = self._cache.get(token_id)
        if cached is None or cached[0] <= now:
            cached = (now + self._cache_seconds, await self._load(token_id))
            self._cache[token_id] = cached
        return cached[1]

    async def _load(self, token_id: str) -> tuple[PoolToken, str] | None:
        async with self._db.transaction() as conn:
            row = await storage.load_pool_token(conn, token_id)
        return (PoolToken.of(row), row.secret_hash) if row else None


def _as_cert(scope: PoolScope) -> PoolScope:
    return PoolScope(
        pool=scope.pool,
        credential=f"cert:{scope.pool}",
        connectors=scope.connectors,
        tools=scope.tools,
        tenant=scope.tenant,
    )
