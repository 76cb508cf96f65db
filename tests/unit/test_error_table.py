"""The API answers errors from one table: each row's code is in the contract's error table (which
gives its status and title), and an exception no row names is a 500 that keeps its text to
itself."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from fastapi import Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from agent_reach.errors import ERROR_KINDS, PROBLEM_KINDS, ErrorCode, ProblemCode, problem_kind
from agent_reach_controller.api import errors
from agent_reach_controller.api.app import create_app
from agent_reach_controller.api.problems import PROBLEM_MEDIA_TYPE


def _subclasses(error: type[Exception]) -> list[type[Exception]]:
    found = [error]
    for sub in error.__subclasses__():
        found += _subclasses(sub)
    return found


def _request() -> Request:
    return Request(
        {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
    )


@pytest.mark.parametrize("row", errors.ANSWERS, ids=lambda row: row.error.__name__)
def test_each_row_names_a_code_of_the_error_table(row: errors.Answer[Exception]) -> None:
    # A row without a code is a family whose every member carries its own.
    carried = [row.code] if row.code is not None else [c.code for c in _subclasses(row.error)]  # type: ignore[attr-defined]
    for code in carried:
        kind = problem_kind(code)
        assert kind is not None, f"{row.error.__name__}: {code!r} is not in agent_reach.errors"
        assert 400 <= kind.http_status < 600


def test_a_family_that_carries_its_codes_agrees_with_the_table() -> None:
    # Triggers carry `status` as well: it must be the one the table gives their code.
    for row in (r for r in errors.ANSWERS if r.code is None):
        for error in _subclasses(row.error):
            kind = problem_kind(error.code)  # type: ignore[attr-defined]
            assert kind is not None
            assert kind.http_status == error.status, error.__name__  # type: ignore[attr-defined]


def test_an_exception_has_one_row() -> None:
    assert len(errors.ANSWER_OF) == len(errors.ANSWERS)


def test_the_api_codes_are_not_step_outcomes() -> None:
    # A receipt's code and the API's own codes are two lists: no code is in both.
    assert not {c.value for c in ProblemCode} & {c.value for c in ErrorCode}
    assert set(PROBLEM_KINDS) == set(ProblemCode)
    assert set(ERROR_KINDS) == set(ErrorCode)


def test_the_app_answers_every_row_with_the_one_handler() -> None:
    app = create_app(SimpleNamespace(settings=None))  # type: ignore[arg-type]
    handlers = app.exception_handlers
    assert all(handlers[row.error] is errors.answer for row in errors.ANSWERS)
    assert handlers[Exception] is errors.answer
    # Besides the table: FastAPI's own HTTP errors and a caller that hung up.
    others = {k for k, v in handlers.items() if v is not errors.answer}
    assert {StarletteHTTPException, ClientDisconnect} <= others


async def test_an_unmapped_exception_is_a_500_that_keeps_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "password=hunter2 at db.internal:5432"
    with caplog.at_level(logging.ERROR, logger=errors.__name__):
        answer = await errors.answer(_request(), KeyError(secret))
    assert answer.status_code == 500
    assert answer.media_type == PROBLEM_MEDIA_TYPE
    body = json.loads(bytes(answer.body))
    assert body == {
        "type": "urn:agent-reach:problem:internal",
        "title": "Internal error",
        "status": 500,
        "detail": "the error was logged",
        "code": "internal",
    }
    assert "hunter2" not in bytes(answer.body).decode()
    # The log keeps what the caller was not told.
    assert [r.event for r in caplog.records] == ["api_error"]  # type: ignore[attr-defined]


async def test_a_mapped_exception_takes_status_and_title_from_the_table() -> None:
    from agent_reach_controller.services.registry import ToolExistsError

    answer = await errors.answer(_request(), ToolExistsError("mail"))
    kind = PROBLEM_KINDS[ProblemCode.TOOL_EXISTS]
    body = json.loads(bytes(answer.body))
    assert (answer.status_code, body["title"], body["code"]) == (
        kind.http_status,
        kind.title,
        "tool_exists",
    )
    assert body["detail"] == "tool 'mail' already exists; update it instead"
