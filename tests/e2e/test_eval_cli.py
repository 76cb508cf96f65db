"""`reach eval` as a user types it, against a real `reach dev` whose executor calls a scripted
model server: the table and its totals against hand-counted figures, --json, --vs, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.agent_stack import KEY, agent_dev, profile
from tests.e2e.processes import REACH, TEST_API_KEY, Proc
from tests.support.models import Reply, ScriptedModels, answer, call_tools

pytestmark = pytest.mark.e2e

PRICES = {"input": 2.0, "output": 8.0}
SUITE: list[dict[str, Any]] = [
    {
        "name": "echo",
        "input": "Say hi.",
        "check": 'end_reason == "answered" && receipts.size() == 1 '
        '&& receipts[0].tool == "echo.say" && receipts[0].status == "succeeded" '
        '&& answer.contains("hi")',
    },
    {
        "name": "stubborn",
        "input": "Pay 5 cents, then echo.",
        "limits": {"max_rounds": 2},
        "check": 'end_reason == "max_rounds" && rounds == 2 '
        '&& receipts.exists(r, r.status == "failed")',
    },
    {
        "name": "made-up",
        "input": "Where is my order?",
        "subject": "ann",
        "check": "size(ungrounded_claims) == 0 && tokens.input > 0 && cost > 0.0",
    },
]


def script(made_up: str) -> list[Reply]:
    """The model's replies to the suite's cases, in order."""
    return [
        call_tools([("echo_say", {"text": "hi"})]),  # echo: round 1, one tool call
        answer("The echo said hi."),  # echo: round 2
        call_tools([("pay_send", {"cents": 5})]),  # stubborn: refused (not its tool)
        call_tools([("echo_say", {"text": "x"})]),  # stubborn: round 2, then max_rounds
        answer(made_up),  # made-up: one round
    ]


SAID: list[str] = []


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    with agent_dev(tmp_path_factory.mktemp("eval-cli")) as proc:
        yield proc
    said = "\n".join(SAID)
    assert TEST_API_KEY not in said
    assert KEY not in said


def reach(dev: Proc, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AGENT_REACH_URL": f"http://{dev.info['http']}",
        "AGENT_REACH_API_KEY": TEST_API_KEY,
        "COLUMNS": "100",
    }
    done = subprocess.run(
        [*REACH, *args], capture_output=True, text=True, timeout=180, env=env, check=False
    )
    SAID.extend((done.stdout, done.stderr))
    assert "Traceback" not in done.stderr, done.stderr
    return done


def put(dev: Proc, tmp_path: Path, name: str, models: ScriptedModels, **more: Any) -> str:
    """Put the profile; its version."""
    file = tmp_path / f"{name}.yaml"
    file.write_text(yaml.safe_dump(profile(models, prices=PRICES, **more)))
    done = reach(dev, "agents", "put", name, "--file", str(file))
    assert done.returncode == 0, done.stderr
    shown = json.loads(reach(dev, "agents", "show", name, "--json").stdout)
    return str(shown["version"])


def suite_file(tmp_path: Path, cases: list[Any], name: str = "suite.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cases))
    return str(path)


def run_of(dev: Proc, run_id: str) -> dict[str, Any]:
    done = reach(dev, "runs", "show", run_id, "--json")
    return dict(json.loads(done.stdout))


def row(stdout: str, first: str) -> list[str]:
    """The cells of the table row that starts with `first` (cells are 2+ spaces apart)."""
    [line] = [line for line in stdout.splitlines() if line.startswith(first + "  ")]
    return [cell.strip() for cell in line.split("  ") if cell.strip()]


def test_a_suites_table_and_totals_are_the_hand_counted_figures(dev: Proc, tmp_path: Path) -> None:
    with ScriptedModels(script("Order 98765 ships tomorrow.")) as models:
        put(dev, tmp_path, "clerk", models)
        done = reach(dev, "eval", suite_file(tmp_path, SUITE), "--agent", "clerk")
    assert done.returncode == 1, done.stdout + done.stderr  # made-up's check fails
    out = done.stdout
    assert row(out, "echo")[:4] == ["echo", "pass", "answered", "2"]
    assert row(out, "stubborn")[:4] == ["stubborn", "pass", "max_rounds", "2"]
    assert row(out, "made-up")[:4] == ["made-up", "FAIL", "answered", "1"]
    assert row(out, "completion rate")[1:] == ["66.7% (2/3)"]
    assert row(out, "pass rate")[1:] == ["66.7% (2/3)"]
    assert row(out, "average rounds")[1:] == ["1.67"]
    assert row(out, "tool error rate")[1:] == ["33.3% (1/3)"]
    assert row(out, "ungrounded-claim rate")[1:] == ["50.0% (1/2)"]
    assert models.count() == 5


def test_json_for_ci_carries_each_run_and_totals_matching_the_runs(
    dev: Proc, tmp_path: Path
) -> None:
    with ScriptedModels(script("Order 98765 ships tomorrow.")) as models:
        put(dev, tmp_path, "clerk", models)
        done = reach(dev, "eval", suite_file(tmp_path, SUITE), "--agent", "clerk", "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] is False
    [side] = report["results"]
    assert [(c["case"], c["passed"]) for c in side["cases"]] == [
        ("echo", True),
        ("stubborn", True),
        ("made-up", False),
    ]
    runs = [run_of(dev, c["run_id"]) for c in side["cases"]]
    assert [r["end_reason"] for r in runs] == ["answered", "max_rounds", "answered"]
    assert runs[2]["subject"] == "ann"
    totals = side["totals"]
    assert (totals["runs"], totals["completed"], totals["passed"]) == (3, 2, 2)
    assert totals["completion_rate"] == pytest.approx(2 / 3)
    assert totals["average_rounds"] == pytest.approx(5 / 3)
    assert (totals["tool_steps"], totals["tool_errors"]) == (3, 1)
    assert (totals["ungrounded"], totals["ungrounded_claim_rate"]) == (1, 0.5)
    assert totals["tokens_per_run"] == pytest.approx(
        {
            "input": sum(r["tokens"]["input"] for r in runs) / 3,
            "output": sum(r["tokens"]["output"] for r in runs) / 3,
        }
    )
    assert totals["cost_per_run"] == pytest.approx(sum(r["cost"] for r in runs) / 3)
    assert totals["cost_per_run"] > 0
    # The server's figures for the agent's version agree with the suite's.
    got = httpx.get(
        f"http://{dev.info['http']}/v1/agents/clerk/stats",
        params={"version": side["version"]},
        headers={"Authorization": f"Bearer {TEST_API_KEY}"},
    )
    assert got.status_code == 200, got.text
    [server] = got.json()["versions"]
    for figure in ("runs", "completed", "tool_steps", "tool_errors", "ungrounded"):
        assert server[figure] == totals[figure], figure
    assert server["cost_per_run"] == pytest.approx(totals["cost_per_run"])
    assert server["tokens_per_run"] == pytest.approx(totals["tokens_per_run"])
    assert models.count() == 5


def test_vs_runs_the_suite_on_two_versions_side_by_side(dev: Proc, tmp_path: Path) -> None:
    replies = script("Order 98765 ships tomorrow.") + script("Your order ships tomorrow.")
    with ScriptedModels(replies) as models:
        old = put(dev, tmp_path, "teller", models, system="Version one.")
        new = put(dev, tmp_path, "teller", models, system="Version two.")
        suite = suite_file(tmp_path, SUITE)
        table = reach(dev, "eval", suite, "--agent", f"teller@{old}", "--vs", f"teller@{new}")
        systems = [str(body["messages"][0]) for _, body in models.requests]
    assert old != new
    assert table.returncode == 1, table.stdout + table.stderr  # the old version's made-up fails
    out = table.stdout
    assert f"teller@{old} vs teller@{new}" in out
    # Each row: the case, then (check, end reason, rounds, tokens, cost) per version.
    echo, made_up = row(out, "echo"), row(out, "made-up")
    assert (echo[1:4], echo[6:9]) == (["pass", "answered", "2"], ["pass", "answered", "2"])
    assert (made_up[1], made_up[6]) == ("FAIL", "pass")
    assert row(out, "pass rate")[1:] == ["66.7% (2/3)", "100.0% (3/3)"]
    assert row(out, "ungrounded-claim rate")[1:] == ["50.0% (1/2)", "0.0% (0/2)"]
    # The first five model calls were the old version's, the last five the new one's.
    assert all("Version one." in s for s in systems[:5]), systems
    assert all("Version two." in s for s in systems[5:]), systems
    assert len(systems) == 10


def test_exit_0_when_every_check_holds_and_2_when_the_suite_cannot_run(
    dev: Proc, tmp_path: Path
) -> None:
    with ScriptedModels([answer("Hello.")]) as models:
        put(dev, tmp_path, "greeter", models)
        ok = reach(
            dev,
            "eval",
            suite_file(tmp_path, [{"name": "hi", "input": "Hi.", "check": 'answer == "Hello."'}]),
            "--agent",
            "greeter",
        )
        bad_cel = suite_file(tmp_path, [{"name": "x", "input": "Hi.", "check": "answer =="}], "b")
        unknown_var = suite_file(tmp_path, [{"name": "x", "input": "Hi.", "check": "steps"}], "u")
        not_a_suite = suite_file(tmp_path, [{"name": "x"}], "n")
        broken = reach(dev, "eval", bad_cel, "--agent", "greeter")
        unknown = reach(dev, "eval", unknown_var, "--agent", "greeter")
        invalid = reach(dev, "eval", not_a_suite, "--agent", "greeter")
        nobody = reach(dev, "eval", suite_file(tmp_path, SUITE), "--agent", "nobody")
        old = reach(dev, "eval", suite_file(tmp_path, SUITE), "--agent", "greeter@0000000000")
        missing = reach(dev, "eval", str(tmp_path / "none.yaml"), "--agent", "greeter")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert row(ok.stdout, "hi")[1] == "pass"
    for failed in (broken, unknown, invalid, nobody, old, missing):
        assert failed.returncode == 2, failed.stdout + failed.stderr
        assert failed.stderr.startswith("reach: "), failed.stderr
        assert failed.stderr.count("\n") == 1, failed.stderr
    assert "does not compile" in broken.stderr
    assert "'steps'" in unknown.stderr
    assert "check" in invalid.stderr
    assert "404" in nobody.stderr
    assert "404" in old.stderr
    assert models.count() == 1
