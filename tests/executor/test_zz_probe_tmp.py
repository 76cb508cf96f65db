import asyncio, time
from tests.executor.test_worker import running_worker, fake, _Stubborn, wait_until  # noqa: F401
from tests.executor.fake_controller import FnConnector
from agent_reach_executor.runner import StepRunner

async def test_drain_base(fake):
    stubborn = _Stubborn()
    connectors = {"stubborn": FnConnector("stubborn", stubborn)}
    fake.enqueue(connector="stubborn")
    try:
        async with running_worker(fake, connectors, runner=StepRunner(connectors), drain_grace=0.2) as running:
            await wait_until(lambda: stubborn.running == 1)
            running.stop.set()
            await asyncio.wait_for(asyncio.shield(running.run), 3)
    finally:
        stubborn.release.set()
        await asyncio.sleep(0.05)

async def test_slot_base(fake):
    stubborn = _Stubborn()
    connectors = {"stubborn": FnConnector("stubborn", stubborn)}
    first = fake.enqueue(connector="stubborn", timeout_ms=50)
    try:
        async with running_worker(fake, connectors, runner=StepRunner(connectors), slots=1):
            await wait_until(lambda: first in fake.results, within=2)
    finally:
        stubborn.release.set()
        await asyncio.sleep(0.05)
