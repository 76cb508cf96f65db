"""The console's only way to the data: the documented /v1 routes, called in-process.

A page never reads storage or a service itself. It calls the same route a script would, with
the signed-in person's session (and, for actions, its CSRF token), over an ASGI transport into
this very application. Roles, tenants, separation of duties, audit entries and trace events are
therefore exactly the API's, and a page can show nothing the API would not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import Request

from agent_reach_controller.identity.sign_ins import COOKIE, CSRF_HEADER, SignIn

# Where the in-process calls pretend to go; nothing listens there, the transport is the app.
_BASE = "http://console.internal"
_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """What a /v1 route answered: its status and its JSON (a problem+json on an error)."""

    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def problem(self) -> dict[str, Any]:
        return self.body if isinstance(self.body, dict) and not self.ok else {}


def segment(value: str) -> str:
    """One path segment, quoted: an id from a URL never steers the call to another route."""
    return quote(value, safe="")


class V1:
    """The /v1 API as the signed-in person sees it."""

    def __init__(self, request: Request, sign_in: SignIn) -> None:
        self._request = request
        self._sign_in = sign_in

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Answer:
        query = {k: v for k, v in (params or {}).items() if v not in (None, "")}
        return await self._call("GET", path, params=query)

    async def post(self, path: str, body: Any = None) -> Answer:
        return await self._call("POST", path, json=body)

    async def patch(self, path: str, body: Any, *, if_match: str | None = None) -> Answer:
        """A partial change; `if_match` (an ETag) makes it one of the version the person saw."""
        sent = {} if if_match is None else {"If-Match": if_match}
        return await self._call("PATCH", path, json=body, sent=sent)

    async def delete(self, path: str, params: dict[str, Any] | None = None) -> Answer:
        return await self._call("DELETE", path, params=params or {})

    async def _call(
        self, method: str, path: str, sent: dict[str, str] | None = None, **kw: Any
    ) -> Answer:
        headers = {
            **(sent or {}),
            "Accept": "application/json",
            "Cookie": f"{COOKIE}={self._sign_in.secret}",
        }
        if method != "GET":
            headers[CSRF_HEADER] = self._sign_in.csrf
        sign_ins = self._request.app.state.components.sign_ins
        if sign_ins.proxy is not None:
            # A proxy session lives only while the proxy names its user: pass its word along.
            named = self._request.headers.get(sign_ins.proxy.header)
            if named is not None:
                headers[sign_ins.proxy.header] = named
        peer = self._request.client
        transport = httpx.ASGITransport(
            app=self._request.app,
            client=(peer.host, peer.port) if peer else ("127.0.0.1", 0),
        )
        async with httpx.AsyncClient(
            transport=transport, base_url=_BASE, timeout=_TIMEOUT
        ) as client:
            answer = await client.request(method, path, headers=headers, **kw)
        try:
            body = answer.json() if answer.content else None
        except ValueError:
            body = {"title": "Unexpected answer", "detail": answer.text[:200]}
        return Answer(status=answer.status_code, body=body)
