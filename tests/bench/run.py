"""`make bench`: end-to-end throughput, dispatch-only throughput, submit→start latency, memory.

Every run starts from a fresh Postgres database and fresh controller and executor processes.
Sizes: AGENT_REACH_BENCH_STEPS (default 10000), AGENT_REACH_BENCH_REPEATS (3),
AGENT_REACH_BENCH_SLOTS (executor slots, 64), AGENT_REACH_BENCH_SUBMITTERS (4),
AGENT_REACH_BENCH_RATE (latency test, steps/s: 100), AGENT_REACH_BENCH_LATENCY_SECONDS (10),
AGENT_REACH_BENCH_POSTGRES (admin URL), AGENT_REACH_BENCH_TRACING=1 (export every span over
OTLP to a receiver in this process, to measure what tracing costs; OTEL_TRACES_SAMPLER and
OTEL_TRACES_SAMPLER_ARG pass through to the processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from tests.bench.machine import header_lines
from tests.bench.scenarios import (
    BenchError,
    Config,
    Dispatch,
    DueAtOnce,
    Latency,
    Stack,
    Throughput,
    dispatch_only,
    due_at_once,
    latency,
    percentile,
    running_stack,
    throughput,
    write_bench_tools,
)
from tests.support.otlp import OtlpReceiver

T = TypeVar("T")

# The goals in BENCHMARKS.md ("Goals"): 2 vCPU, Postgres 15, load generator on the same cores.
BAR_THROUGHPUT = 5000
BAR_P50_MS, BAR_P99_MS = 3.4, 6.5
BAR_RSS_MIB = 150


def _env_int(name: str, default: int) -> int:
    value = int(os.environ.get(name, default))
    if value < 1:
        raise SystemExit(f"{name} must be at least 1")
    return value


def config_from_env() -> Config:
    return Config(
        admin_url=os.environ.get(
            "AGENT_REACH_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        steps=_env_int("AGENT_REACH_BENCH_STEPS", 10_000),
        repeats=_env_int("AGENT_REACH_BENCH_REPEATS", 3),
        slots=_env_int("AGENT_REACH_BENCH_SLOTS", 64),
        submitters=_env_int("AGENT_REACH_BENCH_SUBMITTERS", 4),
        rate=float(os.environ.get("AGENT_REACH_BENCH_RATE", "100")),
        latency_seconds=float(os.environ.get("AGENT_REACH_BENCH_LATENCY_SECONDS", "10")),
    )


def say(*lines: str) -> None:
    print(*lines, sep="\n", flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _repeat(
    config: Config,
    workdir: Path,
    tools: Path,
    name: str,
    measure: Callable[[Stack, Config], Any],
    describe: Callable[[T], str],
) -> list[T]:
    results: list[T] = []
    for r in range(config.repeats):
        with running_stack(config, workdir / f"{name}-{r + 1}", tools) as stack:
            result: T = asyncio.run(measure(stack, config))
        results.append(result)
        say(f"  run {r + 1}: {describe(result)}")
    return results


def _mib(pair: tuple[float, float] | None) -> str:
    return f"{pair[0]:.0f} MiB (peak {pair[1]:.0f})" if pair else "gone"


def _cpu(shares: dict[str, float]) -> str:
    return "CPU (% of one core): " + ", ".join(f"{n} {v:.0f}%" for n, v in shares.items())


def describe_throughput(t: Throughput) -> str:
    return (
        f"{t.steps:,} steps in {t.seconds:.2f} s = {t.rate:,.0f} steps/s"
        f" (submitting took {t.submit_seconds:.2f} s)\n"
        f"         RSS controller {_mib(t.controller_mib)}, executor {_mib(t.executor_mib)};"
        f" {_cpu(t.cpu_percent)}"
    )


def describe_dispatch(d: Dispatch) -> str:
    return (
        f"submit {d.submitted:,} steps in {d.submit_seconds:.2f} s = {d.submit_rate:,.0f} steps/s;"
        f" dispatch {d.steps:,}: {d.wall_seconds:.2f} s from executor start = "
        f"{d.wall_rate:,.0f}/s, {d.lease_seconds:.2f} s from first lease = {d.lease_rate:,.0f}/s"
    )


def describe_latency(lat: Latency) -> str:
    lats, rtts = lat.latencies_ms, lat.rtts_ms
    return (
        f"{lat.sent:,} tasks in {lat.elapsed_s:.2f} s (max send lag {lat.max_send_lag_ms:.1f} ms);"
        f" submit->start p50 {percentile(lats, 50):.1f} / p99 {percentile(lats, 99):.1f}"
        f" / max {max(lats):.1f} ms; submit RTT p50 {percentile(rtts, 50):.1f}"
        f" / p99 {percentile(rtts, 99):.1f} ms\n         last step started"
        f" {1000 * lat.backlog_s:,.0f} ms after the last send; {_cpu(lat.cpu_percent)}"
    )


def describe_due(d: DueAtOnce) -> str:
    late = d.lateness_ms
    return (
        f"{d.steps:,} steps due at one instant (submitted in {d.submit_seconds:.2f} s): start"
        f" after it p50 {percentile(late, 50):,.0f} / p99 {percentile(late, 99):,.0f}"
        f" / max {max(late):,.0f} ms"
    )


def _row(
    label: str,
    values: Sequence[float],
    fmt: str,
    bar: str,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
) -> str:
    """One line: label, median, every run, and the bar with whether the median meets it."""
    runs = " ".join(format(v, fmt) for v in values)
    middle = median(values)
    verdict = ""
    if at_least is not None:
        verdict = "MEETS " if middle >= at_least else f"MISSES ({middle / at_least:.0%} of) "
    if at_most is not None:
        verdict = "MEETS " if middle <= at_most else f"MISSES ({middle / at_most:.1f}x) "
    return f"{label:<42} {format(middle, fmt):>8}   {runs:<22} {verdict}{bar}".rstrip()


def summary(
    config: Config,
    tps: list[Throughput],
    dps: list[Dispatch],
    lats: list[Latency],
    dues: list[DueAtOnce],
) -> list[str]:
    def rss(pick: Callable[[Throughput], tuple[float, float] | None]) -> list[float]:
        return [m[0] for m in map(pick, tps) if m]

    lines = [
        f"{'figure':<42} {'median':>8}   {'runs':<22} bar (BENCHMARKS.md)",
        _row(
            "e2e throughput, steps/s",
            [t.rate for t in tps],
            ",.0f",
            f">= {BAR_THROUGHPUT:,} goal; Celery 696, procrastinate 416 tasks/s",
            at_least=BAR_THROUGHPUT,
        ),
        _row(
            "dispatch only, from first lease, /s",
            [d.lease_rate for d in dps],
            ",.0f",
            f">= {BAR_THROUGHPUT:,} goal; Celery 696, procrastinate 416",
            at_least=BAR_THROUGHPUT,
        ),
        _row("dispatch only, from executor start, /s", [d.wall_rate for d in dps], ",.0f", ""),
        _row("submit only (no executor), steps/s", [d.submit_rate for d in dps], ",.0f", ""),
        _row(
            f"submit->start p50 @{config.rate:.0f}/s, ms",
            [percentile(x.latencies_ms, 50) for x in lats],
            ".1f",
            f"<= {BAR_P50_MS} goal; Celery 3.4, procrastinate 4.0",
            at_most=BAR_P50_MS,
        ),
        _row(
            f"submit->start p99 @{config.rate:.0f}/s, ms",
            [percentile(x.latencies_ms, 99) for x in lats],
            ".1f",
            f"<= {BAR_P99_MS} goal; Celery 4.5, procrastinate 6.5",
            at_most=BAR_P99_MS,
        ),
        _row("submit->start max, ms", [max(x.latencies_ms) for x in lats], ".1f", ""),
        _row("submit HTTP RTT p50, ms", [percentile(x.rtts_ms, 50) for x in lats], ".1f", ""),
        _row("submit HTTP RTT p99, ms", [percentile(x.rtts_ms, 99) for x in lats], ".1f", ""),
        _row(
            f"{config.steps:,} due at once: lateness p99, ms",
            [percentile(d.lateness_ms, 99) for d in dues],
            ",.0f",
            "",
        ),
    ]
    for name in ("controller", "executor"):
        lines.append(
            _row(
                f"{name} CPU per step (throughput), us",
                [t.cpu_us_per_step(name) for t in tps],
                ",.0f",
                "",
            )
        )
    if ctl := rss(lambda t: t.controller_mib):
        lines.append(
            _row("controller RSS after throughput, MiB", ctl, ".0f", "< 150", at_most=BAR_RSS_MIB)
        )
    if exe := rss(lambda t: t.executor_mib):
        lines.append(
            _row("executor RSS after throughput, MiB", exe, ".0f", "< 150", at_most=BAR_RSS_MIB)
        )
    return lines


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    del frame
    raise SystemExit(128 + signum)  # unwinds through every `finally`: processes and databases


def main() -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    config = config_from_env()
    began = time.monotonic()
    say("Agent-Reach bench", *header_lines(config.admin_url))
    plans = -(-config.steps // config.plan_size)
    say(
        f"setup     1 controller + 1 executor ({config.slots} slots), fresh database and processes"
        f" per run, {config.repeats} repeats; tool `noop` on the echo connector"
        " (maximum_attempts 1, idempotent)",
        "",
    )
    with contextlib.ExitStack() as stack:
        if os.environ.get("AGENT_REACH_BENCH_TRACING") == "1":
            # Tracing on: every process exports each span over OTLP/HTTP to a real receiver.
            receiver = stack.enter_context(OtlpReceiver())
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.url
            sampler = os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on")
            if "ratio" in sampler:
                sampler += f" {os.environ.get('OTEL_TRACES_SAMPLER_ARG', '1.0')}"
            say(f"tracing   on: OTLP/HTTP to a receiver at {receiver.url}; sampler {sampler}", "")
        else:
            os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
            os.environ.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
            say("tracing   off (AGENT_REACH_BENCH_TRACING=1 turns it on)", "")
        return _measure(config, began, plans)


def _measure(config: Config, began: float, plans: int) -> int:
    with tempfile.TemporaryDirectory(prefix="reach-bench-") as tmp:
        workdir = Path(tmp)
        tools = write_bench_tools(workdir)
        try:
            say(
                f"== end-to-end throughput: {plans} plans of {config.plan_size} independent steps,"
                f" {config.submitters} concurrent submitters, executor running;"
                " first submit -> every task terminal"
            )
            tps = _repeat(config, workdir, tools, "throughput", throughput, describe_throughput)
            say(f"  median: {median([t.rate for t in tps]):,.0f} steps/s", "")
            say(
                "== dispatch only: the same plans submitted with no executor, then one executor"
                " started; until every task is terminal"
            )
            dps = _repeat(config, workdir, tools, "dispatch", dispatch_only, describe_dispatch)
            say(
                f"  median: {median([d.lease_rate for d in dps]):,.0f} steps/s from first lease,"
                f" {median([d.wall_rate for d in dps]):,.0f} from executor start",
                "",
            )
            say(
                f"== submit->start latency: open loop, {config.rate:.0f} single-step tasks/s for"
                f" {config.latency_seconds:.0f} s; executor connector start - client send time"
            )
            lats = _repeat(config, workdir, tools, "latency", latency, describe_latency)
            say(
                f"  median: p50 {median([percentile(x.latencies_ms, 50) for x in lats]):.1f} /"
                f" p99 {median([percentile(x.latencies_ms, 99) for x in lats]):.1f} ms",
                "",
            )
            say(
                f"== due at once: {config.steps:,} scheduled steps (the `clock` tool) all due at"
                " one instant a few seconds after the submits; start - that instant"
            )
            dues = _repeat(config, workdir, tools, "due", due_at_once, describe_due)
            say(
                f"  median: p99 {median([percentile(d.lateness_ms, 99) for d in dues]):,.0f} ms",
                "",
            )
        except BenchError as exc:
            say(f"bench failed: {exc}")
            return 1
    say(
        f"== summary: median of {config.repeats}; load generator, controller, executor and"
        " Postgres share the machine",
        *summary(config, tps, dps, lats, dues),
        "",
        f"bench took {time.monotonic() - began:.0f} s",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
