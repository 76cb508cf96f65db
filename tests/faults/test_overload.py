"""Overload: load offered well beyond what the executors can run gets 429 with Retry-After (and
nothing stored for a refused submit), the controller's memory stays bounded, and the latency of
a small task recovers once the load drops."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

from tests.faults.checkers import Finding, Run, check_all
from tests.faults.harness import Api, FaultEnv, plan, rss_mib, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.sink import Response, Sink

PROBES = 5
PROBE_WAIT_S = 30.0
LOAD_TOOL, PROBE_TOOL = "ledger.post", "probe.post"
IMPATIENT_PAUSE_S = 0.01


def probe_latencies(api: Api, label: str, count: int = PROBES) -> list[float]:
    """Seconds from submit to terminal of one-step tasks (submit-and-wait), one after another."""
    found = []
    for n in range(count):
        key = f"probe-{label}-{n}"
        began = time.monotonic()
        status, _, _ = api.submit_once(plan(key, [key], PROBE_TOOL), key=key, wait=PROBE_WAIT_S)
        if status == 200:
            found.append(time.monotonic() - began)
    return found


class Budget:
    """How many submits the load generators may still make, together."""

    def __init__(self, total: int) -> None:
        self._left = total
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    api: Api
    steps: int
    deadline: float
    budget: Budget
    stop: threading.Event


def offer(load: Load, client: int, *, patient: bool) -> None:
    """Submit tasks as fast as answers come; a patient client waits Retry-After after a 429, an
    impatient one does not. Bounded by the deadline and the shared submit budget. A refused key
    is dropped: nothing was stored for it."""
    n = 0
    while time.monotonic() < load.deadline and not load.stop.is_set() and load.budget.take():
        key = f"load-{client}-{n}"
        n += 1
        ops = [f"{key}-{i}" for i in range(load.steps)]
        status, _, retry_after = load.api.submit_once(plan(key, ops, LOAD_TOOL), key=key)
        if status == 429:
            pause = retry_after if patient else IMPATIENT_PAUSE_S
            load.stop.wait(min(pause, max(0.0, load.deadline - time.monotonic())))


def probe_during(api: Api, stop: threading.Event, found: list[float]) -> None:
    """Probe latency while the load runs (a probe may be refused: then it does not count)."""
    n = 0
    while not stop.is_set() and n < 100:
        found += probe_latencies(api, f"during-{n}", 1)
        n += 1
        stop.wait(0.5)


def refused_left_nothing(run: Run) -> Finding:
    f = Finding("refused submits stored nothing")
    accepted = set(run.accepted())
    refused = {s["key"] for s in run.submits if s.get("status") == 429} - accepted
    goals = {t["goal"] for t in run.listed}
    for key in sorted(refused & goals):
        f.problem(f"submit {key} was refused with 429, yet a task exists for it")
    f.counts["refused_keys"] = len(refused)
    return f


def test_overload_is_refused_and_latency_recovers(fault_env: FaultEnv) -> None:
    env, p = fault_env, fault_env.profile.overload
    with Sink() as sink, env.cluster() as c:
        sink.script("/ledger", [Response(json={"ok": True}, delay=p.call_delay_s, echo=True)])
        sink.script("/probe", [Response(json={"ok": True}, echo=True)])
        tools = env.tools(
            [
                sink_tool(LOAD_TOOL, f"{sink.url}/ledger"),
                sink_tool(PROBE_TOOL, f"{sink.url}/probe"),
            ],
            sink=sink,
        )
        ctl = c.start_controller(
            "controller",
            database_url=env.db_url(),
            tools=tools,
            env={
                "AGENT_REACH_CONTROLLER_MAX_QUEUED_STEPS": str(p.max_queued_steps),
                "AGENT_REACH_CONTROLLER_OVERLOAD_RETRY_AFTER_SECONDS": "1",
            },
        )
        executor = c.start_executor("executor-0", grpc=ctl.info["grpc"], slots=p.executor_slots)
        c.await_registered([executor])
        api = env.api([ctl], timeout=PROBE_WAIT_S + 10)
        progress = env.progress()
        probe_latencies(api, "warmup", 2)
        before = probe_latencies(api, "before")
        rss_before = rss_mib(ctl)
        env.history.record("rss", process="controller", mib=rss_before, phase="before")

        stop = threading.Event()
        began = time.monotonic()
        deadline = began + p.load_s
        offered = Load(
            api=api,
            steps=p.steps_per_task,
            deadline=deadline,
            budget=Budget(p.max_submits),
            stop=stop,
        )
        clients = [
            threading.Thread(
                target=offer, args=(offered, i), kwargs={"patient": i >= p.impatient_clients}
            )
            for i in range(p.load_clients + p.impatient_clients)
        ]
        during: list[float] = []
        prober = threading.Thread(target=probe_during, args=(api, stop, during))
        env.history.record("fault", action="overload_start", target="controller")
        for thread in [*clients, prober]:
            thread.start()
        peak_depth, peak_rss = 0, rss_before
        while any(t.is_alive() for t in clients) and time.monotonic() < deadline + 5:
            peak_depth = max(peak_depth, progress.ready_depth() or 0)
            peak_rss = max(peak_rss, rss_mib(ctl))
            stop.wait(0.2)
        load_s = time.monotonic() - began
        stop.set()
        for thread in [*clients, prober]:
            thread.join(timeout=PROBE_WAIT_S + 15)
            assert not thread.is_alive(), "a load or probe client did not stop"
        env.history.record("heal", action="overload_end", target="controller")
        env.wait_settled(progress, expected=0, within=p.recovery_bound_s, what="the queue to drain")
        drained_s = time.monotonic() - began - load_s
        after = probe_latencies(api, "after")
        rss_after = rss_mib(ctl)
        env.history.record("rss", process="controller", mib=rss_after, phase="after")
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
    run = Run.load(env.history.path)
    summary = check_all(run, recovery_bound_s=p.recovery_bound_s, extra=[refused_left_nothing])
    answers = summary.findings["API answers"].counts
    loads = [s for s in run.submits if s["key"].startswith("load-")]
    accepted_steps = sum(s["steps"] for s in loads if s.get("outcome") == "accepted")
    assert answers["http_429"] > 0, "the overload was never refused"
    # One controller counts what it accepts at once, so the queue never passes the limit.
    assert peak_depth <= p.max_queued_steps, (
        f"{peak_depth} steps queued; limit {p.max_queued_steps}"
    )
    assert len(before) == PROBES, "probes before the load did not finish"
    assert len(after) == PROBES, "probes after the load did not finish"
    p50_before, p50_after = statistics.median(before), statistics.median(after)
    assert p50_after <= max(0.5, 3 * p50_before), (
        f"latency did not recover: p50 {p50_before * 1000:.0f} ms before, "
        f"{p50_after * 1000:.0f} ms after"
    )
    growth = rss_after - rss_before
    assert growth <= p.rss_growth_bound_mib, f"controller RSS grew {growth:.0f} MiB"
    during_ms = f"{statistics.median(during) * 1000:.0f} ms" if during else "none finished"
    env.figures.add(
        f"overload: {p.load_clients} patient + {p.impatient_clients} impatient clients "
        f"offering {p.steps_per_task}-step tasks for {load_s:.0f} s to 1 executor with "
        f"{p.executor_slots} slots (max queued steps {p.max_queued_steps}): {len(loads)} "
        f"submits, {answers['http_429']} answered 429 with Retry-After, "
        f"{answers['server_errors']} answered 5xx, {accepted_steps:,} steps accepted, "
        f"peak ready queue {peak_depth:,} (limit {p.max_queued_steps}); controller RSS "
        f"{rss_before:.0f} → peak {peak_rss:.0f} → {rss_after:.0f} MiB; probe submit→done "
        f"p50 {p50_before * 1000:.0f} ms before, {during_ms} during ({len(during)} got "
        f"through), {p50_after * 1000:.0f} ms after the queue drained ({drained_s:.1f} s after "
        f"the load stopped); "
        f"{summary.standard()}"
    )
