"""What the model is shown of an output: sensitive fields redacted, a bounded view that says
where the whole output is, and that whole output (still redacted) behind the handle."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.integration.stack import TOOLS, api_client, components_for, failed, ok, write_tools

CARD: dict[str, Any] = {
    "name": "card.fetch",
    "description": "Fetches a card and its recent charges.",
    "connector": "echo",
    "redact": ["card.number", "charges.cvv"],
}
OUTPUT = {
    "card": {"number": "4111111111111111", "last4": "1111"},
    "charges": [{"id": f"ch_{i}", "cvv": "123", "cents": i} for i in range(1_204)],
}
PLAN = {
    "steps": [
        {"step_id": "card", "tool": "card.fetch", "args": {}},
        {
            "step_id": "use",
            "tool": "echo.say",
            "args": {"text": "$card.output.card.number"},
            "depends_on": ["card"],
        },
    ]
}
CALLS = {
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "card_fetch", "arguments": "{}"}},
        {"id": "call_2", "type": "function", "function": {"name": "echo_say", "arguments": "{}"}},
    ]
}


async def test_redacted_fields_never_reach_the_model_but_later_steps_can_use_them(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(database_url, write_tools(tmp_path, [*TOOLS, CARD])) as c,
        api_client(c) as api,
    ):
        plan_task = (await api.post("/v1/tasks", json=PLAN)).json()["task_id"]
        (first,) = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        await c.reporting.report(executor_id="x", results=[ok(first, OUTPUT)])
        (second,) = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        # The stored output keeps the number: the next step was given the real value.
        assert second.resolved_args == {"text": "4111111111111111"}
        await c.reporting.report(executor_id="x", results=[ok(second, {"text": "ok"})])
        receipt = (await api.get(f"/v1/tasks/{plan_task}")).json()["steps"][0]["receipt"]
        assert receipt["data"]["card"] == {"number": "[redacted]", "last4": "1111"}
        assert "4111111111111111" not in json.dumps(receipt)

        task_id = (await api.post("/v1/tasks", json=CALLS)).json()["task_id"]
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        await c.reporting.report(
            executor_id="x",
            results=[ok(s, OUTPUT if s.step_id == "call_1" else {"text": "hi"}) for s in leased],
        )
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        content = task["tool_messages"][0]["content"]
        assert "4111111111111111" not in content
        assert '"cvv":"123"' not in content
        message = json.loads(content)
        handle = f"/v1/tasks/{task_id}/steps/call_1/output"
        assert message["full_output"] == handle
        assert "(first 5 of 1,204)" in message["data"]["charges"]
        assert len(content) <= 2000
        # A short output is shown whole, and then no handle is offered.
        assert "full_output" not in json.loads(task["tool_messages"][1]["content"])

        whole = (await api.get(handle)).json()
        assert whole["status"] == "succeeded"
        assert len(whole["output"]["charges"]) == 1_204
        assert whole["output"]["card"]["number"] == "[redacted]"
        assert {c["cvv"] for c in whole["output"]["charges"]} == {"[redacted]"}
        assert (await api.get(f"/v1/tasks/{task_id}/steps/nope/output")).status_code == 404


async def test_another_tenants_output_is_not_found(sqlite_url: str, tmp_path: Path) -> None:
    async with (
        components_for(sqlite_url, write_tools(tmp_path, [*TOOLS, CARD])) as c,
        api_client(c, tenant="acme") as acme,
        api_client(c, tenant="other") as other,
    ):
        task_id = (await acme.post("/v1/tasks", json=CALLS)).json()["task_id"]
        path = f"/v1/tasks/{task_id}/steps/call_1/output"
        assert (await acme.get(path)).json()["output"] is None  # not run yet
        assert (await other.get(path)).status_code == 404


async def test_a_task_shows_reported_tokens_tool_calls_and_duration(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(database_url, write_tools(tmp_path)) as c,
        api_client(c, tenant="acme") as api,
        api_client(c, tenant="other") as other,
    ):
        body = {"steps": [{"step_id": "s", "tool": "echo.say", "args": {"text": "x"}}]}
        task_id = (await api.post("/v1/tasks", json=body)).json()["task_id"]
        (first,) = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        await c.reporting.report(
            executor_id="x", results=[failed(first, "timeout", retryable=True)]
        )
        # The retry's backoff is 10 ms.
        [again] = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=5, wait=5)
        await c.reporting.report(executor_id="x", results=[ok(again, {"text": "x"})])

        usage = f"/v1/tasks/{task_id}/usage"
        await api.post(usage, json={"input_tokens": 1200, "output_tokens": 80})
        shown = (await api.post(usage, json={"input_tokens": 300})).json()["usage"]
        assert (shown["input_tokens"], shown["output_tokens"], shown["tool_calls"]) == (
            1500,
            80,
            2,
        )
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        assert task["usage"] == shown  # finished: its duration no longer grows
        took = datetime.fromisoformat(task["finished_at"]) - datetime.fromisoformat(
            task["created_at"]
        )
        assert abs(shown["duration_ms"] - took.total_seconds() * 1000) <= 1
        bad = await api.post(usage, json={"input_tokens": -1})
        assert (bad.status_code, bad.json()["errors"][0]["pointer"]) == (
            422,
            "/body/input_tokens",
        )
        assert (await api.post(usage, json={"tokens": 5})).status_code == 422
        assert (await other.post(usage, json={"input_tokens": 5})).status_code == 404
        again = (await api.get(f"/v1/tasks/{task_id}")).json()["usage"]
        assert again["input_tokens"] == 1500  # refused reports changed nothing
