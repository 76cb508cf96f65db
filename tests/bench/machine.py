"""What the figures were measured on: machine, commit, Python, Postgres, date; process memory."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[2]


def _first(path: str, prefix: str) -> str | None:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(prefix):
            return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    return _first("/proc/cpuinfo", "model name") or platform.processor() or "unknown CPU"


def memory_gib() -> float | None:
    total = _first("/proc/meminfo", "MemTotal")  # "24683744 kB"
    return int(total.split()[0]) / 1024 / 1024 if total else None


def git_commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain") else "")


def postgres_version(admin_url: str) -> str:
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


def header_lines(admin_url: str) -> list[str]:
    memory = memory_gib()
    return [
        f"machine   {cpu_model()}, {os.cpu_count()} cores, "
        + (f"{memory:.1f} GiB memory" if memory else "memory unknown"),
        f"commit    {git_commit()}",
        f"python    {platform.python_version()} ({platform.python_implementation()})",
        f"postgres  {postgres_version(admin_url)}",
        f"date      {datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S UTC')}",
        _load_line(),
    ]


def _load_line() -> str:
    busy = machine_busy()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    warning = "  WARNING: something else is using the CPU" if busy > 10 else ""
    return f"load      {busy:.0f}% of all cores busy before the start; load average {load}{warning}"


def memory_mib(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of a live process in MiB; None when it is gone."""
    rss = _first(f"/proc/{pid}/status", "VmRSS")
    peak = _first(f"/proc/{pid}/status", "VmHWM")
    if rss is None or peak is None:
        return None
    return int(rss.split()[0]) / 1024, int(peak.split()[0]) / 1024


_TICK = os.sysconf("SC_CLK_TCK")


def _stat_cpu(stat: str) -> tuple[str, float]:
    """(comm, user + system seconds) from a /proc/PID/stat line."""
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return comm, (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def cpu_seconds(pid: int) -> float:
    """CPU time a live process has used so far (0 when it is gone)."""
    try:
        return _stat_cpu(Path(f"/proc/{pid}/stat").read_text())[1]
    except (OSError, ValueError):
        return 0.0


def postgres_cpu_seconds() -> float:
    """CPU time of every live `postgres` process on the machine (server and backends)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm, seconds = _stat_cpu((entry / "stat").read_text())
        except (OSError, ValueError):
            continue
        if comm.startswith("postgres"):
            total += seconds
    return total


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of the named processes, all of Postgres, and this load generator."""
    snapshot = {name: cpu_seconds(pid) for name, pid in pids.items()}
    snapshot["postgres"] = postgres_cpu_seconds()
    snapshot["load generator"] = time.process_time()
    snapshot[_MACHINE] = _cpu_ticks()[0] / _TICK
    return snapshot


_MACHINE = "whole machine"


def cpu_shares(
    before: dict[str, float], after: dict[str, float], seconds: float
) -> dict[str, float]:
    """Percent of one core each used between two snapshots `seconds` apart; `other` is what the
    rest of the machine used meanwhile (more than a few percent disturbs the figures)."""
    shares = {name: 100 * (after[name] - before[name]) / seconds for name in before}
    machine = shares.pop(_MACHINE)
    shares["other"] = max(0.0, machine - sum(shares.values()))
    return shares


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def machine_busy(seconds: float = 1.0) -> float:
    """Percent of all cores busy over the next `seconds` (before the bench starts anything)."""
    busy0, total0 = _cpu_ticks()
    time.sleep(seconds)
    busy1, total1 = _cpu_ticks()
    return 100 * (busy1 - busy0) / max(1, total1 - total0)


def machine_cpu_seconds() -> float:
    """CPU time the whole machine has spent busy so far (all cores; idle and iowait left out)."""
    return _cpu_ticks()[0] / _TICK
