"""One shape for every time shown: RFC 3339, UTC, `Z`, milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from agent_reach.times import rfc3339


def test_a_moment_is_written_in_utc_with_z_to_the_millisecond() -> None:
    shanghai = timezone(timedelta(hours=8))
    assert rfc3339(datetime(2026, 12, 6, 16, 0, tzinfo=shanghai)) == "2026-12-06T08:00:00.000Z"
    # The fraction is cut, never rounded into the next second.
    late = datetime(2026, 12, 6, 8, 0, 59, 999_999, tzinfo=UTC)
    assert rfc3339(late) == "2026-12-06T08:00:59.999Z"


def test_a_naive_datetime_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        rfc3339(datetime(2026, 12, 6, 8, 0))
