"""`python -m tests.bench.grpc_calls`: what grpc.aio costs the server per exchange, a unary call
against a message each way on one bidi stream (the choice behind "one stream per executor").

A bare echo server (no proto, no interceptors: gRPC's own cost only) runs in its own process on
uvloop, as the controller does, on 127.0.0.1. One client sends a 200-byte payload and waits for
its echo, N times as unary calls, then N times as a write and a read on one stream, then N times
as a call on the project's own Exchange stream (`rpc/exchange.py` serving, the executor's
`exchange.py` calling: each message answered by its own task, matched by id). The server's
CPU (all its threads, from /proc) per exchange and the exchanges per second are printed as
medians of the repeats. Sizes: AGENT_REACH_BENCH_GRPC_CALLS (default 4000),
AGENT_REACH_BENCH_REPEATS (3).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvloop

from agent_reach.v1 import executor_pb2 as pb
from agent_reach_controller.rpc.exchange import MessageContext, Streams
from agent_reach_executor.exchange import StreamCalls
from tests.bench.machine import cpu_model, cpu_seconds, git_commit

ADDRESS = "127.0.0.1:18799"
PAYLOAD = b"x" * 200
WARM_UP = 300


async def _serve() -> None:
    async def unary(request: bytes, _context: Any) -> bytes:
        return request

    async def stream(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    async def answer(message: pb.ExecutorMessage, _context: MessageContext) -> pb.ControllerMessage:
        return pb.ControllerMessage(id=message.id, heartbeat=pb.HeartbeatResponse())

    streams = Streams()

    async def exchange(requests: AsyncIterator[Any], context: Any) -> None:
        await streams.serve(requests, context, answer)

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
            "Exchange": grpc.stream_stream_rpc_method_handler(
                exchange,
                request_deserializer=pb.ExecutorMessage.FromString,
                response_serializer=pb.ControllerMessage.SerializeToString,
            ),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(ADDRESS)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


# {way: [(server µs of CPU per exchange, exchanges/s)] per repeat}
Figures = dict[str, list[tuple[float, float]]]


async def _measure(server_pid: int, calls: int, repeats: int) -> Figures:
    """Time N unary calls, then N messages on one stream, `repeats` times."""
    async with grpc.aio.insecure_channel(ADDRESS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        unary = channel.unary_unary("/bench.Echo/Unary")
        stream = channel.stream_stream("/bench.Echo/Stream")
        for _ in range(WARM_UP):
            await unary(PAYLOAD)
        exchange = StreamCalls(_ExchangeStub(channel), None)
        heartbeat = pb.HeartbeatRequest(executor_id="bench", session="x" * 150)
        figures: Figures = {"unary call": [], "stream message": [], "Exchange call": []}
        for _ in range(repeats):
            cpu, start = cpu_seconds(server_pid), time.perf_counter()
            for _ in range(calls):
                await unary(PAYLOAD)
            figures["unary call"].append(_figure(server_pid, cpu, start, calls))
            call = stream()
            cpu, start = cpu_seconds(server_pid), time.perf_counter()
            for _ in range(calls):
                await call.write(PAYLOAD)
                await call.read()
            figures["stream message"].append(_figure(server_pid, cpu, start, calls))
            await call.done_writing()
            cpu, start = cpu_seconds(server_pid), time.perf_counter()
            for _ in range(calls):
                await exchange.call("Heartbeat", heartbeat, 10)
            figures["Exchange call"].append(_figure(server_pid, cpu, start, calls))
        await exchange.close()
        return figures


class _ExchangeStub:
    def __init__(self, channel: Any) -> None:
        self.Exchange = channel.stream_stream(
            "/bench.Echo/Exchange",
            request_serializer=pb.ExecutorMessage.SerializeToString,
            response_deserializer=pb.ControllerMessage.FromString,
        )


def _figure(pid: int, cpu_before: float, start: float, calls: int) -> tuple[float, float]:
    return (cpu_seconds(pid) - cpu_before) / calls * 1e6, calls / (time.perf_counter() - start)


def main() -> None:
    calls = int(os.environ.get("AGENT_REACH_BENCH_GRPC_CALLS", "4000"))
    repeats = int(os.environ.get("AGENT_REACH_BENCH_REPEATS", "3"))
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.grpc_calls", "serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        if server.stdout is None or server.stdout.readline().strip() != "ready":
            raise SystemExit("the echo server did not start")
        figures = asyncio.run(_measure(server.pid, calls, repeats))
    finally:
        server.kill()
        server.wait()
    print(f"# grpc.aio on uvloop, {cpu_model()}, commit {git_commit()}, grpcio {grpc.__version__}")
    print(f"# {calls} exchanges of {len(PAYLOAD)} bytes each way, medians of {repeats}")
    for way, runs in figures.items():
        cpu = statistics.median(c for c, _ in runs)
        rate = statistics.median(r for _, r in runs)
        print(f"{way:>15}: server CPU {cpu:6.0f} µs per exchange, {rate:6.0f} exchanges/s")


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        uvloop.run(_serve())
    else:
        main()
