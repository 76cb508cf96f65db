"""Live task events as Server-Sent Events: `GET /v1/tasks/{id}/events` with
`Accept: text/event-stream`.

Each message is `id: <event id>`, `event: <kind>`, `data: <the JSON list's item>`; a comment line
after a quiet spell keeps proxies from closing the connection; `event: end` with the task's status
is the last message once the task is terminal. A stream closed without it (the duration limit, a
replica shutting down) is resumed with `Last-Event-ID`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agent_reach_controller.api import schemas
from agent_reach_controller.api.serving import ShuttingDownError
from agent_reach_controller.domain.records import EventRow
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.feed import EventFeed, FollowInput

SSE_MEDIA_TYPE = "text/event-stream"
HEARTBEAT = b": keep-alive\n\n"
# The OpenAPI of the route's 200: the JSON page, or (when asked for) the stream.
EVENTS_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The task's events: a JSON page, or with `Accept: text/event-stream` a "
        "live stream (`id`, `event` = kind, `data` = one item of the JSON page) that ends with "
        "`event: end` once the task is terminal",
        "content": {
            SSE_MEDIA_TYPE: {
                "schema": {"type": "string"},
                "example": 'id: 42\nevent: succeed\ndata: {"id": 42, "kind": "succeed", …}\n\n'
                'event: end\ndata: {"task_id": "…", "status": "succeeded"}\n\n',
            }
        },
    }
}


def wants_stream(accept: str) -> bool:
    """Whether an Accept header asks for an event stream."""
    return any(
        part.split(";", 1)[0].strip().lower() == SSE_MEDIA_TYPE for part in accept.split(",")
    )


@dataclass(frozen=True, slots=True)
class StreamAsk:
    """The client asked for the live stream (`Accept: text/event-stream`)."""

    last_event_id: int | None  # where an EventSource resumes (it wins over `after`)


async def stream_ask(
    request: Request,
    last_event_id: Annotated[
        int | None,
        Header(
            alias="Last-Event-ID",
            ge=0,
            le=2**63 - 1,
            description="With Accept: text/event-stream, resume after this event (over `after`)",
        ),
    ] = None,
) -> StreamAsk | None:
    if not wants_stream(request.headers.get("accept", "")):
        return None
    return StreamAsk(last_event_id)


StreamAsked = Annotated[StreamAsk | None, Depends(stream_ask)]


class TooManyStreamsError(Exception):
    """This replica serves as many live event streams as it may."""

    def __init__(self, followers: int, limit: int) -> None:
        super().__init__(
            f"this replica already serves {followers:,} event streams (the limit is {limit:,}); "
            "retry later"
        )


def stream_events(deps: Components, task_id: str, *, after: int) -> Response:
    """The stream (the caller has checked the key and the tenant), or 429 over the cap."""
    settings = deps.settings
    if deps.feed.closing:
        raise ShuttingDownError(
            "it serves no new event streams; retry (another replica will answer)", retry_after=1
        )
    if not deps.feed.reserve(settings.max_event_streams):
        raise TooManyStreamsError(deps.feed.followers, settings.max_event_streams)
    follow = FollowInput(
        task_id=task_id,
        after=after,
        idle=settings.event_stream_heartbeat_seconds,
        duration=settings.event_stream_max_seconds,
    )
    return EventStream(_messages(deps.feed, follow), feed=deps.feed)


class EventStream(StreamingResponse):
    """An SSE response that gives its follower slot back however it ends (end, limit,
    disconnect, shutdown)."""

    def __init__(self, messages: AsyncGenerator[bytes, None], *, feed: EventFeed) -> None:
        super().__init__(
            messages,
            media_type=SSE_MEDIA_TYPE,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._messages = messages
        self._feed = feed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._messages.aclose()  # leave the notifier's watch list now
            finally:
                self._feed.release()


async def _messages(feed: EventFeed, follow: FollowInput) -> AsyncGenerator[bytes, None]:
    async for batch in feed.follow(follow):
        if batch.ended is not None:
            yield end_message(follow.task_id, batch.ended)
        elif batch.events:
            yield b"".join(event_message(e) for e in batch.events)
        else:
            yield HEARTBEAT


def event_message(event: EventRow) -> bytes:
    data = schemas.EventOut.model_validate(event).model_dump_json()
    return f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n".encode()


def end_message(task_id: str, status: str) -> bytes:
    data = json.dumps({"task_id": task_id, "status": status}, separators=(",", ":"))
    return f"event: end\ndata: {data}\n\n".encode()
