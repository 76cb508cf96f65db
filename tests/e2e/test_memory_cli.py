"""`reach memory …` as a user types it, against a real `reach dev`: what it prints, how it exits,
and that a refused secret is never printed back."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator

import httpx
import pytest
import yaml

from tests.e2e.processes import REACH, TEST_API_KEY, Proc, cluster

pytestmark = pytest.mark.e2e

SUBJECT = "team/ann"  # a "/" in a subject: never a path segment
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
TOOLS = [{"name": "echo.say", "description": "Says what it is given.", "connector": "echo"}]


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    workdir = tmp_path_factory.mktemp("memory-cli")
    tools = workdir / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": TOOLS}))
    with cluster(workdir) as c:
        yield c.dev("dev", tools=tools)


def reach(dev: Proc, *args: str, api_key: str = TEST_API_KEY) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AGENT_REACH_URL": f"http://{dev.info['http']}",
        "AGENT_REACH_API_KEY": api_key,
        "COLUMNS": "120",
    }
    done = subprocess.run(
        [*REACH, "memory", *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


def refused(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("reach: "), done.stderr
    assert done.stdout == ""
    return done.stderr


def memory_id(said: str) -> str:
    found = re.search(r"^memory (\S+) ", said, re.MULTILINE)
    assert found, said
    return found.group(1)


def test_memories_are_put_listed_searched_patched_and_forgotten(dev: Proc) -> None:
    value = '{"channel": "email"}'
    created = ok(
        reach(dev, "put", SUBJECT, "preference", "channel", "Prefers phone", "--value", value)
    )
    channel = memory_id(created)
    assert f"created: preference:channel of {SUBJECT}, version 1" in created
    saved = ok(reach(dev, "put", SUBJECT, "preference", "channel", "Prefers email", "--pin"))
    assert (memory_id(saved), "saved" in saved, "version 2" in saved) == (channel, True, True)
    city = memory_id(ok(reach(dev, "put", SUBJECT, "fact", "city", "Lives in Wuhan")))

    assert re.search(rf"^{re.escape(SUBJECT)}\s+2 memories\s+updated ", ok(reach(dev)), re.M)
    page = json.loads(ok(reach(dev, "subjects", "--json")))
    assert [(s["subject"], s["entries"]) for s in page["subjects"]] == [(SUBJECT, 2)]
    listed = ok(reach(dev, "list", SUBJECT)).splitlines()
    assert [line.split()[:2] for line in listed] == [
        [city, "fact:city"],
        [channel, "preference:channel"],
    ]
    assert "[user, pinned]  Prefers email" in listed[1]
    facts = ok(reach(dev, "list", SUBJECT, "--type", "fact", "--type", "goal"))
    assert [line.split()[1] for line in facts.splitlines()] == ["fact:city"]
    found = ok(reach(dev, "search", SUBJECT, "does ann want email?")).splitlines()
    assert [line.split()[1] for line in found] == ["preference:channel"]
    assert "score " in found[0]
    assert ok(reach(dev, "search", SUBJECT, "unrelated words")) == f"nothing of {SUBJECT} matches\n"

    shown = ok(reach(dev, "show", channel))
    assert "  text: Prefers email" in shown
    assert "value:" not in shown  # a put replaces the entry: the second gave no value
    assert "origin: user  written by bootstrap" in shown
    as_json = json.loads(ok(reach(dev, "show", channel, "--json")))
    assert (as_json["version"], as_json["untrusted"]) == (2, False)

    patched = ok(
        reach(dev, "patch", channel, "--text", "Prefers SMS", "--unpin", "--if-match", "2")
    )
    assert "  text: Prefers SMS" in patched
    assert "version 3" in patched
    assert "not pinned" in patched
    stale = refused(reach(dev, "patch", channel, "--confidence", "0.5", "--if-match", "2"))
    assert "412 The memory changed meanwhile" in stale
    assert "nothing to change" in refused(reach(dev, "patch", channel))

    secret = refused(reach(dev, "put", SUBJECT, "fact", "aws", f"my key is {AWS_KEY}"))
    assert "422" in secret
    assert "/body/text" in secret
    assert AWS_KEY not in secret
    bad_type = reach(dev, "list", SUBJECT, "--type", "opinion")  # argparse's own refusal
    assert (bad_type.returncode, "invalid choice" in bad_type.stderr) == (2, True)

    assert ok(reach(dev, "forget", city)) == f"forgot memory {city}\n"
    assert "404 No such memory" in refused(reach(dev, "show", city))
    assert "add --yes" in refused(reach(dev, "forget-subject", SUBJECT))
    assert json.loads(ok(reach(dev, "list", SUBJECT, "--json")))[0]["memory_id"] == channel
    gone = ok(reach(dev, "forget-subject", SUBJECT, "--yes"))
    assert gone == f"forgot 1 memory of {SUBJECT}\n"
    assert ok(reach(dev, "list", SUBJECT)) == f"no memories of {SUBJECT}\n"
    assert ok(reach(dev)) == "no memories\n"


def test_a_viewer_reads_but_may_not_write_and_no_key_is_told(dev: Proc) -> None:
    url = f"http://{dev.info['http']}"
    admin = {"Authorization": f"Bearer {TEST_API_KEY}"}
    made = httpx.post(
        f"{url}/v1/keys", json={"name": "vera", "roles": ["viewer"]}, headers=admin, timeout=30
    )
    assert made.status_code == 201, made.text
    viewer = made.json()["token"]
    written = ok(reach(dev, "put", "bob", "goal", "trip", "Plans a trip to Lima"))
    assert "Plans a trip" in ok(reach(dev, "list", "bob", api_key=viewer))
    denied = refused(reach(dev, "put", "bob", "goal", "x", "Not allowed", api_key=viewer))
    assert "403" in denied
    assert "memory_write" in denied
    assert "403" in refused(reach(dev, "forget", memory_id(written), api_key=viewer))
    anonymous = refused(reach(dev, "list", "bob", api_key=""))
    assert "401" in anonymous
    assert "no API key was sent" in anonymous
    ok(reach(dev, "forget-subject", "bob", "--yes"))
