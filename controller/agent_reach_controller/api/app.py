"""The FastAPI application: routes, health, and the problem+json answers (api/errors.py)."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.routing import Route

from agent_reach_controller.api import (
    agents,
    approvals,
    console,
    errors,
    executors,
    media,
    memory,
    openapi,
    replay,
    runs,
    tools,
    triggers,
)
from agent_reach_controller.api.errors import RETRY_AFTER_S
from agent_reach_controller.api.keys import router as keys_router
from agent_reach_controller.api.lean_submit import LeanSubmit
from agent_reach_controller.api.problems import problem_responses, single_query_values
from agent_reach_controller.api.serving import ShuttingDownError, StorageUnavailableError
from agent_reach_controller.api.tasks import components
from agent_reach_controller.api.tasks import router as tasks_router
from agent_reach_controller.runtime import Components
from agent_reach_controller.storage.engine import DATABASE_ERRORS

Deps = Annotated[Components, Depends(components)]

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
        raise ShuttingDownError(
            "it still serves what was sent, but sends nothing new here; use another replica",
            retry_after=RETRY_AFTER_S,
        )
    try:
        await deps.db.ping()
    except DATABASE_ERRORS as exc:
        raise StorageUnavailableError from exc
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
    except DATABASE_ERRORS as exc:
        raise StorageUnavailableError from exc
    if found is None:
        raise executors.PoolNotFoundError(pool)
    return JSONResponse(found.to_json())


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
    app.include_router(agents.router)
    app.include_router(runs.router)
    app.include_router(memory.router)
    app.include_router(keys_router)
    app.include_router(executors.tokens_router)
    app.include_router(executors.fleet_router)
    app.include_router(triggers.router)
    app.include_router(approvals.router)
    settings = getattr(components_, "settings", None)  # None: only the OpenAPI is wanted
    if settings is None or settings.console:
        console.install(app)
    errors.install(app)
    openapi.install(app)
    # MCP Streamable HTTP (api/mcp.py): served while `app.state.mcp.running()` is entered.
    app.state.mcp = None
    if settings is None or settings.mcp:
        # Imported here: the MCP SDK is not loaded by a controller that does not serve it.
        from agent_reach_controller.api.mcp import McpGateway

        app.state.mcp = McpGateway(components_)
        app.router.routes.append(Route("/mcp", app.state.mcp, methods=["GET", "POST", "DELETE"]))
    # Last: the stack is built once every route and handler is in (nothing is added after).
    app.middleware_stack = LeanSubmit(
        app.build_middleware_stack(), components_, app.exception_handlers
    )
    return app
