"""Engines for Postgres (psycopg 3) and SQLite (aiosqlite) behind one transaction interface."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.pq import TransactionStatus
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, PendingRollbackError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from agent_reach_controller.storage.commit import CommitStatement

# The handle every storage function takes: one connection inside one transaction. Layers above
# storage name it by this alias and never import SQLAlchemy themselves.
Connection = AsyncConnection

# Keys under this prefix in `conn.info` live for one transaction only.
TX_STATE_PREFIX = "agent_reach.tx."
_BEFORE_COMMIT = f"{TX_STATE_PREFIX}before_commit"
_AFTER_COMMIT = f"{TX_STATE_PREFIX}after_commit"
_ON_COMMIT = f"{TX_STATE_PREFIX}on_commit"
_UNDONE = f"{TX_STATE_PREFIX}undone"
_STATEMENT = f"{TX_STATE_PREFIX}statement"
_QUEUED = f"{TX_STATE_PREFIX}queued"
_LOCKS_FIRST = f"{TX_STATE_PREFIX}locks_first"
# Kept for the life of the pooled connection (its `info` is per DBAPI connection).
_DRIVER = "agent_reach.driver"
CommitHook = Callable[[AsyncConnection], Awaitable[None]]
# Told the cursor of a queued statement once it is answered; raising fails the transaction.
Answered = Callable[[psycopg.AsyncCursor[Any]], None]
AfterCommit = Callable[[], Awaitable[None]]
# Told about every transaction of a Database just before it commits (it may register hooks).
CommitObserver = Callable[[AsyncConnection], Awaitable[None]]


def before_commit(conn: AsyncConnection, hook: CommitHook) -> None:
    """Run `hook(conn)` just before this transaction commits (not if it rolls back).

    On Postgres the hooks add their writes and guards to one statement (`commit_statement`),
    sent with the COMMIT; on SQLite they run their statements at once.
    """
    conn.info.setdefault(_BEFORE_COMMIT, []).append(hook)


def queue_statement(
    conn: AsyncConnection, sql: str, params: Mapping[str, Any], then: Answered
) -> None:
    """Send a statement with this Postgres transaction's next round trip, ahead of what that
    round trip carries; `then(cursor)` is called once it is answered. For a write whose outcome
    is only checked (a session's heartbeat ahead of a report's locks): it costs no round trip
    of its own. Whatever is still queued at commit goes, and is checked, before the commit."""
    queued: list[tuple[str, Mapping[str, Any], Answered]] = conn.info.setdefault(_QUEUED, [])
    queued.append((sql, params, then))


def nothing_before_commit(conn: AsyncConnection, refusal: Callable[[], Exception]) -> None:
    """Refuse (raise `refusal()`) any round trip of this Postgres transaction before its
    commit's: for one whose commit takes its row locks ahead of its writes (`CommitStatement.
    ahead`), where a write sent earlier would take a lock out of that order."""
    conn.info[_LOCKS_FIRST] = refusal


def _nothing_yet(conn: Any, *_: Any) -> None:
    """`nothing_before_commit` for statements sent through SQLAlchemy."""
    refusal: Callable[[], Exception] | None = conn.info.get(_LOCKS_FIRST)
    if refusal is not None:
        raise refusal()


@contextlib.asynccontextmanager
async def round_trip(
    conn: AsyncConnection, *, pipeline: bool = False
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The psycopg connection of a Postgres transaction, for statements sent together: in one
    pipeline (one round trip) with the queued statements and, if the transaction has sent
    nothing yet, the BEGIN psycopg would otherwise send in a round trip of its own. Without
    either, and unless `pipeline`, statements go as they are executed."""
    refusal: Callable[[], Exception] | None = conn.info.get(_LOCKS_FIRST)
    if refusal is not None:
        raise refusal()
    pg = await driver(conn)
    queued: list[tuple[str, Mapping[str, Any], Answered]] = conn.info.pop(_QUEUED, [])
    if not (queued or pipeline or pg.info.transaction_status is TransactionStatus.IDLE):
        yield pg
        return
    async with pg.pipeline():
        sent = [
            (await pg.execute(sql, params, prepare=prepare(pg)), then)
            for sql, params, then in queued
        ]
        yield pg
    for cursor, then in sent:
        then(cursor)


@contextlib.asynccontextmanager
async def closing_statement(
    conn: AsyncConnection, *, single: bool = True
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The psycopg connection for a Postgres transaction's last statement: the block sends it
    (one `execute`, unless not `single`), and the transaction ends with it, committed.

    When the transaction has sent nothing and nothing is queued, the statement goes alone in
    autocommit mode: Postgres runs a single statement as a transaction of its own, all or
    nothing, with no BEGIN and no COMMIT (two statements fewer; through psycopg a unit of one
    statement costs 133 µs of client CPU this way against 390 µs with both). Otherwise it goes
    in one pipeline with what is queued, the BEGIN if due, and the COMMIT.
    """
    pg = await driver(conn)
    alone = (
        single
        and pg.info.transaction_status is TransactionStatus.IDLE
        and not conn.info.get(_QUEUED)
        and not conn.in_transaction()
    )
    if not alone:
        async with round_trip(conn, pipeline=True) as pg:
            yield pg
            await pg.execute("COMMIT", prepare=False)
        return
    await pg.set_autocommit(True)
    try:
        yield pg
    finally:
        # A connection left in autocommit (its state unknown after a failure) is not kept:
        # see Database._release.
        with contextlib.suppress(psycopg.Error):
            await pg.set_autocommit(False)


def prepare(pg: psycopg.AsyncConnection[Any]) -> bool | None:
    """Prepare at once, unless the connection prepares nothing (`Database(prepare=False)`)."""
    return None if pg.prepare_threshold is None else True


def commit_statement(conn: AsyncConnection) -> CommitStatement:
    """The statement a Postgres transaction's commit hooks add their writes and guards to
    (only while they run)."""
    statement: CommitStatement = conn.info[_STATEMENT]
    return statement


def after_commit(conn: AsyncConnection, done: Callable[[], None]) -> None:
    """Call `done()` once this transaction has committed (never if it rolls back or the commit
    fails): for what must count only what really happened, such as metrics."""
    conn.info.setdefault(_AFTER_COMMIT, []).append(done)


def undone(conn: AsyncConnection, then: Callable[[], None]) -> None:
    """Call `then()` if this transaction does not commit (it raised, or its commit failed,
    whether or not the COMMIT may have landed): for what was promised on its outcome, such as a
    step offered to a waiting poller."""
    conn.info.setdefault(_UNDONE, []).append(then)


def on_commit(conn: AsyncConnection, then: AfterCommit) -> None:
    """Await `then()` once this transaction has committed (never after a rollback), outside
    SQLite's writer lock: for what tells the world about the change, such as wake-ups."""
    conn.info.setdefault(_ON_COMMIT, []).append(then)


async def _commit(conn: AsyncConnection) -> None:
    """Commit what a Postgres transaction sent (nothing if its COMMIT already went)."""
    if conn.in_transaction():  # a statement went through SQLAlchemy: it commits them all
        await conn.commit()
        return
    pg = await driver(conn)
    if pg.info.transaction_status is not TransactionStatus.IDLE:
        await pg.commit()


async def _rollback(conn: AsyncConnection) -> None:
    if conn.in_transaction():
        await conn.rollback()
        return
    pg = await driver(conn)
    if pg.info.transaction_status is not TransactionStatus.IDLE:
        await pg.rollback()


def normalize_url(url: str) -> str:
    """Map user-facing URLs (`postgresql://`, `sqlite:///x.db`) to the async drivers we ship."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend == "sqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    else:
        raise ValueError(f"unsupported database {backend!r}: use postgresql:// or sqlite://")
    return parsed.render_as_string(hide_password=False)


def sync_url(url: str) -> str:
    """The same database through a synchronous driver (for Alembic)."""
    parsed = make_url(normalize_url(url))
    driver = "postgresql+psycopg" if parsed.get_backend_name() == "postgresql" else "sqlite"
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    # A deleted row's bytes are overwritten, not left in free pages (a forgotten memory).
    cursor.execute("PRAGMA secure_delete=ON")
    cursor.close()


# What a lost or unreachable database raises: callers answer "unavailable, retry", never 500.
STORAGE_DOWN: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    PendingRollbackError,
    ConnectionError,
    # The hot path's statements go through psycopg directly (storage/hot.py runs them).
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


async def driver(conn: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under a Postgres transaction (for `storage/hot.py`)."""
    cached: psycopg.AsyncConnection[Any] | None = conn.info.get(_DRIVER)
    if cached is not None:
        return cached
    raw = await conn.get_raw_connection()
    found: psycopg.AsyncConnection[Any] = raw.driver_connection  # type: ignore[assignment]
    conn.info[_DRIVER] = found
    return found


_LOST: tuple[type[Exception], ...] = (*STORAGE_DOWN, OSError)

# What a failed ping raises: the driver refused, or the socket did.
DATABASE_ERRORS: tuple[type[Exception], ...] = (OSError, DBAPIError)


def libpq_conninfo(url: str) -> str:
    """A Postgres URL as libpq (psycopg, LISTEN) takes it, whatever driver the user named."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def is_postgres(url: str) -> bool:
    """Whether a database URL names Postgres (whatever driver it spells)."""
    return make_url(url).get_backend_name() == "postgresql"


def sqlite_file(url: str) -> str | None:
    """The file a `sqlite:///` URL names (None for other backends and in-memory databases)."""
    parsed = make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or not name or name == ":memory:":
        return None
    return name


class Database:
    """An async engine plus the one way to open a transaction.

    SQLite allows a single writer, so there every transaction is serialised by an asyncio lock
    (embedded mode is one process); Postgres transactions run concurrently and rely on row locks.
    """

    def __init__(
        self, url: str, *, pool_size: int = 10, echo: bool = False, prepare: bool = True
    ) -> None:
        self.url = normalize_url(url)
        parsed = make_url(self.url)
        self.dialect = parsed.get_backend_name()
        self._lock: asyncio.Lock | None = None
        kwargs: dict[str, Any] = {"echo": echo}
        if self.dialect == "sqlite":
            self._lock = asyncio.Lock()
            kwargs["poolclass"] = StaticPool
            kwargs["connect_args"] = {"check_same_thread": False}
        else:
            kwargs["pool_size"] = pool_size
            kwargs["max_overflow"] = pool_size
            # No ping at checkout: it costs a round trip and ~0.4 ms of CPU per transaction. A
            # connection that died with the server fails its first statement instead (a 503,
            # Retry-After), and SQLAlchemy then drops every connection older than the failure.
            kwargs["pool_pre_ping"] = False
            if not prepare:  # nothing prepared, not even psycopg's repeated statements
                kwargs["connect_args"] = {"prepare_threshold": None}
        self.engine: AsyncEngine = create_async_engine(self.url, **kwargs)
        if self.dialect == "sqlite":
            sa.event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        else:
            sa.event.listen(self.engine.sync_engine, "before_cursor_execute", _nothing_yet)
        self._observers: list[CommitObserver] = []
        # Postgres connections kept checked out between transactions: a checkout, the handle
        # around it and its return cost ~0.2 ms of CPU per transaction, more than a BEGIN/COMMIT.
        self._idle: list[AsyncConnection] = []
        self._keep = pool_size if self.dialect == "postgresql" else 0

    def observe_commits(self, observer: CommitObserver) -> None:
        """Call `observer(conn)` in every transaction just before its `before_commit` hooks
        (what must wait for the commit, it registers with `on_commit`)."""
        self._observers.append(observer)

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A connection inside a transaction: committed on success, rolled back on error.

        Callbacks registered with `before_commit` run, in order, just before a successful
        commit (batched writes such as the event log use it); observers (`observe_commits`)
        run before them. Once committed, the `after_commit` callbacks run, then the `on_commit`
        coroutines (outside SQLite's writer lock); if it did not commit, the `undone` ones.
        """
        undo: list[Callable[[], None]] = []
        try:
            async with self._lock or contextlib.nullcontext(), self._begin() as conn:
                # Read once, while the connection is sound: on a connection that died mid-way
                # `conn.info` raises, and that error would replace the real one (a lost database).
                info = conn.info
                try:
                    yield conn
                    for observer in self._observers:
                        await observer(conn)
                    if info.get(_QUEUED):
                        async with round_trip(conn):
                            pass
                    hooks = info.get(_BEFORE_COMMIT, ())
                    if hooks and self.is_postgres:
                        await self._commit_statement(conn, hooks)
                    else:
                        for hook in hooks:
                            await hook(conn)
                    finished = list(info.get(_AFTER_COMMIT, ()))
                    committed: list[AfterCommit] = list(info.get(_ON_COMMIT, ()))
                finally:
                    undo = info.pop(_UNDONE, [])
                    for key in [k for k in info if str(k).startswith(TX_STATE_PREFIX)]:
                        del info[key]
        except BaseException:
            for void in undo:
                void()
            raise
        for done in finished:
            done()
        for then in committed:
            await then()

    async def _commit_statement(self, conn: AsyncConnection, hooks: list[CommitHook]) -> None:
        """Run the hooks on Postgres: the writes they buffer (rows, events, audit, wake-ups) and
        their guards become one statement, sent with the COMMIT in one round trip. A failed
        guard raises its refusal (nothing was written: the COMMIT found the statement failed)."""
        statement = conn.info[_STATEMENT] = CommitStatement()
        for hook in hooks:
            await hook(conn)
        del conn.info[_STATEMENT]
        conn.info.pop(_LOCKS_FIRST, None)
        if not statement:
            return
        try:
            # The transaction's end then finds it committed (psycopg's commit() would sync once
            # more).
            async with closing_statement(conn, single=statement.single) as pg:
                await statement.send(pg, prepare=prepare(pg))
        except psycopg.Error as error:
            refusal = statement.refusal(error)
            if refusal is None:
                raise
            raise refusal from None
        await statement.answered()

    @contextlib.asynccontextmanager
    async def _begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction on a kept connection if one is idle (Postgres), else on a new one.

        On Postgres SQLAlchemy's transaction object is not used: its begin and commit cost more
        CPU than the statements of a claim. psycopg begins the transaction with its first
        statement, and it is committed here, through SQLAlchemy only if a statement went through
        it (which began its own transaction on the same connection).
        """
        if not self._keep:
            async with self.engine.begin() as conn:
                yield conn
            return
        conn = self._idle.pop() if self._idle else await self.engine.connect()
        try:
            yield conn
            await _commit(conn)
        except Exception:
            await self._abandon(conn)
            raise
        except BaseException:  # cancelled mid-statement: the connection's state is unknown
            await conn.close()
            raise
        await self._release(conn)

    async def _abandon(self, conn: AsyncConnection) -> None:
        """Roll back a failed transaction; if the server went away, drop the kept ones too."""
        try:
            await _rollback(conn)
        except _LOST:
            with contextlib.suppress(*_LOST):
                await conn.invalidate()
        if conn.invalidated:  # the server went away: the other kept ones are likely dead too
            await self._drop_idle()
        await self._release(conn)

    async def _release(self, conn: AsyncConnection) -> None:
        sound = not (conn.invalidated or conn.closed or conn.in_transaction())
        if sound:
            pg: psycopg.AsyncConnection[Any] | None = conn.info.get(_DRIVER)
            sound = pg is None or (
                not pg.closed
                and not pg.autocommit
                and pg.info.transaction_status is TransactionStatus.IDLE
            )
        if sound and len(self._idle) < self._keep:
            self._idle.append(conn)
        else:
            await conn.close()

    async def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(*_LOST):
                await conn.invalidate()

    async def autovacuum_off(self) -> bool:
        """Whether this is a Postgres server that runs without autovacuum (nothing analyses the
        tables: prepared statements keep plans made from statistics of when they were small)."""
        if not self.is_postgres:
            return False
        async with self.transaction() as conn:
            setting = (await conn.execute(sa.text("SHOW autovacuum"))).scalar_one()
        return str(setting).lower() == "off"

    async def ping(self) -> None:
        """Raise if the database cannot answer a trivial query."""
        async with self.transaction() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(*_LOST):
                await conn.close()
        await self.engine.dispose()


def dialect_insert(conn: AsyncConnection, table: sa.Table) -> Any:
    """INSERT with ON CONFLICT support in the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)
