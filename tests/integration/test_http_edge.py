"""The HTTP edge of a running controller (real uvicorn on 127.0.0.1): a client that hangs up."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from agent_reach_controller.server import running_controller
from tests.executor.test_worker import wait_until
from tests.integration.stack import key_for, listening_settings


async def test_a_client_that_hangs_up_mid_body_is_no_server_error(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = listening_settings(sqlite_url, tmp_path)
    caplog.set_level(logging.INFO)
    async with running_controller(settings) as (c, bound):
        [auth] = (await key_for(c)).values()
        host, port = bound.http.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/tasks HTTP/1.1\r\nHost: reach\r\nContent-Type: application/json\r\n"
            + f"Authorization: {auth}\r\nContent-Length: 4000\r\n\r\n".encode()
            + b'{"steps": [{"step_id": "s", '
        )
        await writer.drain()
        writer.close()  # gone before the rest of the body
        await writer.wait_closed()

        def events() -> set[str]:
            return {getattr(r, "event", "") for r in caplog.records}

        await wait_until(lambda: "api_client_gone" in events(), within=10)
        assert "api_error" not in events()
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert await c.queries.list_tasks(tenant="default") == []  # nothing stored
        del reader


async def test_answers_do_not_name_the_server_software(sqlite_url: str, tmp_path: Path) -> None:
    settings = listening_settings(sqlite_url, tmp_path)
    async with running_controller(settings) as (_, bound):
        host, port = bound.http.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: reach\r\n\r\n")
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        await writer.wait_closed()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nserver:" not in head.lower()
