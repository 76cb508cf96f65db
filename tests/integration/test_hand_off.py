"""A new step goes straight to a poller waiting on the replica that takes the submit.

Over the real REST API and real gRPC on Postgres: an executor's poll finds the queue empty and
waits; the submit leases the step to it in the submit's own transaction, and the poll answers with
it. What must hold: the lease is the one a claim would have taken (same events, same holder, a
lease token the executor can report with), it costs no transaction of its own, and wherever a
claim would not have leased the step (the poller's session ended, the tool paused or governed)
the step is queued instead, the submit still answered once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent_reach.v1 import executor_pb2 as pb
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.services import handoff
from agent_reach_controller.services.handoff import HandOff
from agent_reach_controller.services.intake import IntakeService, SubmitInput, Submitted
from agent_reach_controller.storage import flow
from tests.integration.stack import TOOLS, api_client, components_for, write_tools
from tests.integration.test_commits import _next_xid, executor_plane
from tests.integration.test_executor_auth import Executor

PLAN = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"n": 1}}]}


async def _until(holds: Callable[[], bool], what: str, within: float = 5.0) -> None:
    """Return once `holds()`; fail the test after `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not holds():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.005)


async def _waiting(c: Components, count: int = 1) -> None:
    """Until `count` polls wait on this replica to be handed steps."""
    assert c.hand_off is not None
    hand_off = c.hand_off
    await _until(lambda: hand_off.waiting >= count, "no poll came to wait")


async def _registered(c: Components, stub: Any, name: str = "waiting", **scope: Any) -> Executor:
    _, token = await c.pools.create(name=name, created_by="test", **scope)
    executor = Executor(stub, token, executor_id=name)
    await executor.register()
    return executor


async def _polling(
    c: Components, stub: Any, *, wait_ms: int, name: str = "waiting", **scope: Any
) -> tuple[Executor, asyncio.Task[list[Any]]]:
    """A registered executor whose poll found the queue empty, and its next poll, started
    (the caller waits for it to be waiting)."""
    executor = await _registered(c, stub, name=name, **scope)
    assert await executor.poll(wait_ms=50) == []  # the queue is empty: later polls wait
    return executor, asyncio.create_task(executor.poll(wait_ms=wait_ms))


def _session_of(url: str, executor: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT id FROM executor_sessions WHERE executor_id = %s", (executor,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def _events(url: str, task_id: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT kind, step_id, from_status, to_status, data FROM events"
            " WHERE task_id = %s ORDER BY id",
            (task_id,),
        ).fetchall()


@pytest.fixture
async def plane(postgres_url: str, tmp_path: Path) -> AsyncIterator[tuple[Components, Any, Any]]:
    async with (
        components_for(postgres_url, write_tools(tmp_path)) as c,
        api_client(c) as http,
        executor_plane(c) as stub,
    ):
        yield c, http, stub


async def test_a_waiting_poll_is_handed_the_step_in_the_submits_own_transaction(
    postgres_url: str, plane: tuple[Components, Any, Any]
) -> None:
    c, http, stub = plane
    assert c.hand_off is not None
    executor, poll = await _polling(c, stub, wait_ms=5000)
    await _waiting(c)

    before = _next_xid(postgres_url)
    answer = await http.post("/v1/tasks", json=PLAN)
    assert answer.status_code == 202, answer.text
    assert _next_xid(postgres_url) - before == 1  # the lease rode in the submit's transaction
    task_id = answer.json()["task_id"]
    assert answer.json()["status"] == "running"

    (step,) = await asyncio.wait_for(poll, 5)
    assert step.task_id == task_id
    assert step.step_id == "a"
    view = await c.queries.get(task_id)
    assert step.lease.step_key == view.steps[0].id  # the key the database gave the row
    assert view.steps[0].status == "running"
    session = _session_of(postgres_url, "waiting")
    assert view.steps[0].lease_owner == session
    assert c.hand_off.handed == 1
    leased = "agent_reach_steps_leased_total"
    assert c.metrics.total(leased, path="handed_off") == 1
    assert c.metrics.total(leased, path="claimed") == 0

    ack = await executor.report(step.lease, {"ok": True})  # its lease token is the session's
    assert ack.accepted, ack.reason
    assert _next_xid(postgres_url) - before == 2  # submit, report: nothing else wrote
    assert (await c.queries.get(task_id)).task.status == "succeeded"
    kinds = [(kind, frm, to) for kind, _, frm, to, _ in _events(postgres_url, task_id)]
    assert kinds == [
        ("task_created", None, "pending"),
        ("unblock", "blocked", "ready"),
        ("lease", "ready", "running"),  # as a claim records it, holder included
        ("task_status", "pending", "running"),
        ("succeed", "running", "succeeded"),
        ("task_status", "running", "succeeded"),
    ]
    lease = _events(postgres_url, task_id)[2]
    assert lease[4] == {"executor_id": "waiting", "session": session}


async def test_a_poller_whose_session_ended_gets_nothing_and_the_step_is_queued(
    postgres_url: str, plane: tuple[Components, Any, Any]
) -> None:
    c, http, stub = plane
    assert c.hand_off is not None
    _, poll = await _polling(c, stub, wait_ms=300)
    await _waiting(c)
    # Another replica ends the session (an operator revoked it) behind this one's back.
    with psycopg.connect(postgres_url) as conn:
        conn.execute("UPDATE executor_sessions SET ended_at = now(), end_reason = 'revoked'")

    answer = await http.post("/v1/tasks", json=PLAN)
    assert answer.status_code == 202, answer.text
    task_id = answer.json()["task_id"]
    view = await c.queries.get(task_id)
    assert [s.status for s in view.steps] == ["ready"]  # queued for a live executor
    assert view.task.status == "pending"
    assert c.hand_off.handed == 0
    assert await poll == []  # its claim, woken by the queued step, leases nothing either
    with psycopg.connect(postgres_url) as conn:
        tasks = conn.execute("SELECT count(*) FROM tasks").fetchone()
    assert tasks == (1,)  # made again without the hand-off, once

    other = await _registered(c, stub, name="live")
    (step,) = await other.poll(wait_ms=2000)
    assert step.task_id == task_id


async def test_a_paused_tool_is_queued_not_handed_off(
    postgres_url: str, plane: tuple[Components, Any, Any]
) -> None:
    c, http, stub = plane
    assert c.hand_off is not None
    _, poll = await _polling(c, stub, wait_ms=300)
    await _waiting(c)
    now = datetime.now(UTC)
    async with c.db.transaction() as conn:  # a 429's Retry-After, learned on another replica
        await flow.pause_tool(
            conn, "echo.say", until=now + timedelta(minutes=1), reason="t", now=now
        )

    answer = await http.post("/v1/tasks", json=PLAN)
    assert answer.status_code == 202, answer.text
    view = await c.queries.get(answer.json()["task_id"])
    assert [s.status for s in view.steps] == ["ready"]
    assert c.hand_off.handed == 0
    assert await poll == []  # woken by the queued step, it leases nothing of a paused tool


async def test_a_governed_tool_goes_through_the_queue(postgres_url: str, tmp_path: Path) -> None:
    capped = [{**t, "concurrency": 1} if t["name"] == "echo.say" else t for t in TOOLS]
    async with (
        components_for(postgres_url, write_tools(tmp_path, capped)) as c,
        api_client(c) as http,
        executor_plane(c) as stub,
    ):
        assert c.hand_off is not None
        _, poll = await _polling(c, stub, wait_ms=5000)
        # A governed claim never drains the queue: the poll waits to claim again.
        await _until(lambda: c.notifier.waiting >= 1, "no poll came to wait")
        assert c.hand_off.waiting == 0
        answer = await http.post("/v1/tasks", json=PLAN)
        assert answer.status_code == 202, answer.text
        (step,) = await asyncio.wait_for(poll, 5)  # leased by a claim, within the cap
        assert step.task_id == answer.json()["task_id"]
        assert c.hand_off.handed == 0
        assert c.metrics.total("agent_reach_steps_leased_total", path="claimed") == 1


async def test_without_hand_off_the_poll_claims_the_step(postgres_url: str, tmp_path: Path) -> None:
    async with (
        components_for(postgres_url, write_tools(tmp_path), hand_off=False) as c,
        api_client(c) as http,
        executor_plane(c) as stub,
    ):
        assert c.hand_off is None
        executor = await _registered(c, stub)
        poll = asyncio.create_task(executor.poll(wait_ms=5000))
        answer = await http.post("/v1/tasks", json=PLAN)
        (step,) = await asyncio.wait_for(poll, 5)
        assert step.task_id == answer.json()["task_id"]


async def test_a_poll_waits_for_a_step_promised_by_a_transaction_still_running(
    postgres_url: str, plane: tuple[Components, Any, Any]
) -> None:
    """The poll's wait ends while the submit that promised it a step is held up (a concurrent
    insert of the same Idempotency-Key, not yet committed): the poll answers with the step once
    that submit commits, instead of leaving it to be found lost at the next heartbeat."""
    c, http, stub = plane
    assert c.hand_off is not None
    first = await http.post("/v1/tasks", json=PLAN, headers={"Idempotency-Key": "k0"})
    assert first.status_code == 202, first.text
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT principal FROM idempotency_keys WHERE key = 'k0'").fetchone()
    assert row is not None
    executor = await _registered(c, stub)
    (queued,) = await executor.poll(wait_ms=50)
    assert await executor.poll(wait_ms=50) == []
    poll = asyncio.create_task(executor.poll(wait_ms=200))
    await _waiting(c)

    blocker = await psycopg.AsyncConnection.connect(postgres_url)
    try:
        await blocker.execute(
            "INSERT INTO idempotency_keys (principal, key, request_hash, task_id, created_at)"
            " VALUES (%s, 'k1', 'x', 'elsewhere', now())",
            (row[0],),
        )
        submit = asyncio.create_task(
            http.post("/v1/tasks", json=PLAN, headers={"Idempotency-Key": "k1"})
        )
        hand_off = c.hand_off
        await _until(lambda: hand_off.promised > 0, "the submit promised nothing")
        await asyncio.sleep(0.4)  # past the poll's own wait: only the promise holds it now
        assert not poll.done()
        await blocker.rollback()  # the key is free: the submit commits
    finally:
        await blocker.close()
    answer = await submit
    assert answer.status_code == 202, answer.text
    (step,) = await asyncio.wait_for(poll, 5)
    assert step.task_id == answer.json()["task_id"]
    assert queued.task_id == first.json()["task_id"]


async def test_submits_sharing_a_transaction_hand_their_steps_off_together(
    postgres_url: str, plane: tuple[Components, Any, Any]
) -> None:
    """A group commit hands each member's step to a waiting poll, all in its one transaction:
    every step reaches exactly one poll, leased to that poll's session."""
    c, _, stub = plane
    assert c.hand_off is not None
    polls = []
    for name in ("one", "two"):
        polls.append((await _polling(c, stub, wait_ms=3000, name=name))[1])
    await _waiting(c, count=2)

    intake = IntakeService(work=c.work, hand_off=c.hand_off, group_open=1)
    bodies = [
        {"goal": f"g{i}", "steps": [{"step_id": "a", "tool": "echo.say", "args": {"n": i}}]}
        for i in range(4)
    ]
    made = await asyncio.gather(
        *(intake.submit(SubmitInput(plan=parse_plan(b, c.catalog), request=b)) for b in bodies)
    )
    assert intake._groups.stats.sizes == {1: 1, 3: 1}  # one alone, then three together
    handed = [step for poll in await asyncio.gather(*polls) for step in poll]
    assert sorted(s.task_id for s in handed) == sorted(m.task_id for m in made)
    assert c.hand_off.handed == 4
    owners = {_session_of(postgres_url, name) for name in ("one", "two")}
    for m in made:
        (step,) = (await c.queries.get(m.task_id)).steps
        assert step.status == "running"
        assert step.lease_owner in owners


@pytest.mark.parametrize(
    "scope", [{"tenant": "another"}, {"tools": ["echo.count"]}], ids=["tenant", "tools"]
)
async def test_a_poll_is_never_handed_a_step_outside_its_pools_scope(
    plane: tuple[Components, Any, Any], scope: dict[str, Any]
) -> None:
    """A pool scoped to another tenant, or to other tools, waits on the same connector: the
    step is not handed to it (nor claimed by it), and a pool that may run it gets it."""
    c, http, stub = plane
    assert c.hand_off is not None
    _, poll = await _polling(c, stub, wait_ms=300, name="scoped", **scope)
    await _waiting(c)
    answer = await http.post("/v1/tasks", json=PLAN)
    assert answer.status_code == 202, answer.text
    assert c.hand_off.handed == 0
    assert await poll == []
    (step,) = await (await _registered(c, stub, name="allowed")).poll(wait_ms=2000)
    assert step.task_id == answer.json()["task_id"]


async def _poll(executor: Executor, *, max_steps: int, wait_ms: int) -> list[Any]:
    """A poll for at most `max_steps` steps."""
    executor.seq += 1
    reply = await executor.stub.PollSteps(
        pb.PollStepsRequest(
            executor_id=executor.executor_id,
            connectors=["echo"],
            max_steps=max_steps,
            wait_ms=wait_ms,
            session=executor.session,
            poll_seq=executor.seq,
        ),
        metadata=executor.metadata,
    )
    return list(reply.steps)


@contextlib.asynccontextmanager
async def _claims_held(url: str, hand_off: HandOff) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Claims wait, for the life of the block, on the catalogue's revision (every claim reads
    it; a submit made with no revision to check does not). Yields a wait until a poll takes
    hand-offs while it claims, and a claim waits there."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("LOCK TABLE catalog_state IN ACCESS EXCLUSIVE MODE")

        async def waited_on() -> bool:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_locks"
                " WHERE relation = 'catalog_state'::regclass AND NOT granted"
            )
            return bool((await cur.fetchone() or (0,))[0])

        async def a_claim_waits() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5.0
            while not (hand_off.claiming and await waited_on()):
                assert loop.time() < deadline, "no poll came to claim"
                await asyncio.sleep(0.005)

        try:
            yield a_claim_waits
        finally:
            await conn.rollback()


async def _submit(c: Components, intake: IntakeService | None = None) -> asyncio.Task[Submitted]:
    """A submit, started, that checks no catalogue revision (so `_claims_held` holds no submit)."""
    plan = parse_plan(PLAN, c.catalog)
    return asyncio.create_task((intake or c.intake).submit(SubmitInput(plan=plan, request=PLAN)))


def _waits_on_keys(url: str) -> int:
    """How many statements wait for another transaction to end (on an Idempotency-Key)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted"
            " AND database IS NULL AND pid IN (SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database())"
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """A submit waits as long as a test holds the claim it offered a step to."""
    monkeypatch.setattr(handoff, "CLAIM_WITHIN", 30.0)


async def _claiming(
    c: Components, http: Any, stub: Any, *, queued: int
) -> tuple[Executor, list[str]]:
    """A registered executor whose last claim drained the queue, and `queued` tasks submitted
    since (their wake-up makes its next poll claim)."""
    executor = await _registered(c, stub)
    first = await http.post("/v1/tasks", json=PLAN)
    (step,) = await executor.poll(wait_ms=50)  # nobody waited: it was queued, then claimed
    assert step.task_id == first.json()["task_id"]
    made = []
    for _ in range(queued):
        answer = await http.post("/v1/tasks", json=PLAN)
        assert answer.json()["status"] == "pending"  # queued: no poll waits
        made.append(answer.json()["task_id"])
    return executor, made


async def test_a_step_submitted_while_a_poll_claims_is_handed_to_that_poll(
    postgres_url: str, plane: tuple[Components, Any, Any], patient: None
) -> None:
    """A submit finds no poll waiting, only one claiming: the step is handed to that poll in
    the submit's own transaction, which commits once the claim has drained the queue."""
    c, http, stub = plane
    assert c.hand_off is not None
    hand_off = c.hand_off
    executor, (queued,) = await _claiming(c, http, stub, queued=1)
    async with _claims_held(postgres_url, hand_off) as a_claim_waits:
        poll = asyncio.create_task(_poll(executor, max_steps=3, wait_ms=5000))
        await a_claim_waits()
        assert hand_off.waiting == 0  # it claims (and its claim cannot end yet)
        submit = await _submit(c)
        await _until(
            lambda: hand_off.promised == 1, "the submit promised the claiming poll nothing"
        )
        assert not submit.done()  # it commits once the claim is known to have drained the queue
    made = await submit
    assert made.status == "running"  # its step leased in its own transaction
    handed = made.task_id

    steps = await asyncio.wait_for(poll, 5)
    assert sorted(s.task_id for s in steps) == sorted([queued, handed])
    assert hand_off.handed == 1
    leased = "agent_reach_steps_leased_total"
    assert c.metrics.total(leased, path="handed_off") == 1
    assert c.metrics.total(leased, path="claimed") == 2  # the first task, then `queued`
    (step,) = (await c.queries.get(handed)).steps
    assert (step.status, step.lease_owner) == ("running", _session_of(postgres_url, "waiting"))
    for s in steps:
        assert (await executor.report(s.lease, {"ok": True})).accepted, s.task_id


async def test_a_claiming_poll_is_handed_no_more_than_its_limit_leaves_room_for(
    postgres_url: str, plane: tuple[Components, Any, Any], patient: None
) -> None:
    """The claim asks for one step fewer than the poll may take, and room for one step is left
    to submits made meanwhile: what the poll claims and is handed never exceeds its limit."""
    c, http, stub = plane
    assert c.hand_off is not None
    hand_off = c.hand_off
    executor, (queued,) = await _claiming(c, http, stub, queued=1)
    # Submits in transactions of their own at once (none waits to share the held one's).
    intake = IntakeService(work=c.work, hand_off=hand_off, group_open=4)
    plan = parse_plan(PLAN, c.catalog)
    keys = [f"k{i}" for i in range(3)]
    blocker = await psycopg.AsyncConnection.connect(postgres_url)
    try:
        async with _claims_held(postgres_url, hand_off) as a_claim_waits:
            poll = asyncio.create_task(_poll(executor, max_steps=2 + 1, wait_ms=5000))
            await a_claim_waits()
            held = await _submit(c, intake)
            await _until(lambda: hand_off.promised == 1, "the submit promised the poll nothing")
            # Three more, each held at its commit by an Idempotency-Key not yet committed
            # elsewhere: offered the poll's room, they would be promised it too.
            for key in keys:
                await blocker.execute(
                    "INSERT INTO idempotency_keys (principal, key, request_hash, task_id,"
                    " created_at) VALUES ('anonymous', %s, 'x', 'elsewhere', now())",
                    (key,),
                )
            later = [
                asyncio.create_task(
                    intake.submit(SubmitInput(plan=plan, request=PLAN, idempotency_key=key))
                )
                for key in keys
            ]
            await _until(
                lambda: _waits_on_keys(postgres_url) == len(keys), "the later submits did not wait"
            )
            assert hand_off.promised == 1
        steps = await asyncio.wait_for(poll, 5)
        await blocker.rollback()  # the keys are free: the later submits commit
    finally:
        await blocker.close()
    assert len(steps) <= 3
    handed = (await held).task_id
    assert sorted(s.task_id for s in steps) == sorted([queued, handed])
    for task in later:
        assert (await task).status == "pending"  # queued, as if no poll had been there
    assert hand_off.handed == 1


async def test_a_claim_that_takes_all_it_asked_for_refuses_a_step_submitted_meanwhile(
    postgres_url: str, plane: tuple[Components, Any, Any], patient: None
) -> None:
    """A claim that leased all it asked for may have left older steps queued: a step submitted
    during it is not handed to its poll ahead of them; the submit is made again, queued."""
    c, http, stub = plane
    assert c.hand_off is not None
    hand_off = c.hand_off
    executor, (oldest, older) = await _claiming(c, http, stub, queued=2)
    async with _claims_held(postgres_url, hand_off) as a_claim_waits:
        poll = asyncio.create_task(_poll(executor, max_steps=2, wait_ms=5000))  # claims one
        await a_claim_waits()
        submit = await _submit(c)
        await _until(
            lambda: hand_off.promised == 1, "the submit promised the claiming poll nothing"
        )
    (step,) = await asyncio.wait_for(poll, 5)
    assert step.task_id == oldest
    made = await submit
    assert made.status == "pending"
    assert hand_off.handed == 0
    for task_id in (older, made.task_id):
        assert [s.status for s in (await c.queries.get(task_id)).steps] == ["ready"]
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM tasks").fetchone() == (4,)  # made once each


async def test_a_submit_waits_for_a_claim_a_bounded_while_then_queues_its_step(
    postgres_url: str, plane: tuple[Components, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that does not end soon (it waits for a connection the submit holds, say) does
    not hold the submit: past CLAIM_WITHIN the step is queued instead, the submit made again."""
    monkeypatch.setattr(handoff, "CLAIM_WITHIN", 0.05)
    c, http, stub = plane
    assert c.hand_off is not None
    hand_off = c.hand_off
    executor, (queued,) = await _claiming(c, http, stub, queued=1)
    async with _claims_held(postgres_url, hand_off) as a_claim_waits:
        poll = asyncio.create_task(_poll(executor, max_steps=3, wait_ms=5000))
        await a_claim_waits()
        made = await asyncio.wait_for(await _submit(c), 5)  # while the claim is still held
        assert made.status == "pending"
        assert not poll.done()
    steps = await asyncio.wait_for(poll, 5)  # the claim, let go, finds both queued
    assert sorted(s.task_id for s in steps) == sorted([queued, made.task_id])
    assert hand_off.handed == 0
