"""`@tool` functions end to end: `reach tools import-python` puts them in a running controller's
catalogue (it never imports them), and the executor of `reach dev` runs them with their types."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.processes import REACH, api, cluster, wait_until

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def reach(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*REACH, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def test_python_tools_are_imported_by_name_and_run_with_their_types(tmp_path: Path) -> None:
    printed = reach("tools", "import-python", "tests.support.pytools_example", "--print", cwd=ROOT)
    assert printed.returncode == 0, printed.stderr
    names = [t["name"] for t in yaml.safe_load(printed.stdout)["tools"]]
    assert names == ["count", "weather.tomorrow"]
    missing = reach("tools", "import-python", "tests.support.no_such_module", "--print", cwd=ROOT)
    assert missing.returncode == 2
    assert "cannot import tests.support.no_such_module: ModuleNotFoundError" in missing.stderr

    tools = tmp_path / "tools.yaml"
    tools.write_text("tools: []\n")
    # The executor of `reach dev` imports the module by the path the catalogue names.
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with cluster(tmp_path, env=env) as c:
        dev = c.dev("dev", tools=tools)
        url = f"http://{dev.info['http']}"
        done = reach(
            "tools",
            "import-python",
            "tests.support.pytools_example",
            "--url",
            url,
            "--api-key",
            c.api_key,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        with api(dev) as client:
            place = {"city": "Wuhan"}
            steps = [
                {
                    "step_id": "w",
                    "tool": "weather.tomorrow",
                    "args": {"place": place, "at": "2026-12-03T08:00:00+08:00"},
                },
                {"step_id": "n", "tool": "count", "args": {"words": ["take", "an", "umbrella"]}},
                {
                    "step_id": "bad",
                    "tool": "weather.tomorrow",
                    "args": {"place": place, "at": "tomorrow morning"},
                },
            ]
            answer = client.post("/v1/tasks", json={"steps": steps})
            # `at` is a date-time string by the schema, but formats are not asserted at submit:
            # the function's own validation refuses it on the executor.
            assert answer.status_code == 202, answer.text
            task_id = answer.json()["task_id"]

            def ended() -> dict | None:
                task = client.get(f"/v1/tasks/{task_id}").json()
                return task if task["status"] in ("succeeded", "failed") else None

            task = wait_until(ended, within=60, what="the python tools to run")
            by_id = {s["step_id"]: s for s in task["steps"]}
            assert by_id["w"]["receipt"]["data"]["hour"] == 8
            assert by_id["w"]["receipt"]["data"]["rain"] is True
            assert by_id["n"]["receipt"]["data"] == 3
            error = by_id["bad"]["receipt"]["error"]
            assert error["code"] == "invalid_arguments"
            assert "at: Input should be a valid datetime" in error["message"]
