"""Long-term memory: entries per tenant and subject, written by callers and by runs, searched,
recalled into a run's prompt, and deleted for real.

The rules are pure (decide/memory.py); the SQL is storage/memory.py. Every write and delete is
audited in the same transaction, with HMACs in place of the subject and the text: the audit log
cannot be cleaned afterwards, so it never holds what a delete must remove. A delete also scrubs
the copies a subject's runs and tasks made of the text (the conversation, the steps and events
of its rounds and of its callers' own tasks, the answer), replacing them with "[forgotten]".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_reach.ids import new_task_id
from agent_reach_controller import audit
from agent_reach_controller.decide import memory as rules
from agent_reach_controller.decide.memory import FORGOTTEN, Problem, Recalled
from agent_reach_controller.domain.records import MemoryOrigin, MemoryRow
from agent_reach_controller.domain.subjects import subject_problem
from agent_reach_controller.storage import memory as store
from agent_reach_controller.storage.engine import Connection, Database
from agent_reach_controller.tools.agents import MODEL_CONNECTOR
from agent_reach_controller.tools.memory import MEMORY_CONNECTOR

# Field names of a stored entry a caller may change with a patch.
PATCHABLE = frozenset({"text", "value", "pinned", "confidence", "expires_at", "origin"})
# Steps whose outputs are not a tool's: the model's own calls, and memory's internal steps.
INTERNAL_CONNECTORS = (MODEL_CONNECTOR, MEMORY_CONNECTOR)
# The shortest text the scrub replaces: shorter strings ("yes", "NY") occur by chance.
_MIN_SCRUB = 4


class MemoryInputError(ValueError):
    """An entry that cannot be stored: each problem with its JSON pointer."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(f"{p.pointer}: {p.detail}" for p in problems))
        self.problems = list(problems)


class MemoryNotFoundError(LookupError):
    def __init__(self, memory_id: str) -> None:
        super().__init__(f"memory {memory_id} not found")
        self.memory_id = memory_id


class MemoryQuotaError(Exception):
    """The subject holds as many entries as its quota allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the subject already holds {limit} memories, its quota")
        self.limit = limit


class MemoryConflictError(Exception):
    """The entry changed since the version the caller read (If-Match)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """What a writer says an entry is."""

    type: str
    key: str
    text: str
    value: Any = None
    pinned: bool = False
    confidence: float = 1.0
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Writer:
    """Who writes: a caller (origin user) or a run (origin model or receipt), and from where."""

    tenant: str
    actor: str  # a principal, or "run:<id>"
    origin: MemoryOrigin = MemoryOrigin.USER
    source: dict[str, Any] | None = None  # {run, task, step, receipt}

    @property
    def by_model(self) -> bool:
        return self.origin is not MemoryOrigin.USER


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryLimits:
    per_subject: int = 1000  # entries a subject may hold
    retention: timedelta | None = None  # entries not updated for this long are deleted


@dataclass(slots=True)
class Written:
    entry: MemoryRow
    created: bool
    changed: bool = True  # False: the same content was written again (nothing stored)


@dataclass(frozen=True, slots=True)
class Provenance:
    """What a run had seen when it wrote: its user's words, and whether a tool's output."""

    user_said: str
    read_receipts: bool

    def origin(self, entry: Entry) -> MemoryOrigin:
        return rules.origin_of(
            entry.text, entry.value, user_said=self.user_said, read_receipts=self.read_receipts
        )


@dataclass(slots=True)
class _Key:
    configured: bytes | None
    stored: bytes | None = field(default=None)


class MemoryService:
    """Memory's use cases. The `*_in` methods run inside a transaction someone else holds (a
    run's unit of work); the others open their own."""

    def __init__(self, *, db: Database, limits: MemoryLimits, key: bytes | None = None) -> None:
        self._db = db
        self.limits = limits
        self._key = _Key(configured=key)

    async def _hmac_key(self, conn: Connection) -> bytes:
        if self._key.configured is not None:
            return self._key.configured
        if self._key.stored is None:
            self._key.stored = await store.hmac_key(conn)
        return self._key.stored

    async def subject_mark(self, conn: Connection, tenant: str, subject: str) -> str:
        """How the audit log names a subject: an HMAC, never the subject."""
        return rules.mark(await self._hmac_key(conn), "subject", tenant, subject)

    # -- callers ----------------------------------------------------------------------------

    async def put(self, writer: Writer, subject: str, entry: Entry) -> Written:
        """Store an entry; the same (subject, type, key) updates it (its history is audited)."""
        async with self._db.transaction() as conn:
            return await self.write_in(conn, writer, subject, entry, now=_now())

    async def get(self, tenant: str, memory_id: str) -> MemoryRow:
        async with self._db.transaction() as conn:
            found = await store.load(conn, tenant, memory_id)
        if found is None:
            raise MemoryNotFoundError(memory_id)
        return found

    async def patch(
        self,
        writer: Writer,
        memory_id: str,
        changes: Mapping[str, Any],
        *,
        if_version: int | None = None,
    ) -> MemoryRow:
        """Change some fields of an entry (`PATCHABLE`); a caller may confirm a receipt's entry
        by setting its origin to user."""
        unknown = sorted(set(changes) - PATCHABLE)
        if unknown:
            raise MemoryInputError(
                [Problem(f"/{n}", "this field cannot be changed") for n in unknown]
            )
        if "origin" in changes and changes["origin"] != MemoryOrigin.USER:
            raise MemoryInputError([Problem("/origin", "a caller may only set origin to 'user'")])
        now = _now()
        async with self._db.transaction() as conn:
            found = await store.load(conn, writer.tenant, memory_id)
            if found is None:
                raise MemoryNotFoundError(memory_id)
            if if_version is not None and found.version != if_version:
                raise MemoryConflictError(memory_id)
            text = changes.get("text", found.text)
            value = changes.get("value", found.value)
            problems = rules.entry_problems(
                type_=found.type, key=found.key, text=text, value=value, by_model=False
            )
            if problems:
                raise MemoryInputError(problems)
            key = await self._hmac_key(conn)
            values = dict(changes) | {
                "mark": rules.mark(key, found.type, found.key, text, value),
                "written_by": writer.actor,
            }
            if {"text", "value"} & set(changes):
                values |= {"embedding": None, "embedding_model": None}  # stale now
            if not await store.update(conn, found, values, now=now):
                raise MemoryConflictError(memory_id)
            await self._audit(
                conn, writer.actor, found, "memory.update", now=now, mark=values["mark"]
            )
            if {"text", "value"} & set(changes):
                await self._scrub(conn, writer.tenant, found.subject, [found], now=now)
            updated = await store.load(conn, writer.tenant, memory_id)
        assert updated is not None
        return updated

    async def entries(
        self, tenant: str, subject: str, *, types: Sequence[str] = (), limit: int = 100
    ) -> list[MemoryRow]:
        async with self._db.transaction() as conn:
            return await store.list_entries(conn, tenant, subject, types=types, limit=limit)

    async def subjects(
        self, tenant: str, *, limit: int = 100, after: str | None = None
    ) -> list[tuple[str, int, datetime]]:
        async with self._db.transaction() as conn:
            return await store.list_subjects(conn, tenant, limit=limit, after=after)

    async def search(
        self, tenant: str, subject: str, query: str, *, limit: int = 10
    ) -> list[tuple[MemoryRow, float]]:
        async with self._db.transaction() as conn:
            return await self.search_in(conn, tenant, subject, query, limit=limit)

    async def forget(self, tenant: str, actor: str, memory_id: str) -> MemoryRow:
        """Delete an entry for real: its row, its index entries, and the copies runs made."""
        now = _now()
        async with self._db.transaction() as conn:
            found = await store.load(conn, tenant, memory_id)
            if found is None:
                raise MemoryNotFoundError(memory_id)
            await self.forget_in(conn, actor, [found], now=now)
        return found

    async def forget_subject(self, tenant: str, actor: str, subject: str) -> int:
        """Delete every entry of a subject; returns how many there were."""
        now = _now()
        async with self._db.transaction() as conn:
            found = await store.list_entries(conn, tenant, subject, limit=None)
            await self.forget_in(conn, actor, found, now=now)
            await audit.record(
                conn,
                actor=actor,
                tenant=tenant,
                action="memory.forget_subject",
                target=f"subject:{await self.subject_mark(conn, tenant, subject)}",
                data={"entries": len(found)},
                now=now,
            )
        return len(found)

    async def prune(self, *, now: datetime | None = None, batch: int = 500) -> int:
        """Delete expired entries, and those past memory's own retention (a background sweep);
        each is forgotten as a caller's delete is. Returns how many went."""
        now = now or _now()
        gone = 0
        async with self._db.transaction() as conn:
            found = await store.expired(conn, now, limit=batch)
            if self.limits.retention is not None:
                found += await store.stale(conn, now - self.limits.retention, limit=batch)
            unique = list({e.memory_id: e for e in found}.values())
            await self.forget_in(conn, "retention", unique, now=now)
            gone += len(unique)
        return gone

    # -- inside someone else's transaction ----------------------------------------------------

    async def write_in(
        self, conn: Connection, writer: Writer, subject: str, entry: Entry, *, now: datetime
    ) -> Written:
        """Validate and store an entry in `conn`'s transaction (MemoryInputError,
        MemoryQuotaError). A model may not write a reserved type, nor overwrite an entry a
        caller wrote."""
        problems = rules.entry_problems(
            type_=entry.type,
            key=entry.key,
            text=entry.text,
            value=entry.value,
            by_model=writer.by_model,
        )
        subject_wrong = subject_problem(subject)
        if subject_wrong is not None:
            problems.insert(0, Problem("/subject", subject_wrong))
        if problems:
            raise MemoryInputError(problems)
        key = await self._hmac_key(conn)
        mark = rules.mark(key, entry.type, entry.key, entry.text, entry.value)
        found = await store.load_entry(
            conn, writer.tenant, subject, entry.type, entry.key, lock=True
        )
        if found is not None:
            return await self._overwrite(conn, writer, found, entry, mark, now=now)
        if await store.count(conn, writer.tenant, subject) >= self.limits.per_subject:
            raise MemoryQuotaError(self.limits.per_subject)
        row = {
            "memory_id": new_task_id(),
            "tenant": writer.tenant,
            "subject": subject,
            "type": entry.type,
            "key": entry.key,
            "text": entry.text,
            "value": entry.value,
            "origin": writer.origin.value,
            "confidence": entry.confidence,
            "pinned": entry.pinned,
            "source": writer.source,
            "written_by": writer.actor,
            "mark": mark,
            "version": 1,
            "created_at": now,
            "updated_at": now,
            "expires_at": entry.expires_at,
        }
        if not await store.insert(conn, row):  # a concurrent writer stored it first
            raced = await store.load_entry(
                conn, writer.tenant, subject, entry.type, entry.key, lock=True
            )
            if raced is None:  # pragma: no cover - it was inserted and deleted meanwhile
                raise MemoryConflictError(entry.key)
            return await self._overwrite(conn, writer, raced, entry, mark, now=now)
        stored = MemoryRow.from_mapping(row | {"embedding": None, "embedding_model": None})
        await self._audit(conn, writer.actor, stored, "memory.write", now=now)
        return Written(stored, created=True)

    async def _overwrite(
        self,
        conn: Connection,
        writer: Writer,
        found: MemoryRow,
        entry: Entry,
        mark: str,
        *,
        now: datetime,
    ) -> Written:
        if writer.by_model and found.origin is MemoryOrigin.USER:
            raise MemoryInputError(
                [Problem("/key", "a caller wrote this entry: a run may not overwrite it")]
            )
        if found.mark == mark and found.pinned == entry.pinned:
            return Written(found, created=False, changed=False)
        values = {
            "text": entry.text,
            "value": entry.value,
            "origin": writer.origin.value,
            "confidence": entry.confidence,
            "pinned": entry.pinned,
            "source": writer.source,
            "written_by": writer.actor,
            "mark": mark,
            "expires_at": entry.expires_at,
            "embedding": None,
            "embedding_model": None,
        }
        if not await store.update(conn, found, values, now=now):
            raise MemoryConflictError(found.memory_id)
        await self._audit(conn, writer.actor, found, "memory.update", now=now, mark=mark)
        if found.mark != mark:
            await self._scrub(conn, found.tenant, found.subject, [found], now=now)
        updated = await store.load(conn, found.tenant, found.memory_id)
        assert updated is not None
        return Written(updated, created=False)

    async def search_in(
        self, conn: Connection, tenant: str, subject: str, query: str, *, limit: int
    ) -> list[tuple[MemoryRow, float]]:
        """A subject's entries that match `query`'s words, best first (full text)."""
        return await store.search_text(conn, tenant, subject, rules.terms(query), limit=limit)

    async def recall_in(
        self,
        conn: Connection,
        tenant: str,
        subject: str,
        query: str,
        *,
        top_k: int,
        token_cap: int,
    ) -> list[Recalled]:
        """What a run starting with `query` is reminded of: pinned entries and the best
        matches, never an entry a tool's output planted, under the token cap."""
        ranked = await self.search_in(conn, tenant, subject, query, limit=top_k * 3)
        pinned = await store.list_entries(
            conn, tenant, subject, limit=self.limits.per_subject, pinned=True
        )
        return rules.recall(ranked, pinned, top_k=top_k, token_cap=token_cap)

    async def forget_in(
        self, conn: Connection, actor: str, entries: Sequence[MemoryRow], *, now: datetime
    ) -> None:
        """Delete these entries in `conn`'s transaction, scrub runs' copies, audit each."""
        if not entries:
            return
        await store.delete(conn, [e.memory_id for e in entries])
        by_subject: dict[tuple[str, str], list[MemoryRow]] = {}
        for entry in entries:
            by_subject.setdefault((entry.tenant, entry.subject), []).append(entry)
            await self._audit(conn, actor, entry, "memory.forget", now=now)
        for (tenant, subject), gone in by_subject.items():
            await self._scrub(conn, tenant, subject, gone, now=now)

    async def provenance(
        self, conn: Connection, run_id: str, *, current_task: str | None
    ) -> Provenance:
        """What a run had seen when it wrote a memory in `current_task`'s round: what its user
        said, and whether it had read any tool's output (see `rules.origin_of`)."""
        said = " ".join(rules.strings_in(await store.user_messages(conn, run_id), keys=False))
        read = await store.receipts_read(
            conn, run_id, before_task=current_task, internal=INTERNAL_CONNECTORS
        )
        return Provenance(user_said=said, read_receipts=read)

    # -- the audit and the scrub ----------------------------------------------------------------

    async def _audit(
        self,
        conn: Connection,
        actor: str,
        entry: MemoryRow,
        action: str,
        *,
        now: datetime,
        mark: str | None = None,
    ) -> None:
        await audit.record(
            conn,
            actor=actor,
            tenant=entry.tenant,
            action=action,
            target=f"memory:{entry.memory_id}",
            data={
                "subject": await self.subject_mark(conn, entry.tenant, entry.subject),
                "type": entry.type,
                "mark": mark or entry.mark,
                "origin": entry.origin.value,
            },
            now=now,
        )

    async def _scrub(
        self,
        conn: Connection,
        tenant: str,
        subject: str,
        gone: Sequence[MemoryRow],
        *,
        now: datetime,
    ) -> None:
        """Replace the texts of `gone` wherever this subject's runs and tasks copied them."""
        needles = _needles(gone)
        if not needles:
            return
        run_ids = await store.subject_runs(conn, tenant, subject)
        # The subject's own tasks, and its runs' rounds (those stored before rounds carried
        # their run's subject too).
        task_ids = sorted(
            set(await store.run_tasks(conn, run_ids))
            | set(await store.subject_tasks(conn, tenant, subject))
        )
        for table, key, columns in await store.copies(conn, run_ids, task_ids):
            changed = {}
            for name, value in columns.items():
                cleaned = _scrubbed(value, needles)
                if cleaned is not value:
                    changed[name] = cleaned
            if changed:
                await store.rewrite(conn, table, key, changed)

    # -- embeddings (asked of the profile's endpoint by an executor step; stored and compared here)

    async def set_embedding(
        self,
        conn: Connection,
        memory_id: str,
        model: str,
        vector: Sequence[float],
        *,
        mark: str | None = None,
    ) -> bool:
        """Store an entry's embedding by `model` in `conn`'s transaction; False when the entry
        is gone or, given the `mark` it had when its text was sent, has changed since (a stale
        vector is never stored). MemoryInputError for a vector that is not 1-8192 finite
        numbers. A later write of the entry's text or value clears it."""
        problems = rules.vector_problems(model, vector)
        if problems:
            raise MemoryInputError(problems)
        return await store.set_embedding(conn, memory_id, model, rules.pack(vector), mark=mark)

    async def search_vector(
        self,
        conn: Connection,
        tenant: str,
        subject: str,
        model: str,
        vector: Sequence[float],
        limit: int = 10,
    ) -> list[tuple[MemoryRow, float]]:
        """A subject's entries embedded by `model`, nearest `vector` first, with their cosine.

        Computed here, in Python, over the subject's vectors: Debian 12's Postgres has no
        pgvector package and this Python's sqlite3 cannot load extensions (sqlite-vec), so the
        portable path is the one tested on both backends. A subject holds at most its quota of
        entries, and no more than that many vectors are read: 10-20 ms for a thousand of 256
        floats on two busy cores (`make bench-memory`), exact where an index would approximate."""
        if rules.vector_problems(model, vector):
            return []
        candidates = await store.embedded(
            conn, tenant, subject, model, limit=self.limits.per_subject
        )
        ranked = rules.nearest(vector, candidates, limit=limit)
        rows = await store.load_many(conn, tenant, [memory_id for memory_id, _ in ranked])
        return [(rows[i], score) for i, score in ranked if i in rows]


def _needles(gone: Sequence[MemoryRow]) -> list[str]:
    """The strings a delete removes: each text and each string of each value, as written and
    as JSON writes them inside a string (escaped), longest first."""
    found: set[str] = set()
    for entry in gone:
        texts = (
            [entry.text, *rules.strings_in(entry.value)]
            if entry.value is not None
            else [entry.text]
        )
        for text in texts:
            if len(text) < _MIN_SCRUB:
                continue
            found.add(text)
            found.add(json.dumps(text)[1:-1])
            found.add(json.dumps(text, ensure_ascii=False)[1:-1])
    return sorted(found, key=len, reverse=True)


def _scrubbed(value: Any, needles: Sequence[str]) -> Any:
    """`value` with every needle replaced (the same object when nothing changed)."""
    if isinstance(value, str):
        out = value
        for needle in needles:
            if needle in out:
                out = out.replace(needle, FORGOTTEN)
        return out if out != value else value
    if isinstance(value, dict):
        items = {k: _scrubbed(v, needles) for k, v in value.items()}
        return items if any(items[k] is not value[k] for k in value) else value
    if isinstance(value, list):
        listed = [_scrubbed(v, needles) for v in value]
        return listed if any(a is not b for a, b in zip(listed, value, strict=True)) else value
    return value


def _now() -> datetime:
    return datetime.now(UTC)
