"""`reach dev --demo` shows both branches of the umbrella plan; `reach submit/status/tools` work."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.processes import REACH, api, cluster, wait_until
from tests.support.otlp import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.e2e


def test_demo_runs_both_branches_and_cli_talks_to_it(tmp_path: Path) -> None:
    with cluster(tmp_path) as c:
        dev = c.dev("dev", tools=_no_extra_tools(tmp_path), extra=["--demo"])
        wait_until(lambda: "Press Ctrl-C to stop" in dev.output(), within=60, what="the demo")
        with api(dev) as client:
            listed = client.get("/v1/tasks").json()["tasks"]
            tasks = [t for t in listed if not t["goal"].startswith("round ")]  # not the run's
            assert len(tasks) == 2
            [run] = client.get("/v1/runs").json()["runs"]
            by_goal = {t["goal"]: client.get(f"/v1/tasks/{t['task_id']}").json() for t in tasks}
        rainy = next(t for g, t in by_goal.items() if "Wuhan" in g)
        dry = next(t for g, t in by_goal.items() if "Dubai" in g)
        steps = {s["step_id"]: s for s in rainy["steps"]}
        assert {k: s["status"] for k, s in steps.items()} == dict.fromkeys(steps, "succeeded")
        reminder = steps["remind[0]"]  # the write; `remind` is it, read back and verified
        assert (
            reminder["resolved_args"]["evidence"] == steps["weather"]["receipt"]["data"]["summary"]
        )
        assert steps["remind"]["receipt"]["data"]["text"] == "Take an umbrella"
        assert steps["remind"]["receipt"]["meta"]["verified"] is True
        rows = steps["tell"]["receipt"]["targets"]  # delivered at "08:00", to both channels
        assert [(r["output"]["channel"], r["status"]) for r in rows] == [
            ("webhook", "succeeded"),
            ("email", "succeeded"),
        ]
        assert "1 signed webhook(s) on the phone and 1 email(s) in the inbox" in dev.output()
        dry_steps = {s["step_id"]: s for s in dry["steps"]}
        assert dry_steps["weather"]["status"] == "succeeded"
        assert {s["status"] for k, s in dry_steps.items() if k != "weather"} == {"skipped"}
        assert dry_steps["remind"]["receipt"]["error"]["code"] == "condition_false"
        assert rainy["status"] == dry["status"] == "succeeded"
        # The same request as an agent run: the demo's model asked for the forecast, then the
        # reminder, then answered with what the tools said.
        assert (run["status"], run["end_reason"], run["round"]) == ("succeeded", "answered", 3)
        assert "It will rain in Wuhan tomorrow" in run["answer"]
        assert run["ungrounded_claims"] == []
        assert "model calls reminder_create" in dev.output()

        # The key `reach dev` printed works like any other.
        [dev_key] = set(re.findall(r"ark_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", dev.output()))
        url = ["--url", f"http://{dev.info['http']}", "--api-key", dev_key]
        plan = tmp_path / "plan.json"
        plan.write_text(
            json.dumps(
                {
                    "steps": [
                        {
                            "step_id": "w",
                            "tool": "weather.forecast",
                            "args": {"city": "Wuhan", "day": "tomorrow"},
                        }
                    ]
                }
            )
        )
        submitted = _reach("submit", str(plan), "--wait", "20", *url)
        assert submitted["status"] == "succeeded"
        shown = _reach("status", submitted["task_id"], *url)
        assert shown["steps"][0]["receipt"]["data"]["rain"] is True
        listed = _reach("tools", "--format", "openai", *url)
        assert {t["function"]["name"] for t in listed} == {
            "weather_forecast",
            "reminder_create",
            "reminder_get",
            "notify",
        }


def _no_extra_tools(tmp_path: Path) -> Path:
    path = tmp_path / "empty-tools.yaml"
    path.write_text("tools: []\n")
    return path


def _reach(*args: str) -> dict:
    """A `reach` command's answer as JSON (`submit` and `status` print a summary without --json)."""
    if args[0] in {"submit", "status"}:
        args = (*args, "--json")
    done = subprocess.run([*REACH, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_invalid_command_line_fails_clearly() -> None:
    done = subprocess.run(
        [*REACH, "frobnicate"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "invalid choice" in done.stderr


def test_reach_approve_lets_a_waiting_dangerous_step_run(tmp_path: Path) -> None:
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "vault.wipe",
                        "description": "Irreversible.",
                        "connector": "echo",
                        "risk": "dangerous",
                    }
                ]
            }
        )
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": [{"step_id": "w", "tool": "vault.wipe", "args": {}}]}))
    with cluster(tmp_path) as c:
        dev = c.dev("dev", tools=tools)
        wait_until(lambda: "Press Ctrl-C to stop" in dev.output(), within=60, what="reach dev")
        [dev_key] = set(re.findall(r"ark_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", dev.output()))
        url = ["--url", f"http://{dev.info['http']}"]
        # Submitted with the cluster's key, approved by the dev key's principal (another one).
        submitted = _reach("submit", str(plan), *url, "--api-key", c.api_key, "--no-wait")
        waiting = _reach("status", submitted["task_id"], *url, "--api-key", c.api_key)
        assert waiting["steps"][0]["status"] == "awaiting_approval"
        _reach(
            "approve", submitted["task_id"], "w", "--reason", "ticket 7", *url, "--api-key", dev_key
        )
        done = wait_until(
            lambda: (
                (t := _reach("status", submitted["task_id"], *url, "--api-key", c.api_key))[
                    "status"
                ]
                == "succeeded"
                and t
            ),
            within=30,
            what="the approved step to run",
        )
        assert done["steps"][0]["status"] == "succeeded"


def test_reach_tools_changes_the_catalogue_of_a_running_controller(tmp_path: Path) -> None:
    tool = tmp_path / "note.yaml"
    tool.write_text(
        "name: note.write\ndescription: Writes a note.\nconnector: echo\nrisk: write\n"
        "input_schema: {type: object, properties: {text: {type: string}}}\n"
    )
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps({"steps": [{"step_id": "n", "tool": "note.write", "args": {"text": "hi"}}]})
    )
    with cluster(tmp_path) as c:
        dev = c.dev("dev", tools=_no_extra_tools(tmp_path))
        wait_until(lambda: "Press Ctrl-C to stop" in dev.output(), within=60, what="reach dev")
        url = ["--url", f"http://{dev.info['http']}", "--api-key", c.api_key]
        created = _reach("tools", "create", str(tool), *url)
        assert (created["name"], created["enabled"]) == ("note.write", True)
        done = _reach("submit", str(plan), "--wait", "20", *url)
        assert done["status"] == "succeeded"
        replayed = subprocess.run(
            [*REACH, "replay", done["task_id"], "--dry-run", *url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert "reproduced" in replayed.stdout
        timeline = subprocess.run(
            [*REACH, "replay", done["task_id"], *url],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert "task_created" in timeline
        assert "n#1" in timeline

        _reach("tools", "disable", "note.write", *url)
        refused = subprocess.run(
            [*REACH, "submit", str(plan), *url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 1
        assert json.loads(refused.stdout)["errors"][0]["code"] == "tool_disabled"

        exported = tmp_path / "exported.yaml"
        done = subprocess.run(
            [*REACH, "tools", "export", "-o", str(exported), *url], timeout=60, check=False
        )
        assert done.returncode == 0
        assert "note.write" in exported.read_text()
        dry = _reach("tools", "import", str(exported), "--prune", "--dry-run", *url)
        # The catalogue's own tools (memory's, seeded into every catalogue) are exported too.
        memory = [f"memory.{op}" for op in ("forget", "list", "save", "search")]
        assert (dry["dry_run"], dry["unchanged"], dry["deleted"]) == (
            True,
            [*memory, "note.write"],
            [],
        )
        history = _reach("tools", "history", "note.write", *url)
        assert [h["action"] for h in history["changes"]] == ["disable", "create"]


def test_a_newcomer_gets_sentences_not_tracebacks(tmp_path: Path) -> None:
    """A port in use, a missing API key, `--version`, and a task shown as a summary."""
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        "tools:\n  - {name: echo.say, description: Echo, connector: echo,"
        " input_schema: {type: object}, risk: read, idempotent: true}\n"
    )
    version = subprocess.run([*REACH, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("reach ")
    with cluster(tmp_path) as c:
        ctl = c.dev("dev", tools=tools)
        taken = ctl.info["http"]
        busy = subprocess.run(
            [*REACH, "dev", "--http", taken, "--grpc", "127.0.0.1:0", "--tools", str(tools)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )
        assert busy.returncode == 2
        assert f"reach: cannot listen on {taken} (REST)" in busy.stderr
        assert "Traceback" not in busy.stderr
        url = ["--url", f"http://{taken}"]
        env = {k: v for k, v in os.environ.items() if k != "AGENT_REACH_API_KEY"}
        keyless = subprocess.run(
            [*REACH, "status", "t-1", *url], capture_output=True, text=True, env=env, check=False
        )
        assert keyless.returncode == 1
        assert "set AGENT_REACH_API_KEY or pass --api-key" in keyless.stderr
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"steps": [{"step_id": "hi", "tool": "echo.say", "args": {}}]}))
        done = subprocess.run(
            [*REACH, "submit", str(plan), *url, "--api-key", c.api_key],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        first, *steps = done.stdout.splitlines()  # waited for the receipts by default
        assert first.startswith("task ")
        assert " succeeded " in first
        assert steps[0].split()[:2] == ["hi", "succeeded"]


def test_reach_dev_shows_an_example_that_runs_on_the_tools_it_loaded(tmp_path: Path) -> None:
    """Without --demo there is no weather tool: the banner's curl calls one that is loaded, and
    running it as printed (bash, curl) gets a receipt."""
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        "tools:\n"
        "  - {name: alarm.ring, description: Rings, connector: echo, risk: dangerous}\n"
        "  - {name: note.write, description: Writes, connector: echo, risk: write}\n"
        "  - name: echo.say\n"
        "    description: Says it back\n"
        "    connector: echo\n"
        "    risk: read\n"
        "    input_schema:\n"
        "      type: object\n"
        "      required: [text, times]\n"
        "      properties:\n"
        '        text: {type: string, examples: ["it\'s raining"]}\n'
        "        times: {type: integer, minimum: 1}\n"
    )
    with cluster(tmp_path) as c:
        dev = c.dev("dev", tools=tools)
        wait_until(lambda: "Press Ctrl-C to stop" in dev.output(), within=60, what="the banner")
        banner = dev.output()
        assert "weather.forecast" not in banner
        start = banner.index("  export AGENT_REACH_API_KEY=")
        commands = banner[start : banner.index("\n\n", start)]
        done = subprocess.run(
            ["bash", "-c", commands], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        task = json.loads(done.stdout)
        assert task["status"] == "succeeded", task
        [step] = task["steps"]
        assert step["tool"] == "echo.say"  # a read: trying it changes nothing, needs no approval
        assert step["receipt"]["data"]["args"] == {"text": "it's raining", "times": 1}


def test_reach_triggers_runs_a_template_for_a_signed_event(tmp_path: Path) -> None:
    """A real controller and executor: `reach triggers save`, then `send` twice with one id."""
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        json.dumps(
            {"tools": [{"name": "orders.echo", "description": "Echo.", "connector": "echo"}]}
        )
    )
    template = tmp_path / "template.yaml"
    template.write_text(
        "steps:\n"
        "  - {step_id: stock, tool: orders.echo, args: {sku: $event.sku}}\n"
        "  - step_id: tell\n"
        "    tool: orders.echo\n"
        "    args: {to: $event.email, sku: $stock.output.args.sku}\n"
        "    depends_on: [stock]\n"
    )
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"sku": "UMB-1", "email": "ann@example.test"}))
    with OtlpReceiver() as otlp, cluster(tmp_path, env=_traced(otlp)) as c:
        dev = c.dev("dev", tools=tools)
        wait_until(lambda: "Press Ctrl-C to stop" in dev.output(), within=60, what="reach dev")
        key = ["--url", f"http://{dev.info['http']}", "--api-key", c.api_key]
        done = subprocess.run(
            [*REACH, "triggers", "save", "orders.new", str(template), *key],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        secret = json.loads(done.stdout)["secret"]
        send = ("triggers", "send", "orders.new", str(event), "--id", "order-7", "--url")
        first = _reach(*send, f"http://{dev.info['http']}", "--secret", secret)
        again = _reach(*send, f"http://{dev.info['http']}", "--secret", secret)
        assert (first["created"], again["created"]) == (True, False)
        assert again["task_id"] == first["task_id"]
        finished = wait_until(
            lambda: (t := _reach("status", first["task_id"], *key))["status"] == "succeeded" and t,
            within=30,
            what="the trigger's task to run",
        )
        steps = {s["step_id"]: s for s in finished["steps"]}
        assert steps["tell"]["resolved_args"] == {"to": "ann@example.test", "sku": "UMB-1"}
        listed = _reach("triggers", "list", *key)
        assert [t["name"] for t in listed["triggers"]] == ["orders.new"]
        assert secret not in json.dumps(listed)

        # The run is one trace of its own: its submit says which trigger and event started it,
        # and both steps ran under it.
        def run_trace() -> list[ReceivedSpan] | None:
            spans = [s for s in otlp.spans() if s.trace_id == first["trace_id"]]
            ran = [s for s in spans if s.name == "execute_tool orders.echo"]
            return spans if len(ran) == 2 else None

        spans = wait_until(run_trace, within=30, what="the run's spans at the receiver")
        (root,) = [s for s in spans if s.name == "submit_task"]
        assert root.parent_span_id in (None, "")
        assert root.attributes["agent_reach.trigger"] == "orders.new"
        assert root.attributes["agent_reach.event_id"] == "order-7"
        assert secret not in json.dumps([s.attributes for s in otlp.spans()])


def _traced(otlp: OtlpReceiver) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
