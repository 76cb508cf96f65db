"""The fault harness: real processes, a fault injector, a recording client, and observers.

Everything a scenario does that a checker may need goes into the run's History:

- `submit`: every submit attempt (Idempotency-Key, controller, answer status or transport
  error, Retry-After, task id when accepted);
- `answer`: other API answers worth judging (polls during an outage);
- `fault` / `heal`: SIGKILL, SIGSTOP/SIGCONT, Postgres crash/start, proxy cuts and drops;
- `tools`: the tool catalogue of the run (maximum attempts, idempotency, sink or not);
- `task`, `event`, `listed`: the final state, read through the REST API;
- `delivery`, `sink_effects`: what the downstream received and applied.

A scenario is one small test file: build tools, start a cluster, submit, inject faults, wait
until settled, `observe`, `record_sink`, then `check` and `figure`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import httpx
import psycopg

from agent_reach.states import TERMINAL_STEP_STATES, StepStatus
from tests.e2e.processes import REACH, Cluster, Proc, wait_until
from tests.faults.profiles import Profile
from tests.faults.recording import record_tools
from tests.support.catalog import write_tools
from tests.support.history import History
from tests.support.pgserver import PrivatePostgres
from tests.support.sink import Sink

LEASE_S = 2.0
# Every /v1 route needs an API key: each controller accepts this one (an admin of tenant
# `default`, the controller's bootstrap key) and the client sends it.
API_KEY = f"ark_faults_{secrets.token_hex(16)}"
TERMINAL = sorted(s.value for s in TERMINAL_STEP_STATES)
SETTLED = sorted([*TERMINAL, StepStatus.OUTCOME_UNKNOWN.value])
OP_SCHEMA = {
    "type": "object",
    "required": ["op"],
    "properties": {"op": {"type": "string"}, "case": {"type": "string"}},
}


# -- processes -----------------------------------------------------------------------------------


class FaultCluster(Cluster):
    """`Cluster` with per-process environment, fixed addresses and named executors."""

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as handle:
            popen = subprocess.Popen(
                [*REACH, *args],
                cwd=self.workdir,
                env={**self.env, **(env or {})},
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = Proc(name=name, popen=popen, log=log)
        self.procs.append(proc)
        return proc

    def start_controller(
        self,
        name: str,
        *,
        database_url: str,
        tools: Path,
        http: str = "127.0.0.1:0",
        grpc: str = "127.0.0.1:0",
        env: dict[str, str] | None = None,
        lease_s: float | None = LEASE_S,
    ) -> Proc:
        """`lease_s=None`: the controller's default lease (what a deployment gets)."""
        ready = self.workdir / f"{name}.ready.json"
        ready.unlink(missing_ok=True)
        proc = self.spawn(
            name,
            [
                "controller",
                "--http",
                http,
                "--grpc",
                grpc,
                "--database-url",
                database_url,
                "--tools",
                str(tools),
                "--ready-file",
                str(ready),
                *(["--lease-seconds", str(lease_s)] if lease_s is not None else []),
                "--log-format",
                "json",
            ],
            {"AGENT_REACH_CONTROLLER_BOOTSTRAP_KEY": API_KEY, **(env or {})},
        )
        self._await_ready_file(proc, ready)
        return proc

    def start_executor(
        self,
        name: str,
        *,
        grpc: str,
        slots: int,
        env: dict[str, str] | None = None,
        connectors: str = "http",
    ) -> Proc:
        """An executor whose id is `name`; its http calls carry `X-Executor: name`.

        `grpc` may list several controllers (`a:1,b:2`): the executor uses every one.
        `connectors`: those it runs, comma-separated.
        """
        proc = self.spawn(
            name,
            ["executor", "--controller", grpc, "--slots", str(slots), "--connectors", connectors],
            {
                "AGENT_REACH_EXECUTOR_EXECUTOR_ID": name,
                "FAULTS_EXECUTOR": name,
                **(env or {}),
            },
        )
        proc.info["executor_id"] = name
        return proc

    def start_dev(
        self,
        name: str,
        *,
        database_url: str,
        tools: Path,
        env: dict[str, str] | None = None,
        lease_s: float = LEASE_S,
    ) -> Proc:
        """`reach dev` (controller and executor in one process) whose executor's id is `name`
        (its http calls carry `X-Executor: name`), on `database_url` (SQLite)."""
        ready = self.workdir / f"{name}.ready.json"
        ready.unlink(missing_ok=True)
        proc = self.spawn(
            name,
            [
                "dev",
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
                "--database-url",
                database_url,
                "--tools",
                str(tools),
                "--ready-file",
                str(ready),
                "--lease-seconds",
                str(lease_s),
                "--log-format",
                "json",
            ],
            {
                "AGENT_REACH_CONTROLLER_BOOTSTRAP_KEY": API_KEY,
                "AGENT_REACH_EXECUTOR_EXECUTOR_ID": name,
                "FAULTS_EXECUTOR": name,
                **(env or {}),
            },
        )
        self._await_ready_file(proc, ready)
        proc.info["executor_id"] = name
        return proc

    def await_registered(self, procs: Iterable[Proc], *, within: float = 60) -> None:
        for proc in procs:

            def registered(p: Proc = proc) -> bool:
                if p.popen.poll() is not None:
                    raise AssertionError(f"{p.name} exited early:\n{p.output()[-3000:]}")
                return "executor_registered" in p.output()

            wait_until(registered, within=within, what=f"{proc.name} to register")


def rss_mib(proc: Proc) -> float:
    """Resident memory of a live process (VmRSS), MiB."""
    for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {proc.name}")


# -- faults --------------------------------------------------------------------------------------


class Faults:
    """Injects faults and records each one (and its end) in the history."""

    def __init__(self, history: History, pg: PrivatePostgres | None = None) -> None:
        self.history = history
        self.pg = pg
        self._stopped: dict[int, Proc] = {}
        self.pg_down = False
        self.counts: dict[str, int] = {}

    def _count(self, action: str) -> None:
        self.counts[action] = self.counts.get(action, 0) + 1

    def sigkill(self, proc: Proc) -> None:
        self.history.record("fault", action="sigkill", target=proc.name, pid=proc.popen.pid)
        self._count("sigkill")
        proc.kill()
        self._stopped.pop(proc.popen.pid, None)

    def sigstop(self, proc: Proc) -> None:
        self.history.record("fault", action="sigstop", target=proc.name, pid=proc.popen.pid)
        self._count("sigstop")
        proc.popen.send_signal(signal.SIGSTOP)
        self._stopped[proc.popen.pid] = proc

    def sigcont(self, proc: Proc) -> None:
        proc.popen.send_signal(signal.SIGCONT)
        self._stopped.pop(proc.popen.pid, None)
        self.history.record("heal", action="sigcont", target=proc.name, pid=proc.popen.pid)

    def restarted(self, proc: Proc) -> None:
        self.history.record("heal", action="restart", target=proc.name, pid=proc.popen.pid)

    def pg_crash(self) -> None:
        assert self.pg is not None
        self.history.record("fault", action="pg_crash", target="postgres")
        self._count("pg_crash")
        self.pg_down = True
        self.pg.crash()

    def pg_start(self) -> float:
        assert self.pg is not None
        took = self.pg.start()
        self.pg_down = False
        self.history.record("heal", action="pg_start", target="postgres", took_s=round(took, 3))
        return took

    def proxy_event(self, action: str, data: dict[str, Any]) -> None:
        """`PgProxy(on_fault=...)`: cuts and drops are faults too."""
        self._count(action)
        self.history.record("fault", action=action, target="pg-proxy", **data)

    def heal_all(self) -> None:
        """Undo what is still in effect (teardown): resume stopped processes, start Postgres."""
        for proc in list(self._stopped.values()):
            with contextlib.suppress(ProcessLookupError):
                self.sigcont(proc)
        if self.pg_down and self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg_start()


def pace(seconds: float, *, unless: Callable[[], bool], every: float = 0.1) -> bool:
    """Wait out one interval of a fault schedule; return early (True) once `unless()` holds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if unless():
            return True
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))
    return unless()


# -- the client ----------------------------------------------------------------------------------


class SubmitFailedError(AssertionError):
    pass


# A client retries a 500 a few times (a replica may be going away), then reports it.
MAX_SERVER_ERRORS = 5


class Api:
    """A REST client over one or more controllers that records what it asks and hears.

    `submit` always sends an Idempotency-Key and retries transport errors, timeouts, 429 and
    503 (honouring Retry-After), failing over to the next controller; any other answer is a bug
    in the scenario and raises.
    """

    def __init__(
        self,
        history: History,
        controllers: Sequence[Proc | str],
        *,
        timeout: float = 10.0,
    ) -> None:
        self.history = history
        self.urls = [c if isinstance(c, str) else f"http://{c.info['http']}" for c in controllers]
        self.timeout = timeout
        self._local = threading.local()

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(
                timeout=self.timeout, headers={"Authorization": f"Bearer {API_KEY}"}
            )
        return client

    def close(self) -> None:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is not None:
            client.close()

    def submit(
        self,
        body: dict[str, Any],
        *,
        key: str,
        within: float = 120.0,
        start: int = 0,
        max_retry_after: float = 5.0,
        wait: float = 0.0,
    ) -> str:
        """Submit until accepted (or `within` runs out); returns the task id.

        `wait` > 0 asks the controller to answer once the task is over (`?wait=`): the task
        is committed first, so a reply lost meanwhile leaves a task for the retry to find.
        """
        deadline = time.monotonic() + within
        index, attempt, server_errors = start, 0, 0
        steps = len(body.get("steps", body.get("tool_calls", [])))
        while True:
            url = self.urls[index % len(self.urls)]
            began = time.monotonic()
            delay, fail_over = 0.05 * min(attempt + 1, 10), True
            try:
                response = self._client().post(
                    f"{url}/v1/tasks",
                    json=body,
                    headers={"Idempotency-Key": key},
                    params={"wait": wait} if wait > 0 else None,
                )
            except httpx.TimeoutException as exc:
                self.history.record(
                    "submit", key=key, url=url, attempt=attempt, steps=steps, outcome="timeout",
                    error=type(exc).__name__, took_ms=_ms(began),
                )  # fmt: skip
            except httpx.TransportError as exc:
                self.history.record(
                    "submit", key=key, url=url, attempt=attempt, steps=steps, outcome="error",
                    error=type(exc).__name__, took_ms=_ms(began),
                )  # fmt: skip
            else:
                status = response.status_code
                retry_after = response.headers.get("retry-after")
                if status in (200, 202):
                    task_id: str = response.json()["task_id"]
                    self.history.record(
                        "submit", key=key, url=url, attempt=attempt, steps=steps, status=status,
                        outcome="accepted", task_id=task_id, took_ms=_ms(began),
                    )  # fmt: skip
                    return task_id
                self.history.record(
                    "submit", key=key, url=url, attempt=attempt, steps=steps, status=status,
                    outcome="refused", retry_after=retry_after, code=_problem_code(response),
                    took_ms=_ms(began),
                )  # fmt: skip
                if status in (429, 503):
                    delay = min(_seconds(retry_after, 1.0), max_retry_after)
                    fail_over = status == 503
                elif status < 500:
                    raise SubmitFailedError(f"submit {key} answered {status}: {response.text}")
                else:
                    server_errors += 1
                    if server_errors >= MAX_SERVER_ERRORS:
                        raise SubmitFailedError(
                            f"submit {key} answered {status} {server_errors} times (a 5xx other "
                            f"than 503 is a bug; see the controller's log): {response.text}"
                        )
            if time.monotonic() + delay > deadline:
                raise SubmitFailedError(f"submit {key} not accepted within {within:.0f}s")
            time.sleep(delay)
            attempt += 1
            if fail_over:
                index += 1

    def submit_once(
        self, body: dict[str, Any], *, key: str, url: int = 0, wait: float = 0.0
    ) -> tuple[int | None, str | None, float]:
        """One submit, recorded: (status or None on a transport error, task id, Retry-After)."""
        base = self.urls[url % len(self.urls)]
        began = time.monotonic()
        steps = len(body.get("steps", []))
        try:
            response = self._client().post(
                f"{base}/v1/tasks",
                json=body,
                headers={"Idempotency-Key": key},
                params={"wait": wait} if wait > 0 else None,
            )
        except httpx.TransportError as exc:
            self.history.record(
                "submit", key=key, url=base, attempt=0, steps=steps, outcome="error",
                error=type(exc).__name__, took_ms=_ms(began),
            )  # fmt: skip
            return None, None, 0.0
        status = response.status_code
        retry_after = response.headers.get("retry-after")
        if status in (200, 202):
            task_id: str = response.json()["task_id"]
            self.history.record(
                "submit", key=key, url=base, attempt=0, steps=steps, status=status,
                outcome="accepted", task_id=task_id, took_ms=_ms(began),
                task_status=response.json().get("status"),
            )  # fmt: skip
            return status, task_id, 0.0
        self.history.record(
            "submit", key=key, url=base, attempt=0, steps=steps, status=status,
            outcome="refused", retry_after=retry_after, code=_problem_code(response),
            took_ms=_ms(began),
        )  # fmt: skip
        return status, None, _seconds(retry_after, 0.0)

    def get(self, path: str, *, within: float = 60.0, record: bool = False) -> Any:
        """GET `path` (on the first controller that answers), retrying 503 and transport errors."""
        deadline = time.monotonic() + within
        index = 0
        while True:
            url = self.urls[index % len(self.urls)]
            try:
                response = self._client().get(f"{url}{path}")
            except httpx.TransportError as exc:
                if record:
                    self.history.record("answer", method="GET", path=path, error=type(exc).__name__)
                response = None
            if response is not None:
                if record:
                    self.history.record(
                        "answer",
                        method="GET",
                        path=path,
                        url=url,
                        status=response.status_code,
                        retry_after=response.headers.get("retry-after"),
                    )
                if response.status_code == 200:
                    return response.json()
                if response.status_code != 503:
                    raise AssertionError(f"GET {path} answered {response.status_code}")
            if time.monotonic() > deadline:
                raise AssertionError(f"GET {path} did not succeed within {within:.0f}s")
            time.sleep(0.2)
            index += 1

    def probe(self, path: str, *, url: int = 0) -> int | None:
        """One GET, its answer recorded (status and Retry-After); None on a transport error."""
        base = self.urls[url % len(self.urls)]
        try:
            response = self._client().get(f"{base}{path}")
        except httpx.TransportError as exc:
            self.history.record(
                "answer", method="GET", path=path, url=base, error=type(exc).__name__
            )
            return None
        self.history.record(
            "answer",
            method="GET",
            path=path,
            url=base,
            status=response.status_code,
            retry_after=response.headers.get("retry-after"),
            code=_problem_code(response) if response.status_code >= 400 else None,
        )
        return response.status_code

    def post(self, path: str, body: dict[str, Any], *, expect: Sequence[int] = (200,)) -> Any:
        return self._send("POST", path, body, expect)

    def put(self, path: str, body: dict[str, Any], *, expect: Sequence[int] = (200, 201)) -> Any:
        return self._send("PUT", path, body, expect)

    def _send(self, method: str, path: str, body: dict[str, Any], expect: Sequence[int]) -> Any:
        """One call to the first controller, recorded; an answer not in `expect` raises."""
        response = self._client().request(method, f"{self.urls[0]}{path}", json=body)
        self.history.record("answer", method=method, path=path, status=response.status_code)
        if response.status_code not in expect:
            raise AssertionError(
                f"{method} {path} answered {response.status_code}: {response.text}"
            )
        return response.json()


def _ms(began: float) -> int:
    return int((time.monotonic() - began) * 1000)


def _seconds(value: str | None, default: float) -> float:
    try:
        return float(value) if value else default
    except ValueError:
        return default


def _problem_code(response: httpx.Response) -> str | None:
    with contextlib.suppress(ValueError, AttributeError):
        code = response.json().get("code")
        return str(code) if code is not None else None
    return None


# -- tools and plans -----------------------------------------------------------------------------


class ToolOptions(TypedDict, total=False):
    """Keyword arguments of `sink_tool` that scenarios share between tools."""

    max_attempts: int
    timeout: str
    initial: str
    maximum: str
    jitter: bool


def sink_tool(
    name: str,
    url: str,
    *,
    idempotent: bool = True,
    max_attempts: int = 10,
    timeout: str = "10s",
    initial: str = "100ms",
    maximum: str = "1s",
    jitter: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """An http tool POSTing `{op}` to the sink (the path may use `{case}`)."""
    return {
        "name": name,
        "description": f"{name}: post an operation to the test downstream.",
        "connector": "http",
        "config": {
            "method": "POST",
            "url": url,
            "headers": {"X-Executor": "${env:FAULTS_EXECUTOR}"},
            # The test downstream is on loopback, which the SSRF guard refuses by default.
            "allow_hosts": ["127.0.0.1"],
        },
        "input_schema": OP_SCHEMA,
        "timeout": timeout,
        "retry": {
            "initial_interval": initial,
            "maximum_interval": maximum,
            "maximum_attempts": max_attempts,
            "jitter": jitter,
        },
        "risk": "write",
        "idempotent": idempotent,
        **extra,
    }


def plan(key: str, ops: Sequence[str], tool: str, **extra: Any) -> dict[str, Any]:
    """A plan of independent steps, one per op; the goal is the submit's key."""
    return {
        "goal": key,
        "steps": [
            {"step_id": f"s{i}", "tool": tool, "args": {"op": op}} for i, op in enumerate(ops)
        ],
        **extra,
    }


class KeyedClients:
    """Client threads submitting their share of `keys` at a steady pace, each a task of `steps`
    calls of `tool` with `?wait=`, alternating replicas and retrying (with the same
    Idempotency-Key) on the other one when a call fails. Started at once."""

    def __init__(
        self,
        api: Api,
        keys: Sequence[str],
        *,
        clients: int,
        steps: int,
        tool: str,
        every_s: float,
        wait_s: float,
    ) -> None:
        self._stop = threading.Event()

        def submit(mine: Sequence[str], start: int) -> None:
            for n, key in enumerate(mine):
                if self._stop.wait(every_s):
                    return
                ops = [f"{key}-op-{i}" for i in range(steps)]
                body = plan(key, ops, tool)
                api.submit(body, key=key, start=start + n, within=120, wait=wait_s)

        self._threads = [
            threading.Thread(
                target=submit, args=(keys[i::clients], i), name=f"client-{i}", daemon=True
            )
            for i in range(clients)
        ]
        for thread in self._threads:
            thread.start()

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def join(self, timeout: float = 150) -> None:
        """Wait for every client to finish its keys (then stop any that did not)."""
        for thread in self._threads:
            thread.join(timeout=timeout)
        self._stop.set()


def batches(total: int, size: int) -> Iterator[tuple[int, int]]:
    """(first, count) of consecutive batches covering `total` items."""
    for first in range(0, total, size):
        yield first, min(size, total - first)


# -- observing -----------------------------------------------------------------------------------


class Progress:
    """Step counts by status, read straight from Postgres (bypassing controllers and proxies)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection[Any] | None = None

    def counts(self) -> dict[str, int] | None:
        """Steps per status; None while the database does not answer."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
            rows = self._conn.execute("SELECT status, count(*) FROM steps GROUP BY status")
            return {str(status): int(count) for status, count in rows.fetchall()}
        except psycopg.Error:
            self.close()
            return None

    def settled(self, expected: int | None = None, *, allow_unknown: bool = False) -> bool:
        counts = self.counts()
        if counts is None:
            return False
        done = SETTLED if allow_unknown else TERMINAL
        total = sum(counts.values())
        if expected is not None and total < expected:
            return False
        return all(status in done for status, n in counts.items() if n)

    def unfinished(self) -> int | None:
        """Steps not yet terminal (None while the database does not answer)."""
        counts = self.counts()
        if counts is None:
            return None
        return sum(n for status, n in counts.items() if status not in TERMINAL)

    def nearly_done(self, total: int, *, fraction: float = 0.1, at_most: int = 200) -> bool:
        """Less than `fraction` of `total` steps (and at most `at_most`) left: time to stop
        injecting faults, so that the last fault still catches work in flight and the recovery
        measured after it is not mostly a backlog draining."""
        left = self.unfinished()
        return left is not None and left < min(total * fraction, at_most)

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """One value of a query; None while the database does not answer."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
            row = self._conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
        except psycopg.Error:
            self.close()
            return None
        return None if row is None else row[0]

    def rejected(self, executor_id: str | None = None) -> int:
        """Results rejected so far (from this executor, if given)."""
        sql = "SELECT count(*) FROM events WHERE kind = 'result_rejected'"
        if executor_id is None:
            return int(self.scalar(sql) or 0)
        return int(self.scalar(sql + " AND data->>'executor_id' = %s", (executor_id,)) or 0)

    def ready_depth(self) -> int | None:
        counts = self.counts()
        return None if counts is None else counts.get("ready", 0)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


@dataclass(slots=True)
class Figures:
    """Figure lines of the session, printed at the end and kept in a file."""

    path: Path
    header: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.lines.append(line)
        with self.path.open("a") as handle:
            handle.write(line + "\n")
        print(f"\nFIGURE {line}", flush=True)


def seed() -> int:
    value = os.environ.get("AGENT_REACH_FAULTS_SEED")
    return int(value) if value else random.SystemRandom().randrange(1, 2**31)


def dump_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, default=str))


@dataclass(slots=True, kw_only=True)
class FaultEnv:
    """What a scenario gets: its profile, history, database, fault injector and helpers."""

    name: str
    profile: Profile
    dir: Path
    history: History
    pg: PrivatePostgres
    database: str
    rng: random.Random
    figures: Figures
    faults: Faults
    apis: list[Api] = field(default_factory=list)

    def db_url(self, *, port: int | None = None) -> str:
        return self.pg.url(self.database, port=port)

    @contextlib.contextmanager
    def cluster(self, env: dict[str, str] | None = None) -> Iterator[FaultCluster]:
        workdir = self.dir / "procs"
        workdir.mkdir(exist_ok=True)
        c = FaultCluster(workdir, env)
        try:
            yield c
        finally:
            self.faults.heal_all()
            c.stop_all()

    def tools(self, specs: Sequence[dict[str, Any]], *, sink: Sink | None = None) -> Path:
        record_tools(self.history, specs, sink.url if sink else None)
        return write_tools(self.dir, specs)

    def api(self, controllers: Sequence[Proc | str], *, timeout: float = 10.0) -> Api:
        api = Api(self.history, controllers, timeout=timeout)
        self.apis.append(api)
        return api

    def progress(self) -> Progress:
        return Progress(self.db_url())

    def wait_settled(
        self,
        progress: Progress,
        *,
        expected: int,
        within: float,
        allow_unknown: bool = False,
        what: str = "every step to settle",
    ) -> float:
        """Wait until `expected` steps exist and all are terminal; returns the seconds waited."""
        began = time.monotonic()
        try:
            wait_until(
                lambda: progress.settled(expected, allow_unknown=allow_unknown),
                within=within,
                what=f"{what} ({expected:,} steps)",
                every=0.2,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; step counts now: {progress.counts()}") from None
        return time.monotonic() - began

    def close(self) -> None:
        for api in self.apis:
            api.close()
