"""Agent runs as their callers see them: start, continue, cancel, read.

A run is a sequence of rounds, each a task whose first step calls the agent's model (a `model`
tool: tools/agents.py). What moves the rounds on, inside the transactions that move their tasks,
is `Rounds` (services/rounds.py), the unit of work's run hooks; this service makes a run's first
round and the first round of each new message, and answers for a run's state. The conversation
is stored once per run, entry by entry (storage/runs.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from agent_reach.ids import new_task_id, new_trace_id
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
)
from agent_reach_controller.planning.endpoints import EndpointKind
from agent_reach_controller.services.intake import IdempotencyConflictError, IntakeService
from agent_reach_controller.services.memory import MemoryService
from agent_reach_controller.services.rounds import Rounds, ended_values, endpoint_of
from agent_reach_controller.services.run_memory import RunMemory
from agent_reach_controller.services.unit_of_work import TaskWork, UnitOfWork
from agent_reach_controller.storage import idempotency
from agent_reach_controller.storage import runs as run_store
from agent_reach_controller.storage import steps as store
from agent_reach_controller.tools.agents import MODEL_CONNECTOR, AgentProfile, profile_of
from agent_reach_controller.tools.catalog import ToolSpec

# How many times a start retries when the first holder of its Idempotency-Key vanishes between
# the conflict and the look-up (only if the key's record is deleted meanwhile).
_KEY_RACES = 3
# What a run waits for a person on (RunStatus.WAITING, shown while a step of its round is so).
_A_PERSONS = frozenset({StepStatus.AWAITING_APPROVAL, StepStatus.OUTCOME_UNKNOWN})


def _key_scope(principal: str) -> str:
    """Whose Idempotency-Keys a run's is one of: the caller's runs', apart from its tasks'."""
    return f"runs:{principal}"


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
    # A caller's Idempotency-Key: one run per (principal, key); `fingerprint` is what a repeat
    # must match (the request's hash), else IdempotencyConflictError.
    idempotency_key: str | None = None
    fingerprint: str = ""


class RunService:
    """Starts, continues and cancels runs, and reads them; `rounds_keeper` moves them on."""

    def __init__(
        self,
        *,
        work: UnitOfWork,
        intake: IntakeService,
        memory: MemoryService,
        receipt_budget: int,
    ) -> None:
        self._work = work
        # What runs remember of their subjects: recall at the start, extraction at the end.
        self._memory = RunMemory(memory)
        self._subjects = memory  # how the audit log names a subject (an HMAC)
        # What moves a run's rounds (the unit of work's hooks) and builds its model requests.
        self.rounds_keeper = Rounds(
            work=work, intake=intake, memory=self._memory, receipt_budget=receipt_budget
        )

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
        return endpoint_of(spec)

    # -- what callers ask -------------------------------------------------------------------------

    async def start(self, data: StartRun) -> RunRow:
        """A new run, its first round queued; with an Idempotency-Key another start already
        took, that start's run (nothing new is stored)."""
        for _ in range(_KEY_RACES):
            try:
                return await self._start(data)
            except idempotency.KeyTakenError:
                pass
            started = await self._started(data)
            if started is not None:
                return started
        raise RuntimeError("an Idempotency-Key kept appearing and vanishing")  # pragma: no cover

    async def _started(self, data: StartRun) -> RunRow | None:
        """The run an Idempotency-Key already started (None if its record is gone)."""
        assert data.idempotency_key is not None
        async with self._work.db.transaction() as conn:
            stored = await idempotency.load_idempotency_key(
                conn, _key_scope(data.principal), data.idempotency_key
            )
            if stored is None:
                return None
            fingerprint, run_id = stored
            if fingerprint != data.fingerprint:
                raise IdempotencyConflictError(run_id)
            return await run_store.load_run(conn, run_id)

    async def _start(self, data: StartRun) -> RunRow:
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
            if data.idempotency_key is not None:
                key = {
                    "principal": _key_scope(data.principal),
                    "key": data.idempotency_key,
                    "request_hash": data.fingerprint,
                    "task_id": run_id,  # the run this key started
                    "created_at": now,
                }
                await idempotency.claim_idempotency_key(tx.conn, key)
            # What the run's prompt is reminded of (data, not orders): recalled now by full
            # text, or by its first round's recall step (embeddings) before the model's call.
            recall = await self._memory.starting(
                tx.conn,
                tenant=data.tenant,
                subject=data.subject,
                profile=profile,
                messages=data.input,
            )
            task_id = await self.rounds_keeper.new_round(tx, run, 1, recall=recall.embed)
            await run_store.insert_run(tx.conn, row | {"task_id": task_id})
            await run_store.append_messages(
                tx.conn, run_id, 1, [("user", m) for m in data.input], now=now
            )
            if recall.record is not None:
                entry = [(memory_rules.MEMORY_ROLE, recall.record)]
                await run_store.append_messages(tx.conn, run_id, 1, entry, now=now)
            await tx.audit(
                actor=data.principal,
                tenant=data.tenant,
                action="run.start",
                target=f"run:{run_id}",
                data={
                    "agent": spec.name,
                    "version": spec.version,
                    # Named by HMAC: the log outlives a forget and must not hold the subject.
                    "subject": None
                    if data.subject is None
                    else await self._subjects.subject_mark(tx.conn, data.tenant, data.subject),
                },
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
            task_id = await self.rounds_keeper.new_round(tx, run, number)
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
            values = ended_values(RunStatus.CANCELLED, EndReason.CANCELLED, tx.now)
            await run_store.update_run(tx.conn, run, values, now=tx.now)
            self._work.metrics.run_ended(
                tx.conn, run, RunStatus.CANCELLED, EndReason.CANCELLED, ungrounded=False
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
        return [(rules.round_of(goal), task_id, status) for task_id, status, goal in found]

    async def waiting(self, runs: Sequence[RunRow]) -> dict[str, list[StepRow]]:
        """For each running run of `runs` whose round waits for a person, the steps it waits on
        (one read for them all)."""
        current = {
            r.task_id: r.run_id
            for r in runs
            if r.status not in ENDED_RUN_STATES and r.task_id is not None
        }
        if not current:
            return {}
        async with self._work.db.transaction() as conn:
            steps = await store.load_steps(conn, current)
        found: dict[str, list[StepRow]] = {}
        for step in steps:
            if step.status in _A_PERSONS:
                found.setdefault(current[step.task_id], []).append(step)
        return found

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

    async def _load(self, tx: TaskWork, run_id: str, tenant: str, *, lock: bool = False) -> RunRow:
        run = await run_store.load_run(tx.conn, run_id, lock=lock)
        if run is None or run.tenant != tenant:
            raise RunNotFoundError(run_id)
        return run

    # -- the lease and the replay: a model step's request, from the stored conversation -----------

    async def with_requests(self, claimed: Sequence[StepRow]) -> list[StepRow]:
        """Leased steps, each model step given the request its run's conversation makes now."""
        return await self.rounds_keeper.with_requests(claimed)

    def request_for(self, run: RunRow, spec: ToolSpec, conversation: Sequence[RunMessage]) -> Any:
        """The model request a run's conversation makes (a replay shows it for each round)."""
        return self.rounds_keeper.request_for(run, spec, conversation)
