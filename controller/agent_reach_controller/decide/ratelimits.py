"""Rate limits as GCRA (the generic cell rate algorithm): one timestamp per bucket, no counters.

A bucket admits `burst` calls at once and then one every `1/rate` seconds. Its whole state is
its theoretical arrival time (TAT): a call at `now` is admitted when `now >= TAT - tolerance`,
and admitting it moves TAT to `max(TAT, now) + interval`. Over any window of W seconds a bucket
admits at most `burst + W * rate` calls, which is the figure the tests check at the downstream.

The same rule runs in three places: in memory (embedded mode), in a Redis script (production,
one round trip per claim for any number of buckets) and in Postgres under row locks (when Redis
is down). The Lua copy lives in `services/limiter.py` and is tested against this one.

A *floor* makes a bucket start empty instead of full: `floor_tat(rate, since)` is the TAT of a
bucket that spent its whole burst at `since`. Whenever a store's memory of a bucket may be stale
or missing (Redis restarted empty, a switch between Redis and Postgres), the bucket is raised to
that floor, so the limit holds across the change at the price of one burst's delay.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from agent_reach_controller.planning.conditions import ConditionError, evaluate_key
from agent_reach_controller.tools.catalog import RateLimit, ToolSpec

# A call this close to its slot is on time: sums of float intervals drift by a few ulps.
SLACK = 1e-6
# What `in_use` forgives, in intervals (see there).
USE_SLACK = 1e-3


@dataclass(frozen=True, slots=True)
class Rate:
    per_second: float
    burst: int

    @property
    def interval(self) -> float:
        return 1.0 / self.per_second

    @property
    def tolerance(self) -> float:
        return (self.burst - 1) * self.interval

    @classmethod
    def of(cls, limit: RateLimit) -> Rate:
        return cls(per_second=limit.per_second, burst=limit.burst)


def floor_tat(rate: Rate, since: float) -> float:
    """The TAT of a bucket that admitted its whole burst at `since`."""
    return since + rate.tolerance + rate.interval


def admit(tat: float | None, now: float, rate: Rate, *, floor: float = 0.0) -> tuple[float, float]:
    """One call against a bucket: (the new TAT, seconds to wait; 0.0 means admitted).

    `tat` is None for a bucket never used (full). A refused call leaves the TAT unchanged.
    """
    current = max(tat if tat is not None else 0.0, floor)
    allowed_at = current - rate.tolerance
    if now + SLACK < allowed_at:
        return current, allowed_at - now
    return max(current, now) + rate.interval, 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BucketUse:
    """What a bucket holds now: calls admitted within the current burst window, and seconds
    until the oldest of them leaves it (one more slot is free then; 0.0 when none is held)."""

    calls: int
    frees_in: float


def in_use(tat: float | None, now: float, rate: Rate) -> BucketUse:
    """A bucket's use at `now`, from its TAT (None: never used), without admitting anything.

    Each admitted call pushed the TAT one interval further, and the TAT drains in real time, so
    the calls still in the window are the intervals between now and the TAT, rounded up.
    """
    ahead = (tat if tat is not None else 0.0) - now
    if ahead <= SLACK:
        return BucketUse(calls=0, frees_in=0.0)
    # A call within a thousandth of an interval of leaving has left: TATs near 1.7e9 s carry a
    # float error of some ulps per admitted call, which an exact ceiling would count as a call.
    calls = min(math.ceil((ahead - SLACK) / rate.interval - USE_SLACK), rate.burst)
    if calls <= 0:
        return BucketUse(calls=0, frees_in=0.0)
    return BucketUse(calls=calls, frees_in=max(ahead - (calls - 1) * rate.interval, 0.0))


def bucket_key(tool: str, key_value: str | None) -> str:
    """The bucket of a tool, or of one key value of it (`key_value` is already a digest)."""
    return tool if key_value is None else f"{tool}#{key_value}"


def key_digest(value: Any) -> str:
    """A short, stable digest of a key expression's value (the value may hold personal data)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def step_key(tool: ToolSpec, args: Any) -> str | None:
    """The digest of a step's rate-limit key value; None when the tool's limit is unkeyed."""
    if tool.rate_limit is None or tool.rate_limit.key is None:
        return None
    return key_of(tool.rate_limit.key, args)


def concurrency_key(tool: ToolSpec, args: Any) -> str | None:
    """The digest of a step's `concurrency_per_key` key value; None when the tool has none."""
    if tool.concurrency_per_key is None:
        return None
    return key_of(tool.concurrency_per_key.key, args)


def key_of(expression: str, args: Any) -> str:
    """The digest of a key expression's value over arguments.

    Arguments the expression cannot read (a missing field) all share the key of `null`.
    """
    try:
        value = evaluate_key(expression, args if isinstance(args, dict) else {})
    except ConditionError:
        value = None
    return key_digest(value)
