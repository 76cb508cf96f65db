"""Console sign-ins: an API key, or a trusted proxy's identity header, exchanged for a session.

The browser holds `ars_<secret>` in an HttpOnly cookie; the table holds only its SHA-256. A
session is short-lived and never outlives what it was made from: one made from an API key ends
when the key is revoked (within the key cache's couple of seconds), one made behind the proxy
when the proxy stops naming that user or the users file stops mapping them.

Actions need the session's CSRF token besides the cookie: an HMAC of a fixed label under the
session's secret, so any replica can check it and nothing more is stored. A page from another
site can neither read the token (same-origin rule) nor send the cookie (SameSite=Strict).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_reach_controller import audit
from agent_reach_controller.identity.policy import Principal, read_yaml_model
from agent_reach_controller.identity.service import BOOTSTRAP_KEY_ID, KeyService
from agent_reach_controller.storage import identity as storage
from agent_reach_controller.storage.engine import Database

COOKIE = "ar_console"
CSRF_HEADER = "X-CSRF-Token"
_PREFIX = "ars_"
_CSRF_LABEL = b"agent-reach console csrf v1"
# Expired rows are forgotten a few at a time, on sign-in.
_SWEEP_BATCH = 100


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def csrf_token(secret: str) -> str:
    """The CSRF token of a session: what its pages carry and every action must send back."""
    return hmac.new(secret.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()[:32]


def csrf_matches(secret: str, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(csrf_token(secret), sent)


class ProxyUser(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=128)
    roles: list[str] = Field(default_factory=list)


class ProxyUsers(BaseModel):
    """Who a trusted authenticating proxy may sign in: `users: {name: {tenant, roles}}`."""

    model_config = ConfigDict(extra="forbid")

    users: dict[str, ProxyUser] = Field(default_factory=dict)


class ProxyUsersError(Exception):
    """The proxy users file cannot be read or is not valid."""


def load_proxy_users(path: Path) -> ProxyUsers:
    return read_yaml_model(path, ProxyUsers, ProxyUsersError, what="the proxy users")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyTrust:
    """The authenticating proxy: the header it names the user in, and the addresses it calls
    from (a header from anywhere else is ignored, or anyone could claim to be anyone)."""

    header: str
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    users: ProxyUsers

    def user_of(self, peer: str | None, headers: Any) -> str | None:
        """The user the proxy names on this request, or None (no header, untrusted peer)."""
        name = headers.get(self.header)
        if not name or peer is None:
            return None
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return None
        if not any(address in network for network in self.networks):
            return None
        return str(name).strip() or None

    def principal(self, user: str) -> Principal | None:
        found = self.users.users.get(user)
        if found is None:
            return None
        return Principal(name=user, tenant=found.tenant, roles=tuple(found.roles))


@dataclass(frozen=True, slots=True, kw_only=True)
class SignIn:
    """A live console session: who it is, and its secret (the cookie's value)."""

    principal: Principal
    secret: str
    expires_at: datetime

    @property
    def csrf(self) -> str:
        return csrf_token(self.secret)


class SignInService:
    def __init__(
        self,
        db: Database,
        keys: KeyService,
        *,
        lifetime: timedelta,
        bootstrap_enabled: bool,
        proxy: ProxyTrust | None,
    ) -> None:
        self._db = db
        self._keys = keys
        self._lifetime = lifetime
        self._bootstrap_enabled = bootstrap_enabled
        self.proxy = proxy

    async def start(self, principal: Principal, *, via_proxy: bool = False) -> SignIn:
        """A new session for an authenticated principal (from its API key, or the proxy)."""
        secret = _PREFIX + secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        row = storage.ConsoleSessionRow(
            secret_hash=hash_secret(secret),
            principal=principal.name,
            tenant=principal.tenant,
            roles=sorted(principal.roles),
            key_id=None if via_proxy else principal.key_id,
            created_at=now,
            expires_at=now + self._lifetime,
        )
        async with self._db.transaction() as conn:
            await storage.delete_expired_console_sessions(conn, now=now, limit=_SWEEP_BATCH)
            await storage.insert_console_session(conn, row)
            await audit.record(
                conn,
                actor=principal.name,
                tenant=principal.tenant,
                action="console.sign_in",
                target=f"principal:{principal.name}",
                data={"via": "proxy" if via_proxy else f"key:{principal.key_id}"},
                now=now,
            )
        return SignIn(principal=principal, secret=secret, expires_at=row.expires_at)

    async def resolve(self, secret: str, *, proxy_user: str | None) -> SignIn | None:
        """The session a cookie holds, or None: unknown, expired, or what made it is gone.

        `proxy_user` is who the trusted proxy names on this request: a proxy session lives only
        while the proxy keeps naming its user.
        """
        if not secret.startswith(_PREFIX) or len(secret) > 100:
            return None
        async with self._db.transaction() as conn:
            row = await storage.load_console_session(conn, hash_secret(secret))
        if row is None or row.expires_at <= datetime.now(UTC):
            return None
        principal = await self._current(row, proxy_user)
        if principal is None:
            return None
        return SignIn(
            principal=principal,
            secret=secret,
            expires_at=row.expires_at,
        )

    async def end(self, secret: str) -> None:
        async with self._db.transaction() as conn:
            await storage.delete_console_session(conn, hash_secret(secret))

    async def _current(
        self, row: storage.ConsoleSessionRow, proxy_user: str | None
    ) -> Principal | None:
        """Who the session stands for now: the key's or the users file's present word."""
        if row.key_id is None:
            if self.proxy is None or proxy_user != row.principal:
                return None
            return self.proxy.principal(row.principal)
        if row.key_id == BOOTSTRAP_KEY_ID:
            if not self._bootstrap_enabled:
                return None
            return Principal(
                name=row.principal, tenant=row.tenant, roles=tuple(row.roles), key_id=row.key_id
            )
        info = await self._keys.recent(row.key_id)
        if info is None or info.revoked_at is not None:
            return None
        return Principal(name=info.name, tenant=info.tenant, roles=info.roles, key_id=row.key_id)
