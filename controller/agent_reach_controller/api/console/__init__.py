"""The web console at /console: server-rendered pages over the /v1 API, for people."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from agent_reach_controller.api.console import actions, memory, pages, runs
from agent_reach_controller.api.console.query import BadQueryError
from agent_reach_controller.api.console.render import NotSignedInError, page, to_sign_in


def install(app: FastAPI) -> None:
    """Serve the console on this app (any replica: its sessions are in the database)."""
    app.include_router(actions.router)
    app.include_router(pages.router)
    app.include_router(runs.router)
    app.include_router(memory.router)

    @app.exception_handler(NotSignedInError)
    async def not_signed_in(request: Request, _: NotSignedInError) -> Response:
        return to_sign_in(request)

    @app.exception_handler(BadQueryError)
    async def bad_query(request: Request, exc: BadQueryError) -> Response:
        # The page itself, without its query, is the way back.
        context = {"bad": exc.bad, "back": request.url.path}
        if exc.visit is None:
            return page("bad_query.html", status=400, **context)
        return exc.visit.page("bad_query.html", status=400, **context)
