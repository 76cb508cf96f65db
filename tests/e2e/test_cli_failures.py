"""Real `reach` commands given bad input: one line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.processes import REACH
from tests.support.pgserver import free_port

pytestmark = pytest.mark.e2e

POLICY = 'roles:\n  admin: [{tools: "*", actions: [admin]}]\n  auditor: []\n'
# A policy whose YAML breaks after a line holding a secret: the error must not quote it.
BROKEN_POLICY = 'roles:\n  admin: [{tools: "*", actions: [admin]}]\n  x: {token: "sk_live_canary"\n'


def _reach(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*REACH, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def _files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "broken.yaml").write_text(BROKEN_POLICY)
    (tmp_path / "wrong.yaml").write_text("rolez: {}\n")
    return {
        "db": f"sqlite:///{tmp_path / 'keys.db'}",
        "empty_db": f"sqlite:///{tmp_path / 'empty.db'}",
        "closed": f"127.0.0.1:{free_port()}",
    }


CASES = [
    (
        ["keys", "create", "--name", "a", "--role", "admin", "--policy", "missing.yaml"],
        "missing.yaml: cannot read the policy",
    ),
    (
        ["keys", "create", "--name", "a", "--role", "admin", "--policy", "broken.yaml"],
        "broken.yaml: cannot read the policy: while parsing a flow mapping at line 3",
    ),
    (
        ["keys", "create", "--name", "a", "--role", "admin", "--policy", "wrong.yaml"],
        "wrong.yaml: roles: Field required",
    ),
    (["keys", "list", "--database-url", "{empty_db}"], "has `reach migrate` run on it?"),
    (["keys", "list", "--database-url", "junk://x"], "unsupported database 'junk'"),
    (
        ["keys", "list", "--database-url", "postgresql://u:pw_canary@{closed}/x"],
        "database error: connection failed",
    ),
    (["submit", "missing.json", "--url", "http://{closed}"], "cannot use missing.json"),
    (["status", "t-1", "--url", "http://{closed}"], "cannot reach the controller at"),
    (["status", "t-1", "--url", "http://[::"], "not a usable URL"),
    (
        ["controller", "--tools", "missing.yaml", "--database-url", "{db}", "--migrate"],
        "missing.yaml: cannot read tool file",
    ),
    (["controller", "--lease-seconds", "-1"], "invalid settings: lease_seconds"),
    (["executor", "--controller", "{closed}", "--tls-ca", "missing.pem"], "missing.pem"),
]


@pytest.mark.parametrize(("argv", "said"), CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_a_command_that_cannot_go_on_says_why_in_one_line(
    tmp_path: Path, argv: list[str], said: str
) -> None:
    values = _files(tmp_path)
    done = _reach(*(a.format(**values) for a in argv), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("reach: ")
    assert done.stderr.count("\n") == 1, done.stderr
    assert said in done.stderr
    assert "canary" not in done.stderr  # neither the YAML's secret nor the URL's password


def test_keys_create_checks_roles_against_its_policy_file(tmp_path: Path) -> None:
    values = _files(tmp_path)
    db = ["--database-url", values["db"]]
    assert _reach("migrate", *db, cwd=tmp_path).returncode == 0
    key = ("keys", "create", "--name", "ann", *db)

    made = _reach(*key, "--role", "auditor", "--policy", "policy.yaml", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "roles auditor" in made.stdout  # a role only this file has
    assert "ark_" in made.stdout

    unknown = _reach(*key, "--role", "agent", "--policy", "policy.yaml", cwd=tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr == "reach: unknown roles: agent\n"

    listed = _reach("keys", "list", *db, cwd=tmp_path)
    assert listed.returncode == 0
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["roles"] == ["auditor"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", row["created_at"])  # as the API
