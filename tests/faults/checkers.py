"""Checkers: judge a run from its history file alone, after the fact.

    run = Run.load(history_path)
    summary = check_all(run, recovery_bound_s=20)   # raises AssertionError naming every problem

Each checker is a function over the run that returns a `Finding` (its problems and counts):

1. `nothing_lost`: every accepted task was found, and it and every step of it is terminal;
2. `no_duplicate_effects`: at most one effect per Idempotency-Key and per logical operation, one
   task per submit key, and the keys with an effect are exactly those of succeeded sink steps;
3. `no_stale_completions`: every completion of a running step carries the attempt of the lease
   it completed, and the output of each succeeded sink step came from a delivery made by the
   executor holding the step's last lease, after that lease began (rejections are counted);
4. `legal_transitions`: every event is an edge of `STEP_TRANSITIONS`, each step's events chain
   (one starts where the previous ended, from `blocked` to the observed status), attempts
   never exceed the tool's `maximum_attempts`, and no key was delivered more often than leased;
5. `recovery`: every step reached its final state within a bound after the last fault ended;

plus `api_answers`: no answer was a 5xx other than 503, and every 503/429 carried Retry-After.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from agent_reach.states import (
    TERMINAL_STEP_STATES,
    TERMINAL_TASK_STATES,
    StepStatus,
    is_legal,
)
from tests.support.history import History, Record

TERMINAL_STEPS = {s.value for s in TERMINAL_STEP_STATES}
TERMINAL_TASKS = {s.value for s in TERMINAL_TASK_STATES}
# Transitions out of `running` that end an attempt: they must quote the current lease.
ENDS_ATTEMPT = {"succeed", "fail", "retry", "mark_unknown", "cancel"}
MAX_PROBLEMS_SHOWN = 25


def _ns(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp).timestamp() * 1_000_000) * 1000


@dataclass(frozen=True, slots=True)
class Step:
    task_id: str
    step_id: str
    tool: str
    status: str
    attempt: int
    max_attempts: int
    key: str
    op: str | None
    error: str | None
    output: Any


@dataclass(slots=True)
class Run:
    """A run's history, indexed for the checkers."""

    path: Path
    records: list[Record]
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    submits: list[Record] = field(default_factory=list)
    answers: list[Record] = field(default_factory=list)
    tasks: dict[str, Record] = field(default_factory=dict)
    listed: list[Record] = field(default_factory=list)
    steps: dict[tuple[str, str], Step] = field(default_factory=dict)
    step_events: dict[tuple[str, str], list[Record]] = field(default_factory=dict)
    task_events: dict[str, list[Record]] = field(default_factory=dict)
    deliveries: list[Record] = field(default_factory=list)
    effects: dict[str, int] = field(default_factory=dict)
    faults: list[Record] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Run:
        run = cls(path=path, records=History.load(path))
        step_events: dict[tuple[str, str], list[Record]] = defaultdict(list)
        task_events: dict[str, list[Record]] = defaultdict(list)
        for r in run.records:
            kind = r["kind"]
            if kind == "tools":
                run.tools.update(r["tools"])
            elif kind == "submit":
                run.submits.append(r)
            elif kind == "answer":
                run.answers.append(r)
            elif kind == "task":
                run.tasks[r["task_id"]] = r
                for s in r["steps"]:
                    run.steps[(r["task_id"], s["step_id"])] = Step(task_id=r["task_id"], **s)
            elif kind == "listed":
                run.listed.append(r)
            elif kind == "event":
                if r["step_id"] is None:
                    task_events[r["task_id"]].append(r)
                else:
                    step_events[(r["task_id"], r["step_id"])].append(r)
            elif kind == "delivery":
                run.deliveries.append(r)
            elif kind == "sink_effects":
                run.effects = dict(r["effects"])
            elif kind in ("fault", "heal"):
                run.faults.append(r)
        run.step_events = {k: sorted(v, key=lambda e: e["id"]) for k, v in step_events.items()}
        run.task_events = {k: sorted(v, key=lambda e: e["id"]) for k, v in task_events.items()}
        return run

    def accepted(self) -> dict[str, set[str]]:
        """Submit key → every task id an accepting answer named for it."""
        out: dict[str, set[str]] = defaultdict(set)
        for s in self.submits:
            if s.get("outcome") == "accepted":
                out[s["key"]].add(s["task_id"])
        return out

    def found_on_retry(self) -> set[str]:
        """Keys whose task was created by an attempt that failed (the reply was lost): the task
        existed before the attempt that was finally accepted had been sent."""
        found = set()
        created = {t["task_id"]: _ns(t["created_at"]) for t in self.tasks.values()}
        for s in self.submits:
            if s.get("outcome") != "accepted" or s["attempt"] == 0:
                continue
            sent_ns = s["wall"] - s["took_ms"] * 1_000_000
            if s["task_id"] in created and created[s["task_id"]] < sent_ns:
                found.add(s["key"])
        return found

    def sink_tool(self, tool: str) -> bool:
        return bool(self.tools.get(tool, {}).get("sink"))

    def last_fault_ns(self) -> int | None:
        return max((r["wall"] for r in self.faults), default=None)


@dataclass(slots=True)
class Finding:
    name: str
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def problem(self, text: str) -> None:
        self.problems.append(text)


# -- 1 -------------------------------------------------------------------------------------------


def nothing_lost(run: Run) -> Finding:
    f = Finding("nothing lost")
    accepted = {t for ids in run.accepted().values() for t in ids}
    f.counts["accepted_tasks"] = len(accepted)
    for task_id in sorted(accepted - set(run.tasks)):
        f.problem(f"task {task_id} was accepted but is not found (lost)")
    for task_id, task in sorted(run.tasks.items()):
        if task["status"] not in TERMINAL_TASKS:
            f.problem(f"task {task_id} is {task['status']}, not terminal")
    for step in run.steps.values():
        f.counts["steps"] += 1
        f.counts[f"steps_{step.status}"] += 1
        if step.status not in TERMINAL_STEPS:
            f.counts["lost"] += 1
            f.problem(f"step {step.task_id}/{step.step_id} is {step.status}, not terminal")
    return f


# -- 2 -------------------------------------------------------------------------------------------


def no_duplicate_effects(run: Run) -> Finding:
    f = Finding("no duplicate effects")
    for key, count in run.effects.items():
        if not key:
            f.problem(f"{count} effect(s) applied from deliveries without an Idempotency-Key")
        elif count > 1:
            f.problem(f"key {key} applied {count} times")
    applied = {k for k, n in run.effects.items() if k and n}
    keys_of_op: dict[str, set[str]] = defaultdict(set)
    for d in run.deliveries:
        if d.get("op") is not None and d.get("key") in applied:
            keys_of_op[d["op"]].add(d["key"])
    for op, keys in sorted(keys_of_op.items()):
        if len(keys) > 1:
            f.counts["duplicate_effects"] += len(keys) - 1
            f.problem(f"operation {op!r} applied under {len(keys)} keys: {sorted(keys)}")
    succeeded = {
        s.key for s in run.steps.values() if run.sink_tool(s.tool) and s.status == "succeeded"
    }
    for key in sorted(succeeded - applied):
        f.problem(f"step with key {key} succeeded but the downstream has no effect for it")
    for key in sorted(applied - succeeded):
        step = next((s for s in run.steps.values() if s.key == key), None)
        state = f"is {step.status}" if step else "is not found"
        f.problem(f"the downstream applied key {key}, but its step {state}")
    # One task per submit key: a retried submit must never create a second task.
    for key, ids in sorted(run.accepted().items()):
        if len(ids) > 1:
            f.counts["duplicate_tasks"] += len(ids) - 1
            f.problem(f"submit key {key} was answered with {len(ids)} task ids: {sorted(ids)}")
    submitted = {s["key"] for s in run.submits}
    per_goal = Counter(t["goal"] for t in run.listed if t["goal"] in submitted)
    for goal, n in sorted(per_goal.items()):
        if n > 1:
            f.counts["duplicate_tasks"] += n - 1
            f.problem(f"{n} tasks exist for submit key {goal}")
    f.counts["effects"] = len(applied)
    f.counts["deliveries"] = len(run.deliveries)
    f.counts["redeliveries"] = len(run.deliveries) - len({d["key"] for d in run.deliveries})
    return f


# -- 3 -------------------------------------------------------------------------------------------


def no_stale_completions(run: Run) -> Finding:
    f = Finding("no stale completions")
    deliveries = {d["seq"]: d for d in run.deliveries}
    for (task_id, step_id), events in run.step_events.items():
        lease: Record | None = None
        last_lease: Record | None = None
        for e in events:
            kind = e["event"]
            if kind == "result_rejected":
                f.counts["rejected"] += 1
                f.counts[f"rejected_{(e.get('data') or {}).get('reason')}"] += 1
                continue
            if kind == "lease":
                lease = last_lease = e
                continue
            if e["src"] == "running" and kind in ENDS_ATTEMPT:
                if lease is None:
                    f.counts["stale_accepted"] += 1
                    f.problem(f"{task_id}/{step_id}: {kind} of a running step with no lease")
                    continue
                expected = lease["attempt"] + (1 if kind == "retry" else 0)
                if e["attempt"] != expected:
                    f.counts["stale_accepted"] += 1
                    f.problem(
                        f"{task_id}/{step_id}: {kind} recorded attempt {e['attempt']}, "
                        f"but the lease it ended was attempt {lease['attempt']}"
                    )
                lease = None
        step = run.steps.get((task_id, step_id))
        if step is None or step.status != "succeeded" or last_lease is None:
            continue
        provenance = step.output.get("delivery") if isinstance(step.output, dict) else None
        if not isinstance(provenance, dict) or events[-1]["event"] == "resolve_succeeded":
            continue
        f.counts["provenance_checked"] += 1
        owner = (last_lease.get("data") or {}).get("executor_id")
        delivery = deliveries.get(provenance.get("seq"))
        if delivery is None:
            f.problem(f"{task_id}/{step_id}: output names delivery {provenance} the sink lacks")
        elif delivery["key"] != step.key:
            f.problem(f"{task_id}/{step_id}: output came from a delivery of {delivery['key']}")
        elif delivery["executor"] != owner:
            f.counts["stale_accepted"] += 1
            f.problem(
                f"{task_id}/{step_id}: accepted output came from {delivery['executor']}, but the "
                f"last lease (attempt {last_lease['attempt']}) belonged to {owner}"
            )
        elif delivery["wall_ns"] < _ns(last_lease["created_at"]):
            f.counts["stale_accepted"] += 1
            f.problem(
                f"{task_id}/{step_id}: accepted output came from a delivery made before its "
                f"last lease (attempt {last_lease['attempt']}) began"
            )
    return f


# -- 4 -------------------------------------------------------------------------------------------


def legal_transitions(run: Run) -> Finding:
    f = Finding("legal transitions")
    delivered = Counter(d["key"] for d in run.deliveries)
    for (task_id, step_id), step in sorted(run.steps.items()):
        where = f"{task_id}/{step_id}"
        events = [e for e in run.step_events.get((task_id, step_id), []) if e["src"] or e["dst"]]
        status, attempt, leases = StepStatus.BLOCKED.value, 1, 0
        limit = run.tools.get(step.tool, {}).get("maximum_attempts", step.max_attempts)
        for e in events:
            f.counts["transitions"] += 1
            src, dst = e["src"], e["dst"]
            if src != status:
                f.counts["illegal"] += 1
                f.problem(f"{where}: {e['event']} from {src}, but the step was {status}")
            if not is_legal(StepStatus(src), StepStatus(dst)):
                f.counts["illegal"] += 1
                f.problem(f"{where}: {e['event']} {src} -> {dst} is not a legal transition")
            if e["event"] == "lease":
                leases += 1
                if e["attempt"] != attempt:
                    f.counts["illegal"] += 1
                    f.problem(f"{where}: leased as attempt {e['attempt']}, expected {attempt}")
            if e["event"] == "resolve_retry":
                limit = max(limit, e["attempt"])
            if e["attempt"] is not None:
                attempt = e["attempt"]
            if attempt > limit:
                f.counts["over_attempts"] += 1
                f.problem(f"{where}: attempt {attempt} exceeds the tool's maximum of {limit}")
            status = dst
        if status != step.status:
            f.problem(f"{where}: events end in {status}, but the step is {step.status}")
        if step.attempt != attempt:
            f.problem(f"{where}: events end at attempt {attempt}, the step shows {step.attempt}")
        if run.sink_tool(step.tool) and delivered[step.key] > leases:
            f.counts["over_deliveries"] += 1
            f.problem(f"{where}: delivered {delivered[step.key]} times but leased {leases} times")
    for task_id, events in sorted(run.task_events.items()):
        task_status: str | None = None
        for e in events:
            if e["event"] == "task_created":
                task_status = e["dst"]
            elif e["event"] == "task_status":
                if e["src"] != task_status:
                    f.counts["illegal"] += 1
                    f.problem(f"task {task_id}: {e['src']} -> {e['dst']}, but it was {task_status}")
                if task_status in TERMINAL_TASKS:
                    f.counts["illegal"] += 1
                    f.problem(f"task {task_id}: left terminal status {task_status}")
                task_status = e["dst"]
    return f


# -- 5 -------------------------------------------------------------------------------------------


def recovery(run: Run, *, bound_s: float | None) -> Finding:
    f = Finding("recovery")
    last_fault = run.last_fault_ns()
    settled_at = 0
    for key, step in run.steps.items():
        finals = [e for e in run.step_events.get(key, []) if e["dst"] == step.status]
        if finals:
            settled_at = max(settled_at, _ns(finals[-1]["created_at"]))
    if last_fault is None or not settled_at:
        f.counts["recovery_ms"] = 0
        return f
    took = max(0, settled_at - last_fault) / 1e9
    f.counts["recovery_ms"] = round(took * 1000)
    if bound_s is not None and took > bound_s:
        f.problem(f"the last step settled {took:.1f}s after the last fault (bound {bound_s:g}s)")
    return f


# -- API answers ---------------------------------------------------------------------------------


AnswerFilter = Callable[[Run, Record], bool]


def api_answers(run: Run, *, tolerate: AnswerFilter | None = None) -> Finding:
    """No 5xx but 503, and Retry-After on every 503/429. An answer `tolerate` accepts (a known
    product bug, named by the scenario) is counted as `tolerated` instead of failing the run."""
    f = Finding("API answers")
    for r in [*run.submits, *run.answers]:
        status = r.get("status")
        if status is None:
            f.counts["transport_errors"] += 1
            continue
        f.counts[f"http_{status}"] += 1
        if status >= 500 and status != 503:
            f.counts["server_errors"] += 1
            if tolerate is not None and tolerate(run, r):
                f.counts["tolerated"] += 1
                continue
            f.problem(f"{r.get('method', 'POST')} {r.get('path', '/v1/tasks')} answered {status}")
        if status in (429, 503) and not r.get("retry_after"):
            f.problem(f"a {status} answer without Retry-After ({r.get('path', '/v1/tasks')})")
    return f


# -- all -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Summary:
    findings: dict[str, Finding]
    recovery_bound_s: float | None

    def count(self, finding: str, key: str) -> int:
        return self.findings[finding].counts[key]

    @property
    def recovery_s(self) -> float:
        return self.count("recovery", "recovery_ms") / 1000

    def standard(self) -> str:
        """'0 lost, 0 duplicate effects, 0 stale completions accepted (N rejected), …'"""
        lost = self.count("nothing lost", "lost")
        dups = self.count("no duplicate effects", "duplicate_effects") + self.count(
            "no duplicate effects", "duplicate_tasks"
        )
        stale = self.count("no stale completions", "stale_accepted")
        rejected = self.count("no stale completions", "rejected")
        illegal = self.count("legal transitions", "illegal") + self.count(
            "legal transitions", "over_attempts"
        )
        text = (
            f"{lost} lost, {dups} duplicate effects, {stale} stale completions accepted "
            f"({rejected} rejected), {illegal} illegal transitions"
        )
        if self.recovery_bound_s is not None:
            text += (
                f", all terminal ≤ {self.recovery_s:.1f} s after the last fault "
                f"(bound {self.recovery_bound_s:g} s)"
            )
        return text


Checker = Callable[[Run], Finding]
ALWAYS: tuple[Checker, ...] = (
    nothing_lost,
    no_duplicate_effects,
    no_stale_completions,
    legal_transitions,
)


def check_all(
    run: Run,
    *,
    recovery_bound_s: float | None,
    extra: Iterable[Checker] = (),
    tolerate_answer: AnswerFilter | None = None,
) -> Summary:
    """Run every checker; raise one AssertionError listing every problem, with the history."""
    findings = [c(run) for c in (*ALWAYS, *extra)]
    findings.append(api_answers(run, tolerate=tolerate_answer))
    findings.append(recovery(run, bound_s=recovery_bound_s))
    problems = [f"[{f.name}] {p}" for f in findings for p in f.problems]
    if problems:
        shown = "\n  ".join(problems[:MAX_PROBLEMS_SHOWN])
        more = len(problems) - MAX_PROBLEMS_SHOWN
        raise AssertionError(
            f"{len(problems)} problem(s) in {run.path}:\n  {shown}"
            + (f"\n  … and {more} more" if more > 0 else "")
        )
    return Summary(findings={f.name: f for f in findings}, recovery_bound_s=recovery_bound_s)
