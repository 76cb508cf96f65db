"""What a downstream says about when to call again: `Retry-After`, and rate-limit headers that say
the quota is spent and when it refills. Pure parsing; the HTTP connector turns the answers into
`retry_after` and `throttle_s` on its errors and results."""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping

_SECONDS = re.compile(r"\d+(\.\d+)?")


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


# Unix times are this large; smaller reset values are seconds from now (both are in use).
_EPOCH_MIN = 1_000_000_000
_FIELD = {"r": "r", "remaining": "r", "t": "t", "reset": "t"}
_STRUCTURED = re.compile(r"(?:^|[;,\s])(r|t|remaining|reset)\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def quota_reset(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds until the downstream's quota refills, when it says the quota is spent now.

    Reads `X-RateLimit-Remaining`/`X-RateLimit-Reset` (GitHub, Twitter and many others),
    `RateLimit-Remaining`/`RateLimit-Reset` and the IETF draft's `RateLimit: ...;r=0;t=30`.
    A reset is seconds from now, or a Unix time when it is that large. None when the quota is
    not spent or the answer does not say when it refills.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    remaining = lowered.get("x-ratelimit-remaining", lowered.get("ratelimit-remaining"))
    reset = lowered.get("x-ratelimit-reset", lowered.get("ratelimit-reset"))
    if "ratelimit" in lowered:
        fields = {_FIELD[k.lower()]: v for k, v in _STRUCTURED.findall(lowered["ratelimit"])}
        remaining, reset = fields.get("r", remaining), fields.get("t", reset)
    try:
        spent = remaining is not None and float(remaining.strip()) <= 0
        seconds = float(reset.strip()) if reset is not None and spent else None
    except ValueError:
        return None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    if seconds >= _EPOCH_MIN:
        seconds = max(0.0, seconds - (time.time() if now is None else now))
    return seconds or None
