"""How a moment is written wherever anyone reads one: RFC 3339 in UTC, `Z`, to the millisecond.

Every time the controller answers with (task views, events and their data, receipts, webhooks,
the event stream) and a delivery's `delivered_at` is written by `rfc3339`, so a client parses
one shape: `2026-12-06T08:00:00.000Z`. Milliseconds, because that is what JavaScript's `Date`
and most log tools keep; stored times keep their full precision (cursors use those, not this).
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime) -> str:
    """`moment` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC; the fraction cut, never rounded up).

    A naive datetime names no instant: ValueError.
    """
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("a naive datetime names no instant")
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
