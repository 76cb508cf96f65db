"""A TCP proxy on 127.0.0.1 that counts the statements and commits a client sends to Postgres.

    with PgWire(("127.0.0.1", 5432)) as wire:
        url = wire.url("postgresql://postgres@127.0.0.1:5432/db")   # the same database, via us
        mark = wire.mark()
        ... work over `url` ...
        tally = wire.since(mark)   # .statements, .commits, .transactions, .alone, .journal

It counts from the wire, outside the code it measures: every statement Postgres is asked to run
is one `Execute` (`E`) of the extended protocol or one statement of a simple `Query` (`Q`, which
may hold several, split at their semicolons). BEGIN and COMMIT are statements too. A *commit* is a
COMMIT (or END) statement. Statements run outside a BEGIN … COMMIT block are a transaction of
their own (autocommit: the statements of one `Sync` or of one simple query), committed with no
COMMIT statement: those transactions are counted apart, as *alone*. An `Execute` that fetches
more rows of a suspended portal counts again (psycopg does that only for server-side cursors).

Each message is counted before it is forwarded, so whatever a client has had an answer to is in
the count by the time it has the answer. The proxy answers an SSL or GSSAPI encryption request
itself with 'N' (no), so the stream stays plain and parsable whatever the client's `sslmode`;
a client that insists on encryption (`sslmode=require`) fails to connect. Threads only; every
socket is closed on exit.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from tests.support.server import Background, loopback_socket

__all__ = ["PgWire", "Statement", "Tally", "split_statements"]

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_MAX_MESSAGE = 256 * 1024 * 1024

# The lexical pieces of SQL that may hide a semicolon: strings (with E'' escapes), quoted
# identifiers, dollar-quoted bodies and comments; then a semicolon, then anything else.
_TOKEN = re.compile(
    r"""
      (?<!\w)[Ee]'(?:[^'\\]|\\.|'')*'
    | '(?:[^']|'')*'
    | "(?:[^"]|"")*"
    | \$(?P<tag>(?:[A-Za-z_]\w*)?)\$.*?\$(?P=tag)\$
    | (?P<comment>--[^\n]*|/\*.*?\*/)
    | (?P<end>;)
    | [^'"$;/\-Ee]+
    | .
    """,
    re.S | re.X,
)


def split_statements(sql: str) -> list[str]:
    """The statements of a simple query, whitespace collapsed, comments and empty ones dropped."""
    statements: list[str] = []
    current: list[str] = []
    for token in _TOKEN.finditer(sql):
        if token.group("comment"):
            current.append(" ")
        elif token.group("end"):
            statements.append(" ".join("".join(current).split()))
            current = []
        else:
            current.append(token.group())
    statements.append(" ".join("".join(current).split()))
    return [s for s in statements if s]


def _first_word(sql: str) -> str:
    words = sql.split(None, 1)
    return words[0].upper().rstrip(";") if words else ""


def _is_commit(sql: str) -> bool:
    """COMMIT or END (not COMMIT PREPARED, which ends a two-phase transaction elsewhere)."""
    return _first_word(sql) in ("COMMIT", "END") and "PREPARED" not in sql.upper()


def _opens_block(sql: str) -> bool:
    return _first_word(sql) in ("BEGIN", "START")


def _closes_block(sql: str) -> bool:
    return _first_word(sql) in ("COMMIT", "END", "ROLLBACK", "ABORT")


@dataclass(frozen=True, slots=True, kw_only=True)
class Statement:
    """One statement a client asked Postgres to run."""

    connection: int  # which proxied connection (1-based, in the order they were accepted)
    transaction: int  # which transaction it ran in (1-based, over all connections)
    sql: str  # its text, whitespace collapsed
    alone: bool  # in a transaction of its own (autocommit), not in a BEGIN … COMMIT block


@dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """The statements journalled between two marks, and what they add up to."""

    journal: tuple[Statement, ...]

    @property
    def statements(self) -> int:
        return len(self.journal)

    @property
    def commits(self) -> int:
        """COMMIT statements."""
        return sum(_is_commit(s.sql) for s in self.journal)

    @property
    def transactions(self) -> int:
        """Transactions the statements ran in, blocks and autocommit alike."""
        return len({s.transaction for s in self.journal})

    @property
    def alone(self) -> int:
        """Transactions of their own (autocommit), committed with no COMMIT statement."""
        return len({s.transaction for s in self.journal if s.alone})


@dataclass(slots=True)
class _Session:
    """What the protocol has told us about one connection so far."""

    ident: int
    prepared: dict[str, str] = field(default_factory=dict)  # statement name -> its SQL
    portals: dict[str, str] = field(default_factory=dict)  # portal name -> its SQL
    in_block: bool = False  # a BEGIN ran and no COMMIT or ROLLBACK since
    transaction: int | None = None  # the open one (a block, or autocommit until the Sync)


class PgWire(Background):
    """Forwards 127.0.0.1:<port> to `upstream` and journals each statement sent through it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.connections = 0
        # The proxy's own ports towards the upstream: a server's view of who its clients are.
        self.upstream_ports: set[int] = set()
        self._journal: list[Statement] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._transactions = itertools.count(1)
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = loopback_socket()
        self._listener.listen(64)
        self._stopping = threading.Event()

    @property
    def port(self) -> int:
        port: int = self._listener.getsockname()[1]
        return port

    def url(self, database_url: str) -> str:
        """`database_url` (host and port of the upstream) pointed at the proxy instead."""
        parts = urlsplit(database_url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def mark(self) -> int:
        """A point in the journal, for `since`."""
        with self._lock:
            return len(self._journal)

    def since(self, mark: int) -> Tally:
        """The statements journalled after `mark`."""
        with self._lock:
            return Tally(journal=tuple(self._journal[mark:]))

    def _start(self) -> None:
        self._spawn(self._accept_loop, "pgwire-accept")

    def _stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)

    # -- plumbing ------------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # upstream down: the client sees what it would see directly
                continue
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
                self.connections += 1
                self.upstream_ports.add(server.getsockname()[1])
            session = _Session(ident=next(self._ids))
            self._spawn(self._client_to_server, f"pgwire-c{session.ident}", session, client, server)
            self._spawn(self._pipe, f"pgwire-s{session.ident}", server, client)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        """The server's answers go back as they come (nothing in them is counted)."""
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _client_to_server(
        self, session: _Session, client: socket.socket, server: socket.socket
    ) -> None:
        with contextlib.suppress(OSError):
            buffer = self._startup(client, server)
            if buffer is None:
                return
            while True:
                while len(buffer) >= 5:
                    (length,) = struct.unpack("!i", buffer[1:5])
                    if not 4 <= length <= _MAX_MESSAGE:
                        raise OSError(f"not a Postgres message (length {length})")
                    if len(buffer) < 1 + length:
                        break
                    kind, body = buffer[:1], buffer[5 : 1 + length]
                    self._read(session, kind, body)
                    server.sendall(buffer[: 1 + length])
                    buffer = buffer[1 + length :]
                chunk = client.recv(65536)
                if not chunk:
                    break
                buffer += chunk
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    @staticmethod
    def _startup(client: socket.socket, server: socket.socket) -> bytes | None:
        """Forward the startup message, refusing encryption; what follows it (typed messages),
        or None once a cancel request has been forwarded."""
        buffer = b""
        while True:
            while len(buffer) < 8 or len(buffer) < struct.unpack("!i", buffer[:4])[0]:
                chunk = client.recv(65536)
                if not chunk:
                    return None
                buffer += chunk
            length, code = struct.unpack("!ii", buffer[:8])
            if not 8 <= length <= _MAX_MESSAGE:
                raise OSError(f"not a Postgres startup message (length {length})")
            message, buffer = buffer[:length], buffer[length:]
            if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                client.sendall(b"N")
                continue
            server.sendall(message)
            return None if code == _CANCEL_REQUEST else buffer

    def _read(self, session: _Session, kind: bytes, body: bytes) -> None:
        """Journal what one client message asks Postgres to run."""
        if kind == b"P":
            name, text = body.split(b"\x00", 2)[:2]
            session.prepared[name.decode()] = " ".join(text.decode(errors="replace").split())
        elif kind == b"B":
            bound, name = body.split(b"\x00", 2)[:2]
            session.portals[bound.decode()] = session.prepared.get(name.decode(), "?")
        elif kind == b"E":
            portal = body.split(b"\x00", 1)[0].decode()
            self._ran(session, session.portals.get(portal, "?"))
        elif kind == b"Q":
            for sql in split_statements(body.split(b"\x00", 1)[0].decode(errors="replace")):
                self._ran(session, sql)
        if kind in (b"S", b"Q") and not session.in_block:
            session.transaction = None  # an autocommit transaction ends with its Sync

    def _ran(self, session: _Session, sql: str) -> None:
        with self._lock:
            if session.transaction is None or _opens_block(sql):
                session.transaction = next(self._transactions)
            entry = Statement(
                connection=session.ident,
                transaction=session.transaction,
                sql=sql,
                alone=not (session.in_block or _opens_block(sql)),
            )
            self._journal.append(entry)
        if _opens_block(sql):
            session.in_block = True
        elif _closes_block(sql):
            session.in_block = False
            session.transaction = None
