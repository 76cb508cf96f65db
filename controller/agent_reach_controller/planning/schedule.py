"""When a scheduled step is asked to run: `run_at` (RFC 3339 with an offset, or a local time in
the plan's `timezone`) or `delay` (a duration after the task is accepted).

A local time that does not exist (the hour skipped when clocks go forward) moves forward by the
gap; one that happens twice (clocks go back) is its first occurrence.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agent_reach_controller.tools.catalog import parse_duration

# The furthest ahead a step may be scheduled.
MAX_AHEAD = timedelta(days=366)


class ScheduleError(ValueError):
    """A `run_at`, `delay` or `timezone` that cannot be used; the message says why."""


def zone(name: str) -> ZoneInfo:
    """An IANA time zone ("Asia/Shanghai")."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"{name!r} is not an IANA time zone, e.g. 'Asia/Shanghai'") from None


def run_at(value: str, timezone: ZoneInfo | None) -> datetime:
    """The instant (UTC) of an RFC 3339 time, or of a local time in `timezone`."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ScheduleError(
            f"{value!r:.80} is not a time: use RFC 3339 ('2026-12-03T08:00:00+08:00') or a local "
            "time with the plan's timezone ('2026-12-03T08:00')"
        ) from None
    if parsed.tzinfo is None:
        if timezone is None:
            raise ScheduleError(
                f"{value!r:.80} has no offset: give one, or set the plan's 'timezone'"
            )
        parsed = parsed.replace(tzinfo=timezone, fold=0)  # fold=0: the first of two, or forward
    return parsed.astimezone(UTC)


def delay(value: Any) -> float:
    """Seconds from a number or a duration string ("90s", "30m", "2h")."""
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ScheduleError(str(exc)) from None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ScheduleError("a delay is a number of seconds (0 or more) or e.g. '30m'")
    if seconds > MAX_AHEAD.total_seconds():
        raise ScheduleError(f"a delay may be at most {MAX_AHEAD.days} days")
    return float(seconds)


def check_ahead(when: datetime, now: datetime) -> None:
    if when - now > MAX_AHEAD:
        raise ScheduleError(f"a step may be scheduled at most {MAX_AHEAD.days} days ahead")
