"""Replaying an agent run: each round's model request and reply beside its tool receipts, and a
dry run that reads every recorded reply again with today's rules and tools.

The dry run calls no model and no tool. For each round whose reply asked for tools, the reply is
read as it was then (`parse_plan` in the endpoint's dialect, the run's tools as rights, what the
model had read as grounds), but against today's catalogue; each call's decision (run, or refused
and why) and tool version are compared with what the round stored. Each round's task is then
re-driven on its recorded results (`replay.dry_run`), as a task's replay is. Any difference is
said; none means today's rules and tools reach the same decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_reach_controller.decide.run_memory import MEMORY_ROLE
from agent_reach_controller.domain.records import RunMessage, RunRow, StepRow
from agent_reach_controller.planning.endpoints import ENDPOINTS, EndpointKind
from agent_reach_controller.planning.plan import Plan, parse_plan
from agent_reach_controller.planning.problems import PlanInvalidError
from agent_reach_controller.receipts import output_handle, render_receipt_dict
from agent_reach_controller.replay import dry_run
from agent_reach_controller.services.queries import read_view
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.services.rounds import ROUND_STEPS
from agent_reach_controller.services.runs import RunService
from agent_reach_controller.storage.engine import Database
from agent_reach_controller.tools.agents import profile_of
from agent_reach_controller.tools.catalog import ToolCatalog


@dataclass(slots=True)
class RoundReplay:
    round: int
    task_id: str | None
    request: dict[str, Any] | None  # the model request, rebuilt from what the run stored
    reply: list[dict[str, Any]]  # the assistant's entries of the round
    calls: list[dict[str, Any]]  # each call: id, tool, version, status, what the model read
    differences: list[str] = field(default_factory=list)


@dataclass(slots=True)
class RunReplay:
    run: RunRow
    rounds: list[RoundReplay]

    @property
    def identical(self) -> bool:
        return not any(r.differences for r in self.rounds)


_OPENING = frozenset({"user", MEMORY_ROLE})


class RunReplayer:
    """Reads a run back, and re-reads it with today's rules."""

    def __init__(self, *, db: Database, registry: ToolRegistry, runs: RunService) -> None:
        self._db = db
        self._registry = registry
        self._runs = runs

    async def replay(self, run_id: str, tenant: str, *, budget: int) -> RunReplay:
        run, conversation = await self._runs.read(run_id, tenant)
        spec = self._registry.get(run.agent, run.agent_version)
        endpoint = ENDPOINTS[profile_of(spec).endpoint.kind]
        tasks = {n: task_id for n, task_id, _ in await self._runs.rounds(run)}
        numbers = sorted({m.round for m in conversation} | set(tasks))
        rounds = []
        for number in numbers:
            steps: list[StepRow] = []
            task_id = tasks.get(number)
            if task_id is not None:
                async with self._db.transaction() as conn:
                    view = await read_view(conn, task_id)
                await self._registry.ensure((s.tool, s.tool_version) for s in view.steps)
                steps = list(view.steps)
                replayed = dry_run(view.task, steps, tool_of=self._registry.get, budget=budget)
            rounds.append(
                self._round(run, number, conversation, endpoint, steps, task_id, budget=budget)
            )
            if task_id is not None:
                rounds[-1].differences += [
                    f"step {s.step_id}: {d}" for s in replayed.steps for d in s.differences
                ]
        return RunReplay(run=run, rounds=rounds)

    def _round(  # noqa: PLR0913 - one round, all of it shown
        self,
        run: RunRow,
        number: int,
        conversation: Sequence[RunMessage],
        endpoint: EndpointKind,
        steps: Sequence[StepRow],
        task_id: str | None,
        *,
        budget: int,
    ) -> RoundReplay:
        # What the round's request was built from: the earlier rounds, and this round's own
        # opening (the caller's message, and the memories recalled when the run started).
        before = [
            m
            for m in conversation
            if m.round < number or (m.role in _OPENING and m.round == number)
        ]
        said = [m.message for m in conversation if m.round == number and m.role == "assistant"]
        spec = self._registry.get(run.agent, run.agent_version)
        request = self._runs.request_for(run, spec, before) if said or steps else None
        calls = [
            {
                "call_id": s.step_id,
                "tool": s.tool,
                "tool_version": s.tool_version,
                "status": s.status.value,
                "read": None if s.receipt is None else _said(s, budget),
            }
            for s in steps
            if s.step_id not in ROUND_STEPS
        ]
        replay = RoundReplay(
            round=number, task_id=task_id, request=request, reply=said, calls=calls
        )
        if endpoint.calls_in(said):
            replay.differences += _decisions(
                run, endpoint, said, steps, self._registry.catalog, before
            )
        return replay


def _said(step: StepRow, budget: int) -> str:
    assert step.receipt is not None
    return render_receipt_dict(
        step.receipt, budget=budget, handle=output_handle(step.task_id, step.step_id)
    )


def _decisions(
    run: RunRow,
    endpoint: EndpointKind,
    said: list[dict[str, Any]],
    steps: Sequence[StepRow],
    catalog: ToolCatalog,
    before: Sequence[RunMessage],
) -> list[str]:
    """The round's calls read again against today's catalogue: what would run, what would be
    refused, and at which tool version, beside what the round stored."""
    calls = _calls_body(endpoint, said)
    grounds = {
        "context": run.context,
        "input": [m.message for m in before if m.role == "user"],
        "read": [m.message for m in before if m.role == "tool"],
    }
    try:
        plan: Plan | None = parse_plan(
            calls,
            catalog,
            dialect=endpoint.dialect,
            permits=set(run.tools).__contains__,
            grounds=grounds,
        )
    except PlanInvalidError as exc:
        return [f"today the whole reply is refused: {exc.problems[0].detail}"]
    assert plan is not None
    stored = {s.step_id: s for s in steps if s.step_id not in ROUND_STEPS}
    found = []
    for step in plan.steps:
        was = stored.get(step.step_id)
        if was is None:
            continue  # a fan-out's child or a verified write's half: its parent says it
        if was.error is not None and (was.error or {}).get("message", "").startswith("refused"):
            found.append(f"call {step.step_id}: refused then, today it would run")
        elif was.tool_version != step.tool_version:
            found.append(
                f"call {step.step_id}: tool {step.tool} changed since "
                f"({was.tool_version} then, {step.tool_version} today)"
            )
    for refused in plan.refused:
        was = stored.get(refused.step_id)
        if was is not None and not str((was.error or {}).get("message", "")).startswith("refused"):
            found.append(f"call {refused.step_id}: ran then, today refused: {refused.reason()}")
    return found


def _calls_body(endpoint: EndpointKind, said: list[dict[str, Any]]) -> dict[str, Any]:
    """The round's reply as its dialect reads it (what the run read when it was recorded)."""
    if endpoint.dialect == "openai_responses":
        return {"output": said}
    return said[-1]
