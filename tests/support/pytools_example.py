"""Tools written in Python with `@tool`, for the tests (imported by executors and `reach`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from agent_reach_connectors import ConnectorError, tool


class Place(BaseModel):
    city: str
    country: str = "CN"


@tool(name="weather.tomorrow", idempotent=True, timeout="5s")
def tomorrow(
    place: Place,
    at: datetime,
    units: Literal["metric", "imperial"] = "metric",
    title: Annotated[str, Field(description="A property named like a keyword")] = "",
) -> dict[str, object]:
    """Tomorrow's weather at a place.

    The rest of the docstring is for people, not for the model.
    """
    if place.city == "Atlantis":
        raise ConnectorError("not_found", f"no weather for {place.city}", retryable=False)
    rain = place.city == "Wuhan"
    offset = at.utcoffset()
    return {
        "city": place.city,
        "country": place.country,
        "hour": at.hour,  # a datetime, not the string the model sent
        "utc_offset_s": offset.total_seconds() if offset else 0,
        "rain": rain,
        "units": units,
        "title": title,
    }


@tool
async def count(words: list[str], *, at_least: int = 1) -> int:
    """Count the words at least as long as `at_least`."""
    return sum(1 for w in words if len(w) >= at_least)


def helper() -> None:
    """Not a tool: no @tool."""
