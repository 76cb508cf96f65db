"""A client generated from a live controller's /openapi.json by `openapi-python-client`, as a
user's generator would make it, drives submit, status and the catalogue."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.processes import TEST_API_KEY, Proc, cluster

pytestmark = pytest.mark.e2e
PACKAGE = "reach_openapi_client"
TOOLS = [
    {
        "name": "echo.say",
        "description": "Echo the arguments back.",
        "connector": "echo",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    workdir = tmp_path_factory.mktemp("dev")
    tools = workdir / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": TOOLS}))
    with cluster(workdir) as c:
        yield c.dev("dev", tools=tools)


@pytest.fixture(scope="module")
def generated(dev: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    where = tmp_path_factory.mktemp("generated")
    document = where / "openapi.json"
    document.write_bytes(httpx.get(f"http://{dev.info['http']}/openapi.json", timeout=60).content)
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(
        [
            str(bin_dir / "openapi-python-client"),
            "generate",
            "--path",
            str(document),
            "--output-path",
            str(where / PACKAGE),
            "--meta",
            "none",
        ],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The only piece the generator leaves out: the YAML body of tools:import (JSON is there).
    said = done.stdout + done.stderr
    skipped = [line for line in said.splitlines() if line.startswith("WARNING parsing")]
    assert skipped == ["WARNING parsing POST /v1/tools:import within tools."], said
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(where))
        for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def api(generated: ModuleType, name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.api.{name}")


def model(generated: ModuleType, name: str) -> Any:
    return getattr(importlib.import_module(f"{PACKAGE}.models"), name)


def test_the_generated_client_submits_reads_and_lists(dev: Proc, generated: ModuleType) -> None:
    client = generated.AuthenticatedClient(
        base_url=f"http://{dev.info['http']}", token=TEST_API_KEY
    )
    listed = api(generated, "tools.list_tools").sync(
        client=client, format_=model(generated, "ListToolsFormat")("mcp")
    )
    assert [t.name for t in listed] == ["echo.say"]
    assert listed[0].annotations.read_only_hint is True

    plan = model(generated, "PlanSubmission").from_dict(
        {"goal": "say", "steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}}]}
    )
    submit = api(generated, "tasks.submit_task")
    done = submit.sync(client=client, body=plan, wait=20.0, idempotency_key="gen-1")
    assert done.status == "succeeded", done
    read = api(generated, "tasks.get_task").sync(client=client, task_id=done.task_id)
    assert [s.step_id for s in read.steps] == ["a"]
    assert read.steps[0].receipt.additional_properties["status"] == "succeeded"

    turn = model(generated, "ChatSubmission").from_dict(
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "echo_say", "arguments": '{"text": 3}'},
                }
            ],
        }
    )
    answered = submit.sync(client=client, body=turn, wait=20.0)
    assert answered.status == "failed"
    [message] = answered.tool_messages
    assert "refused before it ran" in message.content

    refused = submit.sync_detailed(
        client=client,
        body=model(generated, "PlanSubmission").from_dict(
            {"steps": [{"step_id": "a", "tool": "nope"}]}
        ),
    )
    assert refused.status_code == 422
    assert [e.pointer for e in refused.parsed.errors] == ["/steps/0/tool"]


def test_the_generated_client_remembers_and_forgets(dev: Proc, generated: ModuleType) -> None:
    client = generated.AuthenticatedClient(
        base_url=f"http://{dev.info['http']}", token=TEST_API_KEY
    )
    entry = {"subject": "org/ann", "type": "fact", "key": "city", "text": "Lives in Wuhan"}
    put = api(generated, "memory.put_memory")
    written = put.sync_detailed(client=client, body=model(generated, "MemoryIn").from_dict(entry))
    assert written.status_code == 201
    memory_id = written.parsed.memory_id
    found = api(generated, "memory.search_memory").sync(client=client, subject="org/ann", q="Wuhan")
    assert [(m.memory_id, m.untrusted) for m in found.memories] == [(memory_id, False)]
    listed = api(generated, "memory.list_memories").sync(
        client=client, subject="org/ann", type_="fact,goal"
    )
    assert [m.key for m in listed.memories] == ["city"]
    patched = api(generated, "memory.patch_memory").sync(
        client=client,
        memory_id=memory_id,
        body=model(generated, "MemoryPatch").from_dict({"pinned": True, "value": None}),
    )
    assert (patched.pinned, patched.version) == (True, 2)
    refused = put.sync_detailed(
        client=client,
        body=model(generated, "MemoryIn").from_dict(entry | {"text": "AKIAIOSFODNN7EXAMPLE"}),
    )
    assert refused.status_code == 422
    assert [e.pointer for e in refused.parsed.errors] == ["/body/text"]
    gone = api(generated, "memory.forget_subject").sync(client=client, subject="org/ann")
    assert gone.forgotten == 1
