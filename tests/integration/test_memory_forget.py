"""A forgotten memory is gone from the database: its row and index entries, and the copies its
subject's runs made (the conversation, the answer, the steps and events of their rounds), which
read "[forgotten]" instead. Another subject's runs are left alone, and the audit log says that a
delete happened without naming the subject or holding the text. Checked on the whole database
as a dump sees it: pg_dump, and SQLite's own dump and file bytes (with secure_delete)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from agent_reach_controller.services.memory import Entry, Writer
from agent_reach_controller.storage.schema import audit_log
from tests.integration.runs_stack import profile, put_agent, run, stack
from tests.support.dumps import database_dump
from tests.support.models import ScriptedModels, answer, call_tools

pytestmark = pytest.mark.asyncio

CANARY = "canary-5e0b the user keeps a spare key under the blue flowerpot"


async def test_a_forgotten_memory_leaves_no_copy_in_its_subjects_runs(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model repeats the memory in a tool call and in its answer: copies a run made itself.
    script = [call_tools([("echo_say", {"text": CANARY})]), answer(f"Noted: {CANARY}.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "helper", profile(models))
            written = await c.memory.put(
                Writer(tenant="default", actor="alice"),
                "u1",
                Entry(type="fact", key="spare-key", text=CANARY),
            )
            mine = await run(api, {"agent": "helper", "input": "Remember it.", "subject": "u1"})
            assert CANARY in json.dumps(mine)  # the copies exist before the delete
            assert CANARY in database_dump(database_url)

            await c.memory.forget("default", "alice", written.entry.memory_id)

            after = (await api.get(f"/v1/runs/{mine['run_id']}")).json()
            shown = [after]
            for round_ in after["rounds"]:
                shown.append((await api.get(f"/v1/tasks/{round_['task_id']}")).json())
                shown.append((await api.get(f"/v1/tasks/{round_['task_id']}/events")).json())
            shown.append((await api.get(f"/v1/runs/{mine['run_id']}/replay")).json())
            async with c.db.transaction() as conn:
                audited = (
                    await conn.execute(
                        sa.select(audit_log.c.action, audit_log.c.data).where(
                            audit_log.c.target == f"memory:{written.entry.memory_id}"
                        )
                    )
                ).all()
                started = (
                    await conn.execute(
                        sa.select(audit_log.c.data).where(
                            audit_log.c.target == f"run:{mine['run_id']}"
                        )
                    )
                ).scalar_one()
            dump = database_dump(database_url)
    assert after["answer"] == "Noted: [forgotten]."
    assert CANARY not in json.dumps(shown)
    assert "[forgotten]" in json.dumps(shown[1])  # the tool call's arguments and receipt
    assert [a for a, _ in audited] == ["memory.write", "memory.forget"]
    assert "u1" not in json.dumps([d for _, d in audited])
    # The run's start names its subject by the same HMAC as the memory's rows.
    assert started["subject"] == audited[0][1]["subject"]
    assert mine["run_id"] in dump  # the dump is read, and holds the run
    assert CANARY not in dump


async def test_a_delete_leaves_another_subjects_runs_alone(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [answer(f"Noted: {CANARY}."), answer(f"Noted: {CANARY}.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "helper", profile(models))
            writer = Writer(tenant="default", actor="alice")
            written = await c.memory.put(writer, "u1", Entry(type="fact", key="k", text=CANARY))
            mine = await run(api, {"agent": "helper", "input": "Hi.", "subject": "u1"})
            other = await run(api, {"agent": "helper", "input": "Hi.", "subject": "u2"})
            await c.memory.forget("default", "alice", written.entry.memory_id)
            after = (await api.get(f"/v1/runs/{mine['run_id']}")).json()
            untouched = (await api.get(f"/v1/runs/{other['run_id']}")).json()
    assert after["answer"] == "Noted: [forgotten]."
    assert untouched["answer"] == f"Noted: {CANARY}."
