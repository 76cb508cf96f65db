"""A tool of the "new order" trigger scenario, written in Python (imported by the executor)."""

from __future__ import annotations

from datetime import date, timedelta


def ship_date(ordered: str, days: int) -> dict[str, str]:
    """The day an order ships: `days` working days after the day it was placed."""
    day = date.fromisoformat(ordered[:10])
    while days > 0:
        day += timedelta(days=1)
        days -= day.weekday() < 5  # Saturday and Sunday do not count
    return {"ships_on": day.isoformat()}
