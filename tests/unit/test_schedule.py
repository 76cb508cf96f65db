"""When a scheduled step runs: RFC 3339, local times in a zone across DST changes, delays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_reach_controller.planning import PlanInvalidError, parse_plan, schedule
from tests.unit.test_planning import CATALOG, WEATHER

NEW_YORK = schedule.zone("America/New_York")


def test_rfc3339_with_an_offset_is_that_instant() -> None:
    when = schedule.run_at("2026-12-03T08:00:00+08:00", None)
    assert when == datetime(2026, 12, 3, 0, 0, tzinfo=UTC)


def test_a_local_time_is_read_in_the_plans_zone() -> None:
    shanghai = schedule.zone("Asia/Shanghai")
    assert schedule.run_at("2026-12-03T08:00", shanghai) == datetime(2026, 12, 3, 0, tzinfo=UTC)


def test_a_time_skipped_by_dst_moves_forward_by_the_gap() -> None:
    # 2027-03-14 02:30 does not exist in New York (02:00 jumps to 03:00).
    when = schedule.run_at("2027-03-14T02:30", NEW_YORK)
    assert when == datetime(2027, 3, 14, 7, 30, tzinfo=UTC)  # 03:30 EDT
    assert when.astimezone(NEW_YORK).hour == 3


def test_a_time_that_happens_twice_is_its_first_occurrence() -> None:
    # 2026-11-01 01:30 happens in EDT (UTC-4) and again in EST (UTC-5).
    when = schedule.run_at("2026-11-01T01:30", NEW_YORK)
    assert when == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "zone", "phrase"),
    [
        ("tomorrow at 8", None, "is not a time"),
        ("2026-12-03T08:00", None, "has no offset"),
    ],
)
def test_times_that_cannot_be_used(value: str, zone: Any, phrase: str) -> None:
    with pytest.raises(schedule.ScheduleError, match=phrase):
        schedule.run_at(value, zone)


@pytest.mark.parametrize(("value", "seconds"), [(90, 90.0), ("30m", 1800.0), ("0s", 0.0)])
def test_delays(value: Any, seconds: float) -> None:
    assert schedule.delay(value) == seconds


def test_a_plan_carries_each_steps_time() -> None:
    body = {
        "timezone": "Asia/Shanghai",
        "steps": [
            {**WEATHER, "step_id": "a", "run_at": "2026-12-03T08:00"},
            {**WEATHER, "step_id": "b", "delay": "30m"},
            {**WEATHER, "step_id": "c"},
        ],
    }
    a, b, c = parse_plan(body, CATALOG).steps
    assert (a.run_at, a.delay_s) == (datetime(2026, 12, 3, tzinfo=UTC), None)
    assert (b.run_at, b.delay_s) == (None, 1800.0)
    assert (c.run_at, c.delay_s) == (None, None)


@pytest.mark.parametrize(
    ("step", "extra", "pointer", "phrase"),
    [
        ({"run_at": "2026-12-03T08:00"}, {}, "/steps/0/run_at", "has no offset"),
        ({"run_at": "x"}, {}, "/steps/0/run_at", "is not a time"),
        ({"delay": "soon"}, {}, "/steps/0/delay", "invalid duration"),
        ({"delay": "1s", "run_at": "2026-12-03T08:00Z"}, {}, "/steps/0/delay", "not both"),
        ({}, {"timezone": "Mars/Olympus"}, "/timezone", "not an IANA time zone"),
        ({"delay": 10**9}, {}, "/steps/0/delay", "at most 366 days"),
    ],
)
def test_bad_schedules_point_at_the_field(
    step: dict[str, Any], extra: dict[str, Any], pointer: str, phrase: str
) -> None:
    with pytest.raises(PlanInvalidError) as info:
        parse_plan({"steps": [{**WEATHER, **step}], **extra}, CATALOG)
    [problem] = info.value.problems
    assert problem.pointer == pointer
    assert phrase in problem.detail


def test_a_step_scheduled_more_than_a_year_ahead_is_refused() -> None:
    far = (datetime.now(UTC) + timedelta(days=400)).isoformat()
    with pytest.raises(PlanInvalidError, match="366 days ahead"):
        parse_plan({"steps": [{**WEATHER, "run_at": far}]}, CATALOG)


def test_reach_status_says_when_a_step_is_scheduled_for() -> None:
    from agent_reach_cli.client_commands import describe_task

    later = (datetime.now(UTC) + timedelta(hours=3)).isoformat()
    task = {
        "task_id": "t1",
        "status": "running",
        "steps": [
            {"step_id": "remind", "status": "ready", "run_at": later, "receipt": None},
            {"step_id": "now", "status": "ready", "run_at": None, "receipt": None},
        ],
    }
    lines = describe_task(task).splitlines()
    assert lines[1].split() == ["remind", "scheduled", "for", later]
    assert lines[2].split() == ["now", "ready"]
