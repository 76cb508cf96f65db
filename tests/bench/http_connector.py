"""`python -m tests.bench.http_connector`: calls/s of the http connector to a fast local downstream.

The downstream is a minimal HTTP/1.1 keep-alive server (an asyncio Protocol on uvloop answering a
fixed small JSON body) in its own process, on 127.0.0.1 only, so it shares no event loop with the
client. Its ceiling is measured first with a raw client that does almost nothing per call; then
the project's `HttpConnector` (the object the executor hosts, SSRF guard on, 127.0.0.1 admitted
by the tool's `allow_hosts` as a user would write it) makes the same calls as tool calls: a POST
with a placeholder in the URL and a JSON body, its JSON answer parsed.

Every run is bounded by a number of calls and by a deadline; the figure is the median of the
repeats. Sizes: AGENT_REACH_BENCH_HTTP_CALLS (default 20000), AGENT_REACH_BENCH_HTTP_CONCURRENCY
(64 callers), AGENT_REACH_BENCH_REPEATS (3), AGENT_REACH_BENCH_HTTP_DEADLINE (seconds per run,
15). AGENT_REACH_BENCH_HTTP_PROFILE=FILE writes a cProfile (pstats) of one extra connector run.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent_reach_connectors import ToolCall
from agent_reach_connectors.http import HttpConnector
from tests.bench.machine import cpu_model, git_commit, machine_busy, memory_gib

BAR_CALLS_PER_S = 5000
ANSWER = b'{"ok":true,"order":"o-17","state":"accepted"}'
_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(ANSWER)).encode()
    + b"\r\n\r\n"
    + ANSWER
)
_MAX_HEAD = 64 * 1024


class _Downstream(asyncio.Protocol):
    """HTTP/1.1 keep-alive, any method and path, bodies by Content-Length: one fixed answer."""

    def __init__(self) -> None:
        self._transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        answers = 0
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > _MAX_HEAD and self._transport is not None:
                    self._transport.close()
                break
            length = _content_length(bytes(self._buffer[:end]))
            if len(self._buffer) < end + 4 + length:
                break
            del self._buffer[: end + 4 + length]
            answers += 1
        if answers and self._transport is not None:
            self._transport.write(_RESPONSE * answers)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


async def _serve() -> None:
    """Listen on 127.0.0.1 (a free port, printed), until standard input closes."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Downstream, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # the parent closes it, or dies
    server.close()


@contextlib.contextmanager
def downstream() -> Iterator[int]:
    """The downstream in a process of its own; yields its port."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.http_connector", "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield port
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    calls: int
    concurrency: int
    deadline_s: float


async def _drive(load: Load, worker: Callable[[Callable[[], bool]], Awaitable[None]]) -> float:
    """Run `concurrency` copies of `worker`, which call while `more()` says so; calls/s."""
    done = 0
    stop_at = time.monotonic() + load.deadline_s

    def more() -> bool:
        nonlocal done
        if done >= load.calls or time.monotonic() > stop_at:
            return False
        done += 1
        return True

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(more) for _ in range(load.concurrency)))
    _CPU_PER_CALL.append((time.process_time() - cpu) / max(1, done))
    return done / (time.perf_counter() - started)


# This process's CPU seconds per call, run by run: steadier than calls/s on a shared machine.
_CPU_PER_CALL: list[float] = []


async def raw_calls(port: int, load: Load) -> float:
    """The downstream's ceiling: a client that only writes bytes and reads the answer's length."""
    request = (
        b"POST /orders/o-17 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 12\r\n\r\n{"amount":5}'
    )

    async def worker(more: Callable[[], bool]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while more():
                writer.write(request)
                await reader.readexactly(len(_RESPONSE))
        finally:
            writer.close()

    return await _drive(load, worker)


def tool_call(port: int, index: int) -> ToolCall:
    """One attempt of a step calling a POST tool on the downstream, as the executor builds it."""
    return ToolCall(
        tool="orders.create",
        task_id="t-bench",
        step_id=f"s{index}",
        args={"order_id": "o-17", "amount": 5},
        config={
            "method": "POST",
            "url": f"http://127.0.0.1:{port}/orders/{{order_id}}",
            "allow_hosts": ["127.0.0.1"],
        },
        idempotency_key=f"t-bench:s{index}",
        attempt=1,
        max_attempts=3,
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        timeout_s=10.0,
    )


async def connector_calls(port: int, load: Load) -> float:
    """Calls/s through `HttpConnector.invoke`, every answer checked."""
    connector = HttpConnector()
    await connector.start()
    calls = [tool_call(port, i) for i in range(load.concurrency)]
    expected: Any = {"ok": True, "order": "o-17", "state": "accepted"}
    turn = iter(range(1 << 62))

    async def worker(more: Callable[[], bool]) -> None:
        while more():
            output = await connector.invoke(calls[next(turn) % len(calls)])
            if output != expected:
                raise AssertionError(f"unexpected answer {output!r}")

    try:
        await connector.invoke(calls[0])  # warm: pools and caches, as on a running executor
        return await _drive(load, worker)
    finally:
        await connector.close()


def _env(name: str, default: float) -> float:
    value = float(os.environ.get(name, default))
    if value <= 0:
        raise SystemExit(f"{name} must be positive")
    return value


def _say(line: str) -> None:
    print(line, flush=True)


def _median_of(label: str, runs: list[float]) -> float:
    figures = ", ".join(f"{r:,.0f}" for r in runs)
    median = statistics.median(runs)
    cpu = statistics.median(_CPU_PER_CALL[-len(runs) :]) * 1e6
    _say(f"{label:<34} {median:>9,.0f} calls/s   (runs: {figures}; client CPU {cpu:.0f} us/call)")
    return median


def _header(load: Load, repeats: int) -> None:
    memory = memory_gib()
    busy = machine_busy()
    _say(
        f"machine   {cpu_model()}, {os.cpu_count()} cores, "
        + (f"{memory:.1f} GiB memory" if memory else "memory unknown")
    )
    _say(f"commit    {git_commit()}")
    _say(f"python    {platform.python_version()} ({platform.python_implementation()}), uvloop")
    _say(f"date      {datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S UTC')}")
    warning = "  WARNING: something else is using the CPU" if busy > 10 else ""
    _say(f"load      {busy:.0f}% of all cores busy before the start{warning}")
    _say(
        f"calls     {load.calls:,} per run (deadline {load.deadline_s:.0f} s), "
        f"{load.concurrency} concurrent callers, median of {repeats}"
    )


async def bench(load: Load, repeats: int, profile: str | None) -> None:
    with downstream() as port:
        ceiling = _median_of(
            "downstream alone (raw client)", [await raw_calls(port, load) for _ in range(repeats)]
        )
        figure = _median_of(
            "http connector (SSRF guard on)",
            [await connector_calls(port, load) for _ in range(repeats)],
        )
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            await connector_calls(port, load)
            profiler.disable()
            profiler.dump_stats(profile)
            _say(f"profile   one more connector run written to {profile}")
    verdict = "meets" if figure >= BAR_CALLS_PER_S else "is under"
    _say(
        f"the connector {verdict} the bar of {BAR_CALLS_PER_S:,} calls/s "
        f"({figure / BAR_CALLS_PER_S:.2f}x; {figure / ceiling:.0%} of the downstream's ceiling)"
    )


def main() -> None:
    import uvloop

    if sys.argv[1:] == ["--serve"]:
        uvloop.run(_serve())
        return
    load = Load(
        calls=int(_env("AGENT_REACH_BENCH_HTTP_CALLS", 20_000)),
        concurrency=int(_env("AGENT_REACH_BENCH_HTTP_CONCURRENCY", 64)),
        deadline_s=_env("AGENT_REACH_BENCH_HTTP_DEADLINE", 15),
    )
    repeats = int(_env("AGENT_REACH_BENCH_REPEATS", 3))
    _header(load, repeats)
    uvloop.run(bench(load, repeats, os.environ.get("AGENT_REACH_BENCH_HTTP_PROFILE")))


if __name__ == "__main__":
    main()
