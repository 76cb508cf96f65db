"""The web console at /console: server-rendered pages over the /v1 API, for people."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from agent_reach_controller.api.console import actions, pages
from agent_reach_controller.api.console.render import NotSignedInError, to_sign_in


def install(app: FastAPI) -> None:
    """Serve the console on this app (any replica: its sessions are in the database)."""
    app.include_router(actions.router)
    app.include_router(pages.router)

    @app.exception_handler(NotSignedInError)
    async def not_signed_in(request: Request, _: NotSignedInError) -> Response:
        return to_sign_in(request)
