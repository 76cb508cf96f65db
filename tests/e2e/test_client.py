"""The Python client (controller/client) against a real `reach dev`, the example agent loops
against a scripted model server through the vendors' SDKs, and the client installed alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_reach_client import AsyncClient, Client, PendingCalls, ProblemError

from tests.e2e.processes import TEST_API_KEY, Proc, cluster
from tests.support.models import ScriptedModels
from tests.support.sink import Response, Sink

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "controller" / "client"
EXAMPLES = sorted((CLIENT / "examples").glob("*_loop.py"))
TOOLS = [
    {
        "name": "echo.say",
        "description": "Echo the arguments back.",
        "connector": "echo",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    {
        "name": "vault.wipe",
        "description": "Wipes a vault.",
        "connector": "echo",
        "risk": "dangerous",
        "input_schema": {"type": "object", "properties": {"vault": {"type": "string"}}},
    },
]


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    workdir = tmp_path_factory.mktemp("dev")
    tools = workdir / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": TOOLS}))
    with cluster(workdir) as c:
        yield c.dev("dev", tools=tools)


def url_of(dev: Proc) -> str:
    return f"http://{dev.info['http']}"


def chat_turn(*calls: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }


def test_the_sync_client_end_to_end(dev: Proc) -> None:
    with Client(url_of(dev), api_key=TEST_API_KEY) as reach:
        assert {t["name"] for t in reach.tools(format="mcp")} == {"echo.say", "vault.wipe"}
        replies = reach.answer(chat_turn(("c1", "echo_say", '{"text": "hi"}')))
        assert [r["tool_call_id"] for r in replies] == ["c1"]
        plan = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "x"}}]}
        accepted = reach.submit(plan, idempotency_key="plan-1")
        assert reach.submit(plan, idempotency_key="plan-1")["task_id"] == accepted["task_id"]
        kinds = [e["kind"] for e in reach.events(accepted["task_id"])]
        assert kinds[0] == "task_created"
        assert reach.wait(accepted["task_id"])["status"] == "succeeded"
        with pytest.raises(ProblemError) as refused:
            reach.submit({"steps": [{"step_id": "a", "tool": "echo.say", "when": 5}]})
        assert refused.value.status == 422
        assert refused.value.errors[0]["pointer"] == "/steps/0/when"
        # A dangerous call waits for a person: `answer` says who, then an approver decides.
        with pytest.raises(PendingCalls) as waiting:
            reach.answer(chat_turn(("w1", "vault_wipe", '{"vault": "v"}')), within=1)
        [pending] = waiting.value.pending
        assert (pending["call_id"], pending["waiting_for"]) == ("w1", "approval")
        assert reach.cancel(waiting.value.task_id)["status"] == "cancelled"


async def test_the_async_client_end_to_end(dev: Proc) -> None:
    async with AsyncClient(url_of(dev), api_key=TEST_API_KEY) as reach:
        output = [
            {
                "type": "function_call",
                "call_id": "r1",
                "name": "echo_say",
                "arguments": '{"text": "hi"}',
            }
        ]
        replies = await reach.answer(output)
        assert [(r["type"], r["call_id"]) for r in replies] == [("function_call_output", "r1")]
        blocks = {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "echo_say", "input": {}}],
        }
        [message] = await reach.answer(blocks, dialect="anthropic")
        assert message["content"][0]["tool_use_id"] == "t1"
        call = await reach.submit({"name": "echo.say", "arguments": {}}, dialect="mcp", wait=10)
        assert call["status"] == "succeeded"
        events = [e async for e in reach.events(call["task_id"])]
        assert events[-1]["to_status"] == "succeeded"


def test_retries_honour_retry_after_and_keep_the_idempotency_key() -> None:
    accepted = {"task_id": "t", "trace_id": "0" * 32, "status": "pending"}
    with Sink() as sink:
        sink.script(
            "/v1/tasks",
            [
                Response(status=429, retry_after=0.2, json={"code": "overloaded"}),
                Response(status=503, retry_after=0, json={"code": "storage_unavailable"}),
                Response(status=202, json=accepted),
            ],
        )
        with Client(sink.url, api_key="ark_x", retries=3) as reach:
            assert reach.submit({"steps": []})["task_id"] == "t"
        sent = sink.requests("/v1/tasks")
    assert len(sent) == 3
    assert len({d.key for d in sent}) == 1
    assert sent[0].key is not None
    assert sent[1].at - sent[0].at >= 0.2  # Retry-After was waited out
    assert sent[0].headers["authorization"] == "Bearer ark_x"


def test_a_refusal_that_retrying_cannot_fix_is_raised_at_once() -> None:
    with Sink() as sink:
        problem = {"code": "invalid_plan", "detail": "bad", "errors": [{"pointer": "/steps"}]}
        sink.script("/v1/tasks", [Response(status=422, json=problem)])
        with Client(sink.url) as reach, pytest.raises(ProblemError) as info:
            reach.submit({})
        assert len(sink.requests("/v1/tasks")) == 1
    assert (info.value.status, info.value.code, info.value.errors) == (
        422,
        "invalid_plan",
        [{"pointer": "/steps"}],
    )


def test_events_resume_from_the_last_event_after_a_dropped_stream() -> None:
    def event(n: int) -> str:
        body = {"id": n, "kind": "k", "step_id": None, "data": None}
        return f"id: {n}\nevent: k\ndata: {json.dumps(body)}\n\n"

    sse = "text/event-stream"
    with Sink() as sink:
        sink.script(
            "/v1/tasks/t1/events",
            [  # the first stream ends without `end` (a replica stopping); the second finishes
                Response(body=event(5) + event(6), content_type=sse),
                Response(body=event(7) + "event: end\ndata: {}\n\n", content_type=sse),
            ],
        )
        with Client(sink.url) as reach:
            ids = [e["id"] for e in reach.events("t1", within=10)]
        sent = sink.requests("/v1/tasks/t1/events")
    assert ids == [5, 6, 7]
    assert [d.headers["last-event-id"] for d in sent] == ["0", "6"]
    assert sent[0].headers["accept"] == sse


def _run_example(python: str, example: Path, dev: Proc, models: ScriptedModels) -> str:
    env = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
        "OPENAI_BASE_URL": models.url,
        "OPENAI_API_KEY": "sk-scripted",
        "ANTHROPIC_BASE_URL": models.url.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": "sk-ant-scripted",
        "AGENT_REACH_URL": url_of(dev),
        "AGENT_REACH_API_KEY": TEST_API_KEY,
    }
    done = subprocess.run(
        [python, str(example), "say hi"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_each_example_loop_runs_against_a_scripted_model(example: Path, dev: Proc) -> None:
    with ScriptedModels() as models:
        said = _run_example(sys.executable, example, dev, models)
        # Two model requests: the tool calls, then the answer from their replies.
        assert len(models.requests) == 2
    assert said.startswith("the tools said: ")
    assert '"hi"' in said  # the good call's receipt
    assert "refused before it ran" in said  # the bad call's reply, not a failed turn


def test_the_client_installs_alone(dev: Proc, tmp_path: Path) -> None:
    venv, source = tmp_path / "venv", tmp_path / "client"
    # A copy: building in place would leave build/ and *.egg-info in the checkout.
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(source), "openai", "anthropic"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    for absent in ("fastapi", "sqlalchemy", "agent_reach_controller", "grpc"):
        probe = subprocess.run([python, "-c", f"import {absent}"], capture_output=True, check=False)
        assert probe.returncode != 0, f"{absent} came with the client"
    with ScriptedModels() as models:
        for example in EXAMPLES:
            assert "the tools said: " in _run_example(python, example, dev, models)
