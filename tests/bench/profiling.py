"""`python -m tests.bench.profiling`: one end-to-end throughput run with both processes profiled.

Controller and executor run under `tests.bench.profiled` (a stack sampler by default; set
AGENT_REACH_BENCH_PROFILER=cprofile for cProfile); profiling starts after the warm-up. The report
gives, per process: where the main thread's busy time goes by area (the package or module of the
innermost frame), and our functions by inclusive share of busy time. The sampler's overhead is
small but not nil, and cProfile's is large (2-4x), so the rate printed here is not a benchmark
figure: use `make bench` for those. Sizes as in `tests.bench.run`; AGENT_REACH_BENCH_PROFILE_TOP
sets the number of rows (25); AGENT_REACH_BENCH_PROFILE_SCENARIO=latency profiles the open-loop
single-step submits instead of the throughput run; AGENT_REACH_BENCH_TRACING=1 exports every
span, as in `make bench`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from tests.bench.machine import REPO
from tests.bench.run import config_from_env, describe_latency, describe_throughput, say
from tests.bench.scenarios import (
    BenchError,
    Stack,
    latency,
    running_stack,
    throughput,
    write_bench_tools,
)
from tests.e2e.processes import Cluster, Proc
from tests.support.otlp import OtlpReceiver

# Frames of the process's own scaffolding: on every stack, so not informative.
SCAFFOLDING = ("tests/bench/profiled.py", "agent_reach_cli/", "agent_reach_executor/__main__.py")


class ProfiledCluster(Cluster):
    """Starts every `reach` process under `tests.bench.profiled`, writing NAME.prof."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        super().__init__(workdir, {**(env or {}), "PYTHONPATH": path})

    def _spawn(self, name: str, args: list[str]) -> Proc:
        log = self.workdir / f"{name}.log"
        profile = self.workdir / f"{name}.prof"
        with log.open("wb") as handle:
            popen = subprocess.Popen(
                [sys.executable, "-m", "tests.bench.profiled", str(profile), *args],
                cwd=self.workdir,
                env=self.env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = Proc(name=name, popen=popen, log=log)
        self.procs.append(proc)
        return proc


def start_profiling(stack: Stack) -> None:
    """SIGUSR1 to every profiled process: warm-up is over, start counting."""
    for proc in stack.cluster.procs:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGUSR1)


def area(filename: str) -> str:
    """Where a function lives: a site package, one of our modules, a stdlib module, a builtin."""
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    if filename.startswith(str(REPO)):
        return str(Path(filename).relative_to(REPO))
    if filename == "~":
        return "builtins (C)"
    return "stdlib " + Path(filename).stem


def _ours(frame: str) -> str | None:
    """'controller/…/store.py:change_step' for a frame of our code, None otherwise."""
    filename, _, function = frame.rpartition(":")
    if not filename.startswith(str(REPO)) or "site-packages" in filename:
        return None
    relative = str(Path(filename).relative_to(REPO))
    if any(part in relative for part in SCAFFOLDING):
        return None
    return f"{relative}:{function}"


def _idle(stack: list[str]) -> bool:
    """The main thread waits in the event loop's selector: the CPU went to another thread."""
    leaf = stack[-1] if stack else ""
    return leaf.endswith("selectors.py:select")


def report_samples(name: str, path: Path, top: int, *, steps: int) -> None:
    data = json.loads(path.read_text())
    interval = float(data["interval_s"])
    rows = [(list(r["stack"]), int(r["count"])) for r in data["stacks"]]
    total = sum(n for _, n in rows)
    busy_rows = [(stack, n) for stack, n in rows if not _idle(stack)]
    busy = sum(n for _, n in busy_rows)
    if not busy:
        say(f"no busy samples from {name}")
        return
    by_area: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, n in busy_rows:
        by_area[area(stack[-1].rpartition(":")[0])] += n
        for frame in {f for f in map(_ours, stack) if f}:
            inclusive[frame] += n
    say(
        "",
        f"===== {name}: {total:,} samples, one per {1000 * interval:.0f} ms of process CPU"
        f" (~{1e6 * total * interval / steps:.0f} us CPU per step); main thread busy in {busy:,}"
        f" ({100 * busy / total:.0f}%), the rest is other threads (gRPC) while it waits",
        "-- main-thread time by area of the innermost frame",
    )
    for where, n in by_area.most_common(top):
        say(f"  {100 * n / busy:5.1f}%  {where}")
    say("-- our functions, inclusive share of main-thread time")
    for frame, n in inclusive.most_common(top):
        say(f"  {100 * n / busy:5.1f}%  {frame}")
    sql: dict[str, int] = data.get("sql") or {}
    if sql:
        statements = sum(n for kind, n in sql.items() if not kind.startswith("COMMIT"))
        say(f"-- SQL through SQLAlchemy: {statements / steps:.2f} statements per step")
        for kind, n in sorted(sql.items(), key=lambda kv: -kv[1]):
            say(f"  {n / steps:6.3f}/step  {n:8,}  {kind}")


def report_cprofile(name: str, path: Path, top: int, *, steps: int) -> None:
    """Own time by area, then the hottest functions by own time."""
    stats = pstats.Stats(str(path))
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, object]]
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    by_area: dict[str, float] = {}
    executions = 0
    for (filename, _, function), (_, calls, own, _, _) in raw.items():
        by_area[area(filename)] = by_area.get(area(filename), 0.0) + own
        if filename.endswith("sqlalchemy/engine/default.py") and function == "_init_compiled":
            executions += calls
    say("", f"===== {name}: {total:.2f} s of main-thread CPU, {1e6 * total / steps:.0f} us/step")
    say(f"SQL statements run through SQLAlchemy: {executions:,} ({executions / steps:.2f}/step)")
    say("-- own time by area")
    for where, own in sorted(by_area.items(), key=lambda kv: -kv[1])[:top]:
        say(f"  {100 * own / total:5.1f}%  {own:7.2f} s  {where}")
    say("-- hottest functions by own time")
    stats.sort_stats("tottime").print_stats(top)


def report(name: str, path: Path, top: int, *, steps: int) -> None:
    if not path.exists():
        say(f"no profile from {name} (did it exit cleanly?)")
    elif path.read_bytes()[:1] == b"{":
        report_samples(name, path, top, steps=steps)
    else:
        report_cprofile(name, path, top, steps=steps)


def main() -> int:
    config = config_from_env()
    top = int(os.environ.get("AGENT_REACH_BENCH_PROFILE_TOP", "25"))
    scenario = os.environ.get("AGENT_REACH_BENCH_PROFILE_SCENARIO", "throughput")
    if scenario not in ("throughput", "latency"):
        say(f"AGENT_REACH_BENCH_PROFILE_SCENARIO is throughput or latency, not {scenario!r}")
        return 2
    with (
        contextlib.ExitStack() as scope,
        tempfile.TemporaryDirectory(prefix="reach-profile-") as tmp,
    ):
        if os.environ.get("AGENT_REACH_BENCH_TRACING") == "1":  # as in tests.bench.run
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = scope.enter_context(OtlpReceiver()).url
        workdir = Path(tmp)
        tools = write_bench_tools(workdir)
        run = workdir / "run"
        try:
            with running_stack(
                config, run, tools, make_cluster=ProfiledCluster, on_measure=start_profiling
            ) as stack:
                if scenario == "latency":
                    timed = asyncio.run(latency(stack, config))
                    described, steps = describe_latency(timed), timed.sent
                else:
                    result = asyncio.run(throughput(stack, config))
                    described, steps = describe_throughput(result), result.steps
        except BenchError as exc:
            say(f"profile run failed: {exc}")
            return 1
        say(f"profiled {scenario} run (not a benchmark figure): {described}")
        for name in ("controller", "executor"):
            report(name, run / f"{name}.prof", top, steps=steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
