"""The model endpoint as a hostile downstream: each misbehaviour a retried step or a bounded,
recorded end of the run, never a hang; an endpoint outside its destinations is never called."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.runs_stack import (
    KEY,
    profile,
    put_agent,
    run,
    stack,
)
from tests.support.models import (
    ScriptedModels,
    answer,
    call_tools,
    cut_call,
    failure,
    in_dialect,
    oversized,
    redirect,
)

HOSTILE = {
    # Retried by the step's policy, then the run goes on.
    "a 429 with Retry-After": ([failure(429, retry_after="0"), answer("ok")], "succeeded", None),
    "a 500": ([failure(500), answer("ok")], "succeeded", None),
    # The model is told, as that call's result, and the run goes on.
    "arguments that are not JSON": (
        [call_tools([("echo_say", "{not json")]), answer("ok")],
        "succeeded",
        None,
    ),
    "a tool call cut at max tokens": (
        [cut_call("echo_say", '{"text": "hal'), answer("ok")],
        "succeeded",
        None,
    ),
    # The run ends, saying why.
    "1,001 tool calls in one reply": (
        [call_tools([("echo_say", {"text": str(i)}) for i in range(1001)])],
        "failed",
        "invalid_reply",
    ),
    "another endpoint's reply": (
        [in_dialect("anthropic", answer("hi"))],
        "failed",
        "model_failed",
    ),
    "a reply over the size cap": ([oversized(2 * 1024 * 1024)], "failed", "model_failed"),
    "a redirect": ([redirect("http://127.0.0.1:1/elsewhere")], "failed", "model_failed"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_hostile_model_endpoint_gives_a_bounded_recorded_end(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    script, status, reason = HOSTILE[case]
    with ScriptedModels(script) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            capped = profile(models)
            capped["endpoint"] |= {"max_reply_bytes": 1024 * 1024}
            await put_agent(api, "helper", capped)
            done = await run(api, {"agent": "helper", "input": "Go."})
    assert done["status"] == status, done
    assert done["end_reason"] == (reason or "answered")
    assert models.count() == len(script)  # each scripted reply asked for once, no more
    if status == "succeeded" and len(script) == 2 and script[0].calls:
        [result] = [m for m in done["messages"] if m["role"] == "tool"]
        assert "not valid JSON" in result["message"]["content"]
    if status == "failed":
        assert done["error"]["message"]
        assert KEY not in str(done)


async def test_a_model_endpoint_outside_the_profiles_destinations_is_never_called(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([answer("never")]) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            fenced = profile(models)
            fenced["endpoint"] |= {"destinations": ["models.example"]}
            await put_agent(api, "helper", fenced)
            done = await run(api, {"agent": "helper", "input": "Go."})
    assert (done["status"], done["end_reason"]) == ("failed", "model_failed")
    assert done["error"]["code"] == "destination_refused", done["error"]
    assert models.count() == 0
