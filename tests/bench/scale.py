"""`make bench-scale`: does a step cost the same with 10 k or 1 M steps waiting behind it?

For each backlog size, on a fresh database and fresh processes: one plan of 100 steps is
submitted through the API with no executor running, and its task and step rows are copied by SQL
into `size / 100` tasks (the rows exactly as the API wrote them, under new ids; a million submits
through the API would take most of an hour here). Then one executor starts and the time and the
controller's CPU to finish the first MEASURED steps are taken, the rest of the backlog still
queued behind them. A queue that grows must not make each claim, report or advance dearer.

Sizes: AGENT_REACH_BENCH_SCALE_SIZES (steps, default "10000,100000,1000000"),
AGENT_REACH_BENCH_SCALE_MEASURED (default 5000), AGENT_REACH_BENCH_REPEATS (default 1; the median
is printed), AGENT_REACH_BENCH_SLOTS (64), AGENT_REACH_BENCH_POSTGRES (admin URL).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from tests.bench.machine import cpu_shares, cpu_snapshot, header_lines
from tests.bench.scenarios import (
    BenchError,
    Config,
    Stack,
    _client,
    _submit_one,
    plan_body,
    running_stack,
    write_bench_tools,
)

PLAN = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    backlog: int  # steps queued when the executor started
    measured: int
    seconds: float  # first lease -> the measured-th step succeeded
    controller_cpu_s: float
    seed_seconds: float

    @property
    def rate(self) -> float:
        return self.measured / self.seconds

    @property
    def cpu_us_per_step(self) -> float:
        return 1e6 * self.controller_cpu_s / self.measured


async def _columns(conn: psycopg.AsyncConnection, table: str) -> list[str]:
    cur = await conn.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_name = %s ORDER BY ordinal_position",
        (table,),
    )
    return [name for (name,) in await cur.fetchall()]


# A task id is a UUID's text: each copy takes one derived from the template's and its number.
_NEW_ID = "md5(t.task_id || '-' || g)::uuid::text"


async def _copy(
    conn: psycopg.AsyncConnection, table: str, derived: dict[str, str], copies: int, template: str
) -> None:
    """Insert `copies` copies of the template task's rows of `table`: every column as it is but
    those `derived` (SQL over the row `t` and the copy number `g`) and the generated id."""
    kept = [c for c in await _columns(conn, table) if c != "id" and c not in derived]
    await conn.execute(
        sql.SQL(
            "INSERT INTO {table} ({cols}) SELECT {values}"
            " FROM {table} AS t CROSS JOIN generate_series(1, %s) AS g WHERE t.task_id = %s"
            " ORDER BY g, t.ctid"
        ).format(
            table=sql.Identifier(table),
            cols=sql.SQL(", ").join(map(sql.Identifier, [*derived, *kept])),
            values=sql.SQL(", ").join(
                [*map(sql.SQL, derived.values()), *(sql.Identifier("t", c) for c in kept)]
            ),
        ),
        (copies, template),
    )


async def seed(stack: Stack, backlog: int) -> float:
    """Queue `backlog` ready steps: one plan through the API, copied by SQL. Seconds taken."""
    began = time.monotonic()
    async with _client(stack, 1) as client:
        template = await _submit_one(client, plan_body(PLAN, "scale template"))
    copies = backlog // PLAN - 1
    async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
        await _copy(conn, "tasks", {"task_id": _NEW_ID}, copies, template)
        step_key = f"{_NEW_ID} || ':' || t.step_id"
        await _copy(
            conn, "steps", {"task_id": _NEW_ID, "idempotency_key": step_key}, copies, template
        )
        # What autovacuum would do soon after a million inserts, done now: measured is a queue at
        # rest, not one being vacuumed meanwhile.
        await conn.execute("VACUUM (ANALYZE) tasks")
        await conn.execute("VACUUM (ANALYZE) steps")
        cur = await conn.execute("SELECT count(*) FROM steps WHERE status = 'ready'")
        row = await cur.fetchone()
    if row is None or row[0] != backlog:
        raise BenchError(f"expected {backlog:,} ready steps after seeding, found {row}")
    return time.monotonic() - began


async def measure(stack: Stack, backlog: int, measured: int) -> Level:
    seeded = await seed(stack, backlog)
    pids = {"controller": stack.controller.popen.pid}
    before, began = cpu_snapshot(pids), time.time()
    stack.start_executor()
    deadline = time.monotonic() + 60 + measured / 20
    async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
        while True:
            cur = await conn.execute("SELECT count(*) FROM steps WHERE status = 'succeeded'")
            row = await cur.fetchone()
            if row is not None and row[0] >= measured:
                break
            stack.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{measured:,} steps did not finish in time")
            await asyncio.sleep(0.05)
        reached = time.time()
        after = cpu_snapshot(pids)
        cur = await conn.execute("SELECT extract(epoch FROM min(started_at)) FROM steps")
        first = await cur.fetchone()
    if first is None or first[0] is None:
        raise BenchError("no step was leased")
    share = cpu_shares(before, after, reached - began)
    return Level(
        backlog=backlog,
        measured=measured,
        seconds=reached - float(first[0]),
        controller_cpu_s=share["controller"] / 100 * (reached - began),
        seed_seconds=seeded,
    )


def main() -> int:
    wanted = os.environ.get("AGENT_REACH_BENCH_SCALE_SIZES", "10000,100000,1000000")
    sizes = [int(size) for size in wanted.split(",")]
    measured = int(os.environ.get("AGENT_REACH_BENCH_SCALE_MEASURED", "5000"))
    repeats = int(os.environ.get("AGENT_REACH_BENCH_REPEATS", "1"))
    admin = os.environ.get(
        "AGENT_REACH_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    if any(size < max(measured, 2 * PLAN) or size % PLAN for size in sizes):
        raise SystemExit(f"each size must be a multiple of {PLAN} and at least MEASURED")
    config = Config(
        admin_url=admin,
        steps=measured,
        repeats=repeats,
        slots=int(os.environ.get("AGENT_REACH_BENCH_SLOTS", "64")),
        submitters=1,
    )
    print(*header_lines(admin), sep="\n", flush=True)
    print(f"scale: the first {measured:,} of a backlog of queued steps, one executor", flush=True)
    medians: list[tuple[int, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="reach-scale-") as tmp:
        workdir = Path(tmp)
        tools = write_bench_tools(workdir)
        for size in sizes:
            runs = []
            for r in range(repeats):
                with running_stack(config, workdir / f"{size}-{r + 1}", tools) as stack:
                    level = asyncio.run(measure(stack, size, measured))
                runs.append(level)
                print(
                    f"  backlog {size:>9,}: seeded in {level.seed_seconds:5.1f} s;"
                    f" {level.rate:7,.0f} steps/s, controller CPU {level.cpu_us_per_step:6,.0f} us"
                    " per step",
                    flush=True,
                )
            rate = statistics.median(lv.rate for lv in runs)
            cpu = statistics.median(lv.cpu_us_per_step for lv in runs)
            medians.append((size, rate, cpu))
    small, large = medians[0], medians[-1]
    print(
        f"largest / smallest backlog ({large[0]:,} / {small[0]:,}):"
        f" steps/s x{large[1] / small[1]:.2f}, controller CPU per step x{large[2] / small[2]:.2f}"
        " (flat is x1.00)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
