"""Exchange: an executor's polls, heartbeats and reports as messages on one gRPC stream.

A message is answered by the same handler its unary call runs, with a context that says what the
stream's context says (metadata, peer, TLS) except that an abort ends the message, not the
stream: the answer carries the status the unary call would have ended with. Messages are
answered concurrently (a poll waits; a report behind it must not) and in any order, matched by
id. A stream keeps nothing but its messages in flight, so any replica can take the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from agent_reach.v1 import executor_pb2 as pb

log = logging.getLogger(__name__)

# Messages one stream may have in flight; past it the stream is not read until one is answered
# (an executor has its pollers, one heartbeat and a few reports in flight).
MAX_IN_FLIGHT = 64

Answer = Callable[[pb.ExecutorMessage, "MessageContext"], Awaitable[pb.ControllerMessage]]


class Aborted(Exception):
    """A message's handler aborted: the status its unary call would have ended with."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class MessageContext:
    """What a handler sees of one message: the stream's metadata, peer and TLS identity; `abort`
    ends this message with a status, not the stream."""

    __slots__ = ("_stream",)

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def invocation_metadata(self) -> Any:
        return self._stream.invocation_metadata()

    def peer(self) -> str:
        return str(self._stream.peer())

    def auth_context(self) -> Any:
        return self._stream.auth_context()

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)


def status_reply(message_id: int, code: grpc.StatusCode, details: str) -> pb.ControllerMessage:
    return pb.ControllerMessage(
        id=message_id, status=pb.CallStatus(code=code.value[0], details=details)
    )


class Streams:
    """The open Exchange streams of one controller, and their end when it stops."""

    def __init__(self, *, in_flight: int = MAX_IN_FLIGHT) -> None:
        self._in_flight = in_flight
        self._open: set[_Stream] = set()
        self._closing = False

    async def serve(self, requests: AsyncIterator[Any], context: Any, answer: Answer) -> None:
        """Answer the stream's messages until the executor closes it or this controller stops."""
        if self._closing:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "this controller is stopping; open the stream again"
            )
        stream = _Stream(context, answer, self._in_flight)
        self._open.add(stream)
        try:
            await stream.run(requests)
        finally:
            self._open.discard(stream)

    async def close(self, grace: float) -> None:
        """Stop reading every stream; answer what is in flight within `grace` seconds, then end
        each stream (status OK), so its executor opens the next on another replica."""
        self._closing = True
        streams = list(self._open)
        for stream in streams:
            stream.stop_reading()
        if streams:
            await asyncio.wait(
                [asyncio.ensure_future(s.ended.wait()) for s in streams], timeout=grace
            )
        for stream in streams:
            stream.cancel_answers()


class _Stream:
    def __init__(self, context: Any, answer: Answer, in_flight: int) -> None:
        self._context = context
        self._message_context = MessageContext(context)
        self._answer = answer
        self._slots = asyncio.Semaphore(in_flight)
        self._answers: set[asyncio.Task[None]] = set()
        self._writing = asyncio.Lock()  # gRPC sends one message of a call at a time
        self._reader: asyncio.Task[Any] | None = None
        self._stopped = False
        self.ended = asyncio.Event()

    async def run(self, requests: AsyncIterator[Any]) -> None:
        self._reader = asyncio.current_task()
        assert self._reader is not None
        try:
            try:
                async for message in requests:
                    await self._slots.acquire()
                    task = asyncio.create_task(self._answer_one(message))
                    self._answers.add(task)
                    task.add_done_callback(self._answers.discard)
            except asyncio.CancelledError:
                if not self._stopped:
                    raise  # the stream itself ended (the executor went): drop its answers
                self._reader.uncancel()  # stopped reading: the answers in flight still go out
            if self._answers:
                await asyncio.gather(*self._answers, return_exceptions=True)
        except asyncio.CancelledError:
            self.cancel_answers()
            raise
        finally:
            self.ended.set()

    def stop_reading(self) -> None:
        self._stopped = True
        if self._reader is not None:
            self._reader.cancel()

    def cancel_answers(self) -> None:
        for task in list(self._answers):
            task.cancel()

    async def _answer_one(self, message: pb.ExecutorMessage) -> None:
        try:
            timeout = message.timeout_ms / 1000 if message.timeout_ms else None
            try:
                async with asyncio.timeout(timeout):
                    reply = await self._answer(message, self._message_context)
            except Aborted as aborted:
                reply = status_reply(message.id, aborted.code, aborted.details)
            except TimeoutError:
                reply = status_reply(
                    message.id, grpc.StatusCode.DEADLINE_EXCEEDED, "the message's timeout passed"
                )
            except Exception:
                log.exception(
                    "exchange: a message failed", extra={"event": "exchange_message_failed"}
                )
                reply = status_reply(message.id, grpc.StatusCode.INTERNAL, "internal error")
            async with self._writing:
                with contextlib.suppress(Exception):  # the stream is gone: nobody waits for it
                    await self._context.write(reply)
        finally:
            self._slots.release()
