"""`python -m tests.bench.profiled OUT.prof reach-args...`: `reach` under cProfile.

The timer is the main thread's CPU clock (`time.thread_time`), so time spent waiting in the event
loop's selector or descheduled by the OS is not counted: the profile shows where the Python
thread burns CPU. Profiling starts at the first SIGUSR1 (sent once warm-up is over, so start-up
and imports stay out) and the stats are written when `reach` returns (SIGINT or SIGTERM).
"""

from __future__ import annotations

import cProfile
import signal
import sys
import time
from types import FrameType

from agent_reach_cli.main import main as reach


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    profiler = cProfile.Profile(time.thread_time)

    def start(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        profiler.enable()

    signal.signal(signal.SIGUSR1, start)
    try:
        return reach(args)
    finally:
        profiler.disable()
        profiler.dump_stats(out)


if __name__ == "__main__":
    sys.exit(main())
