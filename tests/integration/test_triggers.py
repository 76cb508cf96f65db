"""Triggers: a signed event starts a stored plan template ("new order → check stock → compute a
ship date → tell the customer"), once per event id, governed like any submit, in its own trace."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from standardwebhooks.webhooks import Webhook

from agent_reach_controller.api.app import create_app
from agent_reach_controller.identity.policy import Principal
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.triggers import Saved, SaveInput, TriggerChangedError
from tests.integration.stack import TOOLS, api_client, components_for, ok, write_tools

ORDER_TEMPLATE: dict[str, Any] = {
    "goal": "ship a new order",
    "steps": [
        {"step_id": "stock", "tool": "echo.count", "args": {"n": "$event.qty"}},
        {
            "step_id": "ship",
            "tool": "echo.say",
            "args": {"text": "$stock.output.eta"},
            "depends_on": ["stock"],
        },
        {
            "step_id": "tell",
            "tool": "echo.say",
            "args": {"text": "$event.customer.email", "n": "$event.qty"},
            "depends_on": ["ship"],
            "when": "context.event.total > 10",
        },
    ],
}
ORDER = {"order_id": "o-1", "qty": 3, "total": 42.5, "customer": {"email": "ann@example.test"}}


def signed(secret: str, event: Any, *, event_id: str, at: datetime | None = None) -> dict[str, Any]:
    """The body and headers a Standard Webhooks sender posts."""
    body = json.dumps(event)
    when = at or datetime.now(UTC)
    signature = Webhook(secret).sign(event_id, when, body)
    headers = {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": signature,
    }
    return {"content": body.encode(), "headers": headers}


def sender(c: Components) -> httpx.AsyncClient:
    """A client with no API key: a trigger's caller has only the secret."""
    transport = httpx.ASGITransport(app=create_app(c))
    return httpx.AsyncClient(transport=transport, base_url="http://reach.test")


async def run_ready(c: Components, outputs: dict[str, Any]) -> list[str]:
    """Lease the ready steps and report each with its output; the step ids run."""
    claimed = await c.leasing.poll(executor_id="t", connectors=["echo"], limit=10, wait=2)
    await c.reporting.report(
        executor_id="t", results=[ok(s, outputs.get(s.step_id, {})) for s in claimed]
    )
    return [s.step_id for s in claimed]


async def test_an_event_runs_the_template_once_per_event_id(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(database_url, write_tools(tmp_path)) as c,
        api_client(c) as api,
        sender(c) as outside,
    ):
        saved = await api.put("/v1/triggers/orders.new", json={"template": ORDER_TEMPLATE})
        assert saved.status_code == 200, saved.text
        out = saved.json()
        assert (out["version"], out["created"], out["new_version"]) == (1, True, True)
        secret = out["secret"]
        assert secret.startswith("whsec_")

        first = await outside.post(
            "/v1/triggers/orders.new", **signed(secret, ORDER, event_id="e1")
        )
        assert first.status_code == 202, first.text
        run = first.json()
        assert (run["trigger"], run["version"], run["created"]) == ("orders.new", 1, True)
        task_id = run["task_id"]
        assert first.headers["location"] == f"/v1/tasks/{task_id}"

        assert await run_ready(c, {"stock": {"eta": "2026-12-05"}}) == ["stock"]
        assert await run_ready(c, {}) == ["ship"]
        assert await run_ready(c, {}) == ["tell"]
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        assert task["status"] == "succeeded", task
        steps = {s["step_id"]: s for s in task["steps"]}
        # The event's parts arrive with the event's types; later references still resolve.
        assert steps["stock"]["resolved_args"] == {"n": 3}
        assert steps["ship"]["resolved_args"] == {"text": "2026-12-05"}
        assert steps["tell"]["resolved_args"] == {"text": "ann@example.test", "n": 3}
        replay = (await api.get(f"/v1/tasks/{task_id}/replay")).json()
        context = replay["request"]["context"]
        assert context["event"] == ORDER
        assert context["trigger"] == {"name": "orders.new", "version": 1, "event_id": "e1"}

        # The sender retries: the same task, nothing new runs.
        again = await outside.post(
            "/v1/triggers/orders.new", **signed(secret, ORDER, event_id="e1")
        )
        assert again.status_code == 200, again.text
        assert (again.json()["task_id"], again.json()["created"]) == (task_id, False)
        # Another body under the same event id is a conflict, not a second run.
        other = {**ORDER, "qty": 4}
        clash = await outside.post(
            "/v1/triggers/orders.new", **signed(secret, other, event_id="e1")
        )
        assert clash.status_code == 409, clash.text
        # A new event is a new task in a trace of its own; the condition reads the event.
        small = {**ORDER, "total": 5}
        second = await outside.post(
            "/v1/triggers/orders.new", **signed(secret, small, event_id="e2")
        )
        assert second.status_code == 202, second.text
        assert second.json()["trace_id"] != run["trace_id"]
        assert await run_ready(c, {"stock": {"eta": "soon"}}) == ["stock"]
        assert await run_ready(c, {}) == ["ship"]
        task = (await api.get(f"/v1/tasks/{second.json()['task_id']}")).json()
        assert {s["step_id"]: s["status"] for s in task["steps"]}["tell"] == "skipped"


async def test_unknown_names_and_bad_signatures_answer_alike(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(sqlite_url, write_tools(tmp_path)) as c,
        api_client(c) as api,
        sender(c) as outside,
    ):
        saved = await api.put("/v1/triggers/orders", json={"template": ORDER_TEMPLATE})
        secret = saved.json()["secret"]
        other = "whsec_" + base64.b64encode(b"not the trigger's secret, 32b").decode()
        good = signed(secret, ORDER, event_id="e1")
        stale = signed(secret, ORDER, event_id="e1", at=datetime.now(UTC) - timedelta(minutes=6))
        cases: list[tuple[str, dict[str, Any]]] = [
            ("/v1/triggers/nope", good),
            ("/v1/triggers/orders", signed(other, ORDER, event_id="e1")),
            ("/v1/triggers/orders", stale),
            ("/v1/triggers/orders", {**good, "content": good["content"] + b" "}),
            ("/v1/triggers/orders", {**good, "headers": {**good["headers"], "webhook-id": "e2"}}),
            # Malformed headers and bodies the signing library would raise on as they come.
            (
                "/v1/triggers/orders",
                {**good, "headers": {**good["headers"], "webhook-signature": "v1"}},
            ),
            (
                "/v1/triggers/orders",
                {**good, "headers": {**good["headers"], "webhook-signature": "v1,%%%"}},
            ),
            (
                "/v1/triggers/orders",
                {**good, "headers": {**good["headers"], "webhook-timestamp": "1e999"}},
            ),
            ("/v1/triggers/orders", {**good, "content": b"\xff\xfe"}),
            (
                "/v1/triggers/orders",
                {"content": good["content"], "headers": {"content-type": "application/json"}},
            ),
        ]
        answers = set()
        for path, request in cases:
            answer = await outside.post(path, **request)
            assert answer.status_code == 401, (path, request["headers"], answer.text)
            assert answer.headers["content-type"] == "application/problem+json"
            answers.add((answer.json()["code"], answer.json()["detail"]))
        assert len(answers) == 1  # nothing tells an unknown name from a wrong signature
        # An API key is no way in either: only the signature is.
        keyed = await api.post("/v1/triggers/orders", json=ORDER)
        assert keyed.status_code == 401
        assert await c.queries.list_tasks(tenant="default", status=None, before=None, limit=5) == []


async def test_templates_are_checked_when_saved(sqlite_url: str, tmp_path: Path) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, api_client(c) as api:

        async def problems(body: dict[str, Any]) -> list[tuple[str, str]]:
            answer = await api.put("/v1/triggers/t", json=body)
            assert answer.status_code == 422, answer.text
            return [(e["pointer"], e["code"]) for e in answer.json()["errors"]]

        bad = {
            "context": {"event": 1, "trigger": 2},
            "steps": [
                {"step_id": "event", "tool": "echo.say", "args": {"text": "$event..x"}},
                {"step_id": "b", "tool": "nope", "args": {}},
                {"step_id": "c", "tool": "echo.count", "args": {"n": "three"}},
            ],
        }
        assert sorted(await problems({"template": bad})) == sorted(
            [
                ("/template/context/event", "reserved"),
                ("/template/context/trigger", "reserved"),
                ("/template/steps/0/step_id", "reserved"),
                ("/template/steps/0/args/text", "invalid_reference"),
                ("/template/steps/1/tool", "unknown_tool"),
                ("/template/steps/2/args/n", "invalid_arguments"),
            ]
        )
        weak = {"template": ORDER_TEMPLATE, "secret": "hunter2"}
        assert await problems(weak) == [("/secret", "invalid_secret")]
        said = await api.put("/v1/triggers/t", json=weak)
        assert "hunter2" not in said.text  # a secret is never said back, even a bad one
        bad_name = await api.put("/v1/triggers/..", json={"template": ORDER_TEMPLATE})
        assert bad_name.status_code in (404, 422)
        assert (await api.get("/v1/triggers")).json() == {"triggers": []}


async def test_versions_secrets_and_tenants(sqlite_url: str, tmp_path: Path) -> None:
    async with (
        components_for(sqlite_url, write_tools(tmp_path)) as c,
        api_client(c) as api,
        api_client(c, tenant="other", name="stranger") as stranger,
        sender(c) as outside,
    ):
        first = (await api.put("/v1/triggers/o", json={"template": ORDER_TEMPLATE})).json()
        same = (await api.put("/v1/triggers/o", json={"template": ORDER_TEMPLATE})).json()
        assert (same["version"], same["new_version"], same["secret"]) == (1, False, None)
        changed = {**ORDER_TEMPLATE, "goal": "ship it"}
        second = (await api.put("/v1/triggers/o", json={"template": changed})).json()
        assert (second["version"], second["new_version"]) == (2, True)
        old = (await api.get("/v1/triggers/o/versions/1")).json()
        assert old["template"] == ORDER_TEMPLATE
        assert (await api.get("/v1/triggers/o")).json()["template"] == changed

        listed = await api.get("/v1/triggers")
        assert first["secret"] not in listed.text
        assert listed.json()["triggers"][0]["secret_fingerprint"].startswith("sha256:")

        rotated = (
            await api.put("/v1/triggers/o", json={"template": changed, "rotate_secret": True})
        ).json()
        assert rotated["secret"] not in (None, first["secret"])
        refused = await outside.post(
            "/v1/triggers/o", **signed(first["secret"], ORDER, event_id="a")
        )
        assert refused.status_code == 401
        taken = await outside.post(
            "/v1/triggers/o", **signed(rotated["secret"], ORDER, event_id="a")
        )
        assert (taken.status_code, taken.json()["version"]) == (202, 2)

        # Another tenant sees nothing and cannot take the name over.
        assert (await stranger.get("/v1/triggers/o")).status_code == 404
        assert (await stranger.get("/v1/triggers")).json() == {"triggers": []}
        assert (
            await stranger.put("/v1/triggers/o", json={"template": ORDER_TEMPLATE})
        ).status_code == 404
        assert (await stranger.delete("/v1/triggers/o")).status_code == 404

        assert (await api.delete("/v1/triggers/o")).status_code == 204
        gone = await outside.post(
            "/v1/triggers/o", **signed(rotated["secret"], ORDER, event_id="b")
        )
        assert gone.status_code == 401
        # The versions a deleted trigger ran stay; a new one under the name goes on counting.
        again = (await api.put("/v1/triggers/o", json={"template": ORDER_TEMPLATE})).json()
        assert again["version"] == 3


async def test_runs_are_governed_like_submits(sqlite_url: str, tmp_path: Path) -> None:
    tools = [
        *TOOLS,
        {**TOOLS[0], "name": "pay.send", "risk": "write"},
        {**TOOLS[0], "name": "echo.grounded", "grounded": ["text"]},
    ]
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "roles:\n"
        "  admin: [{tools: '*', actions: [submit, approve, admin]}]\n"
        "  agent: [{tools: 'echo.*', actions: [submit]}]\n"
        "  viewer: []\n"
    )
    async with (
        components_for(sqlite_url, write_tools(tmp_path, tools), policy=policy) as c,
        api_client(c, roles=("agent",), name="bot") as bot,
        api_client(c, roles=("viewer",), name="eyes") as viewer,
        sender(c) as outside,
    ):
        paying = {"steps": [{"step_id": "p", "tool": "pay.send", "args": {}}]}
        refused = await bot.put("/v1/triggers/pay", json={"template": paying})
        assert (refused.status_code, refused.json()["code"]) == (403, "forbidden")
        assert (
            await viewer.put("/v1/triggers/o", json={"template": ORDER_TEMPLATE})
        ).status_code == 403

        # A grounded argument may come from the event (a run puts it in the context), not
        # from the template's author.
        made_up = {"steps": [{"step_id": "g", "tool": "echo.grounded", "args": {"text": "bob"}}]}
        ungrounded = await bot.put("/v1/triggers/g", json={"template": made_up})
        assert ungrounded.json()["errors"][0]["code"] == "ungrounded_argument"
        grounded = {"steps": [{**made_up["steps"][0], "args": {"text": "$event.to"}}]}
        g = (await bot.put("/v1/triggers/g", json={"template": grounded})).json()
        ran = await outside.post(
            "/v1/triggers/g", **signed(g["secret"], {"to": "ann"}, event_id="g")
        )
        assert ran.status_code == 202, ran.text

        saved = (await bot.put("/v1/triggers/o", json={"template": ORDER_TEMPLATE})).json()
        secret = saved["secret"]
        assert saved["owner"] == "bot"
        missing = await outside.post("/v1/triggers/o", **signed(secret, {"qty": 1}, event_id="m"))
        assert missing.status_code == 422, missing.text
        errors = {(e["pointer"], e["code"]) for e in missing.json()["errors"]}
        assert errors == {("/steps/2/args/text", "missing_event_field")}
        assert "customer" in missing.json()["errors"][0]["detail"]

        off = await bot.put("/v1/triggers/o", json={"template": ORDER_TEMPLATE, "enabled": False})
        assert off.json()["enabled"] is False
        disabled = await outside.post("/v1/triggers/o", **signed(secret, ORDER, event_id="d"))
        assert (disabled.status_code, disabled.json()["code"]) == (403, "trigger_disabled")
        await bot.put("/v1/triggers/o", json={"template": ORDER_TEMPLATE})

        # The run has the rights of the key that saved the trigger, as they are at the run.
        key_id = bot.headers["authorization"].split("_")[1]
        assert await c.keys.revoke(key_id)
        revoked = await outside.post("/v1/triggers/o", **signed(secret, ORDER, event_id="r"))
        assert (revoked.status_code, revoked.json()["code"]) == (403, "owner_revoked")


async def test_saves_that_race_are_stored_or_refused_never_lost(
    database_url: str, tmp_path: Path
) -> None:
    """Concurrent saves of one new name, straight to the service (HTTP requests through the
    in-process transport do not overlap): each is stored as it was sent, or refused with 409."""
    who = Principal(name="ops", tenant="default", roles=("admin",), key_id=None)
    async with components_for(database_url, write_tools(tmp_path)) as c:

        async def save(name: str, template: dict[str, Any]) -> Saved | None:
            data = SaveInput(name=name, template=template)
            try:
                return await c.triggers.save(data, who=who, catalog=c.catalog, authorize=print)
            except TriggerChangedError:
                return None

        for round_ in range(5):
            name = f"race{round_}"
            sent = [{**ORDER_TEMPLATE, "goal": f"try {i}"} for i in range(6)]
            answers = await asyncio.gather(*(save(name, t) for t in sent))
            won = [(t, a) for t, a in zip(sent, answers, strict=True) if a is not None]
            assert won
            for template, saved in won:  # what a save says it stored is what it was sent
                assert saved.trigger.template == template
                stored = await c.triggers.version(name, saved.trigger.version, tenant=None)
                assert stored.template == template
            live = await c.triggers.get(name, tenant=None)
            assert live.version == max(saved.trigger.version for _, saved in won)


async def test_an_events_values_are_data_never_references(
    database_url: str, tmp_path: Path
) -> None:
    """A sender who puts `$step.output` text in an event must not copy an earlier step's output
    into a later step's arguments; `$$` in the event arrives as sent (issue 28)."""
    template = {
        "steps": [
            {"step_id": "first", "tool": "echo.say", "args": {"text": "start"}},
            {
                "step_id": "second",
                "tool": "echo.say",
                "args": {"text": "$event.v", "extra": "$event.more"},
                "depends_on": ["first"],
            },
        ]
    }
    event = {
        "v": "$first.output.internal",
        "more": {"a": ["$first.output", "$$x", {"b": "$$$first.output.internal"}], "p": "$5"},
    }
    async with (
        components_for(database_url, write_tools(tmp_path)) as c,
        api_client(c) as api,
        sender(c) as outside,
    ):
        saved = await api.put("/v1/triggers/leak", json={"template": template})
        assert saved.status_code == 200, saved.text
        posted = await outside.post(
            "/v1/triggers/leak", **signed(saved.json()["secret"], event, event_id="e1")
        )
        assert posted.status_code == 202, posted.text
        await run_ready(c, {"first": {"internal": "SECRET-OUTPUT"}})
        claimed = await c.leasing.poll(executor_id="t", connectors=["echo"], limit=10, wait=2)
        (second,) = claimed
        # What the executor is handed: the event's own bytes, nothing of the first step's output.
        assert second.resolved_args == {"text": event["v"], "extra": event["more"]}
        assert "SECRET-OUTPUT" not in json.dumps(second.resolved_args)
