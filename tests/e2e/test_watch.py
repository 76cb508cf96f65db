"""`reach status TASK_ID --watch` against a real `reach dev`: follows the task live over the
event stream and exits with the task's outcome."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.processes import REACH, api, cluster, wait_until

pytestmark = pytest.mark.e2e

TOOLS = {
    "tools": [
        {"name": "clock.wait", "description": "Waits.", "connector": "sleep"},
        {"name": "note.echo", "description": "Echoes.", "connector": "echo"},
    ]
}


def _watch(url: list[str], task_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*REACH, "status", task_id, "--watch", *url],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_watch_follows_a_task_to_its_end_and_exits_with_its_outcome(tmp_path: Path) -> None:
    tools = tmp_path / "tools.yaml"
    tools.write_text(json.dumps(TOOLS))
    with cluster(tmp_path) as c:
        dev = c.dev("dev", tools=tools)
        wait_until(lambda: "Press Ctrl-C to stop" in dev.output(), within=60, what="reach dev")
        url = ["--url", f"http://{dev.info['http']}", "--api-key", c.api_key]
        with api(dev) as client:
            slow = client.post(
                "/v1/tasks",
                json={
                    "steps": [
                        {"step_id": "wait", "tool": "clock.wait", "args": {"seconds": 5}},
                        {"step_id": "a", "tool": "note.echo", "depends_on": ["wait"]},
                        {"step_id": "b", "tool": "note.echo", "depends_on": ["wait", "a"]},
                    ]
                },
            ).json()["task_id"]
            broken = client.post(
                "/v1/tasks",
                json={
                    "steps": [
                        {"step_id": "wait", "tool": "clock.wait", "args": {"seconds": "x"}},
                        {"step_id": "after", "tool": "note.echo", "depends_on": ["wait"]},
                    ]
                },
            ).json()["task_id"]

            # Started while the first step sleeps: the stream carries the rest as it happens.
            watching = subprocess.Popen(
                [*REACH, "status", slow, "--watch", *url],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            assert watching.stdout is not None
            lines = []
            try:
                for line in watching.stdout:  # bounded: the watch ends with the task
                    lines.append(line.rstrip("\n"))
                    if "wait: ready → running" in line:
                        # Printed live: the step still sleeps, the task has not ended.
                        now = client.get(f"/v1/tasks/{slow}").json()["status"]
                        assert now == "running", (now, lines)
                out, err = watching.communicate(timeout=90)
            finally:
                watching.kill()
        assert watching.returncode == 0, "\n".join(lines) + out + err
        assert out == ""
        for change in (
            "wait: blocked → ready",
            "wait: ready → running",
            "wait: running → succeeded",
            "a: blocked → ready",
            "b: running → succeeded",
            f"task {slow} task_status → succeeded",
        ):
            assert any(change in line for line in lines), (change, lines)
        # Then the final tree: b under a (its latest dependency), naming the other.
        assert lines[-4].startswith(f"task {slow} succeeded · 3/3 steps done · ")
        assert lines[-3].startswith("└─ ✓ wait  clock.wait  succeeded  attempt 1")
        assert lines[-2].startswith("   └─ ✓ a  note.echo  succeeded  attempt 1")
        assert lines[-1].startswith("      └─ ✓ b  note.echo  succeeded  attempt 1")
        assert lines[-1].endswith("(also after wait)")

        failed = _watch(url, broken)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert any("wait: running → failed" in line for line in failed.stdout.splitlines())
        assert f"task {broken} failed" in failed.stdout

        missing = _watch(url, "no-such-task")
        assert missing.returncode == 1
        assert "not_found" in missing.stdout
