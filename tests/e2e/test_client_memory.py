"""The Python client's long-term memory (sync and async) against a real `reach dev`: every
method, and the refusals as ProblemError with the controller's codes and pointers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from agent_reach_client import AsyncClient, Client, ProblemError

from tests.e2e.processes import TEST_API_KEY, Proc, cluster

pytestmark = pytest.mark.e2e

TOOLS = [{"name": "echo.say", "description": "Says what it is given.", "connector": "echo"}]
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    workdir = tmp_path_factory.mktemp("memory-client")
    tools = workdir / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": TOOLS}))
    with cluster(workdir) as c:
        yield c.dev("dev", tools=tools)


def url_of(dev: Proc) -> str:
    return f"http://{dev.info['http']}"


def test_the_sync_client_remembers_finds_patches_and_forgets(dev: Proc) -> None:
    subject = "org/acme/users/ann"
    with Client(url_of(dev), api_key=TEST_API_KEY) as reach:
        channel = reach.put_memory(
            subject,
            "preference",
            "channel",
            "Prefers email over phone calls",
            value={"channel": "email"},
            pinned=True,
            confidence=0.9,
        )
        assert (channel["version"], channel["origin"], channel["untrusted"]) == (1, "user", False)
        assert channel["value"] == {"channel": "email"}
        moved = reach.put_memory(subject, "preference", "channel", "Prefers SMS")
        assert (moved["memory_id"], moved["version"]) == (channel["memory_id"], 2)
        city = reach.put_memory(
            subject, "fact", "city", "Lives in Wuhan", expires_at="2999-01-01T00:00:00Z"
        )
        reach.put_memory("org/acme/users/bob", "goal", "trip", "Plans a trip to Lima")

        page = reach.list_subjects(limit=1)
        assert ([s["subject"] for s in page["subjects"]], page["next_after"]) == (
            ["org/acme/users/ann"],
            "org/acme/users/ann",
        )
        rest = reach.list_subjects(after=page["next_after"])
        assert [(s["subject"], s["entries"]) for s in rest["subjects"]] == [
            ("org/acme/users/bob", 1)
        ]
        assert [m["key"] for m in reach.list_memories(subject)] == ["city", "channel"]
        assert [m["key"] for m in reach.list_memories(subject, types=["fact"])] == ["city"]
        found = reach.search_memory(subject, "where does she live?")
        assert [m["key"] for m in found] == ["city"]
        assert found[0]["score"] > 0
        assert reach.get_memory(city["memory_id"])["expires_at"] == "2999-01-01T00:00:00.000Z"

        patched = reach.patch_memory(
            city["memory_id"], {"text": "Lives in Oslo", "expires_at": None}, if_version=1
        )
        assert (patched["text"], patched["version"], patched["expires_at"]) == (
            "Lives in Oslo",
            2,
            None,
        )
        with pytest.raises(ProblemError) as stale:
            reach.patch_memory(city["memory_id"], {"pinned": True}, if_version=1)
        assert (stale.value.status, stale.value.code) == (412, "memory_changed")
        with pytest.raises(ProblemError) as secret:
            reach.put_memory(subject, "fact", "aws", f"the key is {AWS_KEY}")
        assert (secret.value.status, secret.value.errors[0]["pointer"]) == (422, "/body/text")
        assert AWS_KEY not in str(secret.value.problem)

        reach.forget_memory(city["memory_id"])
        with pytest.raises(ProblemError) as gone:
            reach.get_memory(city["memory_id"])
        assert gone.value.status == 404
        assert reach.forget_subject(subject) == 1
        assert reach.list_memories(subject) == []
        assert reach.forget_subject("org/acme/users/bob") == 1


async def test_the_async_client_does_the_same(dev: Proc) -> None:
    async with AsyncClient(url_of(dev), api_key=TEST_API_KEY) as reach:
        written = await reach.put_memory("cat", "constraint", "budget", "Spends at most 50 EUR")
        assert [m["memory_id"] for m in await reach.list_memories("cat")] == [written["memory_id"]]
        assert [m["key"] for m in await reach.search_memory("cat", "budget in EUR")] == ["budget"]
        assert (await reach.list_subjects())["subjects"][0]["subject"] == "cat"
        pinned = await reach.patch_memory(written["memory_id"], {"pinned": True})
        assert (pinned["pinned"], pinned["version"]) == (True, 2)
        assert (await reach.get_memory(written["memory_id"]))["pinned"] is True
        with pytest.raises(ProblemError) as wrong:
            await reach.put_memory("cat", "opinion", "x", "y")  # type: ignore[arg-type]
        assert wrong.value.errors[0]["pointer"] == "/body/type"
        await reach.forget_memory(written["memory_id"])
        assert await reach.forget_subject("cat") == 0
        assert (await reach.list_subjects())["subjects"] == []
