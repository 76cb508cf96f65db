"""An executor's own /metrics: slots busy and free, call durations with trace exemplars, acks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from agent_reach_executor.__main__ import run_executor
from agent_reach_executor.metrics import serving
from tests.executor.fake_controller import FakeController, FnConnector, Probe
from tests.executor.test_worker import make_settings, running_worker, wait_until

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"  # what FakeController.enqueue sends


@pytest.fixture
async def fake() -> AsyncIterator[FakeController]:
    controller = FakeController()
    await controller.start()
    yield controller
    await controller.stop()


async def scrape(address: str, *, openmetrics: bool = False) -> httpx.Response:
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://{address}/metrics", headers=accept)
    assert response.status_code == 200
    return response


def value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


async def test_slots_calls_and_reports_are_served(fake: FakeController) -> None:
    probe = Probe()
    keys = [fake.enqueue(connector="probe", tool="probe.call") for _ in range(6)]
    connectors: dict[str, Any] = {"probe": FnConnector("probe", probe)}
    async with running_worker(fake, connectors, slots=4) as running:
        with serving(
            "127.0.0.1:0", running.worker.metrics.registry, running.worker.readiness
        ) as address:
            await wait_until(lambda: probe.running == 4)
            text = (await scrape(address)).text
            assert value(text, "agent_reach_executor_slots", state="busy") == 4
            assert value(text, "agent_reach_executor_slots", state="free") == 0
            probe.release.set()
            await wait_until(lambda: all(k in fake.results for k in keys))
            await wait_until(lambda: running.worker.stats.results_accepted == len(keys))
            text = (await scrape(address)).text
            assert value(text, "agent_reach_executor_slots", state="busy") == 0
            assert value(text, "agent_reach_executor_slots", state="free") == 4
            calls = "agent_reach_executor_call_duration_seconds_count"
            assert value(text, calls, tool="probe.call", outcome="succeeded") == 6
            assert value(text, "agent_reach_executor_results_total", result="accepted") == 6
            om = await scrape(address, openmetrics=True)
            assert om.headers["content-type"].startswith("application/openmetrics-text")
            exemplars = [
                s.exemplar
                for f in om_families(om.text)
                for s in f.samples
                if s.name == "agent_reach_executor_call_duration_seconds_bucket" and s.exemplar
            ]
            assert exemplars
            assert {e.labels["trace_id"] for e in exemplars} == {TRACE_ID}


async def test_run_executor_serves_metrics_where_it_is_told(
    fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_reach_executor")
    stop = asyncio.Event()
    connectors: dict[str, Any] = {"probe": FnConnector("probe", Probe())}
    run = asyncio.create_task(
        run_executor(
            make_settings(fake.target, metrics="127.0.0.1:0", slots=3),
            connectors=connectors,
            stop=stop,
            handle_signals=False,
        )
    )
    try:

        def listening() -> list[Any]:
            return [r for r in caplog.records if getattr(r, "event", "") == "metrics_listening"]

        await wait_until(lambda: bool(listening()))
        address = listening()[0].address
        text = (await scrape(address)).text
        assert value(text, "agent_reach_executor_slots", state="free") == 3
    finally:
        stop.set()
        await asyncio.wait_for(run, 10)
    with pytest.raises(httpx.ConnectError):
        await scrape(address)  # the listener ends with the executor


def test_a_bad_metrics_address_is_refused() -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        make_settings("127.0.0.1:1", metrics="nowhere")
