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
    ]


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
    return snapshot


def cpu_shares(
    before: dict[str, float], after: dict[str, float], seconds: float
) -> dict[str, float]:
    """Percent of one core each used between two snapshots `seconds` apart."""
    return {name: 100 * (after[name] - before[name]) / seconds for name in before}
