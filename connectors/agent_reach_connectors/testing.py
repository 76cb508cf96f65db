"""Connectors for demos and tests: `echo`, `sleep`, and `script` (fails on a script)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach_connectors.base import ConnectorError, ToolCall


class _Stateless:
    """Nothing to open or close."""

    name = ""

    async def start(self) -> None:
        """Nothing to open."""
        return None

    async def close(self) -> None:
        """Nothing to release."""
        return None


class EchoConnector(_Stateless):
    """Returns `{"args", "attempt", "idempotency_key"}` of the call, or `config.output` if set."""

    name = "echo"

    async def invoke(self, call: ToolCall) -> Any:
        """Echo the call back."""
        if "output" in call.config:
            return call.config["output"]
        return {
            "args": dict(call.args),
            "attempt": call.attempt,
            "idempotency_key": call.idempotency_key,
        }


class SleepConnector(_Stateless):
    """Sleeps `args.seconds` (else `config.seconds`, else 0) and returns `{"slept": seconds}`.

    Cancellation stops it at once (nothing to clean up).
    """

    name = "sleep"

    async def invoke(self, call: ToolCall) -> Any:
        """Sleep, then report how long."""
        raw = call.args.get("seconds", call.config.get("seconds", 0))
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw < math.inf:
            raise ConnectorError(
                ErrorCode.INVALID_ARGUMENTS,
                f"{call.tool}: seconds must be a non-negative number",
                retryable=False,
            )
        await asyncio.sleep(raw)
        return {"slept": raw}


class ScriptConnector(_Stateless):
    """Plays `config.outcomes` by attempt number: attempt n plays outcomes[n-1], the last repeats.

    Outcomes: `ok` returns `{"attempt": n}`; `error:CODE` raises ConnectorError(CODE) with the
    code's default retryability; `error:CODE:retry_after=SECONDS` also sets retry_after;
    `timeout` raises a retryable `timeout` that may have applied; `hang` waits until cancelled.
    Driven by the attempt number only, it behaves the same on whichever executor runs it.
    """

    name = "script"

    async def invoke(self, call: ToolCall) -> Any:
        """Play the outcome scripted for this attempt."""
        outcomes = call.config.get("outcomes", ["ok"])
        if not isinstance(outcomes, list) or not outcomes:
            raise _bad_script(call.tool, "config.outcomes must be a non-empty list")
        outcome = str(outcomes[min(max(call.attempt, 1), len(outcomes)) - 1])
        if outcome == "ok":
            return {"attempt": call.attempt}
        if outcome == "timeout":
            raise ConnectorError(
                ErrorCode.TIMEOUT, f"{call.tool}: timed out (scripted)", maybe_applied=True
            )
        if outcome == "hang":
            await asyncio.Event().wait()
        if outcome.startswith("error:"):
            raise _scripted_error(call.tool, outcome)
        raise _bad_script(call.tool, f"unknown scripted outcome {outcome!r}")


def _scripted_error(tool: str, outcome: str) -> ConnectorError:
    _, code, *options = outcome.split(":")
    if code not in {c.value for c in ErrorCode}:
        return _bad_script(tool, f"unknown error code {code!r}")
    retry_after = None
    for option in options:
        key, _, value = option.partition("=")
        if key != "retry_after":
            return _bad_script(tool, f"unknown option {key!r} in {outcome!r}")
        try:
            retry_after = float(value)
        except ValueError:
            return _bad_script(tool, f"bad retry_after in {outcome!r}")
    return ConnectorError(code, f"{tool}: failed with {code} (scripted)", retry_after=retry_after)


def _bad_script(tool: str, what: str) -> ConnectorError:
    return ConnectorError(ErrorCode.CONNECTOR_ERROR, f"{tool}: {what}", retryable=False)
