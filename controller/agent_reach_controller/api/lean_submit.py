"""The submit's short way in: `POST /v1/tasks` served in front of the framework's layers.

A submit is the call a service makes once per task. Through FastAPI it passes some twenty ASGI
layers, and the framework resolves the route's dependencies on every request (the caller, the
query model, two headers, the three security schemes the OpenAPI declares, the app's own checks):
about a sixth of the controller's CPU per task under load, more than validating and storing the
task. `LeanSubmit` sits in front of the app's middleware stack and serves the common submit itself,
with the route's own code (`key_principal`, `take_submit`, `accepted_response`) and, for every
error, the app's own exception handlers: the same answers, byte for byte.

It serves a submit only when nothing the framework adds could change the answer, and hands every
other request to the stack untouched (nothing read from it): a query string (`?wait`, `?dialect`,
`?atomic`, or a wrong one), no API key (a console session, or the 401), a body not declared JSON
(the 415), a header it reads given twice, an Idempotency-Key longer than the route takes (the
422), a root path, or tracing on (FastAPI's server span is then the request's span).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from agent_reach import telemetry
from agent_reach_controller.api.auth import key_principal, token_of
from agent_reach_controller.api.media import is_json
from agent_reach_controller.api.tasks import IDEMPOTENCY_KEY_MAX, accepted_response, take_submit
from agent_reach_controller.runtime import Components

# The headers a lean submit reads (lowercase, as ASGI gives them): any given twice sends the
# request the long way, where the framework decides what a repeated header means.
_READ = frozenset(
    {
        b"authorization",
        b"x-api-key",
        b"content-type",
        b"content-length",
        b"idempotency-key",
        b"traceparent",
    }
)


@dataclass(frozen=True, slots=True)
class _Submit:
    """What a lean submit reads from its request's headers."""

    token: str
    idempotency_key: str | None
    traceparent: str | None


class LeanSubmit:
    """ASGI: the common submit served directly; everything else passed to `app`."""

    def __init__(self, app: ASGIApp, components: Components, handlers: Mapping[Any, Any]) -> None:
        self.app = app
        self._components = components
        # The app's exception handlers by exception class (status-code keys left out).
        self._handlers = {k: v for k, v in handlers.items() if isinstance(k, type)}
        self.served = 0  # submits it answered itself (the rest went down the stack)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        submit = _lean_submit(scope)
        if submit is None or telemetry.tracing_enabled():
            await self.app(scope, receive, send)
            return
        self.served += 1
        request = Request(scope, receive)
        try:
            who = await key_principal(self._components, submit.token)
            submitted = await take_submit(
                self._components,
                who,
                request,
                idempotency_key=submit.idempotency_key,
                traceparent=submit.traceparent,
            )
            response = accepted_response(submitted)
        except Exception as exc:  # answered as the app answers it (api/errors.py)
            response = await self._handler(exc)(request, exc)
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Any:
        """The app's handler for this exception: its class's, else its nearest base's."""
        for cls in type(exc).__mro__:
            if cls in self._handlers:
                return self._handlers[cls]
        raise RuntimeError("the app has no handler for Exception") from exc


def _lean_submit(scope: Scope) -> _Submit | None:
    """What a lean submit needs of this request, if it is one it serves; else None."""
    if (
        scope["type"] != "http"
        or scope["path"] != "/v1/tasks"
        or scope["method"] != "POST"
        or scope.get("query_string")
        or scope.get("root_path")
    ):
        return None
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in _READ:
            if name in found:
                return None
            found[name] = value.decode("latin-1")
    token = token_of(found.get(b"authorization", ""), found.get(b"x-api-key"))
    key = found.get(b"idempotency-key")
    if (
        token is None
        or not is_json(found.get(b"content-type", ""))
        or (key is not None and len(key) > IDEMPOTENCY_KEY_MAX)
    ):
        return None
    return _Submit(token=token, idempotency_key=key, traceparent=found.get(b"traceparent"))
