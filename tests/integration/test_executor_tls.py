"""TLS and mutual TLS on the executor plane (and TLS on REST), with certificates made here:
a real executor runs a step over mTLS with no token; a missing, expired or foreign client
certificate, or a client that does not trust the server, never gets a call through."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from agent_reach.v1 import executor_pb2 as pb
from agent_reach.v1 import executor_pb2_grpc as pb_grpc
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.server import Bound, running_controller
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.settings import ControllerSettings
from agent_reach_executor import ExecutorSettings, run_executor
from tests.integration.stack import write_tools
from tests.support.certs import Authority, Issued

POOL_URI = "urn:agent-reach:pool:"


@contextlib.asynccontextmanager
async def secured(
    url: str, tmp_path: Path, *, mutual: bool
) -> AsyncIterator[tuple[Components, Bound, Authority, Authority]]:
    ca, foreign = Authority(tmp_path, "ours"), Authority(tmp_path, "foreign")
    server = ca.issue("server", ips=("127.0.0.1",), dns=("localhost",), server=True)
    pools = tmp_path / "pools.yaml"
    pools.write_text(json.dumps({"tokens": [{"name": "tls-pool", "connectors": ["echo"]}]}))
    settings = ControllerSettings(
        database_url=url,
        tools=[write_tools(tmp_path)],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
        tls_cert=server.cert,
        tls_key=server.key,
        grpc_client_ca=ca.cert if mutual else None,
        executor_tokens=pools,
    )
    async with running_controller(settings) as (c, bound):
        yield c, bound, ca, foreign


def _channel(bound: Bound, ca: Path, client: Issued | None = None) -> Any:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None,
    )
    return grpc.aio.secure_channel(bound.grpc, credentials)


async def _register(channel: Any, metadata: Any = None) -> pb.RegisterResponse:
    stub = pb_grpc.ExecutorServiceStub(channel)
    reply: pb.RegisterResponse = await stub.Register(
        pb.RegisterRequest(executor_id="tls", connectors=["echo"]), metadata=metadata, timeout=5
    )
    return reply


async def _refused(channel: Any, metadata: Any = None) -> grpc.StatusCode:
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _register(channel, metadata)
    code: grpc.StatusCode = refused.value.code()
    return code


async def test_tls_serves_rest_and_grpc_and_refuses_plaintext_and_strangers(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with secured(sqlite_url, tmp_path, mutual=False) as (c, bound, ca, foreign):
        _, token = await c.pools.create(name="tls", created_by="test")
        auth = (("authorization", f"Bearer {token}"),)
        async with _channel(bound, ca.cert) as channel:
            assert (await _register(channel, auth)).pool == "tls"
        # Without a token TLS alone admits nobody.
        assert await _refused(_channel(bound, ca.cert)) is grpc.StatusCode.UNAUTHENTICATED
        # A client that trusts another CA, or speaks plaintext, gets no call through.
        assert await _refused(_channel(bound, foreign.cert), auth) is grpc.StatusCode.UNAVAILABLE
        plain = grpc.aio.insecure_channel(bound.grpc)
        assert await _refused(plain, auth) is grpc.StatusCode.UNAVAILABLE
        trust = ssl.create_default_context(cafile=str(ca.cert))
        async with httpx.AsyncClient(verify=trust) as client:
            assert (await client.get(f"https://{bound.http}/healthz")).status_code == 200
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.HTTPError):
                await client.get(f"http://{bound.http}/healthz")


async def test_mutual_tls_maps_a_certificate_to_its_pool(sqlite_url: str, tmp_path: Path) -> None:
    async with secured(sqlite_url, tmp_path, mutual=True) as (c, bound, ca, foreign):
        member = ca.issue("member", uris=(f"{POOL_URI}tls-pool",))
        async with _channel(bound, ca.cert, member) as channel:
            registered = await _register(channel)
        assert registered.pool == "tls-pool"
        stranger = ca.issue("stranger", uris=(f"{POOL_URI}no-such-pool",))
        refused = await _refused(_channel(bound, ca.cert, stranger))
        assert refused is grpc.StatusCode.PERMISSION_DENIED
        expired = ca.issue("expired", uris=(f"{POOL_URI}tls-pool",), expired=True)
        forged = foreign.issue("forged", uris=(f"{POOL_URI}tls-pool",))
        for client in (None, expired, forged):
            refused = await _refused(_channel(bound, ca.cert, client))
            assert refused is grpc.StatusCode.UNAVAILABLE, client

        # A real executor, given the CA and its certificate (no token), runs a step.
        body = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "over mTLS"}}]}
        task = await c.intake.submit(SubmitInput(plan=parse_plan(body, c.catalog), request=body))
        stop = asyncio.Event()
        settings = ExecutorSettings(
            controller=bound.grpc,
            connectors=["echo"],
            tls_ca=ca.cert,
            tls_cert=member.cert,
            tls_key=member.key,
            drain_grace=1,
        )
        worker = asyncio.create_task(run_executor(settings, stop=stop, handle_signals=False))
        try:
            for _ in range(200):
                view = await c.queries.get(task.task_id)
                if view.steps[0].status == "succeeded":
                    break
                await asyncio.sleep(0.05)
            assert view.steps[0].status == "succeeded"
            assert view.steps[0].output["args"] == {"text": "over mTLS"}
        finally:
            stop.set()
            await worker
