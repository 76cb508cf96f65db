"""The connector plugin protocol, the call it receives, the error it raises, and discovery."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from agent_reach.errors import ErrorCode, kind_of

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "agent_reach.connectors"
_SECRET_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def _no_heartbeat() -> None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One attempt of one step, as a connector sees it.

    `config` is the tool's connector configuration as stored: `${env:NAME}` secret references are
    still references, and a connector resolves them (`resolve_secrets`) at invoke time, so secret
    values exist only on the executor, only while a call runs. `args` are the step's resolved
    arguments (never secret-resolved: they come from the model). `idempotency_key` is identical
    on every attempt of the step: send it downstream so a retried side effect happens once.
    `idempotent` is the catalogue's word that the tool's effect is the same however often a
    call is delivered: only then may a connector send one call more than once on its own (say,
    again over a new connection when a kept-alive one turns out closed). False when not known.
    """

    tool: str
    task_id: str
    step_id: str
    args: Mapping[str, Any]
    config: Mapping[str, Any]
    idempotency_key: str
    attempt: int
    max_attempts: int
    trace_id: str
    traceparent: str
    timeout_s: float
    # Call it while a long call makes progress. With a heartbeat timeout on the tool, a call
    # that stays silent longer than that is stopped as hung and tried again.
    heartbeat: Callable[[], None] = _no_heartbeat
    heartbeat_timeout_s: float | None = None
    idempotent: bool = False


class ConnectorError(Exception):
    """A classified failure of a tool call.

    `code` is an `agent_reach.errors.ErrorCode` value; `message` is one honest sentence the model
    may read (never a secret, never a stack trace). `retryable` defaults to the code's class.
    `retry_after` is the delay the downstream asked for, in seconds. `maybe_applied` says the
    request may have reached the downstream before the failure (a timeout after sending, a reset
    after the body was written), which matters for tools that cannot deduplicate. `throttle` is
    how long the downstream asked every caller to hold back (its quota is spent): the controller
    then pauses the whole tool, not just this step.
    """

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        *,
        retryable: bool | None = None,
        retry_after: float | None = None,
        maybe_applied: bool = False,
        throttle: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message
        self.retryable = kind_of(self.code).retryable if retryable is None else retryable
        self.retry_after = retry_after
        self.maybe_applied = maybe_applied
        self.throttle = throttle


@dataclass(frozen=True, slots=True)
class Throttled:
    """A successful output, and the downstream's word that its quota is spent for `seconds`.

    Return it from `invoke` instead of the bare output when, say, `X-RateLimit-Remaining: 0`
    came with the answer: the controller then holds every step of the tool back that long.
    """

    output: Any
    seconds: float


@runtime_checkable
class Connector(Protocol):
    """What every connector implements. One instance serves all calls of an executor.

    `start` opens shared resources (connection pools); `invoke` runs one call and returns a
    JSON-serialisable output or raises `ConnectorError`; `close` releases what `start` opened.
    `invoke` must be cancellation-safe: the executor cancels it on timeout or task cancellation.
    """

    name: str

    async def start(self) -> None: ...

    async def invoke(self, call: ToolCall) -> Any: ...

    async def close(self) -> None: ...


def resolve_secrets(value: Any, environ: Mapping[str, str] | None = None) -> Any:
    """Replace `${env:NAME}` references in every string of `value` with the variable's value.

    Raises ConnectorError naming the variable (never its value) when one is not set.
    """
    env = os.environ if environ is None else environ
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise ConnectorError(
                    ErrorCode.CONNECTOR_ERROR,
                    f"secret reference ${{env:{name}}} is not set on the executor",
                    retryable=False,
                )
            return env[name]

        return _SECRET_REF.sub(substitute, value)
    if isinstance(value, Mapping):
        return {k: resolve_secrets(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_secrets(v, env) for v in value]
    return value


def load_connectors(names: Iterable[str] | None = None) -> dict[str, Connector]:
    """Instantiate the connectors registered under the `agent_reach.connectors` entry points.

    With `names`, only those (an unknown or broken one raises); otherwise every one that loads,
    a plugin that fails to import being logged and left out rather than taking the executor down.
    """
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    wanted = list(found) if names is None else list(names)
    missing = [n for n in wanted if n not in found]
    if missing:
        raise LookupError(f"unknown connector(s): {', '.join(missing)}; known: {sorted(found)}")
    connectors: dict[str, Connector] = {}
    for name in wanted:
        try:
            connector = found[name].load()()
            if not isinstance(connector, Connector):
                raise TypeError(f"entry point {name!r} did not produce a Connector")
        except Exception:
            if names is not None:
                raise
            log.exception(
                "connector %r failed to load; not hosting it",
                name,
                extra={"event": "connector_load_failed"},
            )
            continue
        connectors[name] = connector
    return connectors
