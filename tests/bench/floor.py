"""`python -m tests.bench.floor`: our controller's CPU per task beside a skeleton controller's.

The skeleton is a controller built on the same parts as ours that does only what no durable
task system can skip. Both take the load `../shared/peers/cpu.py` gives: one-step no-op tasks
POSTed one by one per submitter (threads, each on its own keep-alive `http.client` connection),
until all have succeeded. What the skeleton does per task, and nothing else:

- HTTP (uvicorn, httptools, uvloop; a bare ASGI callable, no framework): read the body, check a
  bearer key, parse the JSON, answer 202 once the task is committed.
- Postgres (psycopg 3, async): the submits that arrive while a commit is in flight share the next
  one (our `GroupCommit`). One statement stores a task row and its step row, and hands the
  step straight to a waiting poll when there is one (our hand-off). A poll that finds nothing
  handed claims with one statement (`FOR UPDATE SKIP LOCKED`); a report ends its steps and their
  tasks with one statement.
- gRPC (grpc.aio, unary, JSON bodies, no interceptors): the executor's long poll and its report.

No events, audit, idempotency keys, plan validation, fencing, sessions, tracing, metrics, logs,
rate limits or approvals: a floor, not a design. The floor is what Python, uvicorn, grpc.aio and
psycopg cost; the gap between it and `reach controller` (with `reach executor`, 64 slots) under
the same load is what our guarantees and our code cost.

Each round starts each stack afresh on a fresh database, warms it with 500 tasks, then measures
N; the two stacks take turns, so the machine's drift falls on both. Printed per round and as
medians: tasks/s and CPU per task (ms) of the controller, the executor, Postgres (all its
processes) and the whole machine, then our controller's CPU over the skeleton's. Loads:
AGENT_REACH_BENCH_FLOOR_CLIENTS (submitters, default "1,8"); AGENT_REACH_BENCH_FLOOR_RATE (tasks/s
of all submitters together; unset, each submits as soon as it is answered). A faster stack
batches more and finds its processes awake more often, so unpaced it also pays less per task for
being faster: paced at a rate both reach, the two compare at equal load. Last, the latency the
peers measure: one submitter at a steady AGENT_REACH_BENCH_FLOOR_LATENCY_RATE tasks/s (default
50; 0 skips it), 300 tasks a round whose step reports when the executor started it; the median
of start less send, per stack. Sizes:
AGENT_REACH_BENCH_FLOOR_TASKS (N, default 3000), AGENT_REACH_BENCH_REPEATS (rounds, 3),
AGENT_REACH_BENCH_POSTGRES (admin URL).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
import psycopg
import uvicorn
import uvloop

from agent_reach_controller.services.groups import GroupCommit
from tests.bench.machine import cpu_seconds, header_lines, machine_cpu_seconds, postgres_cpu_seconds
from tests.bench.scenarios import Config, fresh_database, running_stack, write_bench_tools

HTTP_PORT, GRPC_PORT = 18791, 18792
KEY = b"Bearer floor-key"
BODY = orjson.dumps({"steps": [{"step_id": "s", "tool": "noop", "args": {}}]})
SLOTS = 64
LATENCY_TASKS = 300
# How long a poll waits for a step (the test shortens it, so that polls give up while submits
# are handing them steps).
POLL_WAIT = float(os.environ.get("AGENT_REACH_BENCH_FLOOR_POLL_WAIT", "1"))

SCHEMA = """
CREATE TABLE tasks (
    id bigint PRIMARY KEY, status text NOT NULL, request jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), finished_at timestamptz);
CREATE TABLE steps (
    id bigint PRIMARY KEY, task_id bigint NOT NULL REFERENCES tasks, tool text NOT NULL,
    args jsonb NOT NULL, status text NOT NULL, holder text, lease_expires timestamptz,
    result jsonb);
CREATE INDEX steps_ready ON steps (id) WHERE status = 'ready';
"""

# One statement per group of submits: tasks, then their steps, leased to a waiting poll's holder
# where the group's row says so. The rows: [[id, request, tool, args, holder or null], ...].
SUBMIT = """
WITH rows AS (SELECT r->>0 AS id, r->1 AS request, r->>2 AS tool, r->3 AS args, r->>4 AS holder
              FROM jsonb_array_elements(%(rows)s::jsonb) AS r),
     t AS (INSERT INTO tasks (id, status, request)
           SELECT id::bigint, 'running', request FROM rows)
INSERT INTO steps (id, task_id, tool, args, status, holder, lease_expires)
SELECT id::bigint, id::bigint, tool, args,
       CASE WHEN holder IS NULL THEN 'ready' ELSE 'leased' END,
       holder, CASE WHEN holder IS NULL THEN NULL ELSE now() + interval '30 s' END
FROM rows
"""

CLAIM = """
UPDATE steps SET status = 'leased', holder = %(holder)s, lease_expires = now() + interval '30 s'
WHERE id IN (SELECT id FROM steps WHERE status = 'ready' ORDER BY id
             LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING id, tool, args
"""

REPORT = """
WITH done AS (
    UPDATE steps SET status = 'succeeded', result = r.result
    FROM (SELECT (e->>0)::bigint AS id, e->1 AS result
          FROM jsonb_array_elements(%(results)s::jsonb) AS e) AS r
    WHERE steps.id = r.id AND steps.status = 'leased' AND steps.holder = %(holder)s
    RETURNING steps.task_id)
UPDATE tasks SET status = 'succeeded', finished_at = now()
WHERE id IN (SELECT task_id FROM done)
"""


class Skeleton:
    """The controller's state: three connections (submits, claims, reports) and waiting polls."""

    def __init__(self, submits: Any, claims: Any, reports: Any) -> None:
        self.submits, self.claims, self.reports = submits, claims, reports
        self.next_id = int(time.time() * 1000) << 20
        self.waiting: list[tuple[str, asyncio.Future[list[list[Any]]]]] = []
        self.queued = asyncio.Event()
        # Submits that arrive while a commit is in flight share the next one (ours, as it is).
        self.group: GroupCommit[tuple[int, Any, str, Any], None] = GroupCommit(
            lambda item: self._store([item]), self._store
        )

    async def _store(self, items: Sequence[tuple[int, Any, str, Any]]) -> list[None]:
        handed: list[tuple[asyncio.Future[list[list[Any]]], list[Any]]] = []
        rows = []
        for step_id, request, tool, args in items:
            holder = None
            if self.waiting:
                holder, poll = self.waiting.pop(0)
                handed.append((poll, [step_id, tool, args]))
            rows.append([str(step_id), request, tool, args, holder])
        try:
            await self.submits.execute(SUBMIT, {"rows": orjson.dumps(rows).decode()})
        except BaseException:
            for poll, _ in handed:  # not written: the poll claims for itself
                poll.set_result([])
            raise
        for poll, step in handed:
            poll.set_result([step])
        if len(handed) < len(rows):
            self.queued.set()
        return [None] * len(rows)

    async def submit(self, body: bytes) -> int:
        plan = orjson.loads(body)
        step = plan["steps"][0]
        self.next_id += 1
        task_id = self.next_id
        await self.group((task_id, plan, step["tool"], step.get("args", {})))
        return task_id

    async def poll(self, holder: str, limit: int) -> list[list[Any]]:
        deadline = asyncio.get_running_loop().time() + POLL_WAIT
        while True:
            self.queued.clear()
            cur = await self.claims.execute(CLAIM, {"holder": holder, "limit": limit})
            rows = await cur.fetchall()
            if rows:
                return [[i, tool, args] for i, tool, args in rows]
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return []
            handed: asyncio.Future[list[list[Any]]] = asyncio.get_running_loop().create_future()
            self.waiting.append((holder, handed))
            queued = asyncio.ensure_future(self.queued.wait())
            await asyncio.wait([handed, queued], timeout=remaining, return_when="FIRST_COMPLETED")
            queued.cancel()
            if any(f is handed for _, f in self.waiting):  # nothing handed yet: withdraw
                self.waiting = [(h, f) for h, f in self.waiting if f is not handed]
                continue
            steps = await handed  # a group took it: its step comes once committed
            if steps:
                return steps

    async def report(self, holder: str, results: list[list[Any]]) -> None:
        await self.reports.execute(
            REPORT, {"holder": holder, "results": orjson.dumps(results).decode()}
        )


def _http_app(skeleton: Skeleton) -> Callable[..., Awaitable[None]]:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if (b"authorization", KEY) not in scope["headers"]:
            status, answer = 401, b'{"title":"unauthorized"}'
        elif scope["method"] != "POST" or scope["path"] != "/v1/tasks":
            status, answer = 404, b'{"title":"not found"}'
        else:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            task_id = await skeleton.submit(body)
            status, answer = 202, orjson.dumps({"task_id": str(task_id), "status": "running"})
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


async def _serve(url: str) -> None:
    submits, claims, reports = [
        await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(3)
    ]
    skeleton = Skeleton(submits, claims, reports)

    async def poll(request: bytes, _context: Any) -> bytes:
        asked = orjson.loads(request)
        return orjson.dumps(await skeleton.poll(asked["holder"], asked["limit"]))

    async def report(request: bytes, _context: Any) -> bytes:
        said = orjson.loads(request)
        await skeleton.report(said["holder"], said["results"])
        return b"{}"

    handler = grpc.method_handlers_generic_handler(
        "floor.Executor",
        {
            "Poll": grpc.unary_unary_rpc_method_handler(poll),
            "Report": grpc.unary_unary_rpc_method_handler(report),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{GRPC_PORT}")
    await server.start()
    config = uvicorn.Config(
        _http_app(skeleton),
        host="127.0.0.1",
        port=HTTP_PORT,
        log_config=None,
        access_log=False,
        lifespan="off",
        loop="none",
        http="httptools",
        server_header=False,
    )
    await uvicorn.Server(config).serve()


async def _execute() -> None:
    """The skeleton executor: one long poll for as many steps as it has free slots, the no-op
    run at once, one report in flight carrying every result that finished meanwhile."""
    holder = f"floor-{os.getpid()}"
    results: list[list[Any]] = []
    ready = asyncio.Event()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{GRPC_PORT}") as channel:
        poll = channel.unary_unary("/floor.Executor/Poll")
        report = channel.unary_unary("/floor.Executor/Report")

        async def reporter() -> None:
            nonlocal results
            while True:
                await ready.wait()
                ready.clear()
                batch, results = results, []
                if batch:
                    await report(orjson.dumps({"holder": holder, "results": batch}))

        task = asyncio.create_task(reporter())
        try:
            while True:
                steps = orjson.loads(await poll(orjson.dumps({"holder": holder, "limit": SLOTS})))
                for step_id, _tool, _args in steps:
                    results.append([step_id, time.time()])  # its result: when it started
                if steps:
                    ready.set()
        finally:
            task.cancel()


@dataclass(frozen=True, slots=True)
class Target:
    """A running controller and executor, and how to submit to it."""

    name: str
    port: int
    authorization: str
    controller: int  # pids
    executor: int
    database_url: str
    timed: bytes  # a one-step task whose step's output is when it started (executor's clock)
    started: str  # SQL: (task id, started) of the steps of the task ids given as %(ids)s


@contextlib.contextmanager
def skeleton(admin_url: str) -> Iterator[Target]:
    me = [sys.executable, "-m", "tests.bench.floor"]
    with fresh_database(admin_url) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SCHEMA)
        procs = [subprocess.Popen([*me, "--serve", url])]
        try:
            _wait_for_http(HTTP_PORT, time.monotonic() + 30)
            procs.append(subprocess.Popen([*me, "--execute"]))
            yield Target(
                "skeleton",
                HTTP_PORT,
                KEY.decode(),
                procs[0].pid,
                procs[1].pid,
                url,
                timed=BODY,
                started="SELECT task_id::text, (result #>> '{}')::float8 FROM steps "
                "WHERE task_id = ANY(%(ids)s::bigint[])",
            )
        finally:
            for proc in reversed(procs):
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


@contextlib.contextmanager
def ours(admin_url: str, workdir: Path) -> Iterator[Target]:
    config = Config(admin_url=admin_url, steps=0, repeats=1, slots=SLOTS, submitters=1)
    with running_stack(config, workdir, write_bench_tools(workdir.parent)) as stack:
        executor = stack.start_executor()
        port = int(stack.controller.info["http"].rsplit(":", 1)[1])
        yield Target(
            "reach controller",
            port,
            f"Bearer {stack.cluster.api_key}",
            stack.controller.popen.pid,
            executor.popen.pid,
            stack.database_url,
            timed=orjson.dumps({"steps": [{"step_id": "s", "tool": "clock", "args": {}}]}),
            started="SELECT task_id, (output #>> '{}')::float8 FROM steps "
            "WHERE task_id = ANY(%(ids)s)",
        )


def _submitter(
    port: int, authorization: str, n: int, errors: list[str], every: float | None = None
) -> None:
    """Submit n tasks one by one; with `every`, one every `every` seconds (none left behind)."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Authorization": authorization, "Content-Type": "application/json"}
    due = time.monotonic()
    for _ in range(n):
        if every is not None:
            due += every
            if (pause := due - time.monotonic()) > 0:
                time.sleep(pause)
        conn.request("POST", "/v1/tasks", BODY, headers)
        answer = conn.getresponse()
        text = answer.read()
        if answer.status != 202:
            errors.append(f"{answer.status} {text[:200]!r}")
            return


def _succeeded(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM tasks WHERE status = 'succeeded'").fetchone()
        return int(row[0]) if row else 0


def _wait_for_http(port: int, deadline: float) -> None:
    while True:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("the skeleton controller did not start") from None
            time.sleep(0.05)


def _load(
    target: Target, n: int, clients: int, *, rate: float | None = None, within: float = 300
) -> tuple[float, ...]:
    """Submit n tasks from `clients` threads (all together at most `rate` a second, if given) and
    wait until all succeeded: (tasks/s, then ms of CPU per task of the controller, the executor,
    Postgres and the whole machine)."""
    base, errors = _succeeded(target.database_url), []
    parts = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]

    def cpu() -> tuple[float, ...]:
        return (
            cpu_seconds(target.controller),
            cpu_seconds(target.executor),
            postgres_cpu_seconds(),
            machine_cpu_seconds(),
        )

    before, start = cpu(), time.perf_counter()
    threads = [
        threading.Thread(
            target=_submitter,
            args=(target.port, target.authorization, k, errors, clients / rate if rate else None),
        )
        for k in parts
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + within
    while not errors and _succeeded(target.database_url) < base + n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{target.name}: not all of {n} tasks ended in {within:.0f} s")
        time.sleep(0.02)
    if errors:
        raise RuntimeError(f"{target.name}: a submit was refused: {errors[0]}")
    wall, after = time.perf_counter() - start, cpu()
    return (n / wall, *((b - a) * 1000 / n for a, b in zip(before, after, strict=True)))


def _latency(target: Target, n: int, rate: float) -> float:
    """One submitter sends n timed tasks at `rate` a second: the median, in ms, of each step's
    start (the executor's clock) less the moment its submit was sent."""
    conn = http.client.HTTPConnection("127.0.0.1", target.port)
    headers = {"Authorization": target.authorization, "Content-Type": "application/json"}
    sent: dict[str, float] = {}
    due = time.monotonic()
    for _ in range(n):
        due += 1 / rate
        if (pause := due - time.monotonic()) > 0:
            time.sleep(pause)
        at = time.time()
        conn.request("POST", "/v1/tasks", target.timed, headers)
        answer = conn.getresponse()
        text = answer.read()
        if answer.status != 202:
            raise RuntimeError(
                f"{target.name}: a submit was refused: {answer.status} {text[:200]!r}"
            )
        sent[orjson.loads(text)["task_id"]] = at
    deadline = time.monotonic() + 60
    with psycopg.connect(target.database_url, autocommit=True) as db:
        while True:
            rows = db.execute(target.started, {"ids": list(sent)}).fetchall()
            started = {str(task): at for task, at in rows if at is not None}
            if len(started) == n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.name}: {n - len(started)} timed tasks never started")
            time.sleep(0.05)
    return statistics.median((started[t] - at) * 1000 for t, at in sent.items())


def _line(name: str, row: Sequence[float]) -> str:
    rate, ctl, exe, pg, whole = row
    return (
        f"{name:>16}: {rate:6,.0f} tasks/s | CPU ms per task: controller {ctl:.2f}, "
        f"executor {exe:.2f}, postgres {pg:.2f}, machine {whole:.2f}"
    )


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        uvloop.run(_serve(sys.argv[2]))
        return
    if sys.argv[1:2] == ["--execute"]:
        uvloop.run(_execute())
        return
    admin = os.environ.get(
        "AGENT_REACH_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    tasks = int(os.environ.get("AGENT_REACH_BENCH_FLOOR_TASKS", "3000"))
    repeats = int(os.environ.get("AGENT_REACH_BENCH_REPEATS", "3"))
    loads = [int(c) for c in os.environ.get("AGENT_REACH_BENCH_FLOOR_CLIENTS", "1,8").split(",")]
    rate = float(os.environ.get("AGENT_REACH_BENCH_FLOOR_RATE", "0")) or None
    latency_rate = float(os.environ.get("AGENT_REACH_BENCH_FLOOR_LATENCY_RATE", "50"))
    print("\n".join(header_lines(admin)))
    paced = f", paced at {rate:g} tasks/s" if rate else ", each submitter as fast as it is answered"
    print(f"{tasks} one-step tasks a round{paced}; the two controllers in turn, {repeats} rounds")
    with tempfile.TemporaryDirectory() as tmp:
        for clients in loads:
            rows: dict[str, list[tuple[float, ...]]] = {}
            for round_ in range(repeats):
                for start in (
                    skeleton,
                    functools.partial(ours, workdir=Path(tmp) / f"{clients}-{round_}"),
                ):
                    with start(admin) as target:
                        _load(target, min(500, tasks), clients)  # warm-up, not counted
                        row = _load(target, tasks, clients, rate=rate)
                    rows.setdefault(target.name, []).append(row)
                    print(f"{clients} submitter(s), round {round_ + 1}: {_line(target.name, row)}")
            medians = {
                name: [statistics.median(c) for c in zip(*r, strict=True)]
                for name, r in rows.items()
            }
            print(f"{clients} submitter(s), medians of {repeats}:")
            for name, row in medians.items():
                print(f"  {_line(name, row)}")
            floor, real = medians["skeleton"], medians["reach controller"]
            print(
                f"  reach controller over the skeleton: controller CPU per task "
                f"x{real[1] / floor[1]:.2f}, tasks/s x{real[0] / floor[0]:.2f}",
                flush=True,
            )
        if latency_rate:
            _latencies(admin, Path(tmp), repeats, latency_rate)


def _latencies(admin: str, tmp: Path, repeats: int, rate: float) -> None:
    """p50 submit -> start, one submitter at a steady `rate`, both stacks in turn."""
    print(f"submit -> start, one submitter at {rate:g} tasks/s, {LATENCY_TASKS} tasks a round:")
    p50s: dict[str, list[float]] = {}
    for round_ in range(repeats):
        for start in (skeleton, functools.partial(ours, workdir=tmp / f"latency-{round_}")):
            with start(admin) as target:
                _load(target, 200, 1)  # warm-up, not counted
                p50 = _latency(target, LATENCY_TASKS, rate)
            p50s.setdefault(target.name, []).append(p50)
            print(f"  round {round_ + 1}: {target.name:>16}: p50 {p50:.2f} ms", flush=True)
    floor, real = (statistics.median(p50s[n]) for n in ("skeleton", "reach controller"))
    print(
        f"  medians of {repeats}: skeleton {floor:.2f} ms, reach controller {real:.2f} ms "
        f"(x{real / floor:.2f})",
        flush=True,
    )


if __name__ == "__main__":
    main()
