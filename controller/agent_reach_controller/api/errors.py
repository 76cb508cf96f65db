"""Which problem each error is: one row per exception type, one handler over the rows.

The status and title of a code come from the error table of the contract package
(`agent_reach.errors`: `ErrorCode`, and `ProblemCode` for the codes only this API answers). A row
here says which code an exception is, and only what that error adds: a title that says more than
its code's ("No such task"), the detail, extra problem members, headers. Adding an error is one
row here, and one row in the error table when its code is new.

An exception no row names is a 500 `internal` problem whose text stays in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from http import HTTPStatus
from typing import Any, Generic, TypeVar, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from agent_reach.errors import ERROR_KINDS, PROBLEM_KINDS, ErrorCode, ProblemCode, problem_kind
from agent_reach_controller.api.auth import CsrfError, ForbiddenError, UnauthenticatedError
from agent_reach_controller.api.events import TooManyStreamsError
from agent_reach_controller.api.executors import PoolNotFoundError, PoolTokenNotFoundError
from agent_reach_controller.api.keys import KeyNotFoundError, UnknownRoleError
from agent_reach_controller.api.problems import pointer_from_loc, problem_response
from agent_reach_controller.api.serving import (
    NotServingError,
    NotStartedError,
    ShuttingDownError,
    StorageUnavailableError,
)
from agent_reach_controller.api.tasks import (
    BadJsonError,
    BodyTooLargeError,
    NotATurnError,
    TooManyInFlightError,
)
from agent_reach_controller.api.tools import ImportInvalidError, ToolRevisionMismatchError
from agent_reach_controller.decide.approvals import SeveralAwaitingError
from agent_reach_controller.planning.problems import PlanInvalidError
from agent_reach_controller.services.admission import QueueFullError
from agent_reach_controller.services.intake import IdempotencyConflictError
from agent_reach_controller.services.memory import (
    MemoryConflictError,
    MemoryInputError,
    MemoryNotFoundError,
    MemoryQuotaError,
)
from agent_reach_controller.services.operator import (
    ApprovalExpiredError,
    EditedArgumentsError,
    NotAwaitingApprovalError,
    NotReschedulableError,
    SelfApprovalError,
    StepNotResolvableError,
)
from agent_reach_controller.services.queries import StepNotFoundError, TaskNotFoundError
from agent_reach_controller.services.registry import (
    CatalogRejectedError,
    StaleRevisionError,
    ToolExistsError,
    ToolNotFoundError,
)
from agent_reach_controller.services.runs import (
    AgentNotFoundError,
    RunInputError,
    RunNotFoundError,
    RunStateError,
)
from agent_reach_controller.services.triggers import TriggerError
from agent_reach_controller.storage.engine import STORAGE_DOWN

log = logging.getLogger(__name__)

# How long a caller waits before it retries when storage is down (nothing was lost or half-done).
RETRY_AFTER_S = 2

E = TypeVar("E", bound=Exception)


def _nothing(_: Exception) -> dict[str, Any]:
    return {}


def _no_headers(_: Request, __: Exception) -> dict[str, str] | None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer(Generic[E]):
    """How the API answers one exception type (and its subclasses)."""

    error: type[E]
    # The code, whose status and title the error table gives. None: the exception carries its
    # own `code` and `title` (a family of errors, each subclass with its own: triggers).
    code: ErrorCode | ProblemCode | None
    title: str | None = None  # when this error says more than its code's title
    detail: Callable[[E], str] = str
    more: Callable[[E], dict[str, Any]] = _nothing  # extra members: `errors`, `awaiting`, …
    headers: Callable[[Request, E], dict[str, str] | None] = _no_headers
    # A log event: an outage the caller is told to wait out is worth a warning.
    warn: str | None = None


def _problems(problems: Iterable[Any]) -> dict[str, Any]:
    """`errors`: one per problem (a plan's, edited arguments'), each with its JSON pointer."""
    return {
        "errors": [{"pointer": p.pointer, "code": p.code, "detail": p.detail} for p in problems]
    }


def _body_problems(problems: Iterable[Any]) -> list[dict[str, Any]]:
    """A memory's problems, whose pointers are into the entry, as pointers into the body."""
    return [
        {"pointer": f"/body{p.pointer}", "code": "invalid_memory", "detail": p.detail}
        for p in problems
    ]


def _invalid(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [
        {"pointer": pointer_from_loc(e["loc"]), "code": e["type"], "detail": e["msg"]}
        for e in exc.errors()
    ]


def _first(errors: Iterable[dict[str, Any]]) -> str:
    """The first five problems in one sentence."""
    return "; ".join(f"{e['pointer']}: {e['detail']}" for e in list(errors)[:5])


def _retry_later(request: Request, _: Exception) -> dict[str, str]:
    retry_after = request.app.state.components.settings.overload_retry_after_seconds
    return {"Retry-After": str(retry_after)}


def _retry_storage(_: Request, __: Exception) -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)}


def _retry_elsewhere(_: Request, exc: NotServingError) -> dict[str, str]:
    return {"Retry-After": str(exc.retry_after)}


def _not_moved(exc: NotReschedulableError) -> dict[str, Any]:
    return {"not_moved": [asdict(n) for n in exc.not_moved]} if exc.not_moved else {}


def _trigger_more(exc: TriggerError) -> dict[str, Any]:
    return {} if exc.pointer is None else {"errors": [exc.problem()]}


def _trigger_challenge(_: Request, exc: TriggerError) -> dict[str, str] | None:
    return {"WWW-Authenticate": exc.challenge} if exc.challenge else None


ANSWERS: tuple[Answer[Any], ...] = (
    # Nothing by that name (for this caller).
    Answer(
        error=TaskNotFoundError,
        code=ErrorCode.NOT_FOUND,
        title="No such task",
        detail=lambda e: f"no task {e.args[0]!r}",
    ),
    Answer(
        error=StepNotFoundError,
        code=ErrorCode.NOT_FOUND,
        title="No such step",
        detail=lambda e: f"no step {e.args[0]!r}",
    ),
    Answer(error=ToolNotFoundError, code=ErrorCode.NOT_FOUND, title="No such tool"),
    Answer(error=AgentNotFoundError, code=ErrorCode.NOT_FOUND, title="No such agent"),
    Answer(error=RunNotFoundError, code=ErrorCode.NOT_FOUND, title="No such run"),
    Answer(error=RunStateError, code=ProblemCode.RUN_NOT_ENDED),
    Answer(
        error=RunInputError,
        code=ProblemCode.INVALID_REQUEST,
        detail=lambda e: e.detail,
        more=lambda e: {
            "errors": [{"pointer": e.pointer, "code": "invalid_request", "detail": e.detail}]
        },
    ),
    Answer(
        error=MemoryNotFoundError,
        code=ErrorCode.NOT_FOUND,
        title="No such memory",
        detail=lambda e: f"no memory {e.memory_id!r}",
    ),
    Answer(
        error=KeyNotFoundError,
        code=ErrorCode.NOT_FOUND,
        title="No such key",
        detail=lambda e: f"no key {e.args[0]!r}",
    ),
    Answer(
        error=PoolTokenNotFoundError,
        code=ErrorCode.NOT_FOUND,
        title="No such executor token",
        detail=lambda e: f"no live database token {e.args[0]!r}",
    ),
    Answer(
        error=PoolNotFoundError,
        code=ErrorCode.NOT_FOUND,
        title="No such pool",
        detail=lambda e: f"no executor token or session names the pool {e.args[0]!r}",
    ),
    # Who asks, and whether they may.
    Answer(
        error=UnauthenticatedError,
        code=ProblemCode.UNAUTHENTICATED,
        detail=lambda e: e.detail,
        headers=lambda _, __: {"WWW-Authenticate": "Bearer"},
    ),
    Answer(error=CsrfError, code=ProblemCode.CSRF_FAILED, detail=lambda e: e.detail),
    Answer(
        error=ForbiddenError,
        code=ErrorCode.FORBIDDEN,
        title="Not allowed",
        detail=lambda e: e.detail,
    ),
    Answer(error=SelfApprovalError, code=ProblemCode.SEPARATION_OF_DUTIES),
    # What was sent.
    Answer(
        error=RequestValidationError,
        code=ProblemCode.INVALID_REQUEST,
        detail=lambda e: _first(_invalid(e)),
        more=lambda e: {"errors": _invalid(e)},
    ),
    Answer(
        error=UnknownRoleError,
        code=ProblemCode.INVALID_REQUEST,
        more=lambda e: {
            "errors": [{"pointer": "/roles", "code": "unknown_role", "detail": str(e)}]
        },
    ),
    Answer(error=BadJsonError, code=ProblemCode.INVALID_JSON),
    Answer(error=BodyTooLargeError, code=ProblemCode.TOO_LARGE),
    Answer(
        error=PlanInvalidError,
        code=ErrorCode.INVALID_PLAN,
        detail=lambda e: f"the plan has {len(e.problems)} problem(s); nothing was run",
        more=lambda e: _problems(e.problems),
    ),
    Answer(
        error=EditedArgumentsError,
        code=ErrorCode.INVALID_ARGUMENTS,
        title="The edited arguments are invalid",
        detail=lambda e: "; ".join(f"{p.pointer}: {p.detail}" for p in e.problems[:5]),
        more=lambda e: _problems(e.problems),
    ),
    Answer(
        error=ImportInvalidError,
        code=ProblemCode.INVALID_TOOLS,
        detail=lambda e: _first(e.errors),
        more=lambda e: {"errors": e.errors},
    ),
    # Too much work: nothing was accepted, come back later.
    Answer(
        error=QueueFullError,
        code=ProblemCode.OVERLOADED,
        detail=lambda e: f"{e}; nothing was accepted, retry later",
        headers=_retry_later,
    ),
    Answer(
        error=TooManyInFlightError,
        code=ProblemCode.TOO_MANY_IN_FLIGHT,
        detail=lambda e: f"{e}; nothing was accepted, retry later",
        headers=_retry_later,
    ),
    Answer(error=TooManyStreamsError, code=ProblemCode.TOO_MANY_STREAMS, headers=_retry_later),
    *(
        Answer(
            error=lost,
            code=ErrorCode.STORAGE_UNAVAILABLE,
            detail=lambda _: "the database did not answer; retry after the delay given",
            headers=_retry_storage,
            # An outage met by a request is worth a warning; a probe's answer says it already.
            warn=None if lost is StorageUnavailableError else "storage_down",
        )
        for lost in (*STORAGE_DOWN, StorageUnavailableError)
    ),
    # Not served here now: another replica may answer at once.
    Answer(error=ShuttingDownError, code=ProblemCode.SHUTTING_DOWN, headers=_retry_elsewhere),
    Answer(error=NotStartedError, code=ProblemCode.NOT_STARTED, headers=_retry_elsewhere),
    # What a task or step is now does not allow what was asked.
    Answer(error=NotATurnError, code=ProblemCode.NOT_A_TURN),
    Answer(error=NotReschedulableError, code=ProblemCode.NOT_RESCHEDULABLE, more=_not_moved),
    Answer(
        error=SeveralAwaitingError,
        code=ProblemCode.NOT_DECIDABLE,
        title="Several steps wait for a decision",
        more=lambda e: {"awaiting": e.awaiting},
    ),
    Answer(error=NotAwaitingApprovalError, code=ProblemCode.NOT_DECIDABLE),
    Answer(error=ApprovalExpiredError, code=ProblemCode.NOT_DECIDABLE),
    Answer(error=StepNotResolvableError, code=ProblemCode.NOT_RESOLVABLE),
    Answer(
        error=IdempotencyConflictError,
        code=ErrorCode.IDEMPOTENCY_CONFLICT,
        more=lambda e: {"task_id": e.task_id},
    ),
    # Long-term memory. An entry's problems point into the body that sent it (POST, PATCH); a
    # refused secret is named by its kind, never echoed.
    Answer(
        error=MemoryInputError,
        code=ProblemCode.INVALID_REQUEST,
        detail=lambda e: _first(_body_problems(e.problems)),
        more=lambda e: {"errors": _body_problems(e.problems)},
    ),
    Answer(
        error=MemoryQuotaError,
        code=ProblemCode.MEMORY_QUOTA_EXCEEDED,
        detail=lambda e: f"{e}; forget some of its memories first",
    ),
    Answer(
        error=MemoryConflictError,
        code=ProblemCode.MEMORY_CHANGED,
        detail=lambda _: "the memory is not at the version If-Match names; read it again",
    ),
    # The tool catalogue.
    Answer(error=ToolExistsError, code=ProblemCode.TOOL_EXISTS),
    Answer(error=StaleRevisionError, code=ProblemCode.REVISION_MISMATCH),
    Answer(error=ToolRevisionMismatchError, code=ProblemCode.REVISION_MISMATCH),
    Answer(
        error=CatalogRejectedError,
        code=ProblemCode.CATALOG_CONFLICT,
        detail=lambda e: "; ".join(e.errors[:5]),
        more=lambda e: {
            "errors": [{"pointer": "", "code": "catalog_conflict", "detail": x} for x in e.errors]
        },
    ),
    # Triggers: each subclass carries its code.
    Answer(error=TriggerError, code=None, more=_trigger_more, headers=_trigger_challenge),
)

ANSWER_OF: dict[type[Exception], Answer[Any]] = {a.error: a for a in ANSWERS}


def answer_of(error: type[BaseException]) -> Answer[Any] | None:
    """The row for this exception type: its own, else its nearest base's (as Starlette picks)."""
    for cls in error.__mro__:
        if cls in ANSWER_OF:
            return ANSWER_OF[cls]
    return None


async def answer(request: Request, exc: Exception) -> Response:
    """The one handler: the problem the table says this exception is, or a logged 500."""
    row = answer_of(type(exc))
    code = None if row is None else row.code or getattr(exc, "code", None)
    kind = None if code is None else problem_kind(code)
    if row is None or code is None or kind is None:
        # The detail stays in the log (with the trace); the caller gets no internals.
        log.error(
            "unhandled error: %s", type(exc).__name__, exc_info=exc, extra={"event": "api_error"}
        )
        internal = ERROR_KINDS[ErrorCode.INTERNAL]
        return problem_response(
            internal.http_status,
            code=ErrorCode.INTERNAL.value,
            title=internal.title,
            detail="the error was logged",
        )
    if row.warn is not None:
        log.warning("%s: %s", kind.title, type(exc).__name__, extra={"event": row.warn})
    # A title this error says more than its code's: the row's, or the one the exception carries.
    title = row.title or (getattr(exc, "title", None) if row.code is None else None)
    more = row.more(exc)
    errors = more.pop("errors", ())
    return problem_response(
        kind.http_status,
        code=str(code),
        title=title or kind.title,
        detail=row.detail(exc),
        errors=errors,
        headers=row.headers(request, exc),
        **more,
    )


async def http_error(_: Request, error: Exception) -> Response:
    """FastAPI's own errors (a body it cannot parse, no such route or method) as problem+json:
    their code is their HTTP status's phrase (`method_not_allowed`)."""
    exc = cast(StarletteHTTPException, error)
    phrase = HTTPStatus(exc.status_code).phrase
    parse_error = exc.status_code == 400 and "parsing the body" in str(exc.detail)
    invalid_json = PROBLEM_KINDS[ProblemCode.INVALID_JSON]
    return problem_response(
        exc.status_code,
        code=ProblemCode.INVALID_JSON.value if parse_error else phrase.lower().replace(" ", "_"),
        title=invalid_json.title if parse_error else phrase,
        detail=str(exc.detail),
        headers=dict(exc.headers) if exc.headers else None,
    )


async def client_gone(_: Request, __: Exception) -> Response:
    """The caller hung up while its request was read: nobody to answer, nothing went wrong here
    (a submit whose body never arrived stored nothing)."""
    log.info(
        "the client disconnected before its request was read", extra={"event": "api_client_gone"}
    )
    return Response(status_code=499)


def install(app: FastAPI) -> None:
    """Answer every row's exception, and any other, with `answer`."""
    for error in ANSWER_OF:
        app.add_exception_handler(error, answer)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ClientDisconnect, client_gone)
    app.add_exception_handler(Exception, answer)
