"""The OpenAPI document: FastAPI's, completed with what it cannot see.

The submit route reads its body itself (one route, several dialects), so the dialects' models are
added as components here; every problem response refers to the one Problem component; operation
ids are the route functions' names, which a generated client turns into its method names.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel

from agent_reach_controller.api.schemas import Problem
from agent_reach_controller.planning.dialects import DIALECTS

REF = "#/components/schemas/{model}"


def operation_id(route: APIRoute) -> str:
    """A route's operationId: its function's name (`submit_task`, `get_task`)."""
    return route.name


def component_ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=_name(model))}


def submit_body() -> dict[str, Any]:
    """The submit route's request body: one of the dialects' models."""
    return {
        "required": True,
        "description": "A plan, or a model's turn as its vendor's SDK dumps it (OpenAI Chat "
        "assistant message, OpenAI Responses output items, Anthropic assistant message); "
        "recognised from the body, or named by `?dialect=`. OpenAI Responses output items may "
        "also be sent as a bare array.",
        "content": {
            "application/json": {
                "schema": {"oneOf": [component_ref(d.body) for d in DIALECTS.values()]}
            }
        },
    }


def install(app: FastAPI) -> None:
    """Serve the completed document at /openapi.json, built once, on first use, off the loop.

    Building it takes the schema of every model: a second or more of CPU on a small machine.
    FastAPI's own route builds it on the event loop, which would hold every submit, poll and
    heartbeat of this controller for that long; here a thread builds it while the loop serves.
    """
    build: Callable[[], dict[str, Any]] = app.openapi
    building = threading.Lock()

    def openapi() -> dict[str, Any]:
        with building:
            if app.openapi_schema is None:
                doc = build()
                schemas = doc.setdefault("components", {}).setdefault("schemas", {})
                models: list[type[BaseModel]] = [Problem, *(d.body for d in DIALECTS.values())]
                for model in models:
                    _add(schemas, model)
                app.openapi_schema = doc
            return app.openapi_schema

    async def serve(request: Request) -> JSONResponse:
        cached = app.openapi_schema
        doc = cached if cached is not None else await asyncio.to_thread(openapi)
        # As FastAPI's route does: a controller mounted under a prefix names it as its server.
        root_path = request.scope.get("root_path", "").rstrip("/")
        servers = doc.get("servers", [])
        if (
            root_path
            and app.root_path_in_servers
            and root_path not in {s.get("url") for s in servers}
        ):
            doc = {**doc, "servers": [{"url": root_path}, *servers]}
        return JSONResponse(doc)

    app.openapi = openapi  # type: ignore[method-assign]
    if app.openapi_url:
        url = app.openapi_url
        app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != url]
        app.add_route(url, serve, include_in_schema=False)


def _name(model: type[BaseModel]) -> str:
    return model.__name__


def _add(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    found = model.model_json_schema(ref_template=REF)
    defs = found.pop("$defs", {})
    for name, schema in {**defs, _name(model): found}.items():
        if name in schemas and schemas[name] != schema:
            raise ValueError(f"two different OpenAPI components are named {name!r}")
        schemas[name] = schema
