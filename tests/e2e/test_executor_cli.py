"""Executor credentials from the command line: `reach executors` on the database, `reach dev`'s
printed token for a hand-started executor, and a wrong token that never gets in."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.processes import REACH, cluster, wait_until

pytestmark = pytest.mark.e2e

TOKEN = re.compile(r"rxt_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")
TOOLS = {
    "tools": [
        {
            "name": "echo.say",
            "description": "Echo the arguments back.",
            "connector": "echo",
            "input_schema": {"type": "object"},
        }
    ]
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*REACH, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_tokens_are_created_listed_and_revoked_on_the_database(tmp_path: Path) -> None:
    db = ["--database-url", f"sqlite:///{tmp_path}/fleet.db"]
    _run("migrate", *db)
    made = _run("executors", "create-token", *db, "--name", "pool-a", "--connectors", "echo")
    token = made.stdout.strip()
    assert TOKEN.fullmatch(token), made.stdout  # the token alone on stdout
    (listed,) = [json.loads(line) for line in _run("executors", "tokens", *db).stdout.splitlines()]
    assert (listed["name"], listed["connectors"], listed["revoked_at"]) == (
        "pool-a",
        ["echo"],
        None,
    )
    assert token.split("_", 2)[2] not in json.dumps(listed)
    tools = tmp_path / "tools.yaml"
    tools.write_text(yaml.safe_dump(TOOLS))
    with cluster(tmp_path) as c:
        ctl = c.controller("controller", database_url=db[1], tools=tools)
        ex = c.executor("pool-a", controller=ctl, extra=["--connectors", "echo", "--token", token])
        wait_until(lambda: "executor_registered" in ex.output(), within=60, what="registered")
        fleet = [
            json.loads(line)
            for line in _run("executors", "list", *db, "--json").stdout.splitlines()
        ]
        assert [(e["pool"], e["connectors"]) for e in fleet] == [("pool-a", ["echo"])]
        _run("executors", "revoke-token", *db, listed["token_id"])
        wait_until(
            lambda: '"event": "session_ended"' in ex.output() or "UNAUTHENTICATED" in ex.output(),
            within=30,
            what="the revoked executor to be turned away",
        )
        assert not [
            json.loads(line)
            for line in _run("executors", "list", *db, "--json").stdout.splitlines()
        ]
    offline = _run("executors", "create-token", "--offline", "--name", "pool-b")
    entry = yaml.safe_load(offline.stderr[offline.stderr.index("tokens:") :])["tokens"][0]
    assert entry["name"] == "pool-b"
    assert len(entry["sha256"]) == 64
    assert TOKEN.fullmatch(offline.stdout.strip())


def test_reach_dev_prints_a_token_a_hand_started_executor_needs(tmp_path: Path) -> None:
    tools = tmp_path / "tools.yaml"
    tools.write_text(yaml.safe_dump(TOOLS))
    with cluster(tmp_path) as c:
        dev = c.dev("dev", tools=tools)
        wait_until(lambda: "Press Ctrl-C" in dev.output(), within=60, what="reach dev")
        (token,) = set(TOKEN.findall(dev.output()))
        extra = ["--connectors", "echo"]
        good = c.executor("by-hand", controller=dev, extra=[*extra, "--token", token])
        bad = c.executor("stranger", controller=dev, extra=[*extra, "--token", "rxt_nope"])
        wait_until(lambda: "executor_registered" in good.output(), within=60, what="registered")
        wait_until(lambda: "UNAUTHENTICATED" in bad.output(), within=60, what="refused")
        assert "executor_registered" not in bad.output()
