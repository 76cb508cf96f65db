"""`reach agents …` and `reach runs …` as a user types them, against a real `reach dev` whose
executor calls a scripted model server: what they print and how they exit."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.agent_stack import KEY, agent_dev, profile
from tests.e2e.processes import REACH, TEST_API_KEY, Proc
from tests.support.models import ScriptedModels, answer, call_tools

pytestmark = pytest.mark.e2e

# Everything every command printed, to check no secret was ever among it.
SAID: list[str] = []


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    with agent_dev(tmp_path_factory.mktemp("runs-cli")) as proc:
        yield proc
    said = "\n".join(SAID)
    assert TEST_API_KEY not in said
    assert KEY not in said


def reach(dev: Proc, *args: str, api_key: str = TEST_API_KEY) -> subprocess.CompletedProcess[str]:
    """A `reach` command with the controller's URL and the API key in its environment."""
    env = {
        **os.environ,
        "AGENT_REACH_URL": f"http://{dev.info['http']}",
        "AGENT_REACH_API_KEY": api_key,
        "COLUMNS": "100",
    }
    done = subprocess.run(
        [*REACH, *args], capture_output=True, text=True, timeout=90, env=env, check=False
    )
    SAID.extend((done.stdout, done.stderr))
    assert "Traceback" not in done.stderr, done.stderr
    return done


def put(dev: Proc, tmp_path: Path, name: str, models: ScriptedModels, **more: object) -> None:
    file = tmp_path / f"{name}.yaml"
    file.write_text(yaml.safe_dump(profile(models, **more)))
    done = reach(dev, "agents", "put", name, "--file", str(file))
    assert done.returncode == 0, done.stderr


def run_id(done: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"^run (\S+)", done.stdout, re.MULTILINE)
    assert found, done.stdout
    return found.group(1)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.stderr.startswith("reach: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_an_agent_is_put_from_yaml_listed_shown_and_deleted(dev: Proc, tmp_path: Path) -> None:
    with ScriptedModels([]) as models:
        put(dev, tmp_path, "clerk", models)
        listed = reach(dev, "agents", "list")
        shown = reach(dev, "agents", "show", "clerk")
        as_json = reach(dev, "agents", "show", "clerk", "--json")
        stale = reach(
            dev,
            "agents",
            "put",
            "clerk",
            "--file",
            str(tmp_path / "clerk.yaml"),
            "--if-match",
            "99",
        )
        deleted = reach(dev, "agents", "delete", "clerk")
        gone = reach(dev, "agents", "show", "clerk")
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if line.startswith("clerk")]
    assert "scripted-1" in row
    assert "openai_chat" in row
    assert shown.returncode == 0, shown.stderr
    # What `show` prints is a profile `put` takes back.
    document = yaml.safe_load(shown.stdout.split("\n", 1)[1])
    assert document["model"] == "scripted-1"
    assert document["endpoint"]["api_key"] == "${env:AGENT_REACH_TEST_MODEL_KEY}"
    assert json.loads(as_json.stdout)["name"] == "clerk"
    assert stale.returncode == 2
    assert "412" in one_line(stale)
    assert deleted.returncode == 0, deleted.stderr
    assert gone.returncode == 2
    assert "404" in one_line(gone)


def test_a_run_calls_a_tool_then_answers_and_show_prints_the_conversation(
    dev: Proc, tmp_path: Path
) -> None:
    script = [call_tools([("echo_say", {"text": "hi there"})]), answer("The echo said hi there.")]
    with ScriptedModels(script) as models:
        put(dev, tmp_path, "helper", models)
        started = reach(
            dev,
            "runs",
            "start",
            "helper",
            "Say hi there.",
            "--wait",
            "60",
            "--subject",
            "ann",
            "--context",
            '{"locale": "en"}',
        )
        shown = reach(dev, "runs", "show", run_id(started))
        listed = reach(dev, "runs", "list")
    assert started.returncode == 0, started.stdout + started.stderr
    assert "succeeded" in started.stdout
    assert "answer: The echo said hi there." in started.stdout
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(re.search(r"\buser\b.*Say hi there\.", line) for line in lines), shown.stdout
    assert any(re.search(r"\bassistant\b.*echo_say.*hi there", line) for line in lines), (
        shown.stdout
    )
    assert any(re.search(r"\btool\b.*hi there", line) for line in lines), shown.stdout
    assert any(re.search(r"\bassistant\b.*The echo said hi there\.", line) for line in lines)
    assert all(len(line) <= 100 for line in lines), shown.stdout
    assert run_id(started) in listed.stdout


def test_a_run_that_ends_at_max_rounds_exits_1_with_the_reason(dev: Proc, tmp_path: Path) -> None:
    script = [call_tools([("echo_say", {"text": f"n{i}"})]) for i in range(3)]
    with ScriptedModels(script) as models:
        put(dev, tmp_path, "looper", models)
        done = reach(dev, "runs", "start", "looper", "Go on.", "--max-rounds", "2", "--wait", "60")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "max_rounds" in one_line(done)
    assert models.count() == 2


def test_continue_and_cancel(dev: Proc, tmp_path: Path) -> None:
    script = [answer("First answer."), answer("Second answer."), call_tools([("pay_send", {})])]
    with ScriptedModels(script) as models:
        put(dev, tmp_path, "talker", models, tools=["echo.*", "pay.*"])
        first = reach(dev, "runs", "start", "talker", "One.", "--wait", "60")
        again = reach(dev, "runs", "continue", run_id(first), "Two.", "--wait", "60")
        # The model asks for a dangerous call: the run waits for an approval, then is cancelled.
        paused = reach(dev, "runs", "continue", run_id(first), "Pay.")
        cancelled = reach(dev, "runs", "cancel", run_id(first))
        shown = reach(dev, "runs", "show", run_id(first))
    assert first.returncode == 0, first.stderr
    assert "answer: First answer." in first.stdout
    assert again.returncode == 0, again.stderr
    assert "answer: Second answer." in again.stdout
    assert paused.returncode == 0, paused.stderr
    assert "running" in paused.stdout
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled" in cancelled.stdout
    assert shown.returncode == 1
    assert "cancelled" in one_line(shown)


def test_bad_input_is_one_line_and_exit_2(dev: Proc) -> None:
    unknown = reach(dev, "runs", "start", "nobody", "Hello.")
    no_run = reach(dev, "runs", "show", "no-such-run")
    context = reach(dev, "runs", "start", "nobody", "Hello.", "--context", "[1, 2]")
    wrong_key = reach(dev, "agents", "list", api_key="ark_wrong_key_canary")
    assert unknown.returncode == 2
    assert "404" in one_line(unknown)
    assert "nobody" in unknown.stderr
    assert no_run.returncode == 2
    assert "404" in one_line(no_run)
    assert context.returncode == 2
    assert "--context" in one_line(context)
    assert wrong_key.returncode == 2
    assert "401" in one_line(wrong_key)
    assert "ark_wrong_key_canary" not in wrong_key.stdout + wrong_key.stderr


def test_reach_replay_takes_a_run_and_its_dry_run_says_whether_it_is_reproduced(
    dev: Proc, tmp_path: Path
) -> None:
    script = [call_tools([("echo_say", {"text": "again"})]), answer("It said again.")]
    with ScriptedModels(script) as models:
        put(dev, tmp_path, "replayed", models)
        started = reach(dev, "runs", "start", "replayed", "Say again.", "--wait", "60")
        assert started.returncode == 0, started.stdout + started.stderr
        timeline = reach(dev, "replay", run_id(started))
        dry = reach(dev, "replay", run_id(started), "--dry-run")
        nowhere = reach(dev, "replay", "0190d9a0-0000-7000-8000-000000000000")
    assert timeline.returncode == 0, timeline.stderr
    assert "round 1" in timeline.stdout
    assert "call call_0: echo.say@" in timeline.stdout or "echo.say@" in timeline.stdout
    assert (dry.returncode, dry.stdout.splitlines()[-1]) == (
        0,
        "reproduced: today's rules and tools reach the same decisions",
    )
    assert nowhere.returncode != 0
