"""A TCP proxy on 127.0.0.1 that injects faults between a client and Postgres.

    with PgProxy(("127.0.0.1", pg_port), on_fault=history_callback) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/db"
        proxy.latency = 0.005        # added to every chunk, both directions
        proxy.arm_commit_cuts(10, every=7)   # cut every 7th COMMIT, 10 times
        proxy.drop_all()             # close every connection now

A *commit cut* is the ambiguous commit: the proxy forwards the client's COMMIT to the server,
then closes the client's side at once, so the client is told "connection lost" and never sees
the answer. The server's side stays open until the server's answer to the COMMIT arrives (it
is read and thrown away), so the transaction really committed: the write succeeded, but the
caller was told it failed. Both protocol forms are recognised: a simple query `COMMIT` (`Q`,
what psycopg sends) and an extended-protocol `Parse` of `COMMIT` (cut after its `Sync`). So is
the commit nobody sends: a statement executed outside a transaction (autocommit) is a
transaction of its own, committed when it completes, and counts as a COMMIT at its `Sync`.

The client→server stream is parsed into Postgres protocol messages (startup, SSL/GSS requests,
then typed messages), so cuts happen exactly at message boundaries. Use `sslmode=disable`: an
encrypted stream cannot be parsed (the proxy then passes it through and never cuts it).
Threads only; every socket is closed on exit.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.server import Background, loopback_socket

__all__ = ["CommitCut", "PgProxy"]

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_MAX_MESSAGE = 256 * 1024 * 1024
_READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitCut:
    """One ambiguous commit the proxy caused."""

    connection: int
    ordinal: int  # which COMMIT (1-based, over all connections) was cut
    statements: tuple[str, ...]  # the transaction's statements, first 400 characters each
    at: float  # time.monotonic()


@dataclass(slots=True)
class _Conn:
    ident: int
    client: socket.socket
    server: socket.socket
    statements: deque[str] = field(default_factory=lambda: deque(maxlen=64))
    prepared: dict[str, str] = field(default_factory=dict)  # statement name -> its SQL
    in_transaction: bool = False  # a BEGIN was sent and no COMMIT or ROLLBACK since
    alone: list[str] = field(default_factory=list)  # executed outside a transaction since Sync
    cut: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def close_client(self) -> None:
        with contextlib.suppress(OSError):
            self.client.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.client.close()


def _query_text(kind: bytes, body: bytes) -> str | None:
    """The SQL of a simple query (`Q`) or a parse (`P`) message; None for other messages."""
    if kind == b"Q":
        return body.split(b"\x00", 1)[0].decode(errors="replace")
    if kind == b"P":
        parts = body.split(b"\x00", 2)
        return parts[1].decode(errors="replace") if len(parts) > 1 else ""
    return None


def _bound_statement(body: bytes) -> str:
    """The prepared statement a `Bind` message names ("" for the unnamed one)."""
    parts = body.split(b"\x00", 2)
    return parts[1].decode(errors="replace") if len(parts) > 1 else ""


def _parsed_name(body: bytes) -> str:
    """The name a `Parse` message gives its statement ("" for the unnamed one)."""
    return body.split(b"\x00", 1)[0].decode(errors="replace")


def _is_commit(sql: str) -> bool:
    words = sql.strip().rstrip(";").split()
    return bool(words) and words[0].upper() in ("COMMIT", "END") and len(words) <= 2


class PgProxy(Background):
    """Forwards 127.0.0.1:<port> to `upstream`, with latency, drops and commit cuts on demand."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        on_fault: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.upstream = upstream
        self.latency = 0.0
        self.refusing = False
        self._on_fault = on_fault
        self._lock = threading.Lock()
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count(1)
        self._commits = 0
        self._cuts_left = 0
        self._cut_every = 1
        self._since_cut = 0
        self._only: Callable[[tuple[str, ...]], bool] | None = None
        self.cuts: list[CommitCut] = []
        self.connections_total = 0
        self._listener = loopback_socket()
        self._listener.listen(128)
        self._listener.settimeout(0.2)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="pg-proxy", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._listener.getsockname()[1]
        return port

    @property
    def commits_seen(self) -> int:
        with self._lock:
            return self._commits

    @property
    def cuts_left(self) -> int:
        with self._lock:
            return self._cuts_left

    def _start(self) -> None:
        self._thread.start()

    def _stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._listener.close()
        self.drop_all(record=False)

    # -- faults --------------------------------------------------------------------------------

    def arm_commit_cuts(
        self,
        count: int,
        *,
        every: int = 1,
        only: Callable[[tuple[str, ...]], bool] | None = None,
    ) -> None:
        """Cut `count` of the coming COMMITs: every `every`-th one seen from now on (of those
        whose transaction's statements satisfy `only`, if given)."""
        with self._lock:
            self._cuts_left = count
            self._cut_every = max(1, every)
            self._since_cut = 0
            self._only = only

    def disarm(self) -> None:
        with self._lock:
            self._cuts_left = 0

    def drop_all(self, *, record: bool = True) -> int:
        """Close every proxied connection now (both sides); returns how many."""
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for conn in conns:
            conn.close()
        if record and self._on_fault is not None:
            self._on_fault("proxy_drop_all", {"connections": len(conns)})
        return len(conns)

    # -- plumbing ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # upstream down: the client sees what it would see directly
                continue
            for sock in (client, server):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(ident=next(self._ids), client=client, server=server)
            with self._lock:
                self._conns[conn.ident] = conn
                self.connections_total += 1
            threading.Thread(
                target=self._client_to_server, args=(conn,), name=f"pgp-c{conn.ident}", daemon=True
            ).start()
            threading.Thread(
                target=self._server_to_client, args=(conn,), name=f"pgp-s{conn.ident}", daemon=True
            ).start()

    def _forget(self, conn: _Conn) -> None:
        with self._lock:
            self._conns.pop(conn.ident, None)
        conn.close()

    def _send(self, sock: socket.socket, data: bytes) -> None:
        if self.latency > 0:
            time.sleep(self.latency)
        sock.sendall(data)

    @staticmethod
    def _autocommit_writes(statements: list[str]) -> bool:
        """Whether statements sent outside a transaction may have written (only those commit
        anything; a LISTEN or a read does not)."""
        return any(s.lower().startswith(("insert", "update", "delete", "with")) for s in statements)

    def _should_cut(self, statements: tuple[str, ...]) -> int | None:
        """Count a COMMIT; return its ordinal when it is to be cut."""
        with self._lock:
            self._commits += 1
            if self._cuts_left <= 0 or (self._only is not None and not self._only(statements)):
                return None
            self._since_cut += 1
            if self._since_cut < self._cut_every:
                return None
            self._since_cut = 0
            self._cuts_left -= 1
            return self._commits

    def _client_to_server(self, conn: _Conn) -> None:
        buffer = b""
        startup = True
        opaque = False
        pending_cut: int | None = None  # a Parse of COMMIT was seen: cut after the next Sync
        try:
            while not conn.closed.is_set():
                chunk = conn.client.recv(65536)
                if not chunk:
                    break
                if opaque:
                    self._send(conn.server, chunk)
                    continue
                buffer += chunk
                while True:
                    if startup:
                        if len(buffer) < 8:
                            break
                        length, code = struct.unpack("!ii", buffer[:8])
                        if length < 8 or length > _MAX_MESSAGE:
                            opaque = True
                            break
                        if len(buffer) < length:
                            break
                        message, buffer = buffer[:length], buffer[length:]
                        self._send(conn.server, message)
                        if code not in (_SSL_REQUEST, _GSSENC_REQUEST, _CANCEL_REQUEST):
                            startup = False
                        continue
                    if len(buffer) < 5:
                        break
                    kind = buffer[:1]
                    (length,) = struct.unpack("!i", buffer[1:5])
                    if length < 4 or length > _MAX_MESSAGE:
                        opaque = True
                        break
                    if len(buffer) < 1 + length:
                        break
                    message, buffer = buffer[: 1 + length], buffer[1 + length :]
                    sql = _query_text(kind, message[5:])
                    cut: int | None = None
                    if kind == b"P" and sql is not None:
                        conn.prepared[_parsed_name(message[5:])] = " ".join(sql.split())[:400]
                    if sql is not None:
                        if _is_commit(sql):
                            conn.in_transaction = False
                            ordinal = self._should_cut(tuple(conn.statements))
                            if kind == b"Q":
                                cut = ordinal
                            else:
                                pending_cut = ordinal
                        elif sql.lstrip()[:8].upper().startswith(("BEGIN", "ROLLBACK", "START")):
                            conn.in_transaction = (
                                sql.lstrip()[:8].upper().startswith(("BEGIN", "START"))
                            )
                            conn.statements.clear()
                        elif kind == b"Q":
                            conn.statements.append(" ".join(sql.split())[:400])
                    elif kind == b"B":
                        # What runs: a statement parsed just now or prepared long ago.
                        bound = conn.prepared.get(_bound_statement(message[5:]), "")
                        if (
                            bound
                            and not _is_commit(bound)
                            and not bound.upper().startswith(("BEGIN", "ROLLBACK", "START"))
                        ):
                            if conn.in_transaction:
                                conn.statements.append(bound)
                            else:
                                conn.alone.append(bound)
                    elif kind == b"S" and pending_cut is not None:
                        cut, pending_cut = pending_cut, None
                        conn.alone.clear()
                    elif kind == b"S":
                        # Statements run outside a transaction commit as they complete.
                        if conn.alone and self._autocommit_writes(conn.alone):
                            cut = self._should_cut(tuple(conn.alone))
                            conn.statements.clear()
                            conn.statements.extend(conn.alone)
                        conn.alone.clear()
                    if cut is not None:
                        # Silence the client first, so no byte of the answer can reach it.
                        self._cut(conn, cut)
                        self._send(conn.server, message)
                        return
                    self._send(conn.server, message)
                    if sql is not None and _is_commit(sql) and kind == b"Q":
                        conn.statements.clear()
                if opaque and buffer:
                    self._send(conn.server, buffer)
                    buffer = b""
        except OSError:
            pass
        if not conn.cut.is_set():
            self._forget(conn)

    def _cut(self, conn: _Conn, ordinal: int) -> None:
        """The COMMIT is about to go to the server: the client never hears back."""
        conn.cut.set()
        conn.close_client()
        cut = CommitCut(
            connection=conn.ident,
            ordinal=ordinal,
            statements=tuple(conn.statements),
            at=time.monotonic(),
        )
        with self._lock:
            self.cuts.append(cut)
        if self._on_fault is not None:
            self._on_fault(
                "commit_cut",
                {"connection": cut.connection, "ordinal": ordinal, "statements": cut.statements},
            )
        # The server-side reader waits for the COMMIT's answer, then closes; never for ever.
        threading.Timer(5.0, self._forget, args=(conn,)).start()

    def _server_to_client(self, conn: _Conn) -> None:
        tail = b""
        try:
            while not conn.closed.is_set():
                chunk = conn.server.recv(65536)
                if not chunk:
                    break
                if conn.cut.is_set():
                    # Swallow the answer; once the server is ready again the COMMIT is done.
                    tail = (tail + chunk)[-16:]
                    if _READY_FOR_QUERY in tail or _READY_FOR_QUERY in chunk:
                        break
                    continue
                self._send(conn.client, chunk)
        except OSError:
            pass
        self._forget(conn)
