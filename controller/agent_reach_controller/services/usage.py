"""What a tool uses of its limits now: its rate-limit buckets, its running steps, its breaker."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agent_reach_controller.decide.ratelimits import Rate
from agent_reach_controller.services.limiter import RateLimiter, RateUse
from agent_reach_controller.services.tool_health import ToolHealth
from agent_reach_controller.storage import listings
from agent_reach_controller.storage.engine import Database
from agent_reach_controller.tools.catalog import ToolSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolUsage:
    rate: RateUse | None  # None: no rate limit
    running: int  # steps of the tool running now, every tenant's (its limits are global)
    breaker: dict[str, Any] | None  # None: no breaker (see ToolHealth.breaker_states)


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageReader:
    """Reads a tool's use of its limits, changing nothing (no bucket, no breaker)."""

    db: Database
    limiter: RateLimiter
    tool_health: ToolHealth

    async def read(self, tool: ToolSpec) -> ToolUsage:
        rate = None
        async with self.db.transaction() as conn:
            if tool.rate_limit is not None:
                rate = await self.limiter.peek(
                    conn,
                    tool.name,
                    Rate.of(tool.rate_limit),
                    keyed=tool.rate_limit.key is not None,
                    now=time.time(),
                )
            running = await listings.running_steps(conn, tool.name)
        breaker = None
        if tool.breaker is not None:
            breaker = (await self.tool_health.breaker_states(only=tool.name)).get(tool.name)
        return ToolUsage(rate=rate, running=running, breaker=breaker)
