"""Agent runs end to end: a real controller, a real executor running the `model` connector
against the scripted model server, and the tools the model calls, on both backends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_reach_controller.runtime import Components
from agent_reach_controller.server import running_controller
from agent_reach_controller.services.retention import RetentionService
from agent_reach_controller.settings import ControllerSettings
from agent_reach_executor import ExecutorSettings, run_executor
from tests.integration.stack import key_for, write_tools
from tests.support.models import (
    CHAT,
    MESSAGES,
    RESPONSES,
    ScriptedModels,
    Usage,
    answer,
    call_tools,
    cut_call,
    failure,
    in_dialect,
    oversized,
    redirect,
)

KEY_VARIABLE = "AGENT_REACH_TEST_MODEL_KEY"
KEY = "sk-test-7f3a9c-never-shown"
ECHO = {
    "name": "echo.say",
    "description": "Says what it is given.",
    "connector": "echo",
    "idempotent": True,
    "input_schema": {"type": "object", "properties": {"text": {}}},
}
PAY = {
    "name": "pay.send",
    "description": "Moves money.",
    "connector": "echo",
    "risk": "dangerous",
    "idempotent": True,
    "input_schema": {"type": "object", "properties": {"cents": {"type": "integer"}}},
}
WIRE = {
    "name": "wire.send",
    "description": "Sends a wire; a timeout may have sent it.",
    "connector": "script",
    "risk": "write",
    "config": {"outcomes": ["timeout"]},
    "retry": {"maximum_attempts": 1},
    "input_schema": {"type": "object"},
}
WIRE_TOLD = WIRE | {"name": "wire.told", "if_unknown": "tell_model"}
LEDGER = {
    "name": "ledger.post",
    "description": "Posts to an account, which must come from what the model was given.",
    "connector": "echo",
    "idempotent": True,
    "grounded": ["account"],
    "input_schema": {"type": "object", "properties": {"account": {"type": "string"}}},
}
SECRET_TOOL = {
    "name": "vault.read",
    "description": "Reads the vault.",
    "connector": "echo",
    "input_schema": {"type": "object"},
}


def profile(models: ScriptedModels, kind: str = "openai_chat", **more: Any) -> dict[str, Any]:
    return {
        "description": "Answers with what the echo tool says.",
        "endpoint": {
            "kind": kind,
            "base_url": models.root if kind == "anthropic" else models.url,
            "api_key": f"${{env:{KEY_VARIABLE}}}",
            "allow_hosts": ["127.0.0.1"],
        },
        "model": "scripted-1",
        "system": "You are a careful assistant.",
        "tools": ["echo.*"],
        "retry": {"maximum_attempts": 2, "initial_interval": 0.05, "jitter": False},
    } | more


@contextlib.asynccontextmanager
async def stack(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra_tools: Sequence[dict[str, Any]] = (),
    **more: Any,
) -> AsyncIterator[tuple[Components, httpx.AsyncClient]]:
    """A controller, an executor hosting `echo` and `model`, and an admin's API client."""
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    tools = [ECHO, PAY, WIRE, WIRE_TOLD, LEDGER, SECRET_TOOL, *extra_tools]
    settings = ControllerSettings(
        database_url=database_url,
        tools=[write_tools(tmp_path, tools)],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
        **more,
    )
    async with running_controller(settings) as (c, bound):
        _, token = await c.pools.create(name="pool", created_by="test")
        _, api_key = await c.keys.create(
            name="admin", tenant="default", roles=["admin"], created_by="test"
        )
        stop = asyncio.Event()
        worker = asyncio.create_task(
            run_executor(
                ExecutorSettings(
                    controller=bound.grpc,
                    token=token,
                    connectors=["echo", "model", "script"],
                    drain_grace=1,
                ),
                stop=stop,
                handle_signals=False,
            )
        )
        headers = {"Authorization": f"Bearer {api_key}"}
        try:
            async with httpx.AsyncClient(
                base_url=f"http://{bound.http}", headers=headers, timeout=30
            ) as api:
                yield c, api
        finally:
            stop.set()
            await worker


async def put_agent(api: httpx.AsyncClient, name: str, body: dict[str, Any]) -> dict[str, Any]:
    answer_ = await api.put(f"/v1/agents/{name}", json=body)
    assert answer_.status_code in (200, 201), answer_.text
    return dict(answer_.json())


async def run(api: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    started = await api.post("/v1/runs?wait=30", json=body)
    assert started.status_code == 200, started.text
    got = await api.get(f"/v1/runs/{started.json()['run_id']}")
    assert got.status_code == 200, got.text
    return dict(got.json())


@pytest.mark.parametrize(
    ("kind", "path"),
    [("openai_chat", CHAT), ("openai_responses", RESPONSES), ("anthropic", MESSAGES)],
)
async def test_a_run_calls_tools_then_answers_in_each_endpoint_kind(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, path: str
) -> None:
    script = [
        call_tools([("echo_say", {"text": "hi"}), ("echo_say", {"text": "there"})]),
        answer("The echo said hi and there."),
    ]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "helper", profile(models, kind))
            done = await run(api, {"agent": "helper", "input": "Say hi and there."})
            events = (await api.get(f"/v1/tasks/{done['task_id']}/events")).json()["events"]
            round_task = (await api.get(f"/v1/tasks/{done['task_id']}")).json()
            calls = c.metrics.total("agent_reach_model_calls_total", agent="helper")
            charged = c.metrics.total("agent_reach_model_tokens_total", kind="input")
            ended = c.metrics.total("agent_reach_runs_ended_total", reason="answered")
            judged = (
                c.metrics.total("agent_reach_run_rounds_total", agent="helper"),
                c.metrics.total("agent_reach_run_tool_calls_total", outcome="succeeded"),
                c.metrics.total("agent_reach_run_tool_calls_total", outcome="failed"),
                c.metrics.total("agent_reach_runs_ungrounded_total"),
            )
    assert done["status"] == "succeeded", done
    assert done["end_reason"] == "answered"
    assert done["answer"] == "The echo said hi and there."
    assert done["round"] == 2
    assert models.count(path) == 2  # each completed model call reached the server once
    assert [(r["round"], r["status"]) for r in done["rounds"]] == [
        (1, "succeeded"),
        (2, "succeeded"),
    ]
    assert done["rounds"][-1]["task_id"] == done["task_id"]
    assert round_task["run_id"] == done["run_id"]  # the task links its run
    first, second = (body for _, body in models.requests)
    assert first["model"] == "scripted-1"
    # The second call carries the first reply and both tools' results.
    assert len(str(second)) > len(str(first))
    assert "hi" in str(second)
    assert "there" in str(second)
    assert "Round 2 of at most 5" in str(second)
    assert "Done: 2 tool calls" in str(second)
    roles = [m["role"] for m in done["messages"]]
    assert roles[0] == "user"
    assert roles[-1] == "assistant"
    assert "tool" in roles
    assert done["tokens"]["input"] > 0
    assert done["tokens"]["output"] > 0
    assert KEY not in str(done)
    assert (calls, charged, ended) == (2, done["tokens"]["input"], 1)
    assert judged == (2, 2, 0, 0)  # 2 rounds, 2 tool calls that succeeded, no made-up claim
    # Each model step records what it was charged, beside what its reply claimed.
    [used] = [e["data"] for e in events if e["kind"] == "model_usage"]
    assert used["round"] == 2
    assert used["reported"]["input_tokens"] == 10  # the scripted reply's own figure
    assert used["charged"]["input"] >= 10


async def test_a_tool_the_run_may_not_use_is_refused_as_that_call(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("vault_read", {})]), answer("I could not read the vault.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            done = await run(api, {"agent": "helper", "input": "Read the vault."})
    assert done["status"] == "succeeded", done
    assert done["tools"] == ["echo.say"]
    [_, (_, second)] = models.requests
    results = [m for m in second["messages"] if m["role"] == "tool"]
    assert len(results) == 1
    assert "vault_read" in results[0]["content"] or "vault.read" in results[0]["content"]


async def test_max_rounds_ends_a_run_that_keeps_calling(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("echo_say", {"text": f"n{i}"})]) for i in range(3)]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            done = await run(
                api, {"agent": "helper", "input": "Go on.", "limits": {"max_rounds": 2}}
            )
    assert done["status"] == "failed", done
    assert done["end_reason"] == "max_rounds"
    assert models.count() == 2


async def test_the_same_call_three_times_ends_the_run_as_a_loop(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("echo_say", {"text": "again"})]) for _ in range(4)]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            done = await run(api, {"agent": "helper", "input": "Loop."})
    assert done["status"] == "failed", done
    assert done["end_reason"] == "loop_detected"
    assert models.count() == 3


async def test_continue_after_the_end_sends_the_whole_conversation(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [answer("First answer."), answer("Second answer.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            done = await run(api, {"agent": "helper", "input": "One."})
            more = await api.post(
                f"/v1/runs/{done['run_id']}/messages?wait=30", json={"input": "Two."}
            )
            assert more.status_code == 200, more.text
            again = (await api.get(f"/v1/runs/{done['run_id']}")).json()
    assert again["answer"] == "Second answer."
    [_, (_, second)] = models.requests
    said = [m.get("content") for m in second["messages"] if m["role"] != "system"]
    assert said[-3:] == ["One.", "First answer.", "Two."]
    # The stage note comes last, and counts rounds from the caller's new message.
    assert second["messages"][-1]["role"] == "system"
    assert second["messages"][-1]["content"].startswith("[run state] Round 1 of at most 5.")
    assert "Goal: Two." in second["messages"][-1]["content"]


async def test_bad_run_input_is_a_problem_document(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([]) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            unknown = await api.post("/v1/runs", json={"agent": "nobody", "input": "x"})
            subject = await api.post(
                "/v1/runs", json={"agent": "helper", "input": "x", "subject": 5}
            )
            looser = await api.post(
                "/v1/runs",
                json={"agent": "helper", "input": "x", "limits": {"max_rounds": 50}},
            )
            plain_key = await api.put(
                "/v1/agents/leaky",
                json=profile(models) | {"endpoint": profile(models)["endpoint"] | {"api_key": KEY}},
            )
            as_a_plan = await api.post(
                "/v1/tasks", json={"steps": [{"step_id": "m", "tool": "helper", "args": {}}]}
            )
    assert unknown.status_code == 404, unknown.text
    assert unknown.headers["content-type"] == "application/problem+json"
    assert subject.status_code == 422, subject.text
    assert looser.status_code == 422, looser.text
    assert looser.json()["errors"][0]["pointer"] == "/body/limits"
    assert plain_key.status_code == 422, plain_key.text
    assert KEY not in plain_key.text
    assert as_a_plan.status_code == 422, as_a_plan.text
    assert "runs" in as_a_plan.text
    assert models.count() == 0


async def started(api: httpx.AsyncClient, body: dict[str, Any]) -> str:
    answer_ = await api.post("/v1/runs", json=body)
    assert answer_.status_code == 202, answer_.text
    return str(answer_.json()["run_id"])


async def step_of(c: Components, api: httpx.AsyncClient, run_id: str, status: str) -> Any:
    """The step of the run's current round that reaches `status` (waited for, 30 s at most)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline:
        task_id = (await api.get(f"/v1/runs/{run_id}")).json()["task_id"]
        view = await c.queries.get(task_id)
        found = next((s for s in view.steps if s.status.value == status), None)
        if found is not None:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no step of run {run_id} reached {status} in 30 s")


async def test_a_dangerous_call_pauses_the_run_for_approval_and_nothing_runs_twice(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("pay_send", {"cents": 500})]), answer("Paid.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "payer", profile(models, tools=["pay.*"]))
            run_id = await started(api, {"agent": "payer", "input": "Pay 5 dollars."})
            waiting = await step_of(c, api, run_id, "awaiting_approval")
            [listed] = (await api.get("/v1/runs")).json()["runs"]
            assert listed["status"] == "waiting"  # the list says so too
            paused = (await api.get(f"/v1/runs/{run_id}")).json()
            assert paused["status"] == "waiting"
            assert paused["waiting_for"] == [
                {
                    "task_id": waiting.task_id,
                    "step_id": waiting.step_id,
                    "tool": "pay.send",
                    "status": "awaiting_approval",
                }
            ]
            approver = await key_for(c, roles=("approver",), name="carol")
            decided = await api.post(
                f"/v1/tasks/{waiting.task_id}/steps/{waiting.step_id}/approval",
                json={"decision": "approve", "reason": "ok"},
                headers=approver,
            )
            assert decided.status_code == 200, decided.text
            done = (await api.get(f"/v1/runs/{run_id}?wait=30")).json()
            paid = await c.queries.get(waiting.task_id)
    assert done["status"] == "succeeded", done
    assert models.count() == 2  # the model's first call was not made again after the pause
    [pay] = [s for s in paid.steps if s.tool == "pay.send"]
    assert (pay.status.value, pay.attempt) == ("succeeded", 1)


async def test_an_unknown_outcome_waits_for_a_person_then_the_model_reads_the_verdict(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("wire_send", {"to": "acme"})]), answer("The wire did not go.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "wirer", profile(models, tools=["wire.*"]))
            run_id = await started(api, {"agent": "wirer", "input": "Wire acme."})
            unknown = await step_of(c, api, run_id, "outcome_unknown")
            assert models.count() == 1
            paused = (await api.get(f"/v1/runs/{run_id}")).json()
            assert paused["status"] == "waiting"
            assert [w["status"] for w in paused["waiting_for"]] == ["outcome_unknown"]
            resolved = await api.post(
                f"/v1/tasks/{unknown.task_id}/steps/{unknown.step_id}/resolve",
                json={"action": "failed", "reason": "the bank has no such wire"},
            )
            assert resolved.status_code == 200, resolved.text
            done = (await api.get(f"/v1/runs/{run_id}?wait=30")).json()
    assert done["status"] == "succeeded", done
    [_, (_, second)] = models.requests
    [result] = [m for m in second["messages"] if m["role"] == "tool"]
    assert "the bank has no such wire" in result["content"]


async def test_a_lying_usage_cannot_stretch_a_token_budget(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lie = Usage(input=1, output=1)
    script = [call_tools([("echo_say", {"text": "x"})], usage=lie), answer("done", usage=lie)]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            done = await run(
                api,
                {"agent": "helper", "input": "word " * 1000, "limits": {"input_tokens": 400}},
            )
    assert done["status"] == "failed", done
    assert done["end_reason"] == "budget_exhausted"
    assert done["tokens"]["input"] >= 1000  # what was sent, not what the reply claimed
    assert models.count() == 1
    # The call the model asked for was not run, and the conversation says so.
    [result] = [m for m in done["messages"] if m["role"] == "tool"]
    assert "not run" in result["message"]["content"]


async def test_max_tokens_is_cut_to_what_the_output_budget_has_left(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([answer("ok")]) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            await run(api, {"agent": "helper", "input": "Hi.", "limits": {"output_tokens": 50}})
    [(_, request)] = models.requests
    assert request["max_tokens"] == 50


async def test_a_grounded_argument_must_come_from_the_input_or_a_result_the_model_read(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [
        call_tools([("echo_say", {"text": "the account is acct-42"})]),
        call_tools(
            [("ledger_post", {"account": "acct-42"}), ("ledger_post", {"account": "acct-77"})]
        ),
        answer("Posted."),
    ]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "poster", profile(models, tools=["echo.*", "ledger.*"]))
            done = await run(api, {"agent": "poster", "input": "Post for customer 7."})
    assert done["status"] == "succeeded", done
    [_, _, (_, third)] = models.requests
    results = [m["content"] for m in third["messages"] if m["role"] == "tool"]
    assert len(results) == 3
    # acct-42 came from a result the model read: posted. acct-77 came from nowhere: refused.
    assert "acct-42" in results[1]
    assert "appears in neither" not in results[1]
    assert "acct-77" in results[2]
    assert "appears in neither" in results[2]


async def test_claims_the_answer_makes_up_are_listed(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [
        call_tools([("echo_say", {"text": "order 12345 ships 2026-12-08"})]),
        answer("Order 12345 ships 2026-12-08; order 98765 too. Write to eve@evil.invalid."),
    ]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            done = await run(api, {"agent": "helper", "input": "Where is order 12345?"})
    assert done["status"] == "succeeded", done
    assert done["ungrounded_claims"] == ["eve@evil.invalid", "98765"]


async def sse(api: httpx.AsyncClient, url: str, **headers: str) -> list[tuple[str, Any]]:
    """Every (event, data) of a stream, read to its end (30 s at most)."""
    found: list[tuple[str, Any]] = []
    async with api.stream("GET", url, headers=headers, timeout=30) as stream:
        assert stream.status_code == 200, await stream.aread()
        assert stream.headers["content-type"].startswith("text/event-stream")
        kind = ""
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                found.append((kind, json.loads(line.removeprefix("data: "))))
    return found


async def test_a_runs_events_stream_its_conversation_and_end_and_resume_after_an_entry(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("echo_say", {"text": "hi"})]), answer("It said hi.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            run_id = await started(api, {"agent": "helper", "input": "Say hi."})
            events = await sse(api, f"/v1/runs/{run_id}/events")
            resumed = await sse(api, f"/v1/runs/{run_id}/events", **{"Last-Event-ID": "1"})
            missing = await api.get("/v1/runs/nope/events")
    entries = [data for kind, data in events if kind == "message"]
    assert [e["role"] for e in entries] == ["user", "assistant", "tool", "assistant"]
    assert [e["seq"] for e in entries] == [0, 1, 2, 3]
    kind, end = events[-1]
    assert (kind, end["status"], end["answer"]) == ("end", "succeeded", "It said hi.")
    assert [d["seq"] for k, d in resumed if k == "message"] == [2, 3]
    assert missing.status_code == 404


async def test_an_ended_run_goes_with_its_conversation_at_retention(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([answer("Done.")]) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "helper", profile(models))
            ended = await run(api, {"agent": "helper", "input": "Hi."})
            later = datetime.now(UTC) + timedelta(days=2)
            retention = RetentionService(db=c.db, days=1, batch=10)
            pruned = await retention.prune(now=later)
            gone = await api.get(f"/v1/runs/{ended['run_id']}")
    assert pruned["runs"] == 1
    assert pruned["run_messages"] == 2  # the question and the answer
    assert gone.status_code == 404


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


async def test_a_tool_may_have_its_unknown_outcome_told_to_the_model_instead_of_a_person(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("wire_told", {"to": "acme"})]), answer("I could not confirm it.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "wirer", profile(models, tools=["wire.*"]))
            done = await run(api, {"agent": "wirer", "input": "Wire acme."})
            [first_round] = [
                t
                for t in (await c.queries.list_tasks(tenant="default", limit=10))
                if t.goal and t.goal.startswith("round 1 ")
            ]
            wired = await c.queries.get(first_round.task_id)
    assert done["status"] == "succeeded", done
    [_, (_, second)] = models.requests
    [result] = [m for m in second["messages"] if m["role"] == "tool"]
    assert "unverified" in result["content"]
    assert "may or may not have taken effect" in result["content"]
    [wire] = [s for s in wired.steps if s.tool == "wire.told"]
    assert (wire.status.value, wire.attempt) == ("failed", 1)  # never run again by itself


async def test_a_run_takes_only_the_tools_its_caller_may_use(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "roles:\n"
        "  admin: [{tools: '*', actions: [submit, approve, admin]}]\n"
        "  helper-user:\n"
        "    - {tools: 'helper*', actions: [submit]}\n"
        "    - {tools: 'echo.*', actions: [submit]}\n"
    )
    with ScriptedModels([answer("ok")]) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch, policy=policy) as (c, api):
            await put_agent(api, "helper", profile(models, tools=["*"]))
            await put_agent(api, "helper-vault", profile(models, tools=["echo.*", "vault.read"]))
            user = await key_for(c, roles=("helper-user",), name="ann")
            cut = await api.post(
                "/v1/runs?wait=30", json={"agent": "helper", "input": "Hi."}, headers=user
            )
            named = await api.post(
                "/v1/runs", json={"agent": "helper-vault", "input": "Hi."}, headers=user
            )
            profile_write = await api.put("/v1/agents/helper", json=profile(models), headers=user)
    assert cut.status_code == 200, cut.text
    assert cut.json()["tools"] == ["echo.say"]  # `*`, cut to what ann may submit
    assert named.status_code == 403, named.text
    assert "vault.read" in named.json()["detail"]
    assert profile_write.status_code == 403, profile_write.text  # as privileged as a tool


async def test_run_input_of_the_wrong_type_or_size_is_a_problem_document(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([]) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            answers = {
                "context": await api.post(
                    "/v1/runs", json={"agent": "helper", "input": "x", "context": "nope"}
                ),
                "huge": await api.post(
                    "/v1/runs", json={"agent": "helper", "input": "x" * 300_000}
                ),
                "no messages": await api.post("/v1/runs", json={"agent": "helper", "input": []}),
                "not json": await api.post(
                    "/v1/runs", content=b"{", headers={"Content-Type": "application/json"}
                ),
            }
    for name, answer_ in answers.items():
        assert answer_.status_code in (400, 413, 422), (name, answer_.text)
        assert answer_.headers["content-type"] == "application/problem+json", name
    assert answers["context"].json()["errors"][0]["pointer"] == "/body/context"
    assert answers["no messages"].json()["errors"][0]["pointer"] == "/body/input"
    assert models.count() == 0


async def test_a_runs_deadline_ends_it_while_its_model_is_still_thinking(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([answer("too late")]) as models:
        models.hold()
        async with stack(sqlite_url, tmp_path, monkeypatch, reap_interval_seconds=0.2) as (
            _,
            api,
        ):
            await put_agent(api, "helper", profile(models))
            done = await run(api, {"agent": "helper", "input": "Hi.", "limits": {"deadline": 1}})
    assert (done["status"], done["end_reason"]) == ("failed", "deadline_exceeded")
    assert done["answer"] is None


async def test_starting_runs_is_held_to_a_callers_unfinished_tasks_like_a_submit(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([answer("one"), answer("two")]) as models:
        models.hold()
        async with stack(
            sqlite_url, tmp_path, monkeypatch, max_tasks_in_flight_per_principal=1
        ) as (_, api):
            await put_agent(api, "helper", profile(models))
            first = await api.post("/v1/runs", json={"agent": "helper", "input": "One."})
            second = await api.post("/v1/runs", json={"agent": "helper", "input": "Two."})
            models.release()
    assert first.status_code == 202, first.text
    assert second.status_code == 429, second.text
    assert second.json()["code"] == "too_many_in_flight"


def plan_text(*steps: dict[str, Any], fenced: bool = False) -> str:
    text = json.dumps({"goal": "say two things", "steps": list(steps)})
    return f"```json\n{text}\n```" if fenced else text


SAY_A = {"step_id": "a", "tool": "echo.say", "args": {"text": "first"}}
SAY_B = {
    "step_id": "b",
    "tool": "echo.say",
    "args": {"text": "$a.output.args.text"},
    "depends_on": ["a"],
}
CYCLE = [SAY_A | {"depends_on": ["b"]}, SAY_B]


@pytest.mark.parametrize(("kind", "path"), [("openai_chat", CHAT), ("anthropic", MESSAGES)])
async def test_in_planner_mode_the_model_writes_a_plan_that_runs_as_one_round(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, path: str
) -> None:
    script = [answer(plan_text(SAY_A, SAY_B, fenced=True)), answer("Both said first.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "planner", profile(models, kind, mode="plan"))
            done = await run(api, {"agent": "planner", "input": "Say first, then repeat it."})
            planned = await c.queries.get(done["rounds"][0]["task_id"])
    assert (done["status"], done["end_reason"], done["round"]) == ("succeeded", "answered", 2)
    [(_, first), (_, second)] = models.requests
    assert "Answer with a plan" in str(first)
    assert "tools" not in first  # the tools are in the instructions, not callable
    if kind == "openai_chat":
        assert first["response_format"]["json_schema"]["name"] == "plan"
    assert "The results of your plan" in str(second)
    assert "response_format" not in second
    steps = {s.step_id: s for s in planned.steps}
    assert steps["b"].resolved_args == {"text": "first"}  # the plan's own reference, resolved
    assert steps["b"].status.value == "succeeded"


async def test_a_refused_plan_goes_back_once_and_a_second_ends_the_run_invalid_plan(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repaired = [answer(plan_text(*CYCLE)), answer(plan_text(SAY_A, SAY_B)), answer("Done.")]
    twice = [answer(plan_text(*CYCLE)), answer("not a plan at all")]
    with ScriptedModels(repaired) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "planner", profile(models, mode="plan"))
            fixed = await run(api, {"agent": "planner", "input": "Say first twice."})
    [_, (_, second), _] = models.requests
    assert "Your plan was refused" in str(second)
    assert "/steps/" in str(second)  # the problems' pointers
    assert (fixed["status"], fixed["round"]) == ("succeeded", 3)
    with ScriptedModels(twice) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "planner", profile(models, mode="plan"))
            failed = await run(api, {"agent": "planner", "input": "Say first twice."})
    assert (failed["status"], failed["end_reason"]) == ("failed", "invalid_plan")
    first_set, second_set = failed["error"]["problems"]
    assert any(p["code"] == "cycle" for p in first_set)
    assert "not JSON" in second_set[0]["detail"]
    assert models.count() == 2


async def test_the_plan_schema_is_published_and_a_plan_it_admits_is_read_as_a_plan(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jsonschema

    from agent_reach_controller.planning.plan import parse_plan

    with ScriptedModels([]) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "planner", profile(models, mode="plan"))
            schema = (await api.get("/v1/runs/plan-schema")).json()
            plan = {"goal": "g", "steps": [SAY_A, SAY_B]}
            jsonschema.validate(plan, schema)
            read = parse_plan(plan, c.catalog, dialect="plan", atomic=True)
    assert [s.step_id for s in read.steps] == ["a", "b"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"steps": [SAY_A | {"retry": {}}]}, schema)  # a caller's option


def routed(route: str) -> Any:
    return answer(json.dumps({"route": route, "reason": f"{route} fits"}))


ROUTED = {
    "answer": ([routed("answer"), answer("Hello!")], 2),
    "react": ([routed("react"), call_tools([("echo_say", {"text": "x"})]), answer("ok")], 3),
    "plan": ([routed("plan"), answer(plan_text(SAY_A, SAY_B)), answer("ok")], 3),
    "nonsense": ([answer("I would rather chat"), answer("ok")], 2),
}


@pytest.mark.parametrize("route", list(ROUTED))
async def test_a_router_picks_answer_react_or_plan_and_the_run_records_why(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    script, rounds = ROUTED[route]
    with ScriptedModels(script) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "router", profile(models, mode="auto"))
            done = await run(api, {"agent": "router", "input": "Hi there."})
    assert (done["status"], done["round"]) == ("succeeded", rounds), done
    first, second = models.requests[0][1], models.requests[1][1]
    assert first["response_format"]["json_schema"]["name"] == "route"
    assert "tools" not in first
    said = [m.get("content") for m in second["messages"] if m["role"] != "system"]
    assert said == ["Hi there."]  # the routing exchange is not the conversation's
    if route == "nonsense":
        assert done["route"]["route"] == "react"
        assert "not a choice" in done["route"]["reason"]
        return
    assert done["route"] == {"route": route, "reason": f"{route} fits"}
    assert ("tools" in second) == (route == "react")
    assert ("Answer with a plan" in str(second)) == (route == "plan")


THIRTY = [
    {
        "name": f"{area}.t{i}",
        "description": f"Tool {i} of the {area} area.",
        "connector": "echo",
        "idempotent": True,
        "input_schema": {"type": "object"},
    }
    for area in ("crm", "mail", "billing")
    for i in range(10)
]


async def test_with_thirty_tools_the_model_picks_a_category_then_sees_only_its_tools(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [
        answer(json.dumps({"category": "crm", "reason": "a customer question"})),
        call_tools([("crm_t3", {})]),
        answer("Found the customer."),
    ]
    with ScriptedModels(script) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch, extra_tools=THIRTY) as (_, api):
            areas = ["crm.*", "mail.*", "billing.*"]
            await put_agent(api, "desk", profile(models, tools=areas))
            done = await run(api, {"agent": "desk", "input": "Who is customer 7?"})
    assert (done["status"], done["round"]) == ("succeeded", 3), done
    assert done["category"] == {"category": "crm", "reason": "a customer question"}
    first, second, third = (body for _, body in models.requests)
    assert first["response_format"]["json_schema"]["name"] == "category"
    assert "tools" not in first
    assert "billing: 10 tool(s)" in first["messages"][0]["content"]
    offered = {t["function"]["name"] for t in second["tools"]}
    assert offered == {f"crm_t{i}" for i in range(10)}  # the category's tools, no others
    assert {t["function"]["name"] for t in third["tools"]} == offered  # kept for the turn
    assert len(done["tools"]) == 30


async def test_a_runs_replay_shows_each_round_and_a_dry_run_reports_a_changed_tool(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("echo_say", {"text": "hi"})]), answer("It said hi.")]
    with ScriptedModels(script) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            done = await run(api, {"agent": "helper", "input": "Say hi."})
            same = (await api.get(f"/v1/runs/{done['run_id']}/replay")).json()
            changed = ECHO | {"description": "Says what it is given, louder."}
            assert (await api.put("/v1/tools/echo.say", json=changed)).status_code == 200
            after = (await api.get(f"/v1/runs/{done['run_id']}/replay")).json()
    assert same["identical"] is True, same
    first, second = same["rounds"]
    assert first["request"]["messages"][-2] == {"role": "user", "content": "Say hi."}
    assert first["reply"][0]["tool_calls"][0]["function"]["name"] == "echo_say"
    [call] = first["calls"]
    assert (call["tool"], call["status"]) == ("echo.say", "succeeded")
    assert '"hi"' in call["read"]
    assert second["reply"][0]["content"] == "It said hi."
    assert KEY not in str(same)
    assert after["identical"] is False
    [difference] = after["rounds"][0]["differences"]
    assert "tool echo.say changed since" in difference


async def test_an_idempotency_key_starts_one_run_however_often_it_is_sent(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([answer("once"), answer("twice")]) as models:
        models.hold()
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            body = {"agent": "helper", "input": "Once."}
            key = {"Idempotency-Key": "order-1042"}
            together = await asyncio.gather(
                *(api.post("/v1/runs", json=body, headers=key) for _ in range(4))
            )
            again = await api.post("/v1/runs", json=body, headers=key)
            other = await api.post("/v1/runs", json=body | {"input": "Other."}, headers=key)
            models.release()
            listed = (await api.get("/v1/runs")).json()["runs"]
    assert {a.status_code for a in together} == {202}, [a.text for a in together]
    started = {a.json()["run_id"] for a in [*together, again]}
    assert len(started) == 1
    assert [r["run_id"] for r in listed] == list(started)
    assert other.status_code == 409, other.text
    assert other.json()["code"] == "idempotency_conflict"
