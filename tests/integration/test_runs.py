"""Agent runs end to end, on both backends: the loop in each endpoint kind, how a run ends
(answer, limits, budgets, loops, the deadline), continuing, rights, bad input, grounding and
made-up claims, the event stream, retention and Idempotency-Keys."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from agent_reach_controller.services.retention import RetentionService
from tests.integration.runs_stack import (
    KEY,
    profile,
    put_agent,
    run,
    sse,
    stack,
    started,
)
from tests.integration.stack import key_for
from tests.support.models import (
    CHAT,
    MESSAGES,
    RESPONSES,
    ScriptedModels,
    Usage,
    answer,
    call_tools,
)


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


async def test_another_tenants_run_is_not_found_and_no_key_reaches_any_run_route(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([answer("mine")]) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "helper", profile(models))
            mine = await run(api, {"agent": "helper", "input": "Mine."})
            other = await key_for(c, roles=("admin",), tenant="other", name="eve")
            url = f"/v1/runs/{mine['run_id']}"
            probes = [
                ("GET", url, None),
                ("GET", f"{url}/events", None),
                ("GET", f"{url}/replay", None),
                ("POST", f"{url}/cancel", None),
                ("POST", f"{url}/messages", {"input": "Hijack."}),
            ]
            theirs = [await api.request(m, u, json=b, headers=other) for m, u, b in probes]
            listed = (await api.get("/v1/runs", headers=other)).json()["runs"]
            bare = httpx.AsyncClient(base_url=str(api.base_url))
            async with bare:
                anonymous = [await bare.request(m, u, json=b) for m, u, b in probes]
                anonymous.append(
                    await bare.post("/v1/runs", json={"agent": "helper", "input": "x"})
                )
                anonymous.append(await bare.get("/v1/agents"))
                anonymous.append(await bare.get("/v1/runs/plan-schema"))
            still = (await api.get(url)).json()
    assert [a.status_code for a in theirs] == [404] * len(probes), [a.text for a in theirs]
    assert listed == []
    assert {a.status_code for a in anonymous} == {401}, [a.text for a in anonymous]
    assert (still["status"], still["round"]) == ("succeeded", 1)  # nothing moved it
    assert models.count() == 1
