"""`python -m tests.bench.profiled OUT.prof reach-args...`: `reach` under cProfile.

The timer is the main thread's CPU clock (`time.thread_time`), so time spent waiting in the event
loop's selector or descheduled by the OS is not counted: the profile shows where the Python
thread burns CPU. The stats are written when `reach` returns (SIGINT or SIGTERM stop it cleanly).
"""

from __future__ import annotations

import cProfile
import sys
import time

from agent_reach_cli.main import main as reach


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    profiler = cProfile.Profile(time.thread_time)
    try:
        code: int = profiler.runcall(reach, args)
    finally:
        profiler.dump_stats(out)
    return code


if __name__ == "__main__":
    sys.exit(main())
