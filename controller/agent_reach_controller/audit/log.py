"""The append-only audit log: record in the caller's transaction, seal in the background, verify.

`record` only INSERTs an unsealed row (no `seq`, no hash), so audited writes never wait on each
other. `seal`, run by every replica's background loop, takes the sealer's advisory lock (only one
replica seals at a time; the others skip their turn), reads the chain head and chains the settled
unsealed rows in id order. The chain order is `seq`, the order rows were sealed in: a row whose
transaction committed late is simply sealed later. Triggers in the database refuse every DELETE
and every UPDATE except that sealing (migration 0010).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_reach_controller.audit.chain import (
    GENESIS,
    ChainChecker,
    Entry,
    Problem,
    canonical_json,
    content_hash,
)
from agent_reach_controller.storage import audit as store
from agent_reach_controller.storage.engine import Connection, Database

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
    conn: Connection,
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
    await store.insert_entry(
        conn,
        at=now,
        actor=actor,
        tenant=tenant,
        action=action,
        target=target,
        data=_checked_data(data),
    )


def _entry(seq: int, row: store.AuditRow | store.SealedRow) -> Entry:
    return Entry(
        seq=seq,
        at=row.at,
        actor=row.actor,
        tenant=row.tenant,
        action=row.action,
        target=row.target,
        data=row.data,
    )


async def _head(conn: Connection) -> tuple[int, str]:
    head = await store.chain_head(conn)
    if head is None:
        return 0, GENESIS
    seq, digest = head
    if digest is None:
        raise RuntimeError(f"audit chain head seq {seq} has no hash; run `reach audit verify`")
    return seq, digest


async def seal(
    db: Database, *, limit: int = 1000, settle_s: float = 2.0, now: datetime | None = None
) -> int:
    """Chain up to `limit` unsealed entries older than `settle_s`; returns how many.

    Returns 0 at once when another replica is sealing (Postgres advisory lock, not waited for).
    """
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=settle_s)
    async with db.transaction() as conn:
        if not await store.try_seal_lock(conn, SEAL_LOCK):
            return 0
        rows = await store.unsealed_entries(conn, cutoff=cutoff, limit=limit)
        if not rows:
            return 0
        seq, prev = await _head(conn)
        sealed: list[store.Seal] = []
        for row in rows:
            seq += 1
            digest = content_hash(prev, seq, row)
            sealed.append(store.Seal(id=row.id, seq=seq, prev_hash=prev, hash=digest))
            prev = digest
        count = await store.seal_entries(conn, sealed)
        if count != len(sealed):  # cannot happen under the lock: roll back, retry later
            raise RuntimeError(f"sealed {count} of {len(sealed)} audit rows; rolled back")
        return len(sealed)


async def prune(db: Database, *, before: datetime, limit: int = 10_000) -> tuple[int, int]:
    """Retention: remove up to `limit` of the oldest sealed entries made before `before`, behind
    a checkpoint (seq, hash) that verification starts from. One replica at a time (the sealer's
    lock); returns (checkpoint seq, entries removed), (0, 0) when nothing was due or another
    replica holds the lock."""
    async with db.transaction() as conn:
        if not await store.try_seal_lock(conn, SEAL_LOCK):
            return 0, 0
        return await store.prune_before(conn, before=before, limit=limit, now=datetime.now(UTC))


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    """What `verify` found: counts, the chain head, and the first problem (None: intact)."""

    checked: int  # sealed rows whose link and hash were checked before any problem
    start_seq: int  # the chain starts after this seq (a retention checkpoint; 0: from genesis)
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
            f"checked: {self.checked} of {self.sealed} sealed rows"
            + (f", from the checkpoint at seq {self.start_seq}" if self.start_seq else ""),
            f"head: seq {self.head_seq}, hash {self.head_hash}",
        ]
        if self.problem is None:
            out.append("OK: the chain is intact")
        else:
            out.append(f"PROBLEM: {self.problem}")
        return out


async def _stray_seal(conn: Connection) -> Problem | None:
    """An unsealed-looking row (no seq) that carries a hash: sealing was half done or forged."""
    stray = await store.first_stray_seal(conn)
    if stray is None:
        return None
    return Problem(
        kind="incomplete_seal", seq=0, id=stray, detail="no seq, but a hash or prev_hash"
    )


async def _walk(conn: Connection, checker: ChainChecker, anchor: tuple[int, str] | None) -> None:
    batch, after = 1000, None  # no lower bound at first: a seq of 0 or less is a problem too
    while checker.problem is None:
        rows = await store.sealed_after(conn, after=after, limit=batch)
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
    async with store.snapshot(db) as conn:
        # Retention removed the entries up to a checkpoint: the chain goes on from its hash.
        checkpoint = await store.latest_checkpoint(conn)
        if checkpoint is not None:
            checker.head_seq, checker.head_hash = checkpoint
        sealed = await store.count_sealed(conn)
        pending = await store.count_pending(conn)
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
        start_seq=checkpoint[0] if checkpoint is not None else 0,
        checked=checker.checked,
        sealed=sealed,
        pending=pending,
        head_seq=checker.head_seq,
        head_hash=checker.head_hash,
        problem=checker.problem,
    )
