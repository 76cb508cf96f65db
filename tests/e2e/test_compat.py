"""A rolling upgrade works in either order: the previous release's executor (N-1) runs steps for
this controller, and this executor runs steps for the previous release's controller.

The previous release is read from git (`git archive` of its commit) into a scratch folder and run
from there as plain processes; nothing of it is kept in the tree. The proto only grows (fields
added, none renamed or renumbered), so each side ignores what it does not know.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.processes import Cluster, Proc, all_terminal, api, cluster, wait_until
from tests.support.releases import PACKAGES, unpack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

TOOLS = {
    "tools": [
        {
            "name": "echo.say",
            "description": "Echo the arguments back.",
            "connector": "echo",
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        }
    ]
}


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's packages, unpacked from git."""
    return unpack(tmp_path_factory.mktemp("n-1"), *PACKAGES)


def _old_env(release: Path, base: dict[str, str]) -> dict[str, str]:
    """Run the previous release's code: its packages come first on the import path."""
    paths = [str(release / p) for p in PACKAGES]
    return {**base, "PYTHONPATH": os.pathsep.join([*paths, base.get("PYTHONPATH", "")])}


def _spawn_old(c: Cluster, release: Path, name: str, args: list[str]) -> Proc:
    log = c.workdir / f"{name}.log"
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [sys.executable, *args],
            cwd=c.workdir,
            env=_old_env(release, c.env),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    proc = Proc(name=name, popen=popen, log=log)
    c.procs.append(proc)
    return proc


def _run_a_task(controller: Proc) -> None:
    with api(controller) as client:
        body = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "upgrade"}}]}
        created = client.post("/v1/tasks", json=body)
        assert created.status_code in (200, 201, 202), created.text
        task_id = created.json()["task_id"]
        (task,) = wait_until(
            lambda: all_terminal(client, [task_id]), within=60, what="the task to finish"
        )
        assert task["status"] == "succeeded", task


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(TOOLS))
    return path


def test_the_previous_executor_runs_steps_for_this_controller(
    previous_release: Path, tools: Path, tmp_path: Path
) -> None:
    """Controllers first: during the upgrade they admit token-less executors (auth off)."""
    with cluster(tmp_path) as c:
        ctl = c.controller(
            "controller",
            database_url=f"sqlite:///{tmp_path}/new.db",
            tools=tools,
            extra=["--migrate", "--executor-auth", "off"],
        )
        old = _spawn_old(
            c,
            previous_release,
            "old-executor",
            ["-m", "agent_reach_executor", "--controller", ctl.info["grpc"], "--connector", "echo"],
        )
        wait_until(lambda: "registered with" in old.output(), within=60, what="the old executor")
        assert "(pool" not in old.output()  # it really is the old one: it knows no sessions
        _run_a_task(ctl)
        assert old.popen.poll() is None, old.output()[-3000:]


def test_this_executor_runs_steps_for_the_previous_controller(
    previous_release: Path, tools: Path, tmp_path: Path
) -> None:
    """Executors first: the old controller ignores the token and the session fields."""
    with cluster(tmp_path) as c:
        ready = tmp_path / "old.ready.json"
        old = _spawn_old(
            c,
            previous_release,
            "old-controller",
            [
                "-m",
                "agent_reach_cli.main",
                "controller",
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
                "--database-url",
                f"sqlite:///{tmp_path}/old.db",
                "--tools",
                str(tools),
                "--ready-file",
                str(ready),
                "--migrate",
            ],
        )
        c._await_ready_file(old, ready)
        new = c.executor("executor", controller=old, extra=["--connectors", "echo"])
        wait_until(lambda: "executor_registered" in new.output(), within=60, what="registered")
        assert "session -" in new.output()  # it really is the old controller: no sessions
        _run_a_task(old)
        assert "PollSteps failed" not in new.output()
