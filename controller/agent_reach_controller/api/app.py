"""The FastAPI application: routes, health, tools, and the problem+json error mapping."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from http import HTTPStatus
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from agent_reach_controller.api import (
    approvals,
    console,
    executors,
    media,
    openapi,
    replay,
    tools,
    triggers,
)
from agent_reach_controller.api.auth import CsrfError, ForbiddenError, UnauthenticatedError
from agent_reach_controller.api.keys import KeyNotFoundError, UnknownRoleError
from agent_reach_controller.api.keys import router as keys_router
from agent_reach_controller.api.problems import (
    pointer_from_loc,
    problem_response,
    problem_responses,
    single_query_values,
)
from agent_reach_controller.api.tasks import (
    BadJsonError,
    BodyTooLargeError,
    NotATurnError,
    TooManyInFlightError,
    components,
)
from agent_reach_controller.api.tasks import router as tasks_router
from agent_reach_controller.decide.approvals import SeveralAwaitingError
from agent_reach_controller.planning.problems import PlanInvalidError
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.admission import QueueFullError
from agent_reach_controller.services.intake import IdempotencyConflictError
from agent_reach_controller.services.operator import (
    ApprovalExpiredError,
    EditedArgumentsError,
    NotAwaitingApprovalError,
    NotReschedulableError,
    SelfApprovalError,
    StepNotResolvableError,
)
from agent_reach_controller.services.queries import StepNotFoundError, TaskNotFoundError
from agent_reach_controller.services.triggers import TriggerError
from agent_reach_controller.storage.engine import DATABASE_ERRORS, STORAGE_DOWN

log = logging.getLogger(__name__)
Deps = Annotated[Components, Depends(components)]
RETRY_AFTER_S = "2"

meta = APIRouter(tags=["meta"])


@meta.get("/healthz", summary="Liveness: the process is up")
async def healthz() -> dict[str, str | int]:
    """`process` tells apart the workers of one controller (`--workers`)."""
    return {"status": "ok", "process": os.getpid()}


class Ready(BaseModel):
    status: Literal["ready"]


@meta.get(
    "/readyz",
    summary="Readiness: storage answers",
    response_model=Ready,
    responses=problem_responses(503),
)
async def readyz(deps: Deps) -> Response:
    if deps.stopping:
        return problem_response(
            503,
            code="shutting_down",
            title="This controller is stopping",
            detail="it still serves what was sent, but sends nothing new here; use another replica",
            headers={"Retry-After": RETRY_AFTER_S},
        )
    try:
        await deps.db.ping()
    except DATABASE_ERRORS:
        return storage_unavailable()
    return JSONResponse({"status": "ready"})


@meta.get("/metrics", include_in_schema=False)
async def metrics(request: Request, deps: Deps) -> Response:
    """Prometheus scrape, no key needed; OpenMetrics (with exemplars) when the scraper asks."""
    body, content_type = deps.metrics.exposition(request.headers.get("accept", ""))
    return Response(body, headers={"Content-Type": content_type})


@meta.get("/metrics/pools/{pool}", include_in_schema=False)
async def pool_demand(pool: str, deps: Deps) -> Response:
    """One executor pool's share of the work, for autoscalers that read JSON (KEDA's metrics-api
    trigger): no key, like /metrics, so an autoscaler never holds a credential."""
    try:
        found = await deps.autoscaling.demand(pool)
    except DATABASE_ERRORS:
        return storage_unavailable()
    if found is None:
        return problem_response(
            404,
            code="not_found",
            title="No such pool",
            detail=f"no executor token or session names the pool {pool!r}",
        )
    return JSONResponse(found.to_json())


def storage_unavailable() -> Response:
    """503 with Retry-After: the caller should come back, nothing was lost or half-done."""
    return problem_response(
        503,
        code="storage_unavailable",
        title="Storage is unavailable",
        detail="the database did not answer; retry after the delay given",
        headers={"Retry-After": RETRY_AFTER_S},
    )


def _install_state_handlers(app: FastAPI) -> None:
    """409s: what a task or step is now does not allow what was asked."""

    @app.exception_handler(NotATurnError)
    async def not_a_turn(_: Request, exc: NotATurnError) -> Response:
        return problem_response(409, code=exc.code, title=exc.title, detail=str(exc))

    @app.exception_handler(NotReschedulableError)
    async def not_reschedulable(_: Request, exc: NotReschedulableError) -> Response:
        extra: dict[str, Any] = {}
        if exc.not_moved:
            extra["not_moved"] = [asdict(n) for n in exc.not_moved]
        return problem_response(
            409, code="not_reschedulable", title="The step has started", detail=str(exc), **extra
        )

    @app.exception_handler(SeveralAwaitingError)
    async def several_awaiting(_: Request, exc: SeveralAwaitingError) -> Response:
        return problem_response(
            409,
            code="not_decidable",
            title="Several steps wait for a decision",
            detail=str(exc),
            awaiting=exc.awaiting,
        )

    @app.exception_handler(StepNotResolvableError)
    async def not_resolvable(_: Request, exc: StepNotResolvableError) -> Response:
        return problem_response(
            409, code="not_resolvable", title="The step is not awaiting a verdict", detail=str(exc)
        )


def _install_auth_handlers(app: FastAPI) -> None:
    @app.exception_handler(UnauthenticatedError)
    async def unauthenticated(_: Request, exc: UnauthenticatedError) -> Response:
        return problem_response(
            401,
            code="unauthenticated",
            title="An API key is needed",
            detail=exc.detail,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(CsrfError)
    async def csrf_failed(_: Request, exc: CsrfError) -> Response:
        return problem_response(403, code="csrf_failed", title="Not allowed", detail=exc.detail)

    @app.exception_handler(ForbiddenError)
    async def forbidden(_: Request, exc: ForbiddenError) -> Response:
        return problem_response(403, code="forbidden", title="Not allowed", detail=exc.detail)

    @app.exception_handler(UnknownRoleError)
    async def unknown_role(_: Request, exc: UnknownRoleError) -> Response:
        return problem_response(
            422,
            code="invalid_request",
            title="Invalid request",
            detail=str(exc),
            errors=[{"pointer": "/roles", "code": "unknown_role", "detail": str(exc)}],
        )

    @app.exception_handler(SelfApprovalError)
    async def self_approval(_: Request, exc: SelfApprovalError) -> Response:
        return problem_response(
            403, code="separation_of_duties", title="Not allowed", detail=str(exc)
        )

    @app.exception_handler(NotAwaitingApprovalError)
    @app.exception_handler(ApprovalExpiredError)
    async def not_decidable(_: Request, exc: Exception) -> Response:
        return problem_response(
            409,
            code="not_decidable",
            title="The step is not waiting for a decision",
            detail=str(exc),
        )

    @app.exception_handler(EditedArgumentsError)
    async def bad_edit(_: Request, exc: EditedArgumentsError) -> Response:
        return problem_response(
            422,
            code="invalid_arguments",
            title="The edited arguments are invalid",
            detail="; ".join(f"{p.pointer}: {p.detail}" for p in exc.problems[:5]),
            errors=[
                {"pointer": p.pointer, "code": p.code, "detail": p.detail} for p in exc.problems
            ],
        )

    @app.exception_handler(TriggerError)
    async def trigger_refused(_: Request, exc: TriggerError) -> Response:
        errors = [] if exc.pointer is None else [exc.problem()]
        headers = {"WWW-Authenticate": exc.challenge} if exc.challenge else None
        return problem_response(
            exc.status,
            code=exc.code,
            title=exc.title,
            detail=str(exc),
            errors=errors,
            headers=headers,
        )

    @app.exception_handler(KeyNotFoundError)
    async def no_key(_: Request, exc: KeyNotFoundError) -> Response:
        return problem_response(
            404, code="not_found", title="No such key", detail=f"no key {exc.args[0]!r}"
        )


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(PlanInvalidError)
    async def invalid_plan(_: Request, exc: PlanInvalidError) -> Response:
        problems = exc.problems
        return problem_response(
            422,
            code="invalid_plan",
            title="Invalid plan",
            detail=f"the plan has {len(problems)} problem(s); nothing was run",
            errors=[{"pointer": p.pointer, "code": p.code, "detail": p.detail} for p in problems],
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> Response:
        errors = [
            {"pointer": pointer_from_loc(e["loc"]), "code": e["type"], "detail": e["msg"]}
            for e in exc.errors()
        ]
        return problem_response(
            422,
            code="invalid_request",
            title="Invalid request",
            detail="; ".join(f"{e['pointer']}: {e['detail']}" for e in errors[:5]),
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI's own errors (a body it cannot parse, no such route or method) as problem+json.
        phrase = HTTPStatus(exc.status_code).phrase
        parse_error = exc.status_code == 400 and "parsing the body" in str(exc.detail)
        return problem_response(
            exc.status_code,
            code="invalid_json" if parse_error else phrase.lower().replace(" ", "_"),
            title="The body is not valid JSON" if parse_error else phrase,
            detail=str(exc.detail),
            headers=dict(exc.headers) if exc.headers else None,
        )

    @app.exception_handler(BadJsonError)
    async def bad_json(_: Request, exc: BadJsonError) -> Response:
        return problem_response(
            400, code="invalid_json", title="The body is not valid JSON", detail=str(exc)
        )

    @app.exception_handler(BodyTooLargeError)
    async def too_large(_: Request, exc: BodyTooLargeError) -> Response:
        return problem_response(413, code="too_large", title="Request too large", detail=str(exc))

    @app.exception_handler(QueueFullError)
    @app.exception_handler(TooManyInFlightError)
    async def overloaded(request: Request, exc: Exception) -> Response:
        retry_after = request.app.state.components.settings.overload_retry_after_seconds
        return problem_response(
            429,
            code=getattr(exc, "code", "overloaded"),
            title=getattr(exc, "title", "Too much work is queued"),
            detail=f"{exc}; nothing was accepted, retry later",
            headers={"Retry-After": str(retry_after)},
        )

    @app.exception_handler(TaskNotFoundError)
    async def not_found(_: Request, exc: TaskNotFoundError) -> Response:
        return problem_response(
            404, code="not_found", title="No such task", detail=f"no task {exc.args[0]!r}"
        )

    @app.exception_handler(StepNotFoundError)
    async def no_step(_: Request, exc: StepNotFoundError) -> Response:
        return problem_response(
            404, code="not_found", title="No such step", detail=f"no step {exc.args[0]!r}"
        )

    @app.exception_handler(IdempotencyConflictError)
    async def conflict(_: Request, exc: IdempotencyConflictError) -> Response:
        return problem_response(
            409,
            code="idempotency_conflict",
            title="This Idempotency-Key was used with a different request",
            detail=str(exc),
            task_id=exc.task_id,
        )


def _install_fallback_handlers(app: FastAPI) -> None:
    """A lost database is 503 with Retry-After; anything else unexpected is a logged 500."""

    async def storage_down(_: Request, exc: Exception) -> Response:
        log.warning("storage unavailable: %s", type(exc).__name__, extra={"event": "storage_down"})
        return storage_unavailable()

    async def internal(_: Request, exc: Exception) -> Response:
        # The detail stays in the log (with the trace); the caller gets no internals.
        log.error(
            "unhandled error: %s", type(exc).__name__, exc_info=exc, extra={"event": "api_error"}
        )
        return problem_response(
            500, code="internal", title="Internal error", detail="the error was logged"
        )

    async def client_gone(_: Request, exc: Exception) -> Response:
        # The caller hung up while its request was read: nobody to answer, nothing went wrong
        # here (a submit whose body never arrived stored nothing).
        log.info(
            "the client disconnected before its request was read",
            extra={"event": "api_client_gone"},
        )
        return Response(status_code=499)

    app.add_exception_handler(Exception, internal)
    app.add_exception_handler(ClientDisconnect, client_gone)
    for lost in STORAGE_DOWN:
        app.add_exception_handler(lost, storage_down)


def create_app(components_: Components) -> FastAPI:
    """The REST application over already-opened components."""
    app = FastAPI(
        title="Agent-Reach",
        version="0.1.0",
        summary="Model intents in; real, verified actions and honest receipts out.",
        dependencies=[Depends(single_query_values), Depends(media.require_json_body)],
        # FastAPI's server span ("POST /v1/tasks") is the request's span; its spans around
        # dependency solving and the endpoint would double the spans of every call for nothing
        # a trace reader needs (ours name the work: submit_task, validate_plan, store_task).
        telemetry={"operation_spans": False},
        generate_unique_id_function=openapi.operation_id,
    )
    app.state.components = components_
    app.include_router(meta)
    app.include_router(tasks_router)
    app.include_router(replay.router)
    app.include_router(tools.catalogue)  # before `tools.router`: `/v1/tools:export` is no tool
    app.include_router(tools.router)
    app.include_router(keys_router)
    app.include_router(executors.tokens_router)
    app.include_router(executors.fleet_router)
    app.include_router(triggers.router)
    app.include_router(approvals.router)
    settings = getattr(components_, "settings", None)  # None: only the OpenAPI is wanted
    if settings is None or settings.console:
        console.install(app)
    _install_error_handlers(app)
    _install_auth_handlers(app)
    _install_state_handlers(app)
    tools.install_handlers(app)
    _install_fallback_handlers(app)
    openapi.install(app)
    # MCP Streamable HTTP (api/mcp.py): served while `app.state.mcp.running()` is entered.
    app.state.mcp = None
    if settings is None or settings.mcp:
        # Imported here: the MCP SDK is not loaded by a controller that does not serve it.
        from agent_reach_controller.api.mcp import McpGateway

        app.state.mcp = McpGateway(components_)
        app.router.routes.append(Route("/mcp", app.state.mcp, methods=["GET", "POST", "DELETE"]))
    return app
