"""Task ids, trace ids and idempotency keys: how each is made and parsed."""

from __future__ import annotations

import os
import re
import time
import uuid

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def new_task_id() -> str:
    """A UUIDv7 (RFC 9562): time-ordered, so ids sort by creation and index well."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # 12 bits rand_a
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)  # 62 bits rand_b
    return str(uuid.UUID(int=value))


def task_id_floor(ms: int) -> str:
    """The smallest task id of millisecond `ms` (Unix time): ids made at `ms` or later sort at
    or after it, ids made earlier before it, so a time range is a range of ids (a keyset bound).

    Times outside what the 48-bit prefix holds are clamped to its ends.
    """
    ms = min(max(ms, 0), (1 << 48) - 1)
    return str(uuid.UUID(int=ms << 80))


def new_trace_id() -> str:
    """A W3C trace id: 32 lowercase hex characters, never all zeros."""
    while True:
        trace_id = os.urandom(16).hex()
        if trace_id != "0" * 32:
            return trace_id


def new_span_id() -> str:
    """A W3C span id: 16 lowercase hex characters, never all zeros."""
    while True:
        span_id = os.urandom(8).hex()
        if span_id != "0" * 16:
            return span_id


def parse_traceparent(header: str | None) -> tuple[str, str] | None:
    """(trace_id, parent span id) from a W3C traceparent header, or None if it is not valid."""
    if not header:
        return None
    match = _TRACEPARENT.match(header.strip().lower())
    if match is None:
        return None
    trace_id, span_id, _flags = match.groups()
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id


def make_traceparent(trace_id: str, span_id: str, *, sampled: bool = True) -> str:
    """A W3C traceparent header value."""
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def step_idempotency_key(task_id: str, step_id: str) -> str:
    """The key every attempt of a step carries downstream: stable across retries and executors."""
    return f"{task_id}:{step_id}"
