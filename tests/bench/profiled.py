"""`python -m tests.bench.profiled OUT reach-args...`: `reach` with a profiler attached.

AGENT_REACH_BENCH_PROFILER picks the profiler:

- `sample` (default): the main thread's Python stack is counted on SIGPROF, every 5 ms of
  process CPU time. Inclusive figures are trustworthy under asyncio, and SQLAlchemy's greenlets
  are followed back to the coroutine that started them; the overhead is small. Samples taken
  while the main thread waits in the selector are CPU used by other threads (gRPC's). SQL
  statements sent through SQLAlchemy are counted by verb and table too (and by the function of
  ours that sent them with AGENT_REACH_BENCH_SQL_CALLERS=1). Writes OUT as JSON.
- `cprofile`: cProfile timed by the main thread's CPU clock (`time.thread_time`); exact call
  counts and own times, but cumulative times are wrong across coroutines and greenlets.
  Writes OUT in pstats format.

Both start at the first SIGUSR1 (sent once warm-up is over, so start-up and imports stay out)
and write OUT when `reach` returns (SIGINT or SIGTERM stop it cleanly).
"""

from __future__ import annotations

import cProfile
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from types import FrameType
from typing import Any

from agent_reach_cli.main import main as reach

INTERVAL_S = 0.005
MAX_DEPTH = 200
# The bottom of the main thread's own stack (`python -m`); anything else is a greenlet's.
ROOTS = frozenset({"_run_module_as_main", "<module>"})


def _chain(frame: FrameType | None, into: list[str]) -> FrameType | None:
    """Append 'file:function' from `frame` outwards; returns the outermost frame."""
    last = None
    while frame is not None and len(into) < MAX_DEPTH:
        code = frame.f_code
        into.append(f"{code.co_filename}:{code.co_name}")
        last, frame = frame, frame.f_back
    return last


class Sampler:
    """Counts the main thread's stacks (outermost first) on SIGPROF, every 5 ms of CPU.

    The signal handler runs in the main thread between two bytecodes, so a sample lands where
    the interpreter actually is (a sampling thread would only get the GIL when the main thread
    releases it, around I/O, and so over-count I/O calls).
    """

    def __init__(self) -> None:
        self.stacks: Counter[tuple[str, ...]] = Counter()
        self.greenlet: Any = None
        try:
            import greenlet

            self.greenlet = greenlet
        except ImportError:
            pass

    def sample(self, signum: int, frame: FrameType | None) -> None:
        del signum
        names: list[str] = []
        outermost = _chain(frame, names)
        # Inside a greenlet the chain stops at the greenlet's first frame; its parent,
        # suspended in SQLAlchemy's greenlet_spawn, holds the coroutine stack that called it.
        current = self.greenlet.getcurrent() if self.greenlet else None
        while (
            current is not None
            and current.parent is not None
            and outermost is not None
            and outermost.f_code.co_name not in ROOTS
        ):
            current = current.parent
            outermost = _chain(current.gr_frame, names)
        self.stacks[tuple(reversed(names))] += 1

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self.sample)
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)

    def dump(self, path: str, sql: Counter[str]) -> None:
        rows = [{"stack": list(stack), "count": n} for stack, n in self.stacks.items()]
        with open(path, "w") as handle:
            json.dump({"interval_s": INTERVAL_S, "stacks": rows, "sql": dict(sql)}, handle)


class SqlCounter:
    """Counts the SQL statements and commits SQLAlchemy sends, by verb and table."""

    SHAPE = re.compile(r"^\s*(INSERT INTO|UPDATE|DELETE FROM|SELECT\b.*?\bFROM|\w+)\s*(\w*)", re.S)

    def __init__(self, *, callers: bool = False) -> None:
        self.counts: Counter[str] = Counter()
        self.callers = callers  # also name the function of ours that sent each statement

    def start(self) -> None:
        """Listen on every engine, if this process uses SQLAlchemy at all (the controller)."""
        if "sqlalchemy" not in sys.modules:
            return
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "before_cursor_execute", self._statement)
        event.listen(Engine, "commit", self._commit)

    def _statement(self, conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        match = self.SHAPE.match(sql)
        verb, table = (match.group(1), match.group(2)) if match else (sql[:20], "")
        if verb.upper().startswith("SELECT"):
            verb = "SELECT"
        self.counts[f"{verb.upper()} {table}".strip() + self._caller()] += 1

    def _commit(self, conn: Any) -> None:
        self.counts["COMMIT" + self._caller()] += 1

    def _caller(self) -> str:
        if not self.callers:
            return ""
        import greenlet

        names: list[str] = []
        _chain(sys._getframe(2), names)
        current = greenlet.getcurrent()
        while current.parent is not None:
            current = current.parent
            _chain(current.gr_frame, names)
        ours = [n for n in names if "agent_reach_controller/" in n and "/db/engine.py" not in n]
        return f" <- {ours[0].rsplit('/', 1)[-1]}" if ours else ""


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    kind = os.environ.get("AGENT_REACH_BENCH_PROFILER", "sample")
    if kind == "cprofile":
        profiler = cProfile.Profile(time.thread_time)
        signal.signal(signal.SIGUSR1, lambda signum, frame: profiler.enable())
        try:
            return reach(args)
        finally:
            profiler.disable()
            profiler.dump_stats(out)
    sampler = Sampler()
    sql = SqlCounter(callers=os.environ.get("AGENT_REACH_BENCH_SQL_CALLERS") == "1")

    def start(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        sql.start()
        sampler.start()

    signal.signal(signal.SIGUSR1, start)
    try:
        return reach(args)
    finally:
        sampler.stop()
        sampler.dump(out, sql.counts)


if __name__ == "__main__":
    sys.exit(main())
