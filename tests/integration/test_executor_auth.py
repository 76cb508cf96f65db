"""The executor plane attacked as a process on the same network would: over real gRPC, with the
generated stubs and no help from our client. Every refusal must leave the task untouched, and the
real executor's result must still be the one applied."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from agent_reach.v1 import executor_pb2 as pb
from agent_reach.v1 import executor_pb2_grpc as pb_grpc
from agent_reach_controller.identity import keys
from agent_reach_controller.identity.pools import token_hash
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.server import running_controller
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.settings import ControllerSettings
from tests.integration.stack import TOOLS, api_client, write_tools

OTHER_TOOLS = [
    *TOOLS,
    {
        "name": "orders.refund",
        "description": "Refund an order.",
        "connector": "echo",
        "input_schema": {"type": "object"},
        "retry": {"initial_interval": "10ms", "maximum_attempts": 3, "jitter": False},
        "idempotent": False,
    },
]


@dataclass
class Executor:
    """One executor process, spoken for by hand with the generated stub."""

    stub: Any
    token: str | None
    executor_id: str = "rogue"
    session: str = ""
    seq: int = 0
    leases: list[pb.LeaseRef] = field(default_factory=list)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (("authorization", f"Bearer {self.token}"),) if self.token else None

    async def register(self, connectors: Sequence[str] = ("echo",)) -> pb.RegisterResponse:
        reply = await self.stub.Register(
            pb.RegisterRequest(executor_id=self.executor_id, connectors=connectors, slots=4),
            metadata=self.metadata,
        )
        self.session = reply.session
        return reply

    async def poll(
        self, *, connectors: Sequence[str] = ("echo",), wait_ms: int = 2000
    ) -> list[Any]:
        self.seq += 1
        reply = await self.stub.PollSteps(
            pb.PollStepsRequest(
                executor_id=self.executor_id,
                connectors=connectors,
                max_steps=10,
                wait_ms=wait_ms,
                session=self.session,
                poll_seq=self.seq,
            ),
            metadata=self.metadata,
        )
        self.leases.extend(s.lease for s in reply.steps)
        return list(reply.steps)

    async def beat(self, leases: Sequence[pb.LeaseRef], *, polls_completed: int = 0) -> Any:
        return await self.stub.Heartbeat(
            pb.HeartbeatRequest(
                executor_id=self.executor_id,
                leases=leases,
                session=self.session,
                polls_completed=polls_completed,
            ),
            metadata=self.metadata,
        )

    async def report(self, lease: pb.LeaseRef, output: Any) -> pb.ResultAck:
        result = pb.StepResult(
            lease=lease, outcome=pb.OUTCOME_SUCCEEDED, output_json=json.dumps(output).encode()
        )
        reply = await self.stub.ReportResults(
            pb.ReportResultsRequest(
                executor_id=self.executor_id, results=[result], session=self.session
            ),
            metadata=self.metadata,
        )
        ack: pb.ResultAck = reply.acks[0]
        return ack


@dataclass
class Plane:
    c: Components
    stub: Any

    async def token(self, pool: str = "pool", **scope: Any) -> str:
        _, token = await self.c.pools.create(name=pool, created_by="test", **scope)
        return token

    async def executor(self, executor_id: str, **scope: Any) -> Executor:
        return Executor(self.stub, await self.token(**scope), executor_id=executor_id)

    async def submit(self, *steps: tuple[str, str], tenant: str = "default") -> str:
        body = {"steps": [{"step_id": s, "tool": t, "args": {}} for s, t in steps]}
        view = await self.c.intake.submit(
            SubmitInput(plan=parse_plan(body, self.c.catalog), request=body, tenant=tenant)
        )
        return view.task_id

    async def held_by_a_real_executor(self) -> tuple[str, Executor, Any]:
        """A one-step task whose step a registered executor (`real`) holds: (task, it, step)."""
        task_id = await self.submit(("a", "echo.say"))
        real = await self.executor("real")
        await real.register()
        (step,) = await real.poll()
        return task_id, real, step

    async def events(self, task_id: str, kind: str) -> list[Any]:
        return [e for e in await self.c.queries.events(task_id) if e.kind == kind]

    def refusals(self, reason: str) -> float:
        return self.c.metrics.total("agent_reach_executor_auth_failures_total", reason=reason)


async def _eventually(check: Any, *, within: float = 10.0) -> Any:
    """Await `check()` until it is truthy; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while not (found := await check()):
        assert time.monotonic() < deadline, f"not true within {within}s"
        await asyncio.sleep(0.05)
    return found


@contextlib.asynccontextmanager
async def plane(url: str, tmp_path: Path, **settings: Any) -> AsyncIterator[Plane]:
    config = ControllerSettings(
        database_url=url,
        tools=[write_tools(tmp_path, OTHER_TOOLS)],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
        **settings,
    )
    async with (
        running_controller(config) as (c, bound),
        grpc.aio.insecure_channel(bound.grpc) as channel,
    ):
        yield Plane(c=c, stub=pb_grpc.ExecutorServiceStub(channel))


async def _status(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    code: grpc.StatusCode = refused.value.code()
    return code


async def test_no_or_a_bad_token_is_unauthenticated_on_every_call(
    database_url: str, tmp_path: Path
) -> None:
    async with plane(database_url, tmp_path) as p:
        task_id = await p.submit(("a", "echo.say"))
        forged_token = keys.new_key(keys.POOL_TOKEN_PREFIX).token
        for token in (None, "", forged_token, "rxt_nonsense", "Basic abc"):
            rogue = Executor(p.stub, token)
            assert await _status(rogue.register()) is grpc.StatusCode.UNAUTHENTICATED
            rogue.session = "xs_000000000000_" + "A" * 43
            assert await _status(rogue.poll(wait_ms=0)) is grpc.StatusCode.UNAUTHENTICATED
            lease = pb.LeaseRef(step_key=1, attempt=1)
            assert await _status(rogue.beat([lease])) is grpc.StatusCode.UNAUTHENTICATED
            assert await _status(rogue.report(lease, "forged")) is grpc.StatusCode.UNAUTHENTICATED
        assert p.refusals("no_credentials") >= 8
        assert p.refusals("bad_token") >= 12
        view = await p.c.queries.get(task_id)
        assert view.steps[0].status == "ready"
        assert view.steps[0].attempt == 1


async def test_a_report_with_no_register_and_a_made_up_id_is_refused(
    database_url: str, tmp_path: Path
) -> None:
    """The reported hole: ReportResults quoting step_key N / attempt 1 of a running step."""
    async with plane(database_url, tmp_path) as p:
        task_id, real, step = await p.held_by_a_real_executor()
        guessed = pb.LeaseRef(step_key=step.lease.step_key, attempt=step.lease.attempt)
        for token in (None, await p.token(pool="same-pool")):
            rogue = Executor(p.stub, token, executor_id="made-up")  # never registered
            code = await _status(rogue.report(guessed, {"fabricated": True}))
            assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION)
        assert (await p.c.queries.get(task_id)).steps[0].status == "running"
        ack = await real.report(step.lease, {"real": True})
        assert ack.accepted
        assert (await p.c.queries.get(task_id)).steps[0].output == {"real": True}


async def test_a_forged_report_and_heartbeat_for_a_live_lease_are_refused_and_recorded(
    database_url: str, tmp_path: Path
) -> None:
    async with plane(database_url, tmp_path) as p:
        task_id, real, step = await p.held_by_a_real_executor()
        assert len(step.lease.token) == 32  # 128 bits, hex
        rogue = await p.executor("rogue", pool="another-pool")
        await rogue.register()
        key, attempt = step.lease.step_key, step.lease.attempt
        quoted = [
            pb.LeaseRef(step_key=key, attempt=attempt),  # no token
            pb.LeaseRef(step_key=key, attempt=attempt, token="0" * 32),  # a guessed one
            step.lease,  # the real token, stolen: still not this session's lease
        ]
        for lease in quoted:
            ack = await rogue.report(lease, {"fabricated": True})
            assert (ack.accepted, ack.reason) == (False, "not_lease_holder")
            beat = await rogue.beat([lease])
            assert [x.step_key for x in beat.lost] == [key]
            assert not beat.extended
        # The holder's lease was not disturbed: its heartbeat extends it, its report applies.
        beat = await real.beat([step.lease])
        assert [x.step_key for x in beat.extended] == [key]
        ack = await real.report(step.lease, {"real": True})
        assert ack.accepted
        view = await p.c.queries.get(task_id)
        assert view.steps[0].output == {"real": True}
        rejected = await p.events(task_id, "result_rejected")
        assert [(e.data["reason"], e.data["call"], e.data["executor_id"]) for e in rejected] == [
            ("not_lease_holder", call, "rogue") for _ in quoted for call in ("report", "heartbeat")
        ]
        refused = p.c.metrics.total("agent_reach_results_rejected_total", reason="not_lease_holder")
        assert refused == 6


async def test_a_replayed_lease_after_a_new_attempt_is_stale(
    database_url: str, tmp_path: Path
) -> None:
    async with plane(database_url, tmp_path, lease_seconds=0.5) as p:
        task_id = await p.submit(("a", "echo.say"))
        first = await p.executor("first")
        await first.register()
        (old,) = await first.poll()
        # `first` goes silent: its session expires and the step is leased again, to `second`.
        second = await p.executor("second")
        await second.register()

        async def requeued() -> bool:
            await second.beat([])  # `second` stays alive meanwhile
            await p.c.leases.reap_sessions()  # (the background reaper may be first)
            step = (await p.c.queries.get(task_id)).steps[0]
            return step.status == "ready" and step.attempt == 2

        await _eventually(requeued)
        assert await first.poll(wait_ms=0) == []  # an ended session leases nothing
        (new,) = await second.poll()
        assert new.lease.attempt == old.lease.attempt + 1
        # The old holder's session ended: it must register again and quotes nothing.
        assert await _status(first.report(old.lease, "late")) is grpc.StatusCode.FAILED_PRECONDITION
        await first.register()
        ack = await first.report(old.lease, "late")
        assert (ack.accepted, ack.reason) == (False, "stale_lease")
        replay = pb.LeaseRef(
            step_key=new.lease.step_key, attempt=new.lease.attempt, token=old.lease.token
        )
        ack = await first.report(replay, "replayed")
        assert (ack.accepted, ack.reason) == (False, "not_lease_holder")
        assert (await second.report(new.lease, "fresh")).accepted
        assert (await p.c.queries.get(task_id)).steps[0].output == "fresh"


async def test_scope_bounds_connectors_tools_and_tenants(database_url: str, tmp_path: Path) -> None:
    async with plane(database_url, tmp_path) as p:
        narrow = await p.executor("narrow", pool="echo-only", connectors=["echo"])
        assert await _status(narrow.register(("echo", "http"))) is grpc.StatusCode.PERMISSION_DENIED
        await narrow.register(("echo",))
        assert await _status(narrow.poll(connectors=("http",), wait_ms=0)) is (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert p.refusals("out_of_scope") == 2

        refunds = await p.executor("refunds", pool="refunds", tools=["orders.*"])
        await refunds.register()
        tenant = await p.executor("acme", pool="acme", tenant="acme")
        await tenant.register()
        mixed = await p.submit(("say", "echo.say"), ("refund", "orders.refund"))
        acme = await p.submit(("say", "echo.say"), tenant="acme")
        got = await refunds.poll(wait_ms=0)
        assert [(s.task_id, s.step_id) for s in got] == [(mixed, "refund")]
        got = await tenant.poll(wait_ms=0)
        assert [(s.task_id, s.step_id) for s in got] == [(acme, "say")]
        assert await refunds.poll(wait_ms=0) == []
        assert await tenant.poll(wait_ms=0) == []
        assert [s.step_id for s in await narrow.poll(wait_ms=0)] == ["say"]


async def test_revoking_a_token_ends_its_sessions_and_requeues_at_once(
    database_url: str, tmp_path: Path
) -> None:
    async with plane(database_url, tmp_path) as p:
        task_id = await p.submit(("a", "echo.say"))
        info, token = await p.c.pools.create(name="doomed", created_by="test")
        doomed = Executor(p.stub, token, executor_id="doomed")
        await doomed.register()
        (step,) = await doomed.poll()
        assert await p.c.pools.revoke(info.token_id, by="test")
        await p.c.leases.reap_sessions()  # what the API's revoke does next
        view = await p.c.queries.get(task_id)
        assert (view.steps[0].status, view.steps[0].attempt) == ("ready", 2)
        assert await _status(doomed.report(step.lease, "late")) is grpc.StatusCode.UNAUTHENTICATED
        assert await _status(doomed.register()) is grpc.StatusCode.UNAUTHENTICATED
        other = await p.executor("other")
        await other.register()
        (again,) = await other.poll()
        assert (await other.report(again.lease, "ok")).accepted


async def test_a_session_of_one_pool_is_useless_with_another_pools_token(
    database_url: str, tmp_path: Path
) -> None:
    async with plane(database_url, tmp_path) as p:
        a = await p.executor("a", pool="pool-a")
        await a.register()
        b = await p.executor("b", pool="pool-b")
        b.session = a.session
        assert await _status(b.poll(wait_ms=0)) is grpc.StatusCode.UNAUTHENTICATED
        assert p.refusals("bad_session") == 1


async def test_a_lease_whose_reply_never_arrived_is_released_at_the_next_heartbeat(
    database_url: str, tmp_path: Path
) -> None:
    async with plane(database_url, tmp_path) as p:
        task_id = await p.submit(("a", "orders.refund"))  # not idempotent: no retry if ambiguous
        ex = await p.executor("ex")
        await ex.register()
        await ex.poll()  # poll 1: the executor "never received" this reply
        beat = await ex.beat([], polls_completed=0)  # not yet known to be complete: kept
        view = await p.c.queries.get(task_id)
        assert view.steps[0].status == "running"
        beat = await ex.beat([], polls_completed=1)
        assert not beat.lost
        view = await p.c.queries.get(task_id)
        # It never ran, so it is queued again: for this tool an attempt that may have applied
        # would be `outcome_unknown`, waiting for an operator.
        assert (view.steps[0].status, view.steps[0].attempt) == ("ready", 2)


async def test_executor_auth_off_admits_executors_without_a_token(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The rolling-upgrade mode: an executor of the previous release (no token, no session)."""
    async with plane(sqlite_url, tmp_path, executor_auth="off") as p:
        task_id = await p.submit(("a", "echo.say"))
        old = Executor(p.stub, None, executor_id="old")
        await old.register()
        old.session = ""  # it ignores the field it does not know
        (step,) = await old.poll()
        bare = pb.LeaseRef(step_key=step.lease.step_key, attempt=step.lease.attempt)
        await old.register()  # the old executor registers again after any failed call
        old.session = ""
        assert [x.step_key for x in (await old.beat([bare])).extended] == [bare.step_key]
        assert (await old.report(bare, "ok")).accepted
        assert (await p.c.queries.get(task_id)).steps[0].output == "ok"


async def test_executor_auth_off_a_session_kept_on_registering_again_is_quotable(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Without tokens, registering again keeps the executor's live session (its leases stay its
    own); the credential handed back must name that session, or every later call is refused."""
    async with plane(sqlite_url, tmp_path, executor_auth="off") as p:
        task_id = await p.submit(("a", "echo.say"))
        ex = Executor(p.stub, None, executor_id="current")
        first = (await ex.register()).session
        (step,) = await ex.poll()
        second = (await ex.register()).session
        assert second != first
        assert second.split("_", 2)[1] == first.split("_", 2)[1]  # the same session, a new secret
        assert (await ex.report(step.lease, "ok")).accepted
        assert (await p.c.queries.get(task_id)).steps[0].output == "ok"


async def test_the_admin_api_manages_tokens_and_shows_the_fleet(
    database_url: str, tmp_path: Path
) -> None:
    async with plane(database_url, tmp_path) as p, api_client(p.c) as http:
        task_id = await p.submit(("a", "echo.say"))
        made = await http.post(
            "/v1/executor-tokens", json={"name": "api-pool", "connectors": ["echo"]}
        )
        assert made.status_code == 201
        token, token_id = made.json()["token"], made.json()["token_id"]
        ex = Executor(p.stub, token, executor_id="api-ex")
        await ex.register()
        assert len(await ex.poll()) == 1
        fleet = (await http.get("/v1/executors")).json()["executors"]
        (row,) = [e for e in fleet if e["executor_id"] == "api-ex"]
        assert (row["pool"], row["leases"], row["connectors"]) == ("api-pool", 1, ["echo"])
        assert row["scope"]["connectors"] == ["echo"]
        listed = await http.get("/v1/executor-tokens")
        assert token_id in listed.text
        assert token.split("_", 2)[2] not in listed.text  # never the secret
        assert (await http.delete(f"/v1/executor-tokens/{token_id}")).status_code == 204
        view = await p.c.queries.get(task_id)
        assert (view.steps[0].status, view.steps[0].attempt) == ("ready", 2)
        again = await http.delete(f"/v1/executor-tokens/{token_id}")
        assert again.status_code == 404
        assert again.headers["content-type"] == "application/problem+json"
        ended = (await http.get("/v1/executors", params={"ended": "true"})).json()["executors"]
        assert [e["end_reason"] for e in ended if e["executor_id"] == "api-ex"] == ["revoked"]
    async with plane(database_url, tmp_path) as p, api_client(p.c, roles=("operator",)) as http:
        for call in (http.get("/v1/executors"), http.get("/v1/executor-tokens")):
            assert (await call).status_code == 403


async def test_a_pool_removed_from_the_provisioning_file_is_revoked_without_a_restart(
    sqlite_url: str, tmp_path: Path
) -> None:
    token = keys.new_key(keys.POOL_TOKEN_PREFIX).token
    pools = tmp_path / "pools.yaml"
    entry = {"name": "provisioned", "sha256": token_hash(token), "connectors": ["echo"]}
    pools.write_text(yaml.safe_dump({"tokens": [entry]}))
    async with plane(sqlite_url, tmp_path, executor_tokens=pools) as p:
        task_id = await p.submit(("a", "echo.say"))
        ex = Executor(p.stub, token, executor_id="provisioned")
        assert (await ex.register()).pool == "provisioned"
        assert len(await ex.poll()) == 1
        pools.write_text(yaml.safe_dump({"tokens": []}))  # the Secret, updated in place

        async def refused() -> bool:
            try:
                await ex.beat([])
            except grpc.aio.AioRpcError as exc:
                return exc.code() is grpc.StatusCode.UNAUTHENTICATED
            return False

        await _eventually(refused)

        async def requeued() -> bool:
            await p.c.leases.reap_sessions()
            return (await p.c.queries.get(task_id)).steps[0].status == "ready"

        await _eventually(requeued)
