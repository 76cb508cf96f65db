"""Downstream faults: 503/429 with Retry-After, answers slower than the tool's timeout, resets after
the body was read, hard 4xx. The same Idempotency-Key on every attempt, at least Retry-After (and
the decided backoff) between attempts, full jitter, no retry of 400/401/403/404/422, attempts
bounded by maximum_attempts; a non-idempotent tool ends an ambiguous attempt in
`outcome_unknown` (then resolved by an operator), and retries a clear failure as usual."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

from tests.faults.checkers import Checker, Finding, Run, _ns, check_all
from tests.faults.harness import FaultEnv, ToolOptions, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.server import free_port
from tests.support.sink import Response, Sink

IDEM, ONCE, REFUSED = "ds.idempotent", "ds.once", "ds.refused"
MAX_ATTEMPTS = 4
INITIAL_S, MAXIMUM_S = 0.2, 0.8
TIMEOUT_S = 1.0
SLOW_S = 2.5  # answers this late are past the tool's timeout
OK = Response(json={"ok": True}, echo=True)


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    tool: str
    script: tuple[Response, ...]
    status: str  # where the step settles before any operator acts
    attempts: int
    retry_after_s: float = 0.0
    error: str | None = None


def cases() -> list[Case]:
    return [
        Case(
            "r503",
            IDEM,
            (Response(status=503, retry_after=1), Response(status=503, retry_after=1), OK),
            "succeeded",
            3,
            retry_after_s=1,
        ),
        Case("r429", IDEM, (Response(status=429, retry_after=2), OK), "succeeded", 2, 2),
        Case("slow", IDEM, (Response(json={"ok": 1}, delay=SLOW_S), OK), "succeeded", 2),
        Case("reset", IDEM, (Response(reset=True, applied=True), OK), "succeeded", 2),
        Case("drop", IDEM, (Response(drop=True), OK), "succeeded", 2),
        *(
            Case(f"exhaust{i}", IDEM, (Response(status=503),), "failed", MAX_ATTEMPTS)
            for i in range(3)
        ),
        Case("s400", IDEM, (Response(status=400),), "failed", 1, error="downstream_rejected"),
        Case("s401", IDEM, (Response(status=401),), "failed", 1, error="unauthorized"),
        Case("s403", IDEM, (Response(status=403),), "failed", 1, error="unauthorized"),
        Case("s404", IDEM, (Response(status=404),), "failed", 1, error="not_found"),
        Case("s422", IDEM, (Response(status=422),), "failed", 1, error="downstream_rejected"),
        Case(
            "once-slow",
            ONCE,
            (Response(json={"ok": 1}, delay=SLOW_S),),
            "outcome_unknown",
            1,
            error="outcome_unknown",
        ),
        Case(
            "once-reset",
            ONCE,
            (Response(reset=True, applied=True),),
            "outcome_unknown",
            1,
            error="outcome_unknown",
        ),
        Case(
            "once-503",
            ONCE,
            (Response(status=503, retry_after=1), OK),
            "succeeded",
            2,
            retry_after_s=1,
        ),
        Case("refused", REFUSED, (), "failed", MAX_ATTEMPTS, error="connection_error"),
    ]


def contract(named: dict[str, Case], settled: dict[str, tuple[str, int, str | None]]) -> Checker:
    """The downstream contract, judged from the history (`settled`: before any operator)."""

    def check(run: Run) -> Finding:
        f = Finding("downstream contract")
        by_path: dict[str, list[dict[str, object]]] = defaultdict(list)
        for d in run.deliveries:
            by_path[str(d["path"])].append(d)
        for step in run.steps.values():
            case = named[step.step_id.rsplit("-r", 1)[0]]
            where = f"{step.step_id} ({case.name})"
            status, attempt, error = settled[step.step_id]
            if (status, attempt) != (case.status, case.attempts):
                f.problem(
                    f"{where}: settled {status} at attempt {attempt}, expected "
                    f"{case.status} at attempt {case.attempts}"
                )
            if case.error is not None and error != case.error:
                f.problem(f"{where}: error {error}, expected {case.error}")
            if case.tool == REFUSED:
                continue
            got = sorted(by_path[f"/ds/{step.step_id}"], key=lambda d: int(str(d["at_ns"])))
            if len(got) != case.attempts:
                f.problem(f"{where}: {len(got)} deliveries, expected {case.attempts}")
            f.counts["deliveries"] += len(got)
            if any(d["key"] != step.key for d in got):
                f.problem(f"{where}: keys {[d['key'] for d in got]} differ from {step.key}")
            for before, after in itertools.pairwise(got):
                gap = (int(str(after["at_ns"])) - int(str(before["at_ns"]))) / 1e9
                f.counts["gaps"] += 1
                if gap < case.retry_after_s:
                    f.problem(
                        f"{where}: {gap:.3f}s between attempts, Retry-After was "
                        f"{case.retry_after_s:g}s"
                    )
            retries = [
                e for e in run.step_events[(step.task_id, step.step_id)] if e["event"] == "retry"
            ]
            for retry, nxt in zip(retries, got[1:], strict=False):
                due_ns = _ns(str(retry["created_at"])) + int(retry["data"]["delay_s"] * 1e9)
                if int(str(nxt["wall_ns"])) < due_ns - 5_000_000:
                    f.problem(f"{where}: attempt {retry['attempt']} came before its backoff")
                if case.name.startswith("exhaust"):
                    failed = retry["attempt"] - 1
                    ceiling = min(MAXIMUM_S, INITIAL_S * 2 ** (failed - 1))
                    ratio = retry["data"]["delay_s"] / ceiling
                    f.counts["jitter_samples"] += 1
                    f.counts["jitter_below_90pct"] += ratio < 0.9
                    if ratio > 1.001:
                        f.problem(f"{where}: backoff {retry['data']['delay_s']}s over {ceiling}s")
        if f.counts["jitter_samples"] and not f.counts["jitter_below_90pct"]:
            f.problem("no backoff fell below 90% of its ceiling: is there any jitter?")
        return f

    return check


def test_downstream_faults(fault_env: FaultEnv) -> None:
    env, p = fault_env, fault_env.profile.downstream
    all_cases = cases()
    named = {c.name: c for c in all_cases}
    common = ToolOptions(
        max_attempts=MAX_ATTEMPTS,
        timeout=f"{TIMEOUT_S:g}s",
        initial=f"{INITIAL_S:g}s",
        maximum=f"{MAXIMUM_S:g}s",
    )
    with Sink() as sink, env.cluster() as c:
        specs = [
            sink_tool(IDEM, f"{sink.url}/ds/{{case}}", idempotent=True, **common),
            sink_tool(ONCE, f"{sink.url}/ds/{{case}}", idempotent=False, **common),
            sink_tool(
                REFUSED, f"http://127.0.0.1:{free_port()}/{{case}}", idempotent=False, **common
            ),
        ]
        tools = env.tools(specs, sink=sink)
        steps = []
        for r in range(p.repeat):
            for case in all_cases:
                step_id = f"{case.name}-r{r}"
                if case.script:
                    sink.script(f"/ds/{step_id}", list(case.script))
                args = {"op": f"ds-{step_id}", "case": step_id}
                steps.append({"step_id": step_id, "tool": case.tool, "args": args})
        ctl = c.start_controller("controller", database_url=env.db_url(), tools=tools)
        executors = [
            c.start_executor(f"executor-{i}", grpc=ctl.info["grpc"], slots=8) for i in range(2)
        ]
        c.await_registered(executors)
        api = env.api([ctl])
        task_id = api.submit({"goal": "downstream", "steps": steps}, key="downstream")
        progress = env.progress()
        env.wait_settled(progress, expected=len(steps), within=60, allow_unknown=True)
        before = api.get(f"/v1/tasks/{task_id}")
        settled = {
            s["step_id"]: (
                s["status"],
                s["attempt"],
                ((s["receipt"] or {}).get("error") or {}).get("code"),
            )
            for s in before["steps"]
        }
        env.history.record("settled", steps=settled)
        # The operator looks at the downstream and says what happened to each unknown step.
        effects = sink.effects()
        resolved = 0
        for s in before["steps"]:
            if s["status"] == "outcome_unknown":
                applied = effects.get(s["idempotency_key"], 0) > 0
                api.post(
                    f"/v1/tasks/{task_id}/steps/{s['step_id']}/resolve",
                    {
                        "action": "succeeded" if applied else "failed",
                        "by": "fault-suite",
                        "reason": "checked the downstream's records",
                        "output": {"ok": True} if applied else None,
                    },
                )
                resolved += 1
        env.wait_settled(progress, expected=len(steps), within=30)
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
    summary = check_all(
        Run.load(env.history.path), recovery_bound_s=None, extra=[contract(named, settled)]
    )
    found = summary.findings["downstream contract"].counts
    env.figures.add(
        f"downstream faults, {len(steps)} steps ({p.repeat} of each: 503/429 + Retry-After, "
        f"answer {SLOW_S:g} s past a {TIMEOUT_S:g} s timeout, reset and drop after the body, "
        f"exhausted 503s, 400/401/403/404/422, refused, on idempotent and non-idempotent "
        f"tools): every attempt carried its step's one key, {found['gaps']} gaps between "
        f"attempts all ≥ Retry-After and ≥ the decided backoff, {found['jitter_samples']} "
        f"full-jitter backoffs within their ceilings, 4xx sent once, attempts ≤ "
        f"{MAX_ATTEMPTS}, {resolved} ambiguous non-idempotent attempts held in outcome_unknown "
        f"(then resolved); {summary.standard()}"
    )
