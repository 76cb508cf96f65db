"""GCRA, the rate-limit rule every store applies, and the tool spec's `rate_limit` field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_reach_controller.decide.ratelimits import (
    SLACK,
    Rate,
    admit,
    floor_tat,
    key_digest,
    step_key,
)
from agent_reach_controller.tools.catalog import RateLimit, ToolSpec


def run(rate: Rate, arrivals: list[float], *, floor: float = 0.0) -> list[float]:
    """Times of the admitted calls among `arrivals` (sorted), one bucket."""
    tat: float | None = None
    admitted = []
    for now in arrivals:
        tat, wait = admit(tat, now, rate, floor=floor)
        if wait == 0.0:
            admitted.append(now)
    return admitted


def test_a_full_bucket_admits_its_burst_then_one_per_interval() -> None:
    rate = Rate(per_second=10.0, burst=3)
    assert run(rate, [0.0] * 5) == [0.0] * 3
    assert run(rate, [0.0, 0.0, 0.0, 0.05, 0.1, 0.15, 0.2]) == [0.0, 0.0, 0.0, 0.1, 0.2]


def test_a_refusal_says_how_long_to_wait_and_spends_nothing() -> None:
    rate = Rate(per_second=4.0, burst=1)
    tat, wait = admit(None, 10.0, rate)
    assert wait == 0.0
    again, wait = admit(tat, 10.1, rate)
    assert again == tat
    assert wait == pytest.approx(0.15)
    _, wait = admit(again, 10.1 + wait, rate)
    assert wait == 0.0


def test_a_floor_makes_the_bucket_start_empty() -> None:
    rate = Rate(per_second=2.0, burst=4)
    floor = floor_tat(rate, since=100.0)
    _, wait = admit(None, 100.0, rate, floor=floor)
    assert wait == pytest.approx(0.5)
    # Long after the floor, the bucket is full again.
    assert run(rate, [200.0] * 6, floor=floor) == [200.0] * 4


@settings(max_examples=300, deadline=None)
@given(
    per_second=st.floats(0.5, 200.0),
    burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0.0, 0.3), min_size=1, max_size=300),
    window=st.floats(0.01, 5.0),
)
def test_no_window_ever_admits_more_than_burst_plus_rate_times_its_length(
    per_second: float, burst: int, gaps: list[float], window: float
) -> None:
    rate = Rate(per_second=per_second, burst=burst)
    arrivals, now = [], 0.0
    for gap in gaps:
        now += gap
        arrivals.append(now)
    admitted = run(rate, arrivals)
    bound = burst + (window + SLACK) * per_second
    for i, start in enumerate(admitted):
        inside = sum(1 for t in admitted[i:] if t <= start + window)
        assert inside <= bound


def test_rates_are_read_per_second_minute_or_hour() -> None:
    assert RateLimit.model_validate({"rate": "600/m"}).per_second == 10.0
    assert RateLimit.model_validate({"rate": "7200/h", "burst": 5}).per_second == 2.0
    assert RateLimit.model_validate({"rate": 3}).per_second == 3.0
    for bad in ("fast", "10/d", "0/s", -1, "1/s/s"):
        with pytest.raises(ValidationError):
            RateLimit.model_validate({"rate": bad})
    with pytest.raises(ValidationError, match="key does not compile as CEL"):
        RateLimit.model_validate({"rate": 1, "key": "args.("})


def test_each_key_value_gets_its_own_bucket_and_missing_keys_share_one() -> None:
    tool = ToolSpec.model_validate(
        {
            "name": "crm.update",
            "description": "d",
            "connector": "echo",
            "rate_limit": {"rate": "5/s", "key": "args.customer.id"},
        }
    )
    first = step_key(tool, {"customer": {"id": "c-1"}})
    assert first == step_key(tool, {"customer": {"id": "c-1"}, "note": "x"})
    assert first != step_key(tool, {"customer": {"id": "c-2"}})
    assert step_key(tool, {}) == step_key(tool, {"customer": {}}) == key_digest(None)
    unkeyed = tool.model_copy(update={"rate_limit": RateLimit.model_validate({"rate": 1})})
    assert step_key(unkeyed, {"customer": {"id": "c-1"}}) is None
