"""`python -m tests.bench.profiled OUT reach-args...`: `reach` with a profiler attached.

AGENT_REACH_BENCH_PROFILER picks the profiler:

- `sample` (default): a thread takes the main thread's Python stack every 5 ms and counts
  stacks. Inclusive figures are trustworthy under asyncio, and SQLAlchemy's greenlets are
  followed back to the coroutine that started them; the overhead is small. Writes OUT as JSON.
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
import signal
import sys
import threading
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
    """Counts the main thread's stacks (outermost first) while `running` is set."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self.stacks: Counter[tuple[str, ...]] = Counter()
        self.running = threading.Event()
        self.stopped = threading.Event()
        self.main_greenlet: Any = None
        try:
            import greenlet

            self.main_greenlet = greenlet.getcurrent()
        except ImportError:
            pass
        self.thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _sample(self) -> None:
        frame = sys._current_frames().get(self.main)
        if frame is None:
            return
        names: list[str] = []
        outermost = _chain(frame, names)
        # Inside a greenlet the chain stops at the greenlet's first frame; the main greenlet,
        # suspended in SQLAlchemy's greenlet_spawn, holds the coroutine stack that called it.
        if outermost is not None and outermost.f_code.co_name not in ROOTS:
            parent = getattr(self.main_greenlet, "gr_frame", None)
            if parent is not None:
                _chain(parent, names)
        self.stacks[tuple(reversed(names))] += 1

    def _run(self) -> None:
        self.running.wait()
        while not self.stopped.is_set():
            time.sleep(INTERVAL_S)
            self._sample()

    def dump(self, path: str) -> None:
        rows = [{"stack": list(stack), "count": n} for stack, n in self.stacks.items()]
        with open(path, "w") as handle:
            json.dump({"interval_s": INTERVAL_S, "stacks": rows}, handle)


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
    sampler.thread.start()
    signal.signal(signal.SIGUSR1, lambda signum, frame: sampler.running.set())
    try:
        return reach(args)
    finally:
        sampler.stopped.set()
        sampler.running.set()
        sampler.thread.join(5)
        sampler.dump(out)


if __name__ == "__main__":
    sys.exit(main())
