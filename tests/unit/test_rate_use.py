"""A bucket's use read from its TAT (`in_use`) agrees with what `admit` does next."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_reach_controller.decide.ratelimits import (
    USE_SLACK,
    BucketUse,
    Rate,
    admit,
    floor_tat,
    in_use,
)

NOW = 1_764_921_600.0


def test_a_bucket_never_used_or_drained_holds_nothing() -> None:
    rate = Rate(per_second=2.0, burst=3)
    assert in_use(None, NOW, rate) == BucketUse(calls=0, frees_in=0.0)
    assert in_use(NOW - 5, NOW, rate) == BucketUse(calls=0, frees_in=0.0)
    assert in_use(NOW, NOW, rate) == BucketUse(calls=0, frees_in=0.0)


def test_calls_leave_the_window_one_interval_apart() -> None:
    rate = Rate(per_second=2.0, burst=3)
    tat = None
    for _ in range(3):
        tat, wait = admit(tat, NOW, rate)
        assert wait == 0.0
    assert tat is not None
    assert in_use(tat, NOW, rate) == BucketUse(calls=3, frees_in=pytest.approx(0.5))
    assert in_use(tat, NOW + 0.5, rate) == BucketUse(calls=2, frees_in=pytest.approx(0.5))
    assert in_use(tat, NOW + 0.7, rate) == BucketUse(calls=2, frees_in=pytest.approx(0.3))
    assert in_use(tat, NOW + 1.4, rate) == BucketUse(calls=1, frees_in=pytest.approx(0.1))
    assert in_use(tat, NOW + 1.5, rate).calls == 0


def test_a_floor_reads_as_a_spent_burst() -> None:
    rate = Rate(per_second=1.0, burst=4)
    assert in_use(floor_tat(rate, NOW), NOW, rate) == BucketUse(calls=4, frees_in=1.0)


@given(
    per_second=st.floats(min_value=0.01, max_value=100.0),
    burst=st.integers(min_value=1, max_value=50),
    calls=st.integers(min_value=0, max_value=60),
    later=st.floats(min_value=0.0, max_value=100.0),
)
def test_the_use_says_what_admit_does_next(
    per_second: float, burst: int, calls: int, later: float
) -> None:
    rate = Rate(per_second=per_second, burst=burst)
    tat: float | None = None
    admitted = 0
    for _ in range(calls):
        tat, wait = admit(tat, NOW, rate)
        admitted += wait == 0.0
    assert admitted <= burst
    assert in_use(tat, NOW, rate).calls == admitted
    now = NOW + later * rate.interval
    use = in_use(tat, now, rate)
    assert 0 <= use.calls <= burst
    assert use.frees_in >= 0.0
    assert (use.calls == 0) == (use.frees_in == 0.0)
    _, wait = admit(tat, now, rate)
    if use.calls < burst:  # a slot is free now (to a thousandth of an interval)
        assert wait <= USE_SLACK * rate.interval + 1e-6
    else:
        assert wait == pytest.approx(use.frees_in, abs=1e-6)  # the next call waits for it
