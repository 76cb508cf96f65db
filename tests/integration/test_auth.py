"""API keys, tenants and the permission matrix: who may do what, and what others cannot see."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from agent_reach_controller.api.app import create_app
from agent_reach_controller.runtime import Components
from tests.integration.stack import (
    TOOLS,
    api_client,
    components_for,
    failed,
    key_for,
    ok,
    write_tools,
)

PAY = {
    "name": "pay.send",
    "description": "Moves money.",
    "connector": "echo",
    "idempotent": False,
}
ONCE = {**PAY, "name": "echo.once", "description": "Says it once."}
POLICY = {
    "roles": {
        "admin": [{"tools": "*", "actions": ["submit", "approve", "admin"]}],
        "agent": [{"tools": "echo.*", "actions": ["submit"]}],
        "payer": [{"tools": "pay.*", "actions": ["submit"]}],
        "approver": [{"tools": "pay.*", "actions": ["approve"]}],
        "viewer": [],
    }
}
# Written out by hand, independently of the policy code: (role, tool, action) → allowed.
ALLOWED = {
    ("admin", "echo.once", "submit"),
    ("admin", "pay.send", "submit"),
    ("admin", "echo.once", "approve"),
    ("admin", "pay.send", "approve"),
    ("admin", "*", "admin"),
    ("agent", "echo.once", "submit"),
    ("payer", "pay.send", "submit"),
    ("approver", "pay.send", "approve"),
}


def settings_with_policy(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(POLICY))
    return {"policy": path}


def v1_routes(c: Components) -> list[tuple[str, str]]:
    """Every (method, path) under /v1, with path parameters filled in."""
    paths = create_app(c).openapi()["paths"]
    return [
        (method.upper(), re.sub(r"\{[^}]+\}", "x", path))
        for path, operations in paths.items()
        if path.startswith("/v1")
        for method in operations
    ]


async def test_every_v1_route_needs_a_valid_key_and_health_does_not(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c:
        routes = v1_routes(c)
        assert len(routes) >= 10
        transport = httpx.ASGITransport(app=create_app(c))
        wrong = {"Authorization": "Bearer ark_000000000000_" + "A" * 43}
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for (method, path), headers in itertools.product(routes, ({}, wrong)):
                response = await client.request(method, path, headers=headers, json={})
                assert response.status_code == 401, (method, path, response.text)
                # A trigger's run is signed, not keyed: its challenge says so.
                signed = method == "POST" and path == "/v1/triggers/x"
                challenge = "StandardWebhooks" if signed else "Bearer"
                assert response.headers["www-authenticate"] == challenge
                code = "bad_signature" if signed else "unauthenticated"
                assert response.json()["code"] == code
            for path in ("/healthz", "/readyz"):
                assert (await client.get(path)).status_code == 200


# A valid body for each route that takes one, so a 404 cannot hide behind a 422.
TASK_ROUTE_BODIES: dict[str, dict[str, Any]] = {
    "resolve": {"action": "failed"},
    "approval": {"decision": "approve"},
    "usage": {"input_tokens": 1},
}


def task_routes(c: Components, task_id: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every (method, path, body) of the OpenAPI that names a task, filled in for `task_id`."""
    paths = create_app(c).openapi()["paths"]
    routes = []
    for path, operations in paths.items():
        if "{task_id}" not in path:
            continue
        filled = path.replace("{task_id}", task_id).replace("{step_id}", "s")
        for method in operations:
            body = TASK_ROUTE_BODIES.get(path.rsplit("/", 1)[-1], {}) if method == "post" else None
            routes.append((method.upper(), filled, body))
    return routes


async def test_another_tenants_task_does_not_exist_on_any_route(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        async with api_client(c, tenant="acme", name="alice") as alice:
            body = {"steps": [{"step_id": "s", "tool": "echo.say", "args": {}}]}
            task_id = (await alice.post("/v1/tasks", json=body)).json()["task_id"]
            assert (await alice.get(f"/v1/tasks/{task_id}")).status_code == 200
        routes = task_routes(c, task_id)
        assert len(routes) >= 10, routes  # every {task_id} route the API has
        async with api_client(c, tenant="globex", name="bob") as bob:
            for method, path, payload in routes:
                response = await bob.request(method, path, json=payload)
                assert response.status_code == 404, (method, path, response.text)
                assert response.json()["detail"] == f"no task {task_id!r}", (method, path)
            stream = await bob.get(
                f"/v1/tasks/{task_id}/events", headers={"Accept": "text/event-stream"}
            )
            assert stream.status_code == 404, stream.text
            assert (await bob.get("/v1/tasks")).json()["tasks"] == []
            missing = await bob.get("/v1/tasks/01890000-0000-7000-8000-000000000000")
            assert missing.json()["detail"].startswith("no task")  # the same answer
        async with api_client(c, tenant="acme", name="alice") as alice:
            view = (await alice.get(f"/v1/tasks/{task_id}")).json()
            assert view["status"] != "cancelled", view  # nothing bob sent took effect
            assert view["usage"]["input_tokens"] == 0, view


@pytest.mark.parametrize("role", sorted(POLICY["roles"]))
async def test_the_role_tool_action_matrix(role: str, sqlite_url: str, tmp_path: Path) -> None:
    tools = write_tools(tmp_path, [*TOOLS, PAY, ONCE])
    async with components_for(sqlite_url, tools, **settings_with_policy(tmp_path)) as c:
        admin = await key_for(c, roles=("admin",))
        async with api_client(c, roles=(role,)) as client:
            seen: set[tuple[str, str, str]] = set()
            for tool in ("echo.once", "pay.send"):
                body = {"steps": [{"step_id": "s", "tool": tool, "args": {}}]}
                submitted = await client.post("/v1/tasks", json=body)
                assert submitted.status_code in (202, 403), submitted.text
                if submitted.status_code == 202:
                    seen.add((role, tool, "submit"))
                else:
                    assert submitted.json()["code"] == "forbidden"
                # approve: resolving a step whose outcome is unknown.
                task_id = await unknown_outcome(c, client, admin, tool)
                resolved = await client.post(
                    f"/v1/tasks/{task_id}/steps/s/resolve", json={"action": "failed"}
                )
                assert resolved.status_code in (200, 403), resolved.text
                if resolved.status_code == 200:
                    seen.add((role, tool, "approve"))
            created = await client.post("/v1/keys", json={"name": "x", "roles": ["viewer"]})
            assert created.status_code in (201, 403), created.text
            if created.status_code == 201:
                seen.add((role, "*", "admin"))
            listed = await client.get("/v1/tools", params={"format": "openai"})
            visible = {t["function"]["name"] for t in listed.json()}
        expected = {a for a in ALLOWED if a[0] == role}
        assert seen == expected, f"unexpected allow: {seen - expected}; deny: {expected - seen}"
        may_submit = {tool for r, tool, action in expected if action == "submit"}
        names = {"echo.once": "echo_once", "pay.send": "pay_send"}
        assert {names[t] for t in may_submit} <= visible
        assert not visible & {names[t] for t in names if t not in may_submit}


async def unknown_outcome(
    c: Components, client: httpx.AsyncClient, admin: dict[str, str], tool: str
) -> str:
    """A task of the caller's tenant whose one step waits for a verdict (submitted by admin)."""
    body = {"steps": [{"step_id": "s", "tool": tool, "args": {}}]}
    task_id: str = (await client.post("/v1/tasks", json=body, headers=admin)).json()["task_id"]
    leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
    [step] = [s for s in leased if s.task_id == task_id]
    await c.reporting.report(
        executor_id="x",
        results=[failed(step, "timeout", retryable=True, maybe_applied=True)],
    )
    view = await c.queries.get(task_id)
    assert view.steps[0].status.value == "outcome_unknown", view.steps[0]
    return task_id


async def test_keys_are_shown_once_listed_without_secrets_and_revoked_at_once(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, api_client(c) as admin:
        made = await admin.post(
            "/v1/keys", json={"name": "ci-bot", "tenant": "acme", "roles": ["agent"]}
        )
        assert made.status_code == 201, made.text
        token = made.json()["token"]
        key_id = made.json()["key_id"]
        assert token.startswith(f"ark_{key_id}_")
        listed = (await admin.get("/v1/keys")).text
        assert token.split("_", 2)[2] not in listed
        assert "secret_hash" not in listed
        bot = {"Authorization": f"Bearer {token}"}
        assert (await admin.get("/v1/tasks", headers=bot)).status_code == 200
        bad_role = await admin.post("/v1/keys", json={"name": "x", "roles": ["root"]})
        assert bad_role.status_code == 422
        assert bad_role.json()["errors"][0]["pointer"] == "/roles"
        revoked = await admin.post(f"/v1/keys/{key_id}/revoke")
        assert revoked.json()["revoked_at"] is not None
        assert (await admin.get("/v1/tasks", headers=bot)).status_code == 401


async def test_a_step_whose_key_was_revoked_after_submit_never_runs(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        info, token = await c.keys.create(
            name="bot", tenant="acme", roles=["agent"], created_by="test"
        )
        async with api_client(c) as admin:
            body = {
                "steps": [
                    {"step_id": "a", "tool": "echo.say", "args": {}},
                    {"step_id": "b", "tool": "echo.say", "args": {}, "depends_on": ["a"]},
                ]
            }
            bot = {"Authorization": f"Bearer {token}"}
            task_id = (await admin.post("/v1/tasks", json=body, headers=bot)).json()["task_id"]
            [first] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
            await c.reporting.report(executor_id="x", results=[ok(first, {})])
            await admin.post(f"/v1/keys/{info.key_id}/revoke")
            # The next step is leased, checked, and ended instead of handed out.
            assert await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5) == []
            assert (await admin.get(f"/v1/tasks/{task_id}", headers=bot)).status_code == 401
        view = await c.queries.get(task_id)
        b = next(s for s in view.steps if s.step_id == "b")
        assert (b.status.value, b.error) == (
            "failed",
            {
                "code": "forbidden",
                "message": "not run: the API key that submitted it has been revoked",
                "retryable": False,
            },
        )
        assert view.task.status.value == "failed"


async def test_state_changing_calls_land_in_the_audit_log_with_who(
    database_url: str, tmp_path: Path
) -> None:
    from agent_reach_controller import audit
    from agent_reach_controller.tools.memory import memory_tools

    async with components_for(database_url, write_tools(tmp_path)) as c:
        async with api_client(c, tenant="acme", name="alice") as alice:
            body = {"steps": [{"step_id": "s", "tool": "echo.say", "args": {}}]}
            task_id = (await alice.post("/v1/tasks", json=body)).json()["task_id"]
            await alice.post(f"/v1/tasks/{task_id}/cancel")
        await audit.seal(c.db, settle_s=0)
        report = await audit.verify(c.db)
        assert report.problem is None
        async with c.db.transaction() as conn:
            import sqlalchemy as sa

            from agent_reach_controller.storage.schema import audit_log

            rows = (
                await conn.execute(
                    sa.select(audit_log.c.actor, audit_log.c.action, audit_log.c.target).order_by(
                        audit_log.c.seq
                    )
                )
            ).all()
        assert [tuple(r) for r in rows] == [
            ("tools-file", "tool.create", "tool:echo.say"),
            ("tools-file", "tool.create", "tool:echo.count"),
            *(("agent-reach", "tool.create", f"tool:{t.name}") for t in memory_tools()),
            ("test", "key.create", rows[6][2]),
            ("alice", "task.submit", f"task:{task_id}"),
            ("alice", "task.cancel", f"task:{task_id}"),
        ]


async def test_a_caller_at_its_in_flight_limit_gets_429_and_others_do_not(
    sqlite_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    async with components_for(sqlite_url, tools, max_tasks_in_flight_per_principal=2) as c:
        body = {"steps": [{"step_id": "s", "tool": "echo.say", "args": {}}]}
        async with api_client(c, name="busy") as busy, api_client(c, name="calm") as calm:
            for _ in range(2):
                assert (await busy.post("/v1/tasks", json=body)).status_code == 202
            refused = await busy.post("/v1/tasks", json=body)
            assert refused.status_code == 429
            assert refused.headers["retry-after"]
            assert refused.json()["code"] == "too_many_in_flight"
            assert refused.json()["detail"].startswith("busy has 2 unfinished tasks")
            assert (await calm.post("/v1/tasks", json=body)).status_code == 202
            # One finishes: the busy caller may submit again.
            [step, *_] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=1)
            await c.reporting.report(executor_id="x", results=[ok(step, {})])
            assert (await busy.post("/v1/tasks", json=body)).status_code == 202
