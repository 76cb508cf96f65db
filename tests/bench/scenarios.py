"""One run of each measurement, on a fresh database with freshly started processes.

Clocks: the client records wall-clock times (`time.time()`); the controller writes
`steps.started_at` (lease time) and `tasks.finished_at` from `datetime.now(UTC)`, and the
latency run's `clock` tool returns the executor's `time.time()` when its connector starts, all on
the same machine, so they are directly comparable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.bench.machine import cpu_shares, cpu_snapshot, memory_mib
from tests.e2e.processes import Cluster, Proc
from tests.support.catalog import write_tools

JSON = {"content-type": "application/json"}
# Fail a run rather than wait forever: below this rate something is broken, not slow.
MIN_RATE = 20.0
SETTLE_S = 60.0


class BenchError(RuntimeError):
    """A run could not be measured (a process died, a submit failed, a deadline passed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    admin_url: str
    steps: int
    repeats: int
    slots: int
    submitters: int
    plan_size: int = 100
    rate: float = 100.0
    latency_seconds: float = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    steps: int
    seconds: float
    submit_seconds: float
    controller_mib: tuple[float, float] | None
    executor_mib: tuple[float, float] | None
    cpu_percent: dict[str, float]  # of one core, first submit -> all done, per process group
    cpu_window_s: float  # the span cpu_percent is measured over

    def cpu_us_per_step(self, name: str) -> float:
        return self.cpu_percent[name] / 100 * self.cpu_window_s / self.steps * 1e6

    @property
    def rate(self) -> float:
        return self.steps / self.seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    steps: int  # dispatched, the warm-up step included
    submitted: int  # steps in the timed submission
    submit_seconds: float  # all plans accepted, no executor running
    wall_seconds: float  # executor process started → last task finished
    lease_seconds: float  # first lease → last task finished (executor start-up excluded)

    @property
    def submit_rate(self) -> float:
        return self.submitted / self.submit_seconds

    @property
    def wall_rate(self) -> float:
        return self.steps / self.wall_seconds

    @property
    def lease_rate(self) -> float:
        return self.steps / self.lease_seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    sent: int
    latencies_ms: list[float]  # connector start - client send time, per task
    rtts_ms: list[float]  # submit HTTP round trip
    max_send_lag_ms: float  # how late the generator sent against its schedule
    elapsed_s: float  # first to last send
    backlog_s: float  # last lease - last send: how far behind the offered load the system fell
    cpu_percent: dict[str, float]  # of one core, while sending


@dataclass(frozen=True, slots=True, kw_only=True)
class DueAtOnce:
    steps: int
    lateness_ms: list[float]  # connector start - the time every step was scheduled for
    submit_seconds: float


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


NOOP: dict[str, Any] = {
    "name": "noop",
    "description": "Returns its arguments (benchmark no-op).",
    "connector": "echo",
    "input_schema": {"type": "object"},
    "timeout": "10s",
    "retry": {"maximum_attempts": 1},
    "idempotent": True,
}
# When the step really started: the executor's clock as its connector runs (a lease is
# taken in the submit's own transaction when the step is handed to a waiting poll).
CLOCK: dict[str, Any] = {
    "name": "clock",
    "description": "Returns the executor's time.time() (benchmark start stamp).",
    "connector": "python",
    "config": {"function": "time:time"},
    "input_schema": {"type": "object", "additionalProperties": False},
    "timeout": "10s",
    "retry": {"maximum_attempts": 1},
    "idempotent": True,
}


def write_bench_tools(directory: Path) -> Path:
    """The benchmark's catalogue (noop and clock) as a tools file in `directory`."""
    return write_tools(directory, [NOOP, CLOCK], name="bench-tools.yaml")


def plan_body(size: int, tag: str, *, tool: str = "noop", run_at: str | None = None) -> bytes:
    args = {} if tool == "clock" else None
    steps = [
        {"step_id": f"s{i}", "tool": tool, "args": {"i": i} if args is None else args}
        for i in range(size)
    ]
    if run_at is not None:
        for step in steps:
            step["run_at"] = run_at
    return json.dumps({"goal": tag, "steps": steps}).encode()


def _database_url(admin_url: str, name: str) -> str:
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


@contextlib.contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """CREATE DATABASE reach_bench_<random>; dropped (connections and all) on the way out."""
    name = f"reach_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _database_url(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass(slots=True)
class Stack:
    cluster: Cluster
    controller: Proc
    database_url: str
    tools: Path
    slots: int
    executor: Proc | None = None
    # Called when the measured part of a run begins (the profiler starts there).
    on_measure: Callable[[Stack], None] | None = None

    def measuring(self) -> None:
        if self.on_measure is not None:
            self.on_measure(self)

    @property
    def base_url(self) -> str:
        return f"http://{self.controller.info['http']}"

    def start_executor(self) -> Proc:
        self.executor = self.cluster.executor(
            "executor",
            controller=self.controller,
            slots=self.slots,
            extra=["--connectors", "echo,python"],
        )
        return self.executor

    def check_alive(self) -> None:
        for proc in (self.controller, self.executor):
            if proc is not None and proc.popen.poll() is not None:
                raise BenchError(f"{proc.name} exited with {proc.popen.returncode}")


@contextlib.contextmanager
def running_stack(
    config: Config,
    workdir: Path,
    tools: Path,
    *,
    make_cluster: type[Cluster] = Cluster,
    on_measure: Callable[[Stack], None] | None = None,
) -> Iterator[Stack]:
    """A fresh database and a controller on it; processes stop before the database is dropped."""
    workdir.mkdir(parents=True)
    with fresh_database(config.admin_url) as url, _stopping(make_cluster(workdir)) as c:
        try:
            controller = c.controller(
                "controller",
                database_url=url,
                tools=tools,
                extra=["--migrate", "--log-format", "json"],
            )
            yield Stack(
                cluster=c,
                controller=controller,
                database_url=url,
                tools=tools,
                slots=config.slots,
                on_measure=on_measure,
            )
        except BaseException:
            for proc in c.procs:
                tail = [line[:400] for line in proc.output().splitlines()[-6:]]
                print(
                    f"--- last lines of {proc.name} ({proc.log}):", *tail, sep="\n", file=sys.stderr
                )
            raise


@contextlib.contextmanager
def _stopping(c: Cluster) -> Iterator[Cluster]:
    try:
        yield c
    finally:
        c.stop_all()


# -- client side ------------------------------------------------------------------------------


def _client(stack: Stack, connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=stack.base_url,
        timeout=60,
        headers={"Authorization": f"Bearer {stack.cluster.api_key}"},
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def _submit_one(client: httpx.AsyncClient, body: bytes) -> str:
    response = await client.post("/v1/tasks", content=body, headers=JSON)
    if response.status_code != 202:
        raise BenchError(f"submit answered {response.status_code}: {response.text[:300]}")
    task_id: str = response.json()["task_id"]
    return task_id


async def submit_plans(
    stack: Stack, bodies: list[bytes], submitters: int
) -> tuple[float, float, list[str]]:
    """Submit every plan with `submitters` concurrent clients; (first send, last 202, task ids)."""
    pending = list(reversed(bodies))
    task_ids: list[str] = []
    async with _client(stack, submitters) as client:

        async def submitter() -> None:
            while pending:
                task_ids.append(await _submit_one(client, pending.pop()))

        first = time.time()
        await asyncio.gather(*(submitter() for _ in range(submitters)))
        return first, time.time(), task_ids


async def _finished_count(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT count(*) FROM tasks WHERE finished_at IS NOT NULL")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def wait_finished(stack: Stack, tasks: int, *, within: float) -> None:
    """Poll the tasks table (10 Hz) until `tasks` tasks have a finished_at."""
    deadline = time.monotonic() + within
    async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
        while await _finished_count(conn) < tasks:
            stack.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"not all {tasks} tasks finished within {within:.0f}s")
            await asyncio.sleep(0.1)


async def _one_row(stack: Stack, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
    async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    if row is None:
        raise BenchError(f"no row from {sql}")
    return tuple(row)


async def check_all_succeeded(stack: Stack, steps: int) -> None:
    async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT status, count(*) FROM steps GROUP BY status")
        counts = {status: n for status, n in await cur.fetchall()}
    if counts != {"succeeded": steps}:
        raise BenchError(f"expected {steps} succeeded steps, found {counts}")


async def _warm_up(stack: Stack) -> None:
    """One single-step task through the whole path, so start-up costs are not measured."""
    async with _client(stack, 1) as client:
        await _submit_one(client, plan_body(1, "warm-up"))
    await wait_finished(stack, 1, within=SETTLE_S)


def _deadline(steps: int) -> float:
    return SETTLE_S + steps / MIN_RATE


# -- the measurements -------------------------------------------------------------------------


async def throughput(stack: Stack, config: Config) -> Throughput:
    """Executor running; submit every plan; first submit → every task terminal."""
    stack.start_executor()
    await _warm_up(stack)
    plans = math.ceil(config.steps / config.plan_size)
    bodies = [plan_body(config.plan_size, f"bench {k}") for k in range(plans)]
    pids = {p.name: p.popen.pid for p in (stack.controller, stack.executor) if p}
    stack.measuring()
    cpu_before, cpu_began = cpu_snapshot(pids), time.time()
    first, submitted, ids = await submit_plans(stack, bodies, config.submitters)
    await wait_finished(stack, 1 + plans, within=_deadline(config.steps))
    window = time.time() - cpu_began
    cpu = cpu_shares(cpu_before, cpu_snapshot(pids), window)
    memory = {name: memory_mib(pid) for name, pid in pids.items()}
    (last,) = await _one_row(
        stack,
        "SELECT extract(epoch FROM max(finished_at)) FROM tasks WHERE task_id = ANY(%s)",
        (ids,),
    )
    await check_all_succeeded(stack, 1 + plans * config.plan_size)
    return Throughput(
        steps=plans * config.plan_size,
        seconds=float(last) - first,
        submit_seconds=submitted - first,
        controller_mib=memory["controller"],
        executor_mib=memory["executor"],
        cpu_percent=cpu,
        cpu_window_s=window,
    )


async def dispatch_only(stack: Stack, config: Config) -> Dispatch:
    """Submit everything with no executor; then start one and time until every task is done."""
    plans = math.ceil(config.steps / config.plan_size)
    bodies = [plan_body(config.plan_size, f"bench {k}") for k in range(plans)]
    # One warm-up request (it stays queued and is dispatched with the rest).
    async with _client(stack, 1) as client:
        await _submit_one(client, plan_body(1, "warm-up"))
    first, submitted, _ = await submit_plans(stack, bodies, config.submitters)
    total = 1 + plans * config.plan_size
    stack.measuring()  # before the executor exists: it is not profiled in this scenario
    started = time.time()
    stack.start_executor()
    await wait_finished(stack, 1 + plans, within=_deadline(config.steps))
    first_lease, last = await _one_row(
        stack,
        "SELECT extract(epoch FROM (SELECT min(started_at) FROM steps)),"
        " extract(epoch FROM (SELECT max(finished_at) FROM tasks))",
    )
    await check_all_succeeded(stack, total)
    return Dispatch(
        steps=total,
        submitted=plans * config.plan_size,
        submit_seconds=submitted - first,
        wall_seconds=float(last) - started,
        lease_seconds=float(last) - float(first_lease),
    )


async def latency(stack: Stack, config: Config) -> Latency:
    """Open loop: single-step tasks sent at t0 + i/rate whatever the answers; the time the
    executor's connector started (the `clock` tool's output) - send."""
    stack.start_executor()
    await _warm_up(stack)
    count = round(config.rate * config.latency_seconds)
    body = plan_body(1, "latency", tool="clock")
    sends: list[float] = [math.nan] * count
    rtts: list[float] = [math.nan] * count
    task_ids: list[str] = [""] * count
    loop = asyncio.get_running_loop()
    pids = {p.name: p.popen.pid for p in (stack.controller, stack.executor) if p}
    async with _client(stack, 100) as client:

        async def one(i: int) -> None:
            sends[i] = time.time()
            began = time.perf_counter()
            task_ids[i] = await _submit_one(client, body)
            rtts[i] = (time.perf_counter() - began) * 1000

        stack.measuring()
        cpu_before, cpu_began = cpu_snapshot(pids), time.time()
        start_loop, start_wall = loop.time() + 0.01, time.time() + 0.01
        in_flight = []
        for i in range(count):
            delay = start_loop + i / config.rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            in_flight.append(asyncio.create_task(one(i)))
        await asyncio.gather(*in_flight)
        cpu = cpu_shares(cpu_before, cpu_snapshot(pids), time.time() - cpu_began)
    await wait_finished(stack, 1 + count, within=_deadline(count))
    await check_all_succeeded(stack, 1 + count)
    async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT task_id, (output #>> '{}')::float8 FROM steps WHERE task_id = ANY(%s)",
            (task_ids,),
        )
        started = {task_id: float(at) for task_id, at in await cur.fetchall()}
    lags = [sends[i] - (start_wall + i / config.rate) for i in range(count)]
    return Latency(
        sent=count,
        latencies_ms=[(started[t] - s) * 1000 for t, s in zip(task_ids, sends, strict=True)],
        rtts_ms=rtts,
        max_send_lag_ms=max(lags) * 1000,
        elapsed_s=sends[-1] - sends[0],
        backlog_s=max(started.values()) - sends[-1],
        cpu_percent=cpu,
    )


async def due_at_once(stack: Stack, config: Config) -> DueAtOnce:
    """Every step scheduled for one instant, far enough ahead to submit them all first; how late
    each starts after it (the `clock` tool's output - the instant)."""
    stack.start_executor()
    await _warm_up(stack)
    plans = math.ceil(config.steps / config.plan_size)
    due = time.time() + 5 + config.steps / 1000  # submit runs at several thousand steps/s
    at = datetime.fromtimestamp(due, UTC).isoformat()
    bodies = [
        plan_body(config.plan_size, f"due {k}", tool="clock", run_at=at) for k in range(plans)
    ]
    first, submitted, ids = await submit_plans(stack, bodies, config.submitters)
    if submitted >= due:
        raise BenchError("submitting took longer than the margin before the due time")
    await wait_finished(stack, 1 + plans, within=_deadline(config.steps) + (due - time.time()))
    await check_all_succeeded(stack, 1 + plans * config.plan_size)
    async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (output #>> '{}')::float8 FROM steps WHERE task_id = ANY(%s)", (ids,)
        )
        started = [float(at) for (at,) in await cur.fetchall()]
    return DueAtOnce(
        steps=len(started),
        lateness_ms=[(s - due) * 1000 for s in started],
        submit_seconds=submitted - first,
    )
