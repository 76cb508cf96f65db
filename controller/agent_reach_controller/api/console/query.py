"""What a console page reads from its address: every parameter checked, a bad one named.

A page declares the parameters it reads, each with a check. A parameter it does not read, one
given twice, or a value its check refuses is never ignored: the page answers 400 with the
console's page and headers, naming each parameter and what is wrong with it. An empty value is
no value (a form's "any" option sends one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Depends
from starlette.datastructures import QueryParams

from agent_reach_controller.api.console.render import SignedIn, Visit, local_next
from agent_reach_controller.api.schemas import RFC3339, TOOL_NAME

Check = Callable[[str], None]
"""Refuses a value by raising ValueError with what is wrong (a phrase after the name)."""

# A datetime-local input sends no offset (the form says its times are UTC).
_LOCAL_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d)?", re.ASCII)
_TASK_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII)
_TOOL_NAME = re.compile(TOOL_NAME, re.ASCII)
_LONGEST_NAME = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class BadParameter:
    """One query parameter and what is wrong with it."""

    name: str
    problem: str


class BadQueryError(Exception):
    """A page's address carries bad parameters; `visit` is None on the sign-in page."""

    def __init__(self, visit: Visit | None, bad: Sequence[BadParameter]) -> None:
        super().__init__("; ".join(f"{b.name}: {b.problem}" for b in bad))
        self.visit = visit
        self.bad = tuple(bad)


def check_query(
    query: QueryParams, checks: Mapping[str, Check]
) -> tuple[dict[str, str], list[BadParameter]]:
    """The parameters a page reads (absent or empty ones left out) and every bad one."""
    asked: dict[str, str] = {}
    bad: list[BadParameter] = []
    for name in dict.fromkeys(query.keys()):
        values = query.getlist(name)
        check = checks.get(name)
        if check is None:
            reads = f"it reads {', '.join(checks)}" if checks else "it reads none"
            problem = f"is not a parameter of this page ({reads})"
            bad.append(BadParameter(name=_shown(name), problem=problem))
        elif len(values) > 1:
            problem = f"is given {len(values)} times; give it once"
            bad.append(BadParameter(name=name, problem=problem))
        elif values[0]:
            try:
                check(values[0])
            except ValueError as exc:
                bad.append(BadParameter(name=name, problem=str(exc)))
            else:
                asked[name] = values[0]
    return asked, bad


def _shown(name: str) -> str:
    """A name as the page shows it: a made-up one may be long (it is escaped like all text)."""
    return name if len(name) <= _LONGEST_NAME else name[: _LONGEST_NAME - 1] + "…"


def a_console_page(value: str) -> None:
    """Where the sign-in form returns to: a page of this console, never another site."""
    if local_next(value, default="") != value:
        raise ValueError("is not a page of this console (a path starting /console)")


def reads(**checks: Check) -> Any:
    """A page's parameters as a dependency: the checked values, or BadQueryError (after the
    sign-in, so someone not signed in is sent to sign in first)."""

    async def read(found: SignedIn) -> dict[str, str]:
        asked, bad = check_query(found.request.query_params, checks)
        if bad:
            raise BadQueryError(found, bad)
        return asked

    return Depends(read)


def one_of(allowed: Sequence[str]) -> Check:
    def check(value: str) -> None:
        if value not in allowed:
            raise ValueError(f"must be one of: {', '.join(allowed)}")

    return check


def at_most(longest: int) -> Check:
    def check(value: str) -> None:
        if len(value) > longest:
            raise ValueError(f"is {len(value)} characters long; the most is {longest}")

    return check


def a_tool_name(value: str) -> None:
    if not _TOOL_NAME.fullmatch(value):
        raise ValueError(
            "is not a tool name (a letter, then at most 127 letters, digits, '_', '.' or '-')"
        )


def a_task_id(value: str) -> None:
    if not _TASK_ID.fullmatch(value):
        raise ValueError(
            "is not a task id (36 characters like 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b): "
            "follow the list's 'Older tasks' link"
        )


def a_run_id(value: str) -> None:
    if not _TASK_ID.fullmatch(value):  # a run's id is made as a task's is
        raise ValueError(
            "is not a run id (36 characters like 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b): "
            "follow the list's 'Older runs' link"
        )


def a_time(value: str) -> None:
    """A time: the form's date and time (read as UTC) or an RFC 3339 date-time."""
    if not (_LOCAL_TIME.fullmatch(value) or RFC3339.fullmatch(value)):
        raise ValueError(
            "is not a time: give a date and time like 2026-12-05T08:00 (UTC) "
            "or an RFC 3339 date-time like 2026-12-05T08:00:00Z"
        )
    try:
        moment(value)
    except ValueError:
        raise ValueError("is not a date and time that exists") from None


def utc(value: str | None) -> str | None:
    """A checked time as the /v1 API takes it: the form's times (no offset) are UTC."""
    if value and _LOCAL_TIME.fullmatch(value):
        return value + ("Z" if value.count(":") == 2 else ":00Z")
    return value or None


def moment(value: str) -> datetime:
    """A time as an instant (to compare two); ValueError if no such date and time exists."""
    return datetime.fromisoformat((utc(value) or value).upper()).astimezone(UTC)
