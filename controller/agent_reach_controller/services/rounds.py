"""What moves an agent run's rounds, inside the transactions that move its tasks.

`Rounds` is the unit of work's `RunHooks`: when a round's model step succeeds, its reply joins
the conversation and its tool calls join the round's task (read through the same planning a
caller's turn takes), or the run ends with its answer or a limit; when a round's task ends, its
receipts go back to the model and the next round's task is made. It also builds each model
step's request from the stored conversation when the step is leased. The rules it applies are
pure (decide/runs.py); what a caller asks of a run is services/runs.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from agent_reach.states import StepStatus, TaskStatus
from agent_reach_controller.decide import run_memory as memory_rules
from agent_reach_controller.decide import runs as rules
from agent_reach_controller.decide.runs import EndReason
from agent_reach_controller.domain.records import (
    ENDED_RUN_STATES,
    RunMessage,
    RunRow,
    RunStatus,
    StepRow,
    TaskRow,
)
from agent_reach_controller.planning import fanout, planner
from agent_reach_controller.planning.dialects.base import Answer
from agent_reach_controller.planning.endpoints import ENDPOINTS, Ask, EndpointKind, ReplyError
from agent_reach_controller.planning.plan import Plan, PlannedStep, parse_plan
from agent_reach_controller.planning.problems import PlanInvalidError, Problem, ProblemCode
from agent_reach_controller.receipts import output_handle, render_receipt_dict
from agent_reach_controller.services.intake import IntakeService, SubmitInput, refusals, step_rows
from agent_reach_controller.services.run_memory import RunMemory
from agent_reach_controller.services.unit_of_work import TaskWork, UnitOfWork
from agent_reach_controller.storage import events as event_log
from agent_reach_controller.storage import runs as run_store
from agent_reach_controller.storage import steps as store
from agent_reach_controller.tools.agents import MODEL_CONNECTOR, AgentProfile, Limits, profile_of
from agent_reach_controller.tools.catalog import ToolSpec

# Entries that record something about the run (a router's or a category's choice, what it
# recalled, its extraction), never sent to the model as messages.
_NOT_SENT = frozenset({"route", "category", memory_rules.MEMORY_ROLE, memory_rules.EXTRACTION_ROLE})
# The step of a round that calls the model (a tool call's id never takes it: see number_calls).
MODEL_STEP = "model"
# A round's steps that are not the model's tool calls: its model call, and (a run's first round,
# when its profile recalls by embeddings) the recall step before it.
ROUND_STEPS = frozenset({MODEL_STEP, memory_rules.RECALL_STEP})


def endpoint_of(spec: ToolSpec) -> EndpointKind:
    """The endpoint kind an agent's model tool speaks."""
    return ENDPOINTS[str(spec.config["endpoint"])]


def ended_values(status: RunStatus, reason: str, now: datetime) -> dict[str, Any]:
    return {"status": status, "end_reason": reason, "finished_at": now}


def _joined(*parts: str) -> str:
    return "\n\n".join(p for p in parts if p)


@dataclass(frozen=True, slots=True, kw_only=True)
class Read:
    """A model's reply that asks for tools, read: what its calls are, and what grounds them."""

    endpoint: EndpointKind
    calls: dict[str, Any]
    grounds: dict[str, Any]


class Rounds:
    """Moves runs on as their rounds' steps and tasks move (RunHooks), and builds model requests."""

    def __init__(
        self, *, work: UnitOfWork, intake: IntakeService, memory: RunMemory, receipt_budget: int
    ) -> None:
        self._work = work
        self._intake = intake
        self._memory = memory
        self._budget = receipt_budget

    async def with_requests(self, claimed: Sequence[StepRow]) -> list[StepRow]:
        """Leased steps, each model step given the request its run's conversation makes now."""
        wanted = {s.args.get("run") for s in claimed if s.connector == MODEL_CONNECTOR}
        if not wanted:
            return list(claimed)
        ids = [w for w in wanted if isinstance(w, str)]
        async with self._work.db.transaction() as conn:
            found = await run_store.load_runs(conn, ids)
            conversations = await run_store.load_messages(conn, ids)
        return [
            self._with_request(s, found, conversations) if s.connector == MODEL_CONNECTOR else s
            for s in claimed
        ]

    def _with_request(
        self, step: StepRow, found: dict[str, RunRow], conversations: dict[str, list[RunMessage]]
    ) -> StepRow:
        run = found.get(str(step.args.get("run")))
        if run is None:
            return step
        spec = self._work.registry.get(step.tool, step.tool_version)
        request = self._request(run, spec, conversations.get(run.run_id, []))
        return replace(step, resolved_args={"request": request})

    def request_for(self, run: RunRow, spec: ToolSpec, conversation: Sequence[RunMessage]) -> Any:
        """The model request a run's conversation makes (a replay shows it for each round)."""
        return self._request(run, spec, list(conversation))

    def _request(self, run: RunRow, spec: ToolSpec, conversation: list[RunMessage]) -> Any:
        profile = profile_of(spec)
        limits = Limits.model_validate(run.limits)
        known = memory_rules.block_of(conversation)  # data, delimited, never an instruction
        if memory_rules.extracting(conversation):
            return self._extraction_request(run, spec, profile, conversation, known)
        tools = self._tools_of(run)
        mode = rules.mode_of(profile, conversation, len(tools))
        system, schema = _joined(profile.system, known), None
        if mode == "route":  # the router: how to handle the message, said in JSON
            system = _joined(system, planner.router_instructions(tools))
            schema, tools = planner.ROUTE_SCHEMA, []
        elif mode == "category":  # many tools: a category first, said in JSON
            by_category = planner.categories(tools)
            system = _joined(system, planner.category_instructions(by_category))
            schema, tools = planner.category_schema(list(by_category)), []
        elif mode == "plan":  # a plan is written without tools, then answered without
            if rules.planning(conversation):
                system = _joined(system, planner.instructions(tools))
                schema = planner.PLAN_SCHEMA
            tools = []
        elif mode == "answer":
            tools = []
        elif (chosen := rules.chosen_category(conversation)) is not None:
            tools = [t for t in tools if planner.category_of(t) == chosen]
        ask = Ask(
            model=profile.model,
            system=system,
            messages=[m.message for m in conversation if m.role not in _NOT_SENT],
            tools=tools,
            temperature=profile.temperature,
            max_tokens=rules.max_tokens(run, limits),
            note=rules.stage_note(run, limits, goal=rules.goal_of(conversation)),
            reply_schema=schema,
            reply_name=mode,
        )
        return endpoint_of(spec).request(ask)

    def _extraction_request(
        self,
        run: RunRow,
        spec: ToolSpec,
        profile: AgentProfile,
        conversation: list[RunMessage],
        known: str,
    ) -> Any:
        """The extraction's request: the whole conversation, no tools, and what to propose in
        the memory schema (the response format where the endpoint takes one)."""
        types = profile.memory.extract_types
        ask = Ask(
            model=profile.model,
            system=memory_rules.extraction_system(types, known),
            messages=[m.message for m in conversation if m.role not in _NOT_SENT],
            tools=[],
            temperature=profile.temperature,
            max_tokens=rules.max_tokens(run, Limits.model_validate(run.limits)),
            note=memory_rules.EXTRACTION_NOTE,
            reply_schema=memory_rules.memory_schema(types),
            reply_name="memories",
        )
        return endpoint_of(spec).request(ask)

    async def model_answered(self, tx: TaskWork, step: StepRow, output: Any) -> None:
        """A round's model call succeeded: its reply joins the conversation, and its tool calls
        join the round (or the run has its answer, or a limit ends it). A run's recall step
        (the embeddings of its input and memories) is read apart: `_recalled`."""
        if memory_rules.is_recall(step.step_id, step.args):
            await self._recalled(tx, step, output)
        else:
            await self._replied(tx, step, output)

    async def _replied(self, tx: TaskWork, step: StepRow, output: Any) -> None:
        run = await self._current(tx, step.task_id, step.args.get("run"))
        if run is None:
            return
        spec = tx.tool(step)
        profile, endpoint = profile_of(spec), endpoint_of(spec)
        limits = Limits.model_validate(run.limits)
        conversation = (await run_store.load_messages(tx.conn, [run.run_id]))[run.run_id]
        sent = json.dumps(self._request(run, spec, conversation))
        usage = rules.usage_of(output, sent_chars=len(sent), prices=profile.prices)
        totals = usage.added_to(run)
        await self._charge(tx, step, run, profile.model, usage, output)
        if memory_rules.extracting(conversation):
            await self._extracted(tx, step, run, profile, output, totals)
            return
        try:
            reply = endpoint.read(output.get("reply") if isinstance(output, dict) else None)
        except ReplyError as exc:
            await self.end(tx, run, totals, RunStatus.FAILED, EndReason.INVALID_REPLY, str(exc))
            return
        ids = endpoint.number_calls(reply, taken=set(ROUND_STEPS), prefix=f"call_{run.round}_")
        mode = rules.mode_of(profile, conversation, len(self._tools_of(run)))
        if mode in ("route", "category"):
            await self._chose(tx, run, mode, reply.text, totals)
            return
        entries = [("assistant", e) for e in reply.entries]
        await run_store.append_messages(tx.conn, run.run_id, run.round, entries, now=tx.now)
        if reply.calls is None and mode == "plan" and rules.planning(conversation):
            read = Read(endpoint=endpoint, calls={}, grounds=rules.grounds_of(run, conversation))
            await self._planned(tx, step, run, read, reply.text, totals, conversation)
            return
        if reply.calls is None:
            sources = [json.dumps(m.message) for m in conversation if m.role != "assistant"]
            sources += [json.dumps(run.context), profile.system]
            claims = rules.ungrounded_claims(reply.text, sources)
            await self._answered(
                tx, run, profile, totals | {"ungrounded_claims": claims}, reply.text
            )
            return
        read = Read(
            endpoint=endpoint, calls=reply.calls, grounds=rules.grounds_of(run, conversation)
        )
        ended = await self._expand(tx, step, run, read, totals, limits)
        if ended is not None:
            reason, detail = ended
            await self._unanswered(tx, run, endpoint, ids, f"not run: {detail}")
            await self.end(tx, run, totals, RunStatus.FAILED, reason, detail)

    async def _answered(
        self,
        tx: TaskWork,
        run: RunRow,
        profile: AgentProfile,
        totals: dict[str, Any],
        answer: str,
    ) -> None:
        """The model answered: the run ends with its answer, unless its profile asks for
        memories; then one more round comes first, the extraction (the run has its answer)."""
        wanted = memory_rules.extraction_wanted(run, profile, totals, now=tx.now)
        if wanted.reason is not None:
            await self._extraction_said(tx, run, {"state": "skipped", "reason": wanted.reason})
        if not wanted.ask:
            await self.end(tx, run, totals, RunStatus.SUCCEEDED, EndReason.ANSWERED, None, answer)
            return
        await self._extraction_said(tx, run, {"state": "asked"})
        number = run.round + 1
        task_id = await self.new_round(tx, run, number)
        values = totals | {"answer": answer, "round": number, "task_id": task_id}
        await run_store.update_run(tx.conn, run, values, now=tx.now)

    async def _extracted(
        self,
        tx: TaskWork,
        step: StepRow,
        run: RunRow,
        profile: AgentProfile,
        output: Any,
        totals: dict[str, Any],
    ) -> None:
        """The extraction's reply: its proposals stored (each checked alone), or why none
        could be; either way the run ends with the answer it already had."""
        try:
            reply = endpoint_of(tx.tool(step)).read(
                output.get("reply") if isinstance(output, dict) else None
            )
            proposals = memory_rules.read_proposals(reply.text)
        except ValueError as exc:  # a ReplyError too
            said = {"state": "failed", "reason": str(exc)}
        else:
            types = profile.memory.extract_types
            said = await self._memory.store(tx.conn, run, step, proposals, types=types, now=tx.now)
        await self._after_extraction(tx, run, totals, said)

    async def _recalled(self, tx: TaskWork, step: StepRow, output: Any) -> None:
        """A run's recall step answered: its memories' vectors are stored, and what the run is
        reminded of is recorded before its model step (which depends on this one) is leased.
        Its output then keeps no vector: those live with the memories, which a delete takes."""
        task = tx.tasks.get(step.task_id)
        run = await self._current(tx, step.task_id, task.run_id if task is not None else None)
        embedded = 0
        if run is not None and run.subject is not None:
            profile = profile_of(tx.tool(step))
            said, embedded = await self._memory.recalled_by_vectors(
                tx.conn, run, profile, step, output
            )
            entry = [(memory_rules.MEMORY_ROLE, said)]
            await run_store.append_messages(tx.conn, run.run_id, run.round, entry, now=tx.now)
            # The embeddings call counts against the run's input tokens, as its model calls do.
            sent = json.dumps(step.args.get("input"))
            usage = rules.embedding_usage(output, sent_chars=len(sent))
            model = str(step.args.get("model") or profile.model)
            await self._charge(tx, step, run, model, usage, output)
            await run_store.update_run(tx.conn, run, usage.added_to(run), now=tx.now)
        await self._memory.put_down(tx.conn, step, output, embedded=embedded)

    async def _recall_failed(
        self, tx: TaskWork, run: RunRow, recall: StepRow, conversation: Sequence[RunMessage]
    ) -> None:
        """A run's recall step ended without its vectors (so its model step was skipped): the
        run recalls by full text, saying why, and its round starts again with the model's call
        alone (a task of the same round number)."""
        why = (recall.error or {}).get("message") or f"it ended {recall.status}"
        if run.subject is not None and not any(
            m.role == memory_rules.MEMORY_ROLE for m in conversation
        ):
            profile = profile_of(self._work.registry.get(run.agent, run.agent_version))
            said = await self._memory.recalled_without_vectors(
                tx.conn, run, profile, f"the embeddings call failed: {why}"
            )
            entry = [(memory_rules.MEMORY_ROLE, said)]
            await run_store.append_messages(tx.conn, run.run_id, run.round, entry, now=tx.now)
        task_id = await self.new_round(tx, run, run.round)
        await run_store.update_run(tx.conn, run, {"task_id": task_id}, now=tx.now)

    async def _extraction_ended(self, tx: TaskWork, run: RunRow, task: TaskRow) -> None:
        """The extraction's round ended without its reply (the model's call failed, the
        deadline passed): it stored nothing, and the run still ends with its answer."""
        steps = await tx.steps_of(task.task_id)
        model = next((s for s in steps if s.step_id == MODEL_STEP), None)
        why = ((model.error if model is not None else None) or {}).get("message")
        reason = "the extraction's model call did not answer" + (f": {why}" if why else "")
        await self._after_extraction(tx, run, {}, {"state": "failed", "reason": reason})

    async def _after_extraction(
        self, tx: TaskWork, run: RunRow, totals: Mapping[str, Any], said: dict[str, Any]
    ) -> None:
        await self._extraction_said(tx, run, said)
        values = dict(totals) | {"ungrounded_claims": run.ungrounded_claims}
        await self.end(tx, run, values, RunStatus.SUCCEEDED, EndReason.ANSWERED, None, run.answer)

    async def _extraction_said(self, tx: TaskWork, run: RunRow, said: dict[str, Any]) -> None:
        entry = [(memory_rules.EXTRACTION_ROLE, said)]
        await run_store.append_messages(tx.conn, run.run_id, run.round, entry, now=tx.now)

    def _tools_of(self, run: RunRow) -> list[ToolSpec]:
        """The tools a run's model may call, as the catalogue has them now (enabled ones)."""
        catalog = self._work.registry.catalog
        return [t for name in run.tools if (t := catalog.get(name)) is not None and t.enabled]

    async def _chose(
        self, tx: TaskWork, run: RunRow, mode: str, text: str, totals: dict[str, Any]
    ) -> None:
        """A router's or a category's choice, recorded in the run (not in the conversation the
        model reads): what the next round does follows from it."""
        if mode == "route":
            route, reason = planner.read_route(text)
            said: dict[str, Any] = {"route": route, "reason": reason}
        else:
            names = list(planner.categories(self._tools_of(run)))
            category, reason = planner.read_category(text, names)
            said = {"category": category, "reason": reason}
        await run_store.append_messages(tx.conn, run.run_id, run.round, [(mode, said)], now=tx.now)
        await run_store.update_run(tx.conn, run, totals, now=tx.now)

    async def _charge(
        self,
        tx: TaskWork,
        step: StepRow,
        run: RunRow,
        model: str,
        usage: rules.Usage,
        output: Any,
    ) -> None:
        """Count a model call at commit (metrics), and record what it was charged beside what
        its reply claimed (a `model_usage` event of its round's task)."""
        tokens = {
            "input": usage.input_tokens,
            "output": usage.output_tokens,
            "cached": usage.cached_tokens,
        }
        self._work.metrics.model_called(tx.conn, run, model, tokens, usage.cost)
        reported = output.get("usage") if isinstance(output, dict) else None
        charged = {"model": model, "charged": tokens, "cost": usage.cost}
        await event_log.append_events(
            tx.conn,
            [
                event_log.NewEvent(
                    task_id=step.task_id,
                    step_id=step.step_id,
                    kind="model_usage",
                    attempt=step.attempt,
                    data=charged | {"reported": reported, "round": run.round},
                    created_at=tx.now,
                )
            ],
        )

    async def _planned(  # noqa: PLR0913, PLR0917 - the planning round as read, all of it used
        self,
        tx: TaskWork,
        step: StepRow,
        run: RunRow,
        read: Read,
        text: str,
        totals: dict[str, Any],
        conversation: Sequence[RunMessage],
    ) -> None:
        """Planner mode: the model's plan joins the round (read as any submitted plan); a plan
        refused goes back to the model once with its problems, a second ends the run."""
        limits = Limits.model_validate(run.limits)
        spent = rules.over_budget(totals, limits)
        if spent is not None:
            detail = f"spent {spent}"
            await self.end(tx, run, totals, RunStatus.FAILED, EndReason.BUDGET_EXHAUSTED, detail)
            return
        task = tx.tasks[step.task_id]
        try:
            plan = parse_plan(
                planner.read_plan(text),
                self._work.registry.catalog,
                dialect="plan",
                permits=set(run.tools).__contains__,
                environment=task.environment,
                grounds=read.grounds,
            )
        except (ValueError, PlanInvalidError) as exc:
            problems = (
                list(exc.problems)
                if isinstance(exc, PlanInvalidError)
                else [Problem(pointer="", code=ProblemCode.INVALID_TYPE, detail=str(exc))]
            )
            await self._refused_plan(tx, run, read.endpoint, problems, totals, conversation)
            return
        await self._add_calls(tx, task, plan)
        await run_store.update_run(tx.conn, run, totals, now=tx.now)

    async def _refused_plan(
        self,
        tx: TaskWork,
        run: RunRow,
        endpoint: EndpointKind,
        problems: list[Problem],
        totals: dict[str, Any],
        conversation: Sequence[RunMessage],
    ) -> None:
        earlier = [
            m.message.get("problems", []) for m in rules.this_turn(conversation, "controller")
        ]
        found = [{"pointer": p.pointer, "code": p.code, "detail": p.detail} for p in problems]
        if earlier:  # the second plan refused: the run ends with both sets of problems
            message = (
                f"the model's plan was refused twice ({len(found)} problem(s) the second time)"
            )
            error = {
                "code": EndReason.INVALID_PLAN,
                "message": message,
                "problems": [*earlier, found],
            }
            await self.end(
                tx, run, totals, RunStatus.FAILED, EndReason.INVALID_PLAN, message, error=error
            )
            return
        said = endpoint.user(planner.refusal(problems)) | {"problems": found}
        await run_store.append_messages(
            tx.conn, run.run_id, run.round, [("controller", said)], now=tx.now
        )
        await run_store.update_run(tx.conn, run, totals, now=tx.now)

    async def _expand(
        self,
        tx: TaskWork,
        step: StepRow,
        run: RunRow,
        read: Read,
        totals: dict[str, Any],
        limits: Limits,
    ) -> tuple[str, str] | None:
        """The reply's calls as the round's steps; (reason, detail) when the run must end."""
        spent = rules.over_budget(totals, limits)
        if spent is not None:
            return EndReason.BUDGET_EXHAUSTED, f"spent {spent}"
        task = tx.tasks[step.task_id]
        allowed = set(run.tools)
        try:
            plan = parse_plan(
                read.calls,
                self._work.registry.catalog,
                dialect=read.endpoint.dialect,
                permits=allowed.__contains__,
                environment=task.environment,
                grounds=read.grounds,
            )
        except PlanInvalidError as exc:
            said = "; ".join(f"{p.pointer or '/'}: {p.detail}" for p in exc.problems[:5])
            return EndReason.INVALID_REPLY, f"the model's tool calls were refused: {said}"
        counts, looping = rules.counted_calls(run.calls, [(s.tool, s.args) for s in plan.steps])
        if looping is not None:
            detail = f"tool {looping!r} was called {rules.LOOP_REPEATS} times with one input"
            return EndReason.LOOP_DETECTED, detail
        await self._add_calls(tx, task, plan)
        await run_store.update_run(tx.conn, run, totals | {"calls": counts}, now=tx.now)
        return None

    async def _add_calls(self, tx: TaskWork, task: TaskRow, plan: Plan) -> None:
        data = SubmitInput(
            plan=plan,
            request={},
            principal=task.principal,
            tenant=task.tenant,
            key_id=None,
            environment=task.environment,
        )
        registry = self._work.registry
        rows = step_rows(data, task.task_id, task.trace_id, tx.now, registry)
        model = await tx.steps_of(task.task_id)
        key_id = next((s.key_id for s in model if s.step_id == MODEL_STEP), None)
        first = 1 + max((s.position for s in model if s.step_id in ROUND_STEPS), default=0)
        for row in rows:
            row["position"] += first  # after the model's call (and the recall before it)
            row["key_id"] = key_id
        added = await store.add_steps(tx.conn, rows)
        refused = refusals(added, plan, registry, tx.now)
        if refused:
            await tx.change(refused)

    async def outcome_unknown(self, tx: TaskWork, step: StepRow) -> None:
        """A call of a run's round whose outcome is unknown: by its tool's `if_unknown`, the run
        waits for a person (nothing to do), or the call ends `unverified` for the model to read,
        never run again by itself."""
        tool = tx.tool(step)
        if tool.if_unknown != "tell_model":
            return
        now_unknown = replace(step, status=StepStatus.OUTCOME_UNKNOWN)
        await tx.change([rules.told_unverified(now_unknown, tool, now=tx.now)])

    async def round_ended(self, tx: TaskWork, task: TaskRow, status: TaskStatus) -> None:
        """A round's task ended: its receipts go back to the model in a next round, unless the
        run must end (the model's call failed, a limit, the deadline, a cancel)."""
        run = await self._current(tx, task.task_id, task.run_id)
        if run is None:
            return
        conversation = (await run_store.load_messages(tx.conn, [run.run_id]))[run.run_id]
        if memory_rules.extracting(conversation):
            await self._extraction_ended(tx, run, task)
            return
        if run.deadline is not None and tx.now >= run.deadline:  # the round's task was ended
            detail = "the run's deadline passed"
            await self.end(tx, run, {}, RunStatus.FAILED, EndReason.DEADLINE_EXCEEDED, detail)
            return
        if status == TaskStatus.CANCELLED:
            await self.end(tx, run, {}, RunStatus.CANCELLED, EndReason.CANCELLED, None)
            return
        steps = await tx.steps_of(task.task_id)
        model = next((s for s in steps if s.step_id == MODEL_STEP), None)
        if model is None or model.status != StepStatus.SUCCEEDED:
            await self._unanswered_round(tx, run, steps, conversation)
            return
        endpoint = endpoint_of(self._work.registry.get(model.tool, model.tool_version))
        answers = self._answers(task, steps)
        failed = sum(a.is_error for a in answers)
        self._work.metrics.run_tool_calls(tx.conn, run, failed, len(answers) - failed)
        said = [m.message for m in conversation if m.role == "assistant" and m.round == run.round]
        if endpoint.calls_in(said) or not answers:
            entries = [("tool", m) for m in endpoint.replies(answers)]
        else:  # a plan's steps: their results, in one message the model reads
            lines = [(a.call_id, a.text) for a in answers]
            entries = [("tool", endpoint.user(planner.results(lines)))]
        await run_store.append_messages(tx.conn, run.run_id, run.round, entries, now=tx.now)
        decided = rules.after_round(run, Limits.model_validate(run.limits), now=tx.now)
        if not decided.go_on:
            assert decided.reason is not None
            await self.end(tx, run, {}, RunStatus.FAILED, decided.reason, decided.detail)
            return
        number = run.round + 1
        task_id = await self.new_round(tx, run, number)
        await run_store.update_run(tx.conn, run, {"round": number, "task_id": task_id}, now=tx.now)

    async def _unanswered_round(
        self,
        tx: TaskWork,
        run: RunRow,
        steps: Sequence[StepRow],
        conversation: Sequence[RunMessage],
    ) -> None:
        """A round ended without the model's answer: its recall step failed (the round starts
        again, recalling by full text), or the model's call did (the run ends)."""
        recall = next((s for s in steps if s.step_id == memory_rules.RECALL_STEP), None)
        if recall is not None and recall.status != StepStatus.SUCCEEDED:
            await self._recall_failed(tx, run, recall, conversation)
            return
        model = next((s for s in steps if s.step_id == MODEL_STEP), None)
        error = model.error if model is not None else None
        detail = (error or {}).get("message") or "the model's call failed"
        await self.end(tx, run, {}, RunStatus.FAILED, EndReason.MODEL_FAILED, detail, error=error)

    def _answers(self, task: TaskRow, steps: list[StepRow]) -> list[Answer]:
        """Each call's receipt as the model reads it (a fan-out's children answer as one)."""
        answers = []
        for s in sorted(steps, key=lambda s: s.position):
            if s.step_id in ROUND_STEPS or fanout.parent_of(s.step_id) is not None:
                continue
            text = (
                render_receipt_dict(
                    s.receipt, budget=self._budget, handle=output_handle(task.task_id, s.step_id)
                )
                if s.receipt is not None
                else f"no result: the call ended {s.status}"
            )
            answers.append(
                Answer(call_id=s.step_id, text=text, is_error=s.status != StepStatus.SUCCEEDED)
            )
        return answers

    async def _unanswered(
        self, tx: TaskWork, run: RunRow, endpoint: EndpointKind, ids: list[str], why: str
    ) -> None:
        """Replies for calls that will not run, so the conversation stays well formed."""
        answers = [Answer(call_id=i, text=why, is_error=True) for i in ids]
        entries = [("tool", m) for m in endpoint.replies(answers)]
        await run_store.append_messages(tx.conn, run.run_id, run.round, entries, now=tx.now)

    async def new_round(
        self, tx: TaskWork, run: RunRow, number: int, *, recall: dict[str, Any] | None = None
    ) -> str:
        """Add round `number`'s task: one step, the model's call; with `recall` (the arguments
        of an embed call), the recall step first, on which the model's call depends."""
        spec = self._work.registry.get(run.agent, run.agent_version)
        left = (run.deadline - tx.now).total_seconds() if run.deadline is not None else None
        steps: list[PlannedStep] = []
        if recall is not None:
            steps.append(
                PlannedStep(
                    step_id=memory_rules.RECALL_STEP,
                    tool=run.agent,
                    tool_version=run.agent_version,
                    args=recall,
                    depends_on=(),
                    when=None,
                    position=0,
                )
            )
        steps.append(
            PlannedStep(
                step_id=MODEL_STEP,
                tool=run.agent,
                tool_version=run.agent_version,
                args={"run": run.run_id, "round": number},
                depends_on=tuple(s.step_id for s in steps),
                when=None,
                position=len(steps),
            )
        )
        plan = Plan(
            goal=f"round {number} of run {run.run_id}",
            steps=tuple(steps),
            context=run.context,
            source=endpoint_of(spec).dialect,
            deadline_s=max(left, 1.0) if left is not None else None,
            subject=run.subject,  # memory's tools in the round act for it
        )
        data = SubmitInput(
            plan=plan,
            request={"run": run.run_id, "round": number},
            principal=run.principal,
            tenant=run.tenant,
            key_id=run.key_id,
            trace_id=run.trace_id,
            run_id=run.run_id,
        )
        return await self._intake.add(tx, data)

    async def _current(self, tx: TaskWork, task_id: str, run_id: Any) -> RunRow | None:
        """The run whose current round is this task, locked (None if it has moved on)."""
        if not isinstance(run_id, str):
            return None
        run = await run_store.load_run(tx.conn, run_id, lock=True)
        if run is None or run.status in ENDED_RUN_STATES or run.task_id != task_id:
            return None
        return run

    async def end(  # noqa: PLR0913, PLR0917 - how a run ends, all of it recorded
        self,
        tx: TaskWork,
        run: RunRow,
        totals: Mapping[str, Any],
        status: RunStatus,
        reason: str,
        detail: str | None,
        answer: str | None = None,
        *,
        error: dict[str, Any] | None = None,
    ) -> None:
        values = dict(totals) | ended_values(status, reason, tx.now) | {"answer": answer}
        if status == RunStatus.FAILED:
            values["error"] = error or {"code": reason, "message": detail}
        await run_store.update_run(tx.conn, run, values, now=tx.now)
        claims = values.get("ungrounded_claims")
        self._work.metrics.run_ended(tx.conn, run, status, reason, ungrounded=bool(claims))
