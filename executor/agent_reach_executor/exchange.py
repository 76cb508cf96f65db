"""The executor's polls, heartbeats and reports as messages on Exchange streams.

A message costs both sides less than a unary call (see BENCHMARKS.md, `make bench-grpc`). The
stream is opened at the first call and again after it breaks; a call whose stream breaks fails
as a unary call to a vanished controller would (UNAVAILABLE, transient), and the worker retries
it as it always has, on a new stream that may reach another replica. A controller that predates
the stream answers UNIMPLEMENTED (and a proxy that cannot carry it may fail it otherwise): a
stream that fails before its first answer with a status that retrying would not change raises
`StreamUnsupported`, and the client goes back to unary calls for good.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import grpc

from agent_reach.v1 import executor_pb2 as pb

# The message field of each call that may travel on the stream.
FIELDS = {"PollSteps": "poll", "Heartbeat": "heartbeat", "ReportResults": "report"}

_CODES = {code.value[0]: code for code in grpc.StatusCode}

# Codes after which the same call may succeed later: the controller is restarting, stopping,
# overloaded or unreachable. A stream failing with one of them may work when opened again; any
# other status before its first answer says the stream cannot work here. Anything else from a
# call is a bug on one side; the worker still retries, but louder.
TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


class StreamUnsupported(Exception):
    """The controller has no Exchange (an older release): use unary calls."""


class CallFailed(Exception):
    """One call on the stream ended with a status: its code and detail."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name} {details}")
        self.code = code
        self.details = details


class StreamCalls:
    """Calls as messages on `streams` streams, taken in turn; each opened on first use and again
    after it breaks. Each stream is a call of its own, so the channel's round robin puts them on
    different replicas, as it did the unary calls: with one stream per poller, each poller's long
    poll can wait on a different replica, where a submit may hand it a step."""

    def __init__(self, stub: Any, metadata: Any, *, streams: int = 1) -> None:
        self._stub = stub
        self._metadata = metadata
        self._ids = itertools.count(1)
        self._streams: list[_Stream | None] = [None] * max(1, streams)
        self._turns = itertools.cycle(range(len(self._streams)))

    async def call(self, method: str, request: Any, deadline_s: float) -> Any:
        """The reply to `request`, or CallFailed with the status the unary call would have."""
        turn = next(self._turns)
        stream = self._streams[turn]
        if stream is None or stream.failure is not None:
            stream = self._streams[turn] = _Stream(self._stub.Exchange(metadata=self._metadata))
        message = pb.ExecutorMessage(id=next(self._ids), timeout_ms=max(1, int(deadline_s * 1000)))
        getattr(message, FIELDS[method]).CopyFrom(request)
        reply = await stream.ask(message, deadline_s)
        kind = reply.WhichOneof("reply")
        if kind == "status":
            raise CallFailed(
                _CODES.get(reply.status.code, grpc.StatusCode.UNKNOWN), reply.status.details
            )
        return getattr(reply, kind)

    async def close(self) -> None:
        streams, self._streams = self._streams, [None] * len(self._streams)
        for stream in streams:
            if stream is not None:
                await stream.close()


class _Stream:
    """One open Exchange call: its messages in flight and the task reading their answers."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._pending: dict[int, asyncio.Future[pb.ControllerMessage]] = {}
        self._writing = asyncio.Lock()  # gRPC sends one message of a call at a time
        self.failure: Exception | None = None  # set once the stream broke: open another
        self._answered = False
        self._reader = asyncio.create_task(self._read(), name="exchange-reader")

    async def ask(self, message: pb.ExecutorMessage, deadline_s: float) -> pb.ControllerMessage:
        answered: asyncio.Future[pb.ControllerMessage] = asyncio.get_running_loop().create_future()
        self._pending[message.id] = answered
        try:
            async with asyncio.timeout(deadline_s):
                try:
                    async with self._writing:
                        await self._call.write(message)
                except Exception:
                    # The stream broke: its reader says how (UNIMPLEMENTED sends the client back
                    # to unary calls), to this message and every other in flight.
                    self._call.cancel()
                if self.failure is not None and not answered.done():
                    raise self.failure  # the reader ended before this message was in flight
                return await answered
        except TimeoutError:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer in time") from None
        finally:
            del self._pending[message.id]

    async def close(self) -> None:
        self._call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        try:
            async for reply in self._call:
                self._answered = True
                waiting = self._pending.get(reply.id)
                if waiting is not None and not waiting.done():
                    waiting.set_result(reply)
            failure: Exception = CallFailed(
                grpc.StatusCode.UNAVAILABLE, "the controller ended the stream"
            )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNIMPLEMENTED or not (
                self._answered or code in TRANSIENT_CODES
            ):
                failure = StreamUnsupported()
            else:
                failure = CallFailed(code, exc.details() or "the stream broke")
        except asyncio.CancelledError:
            failure = CallFailed(grpc.StatusCode.CANCELLED, "the client closed the stream")
        except Exception as exc:  # a reply the stub could not read: the stream is unusable
            failure = CallFailed(grpc.StatusCode.INTERNAL, type(exc).__name__)
        self.failure = failure
        for waiting in list(self._pending.values()):
            if not waiting.done():
                waiting.set_exception(self.failure)
