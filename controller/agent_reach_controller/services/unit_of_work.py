"""The unit of work: one transaction over a set of tasks, from their locks to their wake-ups.

Every use case that moves steps does the same five things, in this order, in one transaction:
lock the tasks, apply the decided `StepChange`s, advance (unblock, skip, ask for approval, settle
task statuses), record events and audit rows, and tell the other replicas once it has committed.
`TaskWork` is that sequence, written once:

    async with work.begin() as tx:
        await tx.lock_steps(keys)          # the tasks of these steps, locked; steps and tasks read
        await tx.change(changes)           # compare-and-set; events ride in the commit pipeline
    # committed: advanced (if anything moved), wake-ups and metrics sent

Nothing here decides anything: the deciders in `decide/` do, on the rows read under the locks.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import Counter, defaultdict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

from agent_reach.states import (
    TERMINAL_TASK_STATES,
    StepStatus,
    TaskStatus,
    Transition,
    derive_task_status,
)
from agent_reach.states import target as target_of
from agent_reach_controller import audit
from agent_reach_controller.decide import approvals
from agent_reach_controller.decide.advance import AdvanceInput, budget_for, decide_unblocks
from agent_reach_controller.decide.outcomes import Budget, Decision, terminal_values
from agent_reach_controller.domain.records import StepChange, StepRow, TaskRow
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services import webhooks
from agent_reach_controller.services.held import HeldRowsChanged
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.services.webhooks import WebhookSender
from agent_reach_controller.storage import advance_writes as writes_to
from agent_reach_controller.storage import locks
from agent_reach_controller.storage import steps as store
from agent_reach_controller.storage import tasks as task_store
from agent_reach_controller.storage.engine import Connection, Database
from agent_reach_controller.storage.wakeups import Notifier
from agent_reach_controller.tools.agents import MODEL_CONNECTOR
from agent_reach_controller.tools.catalog import ToolSpec

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Advanced:
    """What an advance pass changed, for wake-ups and answers."""

    ready_connectors: set[str] = field(default_factory=set)
    finished_tasks: set[str] = field(default_factory=set)
    task_status: dict[str, TaskStatus] = field(default_factory=dict)


# Leases what waiting pollers can take of a new task's ready steps (services/handoff.py).
Offer = Callable[[Connection, writes_to.NewTask, datetime], Awaitable[None]]


class RunHooks(Protocol):
    """What an agent run does inside the transaction that moves its round (services/runs.py)."""

    async def model_answered(self, tx: TaskWork, step: StepRow, output: Any) -> None: ...

    async def outcome_unknown(self, tx: TaskWork, step: StepRow) -> None: ...

    async def round_ended(self, tx: TaskWork, task: TaskRow, status: TaskStatus) -> None: ...


# How the events of a step the controller ran itself name its holder (`lease` events).
INTERNAL_EXECUTOR = "controller"


@dataclass(frozen=True, slots=True, kw_only=True)
class InternalCall:
    """A step the controller runs itself, leased to it in the transaction that made it ready."""

    task: TaskRow
    step: StepRow  # leased: running, its arguments resolved
    tool: ToolSpec  # the version the step was validated against
    now: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class InternalOutcome:
    """What a step the controller ran came to: its output, or the error its receipt shows."""

    output: Any = None
    error: dict[str, Any] | None = None  # {code, message, retryable}: the step fails, for good


class InternalSteps(Protocol):
    """Steps of connectors no executor runs (`memory`): each is run where it becomes ready, in
    the transaction that made it so, and its dependants move in the same transaction
    (services/memory_tools.py). None is ever seen ready by a poll, a hand-off or a sweep."""

    connectors: frozenset[str]

    async def run(self, conn: Connection, call: InternalCall) -> InternalOutcome: ...


class TaskWork:
    """One transaction over some tasks: what a use case changes in them goes through here.

    Steps that moved make the unit advance their tasks before it commits; wake-ups are sent
    once it has committed, never if it rolls back.
    """

    def __init__(
        self, work: UnitOfWork, conn: Connection, now: datetime, *, certain: bool = False
    ) -> None:
        self._work = work
        self.conn = conn
        self.now = now
        # Whether changes that cannot lose go with the commit (see `change`).
        self._certain = certain and conn.dialect.name == "postgresql"
        self._waiting = False  # changes are waiting for the commit
        self.tasks: dict[str, TaskRow] = {}  # read under their locks
        self.steps: dict[int, StepRow] = {}  # by key: those `lock_steps` was given
        self._locked: list[str] = []
        # Locked tasks all of whose steps `lock_steps` read, each step (by key) as the changes
        # since left it: their next advance is decided on these rows, and reads none.
        self._whole: dict[str, dict[int, StepRow]] = {}
        self._budgets: dict[str, Budget] | None = None
        self._moved = False  # steps changed since the last advance
        self._connectors: set[str] = set()
        self._finished: set[str] = set()
        # Steps of internal connectors a change made ready (an approval): the advance runs them.
        self._internal_ready: dict[int, StepRow] = {}
        # The rows were kept from the leases (`hold`), not read under the locks.
        self._held = False

    # -- reading under the locks ------------------------------------------------------------------

    async def lock_steps(self, keys: Sequence[int]) -> dict[int, StepRow]:
        """Lock the tasks of these steps, then read the steps and the tasks (in one go)."""
        await self._send_waiting()
        # Read once under the lock: step changes never touch task rows.
        self.tasks, self.steps, whole = await locks.lock_steps(self.conn, keys)
        self._locked = sorted(self.tasks)
        # Not the round of an agent run: its run's hooks (`RunHooks`) add steps to it, which
        # `change` does not see.
        self._whole = {t: {} for t in whole if self.tasks[t].run_id is None}
        for key, step in self.steps.items():
            if step.task_id in self._whole:
                self._whole[step.task_id][key] = step
        await self._work.registry.ensure(
            [(s.tool, s.tool_version) for s in self.steps.values()], conn=self.conn
        )
        return self.steps

    async def hold(self, tasks: dict[str, TaskRow], steps: dict[int, StepRow]) -> bool:
        """Decide on these rows, as this replica leased them, instead of reading them under the
        locks (`lock_steps`): every step of each task is among `steps` (services/held.py).

        Only in a unit begun `certain` (Postgres): its commit locks the tasks ahead of any
        write and raises `HeldRowsChanged`, having written nothing, if a task's version moved or
        a cancel was asked for since; the steps' changes are guarded as always. So does any
        round trip before the commit (a write then would lock a row before its task): the unit
        runs again, reading under the locks (`UnitOfWork.run`). Returns False (nothing taken)
        elsewhere: the caller reads under the locks."""
        if not self._certain or self._waiting or self.tasks:
            return False
        self.tasks, self.steps = tasks, steps
        self._locked = sorted(tasks)
        self._whole = {t: {} for t in tasks}
        for key, step in steps.items():
            self._whole[step.task_id][key] = step
        self._held = True
        await self._work.registry.ensure(
            [(s.tool, s.tool_version) for s in steps.values()], conn=self.conn
        )
        locks.expect_unchanged(self.conn, tasks.values(), refusal=HeldRowsChanged)
        return True

    async def lock_task(self, task_id: str) -> TaskRow | None:
        """Lock one task and read it (None if there is no such task)."""
        await self._send_waiting()
        await locks.lock_tasks(self.conn, [task_id])
        self._locked = [task_id]
        self._whole = {}
        task = await task_store.load_task(self.conn, task_id)
        self.tasks = {task_id: task} if task is not None else {}
        return task

    async def steps_of(self, task_id: str) -> list[StepRow]:
        """Every step of a locked task, with its tool version loaded."""
        await self._send_waiting()
        found = await store.load_steps(self.conn, [task_id])
        await self._work.registry.ensure([(s.tool, s.tool_version) for s in found], conn=self.conn)
        return found

    async def budgets(self) -> dict[str, Budget]:
        """What is left of each locked task's attempt budget (tasks without one left out)."""
        if self._budgets is None:
            await self._send_waiting()
            self._budgets = await self._work.budgets(self.conn, self.tasks)
        return self._budgets

    def tool(self, step: StepRow) -> ToolSpec:
        return self._work.registry.get(step.tool, step.tool_version)

    async def decision(self, step: StepRow) -> Decision:
        """What deciding this step's next move needs: its tool, now, its task's budget."""
        return self._work.decision(
            self.tool(step), self.now, (await self.budgets()).get(step.task_id)
        )

    # -- changing ---------------------------------------------------------------------------------

    async def change(self, changes: Sequence[StepChange]) -> set[int]:
        """Apply decided changes (compare-and-set on each step's status and attempt); returns
        the ids of the steps that moved. Their events are written with the commit.

        In a unit of work begun `certain`, changes that cannot lose are written with the commit
        too, at no round trip of their own: every locked task is held whole, each step is as
        read under the lock, and no agent run's hooks follow (`store.change_steps_at_commit`;
        if one loses after all, committing raises `StepMovedError` and nothing is written).
        """
        # What the advance will read is read in the same round trip (it is stale, and read
        # again, if anything changes the steps before); a task held whole needs nothing read.
        partial = [t for t in self._locked if t not in self._whole]
        if self._cannot_lose(changes, partial):
            # On kept rows, a step that moved is a row gone stale, not a writer that broke the
            # rule: decided again under the locks.
            refusal = HeldRowsChanged if self._held else store.StepMovedError
            moved = await store.change_steps_at_commit(
                self.conn, changes, now=self.now, moved=refusal
            )
            self._waiting = True
        else:
            moved = await store.change_steps(self.conn, changes, now=self.now, advance_of=partial)
            self._waiting = self._waiting and not changes  # if any, sent ahead of these
        self._moved = self._moved or bool(moved)
        for c in changes:
            held = self._whole.get(c.step.task_id)
            if held is not None and c.step.id in moved:
                held[c.step.id] = changed_row(replace(c, step=held[c.step.id]))
        internal = self._work.internal_connectors
        for c in changes if internal else ():
            if (
                c.step.id in moved
                and target_of(c.transition) == StepStatus.READY
                and c.values.get("connector", c.step.connector) in internal
            ):
                self._internal_ready[c.step.id] = changed_row(c)
        runs = self._work.runs
        if runs is not None and moved:
            for c in changes:
                if c.step.id not in moved:
                    continue
                after = target_of(c.transition)
                if c.step.connector == MODEL_CONNECTOR and after == StepStatus.SUCCEEDED:
                    await runs.model_answered(self, c.step, c.values.get("output"))
                elif after == StepStatus.OUTCOME_UNKNOWN and self._in_run(c.step):
                    await runs.outcome_unknown(self, c.step)
        return moved

    def _cannot_lose(self, changes: Sequence[StepChange], partial: Sequence[str]) -> bool:
        if not self._certain or self._waiting or partial or not changes:
            return False
        for change in changes:
            held = self._whole.get(change.step.task_id, {}).get(change.step.id)
            if (
                held is None
                or (held.status, held.attempt) != (change.step.status, change.step.attempt)
                or change.step.connector == MODEL_CONNECTOR
            ):
                return False
        return len({c.step.id for c in changes}) == len(changes)

    async def _send_waiting(self) -> None:
        """Before a read: send the changes waiting for the commit."""
        if self._waiting:
            await store.send_changes_at_commit(self.conn)
            self._waiting = False

    def _in_run(self, step: StepRow) -> bool:
        task = self.tasks.get(step.task_id)
        return task is not None and task.run_id is not None

    async def request_cancel(self, task: TaskRow) -> None:
        """Mark a locked task cancelled: its next advance settles it so."""
        await task_store.request_cancel(self.conn, task.task_id, now=self.now)
        self.tasks[task.task_id] = replace(task, cancel_requested=True)
        self._moved = True

    async def audit(
        self, *, actor: str, tenant: str | None, action: str, target: str, data: Mapping[str, Any]
    ) -> None:
        """An audit row, chained with the others, in this transaction."""
        await audit.record(
            self.conn,
            actor=actor,
            tenant=tenant,
            action=action,
            target=target,
            data=dict(data),
            now=self.now,
        )

    def wake(self, *, connectors: Iterable[str] = (), tasks: Iterable[str] = ()) -> None:
        """Once committed, wake pollers of these connectors and waiters on these tasks."""
        self._connectors.update(connectors)
        self._finished.update(tasks)

    async def advance(self, *, last: bool = False) -> Advanced:
        """Advance the locked tasks now (the unit also does it before committing if steps
        moved since): unblock, skip, ask for approval, settle task statuses. The `last` one,
        after which nothing reads the task rows, writes their statuses with the commit."""
        self._moved = False
        if any(t not in self._whole for t in self.tasks):
            await self._send_waiting()  # the advance reads those tasks' steps
        ready, self._internal_ready = list(self._internal_ready.values()), {}
        whole = {t: sorted(held.values(), key=_position) for t, held in self._whole.items()}
        self._whole = {}  # the advance moves steps these rows would not show
        advanced = await self._work.advance(
            self.conn, now=self.now, tasks=self.tasks, at_commit=last, ready=ready, whole=whole
        )
        self.wake(connectors=advanced.ready_connectors, tasks=advanced.finished_tasks)
        runs = self._work.runs
        if runs is not None:
            for task_id in sorted(advanced.finished_tasks):
                task = self.tasks.get(task_id)
                if task is not None and task.run_id is not None:
                    await runs.round_ended(self, task, advanced.task_status[task_id])
        return advanced

    async def create(self, new: writes_to.NewTask, *, hand_off: Offer | None = None) -> Advanced:
        """Insert a task nobody else can see yet: its first advance is decided on the rows in
        memory, which are then written once, as decided (no lock needed). `hand_off` may lease
        the steps it made ready to waiting pollers first (services/handoff.py)."""
        task = new.task_row()
        advanced = await self._work.advance_loaded(
            self.conn,
            {task.task_id: task},
            {task.task_id: new.step_rows()},
            now=self.now,
            writes=new,
        )
        if hand_off is not None and advanced.ready_connectors:
            await hand_off(self.conn, new, self.now)
            queued = {r["connector"] for _, r in new.rows() if r["status"] == StepStatus.READY}
            advanced.ready_connectors.intersection_update(queued)  # nobody to wake for the rest
            advanced.task_status[task.task_id] = new.task_row().status
        await new.write(self.conn)
        self.wake(connectors=advanced.ready_connectors, tasks=advanced.finished_tasks)
        return advanced

    async def _close(self) -> None:
        if self._moved:
            await self.advance(last=True)
        if self._connectors or self._finished:
            await self._work.notifier.announce(
                self.conn, connectors=self._connectors, tasks=self._finished
            )


class UnitOfWork:
    """Opens `TaskWork`s, and advances tasks: the one place their steps' changes take effect."""

    def __init__(
        self,
        *,
        db: Database,
        registry: ToolRegistry,
        notifier: Notifier,
        metrics: ControllerMetrics,
        approval_ttl: timedelta = timedelta(hours=1),
        announcer: WebhookSender | None = None,
    ) -> None:
        self.db = db
        self.registry = registry
        self.notifier = notifier
        self.metrics = metrics
        self._approval_ttl = approval_ttl
        # Where approval requests are announced (an outbox row per request), if anywhere.
        self._announcer = announcer
        self._rng = random.Random()
        # What agent runs do when a round moves (set once the run service exists).
        self.runs: RunHooks | None = None
        # Who runs the steps of connectors no executor runs (set once memory exists).
        self.internal: InternalSteps | None = None

    @property
    def internal_connectors(self) -> frozenset[str]:
        return self.internal.connectors if self.internal is not None else frozenset()

    @contextlib.asynccontextmanager
    async def begin(
        self, now: datetime | None = None, *, certain: bool = False
    ) -> AsyncIterator[TaskWork]:
        """A unit of work in a new transaction: committed when the block ends without error.

        `certain`: changes that cannot lose are written with the commit (`TaskWork.change`),
        and committing may raise `StepMovedError` (nothing written); `run` begins such units
        and tries again without."""
        async with self.db.transaction() as conn:
            work = TaskWork(self, conn, now or datetime.now(UTC), certain=certain)
            yield work
            await work._close()

    async def run(
        self, body: Callable[[TaskWork], Awaitable[T]], *, now: datetime | None = None
    ) -> T:
        """`body` in a unit of work whose changes that cannot lose go with the commit (one round
        trip fewer). Should one lose after all (a writer that did not take its task's lock),
        nothing was written, and `body` runs again in a unit that sends each change as made."""
        try:
            try:
                async with self.begin(now, certain=True) as tx:
                    return await body(tx)
            except HeldRowsChanged:
                # Decided on rows a task's change made stale: again, reading under the locks
                # (the body has taken the rows it held).
                async with self.begin(now, certain=True) as tx:
                    return await body(tx)
        except store.StepMovedError:
            log.warning(
                "a step changed without its task's lock; its unit of work ran again",
                extra={"event": "step_moved_unlocked"},
            )
        async with self.begin(now) as tx:
            return await body(tx)

    def decision(self, tool: ToolSpec, now: datetime, budget: Budget | None) -> Decision:
        return Decision(
            tool=tool,
            now=now,
            rng=self._rng,
            budget=budget or Budget(),
            tool_named=self.registry.catalog.get,
        )

    async def settle(
        self,
        keys: Sequence[int],
        *,
        now: datetime,
        due: Callable[[StepRow], bool],
        decide: Callable[[StepRow, Decision], StepChange],
    ) -> int:
        """Decide these steps (those still `due` once their tasks are locked) and advance;
        returns how many moved. Sweeps, lost leases and refused leases all end up here."""
        if not keys:
            return 0

        async def body(tx: TaskWork) -> int:
            current = await tx.lock_steps(keys)
            changes = [
                decide(step, await tx.decision(step)) for step in current.values() if due(step)
            ]
            moved = await tx.change(changes)
            applied = [c for c in changes if c.step.id in moved]
            self.metrics.settled(tx.conn, applied)
            tx.wake(connectors={c.values.get("connector", c.step.connector) for c in applied})
            return len(moved)

        return await self.run(body, now=now)

    async def budgets(self, conn: Connection, tasks: Mapping[str, TaskRow]) -> dict[str, Budget]:
        """What is left of each task's attempt budget (tasks without one are left out)."""
        limited = [t for t in tasks.values() if t.max_attempts is not None]
        if not limited:
            return {}
        by_task: dict[str, list[StepRow]] = defaultdict(list)
        for step in await store.load_steps(conn, (t.task_id for t in limited)):
            by_task[step.task_id].append(step)
        return {t.task_id: budget_for(t.max_attempts, by_task[t.task_id]) for t in limited}

    async def advance(
        self,
        conn: Connection,
        *,
        now: datetime,
        tasks: dict[str, TaskRow],
        at_commit: bool = False,
        ready: Sequence[StepRow] = (),
        whole: Mapping[str, list[StepRow]] | None = None,
    ) -> Advanced:
        """Unblock, skip or fail what the current step states of `tasks` allow; settle their
        statuses (written `at_commit` if nothing reads them before: see `writes_to.AtCommit`).
        `ready`: steps of internal connectors a change has just queued, to run with the others.
        `whole`: every step of some of the tasks, as they are now, in position order (nothing
        is read for those).

        The caller holds the tasks' row locks and read `tasks` under them.
        """
        ids = sorted(tasks)
        whole = whole or {}
        read = [t for t in ids if t not in whole]
        # Only blocked steps can move, and only their dependencies' outputs matter; a task's
        # other steps count only through their statuses. (A budget needs every step's attempts.)
        _, rows, counts = await store.load_for_advance(conn, read, with_tasks=False)
        budgeted = [t for t in read if tasks[t].max_attempts is not None]
        if budgeted:
            rows = [r for r in rows if r.task_id not in budgeted]
            rows += await store.load_steps(conn, budgeted)
        rows += [s for t in ids if t in whole for s in whole[t]]
        loaded = {r.id for r in rows}
        rows += [s for s in ready if s.id not in loaded and s.task_id in ids]
        by_task: dict[str, list[StepRow]] = defaultdict(list)
        for step in rows:
            by_task[step.task_id].append(step)
        writes = writes_to.AtCommit(conn) if at_commit else writes_to.Stored(conn)
        counts = {t: counts.get(t, Counter()) for t in read}
        return await self.advance_loaded(
            conn, tasks, by_task, now=now, counts=counts, writes=writes
        )

    async def advance_loaded(
        self,
        conn: Connection,
        tasks: dict[str, TaskRow],
        by_task: dict[str, list[StepRow]],
        *,
        now: datetime,
        counts: dict[str, Counter[StepStatus]] | None = None,
        writes: writes_to.StepWrites | None = None,
    ) -> Advanced:
        """Apply what `decide_unblocks` allows and settle each task's status.

        `by_task` must hold every blocked step and the steps they depend on; `counts` gives the
        step statuses of the tasks of which `by_task` does not hold every step (it holds every
        step of those `counts` leaves out, or of all if it is None). The transitions go to the
        stored rows unless `writes` takes them (a task being submitted). A step of an internal
        connector that is ready is run here (`InternalSteps`), and what it unblocks moves too:
        the pass repeats until none is left ready.
        """
        writes = writes or writes_to.Stored(conn)
        ids = sorted(tasks)
        await self.registry.ensure(
            ((s.tool, s.tool_version) for steps in by_task.values() for s in steps), conn=conn
        )
        moves = _Moves({t: by_task.get(t, []) for t in ids})
        while True:
            await self._unblock(conn, tasks, moves, now=now, writes=writes)
            internal = moves.ready_of(self.internal_connectors)
            if not internal:
                break
            await self._run_internal(conn, tasks, internal, moves, now=now, writes=writes)
        result = Advanced()
        result.ready_connectors.update(moves.queued_connectors())
        for task_id in ids:
            counted = counts.get(task_id) if counts is not None else None
            if counted is None:
                statuses = [moves.status(s) for s in moves.rows[task_id]]
            else:
                tally = Counter(counted)
                for was, is_now in moves.moved_in(task_id):
                    tally[was] -= 1
                    tally[is_now] += 1
                statuses = list(tally.elements())
            await _settle_status(writes, tasks[task_id], statuses, now=now, result=result)
        ended = [tasks[t] for t in sorted(result.finished_tasks) if tasks[t].webhook_url]
        if self._announcer is not None and ended:
            await self._announcer.finished(
                conn,
                [replace(t, status=result.task_status[t.task_id], finished_at=now) for t in ended],
            )
        return result

    async def _unblock(
        self,
        conn: Connection,
        tasks: dict[str, TaskRow],
        moves: _Moves,
        *,
        now: datetime,
        writes: writes_to.StepWrites,
    ) -> None:
        """One pass: unblock, skip or fail the blocked steps, and ask for approvals."""
        registry = self.registry
        changes: list[StepChange] = []
        for task_id in moves.rows:
            steps = moves.steps(task_id)
            changes += decide_unblocks(
                AdvanceInput(
                    steps=steps,
                    context=tasks[task_id].context,
                    tool_of=registry.get,
                    now=now,
                    budget=budget_for(tasks[task_id].max_attempts, steps),
                )
            )
        moved = await writes.change_steps(changes, now=now)
        moves.apply(changes, moved)
        asks = approvals.requests(
            (c for c in changes if c.step.id in moved),
            tool_of=registry.get,
            now=now,
            ttl=self._approval_ttl,
        )
        asked = await writes.change_steps(asks, now=now)
        moves.apply(asks, asked)
        if self._announcer is not None and self._announcer.announces_approvals and asked:
            await self._announcer.enqueue(
                conn,
                [
                    (webhooks.approval_request(a, tasks[a.step.task_id]), a.values["decide_by"])
                    for a in asks
                    if a.step.id in asked
                ],
            )

    async def _run_internal(
        self,
        conn: Connection,
        tasks: dict[str, TaskRow],
        ready: Sequence[StepRow],
        moves: _Moves,
        *,
        now: datetime,
        writes: writes_to.StepWrites,
    ) -> None:
        """Lease these ready steps to the controller, run each, and record how it ended: the
        same transitions and events an executor's would be, in this transaction."""
        assert self.internal is not None
        leases = [
            StepChange(
                step=s,
                transition=Transition.LEASE,
                values={
                    "lease_owner": INTERNAL_EXECUTOR,
                    "lease_expires_at": None,
                    "started_at": s.started_at or now,
                },
                event_data={"executor_id": INTERNAL_EXECUTOR},
            )
            for s in ready
        ]
        moves.ran.update(s.id for s in ready)
        moves.apply(leases, await writes.change_steps(leases, now=now))
        ends: list[StepChange] = []
        for step in (moves.current(s) for s in ready):
            if step.status is not StepStatus.RUNNING:
                continue  # someone else moved it first
            tool = self.registry.get(step.tool, step.tool_version)
            call = InternalCall(task=tasks[step.task_id], step=step, tool=tool, now=now)
            outcome = await self.internal.run(conn, call)
            how = Transition.SUCCEED if outcome.error is None else Transition.FAIL
            values = terminal_values(
                step, tool=tool, transition=how, now=now, output=outcome.output, error=outcome.error
            )
            data = {"error": outcome.error} if outcome.error is not None else None
            ends.append(StepChange(step=step, transition=how, values=values, event_data=data))
        moves.apply(ends, await writes.change_steps(ends, now=now))


_STEP_FIELDS = frozenset(f.name for f in fields(StepRow))


def _position(step: StepRow) -> int:
    return step.position


def changed_row(change: StepChange) -> StepRow:
    """A step as a change leaves it."""
    values = {k: v for k, v in change.values.items() if k in _STEP_FIELDS and k != "status"}
    return replace(change.step, status=target_of(change.transition), **values)


@dataclass(slots=True)
class _Moves:
    """What one advance did, across its passes: each moved step's latest change and its status
    before the advance. Rows are rebuilt from the changes only when a second pass reads them."""

    rows: dict[str, list[StepRow]]  # by task, as loaded
    last: dict[int, StepChange] = field(default_factory=dict)
    before: dict[int, StepStatus] = field(default_factory=dict)
    ran: set[int] = field(default_factory=set)  # internal steps run (each at most once)

    def apply(self, changes: Iterable[StepChange], moved: set[int]) -> None:
        for change in changes:
            if change.step.id in moved:
                self.before.setdefault(change.step.id, change.step.status)
                self.last[change.step.id] = change

    def status(self, step: StepRow) -> StepStatus:
        change = self.last.get(step.id)
        return step.status if change is None else target_of(change.transition)

    def _connector(self, step: StepRow) -> str:
        change = self.last.get(step.id)
        return step.connector if change is None else change.values.get("connector", step.connector)

    def current(self, step: StepRow) -> StepRow:
        change = self.last.get(step.id)
        return step if change is None else changed_row(change)

    def steps(self, task_id: str) -> list[StepRow]:
        rows = self.rows[task_id]
        return [self.current(s) for s in rows] if self.last else rows

    def ready_of(self, connectors: frozenset[str]) -> list[StepRow]:
        """Ready steps of these connectors not run yet, as they are now."""
        if not connectors:
            return []
        return [
            self.current(s)
            for rows in self.rows.values()
            for s in rows
            if s.id not in self.ran
            and self.status(s) is StepStatus.READY
            and self._connector(s) in connectors
        ]

    def queued_connectors(self) -> set[str]:
        """The connectors of the steps this advance queued (the pollers to wake)."""
        return {
            self._connector(c.step)
            for c in self.last.values()
            if target_of(c.transition) is StepStatus.READY
        }

    def moved_in(self, task_id: str) -> Iterator[tuple[StepStatus, StepStatus]]:
        """(status before, status now) of each step of the task that moved."""
        for step in self.rows[task_id]:
            if step.id in self.before:
                yield self.before[step.id], self.status(step)


async def _settle_status(
    writes: writes_to.StepWrites,
    task: TaskRow,
    statuses: list[StepStatus],
    *,
    now: datetime,
    result: Advanced,
) -> None:
    new = derive_task_status(statuses, cancelled=task.cancel_requested)
    result.task_status[task.task_id] = task.status
    if task.status in TERMINAL_TASK_STATES or new == task.status:
        return
    if new == TaskStatus.PENDING and task.status == TaskStatus.RUNNING:
        return  # a retry moved every step back to ready: the task is still running
    result.task_status[task.task_id] = new
    await writes.set_task_status(task, new, now=now)
    if new in TERMINAL_TASK_STATES:
        result.finished_tasks.add(task.task_id)
