"""The append-only audit log: record in the caller's transaction, seal in the background, verify.

`record` only INSERTs an unsealed row (no `seq`, no hash), so audited writes never wait on each
other. `seal`, run by every replica's background loop, takes the sealer's advisory lock (only one
replica seals at a time; the others skip their turn), reads the chain head and chains the settled
unsealed rows in id order. The chain order is `seq`, the order rows were sealed in: a row whose
transaction committed late is simply sealed later. Triggers in the database refuse every DELETE
and every UPDATE except that sealing (migration 0010).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.audit.chain import (
    GENESIS,
    ChainChecker,
    Entry,
    Problem,
    canonical_json,
    entry_hash,
)
from agent_reach_controller.db.engine import Database
from agent_reach_controller.db.schema import audit_log

SEAL_LOCK = "agent_reach:v1:audit:seal"
# An entry says who did what to which object; anything bigger belongs in the event log.
MAX_DATA_CHARS = 4096
# Keys whose values must never be stored (the log can never be cleaned up afterwards).
_SECRET_KEY = re.compile(
    r"(secret|password|passwd|passphrase|token|authorization|api[_-]?key|private[_-]?key"
    r"|credentials?|cookie)$",
    re.IGNORECASE,
)
_LIMITS = {"actor": 128, "tenant": 128, "action": 64, "target": 200}
_COLUMNS = (
    audit_log.c.id,
    audit_log.c.at,
    audit_log.c.actor,
    audit_log.c.tenant,
    audit_log.c.action,
    audit_log.c.target,
    audit_log.c.data,
)


def _refuse_secrets(value: Any, path: str) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if _SECRET_KEY.search(str(key)):
                raise ValueError(f"audit data must not carry secrets: {path}.{key}")
            _refuse_secrets(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _refuse_secrets(item, f"{path}[{i}]")


def _checked_data(data: Mapping[str, Any] | None) -> dict[str, Any]:
    value = dict(data or {})
    _refuse_secrets(value, "data")
    size = len(canonical_json(value))
    if size > MAX_DATA_CHARS:
        raise ValueError(f"audit data is {size} characters; the most is {MAX_DATA_CHARS}")
    return value


async def record(  # noqa: PLR0913  (the fields of one entry, all by keyword)
    conn: AsyncConnection,
    *,
    actor: str,
    tenant: str | None,
    action: str,
    target: str,
    data: Mapping[str, Any] | None = None,
    now: datetime,
) -> None:
    """Append one entry inside the caller's transaction (it commits or rolls back with it).

    `data` is small JSON that says what was done (ids, names, counts), never a secret: keys
    named like one (`token`, `password`, `api_key`, `…_secret`, …) are refused.
    """
    fields = {"actor": actor, "tenant": tenant, "action": action, "target": target}
    for name, value in fields.items():
        if value is not None and len(value) > _LIMITS[name]:
            raise ValueError(f"audit {name} is longer than {_LIMITS[name]} characters")
    if not actor or not action or not target:
        raise ValueError("an audit entry needs an actor, an action and a target")
    if now.tzinfo is None:
        raise ValueError("audit entries need a timezone-aware time")
    await conn.execute(sa.insert(audit_log).values(at=now, data=_checked_data(data), **fields))


def _entry(seq: int, row: Any) -> Entry:
    return Entry(
        seq=seq,
        at=row.at,
        actor=row.actor,
        tenant=row.tenant,
        action=row.action,
        target=row.target,
        data=row.data,
    )


async def _head(conn: AsyncConnection) -> tuple[int, str]:
    row = (
        await conn.execute(
            sa.select(audit_log.c.seq, audit_log.c.hash)
            .where(audit_log.c.seq.is_not(None))
            .order_by(audit_log.c.seq.desc())
            .limit(1)
        )
    ).first()
    if row is None:
        return 0, GENESIS
    if row.hash is None:
        raise RuntimeError(f"audit chain head seq {row.seq} has no hash; run `reach audit verify`")
    return int(row.seq), str(row.hash)


async def seal(
    db: Database, *, limit: int = 1000, settle_s: float = 2.0, now: datetime | None = None
) -> int:
    """Chain up to `limit` unsealed entries older than `settle_s`; returns how many.

    Returns 0 at once when another replica is sealing (Postgres advisory lock, not waited for).
    """
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=settle_s)
    async with db.transaction() as conn:
        if db.is_postgres:
            locked = await conn.scalar(
                sa.text("SELECT pg_try_advisory_xact_lock(hashtext(:key))"), {"key": SEAL_LOCK}
            )
            if not locked:
                return 0
        rows = (
            await conn.execute(
                sa.select(*_COLUMNS)
                .where(audit_log.c.hash.is_(None), audit_log.c.at <= cutoff)
                .order_by(audit_log.c.id)
                .limit(limit)
            )
        ).all()
        if not rows:
            return 0
        seq, prev = await _head(conn)
        sealed: list[dict[str, Any]] = []
        for row in rows:
            seq += 1
            digest = entry_hash(prev, _entry(seq, row))
            sealed.append({"b_id": row.id, "b_seq": seq, "b_prev": prev, "b_hash": digest})
            prev = digest
        result = await conn.execute(
            sa.update(audit_log)
            .where(audit_log.c.id == sa.bindparam("b_id"), audit_log.c.hash.is_(None))
            .values(
                seq=sa.bindparam("b_seq"),
                prev_hash=sa.bindparam("b_prev"),
                hash=sa.bindparam("b_hash"),
            ),
            sealed,
        )
        if result.rowcount != len(sealed):  # cannot happen under the lock: roll back, retry later
            raise RuntimeError(f"sealed {result.rowcount} of {len(sealed)} audit rows; rolled back")
        return len(sealed)


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    """What `verify` found: counts, the chain head, and the first problem (None: intact)."""

    checked: int  # sealed rows whose link and hash were checked before any problem
    sealed: int
    pending: int  # rows not sealed yet
    head_seq: int
    head_hash: str
    problem: Problem | None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def lines(self) -> list[str]:
        out = [
            f"audit log: {self.sealed} sealed, {self.pending} pending (not sealed yet)",
            f"checked: {self.checked} of {self.sealed} sealed rows",
            f"head: seq {self.head_seq}, hash {self.head_hash}",
        ]
        if self.problem is None:
            out.append("OK: the chain is intact")
        else:
            out.append(f"PROBLEM: {self.problem}")
        return out


@contextlib.asynccontextmanager
async def _snapshot(db: Database) -> AsyncIterator[AsyncConnection]:
    """One consistent, read-only view of the table (SQLite transactions already are one)."""
    if not db.is_postgres:
        async with db.transaction() as conn:
            yield conn
        return
    async with db.engine.connect() as plain:
        conn = await plain.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
        async with conn.begin():
            yield conn


async def _stray_seal(conn: AsyncConnection) -> Problem | None:
    """An unsealed-looking row (no seq) that carries a hash: sealing was half done or forged."""
    row = (
        await conn.execute(
            sa.select(audit_log.c.id)
            .where(
                audit_log.c.seq.is_(None),
                sa.or_(audit_log.c.hash.is_not(None), audit_log.c.prev_hash.is_not(None)),
            )
            .order_by(audit_log.c.id)
            .limit(1)
        )
    ).first()
    if row is None:
        return None
    return Problem(
        kind="incomplete_seal", seq=0, id=int(row.id), detail="no seq, but a hash or prev_hash"
    )


async def _walk(
    conn: AsyncConnection, checker: ChainChecker, anchor: tuple[int, str] | None
) -> None:
    batch, after = 1000, None  # no lower bound at first: a seq of 0 or less is a problem too
    while checker.problem is None:
        rows = (
            await conn.execute(
                sa.select(*_COLUMNS, audit_log.c.seq, audit_log.c.prev_hash, audit_log.c.hash)
                .where(audit_log.c.seq.is_not(None) if after is None else audit_log.c.seq > after)
                .order_by(audit_log.c.seq)
                .limit(batch)
            )
        ).all()
        for row in rows:
            entry = _entry(int(row.seq), row)
            if checker.feed(id=row.id, entry=entry, prev_hash=row.prev_hash, hash=row.hash):
                return
            if anchor is not None and entry.seq == anchor[0] and row.hash != anchor[1]:
                checker.problem = Problem(
                    kind="anchor_mismatch",
                    seq=entry.seq,
                    id=int(row.id),
                    detail=f"hash is {row.hash}, the anchor says {anchor[1]}",
                )
                return
        if len(rows) < batch:
            return
        after = int(rows[-1].seq)


async def verify(db: Database, *, anchor: tuple[int, str] | None = None) -> VerifyReport:
    """Walk the sealed chain in seq order and report the first problem.

    `anchor` is a (seq, hash) pair recorded earlier (say, from a previous report's head): the
    chain must still reach that seq with that hash, which catches a truncated or rewritten tail.
    """
    checker = ChainChecker()
    async with _snapshot(db) as conn:
        sealed = int(
            await conn.scalar(sa.select(sa.func.count()).where(audit_log.c.seq.is_not(None))) or 0
        )
        pending = int(
            await conn.scalar(sa.select(sa.func.count()).where(audit_log.c.seq.is_(None))) or 0
        )
        await _walk(conn, checker, anchor)
        if checker.problem is None and anchor is not None and checker.head_seq < anchor[0]:
            checker.problem = Problem(
                kind="anchor_missing",
                seq=anchor[0],
                id=None,
                detail=f"the chain ends at seq {checker.head_seq}: sealed entries were removed",
            )
        if checker.problem is None:
            checker.problem = await _stray_seal(conn)
    return VerifyReport(
        checked=checker.checked,
        sealed=sealed,
        pending=pending,
        head_seq=checker.head_seq,
        head_hash=checker.head_hash,
        problem=checker.problem,
    )
