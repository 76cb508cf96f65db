"""Each dialect's round trip through the real app, built and checked with the vendors' own SDK
types: a model's turn as the SDK dumps it goes in, and what comes out must be valid input to the
same SDK's next request, one reply per call, the bad call answered with an error."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_type_hints

import httpx
import pytest
import yaml
from anthropic.types import Message, MessageParam, TextBlock, ToolParam, ToolUseBlock, Usage
from openai.types.chat import (
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionToolParam,
)
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.responses import (
    FunctionToolParam,
    Response,
    ResponseFunctionToolCall,
    ResponseInputParam,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import TypeAdapter

from agent_reach_controller.runtime import Components
from tests.integration.stack import TOOLS, api_client, components_for, key_for, ok, write_tools

DANGEROUS = {
    "name": "vault.wipe",
    "description": "Wipes a vault.",
    "connector": "echo",
    "risk": "dangerous",
    "input_schema": {
        "type": "object",
        "required": ["vault"],
        "additionalProperties": False,
        "properties": {"vault": {"type": "string"}},
    },
}


@contextlib.asynccontextmanager
async def api(url: str, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Components]]:
    policy = tmp_path / "policy.yaml"
    roles = {
        "admin": [{"tools": "*", "actions": ["submit", "approve", "admin"]}],
        "approver": [{"tools": "vault.*", "actions": ["approve"]}],
        "echoer": [{"tools": "echo.*", "actions": ["submit"]}],
    }
    policy.write_text(yaml.safe_dump({"roles": roles}))
    tools = write_tools(tmp_path, [*TOOLS, DANGEROUS])
    async with (
        components_for(url, tools, policy=policy) as c,
        api_client(c) as client,
    ):
        yield client, c


async def work_off(c: Components) -> None:
    """Act as an executor until nothing is ready: echo every step's arguments back."""
    while claimed := await c.leasing.poll(executor_id="t", connectors=["echo"], limit=10, wait=1):
        await c.reporting.report(executor_id="t", results=[ok(s, s.resolved_args) for s in claimed])


def keys_of(typed_dict: Any) -> set[str]:
    return set(get_type_hints(typed_dict))


def chat_turn(*calls: tuple[str, str, str]) -> dict[str, Any]:
    """An assistant message with these (id, function, arguments) calls, dumped as the SDK does."""
    message = ChatCompletionMessage(
        role="assistant",
        content=None,
        tool_calls=[
            ChatCompletionMessageFunctionToolCall(
                id=call_id, type="function", function=Function(name=name, arguments=arguments)
            )
            for call_id, name, arguments in calls
        ],
    )
    return message.model_dump()


async def test_openai_chat_turn_with_one_bad_call(database_url: str, tmp_path: Path) -> None:
    async with api(database_url, tmp_path) as (client, c):
        turn = chat_turn(
            ("call_ok", "echo_say", '{"text": "hi"}'),
            ("call_bad", "echo_say", '{"text": 5}'),
            ("call_ghost", "no_such_tool", "{}"),
            ("call_json", "echo_count", '{"n": '),
        )
        answer = await client.post("/v1/tasks", json={**turn, "context": {"user": "u1"}})
        assert answer.status_code == 202, answer.text
        task_id = answer.json()["task_id"]
        await work_off(c)
        replies = (await client.get(f"/v1/tasks/{task_id}/replies")).json()
        assert replies["dialect"] == "openai_chat"
        assert replies["pending"] == []
        messages = replies["replies"]
        assert [m["tool_call_id"] for m in messages] == [
            "call_ok",
            "call_bad",
            "call_ghost",
            "call_json",
        ]
        assert all(set(m) <= keys_of(ChatCompletionToolMessageParam) for m in messages)
        # The next request to the model is valid: the user's message, the assistant's turn as it
        # came, and a tool message for every call.
        conversation = [{"role": "user", "content": "hi"}, turn, *messages]
        TypeAdapter(list[ChatCompletionMessageParam]).validate_python(conversation)
        by_id = {m["tool_call_id"]: m["content"] for m in messages}
        assert '"hi"' in by_id["call_ok"]
        assert "refused before it ran" in by_id["call_bad"]
        assert "at /text: 5 is not of type 'string'" in by_id["call_bad"]
        assert "no tool named 'no_such_tool'" in by_id["call_ghost"]
        assert "not valid JSON" in by_id["call_json"]
        task = (await client.get(f"/v1/tasks/{task_id}")).json()
        assert task["source"] == "openai_chat"
        assert task["tool_messages"] == messages
        steps = {s["step_id"]: s for s in task["steps"]}
        assert steps["call_ok"]["status"] == "succeeded"
        assert steps["call_bad"]["status"] == "failed"
        assert steps["call_bad"]["receipt"]["error"]["code"] == "invalid_arguments"
        assert steps["call_ghost"]["receipt"]["error"]["code"] == "tool_unavailable"
        # The refusals are in the event log (replay and audit read it), with their pointers.
        events = (await client.get(f"/v1/tasks/{task_id}/events")).json()["events"]
        refusal = next(e for e in events if e["step_id"] == "call_bad")
        assert refusal["to_status"] == "failed"
        assert refusal["data"]["problems"] == [
            {
                "pointer": "/tool_calls/1/function/arguments",
                "code": "invalid_arguments",
                "detail": "at /text: 5 is not of type 'string'",
            }
        ]
        # ...and in the task's trace, as logs of its submit span (it never reached a queue).
        trace = (await client.get(f"/v1/tasks/{task_id}/trace")).json()
        [root] = [s for s in trace["data"][0]["spans"] if s["operationName"] == "submit_task"]
        logged = [{f["key"]: f["value"] for f in log["fields"]} for log in root["logs"]]
        bad = next(log for log in logged if log.get("step_id") == "call_bad")
        assert (bad["status"], bad["error.code"]) == ("failed", "invalid_arguments")
        replay = (await client.get(f"/v1/tasks/{task_id}/replay")).json()
        assert {s["step_id"] for s in replay["dry_run"]["steps"]} >= {"call_bad", "call_ghost"}


async def test_a_turn_of_only_bad_calls_ends_failed_with_every_reply(
    database_url: str, tmp_path: Path
) -> None:
    async with api(database_url, tmp_path) as (client, _):
        turn = chat_turn(("a", "echo_count", "{}"), ("b", "ghost", "{}"))
        answer = await client.post("/v1/tasks", json=turn, params={"wait": 5})
        assert answer.status_code == 200, answer.text
        task = answer.json()
        assert task["status"] == "failed"
        assert [m["tool_call_id"] for m in task["turn"]["replies"]] == ["a", "b"]
        assert task["turn"]["pending"] == []
        # atomic=true: all or nothing, as before and as a plan is.
        atomic = await client.post("/v1/tasks", json=turn, params={"atomic": "true"})
        assert atomic.status_code == 422
        assert {e["pointer"] for e in atomic.json()["errors"]} == {
            "/tool_calls/0/function/arguments",
            "/tool_calls/1/function/name",
        }


async def test_openai_responses_round_trip(database_url: str, tmp_path: Path) -> None:
    async with api(database_url, tmp_path) as (client, c):
        output = [
            ResponseOutputMessage(
                id="msg_1",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text="Let me.", annotations=[])],
            ),
            ResponseFunctionToolCall(
                type="function_call",
                id="fc_1",
                call_id="call_1",
                name="echo_say",
                arguments='{"text": "one"}',
                status="completed",
            ),
            ResponseFunctionToolCall(
                type="function_call",
                id="fc_2",
                call_id="call_2",
                name="echo_count",
                arguments='{"n": "two"}',
                status="completed",
            ),
        ]
        items = [item.model_dump() for item in output]
        for body in (items, {"output": items, "priority": 5}):  # bare, or with options
            answer = await client.post("/v1/tasks", json=body)
            assert answer.status_code == 202, answer.text
            task_id = answer.json()["task_id"]
            await work_off(c)
            turn = (await client.get(f"/v1/tasks/{task_id}/replies")).json()
            assert turn["dialect"] == "openai_responses"
            replies = turn["replies"]
            assert [(r["type"], r["call_id"]) for r in replies] == [
                ("function_call_output", "call_1"),
                ("function_call_output", "call_2"),
            ]
            assert all(set(r) <= keys_of(FunctionCallOutput) for r in replies)
            history = [i.model_dump(exclude_none=True, by_alias=True) for i in output[1:]]
            TypeAdapter(ResponseInputParam).validate_python([*history, *replies])
            assert "'two' is not of type 'integer'" in replies[1]["output"]
        bad = await client.post("/v1/tasks", json=[items[0]])
        assert bad.status_code == 422
        assert bad.json()["errors"][0]["detail"] == "no item of type 'function_call' to run"


async def test_a_whole_openai_response_is_taken_as_the_sdk_dumps_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    """`response.model_dump()` as it comes (usage, tools, reasoning and every other field of the
    SDK's `Response`): its function calls run, its other fields are not used."""
    call = ResponseFunctionToolCall(
        type="function_call", call_id="call_1", name="echo_say", arguments='{"text": "hi"}'
    )
    response = Response.model_validate(
        {
            "id": "resp_1",
            "created_at": 1765000000,
            "model": "gpt-test",
            "object": "response",
            "output": [call.model_dump()],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [{"type": "function", "name": "echo_say", "parameters": {}, "strict": True}],
            "status": "completed",
            "usage": {
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 15,
            },
        }
    )
    body = response.model_dump()
    assert len(body) > 20  # the SDK's every field, set or not
    async with api(sqlite_url, tmp_path) as (client, c):
        answer = await client.post("/v1/tasks", json={**body, "priority": 3})
        assert answer.status_code == 202, answer.text
        await work_off(c)
        task = (await client.get(f"/v1/tasks/{answer.json()['task_id']}")).json()
        assert task["source"] == "openai_responses"
        assert [(s["step_id"], s["status"]) for s in task["steps"]] == [("call_1", "succeeded")]
        # A near miss of an option beside the vendor's fields is still refused, not dropped.
        typo = await client.post("/v1/tasks", json={**body, "priorty": 3})
        assert typo.status_code == 422, typo.text
        assert typo.json()["errors"][0]["pointer"] == "/priorty"


async def test_anthropic_round_trip(database_url: str, tmp_path: Path) -> None:
    async with api(database_url, tmp_path) as (client, c):
        message = Message(
            id="msg_1",
            type="message",
            role="assistant",
            model="claude-sonnet-4-5",
            content=[
                TextBlock(type="text", text="Two calls."),
                ToolUseBlock(type="tool_use", id="toolu_1", name="echo_say", input={"text": "a"}),
                ToolUseBlock(type="tool_use", id="toolu_2", name="echo_count", input={"n": "b"}),
            ],
            stop_reason="tool_use",
            stop_sequence=None,
            usage=Usage(input_tokens=10, output_tokens=20),
        )
        answer = await client.post("/v1/tasks", json=message.model_dump())
        assert answer.status_code == 202, answer.text
        task_id = answer.json()["task_id"]
        await work_off(c)
        turn = (await client.get(f"/v1/tasks/{task_id}/replies")).json()
        assert turn["dialect"] == "anthropic"
        [reply] = turn["replies"]
        assert reply["role"] == "user"
        assert [(b["tool_use_id"], b["is_error"]) for b in reply["content"]] == [
            ("toolu_1", False),
            ("toolu_2", True),
        ]
        # Valid as the next request's messages: the assistant's turn as a param, then the reply.
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": [
                b.model_dump(exclude_none=True, include={"type", "text", "id", "name", "input"})
                for b in message.content
            ],
        }
        TypeAdapter(list[MessageParam]).validate_python([assistant, reply])
        # The MessageParam form (what a loop keeps in its history) reads the same.
        again = await client.post("/v1/tasks", json=assistant, params={"dialect": "anthropic"})
        assert again.status_code == 202, again.text


async def test_pending_calls_say_what_they_wait_for(database_url: str, tmp_path: Path) -> None:
    async with api(database_url, tmp_path) as (client, c):
        turn = chat_turn(
            ("call_wipe", "vault_wipe", '{"vault": "v1"}'),
            ("call_say", "echo_say", '{"text": "x"}'),
        )
        answer = await client.post("/v1/tasks", json=turn, params={"wait": 0.2})
        assert answer.status_code == 202
        task = answer.json()
        assert task["turn"]["replies"] == []  # no placeholder for a call that has not ended
        pending = {p["call_id"]: p for p in task["turn"]["pending"]}
        wipe = pending["call_wipe"]
        assert wipe["waiting_for"] == "approval"
        assert wipe["approvers"] == ["admin", "approver"]
        assert wipe["decide_by"] is not None
        assert wipe["replies_url"] == f"/v1/tasks/{task['task_id']}/replies"
        assert pending["call_say"]["waiting_for"] == "executor"
        await work_off(c)
        after = (await client.get(wipe["replies_url"])).json()
        assert [r["tool_call_id"] for r in after["replies"]] == ["call_say"]
        assert [p["call_id"] for p in after["pending"]] == ["call_wipe"]


async def test_the_same_turn_and_key_get_the_same_task_and_replies(
    database_url: str, tmp_path: Path
) -> None:
    async with api(database_url, tmp_path) as (client, c):
        turn = chat_turn(("c1", "echo_say", '{"text": "x"}'), ("c2", "ghost", "{}"))
        headers = {"Idempotency-Key": "turn-7"}
        first = await client.post("/v1/tasks", json=turn, headers=headers)
        await work_off(c)
        second = await client.post("/v1/tasks", json=turn, headers=headers, params={"wait": 5})
        assert second.status_code == 200
        assert second.json()["task_id"] == first.json()["task_id"]
        replies = (await client.get(f"/v1/tasks/{first.json()['task_id']}/replies")).json()
        assert second.json()["turn"]["replies"] == replies["replies"]
        assert len(replies["replies"]) == 2


async def test_a_call_to_a_tool_the_caller_may_not_use_is_refused_alone(
    database_url: str, tmp_path: Path
) -> None:
    async with api(database_url, tmp_path) as (admin, c):
        headers = await key_for(c, roles=("echoer",), name="agent")
        turn = chat_turn(
            ("c1", "echo_say", '{"text": "x"}'), ("c2", "vault_wipe", '{"vault": "v"}')
        )
        answer = await admin.post("/v1/tasks", json=turn, headers=headers, params={"wait": 0.2})
        assert answer.status_code == 202, answer.text
        by_id = {s["step_id"]: s for s in answer.json()["steps"]}
        assert by_id["c2"]["status"] == "failed"
        assert by_id["c2"]["receipt"]["error"]["code"] == "forbidden"
        assert by_id["c1"]["status"] in {"ready", "running"}
        # As a plan (all or nothing) the same call is a 403.
        plan = {"steps": [{"step_id": "w", "tool": "vault.wipe", "args": {"vault": "v"}}]}
        assert (await admin.post("/v1/tasks", json=plan, headers=headers)).status_code == 403


@pytest.mark.parametrize(
    ("body", "pointer", "detail"),
    [
        ({"tool_calls": [{"function": {"name": "x"}}]}, "/tool_calls/0/id", "'id' is required"),
        ({"content": [{"type": "tool_use", "name": "x"}]}, "/content/0/id", "'id' is required"),
        ({"output": "x"}, "/output", "'output' must be an array, not string"),
        ({"tool_calls": [], "contxt": {}}, "/contxt", "did you mean 'context'?"),
        ({"goal": "g"}, "/steps", "'steps' is required, or a model's turn"),
    ],
)
async def test_a_malformed_turn_is_refused_whole_with_a_pointer(
    sqlite_url: str, tmp_path: Path, body: Any, pointer: str, detail: str
) -> None:
    async with api(sqlite_url, tmp_path) as (client, _):
        answer = await client.post("/v1/tasks", json=body)
        assert answer.status_code == 422, answer.text
        errors = answer.json()["errors"]
        assert any(e["pointer"] == pointer and e["detail"].startswith(detail) for e in errors), (
            errors
        )


async def test_the_catalogue_in_every_shape_validates_as_the_sdks_take_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with api(sqlite_url, tmp_path) as (client, c):

        async def shape(fmt: str, **key: Any) -> list[dict[str, Any]]:
            headers = await key_for(c, **key) if key else {}
            answer = await client.get("/v1/tools", params={"format": fmt}, headers=headers)
            assert answer.status_code == 200, answer.text
            found: list[dict[str, Any]] = answer.json()
            return found

        chat = await shape("openai_chat")
        assert chat == await shape("openai")
        TypeAdapter(list[ChatCompletionToolParam]).validate_python(chat)
        responses = await shape("openai_responses")
        TypeAdapter(list[FunctionToolParam]).validate_python(responses)
        assert all(set(t) <= keys_of(FunctionToolParam) for t in responses)
        strict = {t["name"]: t["strict"] for t in responses}
        assert strict == {"echo_say": False, "echo_count": False, "vault_wipe": True}
        anthropic = await shape("anthropic")
        TypeAdapter(list[ToolParam]).validate_python(anthropic)
        assert all(set(t) <= keys_of(ToolParam) for t in anthropic)
        mcp = {t["name"]: t for t in await shape("mcp")}
        assert mcp["vault.wipe"]["annotations"] == {
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": False,
        }
        assert mcp["echo.say"]["annotations"]["readOnlyHint"] is True
        # Filtered by the caller's grants: a model is never shown what it cannot run.
        assert {t["name"] for t in await shape("mcp", roles=("echoer",))} == {
            "echo.say",
            "echo.count",
        }
