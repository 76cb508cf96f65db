"""The Python client's agents and runs (sync and async) against a real `reach dev` whose executor
calls a scripted model server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_reach_client import AsyncClient, Client, ProblemError

from tests.e2e.agent_stack import KEY, agent_dev, profile
from tests.e2e.processes import TEST_API_KEY, Proc
from tests.support.models import ScriptedModels, answer, call_tools

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    with agent_dev(tmp_path_factory.mktemp("runs-client")) as proc:
        yield proc


def url_of(dev: Proc) -> str:
    return f"http://{dev.info['http']}"


def test_the_sync_client_puts_an_agent_runs_it_and_continues(dev: Proc) -> None:
    script = [
        call_tools([("echo_say", {"text": "hi"})]),
        answer("The echo said hi."),
        answer("Still hi."),
    ]
    with ScriptedModels(script) as models, Client(url_of(dev), api_key=TEST_API_KEY) as reach:
        created = reach.put_agent("helper", profile(models))
        assert created["profile"]["model"] == "scripted-1"
        again = reach.put_agent("helper", profile(models), if_revision=created["revision"])
        assert again["revision"] == created["revision"]  # the same profile changes nothing
        assert reach.get_agent("helper")["name"] == "helper"
        assert "helper" in [a["name"] for a in reach.list_agents()]

        done = reach.start_run("helper", "Say hi.", subject="ann", context={"n": 1}, wait=60)
        assert (done["status"], done["end_reason"]) == ("succeeded", "answered")
        assert done["answer"] == "The echo said hi."
        assert done["subject"] == "ann"
        shown = reach.get_run(done["run_id"])
        roles = [entry["role"] for entry in shown["messages"] or []]
        # A run with a subject records what it recalled (here nothing), never sent as a message.
        assert roles == ["user", "memory", "assistant", "tool", "assistant"]
        assert shown["recalled"] == []
        assert shown["tokens"]["input"] > 0
        assert done["run_id"] in [r["run_id"] for r in reach.list_runs()]

        more = reach.continue_run(done["run_id"], "And now?", wait=60)
        assert (more["status"], more["answer"]) == ("succeeded", "Still hi.")
        assert KEY not in str(reach.get_run(done["run_id"]))

        with pytest.raises(ProblemError) as stale:
            reach.put_agent("helper", profile(models, model="other"), if_revision=99)
        assert stale.value.status == 412
        reach.delete_agent("helper")
        with pytest.raises(ProblemError) as gone:
            reach.get_agent("helper")
        assert gone.value.status == 404
    assert models.count() == 3


async def test_the_async_client_limits_a_run_and_cancels_one(dev: Proc) -> None:
    script = [call_tools([("echo_say", {"text": f"n{i}"})]) for i in range(2)]
    script.append(call_tools([("pay_send", {"cents": 5})]))
    with ScriptedModels(script) as models:
        async with AsyncClient(url_of(dev), api_key=TEST_API_KEY) as reach:
            await reach.put_agent("payer", profile(models, tools=["echo.*", "pay.*"]))
            capped = await reach.start_run("payer", "Go on.", limits={"max_rounds": 2}, wait=60)
            assert (capped["status"], capped["end_reason"]) == ("failed", "max_rounds")
            assert capped["limits"]["max_rounds"] == 2

            # A dangerous call waits for approval: the run is under way until it is cancelled.
            paused = await reach.start_run("payer", "Pay.")
            assert paused["status"] == "running"
            cancelled = await reach.cancel_run(paused["run_id"])
            assert cancelled["status"] == "cancelled"
            assert (await reach.get_run(paused["run_id"], wait=10))["status"] == "cancelled"
            assert "payer" in [a["name"] for a in await reach.list_agents()]
            assert len(await reach.list_runs(limit=1)) == 1

            with pytest.raises(ProblemError) as unknown:
                await reach.start_run("nobody", "Hello.")
            assert unknown.value.status == 404
            with pytest.raises(ProblemError) as looser:
                await reach.start_run("payer", "x", limits={"max_rounds": 50})
            assert looser.value.status == 422
            assert looser.value.errors[0]["pointer"] == "/body/limits"
            await reach.delete_agent("payer")
