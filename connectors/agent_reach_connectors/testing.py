"""Connectors for demos and tests: `echo`, `sleep`, and `script` (fails on a script)."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach_connectors.base import ConnectorError, ToolCall


class _Stateless:
    """Nothing to open or close."""

    name = ""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class EchoConnector(_Stateless):
    """Returns the arguments (or `config.output`), the attempt and the idempotency key."""

    name = "echo"

    async def invoke(self, call: ToolCall) -> Any:
        if "output" in call.config:
            return call.config["output"]
        return {
            "args": dict(call.args),
            "attempt": call.attempt,
            "idempotency_key": call.idempotency_key,
        }


class SleepConnector(_Stateless):
    """Sleeps `args.seconds` (or `config.seconds`); cancellation stops it at once."""

    name = "sleep"

    async def invoke(self, call: ToolCall) -> Any:
        seconds = float(call.args.get("seconds", call.config.get("seconds", 0)))
        await asyncio.sleep(seconds)
        return {"slept": seconds}


class ScriptConnector(_Stateless):
    """Plays `config.outcomes` by attempt number (the last one repeats).

    Outcomes: `ok`, `timeout`, `hang`, `error:CODE` and `error:CODE:retry_after=SECONDS`. Being
    driven by the attempt number only, it behaves the same on whichever executor runs it.
    """

    name = "script"

    async def invoke(self, call: ToolCall) -> Any:
        outcomes = list(call.config.get("outcomes") or ["ok"])
        outcome = str(outcomes[min(call.attempt, len(outcomes)) - 1])
        if outcome == "ok":
            return {"attempt": call.attempt}
        if outcome == "timeout":
            raise ConnectorError(
                ErrorCode.TIMEOUT, f"{call.tool} timed out (scripted)", maybe_applied=True
            )
        if outcome == "hang":
            await asyncio.Event().wait()
        if outcome.startswith("error:"):
            _, code, *options = outcome.split(":")
            retry_after = None
            for option in options:
                key, _, value = option.partition("=")
                if key == "retry_after":
                    retry_after = float(value)
            raise ConnectorError(
                code, f"{call.tool} failed: {code} (scripted)", retry_after=retry_after
            )
        raise ConnectorError(ErrorCode.CONNECTOR_ERROR, f"{call.tool}: unknown scripted outcome")
