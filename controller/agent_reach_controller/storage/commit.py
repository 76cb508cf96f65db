"""A Postgres transaction's commit-time writes, sent as one statement with its COMMIT.

What a transaction buffers until it commits (its events, audit entries and wake-up notices, a new
task's rows) and the guards read with them (the catalogue revision, an Idempotency-Key's claim)
would each be a statement of its own: psycopg spends ~0.1 ms of CPU on each one it sends, more
than Postgres spends running it. `CommitStatement` joins them: each part becomes a WITH query of
one statement, so they run in one snapshot, all or nothing. A guard whose condition fails calls
`agent_reach_refuse` (migration 0019): the statement fails, nothing of it is written, the COMMIT
sent behind it in the same round trip rolls back, and the caller gets the guard's exception.

Parts are plain SQL with `%(name)s` placeholders. They must not depend on each other's writes (a
statement's WITH queries all see the snapshot it started with) nor write the same row twice, and
they run in no set order: rows whose ids must keep an order (events, audit entries) are one part.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection

from agent_reach_controller.domain.jsontext import compact

# What `agent_reach_refuse(reason)` raises.
REFUSED = "AR001"

_PARAM = re.compile(r"%\((\w+)\)s")
_REFUSAL_NAME = re.compile(r"[A-Za-z]\w*")


class CommitStatement:
    """The parts of one transaction's commit statement, in the order they were added."""

    def __init__(self) -> None:
        self._parts: list[tuple[str, Mapping[str, Any], str | None]] = []
        self._refusals: dict[str, Callable[[], Exception]] = {}
        # Parts whose value is handed back once the statement has run: (part, answer).
        self._readers: list[tuple[int, Callable[[Any], None]]] = []
        self._cursor: psycopg.AsyncCursor[Any] | None = None
        # Guards sent as statements of their own before this one, in the same round trip.
        self._ahead: list[tuple[str, Mapping[str, Any]]] = []

    def __bool__(self) -> bool:
        return bool(self._parts or self._ahead)

    @property
    def single(self) -> bool:
        """Whether it is one statement (no guard goes ahead of it)."""
        return not self._ahead

    def write(self, sql: str, params: Mapping[str, Any]) -> None:
        """Add an INSERT or UPDATE (Postgres runs it whether or not anything reads its rows).

        Writes of one text whose only parameter is `rows` (a JSON array, see `json_rows`) become
        one part with the rows of both, in order: a transaction that creates several tasks (a
        group commit) sends the same statement text whatever their number."""
        if set(params) == {"rows"}:
            for i, (known, earlier, value) in enumerate(self._parts):
                if known == sql and value is None and set(earlier) == {"rows"}:
                    self._parts[i] = (sql, {"rows": _join(earlier["rows"], params["rows"])}, None)
                    return
        self._parts.append((sql, params, None))

    def select(self, sql: str, params: Mapping[str, Any]) -> None:
        """Add a SELECT run for its effect (`pg_notify`): the statement counts its rows."""
        self._parts.append((sql, params, "count(*)"))

    def read(
        self, sql: str, params: Mapping[str, Any], *, value: str, answer: Callable[[Any], None]
    ) -> None:
        """Add a write whose RETURNING rows are wanted: `value`, an SQL aggregate over them
        (`json_agg(…)`), is passed to `answer` once the statement has run (see `answered`)."""
        self._readers.append((len(self._parts), answer))
        self._parts.append((sql, params, value))

    def expect(
        self, sql: str, params: Mapping[str, Any], *, holds: str, refusal: Callable[[], Exception]
    ) -> None:
        """Add a part whose rows must satisfy `holds`, an SQL condition over them as a group
        (`count(*) = 1`); if not, nothing of the transaction is written and committing it
        raises `refusal()`: an exception class, or a function that makes the exception (one
        with a name, not a lambda: the guard names it in SQL)."""
        check = self._check(holds, refusal)
        if (sql, params, check) not in self._parts:  # one guard asked for twice is checked once
            self._parts.append((sql, params, check))

    def ahead(
        self, sql: str, params: Mapping[str, Any], *, holds: str, refusal: Callable[[], Exception]
    ) -> None:
        """Add a guard as `expect` does, but sent as a statement of its own before this one (in
        the same round trip): for one that takes row locks, which must be held before any part
        of this statement writes (a statement's parts run in no set order)."""
        check = self._check(holds, refusal)
        self._ahead.append((f"SELECT {check} FROM ({sql.strip()}) AS guarded", params))

    def _check(self, holds: str, refusal: Callable[[], Exception]) -> str:
        name = getattr(refusal, "__name__", "")
        if not _REFUSAL_NAME.fullmatch(name):
            raise ValueError(f"refusal {name!r} cannot be named in SQL")
        self._refusals[name] = refusal
        return f"CASE WHEN {holds} THEN true ELSE agent_reach_refuse('{name}') END"

    async def send(self, pg: AsyncConnection[Any], *, prepare: bool | None) -> None:
        """Queue the guards that go ahead, then the statement (in the caller's pipeline)."""
        for sql, params in self._ahead:
            await pg.execute(sql, params, prepare=prepare)
        if not self._parts:
            return
        params = {
            f"p{i}_{name}": value
            for i, (_, part, _) in enumerate(self._parts)
            for name, value in part.items()
        }
        sql = compose(tuple((sql, value) for sql, _, value in self._parts))
        self._cursor = await pg.execute(sql, params, prepare=prepare)

    async def answered(self) -> None:
        """Hand each `read` part its value (the statement sent, its round trip done)."""
        if not self._readers or self._cursor is None:
            return
        row = await self._cursor.fetchone()
        assert row is not None
        # The final SELECT lists the values of the parts that have one, in part order.
        valued = [i for i, (_, _, value) in enumerate(self._parts) if value is not None]
        for part, answer in self._readers:
            answer(row[valued.index(part)])

    def refusal(self, error: psycopg.Error) -> Exception | None:
        """The guard's exception if `error` is one of this statement's refusals."""
        if error.sqlstate != REFUSED:
            return None
        refusal = self._refusals.get(error.diag.message_primary or "")
        return refusal() if refusal is not None else None


# psycopg finds a statement's placeholders afresh on every execute when its text is longer than
# this (it caches the parse of shorter ones only: `psycopg._queries.MAX_CACHED_STATEMENT_LENGTH`),
# a regex pass over the whole text each time. The claim's text was just over it.
PARSE_CACHED_CHARS = 4096


def tight(sql: str) -> str:
    """`sql` without its indentation and blank lines, to stay under PARSE_CACHED_CHARS. Lines stay
    lines, so a `--` comment still ends where it did (no literal of ours spans lines)."""
    return "\n".join(line.strip() for line in sql.splitlines() if line.strip())


@functools.lru_cache(maxsize=256)
def compose(parts: tuple[tuple[str, str | None], ...]) -> str:
    """`WITH q0 AS (…), q1 AS (…) SELECT (SELECT value FROM q1), …`: one text per sequence of
    parts, so each is prepared once. Every part's placeholders get its own prefix. A part with a
    value is read by the final SELECT, which is what makes a SELECT part run at all (Postgres runs
    a data-modifying WITH query whether or not it is read)."""
    queries, values = [], []
    for i, (sql, value) in enumerate(parts):
        renamed = _PARAM.sub(rf"%(p{i}_\1)s", sql.strip())
        queries.append(f"q{i} AS ({renamed})")
        if value is not None:
            values.append(f"(SELECT {value} FROM q{i})")
    return tight(f"WITH {', '.join(queries)} SELECT {', '.join(values) or 'NULL'}")


def json_rows(rows: Any) -> str:
    """Rows as one compact JSON text, for `jsonb_to_recordset` and its kin (timestamps in ISO
    8601 with their offset; see domain/jsontext.py)."""
    return compact(rows, default=_json_default).decode()


def _join(first: str, second: str) -> str:
    """Two JSON arrays as one, without parsing them."""
    if first == "[]":
        return second
    if second == "[]":
        return first
    return f"{first[:-1]},{second[1:]}"


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot store {type(value).__name__}")
