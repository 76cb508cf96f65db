"""The tool registry: change the catalogue through the API, every change a version, and a disabled
or deleted tool refused from the next dispatch on, in every replica."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from agent_reach_controller.runtime import Components
from agent_reach_controller.services.registry import UNDECLARED_DESTINATIONS_BY
from agent_reach_controller.storage import catalog
from agent_reach_controller.storage.catalog import ChangeRow
from agent_reach_controller.storage.schema import audit_log
from agent_reach_controller.tools.catalog import STORED, ToolSpec
from agent_reach_controller.tools.memory import memory_tools
from tests.integration.stack import TOOLS, api_client, components_for, key_for, ok, write_tools

# The tools every catalogue is seeded with (the memory tools).
SEEDED = [t.name for t in memory_tools()]
MAIL: dict[str, Any] = {
    "name": "mail.send",
    "description": "Sends a message.",
    "connector": "echo",
    "risk": "write",
    "timeout": "5s",
    "input_schema": {
        "type": "object",
        "required": ["to"],
        "properties": {"to": {"type": "string"}},
    },
}


def plan(tool: str = "mail.send", **args: Any) -> dict[str, Any]:
    return {"steps": [{"step_id": "s", "tool": tool, "args": args or {"to": "ann"}}]}


async def ended(c: Components, task_id: str) -> Any:
    view = await c.queries.get(task_id)
    return view.steps[0]


async def test_a_tool_created_through_the_api_runs_and_its_history_is_kept(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        created = await api.post("/v1/tools", json=MAIL)
        assert created.status_code == 201, created.text
        assert created.headers["location"] == "/v1/tools/mail.send"
        first = created.json()
        assert created.headers["etag"] == f'"{first["revision"]}"'
        assert (first["name"], first["enabled"], first["updated_by"]) == (
            "mail.send",
            True,
            "tester",
        )
        assert (await api.post("/v1/tools", json=MAIL)).status_code == 409

        task = await api.post("/v1/tasks", json=plan())
        assert task.status_code == 202, task.text
        (leased,) = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        assert (leased.tool, leased.tool_version) == ("mail.send", first["version"])

        changed = await api.put("/v1/tools/mail.send", json={**MAIL, "timeout": "9s"})
        assert changed.status_code == 200, changed.text
        assert changed.json()["version"] != first["version"]
        assert changed.json()["revision"] > first["revision"]
        again = await api.put("/v1/tools/mail.send", json={**MAIL, "timeout": "9s"})
        assert again.json()["revision"] == changed.json()["revision"]  # same definition: no change

        history = (await api.get("/v1/tools/mail.send/versions")).json()["changes"]
        assert [(h["action"], h["version"]) for h in history] == [
            ("update", changed.json()["version"]),
            ("create", first["version"]),
        ]
        old = await api.get(f"/v1/tools/mail.send/versions/{first['version']}")
        assert (old.json()["timeout"], old.json()["version"]) == (5.0, first["version"])


async def test_a_task_keeps_the_version_it_was_validated_against(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        await api.post("/v1/tools", json=MAIL)
        before = (await api.post("/v1/tasks", json=plan())).json()["task_id"]
        tighter = {**MAIL, "timeout": "1s"}
        assert (await api.put("/v1/tools/mail.send", json=tighter)).status_code == 200
        after = (await api.post("/v1/tasks", json=plan())).json()["task_id"]
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        by_task = {s.task_id: c.registry.get(s.tool, s.tool_version).timeout for s in leased}
        assert by_task == {before: 5.0, after: 1.0}


async def test_after_a_restart_a_step_of_an_older_version_still_reports(
    database_url: str, tmp_path: Path
) -> None:
    """The older version is loaded in the report's own transaction (a second one would wait for
    the first forever on SQLite)."""
    tools = write_tools(tmp_path)
    async with components_for(database_url, tools) as c, api_client(c) as api:
        assert (await api.post("/v1/tools", json=MAIL)).status_code == 201
        assert (await api.post("/v1/tasks", json=plan())).status_code == 202
        [step] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        tighter = {**MAIL, "timeout": "1s"}  # a new version; the step keeps its own
        assert (await api.put("/v1/tools/mail.send", json=tighter)).status_code == 200
    async with components_for(database_url, tools) as c:  # a restart: caches start empty
        async with asyncio.timeout(20):
            acks = await c.reporting.report(executor_id="x", results=[ok(step, {"sent": 1})])
        assert [a.accepted for a in acks] == [True]
        assert (await c.queries.get(step.task_id)).task.status == "succeeded"


async def test_a_disabled_tool_is_refused_at_the_next_dispatch_with_a_receipt(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        await api.post("/v1/tools", json=MAIL)
        queued = (await api.post("/v1/tasks", json=plan())).json()["task_id"]
        off = await api.post("/v1/tools/mail.send:disable")
        assert (off.status_code, off.json()["enabled"]) == (200, False)

        assert await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5) == []
        step = await ended(c, queued)
        assert (step.status.value, step.error["code"]) == ("failed", "tool_unavailable")
        assert "disabled" in step.error["message"]

        refused = await api.post("/v1/tasks", json=plan())
        assert refused.status_code == 422
        assert refused.json()["errors"][0]["code"] == "tool_disabled"
        listed = (await api.get("/v1/tools")).json()["tools"]
        assert "mail.send" not in {t["name"] for t in listed}
        openai = (await api.get("/v1/tools", params={"format": "openai"})).json()
        assert "mail_send" not in {t["function"]["name"] for t in openai}
        shown = (await api.get("/v1/tools", params={"include_disabled": "true"})).json()["tools"]
        assert {t["name"]: t["enabled"] for t in shown}["mail.send"] is False

        assert (await api.post("/v1/tools/mail.send:enable")).json()["enabled"] is True
        runs = (await api.post("/v1/tasks", json=plan())).json()["task_id"]
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        assert [s.task_id for s in leased] == [runs]
        actions = [
            h["action"] for h in (await api.get("/v1/tools/mail.send/versions")).json()["changes"]
        ]
        assert actions == ["enable", "disable", "create"]


async def test_disabling_in_one_replica_stops_the_next_claim_in_another(
    postgres_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, MAIL])
    async with (
        components_for(postgres_url, tools) as one,
        components_for(postgres_url, tools) as two,
    ):
        async with api_client(one) as api:
            queued = (await api.post("/v1/tasks", json=plan())).json()["task_id"]
            assert two.catalog["mail.send"].enabled  # replica two has seen it enabled
            assert (await api.post("/v1/tools/mail.send:disable")).status_code == 200
        assert await two.leasing.claim(executor_id="y", connectors=["echo"], limit=5) == []
        assert (await ended(two, queued)).error["code"] == "tool_unavailable"
        assert not two.catalog["mail.send"].enabled


async def test_a_submit_to_a_replica_with_a_stale_catalogue_is_checked_against_the_new_one(
    postgres_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, MAIL])
    strict = {**MAIL, "input_schema": {**MAIL["input_schema"], "required": ["to", "subject"]}}
    async with (
        components_for(postgres_url, tools) as one,
        components_for(postgres_url, tools) as two,
        api_client(one) as first,
        api_client(two) as second,
    ):
        changed = await first.put("/v1/tools/mail.send", json=strict)
        assert changed.status_code == 200, changed.text
        stale = two.registry.revision
        assert stale < one.registry.revision  # replica two has not looked yet
        refused = await second.post("/v1/tasks", json=plan())  # valid only for the old version
        assert refused.status_code == 422, refused.text
        assert [e["pointer"] for e in refused.json()["errors"]] == ["/steps/0/args"]
        assert two.registry.revision == one.registry.revision
        ok = await second.post("/v1/tasks", json=plan(to="ann", subject="hi"))
        assert ok.status_code == 202, ok.text
        view = await two.queries.get(ok.json()["task_id"])
        assert view.steps[0].tool_version == one.catalog["mail.send"].version
        assert len((await second.get("/v1/tasks")).json()["tasks"]) == 1  # nothing else stored


async def test_a_tool_created_on_another_replica_is_accepted_at_once(
    postgres_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    async with (
        components_for(postgres_url, tools) as one,
        components_for(postgres_url, tools) as two,
        api_client(one) as first,
        api_client(two) as second,
    ):
        assert (await first.post("/v1/tools", json=MAIL)).status_code == 201
        assert "mail.send" not in two.catalog  # replica two has not looked yet
        accepted = await second.post("/v1/tasks", json=plan())
        assert accepted.status_code == 202, accepted.text
        refused = await second.post("/v1/tasks", json=plan("no.such"))  # still refused
        assert refused.json()["errors"][0]["code"] == "unknown_tool", refused.text


async def test_a_deleted_tool_ends_its_queued_steps_and_its_versions_stay(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        version = (await api.post("/v1/tools", json=MAIL)).json()["version"]
        queued = (await api.post("/v1/tasks", json=plan())).json()["task_id"]
        assert (await api.delete("/v1/tools/mail.send")).status_code == 204
        assert (await api.get("/v1/tools/mail.send")).status_code == 404
        assert await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5) == []
        step = await ended(c, queued)
        assert (step.error["code"], "deleted" in step.error["message"]) == (
            "tool_unavailable",
            True,
        )
        kept = await api.get(f"/v1/tools/mail.send/versions/{version}")
        assert kept.status_code == 200
        assert [
            h["action"] for h in (await api.get("/v1/tools/mail.send/versions")).json()["changes"]
        ] == ["delete", "create"]
        assert (await api.post("/v1/tools", json=MAIL)).status_code == 201  # the name is free


async def test_the_catalogue_stays_valid_as_a_whole(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        backup = {**MAIL, "name": "mail.backup"}
        primary = {**MAIL, "fallback": "mail.backup"}
        orphan = await api.post("/v1/tools", json=primary)
        assert (orphan.status_code, orphan.json()["code"]) == (409, "catalog_conflict")
        assert "not a known tool" in orphan.json()["detail"]
        await api.post("/v1/tools", json=backup)
        assert (await api.post("/v1/tools", json=primary)).status_code == 201
        still_used = await api.delete("/v1/tools/mail.backup")
        assert (still_used.status_code, still_used.json()["code"]) == (409, "catalog_conflict")
        reserved = await api.post("/v1/tools", json={**MAIL, "name": "breakers"})
        assert reserved.status_code == 409
        bad = await api.post("/v1/tools", json={**MAIL, "retry": {"maximum_attempts": 0}})
        assert bad.status_code == 422
        assert bad.json()["errors"][0]["pointer"] == "/body/retry/maximum_attempts"
        renamed = await api.put("/v1/tools/mail.send", json={**MAIL, "name": "mail.other"})
        assert (renamed.status_code, renamed.json()["errors"][0]["pointer"]) == (422, "/body/name")


async def test_if_match_makes_a_change_conditional(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        etag = (await api.post("/v1/tools", json=MAIL)).headers["etag"]
        moved = await api.post("/v1/tools/mail.send:disable", headers={"If-Match": etag})
        assert moved.status_code == 200
        stale = await api.post("/v1/tools/mail.send:enable", headers={"If-Match": etag})
        assert (stale.status_code, stale.json()["code"]) == (412, "revision_mismatch")
        assert (await api.get("/v1/tools/mail.send")).json()["enabled"] is False
        fresh = await api.post(
            "/v1/tools/mail.send:enable", headers={"If-Match": moved.headers["etag"]}
        )
        assert fresh.status_code == 200
        garbage = await api.delete("/v1/tools/mail.send", headers={"If-Match": "soon"})
        assert garbage.status_code == 412


async def test_export_then_import_changes_nothing_and_import_says_what_changed(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        await api.post("/v1/tools", json=MAIL)
        exported = await api.get("/v1/tools:export")
        assert exported.headers["content-type"].startswith("application/yaml")
        document = yaml.safe_load(exported.text)
        # The memory tools are seeded into every catalogue: exported and imported like any.
        assert {t["name"] for t in document["tools"]} == {
            "echo.say",
            "echo.count",
            "mail.send",
            *SEEDED,
        }
        assert "retry" not in next(t for t in document["tools"] if t["name"] == "mail.send")

        yaml_body = {"content": exported.text, "headers": {"Content-Type": "application/yaml"}}
        same = (await api.post("/v1/tools:import", **yaml_body)).json()
        assert (same["created"], same["updated"], same["deleted"]) == ([], [], [])
        assert sorted(same["unchanged"]) == sorted(["echo.count", "echo.say", "mail.send", *SEEDED])

        mail = next(t for t in document["tools"] if t["name"] == "mail.send")
        edited = {"tools": [{**mail, "timeout": 7}, {**MAIL, "name": "mail.new"}]}
        dry = await api.post(
            "/v1/tools:import", params={"dry_run": "true", "prune": "true"}, json=edited
        )
        assert dry.json() | {"revision": 0} == {
            "revision": 0,
            "dry_run": True,
            "created": ["mail.new"],
            "updated": ["mail.send"],
            "disabled": [],
            "enabled": [],
            "deleted": ["echo.count", "echo.say", *sorted(SEEDED)],
            "unchanged": [],
        }
        assert "mail.new" not in c.catalog  # a dry run changes nothing
        done = (await api.post("/v1/tools:import", params={"prune": "true"}, json=edited)).json()
        assert (done["created"], done["deleted"]) == (
            ["mail.new"],
            ["echo.count", "echo.say", *sorted(SEEDED)],
        )
        names = {t["name"] for t in (await api.get("/v1/tools")).json()["tools"]}
        assert names == {"mail.send", "mail.new"}


async def test_an_invalid_import_changes_nothing_and_points_at_every_problem(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        before = c.registry.revision
        document = {
            "tools": [
                MAIL,
                {**MAIL, "name": "mail.bad", "retry": {"maximum_attempts": 0}},
                {**MAIL, "timeout": "soon"},
            ]
        }
        answer = await api.post("/v1/tools:import", json=document)
        assert answer.status_code == 422
        pointers = [e["pointer"] for e in answer.json()["errors"]]
        assert pointers == ["/tools/1/retry/maximum_attempts", "/tools/2/timeout"]
        duplicate = await api.post("/v1/tools:import", json={"tools": [MAIL, MAIL]})
        assert duplicate.json()["errors"][0]["pointer"] == "/tools/1/name"
        broken = await api.post(
            "/v1/tools:import", content="tools: [", headers={"Content-Type": "application/yaml"}
        )
        assert broken.status_code == 400
        await c.registry.refresh()
        assert c.registry.revision == before


async def test_only_admins_of_a_tool_may_change_it(database_url: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "roles": {
                    "admin": [{"tools": "*", "actions": ["submit", "admin"]}],
                    "mail-admin": [{"tools": "mail.*", "actions": ["admin"]}],
                    "agent": [{"tools": "echo.*", "actions": ["submit"]}],
                }
            }
        )
    )
    async with components_for(database_url, write_tools(tmp_path), policy=policy) as c:
        mail_admin = await key_for(c, roles=("mail-admin",), name="mo")
        agent = await key_for(c, roles=("agent",), name="bot")
        async with api_client(c) as api:
            assert (await api.post("/v1/tools", json=MAIL, headers=mail_admin)).status_code == 201
            other = {**MAIL, "name": "pay.send"}
            assert (await api.post("/v1/tools", json=other, headers=mail_admin)).status_code == 403
            assert (await api.post("/v1/tools", json=MAIL, headers=agent)).status_code == 403
            # The agent cannot see mail.* at all: 404, as for a tool that does not exist.
            assert (await api.get("/v1/tools/mail.send", headers=agent)).status_code == 404
            hidden = await api.post("/v1/tools/mail.send:disable", headers=agent)
            assert hidden.status_code == 404
            seen = await api.post("/v1/tools/echo.say:disable", headers=agent)
            assert seen.status_code == 403
            pruning = await api.post(
                "/v1/tools:import",
                params={"prune": "true"},
                json={"tools": [MAIL]},
                headers=mail_admin,
            )
            assert pruning.status_code == 403
            exported = yaml.safe_load((await api.get("/v1/tools:export", headers=mail_admin)).text)
            assert [t["name"] for t in exported["tools"]] == ["mail.send"]


async def test_a_restart_reapplies_the_tools_files_and_keeps_api_tools(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    async with components_for(database_url, tools) as c, api_client(c) as api:
        await api.post("/v1/tools", json=MAIL)
        await api.post("/v1/tools/echo.say:disable")
        revision = c.registry.revision
    async with components_for(database_url, tools) as c:
        # The file owns echo.say: it is enabled again; mail.send came from the API and stays.
        assert c.catalog["echo.say"].enabled
        assert "mail.send" in c.catalog
        assert c.registry.revision == revision + 1
    async with components_for(database_url, tools) as c:
        assert c.registry.revision == revision + 1  # the same files again change nothing


# Stored before `destinations` were required: a notify tool, and an http tool whose URL's host
# is an argument. The third names a fixed host and needs no list.
BEFORE_DESTINATIONS: list[dict[str, Any]] = [
    {
        "name": "tell",
        "description": "Tells people.",
        "connector": "notify",
        "risk": "write",
        "config": {"webhook_secret": "${env:TELL_SECRET}"},
    },
    {
        "name": "hook.post",
        "description": "Posts to the URL given.",
        "connector": "http",
        "config": {"url": "https://{host}/hook", "method": "POST"},
        "input_schema": {"type": "object", "properties": {"host": {"type": "string"}}},
    },
    {
        "name": "order.get",
        "description": "Reads an order.",
        "connector": "http",
        "config": {"url": "https://orders.example.invalid/orders/{id}"},
    },
]


async def store_as_an_older_version_did(c: Components, definitions: list[dict[str, Any]]) -> None:
    """Write tools straight into the catalogue's tables, checked only as a stored version is."""
    specs = [ToolSpec.model_validate(d, context=STORED) for d in definitions]
    async with c.db.transaction() as conn:
        revision = await catalog.revision(conn, lock=True)
        changes = [
            ChangeRow(
                revision=revision + n,
                name=spec.name,
                action="create",
                version=spec.version,
                principal="tools-file",
                created_at=datetime.now(UTC),
            )
            for n, spec in enumerate(specs, start=1)
        ]
        dumped = {spec.version: spec.model_dump(mode="json") for spec in specs}
        await catalog.write_changes(conn, changes, specs=dumped)


async def test_a_stored_tool_without_destinations_is_disabled_at_start_with_the_reason(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    async with components_for(database_url, tools) as c:
        await store_as_an_older_version_did(c, BEFORE_DESTINATIONS)
    async with components_for(database_url, tools) as c, api_client(c) as api:  # it starts
        heads = c.registry.heads
        for name in ("tell", "hook.post"):
            assert not heads[name].spec.enabled, name
            assert heads[name].updated_by == UNDECLARED_DESTINATIONS_BY
        assert heads["order.get"].spec.enabled
        shown = (await api.get("/v1/tools/tell")).json()
        assert (shown["enabled"], shown["updated_by"]) == (False, UNDECLARED_DESTINATIONS_BY)
        history = (await api.get("/v1/tools/hook.post/versions")).json()["changes"]
        assert [h["action"] for h in history] == ["disable", "create"]
        async with c.db.transaction() as conn:
            rows = await conn.execute(
                sa.select(audit_log.c.target, audit_log.c.data).where(
                    audit_log.c.actor == UNDECLARED_DESTINATIONS_BY
                )
            )
            reasons = {row.target: row.data["reason"] for row in rows}
        assert set(reasons) == {"tool:tell", "tool:hook.post"}
        assert reasons["tool:tell"].startswith("config.destinations is required: a notify tool")
        assert (
            "config.destinations is required: an argument of the url" in reasons["tool:hook.post"]
        )

        refused = await api.post("/v1/tasks", json=plan("hook.post", host="x.invalid"))
        assert refused.status_code == 422, refused.text
        assert "tool_disabled" in refused.text
        enabled = await api.post("/v1/tools/hook.post:enable")
        assert enabled.status_code == 409, enabled.text
        assert "config.destinations" in enabled.json()["detail"]

        fixed = {**BEFORE_DESTINATIONS[1], "enabled": True}
        fixed["config"] = {**fixed["config"], "destinations": ["hooks.example.invalid"]}
        updated = await api.put("/v1/tools/hook.post", json=fixed)
        assert updated.status_code == 200, updated.text
        assert updated.json()["enabled"] is True
        revision = c.registry.revision
    async with components_for(database_url, tools) as c:  # a second start changes nothing
        assert c.registry.revision == revision
        assert not c.catalog["tell"].enabled
        assert c.catalog["hook.post"].enabled
