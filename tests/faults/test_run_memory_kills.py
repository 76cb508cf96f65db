"""A run's memory extraction SIGKILLed in flight (issue 32), on Postgres with real processes: the
controller or the executor killed while the extraction's model call is out. The proposals are
stored in the transaction that records the reply, so after the restart each is stored once,
audited once, and the run ends once, succeeded with the answer it had before the extraction.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.e2e.processes import wait_until
from tests.faults.checkers import Run, check_all
from tests.faults.harness import FaultEnv
from tests.faults.recording import observe
from tests.faults.test_run_kills import (
    KEY,
    KEY_VARIABLE,
    RECOVERY_BOUND_S,
    ended_run,
    start_executor,
    start_stack,
)
from tests.support.models import CHAT, ScriptedModels, answer

AGENT = "keeper"
SUBJECT = "u-fault"
ANSWER = "Noted: email, and the marathon in May."
PROPOSALS = [
    {"type": "preference", "key": "channel", "text": "Prefers email"},
    {"type": "goal", "key": "marathon", "text": "Runs a marathon in May"},
]


def profile(models: ScriptedModels) -> dict[str, Any]:
    return {
        "description": "Remembers what its user says.",
        "endpoint": {
            "kind": "openai_chat",
            "base_url": models.url,
            "api_key": f"${{env:{KEY_VARIABLE}}}",
            "allow_hosts": ["127.0.0.1"],
        },
        "model": "scripted-1",
        "timeout": 30,
        "retry": {"maximum_attempts": 3, "initial_interval": 0.1, "jitter": False},
        "memory": {"extract": True},
    }


def stored(db_url: str, run_id: str) -> dict[str, Any]:
    """What the database holds of the run's memory, read from Postgres itself."""
    with psycopg.connect(db_url, autocommit=True, connect_timeout=2) as conn:
        entries = conn.execute(
            "SELECT memory_id, type, key, origin, source FROM memories WHERE subject = %s",
            (SUBJECT,),
        ).fetchall()
        audited = conn.execute(
            "SELECT action, target FROM audit_log WHERE action LIKE 'memory.%%'"
        ).fetchall()
        said = conn.execute(
            "SELECT message FROM run_messages WHERE run_id = %s AND role = 'extraction' "
            "ORDER BY seq",
            (run_id,),
        ).fetchall()
    return {"entries": entries, "audited": audited, "said": [r[0] for r in said]}


@pytest.mark.parametrize("victim", ["controller", "executor"])
def test_a_kill_during_extraction_stores_each_memory_once(fault_env: FaultEnv, victim: str) -> None:
    env = fault_env
    script = [answer(ANSWER), answer(json.dumps({"memories": PROPOSALS}))]
    with (
        ScriptedModels(script, replay=True) as models,
        env.cluster({KEY_VARIABLE: KEY}) as c,
    ):
        tools = env.tools([])
        ctl = start_stack(env, c, tools)
        executor = start_executor(c, ctl, "executor-0")
        api = env.api([ctl])
        models.hold(after=1)  # the answer is given; the extraction's call waits
        api.put(f"/v1/agents/{AGENT}", profile(models))
        started = api.post(
            "/v1/runs",
            {
                "agent": AGENT,
                "input": "I prefer email. I run a marathon in May.",
                "subject": SUBJECT,
            },
            expect=(202,),
        )
        run_id = str(started["run_id"])
        wait_until(lambda: models.held == 1, within=60, what="the extraction's call in flight")
        at_kill = stored(env.db_url(), run_id)
        if victim == "controller":
            env.faults.sigkill(ctl)
            models.release()  # the executor holds the reply while no controller is up
            ctl = start_stack(env, c, tools, again=ctl)
            env.faults.restarted(ctl)
        else:
            env.faults.sigkill(executor)
            models.release()  # answered into a closed socket: the call is made again
            executor = start_executor(c, ctl, "executor-1")
            env.faults.restarted(executor)
        api = env.api([ctl])
        done = ended_run(api, run_id, within=RECOVERY_BOUND_S + 30)
        after = stored(env.db_url(), run_id)
        observe(env.history, api)
        summary = check_all(Run.load(env.history.path), recovery_bound_s=RECOVERY_BOUND_S)
        for proc in c.procs:
            if proc.name.startswith("executor"):
                proc.terminate()
    # Nothing of the extraction was stored while its call was out.
    assert at_kill["entries"] == []
    assert at_kill["said"] == [{"state": "asked"}]
    # The run ended once, succeeded with its answer; its extraction was done once.
    assert (done["status"], done["end_reason"], done["answer"]) == ("succeeded", "answered", ANSWER)
    assert [s["state"] for s in after["said"]] == ["asked", "done"]
    assert [(s["type"], s["key"], s["action"]) for s in done["extraction"]["stored"]] == [
        (p["type"], p["key"], "created") for p in PROPOSALS
    ]
    # Each memory stored once, whole, with its source; each write audited once.
    assert sorted((t, k) for _, t, k, _, _ in after["entries"]) == sorted(
        (p["type"], p["key"]) for p in PROPOSALS
    )
    for _, _, _, origin, source in after["entries"]:
        assert origin == "model"
        assert (source["run"], source["task"], source["step"]) == (run_id, done["task_id"], "model")
    targets = [f"memory:{m}" for m, *_ in after["entries"]]
    assert sorted(t for a, t in after["audited"] if a == "memory.write") == sorted(targets)
    assert [a for a, _ in after["audited"] if a != "memory.write"] == []
    # The extraction's call: the same request each time it was made (twice at most).
    extraction_calls = [b for p, b in models.requests if p == CHAT and "response_format" in b]
    assert 1 <= len(extraction_calls) <= 2
    assert len({json.dumps(b, sort_keys=True) for b in extraction_calls}) == 1
    env.figures.add(
        f"agent run, {victim} SIGKILLed during its memory extraction's model call: run "
        f"succeeded once with its answer, {len(after['entries'])} memories stored once each "
        f"(extraction call made {len(extraction_calls)}x); {summary.standard()}"
    )
