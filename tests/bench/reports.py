"""`python -m tests.bench.reports`: what a report costs, in the controller and in Postgres.

The controller's components run in this process on a fresh Postgres database (no HTTP, no gRPC:
the reporting service alone). Each round submits N one-step tasks, leases them all, then reports
their results one call at a time, B results a call, through `ReportingService.report`, the
service the executors' ReportResults reaches. This process's CPU and every Postgres process's
CPU (from /proc) over the reports, divided by the results, are printed as medians of the rounds,
for B = 1 (one submitter's load: each report alone) and B = 16 (eight submitters': a batch).
Sizes: AGENT_REACH_BENCH_REPORTS (results a round, default 1600), AGENT_REACH_BENCH_REPEATS (5),
AGENT_REACH_BENCH_POSTGRES (admin URL).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import psycopg
import uvloop

from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.intake import SubmitInput
from tests.bench.machine import header_lines, postgres_cpu_seconds
from tests.bench.scenarios import fresh_database
from tests.integration.stack import components_for, ok, write_tools

BODY = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}}]}
BATCHES = (1, 16)


async def _round(c: Components, url: str, results: int, batch: int) -> tuple[float, float]:
    """(controller µs, Postgres µs) of CPU per result over one round's reports."""
    plan = parse_plan(BODY, c.catalog)
    for _ in range(results):
        await c.intake.submit(SubmitInput(plan=plan, request=BODY))
    leased: list[StepRow] = []
    while len(leased) < results:
        leased += await c.leasing.claim(executor_id="bench", connectors=["echo"], limit=100)
    calls = [leased[i : i + batch] for i in range(0, len(leased), batch)]
    # Open until the round is measured: a backend that exits takes its CPU out of the sum.
    with psycopg.connect(url, autocommit=True) as analyst:
        analyst.execute("ANALYZE tasks, steps, events")
        cpu, pg = time.process_time(), postgres_cpu_seconds()
        for call in calls:
            acks = await c.reporting.report(
                executor_id="bench", results=[ok(step, {"n": 1}) for step in call]
            )
            if not all(a.accepted for a in acks):
                raise RuntimeError(f"a report was refused: {acks}")
        per = 1e6 / len(leased)
        return (time.process_time() - cpu) * per, (postgres_cpu_seconds() - pg) * per


async def _measure(admin_url: str, results: int, repeats: int) -> None:
    with fresh_database(admin_url) as url, tempfile.TemporaryDirectory() as tmp:
        async with components_for(url, write_tools(Path(tmp)), migrate=True) as c:
            await _round(c, url, 100, 1)  # warm-up: prepared statements, caches
            figures: dict[int, list[tuple[float, float]]] = {b: [] for b in BATCHES}
            for _ in range(repeats):
                for batch in BATCHES:
                    figures[batch].append(await _round(c, url, results, batch))
    for batch, rounds in figures.items():
        controller = statistics.median(r[0] for r in rounds)
        postgres = statistics.median(r[1] for r in rounds)
        print(
            f"{batch:>3} result(s) a report: controller {controller:5.0f} µs, "
            f"Postgres {postgres:5.0f} µs of CPU per result"
        )


def main() -> None:
    admin_url = os.environ.get(
        "AGENT_REACH_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    results = int(os.environ.get("AGENT_REACH_BENCH_REPORTS", "1600"))
    repeats = int(os.environ.get("AGENT_REACH_BENCH_REPEATS", "5"))
    for line in header_lines(admin_url):
        print(f"# {line}")
    print(f"# reports of one-step tasks, {results} results a round, medians of {repeats} rounds")
    uvloop.run(_measure(admin_url, results, repeats))


if __name__ == "__main__":
    main()
