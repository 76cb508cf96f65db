"""Who may let a run touch memory: a run's memory tools need the caller's memory rights beside
`submit` (search and list: read; save: write; forget: forget), and a run with a subject needs
read to recall and write to extract. A caller without them cannot reach memory through a run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration.runs_stack import profile, put_agent, stack
from tests.integration.stack import key_for
from tests.support.models import ScriptedModels, answer

pytestmark = pytest.mark.asyncio

POLICY = {
    "roles": {
        "admin": [
            {
                "tools": "*",
                "actions": ["submit", "approve", "admin", "memory_read", "memory_write"],
            }
        ],
        "reader": [{"tools": "*", "actions": ["submit", "memory_read"]}],
        "plain": [{"tools": "*", "actions": ["submit"]}],
    }
}


async def test_a_runs_memory_needs_its_callers_memory_rights(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    with ScriptedModels([answer("ok")] * 4) as models:
        async with stack(database_url, tmp_path, monkeypatch, policy=policy) as (c, api):
            await put_agent(api, "all", profile(models, tools=["echo.*", "memory.*"]))
            await put_agent(api, "saver", profile(models, tools=["memory.save"]))
            await put_agent(api, "keeper", profile(models, memory={"extract": True}))
            reader = await key_for(c, roles=("reader",), name="reader")
            plain = await key_for(c, roles=("plain",), name="plain")
            ask = {"agent": "all", "input": "hi", "subject": "u1"}
            as_reader = await api.post("/v1/runs?wait=30", json=ask, headers=reader)
            as_plain = await api.post("/v1/runs?wait=30", json=ask, headers=plain)
            no_subject = await api.post(
                "/v1/runs?wait=30", json={"agent": "all", "input": "hi"}, headers=plain
            )
            named = await api.post(
                "/v1/runs", json={"agent": "saver", "input": "hi"}, headers=reader
            )
            extracting = await api.post(
                "/v1/runs", json={"agent": "keeper", "input": "hi", "subject": "u1"}, headers=reader
            )
            sent_tools = [
                sorted(t["function"]["name"] for t in body.get("tools", []))
                for _, body in models.requests
            ]
    assert as_reader.status_code == 200, as_reader.text
    # The reader's run may read memory, not write or forget it.
    assert sent_tools[0] == ["echo_say", "memory_list", "memory_search"]
    # Without memory_read, a run with a subject cannot recall: refused, naming the action.
    assert as_plain.status_code == 403, as_plain.text
    assert "memory_read" in as_plain.json()["detail"]
    # Without a subject it recalls nothing; its model still gets no memory tool.
    assert no_subject.status_code == 200, no_subject.text
    assert sent_tools[1] == ["echo_say"]
    # A profile naming a memory tool outright needs the right for it.
    assert named.status_code == 403, named.text
    assert "memory_write" in named.json()["detail"]
    assert extracting.status_code == 403, extracting.text
    assert "memory_write" in extracting.json()["detail"]
