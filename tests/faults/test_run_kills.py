"""Agent runs SIGKILLed mid-run (issue 30's durability), on Postgres with real processes: the
controller or the executor killed while a model call or a tool call of a run is in flight, the
controller killed just after a model reply committed, and `reach dev` (SQLite, one process)
killed mid-run. Each run ends as it would have; every model call that completed before a kill
reached the model once (the one in flight may be made once more, and is counted); every tool
effect happened once.

The run: round 1 posts two ledger entries, round 2 one more, round 3 answers. The scripted model
replays: a request it has seen is answered as before, so a call made again after a kill gets
the reply the first one would have had, and the bodies it saw tell which round each call was.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.processes import Proc, wait_until
from tests.faults.checkers import Run, check_all
from tests.faults.harness import Api, FaultCluster, FaultEnv, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.models import CHAT, ScriptedModels, answer, call_tools
from tests.support.sink import Response, Sink

KEY_VARIABLE = "AGENT_REACH_FAULTS_MODEL_KEY"
KEY = "sk-faults-3b9e1d-never-shown"
AGENT = "poster"
TOOL = "ledger.post"
ANSWER = "Posted r1-a, r1-b and r2-c."
ROUNDS = 3
# The ledger's paths: `slow` holds a call in flight for this long, so a kill lands inside it.
SLOW_S = 2.5
# From the restart to the run's end: a controller's start (~2 s), the dead lease's expiry (2 s),
# the executor's reconnect backoff, and the rounds left (<1 s); 2x slack over what is seen here.
RECOVERY_BOUND_S = 20.0


@dataclass(frozen=True, slots=True)
class Kill:
    victim: str  # controller or executor
    at: str  # model (round 2's model call in flight) or tool (round 2's tool call in flight)


def script(slow_round: int | None) -> list[Any]:
    """The model's three replies; the calls of `slow_round` go to the slow path."""

    def case(round_: int) -> str:
        return "slow" if round_ == slow_round else "fast"

    return [
        call_tools(
            [
                ("ledger_post", {"op": "r1-a", "case": case(1)}),
                ("ledger_post", {"op": "r1-b", "case": case(1)}),
            ]
        ),
        call_tools([("ledger_post", {"op": "r2-c", "case": case(2)})]),
        answer(ANSWER),
    ]


def ledger(sink: Sink, *, slow_calls: int) -> dict[str, Any]:
    """The tool, and the sink's script: the first `slow_calls` to /ledger/slow hang `SLOW_S`."""
    sink.script("/ledger/fast", [Response(json={"ok": True}, echo=True)])
    slow = Response(json={"ok": True}, echo=True, delay=SLOW_S)
    sink.script("/ledger/slow", [*[slow] * slow_calls, Response(json={"ok": True}, echo=True)])
    return sink_tool(TOOL, f"{sink.url}/ledger/{{case}}", max_attempts=5, timeout="10s")


def profile(models: ScriptedModels) -> dict[str, Any]:
    return {
        "description": "Posts to the ledger, then says what it posted.",
        "endpoint": {
            "kind": "openai_chat",
            "base_url": models.url,
            "api_key": f"${{env:{KEY_VARIABLE}}}",
            "allow_hosts": ["127.0.0.1"],
        },
        "model": "scripted-1",
        "system": "Post what you are asked to post.",
        "tools": ["ledger.*"],
        "timeout": 30,
        "retry": {"maximum_attempts": 3, "initial_interval": 0.1, "jitter": False},
    }


# -- the stack -----------------------------------------------------------------------------------


def start_stack(env: FaultEnv, c: FaultCluster, tools: Path, *, again: Proc | None = None) -> Proc:
    """A controller; `again`: its successor, on the same addresses (the executor redials)."""
    if again is None:
        return c.start_controller("controller", database_url=env.db_url(), tools=tools)
    return c.start_controller(
        f"{again.name}-1",
        database_url=env.db_url(),
        tools=tools,
        http=again.info["http"],
        grpc=again.info["grpc"],
    )


def start_executor(c: FaultCluster, ctl: Proc, name: str) -> Proc:
    executor = c.start_executor(name, grpc=ctl.info["grpc"], slots=4, connectors="http,model")
    c.await_registered([executor])
    return executor


def start_run(api: Api, models: ScriptedModels) -> str:
    api.put(f"/v1/agents/{AGENT}", profile(models))
    started = api.post(
        "/v1/runs", {"agent": AGENT, "input": "Post r1-a and r1-b, then r2-c."}, expect=(202,)
    )
    return str(started["run_id"])


def ended_run(api: Api, run_id: str, *, within: float) -> dict[str, Any]:
    """The run once it ended (polled, `within` seconds at most)."""

    def ended() -> dict[str, Any] | None:
        run: dict[str, Any] = api.get(f"/v1/runs/{run_id}")
        return run if run["status"] != "running" else None

    found: dict[str, Any] = wait_until(ended, within=within, what=f"run {run_id} to end", every=0.1)
    return found


@dataclass(frozen=True, slots=True)
class ModelCalls:
    """What the model server saw, by round: the distinct request bodies and how many times."""

    bodies: dict[int, set[str]]
    calls: Counter[int]

    @classmethod
    def of(cls, models: ScriptedModels) -> ModelCalls:
        bodies: dict[int, set[str]] = {}
        calls: Counter[int] = Counter()
        for path, body in models.requests:
            assert path.split("?")[0] == CHAT, path
            # Round n's request carries the model's n - 1 earlier replies.
            round_ = 1 + sum(1 for m in body["messages"] if m.get("role") == "assistant")
            bodies.setdefault(round_, set()).add(json.dumps(body, sort_keys=True))
            calls[round_] += 1
        return cls(bodies=bodies, calls=calls)


def assert_ended_as_it_would_have(
    done: dict[str, Any], models: ScriptedModels, sink: Sink, *, in_flight: int | None
) -> ModelCalls:
    """Succeeded with the answer; each completed model call once (round `in_flight`'s at most
    twice), each request as an unbroken run would have sent it, each effect once."""
    assert done["status"] == "succeeded", done
    assert KEY not in json.dumps(done)
    assert (done["end_reason"], done["answer"], done["round"]) == ("answered", ANSWER, ROUNDS)
    results = [m for m in done["messages"] if m["role"] == "tool"]
    assert len(results) == 3, f"tool results in the conversation: {results}"
    seen = ModelCalls.of(models)
    # One request per round: a resume neither lost nor repeated anything of the conversation.
    assert sorted(seen.bodies) == list(range(1, ROUNDS + 1)), seen.calls
    assert all(len(b) == 1 for b in seen.bodies.values()), "a round sent two different requests"
    for round_ in range(1, ROUNDS + 1):
        most = 2 if round_ == in_flight else 1
        assert 1 <= seen.calls[round_] <= most, (
            f"round {round_}'s model call reached the model {seen.calls[round_]} times "
            f"(at most {most}): {dict(seen.calls)}"
        )
    effects = sink.effects()
    assert "" not in effects, "a delivery without an Idempotency-Key"
    assert len(effects) == 3, effects
    assert set(effects.values()) == {1}, effects
    ops = Counter(d.json()["op"] for d in sink.requests())
    assert set(ops) == {"r1-a", "r1-b", "r2-c"}, ops
    keys_of_op: dict[str, set[str | None]] = defaultdict(set)
    for d in sink.requests():
        keys_of_op[d.json()["op"]].add(d.key)
    assert all(len(k) == 1 for k in keys_of_op.values()), keys_of_op
    return seen


def judge(env: FaultEnv, c: FaultCluster, api: Api, sink: Sink) -> str:
    """Record the tasks (the run's rounds) and the sink; the standard checkers, 2x-slack bound.

    Then the executors stop first: a controller stopping under an executor's open streams
    waits out its grace period (seconds per scenario, on a suite that must stay short)."""
    observe(env.history, api)
    record_sink(env.history, sink)
    summary = check_all(Run.load(env.history.path), recovery_bound_s=RECOVERY_BOUND_S)
    for proc in c.procs:
        if proc.name.startswith("executor"):
            proc.terminate()
    for proc in c.procs:
        assert KEY not in proc.output(), f"the model's API key is in {proc.name}'s log"
    return summary.standard()


def wait_in_flight(kill: Kill, models: ScriptedModels, sink: Sink) -> None:
    if kill.at == "model":
        wait_until(lambda: models.held == 1, within=60, what="round 2's model call in flight")
    else:
        sink.wait_for_requests(1, path="/ledger/slow", timeout=60)


# -- 1, 2: the controller or the executor killed at a model call or a tool call ------------------


KILLS = [
    Kill("controller", "model"),
    Kill("executor", "tool"),
    Kill("controller", "tool"),
    Kill("executor", "model"),
]


@pytest.mark.parametrize("kill", KILLS, ids=[f"{k.victim}-at-{k.at}" for k in KILLS])
def test_a_run_ends_as_it_would_have_after_a_kill(fault_env: FaultEnv, kill: Kill) -> None:
    env = fault_env
    slow_round = 2 if kill.at == "tool" else None
    with (
        ScriptedModels(script(slow_round), replay=True) as models,
        Sink() as sink,
        env.cluster({KEY_VARIABLE: KEY}) as c,
    ):
        tools = env.tools([ledger(sink, slow_calls=1)], sink=sink)
        ctl = start_stack(env, c, tools)
        executor = start_executor(c, ctl, "executor-0")
        api = env.api([ctl])
        if kill.at == "model":
            models.hold(after=1)  # round 1's call is answered; round 2's waits
        run_id = start_run(api, models)
        wait_in_flight(kill, models, sink)
        if kill.victim == "controller":
            env.faults.sigkill(ctl)
            models.release()  # the executor holds the reply while no controller is up
            ctl = start_stack(env, c, tools, again=ctl)
            env.faults.restarted(ctl)
        else:
            env.faults.sigkill(executor)
            models.release()  # the dead executor's call is answered into a closed socket
            executor = start_executor(c, ctl, "executor-1")
            env.faults.restarted(executor)
        done = ended_run(api, run_id, within=RECOVERY_BOUND_S + 30)
        standard = judge(env, c, api, sink)
    seen = assert_ended_as_it_would_have(
        done, models, sink, in_flight=2 if kill.at == "model" else None
    )
    redelivered = sum(n - 1 for n in sink.deliveries_per_key().values())
    env.figures.add(
        f"agent run, {kill.victim} SIGKILLed at round 2's {kill.at} call: run succeeded with "
        f"its answer; model calls per round {dict(sorted(seen.calls.items()))}; 3 effects, "
        f"{redelivered} redeliveries absorbed by Idempotency-Key; {standard}"
    )


# -- 3: the controller killed between a committed model reply and the next round ----------------


def current_round(db_url: str, run_id: str) -> list[tuple[int, str, str, int]]:
    """(run's round, step id, status, attempt) of every step of the run's current round, read
    from Postgres itself (a dead controller cannot answer)."""
    with psycopg.connect(db_url, autocommit=True, connect_timeout=2) as conn:
        rows = conn.execute(
            "SELECT r.round, s.step_id, s.status, s.attempt FROM runs r "
            "JOIN steps s ON s.task_id = r.task_id WHERE r.run_id = %s",
            (run_id,),
        ).fetchall()
    return [(int(n), str(step), str(status), int(attempt)) for n, step, status, attempt in rows]


def test_a_model_reply_committed_before_a_controller_kill_is_not_asked_again(
    fault_env: FaultEnv,
) -> None:
    env = fault_env
    with (
        ScriptedModels(script(slow_round=1), replay=True) as models,
        Sink() as sink,
        env.cluster({KEY_VARIABLE: KEY}) as c,
    ):
        tools = env.tools([ledger(sink, slow_calls=2)], sink=sink)
        ctl = start_stack(env, c, tools)
        start_executor(c, ctl, "executor-0")
        api = env.api([ctl])
        run_id = start_run(api, models)

        def committed() -> list[tuple[int, str, str, int]] | None:
            rows = current_round(env.db_url(), run_id)
            model = [r for r in rows if r[1] == "model"]
            return rows if model and model[0][:3] == (1, "model", "succeeded") else None

        wait_until(committed, within=60, what="round 1's model reply to commit", every=0.01)
        env.faults.sigkill(ctl)
        # Where the kill landed: the reply committed and its calls planned, the round not over.
        at_kill = current_round(env.db_url(), run_id)
        ctl = start_stack(env, c, tools, again=ctl)
        env.faults.restarted(ctl)
        done = ended_run(api, run_id, within=RECOVERY_BOUND_S + 30)
        standard = judge(env, c, api, sink)
    calls = [(step, status) for round_, step, status, _ in at_kill if step != "model"]
    assert all(r[0] == 1 for r in at_kill), f"the kill landed after round 1 ended: {at_kill}"
    assert len(calls) == 2, f"the reply's two calls were not planned with it: {at_kill}"
    assert not any(status == "succeeded" for _, status in calls), at_kill
    [model_attempt] = [attempt for _, step, _, attempt in at_kill if step == "model"]
    assert model_attempt == 1, at_kill
    seen = assert_ended_as_it_would_have(done, models, sink, in_flight=None)
    env.figures.add(
        f"agent run, controller SIGKILLed just after round 1's model reply committed (its "
        f"calls {[s for _, s in calls]}): model calls per round "
        f"{dict(sorted(seen.calls.items()))}, none repeated; {standard}"
    )


# -- 4: the embedded stack ------------------------------------------------------------------------


def test_the_embedded_stack_resumes_a_run_after_a_kill(fault_env: FaultEnv) -> None:
    env = fault_env
    with (
        ScriptedModels(script(slow_round=None), replay=True) as models,
        Sink() as sink,
        env.cluster({KEY_VARIABLE: KEY}) as c,
    ):
        tools = env.tools([ledger(sink, slow_calls=0)], sink=sink)
        database = f"sqlite:///{env.dir / 'dev.db'}"
        dev = c.start_dev("dev-0", database_url=database, tools=tools)
        c.await_registered([dev])
        models.hold(after=1)
        run_id = start_run(env.api([dev]), models)
        wait_until(lambda: models.held == 1, within=60, what="round 2's model call in flight")
        env.faults.sigkill(dev)
        models.release()
        dev = c.start_dev("dev-1", database_url=database, tools=tools)
        env.faults.restarted(dev)
        api = env.api([dev])
        done = ended_run(api, run_id, within=RECOVERY_BOUND_S + 30)
        standard = judge(env, c, api, sink)
    seen = assert_ended_as_it_would_have(done, models, sink, in_flight=2)
    env.figures.add(
        f"agent run on `reach dev` (SQLite), SIGKILLed at round 2's model call and restarted: "
        f"resumed to its answer; model calls per round {dict(sorted(seen.calls.items()))}; "
        f"{standard}"
    )
