"""Whether to count this executor ready, and /readyz, which says so beside /metrics.

Ready means it takes work now: registered with a controller, its calls answered, not draining.
A rollout or a PodDisruptionBudget counts a pod only from then on, and stops counting it as
soon as SIGTERM starts the drain.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

READYZ = "/readyz"


@dataclass(frozen=True, slots=True, kw_only=True)
class Readiness:
    """Ready or not, and why, in one short line of plain text."""

    ready: bool
    reason: str


class ReadinessState:
    """What the worker has done so far, as /readyz reads it.

    The worker writes it on its event loop and the listener reads it on its own thread: each
    write replaces one attribute, and `now()` reads each once, so no lock is needed.
    """

    def __init__(self) -> None:
        self._stop: asyncio.Event | None = None
        self._registered = False
        self._lost = False
        self._failing: str | None = None  # the last call that failed, until one succeeds

    def running(self, stop: asyncio.Event) -> None:
        """The worker has started; it drains once `stop` is set."""
        self._stop = stop

    def registered(self) -> None:
        self._registered, self._lost, self._failing = True, False, None

    def lost(self) -> None:
        """The controller ended the session: not ready until registered again."""
        self._lost = True

    def failed(self, method: str, code: str) -> None:
        """A call to the controller failed (unreachable, refused, timed out)."""
        self._failing = f"{method} {code}"

    def answered(self) -> None:
        """A call to the controller succeeded."""
        self._failing = None

    def now(self) -> Readiness:
        stop, failing = self._stop, self._failing
        last = f" (last call: {failing})" if failing else ""
        if stop is not None and stop.is_set():
            return Readiness(ready=False, reason="draining: taking no new steps")
        if self._lost:
            return Readiness(ready=False, reason=f"registration lost: registering again{last}")
        if not self._registered or stop is None:
            return Readiness(ready=False, reason=f"not registered with a controller yet{last}")
        if failing:
            return Readiness(ready=False, reason=f"calls to the controller fail: {failing}")
        return Readiness(ready=True, reason="ready: registered and polling")


def with_readyz(app: WSGIApplication, state: ReadinessState) -> WSGIApplication:
    """`app` with GET /readyz answered from `state`: 200 when ready, else 503; the body says
    why in plain text. Every other path is `app`'s."""

    def route(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != READYZ:
            return app(environ, start_response)
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        now = state.now()
        body = f"{now.reason}\n".encode()
        start_response(
            "200 OK" if now.ready else "503 Service Unavailable",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [b""] if environ["REQUEST_METHOD"] == "HEAD" else [body]

    return route
