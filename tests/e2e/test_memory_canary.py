"""A forgotten memory is nowhere: a canary memory is written, recalled into a run (the model
really is sent it, and repeats it in a tool call and in its answer), then deleted. Afterwards
the canary is looked for in every file the processes wrote (JSON logs at DEBUG), every span they
exported, every API answer about the run (the run, its rounds' tasks and events, the replay, the
memory routes), the console's pages, and the database as its own dump tool writes it (pg_dump;
SQLite's dump and file bytes, secure_delete on). None may hold it; the replay shows
"[forgotten]" where it was.

Controller and executor as separate processes on Postgres, and `reach dev` on SQLite.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.processes import TEST_API_KEY, Cluster, Proc, api, cluster
from tests.support.dumps import database_dump
from tests.support.models import ScriptedModels, answer, call_tools
from tests.support.otlp import OtlpReceiver

pytestmark = pytest.mark.e2e

CANARY = "canary-9d41 the user buried the map under the third olive tree"
SUBJECT = "user-canary"
MODEL_KEY = "AGENT_REACH_CANARY_MODEL_KEY"


def tools_file(tmp_path: Path, models: ScriptedModels) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "name": "echo.say",
                        "description": "Says what it is given.",
                        "connector": "echo",
                        "idempotent": True,
                        "input_schema": {"type": "object", "properties": {"text": {}}},
                    }
                ],
                "agents": [
                    {
                        "name": "keeper",
                        "description": "Remembers.",
                        "endpoint": {
                            "kind": "openai_chat",
                            "base_url": models.url,
                            "api_key": f"${{env:{MODEL_KEY}}}",
                            "allow_hosts": ["127.0.0.1"],
                        },
                        "model": "scripted-1",
                        "tools": ["echo.*"],
                        "memory": {"recall": 5},
                    }
                ],
            }
        )
    )
    return path


def exercise(proc: Proc, models: ScriptedModels) -> tuple[dict[str, Any], list[str]]:
    """Write the canary, run with it, forget it; every answer read afterwards, as text."""
    read: list[str] = []
    with api(proc) as client:
        written = client.post(
            "/v1/memory",
            json={"subject": SUBJECT, "type": "fact", "key": "map", "text": CANARY},
        )
        assert written.status_code == 201, written.text
        memory_id = written.json()["memory_id"]
        started = client.post(
            "/v1/runs?wait=60",
            json={"agent": "keeper", "input": "Where is the olive tree map?", "subject": SUBJECT},
        )
        assert started.status_code == 200, started.text
        run_id = started.json()["run_id"]
        before = client.get(f"/v1/runs/{run_id}").json()
        assert before["status"] == "succeeded", before
        assert CANARY in json.dumps(before)  # the run's copies exist before the delete
        assert client.delete(f"/v1/memory/{memory_id}").status_code == 204

        run = client.get(f"/v1/runs/{run_id}")
        read.append(run.text)
        for round_ in run.json()["rounds"]:
            read.append(client.get(f"/v1/tasks/{round_['task_id']}").text)
            read.append(client.get(f"/v1/tasks/{round_['task_id']}/events").text)
        replay = client.get(f"/v1/runs/{run_id}/replay")
        read.append(replay.text)
        read.append(client.get("/v1/memory", params={"subject": SUBJECT}).text)
        read.append(client.get("/v1/memory/search", params={"subject": SUBJECT, "q": "olive"}).text)
        assert client.get(f"/v1/memory/{memory_id}").status_code == 404
        read += console_pages(client, run_id)
    return replay.json(), read


def console_pages(client: httpx.Client, run_id: str) -> list[str]:
    """The console's run pages, signed in with the cluster's admin key."""
    with httpx.Client(base_url=client.base_url, timeout=30, follow_redirects=True) as web:
        signed = web.post("/console/login", data={"api_key": TEST_API_KEY, "next": "/console/runs"})
        assert signed.status_code == 200, signed.text[:500]
        pages = [
            web.get(f"/console/runs/{run_id}"),
            web.get("/console/runs"),
            web.get("/console/memory"),
            web.get("/console/memory/subject", params={"subject": SUBJECT}),
            web.get("/console/memory/subject", params={"subject": SUBJECT, "q": "olive map"}),
        ]
        for page in pages:
            assert page.status_code == 200, page.text[:500]
        return [p.text for p in pages]


def script() -> list[Any]:
    # The model repeats what it was reminded of: a copy the run itself makes.
    return [call_tools([("echo_say", {"text": CANARY})]), answer(f"It is: {CANARY}.")]


def check(replay: dict[str, Any], read: list[str], workdir: Path, dump: str, spans: str) -> None:
    assert "[forgotten]" in json.dumps(replay)
    places = {f"answer {i}": text for i, text in enumerate(read)}
    for path in sorted(workdir.rglob("*.log")):
        places[f"file {path.name}"] = path.read_text(errors="replace")
    places["database dump"] = dump
    places["spans"] = spans
    assert any(name.startswith("file ") for name in places)
    leaks = [name for name, text in places.items() if CANARY in text]
    assert not leaks, f"the forgotten memory is still in: {leaks}"


def stop(c: Cluster) -> None:
    for proc in c.procs:
        code = proc.terminate(timeout=20)
        assert code == 0, f"{proc.name} exited {code}:\n{proc.output()[-3000:]}"


def test_a_forgotten_memory_is_nowhere_in_a_cluster(postgres_url: str, tmp_path: Path) -> None:
    started = time.monotonic()
    with OtlpReceiver() as otlp, ScriptedModels(script()) as models:
        with cluster(tmp_path, env={MODEL_KEY: "sk-canary-model"}) as c:
            c.env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
            c.env["AGENT_REACH_CONTROLLER_LOG_LEVEL"] = "DEBUG"
            ctl = c.controller(
                "controller",
                database_url=postgres_url,
                tools=tools_file(tmp_path, models),
                extra=["--migrate"],
            )
            c.executor("executor", controller=ctl, slots=4)
            replay, read = exercise(ctl, models)
            stop(c)
        spans = json.dumps([asdict(s) for s in otlp.spans()])
        sent = json.dumps([body for _, body in models.requests])
    assert CANARY in sent  # the model really was reminded of it: the search below can find it
    assert "execute_tool" in spans
    dump = database_dump(postgres_url)
    assert SUBJECT in dump  # the dump holds the run (its subject), not the memory's text
    check(replay, read, tmp_path, dump, spans)
    print(f"cluster: canary absent everywhere; {time.monotonic() - started:.1f}s")


def test_a_forgotten_memory_is_nowhere_in_reach_dev(tmp_path: Path) -> None:
    db = tmp_path / "dev.db"
    env = {
        "AGENT_REACH_CONTROLLER_DATABASE_URL": f"sqlite:///{db}",
        "AGENT_REACH_CONTROLLER_LOG_LEVEL": "DEBUG",
        MODEL_KEY: "sk-canary-model",
    }
    with ScriptedModels(script()) as models:
        with cluster(tmp_path, env=env) as c:
            dev = c.dev("dev", tools=tools_file(tmp_path, models))
            replay, read = exercise(dev, models)
            stop(c)
        sent = json.dumps([body for _, body in models.requests])
    assert CANARY in sent
    assert '"level": "debug"' in dev.output()
    check(replay, read, tmp_path, database_dump(f"sqlite:///{db}"), spans="")
