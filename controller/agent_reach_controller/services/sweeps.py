"""Background sweeps: each a named loop of its own, supervised, so one that fails never holds up
the others (a broken audit seal must not stop leases from expiring).

Every replica runs every sweep; row locks (`FOR UPDATE SKIP LOCKED`, compare-and-set) keep
replicas from colliding. A sweep that raises is logged with its name, counted
(`agent_reach_sweep_failures_total{sweep}`) and runs again at its next interval; a lost database
also tells the lease keeper, which then holds session expiry until storage has been back a while.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent_reach_controller.storage.engine import STORAGE_DOWN

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    """One background duty: `run` once every `every` seconds, and, for a duty whose cost grows
    with the data (counting the whole queue), no more than `share` of the time."""

    name: str
    run: Callable[[], Awaitable[Any]]
    every: float
    share: float = 1.0

    def pause_after(self, took: float) -> float:
        """Seconds to wait after a run that took `took` seconds."""
        return max(self.every, took * (1 / self.share - 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class Supervision:
    """What a sweep's failure tells: a counter by sweep name, and the lease keeper on an outage."""

    failed: Callable[[str], None]
    storage_down: Callable[[], None]


async def run_sweep(sweep: Sweep, supervision: Supervision, *, offset: float = 0.0) -> None:
    """Run `sweep` forever (until cancelled), first after `offset` seconds; a failure never
    ends the loop."""
    await asyncio.sleep(offset)
    loop = asyncio.get_running_loop()
    while True:
        began = loop.time()
        try:
            await sweep.run()
        except asyncio.CancelledError:
            raise
        except STORAGE_DOWN as exc:
            supervision.storage_down()
            supervision.failed(sweep.name)
            log.warning(
                "sweep %s: storage unavailable (%s)",
                sweep.name,
                type(exc).__name__,
                extra={"event": "storage_down", "sweep": sweep.name},
            )
        except Exception:
            supervision.failed(sweep.name)
            log.exception(
                "sweep %s failed; it runs again in %.1fs",
                sweep.name,
                sweep.every,
                extra={"event": "sweep_failed", "sweep": sweep.name},
            )
        await asyncio.sleep(sweep.pause_after(loop.time() - began))


def start(sweeps: Sequence[Sweep], supervision: Supervision) -> list[asyncio.Task[None]]:
    """One task per sweep, named after it. Sweeps with the same interval are spread across it,
    so their transactions do not all ask for a connection at the same instant."""
    tasks = []
    for sweep in sweeps:
        peers = [s for s in sweeps if s.every == sweep.every]
        offset = sweep.every * peers.index(sweep) / len(peers)
        tasks.append(
            asyncio.create_task(
                run_sweep(sweep, supervision, offset=offset), name=f"sweep-{sweep.name}"
            )
        )
    return tasks
