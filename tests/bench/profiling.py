"""`python -m tests.bench.profiling`: one end-to-end throughput run with both processes profiled.

Controller and executor run under cProfile (main-thread CPU time, see `profiled.py`); their
hottest functions by own time and by cumulative time are printed. Profiling slows Python down
(often 1.5-2x), so the rate printed here is not a benchmark figure: use `make bench` for those.
Sizes as in `tests.bench.run`; AGENT_REACH_BENCH_PROFILE_TOP sets the number of rows (25).
"""

from __future__ import annotations

import asyncio
import os
import pstats
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.bench.machine import REPO
from tests.bench.run import config_from_env, describe_throughput, say
from tests.bench.scenarios import BenchError, Stack, running_stack, throughput, write_tools
from tests.e2e.processes import Cluster, Proc


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


def area(filename: str) -> str:
    """Where a function lives: a site package, one of our modules, a stdlib module, a builtin."""
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    if filename.startswith(str(REPO)):
        return str(Path(filename).relative_to(REPO))
    if filename == "~":
        return "builtins (C)"
    return "stdlib " + Path(filename).stem


def start_profiling(stack: Stack) -> None:
    """SIGUSR1 to every profiled process: warm-up is over, start counting."""
    for proc in stack.cluster.procs:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGUSR1)


def report(name: str, path: Path, top: int, *, steps: int) -> None:
    """Own time by area, then the hottest functions. Cumulative times are not printed: under
    asyncio and SQLAlchemy's greenlets cProfile's cumulative figures are not trustworthy."""
    if not path.exists():
        say(f"no profile from {name} (did it exit cleanly?)")
        return
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


def main() -> int:
    config = config_from_env()
    top = int(os.environ.get("AGENT_REACH_BENCH_PROFILE_TOP", "25"))
    with tempfile.TemporaryDirectory(prefix="reach-profile-") as tmp:
        workdir = Path(tmp)
        tools = write_tools(workdir)
        run = workdir / "run"
        try:
            with running_stack(
                config, run, tools, make_cluster=ProfiledCluster, on_measure=start_profiling
            ) as stack:
                result = asyncio.run(throughput(stack, config))
        except BenchError as exc:
            say(f"profile run failed: {exc}")
            return 1
        say(f"profiled run (slower than unprofiled): {describe_throughput(result)}")
        for name in ("controller", "executor"):
            report(name, run / f"{name}.prof", top, steps=result.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
