"""Triggers: a name that starts a stored plan template when a signed event is POSTed to it.

A trigger is saved with a template (a plan with `$event` references, planning/templates.py),
checked then as any plan is; each change of its template is a new immutable version. Events
are signed as Standard Webhooks prescribe (`webhook-id`, `webhook-timestamp`,
`webhook-signature`, HMAC-SHA256 with the trigger's `whsec_` secret), so GitHub-, Stripe- or
Svix-style senders need no API key. A run is a submit by the principal who saved the trigger,
with the rights its key has at the time of the run: a revoked key stops the trigger.

An event id is an Idempotency-Key in the scope `trigger:<name>`: a sender that retries, or a
captured request replayed within the timestamp's tolerance, gets the first run's task.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from agent_reach_controller import audit
from agent_reach_controller.identity.policy import Principal
from agent_reach_controller.identity.service import BOOTSTRAP_KEY_ID, KeyService
from agent_reach_controller.planning.plan import Plan, parse_template
from agent_reach_controller.services.intake import request_hash
from agent_reach_controller.storage import triggers as store
from agent_reach_controller.storage.engine import Database
from agent_reach_controller.storage.triggers import TriggerRow, VersionRow
from agent_reach_controller.tools.catalog import ToolCatalog

log = logging.getLogger(__name__)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
_ENV_SECRET = re.compile(r"^\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}$")
# Standard Webhooks secrets are 24 to 64 random bytes.
_SECRET_BYTES = (24, 64)
_EVENT_ID_MAX = 255
_PREFIX = "whsec_"


class TriggerError(Exception):
    """A trigger request that cannot be served; the API answers `status` with `code`."""

    status = 400
    code = "trigger_error"
    title = "The trigger cannot be used"
    pointer: str | None = None  # where in the request body, when it is about the body
    challenge: str | None = None  # a 401's WWW-Authenticate

    def problem(self) -> dict[str, str]:
        return {"pointer": self.pointer or "", "code": self.code, "detail": str(self)}


class TriggerNotFoundError(TriggerError):
    status, code, title = 404, "not_found", "No such trigger"

    def __init__(self, name: str) -> None:
        super().__init__(f"no trigger {name!r}")


class TriggerSignatureError(TriggerError):
    """The same answer for an unknown trigger and a bad signature: a sender without the secret
    learns nothing of which names exist."""

    status, code, title = 401, "bad_signature", "The event is not signed for this trigger"
    # The challenge names what to send instead of an API key.
    challenge = "StandardWebhooks"

    def __init__(self) -> None:
        super().__init__(
            "sign the body with the trigger's secret as Standard Webhooks prescribe (webhook-id, "
            "webhook-timestamp within 5 minutes, webhook-signature v1)"
        )


class TriggerDisabledError(TriggerError):
    status, code, title = 403, "trigger_disabled", "The trigger is disabled"

    def __init__(self, name: str) -> None:
        super().__init__(f"trigger {name!r} is disabled: nothing was run")


class TriggerOwnerError(TriggerError):
    status, code, title = 403, "owner_revoked", "The trigger's owner may no longer submit"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"the API key that saved trigger {name!r} was revoked: save it again with a live key"
        )


class TriggerChangedError(TriggerError):
    status, code, title = 409, "trigger_changed", "The trigger changed meanwhile"

    def __init__(self, name: str) -> None:
        super().__init__(f"trigger {name!r} was saved or deleted by another request: save again")


class TriggerSecretError(TriggerError):
    status, code, title = 422, "invalid_secret", "Invalid trigger secret"
    pointer = "/secret"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class BadEventIdError(TriggerError):
    code, title = "invalid_event_id", "Invalid event id"

    def __init__(self) -> None:
        super().__init__(f"webhook-id must be 1 to {_EVENT_ID_MAX} characters")


@dataclass(frozen=True, slots=True, kw_only=True)
class SaveInput:
    name: str
    template: dict[str, Any]
    enabled: bool = True
    secret: str | None = None  # None: keep the current one (a new trigger gets one made)
    rotate_secret: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Saved:
    trigger: TriggerRow
    plan: Plan
    created: bool
    new_version: bool
    secret: str | None  # only when this save made it: shown once


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """A verified event for a trigger: what to run, as whom, under which id."""

    trigger: TriggerRow
    event_id: str
    body: bytes
    owner: Principal


def fingerprint(secret: str) -> str:
    """What listings show of a secret: enough to tell two apart, nothing to sign with."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def new_secret() -> str:
    return _PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def check_secret(secret: str) -> None:
    """TriggerSecretError unless `secret` is a Standard Webhooks secret or an env reference."""
    if _ENV_SECRET.match(secret):
        return
    if not secret.startswith(_PREFIX):
        raise TriggerSecretError("a secret is 'whsec_' + base64 of 24 to 64 bytes, or ${env:NAME}")
    try:
        raw = base64.b64decode(secret[len(_PREFIX) :], validate=True)
    except binascii.Error:
        raise TriggerSecretError("the part after 'whsec_' is not base64") from None
    low, high = _SECRET_BYTES
    if not low <= len(raw) <= high:
        raise TriggerSecretError(f"the secret is {len(raw)} bytes; it must be {low} to {high}")


def _signing_key(row: TriggerRow, environ: Mapping[str, str]) -> str | None:
    """The secret to check with: stored, or read from the controller's environment."""
    ref = _ENV_SECRET.match(row.secret)
    if ref is None:
        return row.secret
    value = environ.get(ref.group(1))
    if not value:
        log.error("trigger %s: its secret ${env:%s} is not set here", row.name, ref.group(1))
    return value or None


class TriggerService:
    """Saves, lists and deletes triggers, and verifies the events sent to them."""

    def __init__(self, db: Database, keys: KeyService) -> None:
        self._db = db
        self._keys = keys

    async def save(
        self,
        data: SaveInput,
        *,
        who: Principal,
        catalog: ToolCatalog,
        authorize: Callable[[str], None],
    ) -> Saved:
        """Check the template (PlanInvalidError, every problem) and store it: a new version
        when it changed. `authorize` raises for a tool `who` may not submit (a run has the
        saver's rights). Another tenant's trigger answers TriggerNotFoundError."""
        plan = parse_template(data.template, catalog)
        for tool in sorted({s.tool for s in plan.steps}):
            authorize(tool)
        if data.secret is not None:
            check_secret(data.secret)
        now = datetime.now(UTC)
        sha = request_hash(data.template)
        async with self._db.transaction() as conn:
            old = await store.load(conn, data.name, lock=True)
            if old is not None and old.tenant != who.tenant:
                raise TriggerNotFoundError(data.name)
            new_version = old is None or old.sha256 != sha
            version = old.version if old is not None else 0
            if new_version:
                version = await store.last_version(conn, data.name) + 1
                stored = await store.add_version(
                    conn,
                    VersionRow(
                        name=data.name,
                        version=version,
                        template=data.template,
                        sha256=sha,
                        created_by=who.name,
                        created_at=now,
                    ),
                )
                if not stored:
                    raise TriggerChangedError(data.name)
            fresh = (old is None and data.secret is None) or data.rotate_secret
            made = new_secret() if fresh else None
            secret = made or data.secret or (old.secret if old is not None else "")
            head = {
                "name": data.name,
                "tenant": who.tenant,
                "version": version,
                "enabled": data.enabled,
                "secret": secret,
                "owner": who.name,
                "key_id": who.key_id,
                "created_at": now,
                "updated_at": now,
                "updated_by": who.name,
            }
            if not await store.save_head(conn, head, exists=old is not None):
                raise TriggerChangedError(data.name)
            await audit.record(
                conn,
                actor=who.name,
                tenant=who.tenant,
                action="trigger.save",
                target=f"trigger:{data.name}",
                data={
                    "version": version,
                    "new_version": new_version,
                    "enabled": data.enabled,
                    "secret_changed": old is None or secret != old.secret,
                    "tools": sorted({s.tool for s in plan.steps}),
                },
                now=now,
            )
            saved = await store.load(conn, data.name)
        assert saved is not None
        return Saved(
            trigger=saved, plan=plan, created=old is None, new_version=new_version, secret=made
        )

    async def get(self, name: str, *, tenant: str | None) -> TriggerRow:
        """A trigger (of `tenant`, unless None); TriggerNotFoundError otherwise."""
        async with self._db.transaction() as conn:
            row = await store.load(conn, name)
        if row is None or (tenant is not None and row.tenant != tenant):
            raise TriggerNotFoundError(name)
        return row

    async def version(self, name: str, version: int, *, tenant: str | None) -> VersionRow:
        """One stored version of a trigger's template (kept after the trigger changed)."""
        await self.get(name, tenant=tenant)
        async with self._db.transaction() as conn:
            row = await store.load_version(conn, name, version)
        if row is None:
            raise TriggerNotFoundError(f"{name} version {version}")
        return row

    async def list(self, *, tenant: str | None) -> list[TriggerRow]:
        async with self._db.transaction() as conn:
            return await store.list_heads(conn, tenant=tenant)

    async def delete(self, name: str, *, who: Principal, tenant: str | None) -> None:
        """Remove a trigger; its versions stay for the tasks it started."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            row = await store.load(conn, name, lock=True)
            if row is None or (tenant is not None and row.tenant != tenant):
                raise TriggerNotFoundError(name)
            await store.delete_head(conn, name)
            await audit.record(
                conn,
                actor=who.name,
                tenant=row.tenant,
                action="trigger.delete",
                target=f"trigger:{name}",
                data={"version": row.version},
                now=now,
            )

    async def open(
        self,
        name: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Event:
        """A signed event for `name`, checked: TriggerSignatureError for an unknown trigger or a
        bad signature (alike), TriggerDisabledError, TriggerOwnerError."""
        async with self._db.transaction() as conn:
            row = await store.load(conn, name)
        key = _signing_key(row, os.environ if environ is None else environ) if row else None
        if row is None or key is None:
            raise TriggerSignatureError
        wanted = {h: headers.get(h, "") for h in ("webhook-id", "webhook-timestamp")}
        wanted["webhook-signature"] = headers.get("webhook-signature", "")
        try:
            Webhook(key).verify(body, wanted, json_parse=False)
        # The library lets a malformed header or a body that is not UTF-8 raise as it comes.
        except (WebhookVerificationError, ValueError, UnicodeDecodeError):
            raise TriggerSignatureError from None
        if not row.enabled:
            raise TriggerDisabledError(name)
        event_id = wanted["webhook-id"]
        if not 0 < len(event_id) <= _EVENT_ID_MAX:
            raise BadEventIdError
        return Event(trigger=row, event_id=event_id, body=body, owner=await self._owner(row))

    async def _owner(self, row: TriggerRow) -> Principal:
        """Who a run submits as: the trigger's saver, with the roles its key has now."""
        if row.key_id == BOOTSTRAP_KEY_ID:
            roles: tuple[str, ...] = ("admin",)
        else:
            info = await self._keys.recent(row.key_id) if row.key_id else None
            if info is None or info.revoked_at is not None:
                raise TriggerOwnerError(row.name)
            roles = info.roles
        return Principal(name=row.owner, tenant=row.tenant, roles=roles, key_id=row.key_id)
