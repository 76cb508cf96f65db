"""Agent runs: the model's loop, on the server, as a sequence of rounds that are tasks.

A round is a task whose first step calls the agent's model (a `model` tool: tools/agents.py).
When that step succeeds, its reply is read in the transaction that records it: the tool calls it
asks for become the round's next steps through the same planning a caller's turn takes (a tool
the run may not use is refused as that call, and the model reads why); no call means the run has
its answer. When the round's task ends, its receipts go back into the conversation and the next
round's task is made, in the transaction that ended the round. No coroutine waits on a run: any
replica continues any run, and a kill loses nothing a commit recorded.

The conversation is stored once per run, entry by entry; a model step carries only its run and
round, and the request is built from the stored conversation when the step is leased.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from agent_reach.ids import new_task_id, new_trace_id
from agent_reach.states import StepStatus, TaskStatus
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
from agent_reach_controller.services.unit_of_work import TaskWork, UnitOfWork
from agent_reach_controller.storage import events as event_log
from agent_reach_controller.storage import runs as run_store
from agent_reach_controller.storage import steps as store
from agent_reach_controller.tools.agents import MODEL_CONNECTOR, AgentProfile, Limits, profile_of
from agent_reach_controller.tools.catalog import ToolSpec

# Entries that record a choice about the run (a router's, a category's), never sent to the model.
_CHOICES = frozenset({"route", "category"})
# What a run waits for a person on (RunStatus.WAITING, shown while a step of its round is so).
_A_PERSONS = frozenset({StepStatus.AWAITING_APPROVAL, StepStatus.OUTCOME_UNKNOWN})
# The step of a round that calls the model (a tool call's id never takes it: see number_calls).
MODEL_STEP = "model"


class AgentNotFoundError(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no agent named {name!r}")
        self.name = name


class RunNotFoundError(LookupError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} not found")
        self.run_id = run_id


class RunInputError(ValueError):
    """A run's input that cannot be taken: where (a JSON pointer) and why."""

    def __init__(self, pointer: str, detail: str) -> None:
        super().__init__(f"{pointer}: {detail}")
        self.pointer = pointer
        self.detail = detail


class RunStateError(Exception):
    """What was asked does not fit where the run is (continue a running run, say)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StartRun:
    agent: str
    input: list[dict[str, Any]]  # the caller's messages, in the agent's endpoint's shape
    principal: str
    tenant: str
    key_id: str | None = None
    subject: str | None = None
    context: dict[str, Any]
    limits: Mapping[str, Any]  # the caller's overrides (they only tighten)
    tools: list[str]  # what the model may call: the profile's patterns cut to the caller's rights
    trace_id: str | None = None
    version: str | None = None  # the agent's version to run; None: its current one


@dataclass(frozen=True, slots=True, kw_only=True)
class Read:
    """A model's reply that asks for tools, read: what its calls are, and what grounds them."""

    endpoint: EndpointKind
    calls: dict[str, Any]
    grounds: dict[str, Any]


def _grounds(run: RunRow, conversation: Sequence[RunMessage]) -> dict[str, Any]:
    """What a grounded argument may come from in a run: the caller's context and messages, and
    every tool result the model has read; never the model's own words."""
    return {
        "context": run.context,
        "input": [m.message for m in conversation if m.role == "user"],
        "read": [m.message for m in conversation if m.role == "tool"],
    }


class RunService:
    """Starts, continues and cancels runs, and moves them on as their rounds end."""

    def __init__(self, *, work: UnitOfWork, intake: IntakeService, receipt_budget: int) -> None:
        self._work = work
        self._intake = intake
        self._budget = receipt_budget

    # -- profiles ---------------------------------------------------------------------------------

    def profile(self, name: str) -> tuple[ToolSpec, AgentProfile]:
        """An agent's current catalogue entry and profile (AgentNotFoundError if none)."""
        spec = self._work.registry.catalog.get(name)
        if spec is None or spec.connector != MODEL_CONNECTOR:
            raise AgentNotFoundError(name)
        return spec, profile_of(spec)

    async def agent(self, name: str, version: str | None = None) -> tuple[ToolSpec, AgentProfile]:
        """An agent's profile: its current version, or the `version` named (an earlier one, to
        compare); AgentNotFoundError when there is no such agent or version."""
        if version is None:
            return self.profile(name)
        try:
            spec = await self._work.registry.version(name, version)
        except LookupError:
            raise AgentNotFoundError(f"{name}@{version}") from None
        if spec.connector != MODEL_CONNECTOR:
            raise AgentNotFoundError(name)
        return spec, profile_of(spec)

    def endpoint(self, spec: ToolSpec) -> EndpointKind:
        return ENDPOINTS[str(spec.config["endpoint"])]

    # -- what callers ask -------------------------------------------------------------------------

    async def start(self, data: StartRun) -> RunRow:
        spec, profile = await self.agent(data.agent, data.version)
        limits = profile.limits.overridden(dict(data.limits))
        run_id = new_task_id()
        async with self._work.begin() as tx:
            now = tx.now
            deadline = now + timedelta(seconds=limits.deadline) if limits.deadline else None
            row: dict[str, Any] = {
                "run_id": run_id,
                "tenant": data.tenant,
                "principal": data.principal,
                "key_id": data.key_id,
                "trace_id": data.trace_id or new_trace_id(),
                "agent": spec.name,
                "agent_version": spec.version,
                "subject": data.subject,
                "context": data.context,
                "status": RunStatus.RUNNING,
                "end_reason": None,
                "round": 1,
                "task_id": None,
                "limits": limits.model_dump(mode="json"),
                "tools": data.tools,
                "input_tokens": 0,
                "output_tokens": 0,
                "cached_tokens": 0,
                "cost": 0.0,
                "answer": None,
                "ungrounded_claims": None,
                "error": None,
                "calls": {},
                "turn_start": 1,
                "version": 1,
                "created_at": now,
                "updated_at": now,
                "finished_at": None,
                "deadline": deadline,
            }
            run = RunRow.from_mapping(row)
            task_id = await self._round(tx, run, 1)
            await run_store.insert_run(tx.conn, row | {"task_id": task_id})
            await run_store.append_messages(
                tx.conn, run_id, 1, [("user", m) for m in data.input], now=now
            )
            await tx.audit(
                actor=data.principal,
                tenant=data.tenant,
                action="run.start",
                target=f"run:{run_id}",
                data={"agent": spec.name, "version": spec.version, "subject": data.subject},
            )
        return replace(run, task_id=task_id)

    async def continue_run(
        self, run_id: str, tenant: str, messages: list[dict[str, Any]], *, actor: str
    ) -> RunRow:
        """A caller's next message to a run that ended (or answered): a new turn, new rounds."""
        async with self._work.begin() as tx:
            run = await self._load(tx, run_id, tenant, lock=True)
            if run.status not in ENDED_RUN_STATES:
                raise RunStateError(f"run {run_id} is {run.status}: wait for it to end")
            number = run.round + 1
            await run_store.append_messages(
                tx.conn, run_id, number, [("user", m) for m in messages], now=tx.now
            )
            task_id = await self._round(tx, run, number)
            values: dict[str, Any] = {
                "status": RunStatus.RUNNING,
                "end_reason": None,
                "error": None,
                "answer": None,
                "round": number,
                "turn_start": number,
                "task_id": task_id,
                "finished_at": None,
            }
            await run_store.update_run(tx.conn, run, values, now=tx.now)
            await tx.audit(
                actor=actor, tenant=tenant, action="run.continue", target=f"run:{run_id}", data={}
            )
        return replace(run, **values)

    async def cancel(self, run_id: str, tenant: str, *, actor: str) -> RunRow:
        """Stop a run: its round's task is cancelled (what runs now ends as cancelled)."""
        async with self._work.begin() as tx:
            run = await self._load(tx, run_id, tenant)
            task = await tx.lock_task(run.task_id) if run.task_id else None
            run = await self._load(tx, run_id, tenant, lock=True)  # after the task: lock order
            if run.status in ENDED_RUN_STATES:
                return run
            if task is not None and task.status not in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
                await tx.request_cancel(task)
            values = _ended(RunStatus.CANCELLED, EndReason.CANCELLED, tx.now)
            await run_store.update_run(tx.conn, run, values, now=tx.now)
            self._work.metrics.run_ended(
                tx.conn, run.agent, RunStatus.CANCELLED, EndReason.CANCELLED
            )
            await tx.audit(
                actor=actor, tenant=tenant, action="run.cancel", target=f"run:{run_id}", data={}
            )
        return replace(run, **values)

    async def read(self, run_id: str, tenant: str) -> tuple[RunRow, list[RunMessage]]:
        async with self._work.db.transaction() as conn:
            run = await run_store.load_run(conn, run_id)
            if run is None or run.tenant != tenant:
                raise RunNotFoundError(run_id)
            return run, (await run_store.load_messages(conn, [run_id]))[run_id]

    async def rounds(self, run: RunRow) -> list[tuple[int, str, str]]:
        """The run's rounds still kept: (round, task_id, status), oldest first."""
        async with self._work.db.transaction() as conn:
            found = await run_store.rounds_of(conn, run.run_id)
        return [(_round_of(goal), task_id, status) for task_id, status, goal in found]

    async def waiting_for(self, run: RunRow) -> list[StepRow]:
        """The steps of a running run's round that wait for a person: an approval, or a
        verdict on an outcome nobody knows."""
        if run.status in ENDED_RUN_STATES or run.task_id is None:
            return []
        async with self._work.db.transaction() as conn:
            steps = await store.load_steps(conn, [run.task_id])
        return [s for s in steps if s.status in _A_PERSONS]

    async def listed(self, tenant: str, *, limit: int, before: str | None) -> list[RunRow]:
        async with self._work.db.transaction() as conn:
            return await run_store.list_runs(conn, tenant, limit=limit, before=before)

    # -- the lease: a model step's request, from the stored conversation ---------------------------

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
        tools = self._tools_of(run)
        limits = Limits.model_validate(run.limits)
        system, schema, mode = profile.system, None, _mode(profile, conversation, len(tools))
        if mode == "route":  # the router: how to handle the message, said in JSON
            system = _joined(system, planner.router_instructions(tools))
            schema, tools = planner.ROUTE_SCHEMA, []
        elif mode == "category":  # many tools: a category first, said in JSON
            by_category = planner.categories(tools)
            system = _joined(system, planner.category_instructions(by_category))
            schema, tools = planner.category_schema(list(by_category)), []
        elif mode == "plan":  # a plan is written without tools, then answered without
            if _planning(conversation):
                system = _joined(system, planner.instructions(tools))
                schema = planner.PLAN_SCHEMA
            tools = []
        elif mode == "answer":
            tools = []
        elif (chosen := _chosen_category(conversation)) is not None:
            tools = [t for t in tools if planner.category_of(t) == chosen]
        ask = Ask(
            model=profile.model,
            system=system,
            messages=[m.message for m in conversation if m.role not in _CHOICES],
            tools=tools,
            temperature=profile.temperature,
            max_tokens=rules.max_tokens(run, limits),
            note=rules.stage_note(run, limits, goal=_goal(conversation)),
            reply_schema=schema,
            reply_name=mode,
        )
        return self.endpoint(spec).request(ask)

    # -- the unit of work's hooks: a model step answered, a round ended ---------------------------

    async def model_answered(self, tx: TaskWork, step: StepRow, output: Any) -> None:
        """A round's model call succeeded: its reply joins the conversation, and its tool calls
        join the round (or the run has its answer, or a limit ends it)."""
        run = await self._current(tx, step.task_id, step.args.get("run"))
        if run is None:
            return
        spec = tx.tool(step)
        profile, endpoint = profile_of(spec), self.endpoint(spec)
        limits = Limits.model_validate(run.limits)
        conversation = (await run_store.load_messages(tx.conn, [run.run_id]))[run.run_id]
        sent = json.dumps(self._request(run, spec, conversation))
        usage = rules.usage_of(output, sent_chars=len(sent), prices=profile.prices)
        totals = usage.added_to(run)
        await self._charge(tx, step, run, profile.model, usage, output)
        try:
            reply = endpoint.read(output.get("reply") if isinstance(output, dict) else None)
        except ReplyError as exc:
            await self._end(tx, run, totals, RunStatus.FAILED, EndReason.INVALID_REPLY, str(exc))
            return
        ids = endpoint.number_calls(reply, taken={MODEL_STEP}, prefix=f"call_{run.round}_")
        mode = _mode(profile, conversation, len(self._tools_of(run)))
        if mode in ("route", "category"):
            await self._chose(tx, run, mode, reply.text, totals)
            return
        entries = [("assistant", e) for e in reply.entries]
        await run_store.append_messages(tx.conn, run.run_id, run.round, entries, now=tx.now)
        if reply.calls is None and mode == "plan" and _planning(conversation):
            read = Read(endpoint=endpoint, calls={}, grounds=_grounds(run, conversation))
            await self._planned(tx, step, run, read, reply.text, totals, conversation)
            return
        if reply.calls is None:
            sources = [json.dumps(m.message) for m in conversation if m.role != "assistant"]
            sources += [json.dumps(run.context), profile.system]
            claims = rules.ungrounded_claims(reply.text, sources)
            await self._end(
                tx,
                run,
                totals | {"ungrounded_claims": claims},
                RunStatus.SUCCEEDED,
                EndReason.ANSWERED,
                None,
                reply.text,
            )
            return
        read = Read(endpoint=endpoint, calls=reply.calls, grounds=_grounds(run, conversation))
        ended = await self._expand(tx, step, run, read, totals, limits)
        if ended is not None:
            reason, detail = ended
            await self._unanswered(tx, run, endpoint, ids, f"not run: {detail}")
            await self._end(tx, run, totals, RunStatus.FAILED, reason, detail)

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
        self._work.metrics.model_called(tx.conn, run.agent, model, tokens, usage.cost)
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
            await self._end(tx, run, totals, RunStatus.FAILED, EndReason.BUDGET_EXHAUSTED, detail)
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
        earlier = [m.message.get("problems", []) for m in _this_turn(conversation, "controller")]
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
            await self._end(
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
        for row in rows:
            row["position"] += 1  # the model's call is the round's first step
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
        if run.deadline is not None and tx.now >= run.deadline:  # the round's task was ended
            detail = "the run's deadline passed"
            await self._end(tx, run, {}, RunStatus.FAILED, EndReason.DEADLINE_EXCEEDED, detail)
            return
        if status == TaskStatus.CANCELLED:
            await self._end(tx, run, {}, RunStatus.CANCELLED, EndReason.CANCELLED, None)
            return
        steps = await tx.steps_of(task.task_id)
        model = next((s for s in steps if s.step_id == MODEL_STEP), None)
        if model is None or model.status != StepStatus.SUCCEEDED:
            error = model.error if model is not None else None
            detail = (error or {}).get("message") or "the model's call failed"
            await self._end(
                tx, run, {}, RunStatus.FAILED, EndReason.MODEL_FAILED, detail, error=error
            )
            return
        endpoint = self.endpoint(self._work.registry.get(model.tool, model.tool_version))
        answers = self._answers(task, steps)
        conversation = (await run_store.load_messages(tx.conn, [run.run_id]))[run.run_id]
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
            await self._end(tx, run, {}, RunStatus.FAILED, decided.reason, decided.detail)
            return
        number = run.round + 1
        task_id = await self._round(tx, run, number)
        await run_store.update_run(tx.conn, run, {"round": number, "task_id": task_id}, now=tx.now)

    def _answers(self, task: TaskRow, steps: list[StepRow]) -> list[Answer]:
        """Each call's receipt as the model reads it (a fan-out's children answer as one)."""
        answers = []
        for s in sorted(steps, key=lambda s: s.position):
            if s.step_id == MODEL_STEP or fanout.parent_of(s.step_id) is not None:
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

    # -- helpers ----------------------------------------------------------------------------------

    async def _round(self, tx: TaskWork, run: RunRow, number: int) -> str:
        """Add round `number`'s task: one step, the model's call."""
        spec = self._work.registry.get(run.agent, run.agent_version)
        left = (run.deadline - tx.now).total_seconds() if run.deadline is not None else None
        model = PlannedStep(
            step_id=MODEL_STEP,
            tool=run.agent,
            tool_version=run.agent_version,
            args={"run": run.run_id, "round": number},
            depends_on=(),
            when=None,
            position=0,
        )
        plan = Plan(
            goal=f"round {number} of run {run.run_id}",
            steps=(model,),
            context=run.context,
            source=self.endpoint(spec).dialect,
            deadline_s=max(left, 1.0) if left is not None else None,
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

    async def _load(self, tx: TaskWork, run_id: str, tenant: str, *, lock: bool = False) -> RunRow:
        run = await run_store.load_run(tx.conn, run_id, lock=lock)
        if run is None or run.tenant != tenant:
            raise RunNotFoundError(run_id)
        return run

    async def _current(self, tx: TaskWork, task_id: str, run_id: Any) -> RunRow | None:
        """The run whose current round is this task, locked (None if it has moved on)."""
        if not isinstance(run_id, str):
            return None
        run = await run_store.load_run(tx.conn, run_id, lock=True)
        if run is None or run.status in ENDED_RUN_STATES or run.task_id != task_id:
            return None
        return run

    async def _end(  # noqa: PLR0913, PLR0917 - how a run ends, all of it recorded
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
        values = dict(totals) | _ended(status, reason, tx.now) | {"answer": answer}
        if status == RunStatus.FAILED:
            values["error"] = error or {"code": reason, "message": detail}
        await run_store.update_run(tx.conn, run, values, now=tx.now)
        self._work.metrics.run_ended(tx.conn, run.agent, status, reason)


def _this_turn(conversation: Sequence[RunMessage], role: str) -> list[RunMessage]:
    """The entries of `role` since the caller's latest message."""
    found: list[RunMessage] = []
    for m in conversation:
        if m.role == "user":
            found = []
        elif m.role == role:
            found.append(m)
    return found


def _mode(profile: AgentProfile, conversation: Sequence[RunMessage], tools: int) -> str:
    """How the next reply is read: `route` (the router's call), `category` (a category of many
    tools), or the profile's mode, or in `auto` what the router chose for the caller's latest
    message."""
    mode: str = profile.mode
    if mode == "auto":
        routed = _this_turn(conversation, "route")
        if not routed:
            return "route"
        mode = str(routed[-1].message.get("route", "react"))
    many = tools > profile.category_threshold
    if mode == "react" and many and not _this_turn(conversation, "category"):
        return "category"
    return mode


def _chosen_category(conversation: Sequence[RunMessage]) -> str | None:
    chosen = _this_turn(conversation, "category")
    name = chosen[-1].message.get("category") if chosen else None
    return name if isinstance(name, str) else None


def _joined(*parts: str) -> str:
    return "\n\n".join(p for p in parts if p)


def _planning(conversation: Sequence[RunMessage]) -> bool:
    """Planner mode: whether the next reply is a plan (none has run since the caller spoke)."""
    return not _this_turn(conversation, "tool")


def _round_of(goal: str) -> int:
    """A round's number, from its task's goal (`round N of run …`, as `_round` writes it)."""
    words = goal.split()
    return int(words[1]) if len(words) > 1 and words[1].isdigit() else 0


def _goal(conversation: Sequence[RunMessage]) -> str:
    """The caller's latest words: what the run is for now."""
    for m in reversed(conversation):
        content = m.message.get("content")
        if m.role == "user" and isinstance(content, str):
            return " ".join(content.split())
    return ""


def _ended(status: RunStatus, reason: str, now: datetime) -> dict[str, Any]:
    return {"status": status, "end_reason": reason, "finished_at": now}
