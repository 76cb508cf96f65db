"""The `sql` connector: a tool's configured statements, run on PostgreSQL with bound arguments.

The model never sends SQL: it picks a statement of the tool's config and gives the values of its
named parameters, which travel as bound values only. Each call is one transaction on a connection
of its own, READ ONLY unless the tool says `write: true`. Nothing is applied before COMMIT, so a
failed write was rolled back and may be tried again; only a COMMIT whose answer was lost may have
been applied (`maybe_applied`). The database host passes the http connector's SSRF guard and
libpq connects to the checked addresses only (`hostaddr`). This is the one connector allowed to
import psycopg (an import-linter exception): it reaches a tool's database, never Agent-Reach's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import math
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any, cast
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from agent_reach.errors import ErrorCode
from agent_reach_connectors import netguard
from agent_reach_connectors.base import ConnectorError, ToolCall, resolve_secrets
from agent_reach_connectors.http import HttpConnector, Redactor, Resolver
from agent_reach_connectors.http_request import CONNECT_TIMEOUT_CAP, allowlist, misconfigured

DEFAULT_MAX_ROWS = 1000
DEFAULT_TIMEOUT = 10.0
# The client-side cap waits this long past the server's statement_timeout (a partitioned
# network never answers), so the server's cancellation is what normally ends a slow statement.
_CLIENT_GRACE = 1.0
_SECRET_KEYS = ("password", "sslpassword", "oauth_client_secret")
# Literals, quoted identifiers and comments: a `;` or `%` inside them is not SQL syntax.
_QUOTED = re.compile(
    r"""[eE]'(?:[^'\\]|\\.|'')*' | '(?:[^']|'')*' | "(?:[^"]|"")*"
      | \$\$.*?\$\$ | \$(?P<tag>[A-Za-z_][A-Za-z0-9_]*)\$.*?\$(?P=tag)\$
      | --[^\n]* | /\*.*?\*/""",
    re.S | re.X,
)
_PLACEHOLDER = re.compile(r"%(?:%|\((?P<name>[A-Za-z_][A-Za-z0-9_]*)\)[sbt]|(?P<bad>))")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_LOGIN_REFUSED = re.compile(r"authentication failed|role \".*\" does not exist|pg_hba\.conf")
_NO_DATABASE = re.compile(r"database \".*\" does not exist")
# What a SQLSTATE (or its two-character class) means for the caller: code, retryable, phrase.
_OUTCOMES: dict[str, tuple[ErrorCode, bool, str]] = {
    "57014": (ErrorCode.TIMEOUT, True, "the statement ran past the tool's timeout"),
    "25006": (ErrorCode.DOWNSTREAM_REJECTED, False, "the tool is read-only; the statement writes"),
    "42501": (ErrorCode.UNAUTHORIZED, False, "the database user lacks a privilege"),
    "55P03": (ErrorCode.DOWNSTREAM_UNAVAILABLE, True, "a lock was not available"),
    "40": (ErrorCode.DOWNSTREAM_UNAVAILABLE, True, "it conflicted with a concurrent transaction"),
    "23": (ErrorCode.DOWNSTREAM_REJECTED, False, "the database refused the change"),
    "22": (ErrorCode.INVALID_ARGUMENTS, False, "an argument does not fit the statement"),
    "42": (ErrorCode.CONNECTOR_ERROR, False, "the tool's statement is misconfigured"),
    "0A": (ErrorCode.CONNECTOR_ERROR, False, "the tool's statement is misconfigured"),
    "3F": (ErrorCode.CONNECTOR_ERROR, False, "the tool's statement is misconfigured"),
    "08": (ErrorCode.CONNECTION_ERROR, True, "the connection to the database failed"),
    "53": (ErrorCode.DOWNSTREAM_UNAVAILABLE, True, "the database is out of resources"),
    "57": (ErrorCode.DOWNSTREAM_UNAVAILABLE, True, "the database is not accepting work"),
    "58": (ErrorCode.DOWNSTREAM_UNAVAILABLE, True, "the database failed"),
    "XX": (ErrorCode.DOWNSTREAM_UNAVAILABLE, True, "the database failed"),
}
_REFUSED = (ErrorCode.DOWNSTREAM_REJECTED, False, "the database refused the statement")
_UNCERTAIN = frozenset({"08", "57", "58", "XX"})  # a COMMIT answered so may have happened


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    """One call read from its config and arguments: what to run, and its limits."""

    tool: str
    statement: str
    params: dict[str, Any]
    write: bool
    max_rows: int
    timeout: float


@dataclass(frozen=True, slots=True, kw_only=True)
class _Database:
    """The URL's connection parameters (secrets resolved), and its one TCP host."""

    params: dict[str, Any]
    host: str
    port: int

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class SqlConnector:
    """Runs one of a tool's configured statements on PostgreSQL per call.

    Config: `url` (`postgresql://...`, usually `${env:NAME}`; a Unix socket is refused),
    `query` (one statement) or `queries` (name -> statement, `args["query"]` picks one), each
    with `%(name)s` parameters (a literal `%` is `%%`) that the arguments must match exactly;
    `write` (default false: READ ONLY), `max_rows` (1000; reads are streamed and stop there),
    `timeout` (10 s, never more than the call's: `statement_timeout` and a client-side cap) and
    `allow_hosts` (as the http connector reads it).

    Output: `{"rows": [{column: value}], "row_count": n, "truncated": bool}` for a statement that
    returns rows (a write's `row_count` counts the rows it changed), `{"row_count": n}` for a
    write that returns none. Values are JSON: numeric as text, times ISO 8601, bytea base64.
    Neither the URL nor its password ever shows in an output or an error message.

    `resolver` (tests) replaces the system's getaddrinfo.
    """

    name = "sql"

    def __init__(self, *, resolver: Resolver | None = None) -> None:
        self._guard = HttpConnector(resolver=resolver)  # its SSRF guard only: never started

    async def start(self) -> None:
        """Nothing to open: each call opens its own connection."""

    async def close(self) -> None:
        """Nothing to close: each call closes its own connection."""

    async def invoke(self, call: ToolCall) -> dict[str, Any]:
        """Run the call's statement; its rows or row count, or a classified ConnectorError."""
        secrets = _Secrets(call.config)
        try:
            plan = _read_call(call)
            database = _read_url(call, secrets)
            addresses = await self._guard.check_destination(
                plan.tool,
                database.host,
                database.port,
                allowlist(plan.tool, call.config),
                what=f"the database {database.where}",
                wait=min(plan.timeout, CONNECT_TIMEOUT_CAP),
            )
            return await _run(plan, database, addresses)
        except ConnectorError as error:
            error.message = secrets.scrub(error.message)
            error.args = (error.message,)
            raise


class _Secrets:
    """The config's `${env:...}` values and the URL (whole, and its password), to scrub."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._redact = Redactor(config)
        self._values: set[str] = set()

    def add(self, value: str) -> None:
        self._values.update(v for v in (value, quote(value, safe=""), quote(value)) if v)

    def scrub(self, message: str) -> str:
        for value in sorted(self._values, key=len, reverse=True):
            message = message.replace(value, "***")
        return self._redact(message)


def _read_call(call: ToolCall) -> _Plan:
    tool, config, args = call.tool, call.config, dict(call.args)
    queries, single = config.get("queries"), config.get("query")
    if (queries is None) == (single is None):
        raise misconfigured(tool, "config needs one of query (a statement) or queries (named)")
    if queries is not None:
        if not isinstance(queries, Mapping) or not queries:
            raise misconfigured(tool, "config.queries must map names to statements")
        name = args.pop("query", None)
        if not isinstance(name, str) or name not in queries:
            raise _invalid(tool, f"query must name one of: {', '.join(sorted(map(str, queries)))}")
        single = queries[name]
    if not isinstance(single, str):
        raise misconfigured(tool, "a configured statement must be a string")
    problem, used = _statement(single)
    if problem:
        raise misconfigured(tool, problem)
    missing, extra = sorted(used - args.keys()), sorted(args.keys() - used)
    if missing or extra:
        said = [f"missing {', '.join(missing)}"] * bool(missing)
        said += [f"not used by the statement: {', '.join(extra)}"] * bool(extra)
        raise _invalid(tool, f"arguments do not match the statement ({'; '.join(said)})")
    write, max_rows = config.get("write", False), config.get("max_rows", DEFAULT_MAX_ROWS)
    timeout = config.get("timeout", DEFAULT_TIMEOUT)
    if not isinstance(write, bool):
        raise misconfigured(tool, "config.write must be true or false")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise misconfigured(tool, "config.max_rows must be a positive whole number")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise misconfigured(tool, "config.timeout must be a positive number of seconds")
    return _Plan(
        tool=tool,
        statement=single,
        params={key: _bound(value) for key, value in args.items()},
        write=write,
        max_rows=max_rows,
        timeout=min(float(timeout), call.timeout_s) if call.timeout_s > 0 else float(timeout),
    )


@functools.lru_cache(maxsize=1024)
def _statement(text: str) -> tuple[str, frozenset[str]]:
    """What is wrong with a configured statement ("" if nothing), and the parameters it uses."""
    skeleton = _QUOTED.sub(lambda m: " " if m.group()[:2] in ("--", "/*") else "x", text)
    core = skeleton.rstrip().rstrip(";").rstrip()
    if not core:
        return "a configured statement is empty", frozenset()
    if ";" in core:
        return "a configured statement holds more than one statement (a ';' inside)", frozenset()
    names = set()
    for match in _PLACEHOLDER.finditer(text):
        if match.group("bad") is not None:
            return "a statement takes named parameters, %(name)s; a literal % is %%", frozenset()
        if match.group("name"):
            names.add(match.group("name"))
    return "", frozenset(names)


def _bound(value: Any) -> Any:
    """An argument as psycopg sends it: objects (and lists holding them) as jsonb."""
    if isinstance(value, Mapping) or (
        isinstance(value, list) and any(isinstance(v, Mapping | list) for v in value)
    ):
        return Jsonb(value)
    return value


def _read_url(call: ToolCall, secrets: _Secrets) -> _Database:
    tool, raw = call.tool, call.config.get("url")
    if not isinstance(raw, str) or not raw.strip():
        raise misconfigured(tool, "config.url is not set")
    url = resolve_secrets(raw).strip()
    secrets.add(url)
    try:
        params: dict[str, Any] | None = conninfo_to_dict(url)
    except psycopg.Error:  # its message may quote the URL: not kept, not chained
        params = None
    if params is None:
        raise misconfigured(tool, "config.url is not a PostgreSQL connection URL")
    for key in _SECRET_KEYS:
        if isinstance(params.get(key), str):
            secrets.add(params[key])
    host, port = str(params.get("host") or ""), str(params.get("port") or "5432")
    if not host or host.startswith(("/", "@")):
        raise ConnectorError(
            ErrorCode.DESTINATION_REFUSED,
            f"{tool}: refused the database: a Unix socket (the URL names no TCP host)",
            retryable=False,
        )
    if "," in host or "hostaddr" in params:
        raise misconfigured(tool, "config.url must name one host (and no hostaddr)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise misconfigured(tool, "config.url has an invalid port")
    return _Database(params=params, host=host, port=int(port))


async def _run(
    plan: _Plan, database: _Database, addresses: Sequence[netguard.IPAddress]
) -> dict[str, Any]:
    """Connect, run the statement in its own transaction, commit a write; always close."""
    deadline = asyncio.get_running_loop().time() + plan.timeout
    conn = await _connect(plan, database, addresses)
    committing = False
    failure: ConnectorError
    try:
        async with asyncio.timeout_at(deadline + _CLIENT_GRACE):
            await conn.set_read_only(not plan.write)  # BEGIN READ ONLY
            cursor = conn.cursor()
            left = max(1, int((deadline - asyncio.get_running_loop().time()) * 1000))
            await cursor.execute("SELECT set_config('statement_timeout', %s, true)", [str(left)])
            if not plan.write:
                return await _read(plan, cursor)
            output = await _write(plan, cursor)
            committing = True
            await conn.commit()
            return output
    except psycopg.Error as exc:
        failure = _failure(plan, exc, committing=committing)
    except TimeoutError:
        failure = _failure(plan, None, committing=committing)
    finally:
        await conn.close()
    raise failure  # outside the handler: the psycopg error (its pgconn holds the URL) not chained


async def _connect(
    plan: _Plan, database: _Database, addresses: Sequence[netguard.IPAddress]
) -> psycopg.AsyncConnection[tuple[Any, ...]]:
    """A connection to one of the checked addresses (libpq never resolves the name again)."""
    wait = min(plan.timeout, CONNECT_TIMEOUT_CAP)
    reason = "timed out"
    try:
        async with asyncio.timeout(wait):
            return await psycopg.AsyncConnection.connect(
                **{
                    **database.params,
                    "host": ",".join([database.host] * len(addresses)),  # what TLS verifies
                    "hostaddr": ",".join(address.compressed for address in addresses),
                    "port": str(database.port),
                    "connect_timeout": max(2, math.ceil(wait)),  # libpq's own minimum is 2
                    "fallback_application_name": "agent-reach-sql",
                }
            )
    except (psycopg.OperationalError, TimeoutError) as exc:
        if not isinstance(exc, TimeoutError | psycopg.errors.ConnectionTimeout):
            reason = str(exc).split("\n", 1)[0].rsplit("failed: ", 1)[-1].replace("FATAL:  ", "")
    code = ErrorCode.CONNECTION_ERROR
    if _LOGIN_REFUSED.search(reason):
        code = ErrorCode.UNAUTHORIZED
    elif _NO_DATABASE.search(reason):
        code = ErrorCode.CONNECTOR_ERROR
    said = f"{plan.tool}: could not connect to the database {database.where}: {reason[:200]}"
    raise ConnectorError(code, said, maybe_applied=False)


async def _read(plan: _Plan, cursor: psycopg.AsyncCursor[tuple[Any, ...]]) -> dict[str, Any]:
    """At most `max_rows` rows, streamed: one row more says there are others (not fetched)."""
    rows: list[tuple[Any, ...]] = []
    truncated = False
    stream = cast(AsyncGenerator[tuple[Any, ...], None], cursor.stream(plan.statement, plan.params))
    async with contextlib.aclosing(stream):
        async for row in stream:
            if len(rows) == plan.max_rows:
                truncated = True  # leaving the stream cancels the rest of the statement
                break
            rows.append(row)
    return {"rows": _records(plan, cursor, rows), "row_count": len(rows), "truncated": truncated}


async def _write(plan: _Plan, cursor: psycopg.AsyncCursor[tuple[Any, ...]]) -> dict[str, Any]:
    await cursor.execute(plan.statement, plan.params)
    output: dict[str, Any] = {"row_count": cursor.rowcount}
    if cursor.description is not None:  # RETURNING
        rows = await cursor.fetchmany(plan.max_rows + 1)
        output["rows"] = _records(plan, cursor, rows[: plan.max_rows])
        output["truncated"] = len(rows) > plan.max_rows
    return output


def _records(
    plan: _Plan, cursor: psycopg.AsyncCursor[tuple[Any, ...]], rows: list[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    if not rows or cursor.description is None:
        return []
    names = [column.name for column in cursor.description]
    if len(set(names)) < len(names):
        raise misconfigured(plan.tool, "the statement returns two columns of one name: alias one")
    return [dict(zip(names, map(_json_value, row), strict=True)) for row in rows]


def _json_value(value: Any) -> Any:
    """A column value as JSON can carry it, losing nothing: exact numbers and times as text."""
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return _json_scalar(value)


def _json_scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):  # an interval, as an ISO 8601 duration in seconds
        return f"PT{value.total_seconds():f}".rstrip("0").rstrip(".") + "S"
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and math.isfinite(value):
        return value
    return str(value)  # Decimal (exact), NaN, UUID, inet, ranges, ...: their text


def _failure(plan: _Plan, exc: psycopg.Error | None, *, committing: bool) -> ConnectorError:
    """What a failed statement (or COMMIT) means for the caller; None: the client cap expired.

    A statement that failed before COMMIT was rolled back: nothing was applied, whatever the
    error. A COMMIT whose answer was lost (a timeout, a dropped connection) may have happened.
    """
    tool = plan.tool
    state = (exc.sqlstate or "") if exc is not None else ""
    if exc is None:
        code, retryable, phrase = ErrorCode.TIMEOUT, True, "the database did not answer in time"
        said = f"{phrase} ({plan.timeout:g}s)"
    elif not state:
        code, retryable, phrase = _driver_outcome(exc)
        said = f"{phrase}: {str(exc).split(chr(10), 1)[0][:200]}"
    else:
        code, retryable, phrase = _OUTCOMES.get(state) or _OUTCOMES.get(state[:2]) or _REFUSED
        phrase = "the database is read-only" if state == "25006" and plan.write else phrase
        name = _CAMEL.sub("_", type(exc).__name__).lower()
        on = exc.diag.constraint_name or exc.diag.column_name
        detail = f" on {on}" if on and state.startswith("23") else ""
        said = f"{phrase}: {name} ({state}){detail}: {exc.diag.message_primary or ''}"
    uncertain = committing and (exc is None or not state or state[:2] in _UNCERTAIN)
    if uncertain:
        said += "; the COMMIT was sent and its outcome is unknown: it may have been applied"
    elif plan.write and retryable:
        said += "; the transaction was rolled back"
    return ConnectorError(code, f"{tool}: {said}", retryable=retryable, maybe_applied=uncertain)


def _driver_outcome(exc: psycopg.Error) -> tuple[ErrorCode, bool, str]:
    """An error psycopg raised itself (no SQLSTATE): a lost connection, or a value it refused."""
    if isinstance(exc, psycopg.OperationalError):
        return ErrorCode.CONNECTION_ERROR, True, "the connection to the database was lost"
    if isinstance(exc, psycopg.DataError):
        return ErrorCode.INVALID_ARGUMENTS, False, "an argument cannot be sent"
    return ErrorCode.CONNECTOR_ERROR, False, "the tool's statement cannot be run"


def _invalid(tool: str, what: str) -> ConnectorError:
    return ConnectorError(ErrorCode.INVALID_ARGUMENTS, f"{tool}: {what}", retryable=False)
