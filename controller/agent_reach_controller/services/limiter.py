"""Where rate-limit buckets live: in memory, in Postgres, or in Redis with Postgres behind it.

Why not a library. `limits` and `pyrate-limiter` are well kept, but a claim needs three things
they do not give together: many buckets decided in one round trip (a claim leases a batch of
steps of many tools and keys), the wait of a refused call (it becomes the step's durable
`not_before`, so a limited step waits in the queue, not in an executor slot), and a Postgres
store that takes part in the claim's own transaction (a rolled-back claim then spends nothing).
GCRA needs one number per bucket, so the three stores below are short; the rule itself is the
pure `decide.ratelimits.admit`, and the Lua copy of it is tested against that function.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from agent_reach_controller.decide.ratelimits import (
    BucketUse,
    Rate,
    admit,
    bucket_key,
    floor_tat,
    in_use,
)
from agent_reach_controller.storage import flow
from agent_reach_controller.storage.engine import Connection

log = logging.getLogger(__name__)

Ask = tuple[str, Rate]
# A keyed limit's peek counts at most this many key buckets holding state; in Redis it examines
# at most SCAN_ROUNDS x SCAN_COUNT keys (SCAN's COUNT is a hint, so about that many).
KEYS_COUNTED = 10_000
SCAN_ROUNDS = 20
SCAN_COUNT = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class RateUse:
    """A tool's rate-limit use now: its bucket's, or for a keyed limit the busiest key's (among
    those counted) and how many key buckets hold state."""

    busiest: BucketUse
    keys: int | None = None  # None: the limit is not keyed
    more_keys: bool = False  # more key buckets than KEYS_COUNTED, or than one bounded scan saw


def _keyed(held: Sequence[float], *, now: float, rate: Rate, more: bool) -> RateUse:
    """The use of a keyed limit whose key buckets holding state have these TATs."""
    latest = max(held, default=None)
    return RateUse(busiest=in_use(latest, now, rate), keys=len(held), more_keys=more)


class MemoryLimiter:
    """Buckets in this process: the embedded mode, where one process does all the dispatching.

    It cannot know what was admitted before it started, so every bucket starts empty.
    """

    def __init__(self) -> None:
        self._since = time.time()
        self._tats: dict[str, float] = {}

    async def acquire(self, conn: Connection, asks: Sequence[Ask], now: float) -> list[float]:
        waits = []
        for bucket, rate in asks:
            tat, wait = admit(self._tats.get(bucket), now, rate, floor=floor_tat(rate, self._since))
            self._tats[bucket] = tat
            waits.append(wait)
        return waits

    async def peek(
        self, conn: Connection, tool: str, rate: Rate, *, keyed: bool, now: float
    ) -> RateUse:
        """A tool's use now (see RateUse); nothing changes."""
        floor = floor_tat(rate, self._since)
        if not keyed:
            return RateUse(busiest=in_use(max(self._tats.get(tool, 0.0), floor), now, rate))
        prefix = bucket_key(tool, "")
        held: list[float] = []
        for name, tat in self._tats.items():
            if name.startswith(prefix) and max(tat, floor) > now:
                if len(held) == KEYS_COUNTED:
                    return _keyed(held, now=now, rate=rate, more=True)
                held.append(max(tat, floor))
        return _keyed(held, now=now, rate=rate, more=False)

    async def close(self) -> None:
        return None


class SqlLimiter:
    """Buckets in the `rate_buckets` table, decided inside the claim's transaction.

    Started with `since`, the time before which its rows may be stale (another store was in
    use): buckets are raised to empty as of then.
    """

    def __init__(self, since: float = 0.0) -> None:
        self.since = since

    async def acquire(self, conn: Connection, asks: Sequence[Ask], now: float) -> list[float]:
        """GCRA over the bucket rows, locked until commit: the wait of each ask, 0 if taken."""
        tats = await flow.lock_buckets(conn, [bucket for bucket, _ in asks])
        before = dict(tats)
        waits = []
        for bucket, rate in asks:
            tats[bucket], wait = admit(tats[bucket], now, rate, floor=floor_tat(rate, self.since))
            waits.append(wait)
        await flow.save_buckets(conn, {b: t for b, t in tats.items() if t != before[b]})
        return waits

    async def peek(
        self, conn: Connection, tool: str, rate: Rate, *, keyed: bool, now: float
    ) -> RateUse:
        """A tool's use now (see RateUse), read without locking a bucket row or writing one."""
        floor = floor_tat(rate, self.since)
        if not keyed:
            tat = await flow.peek_bucket(conn, tool)
            return RateUse(busiest=in_use(max(tat or 0.0, floor), now, rate))
        count, latest = await flow.peek_key_buckets(conn, tool, after=now, up_to=KEYS_COUNTED + 1)
        return RateUse(
            busiest=in_use(None if latest is None else max(latest, floor), now, rate),
            keys=min(count, KEYS_COUNTED),
            more_keys=count > KEYS_COUNTED,
        )

    async def close(self) -> None:
        return None


# KEYS[1]: the epoch key (when this Redis started keeping buckets); KEYS[2..]: one per ask.
# ARGV[1]: a floor time from the caller; then interval and tolerance of each ask, in order.
# Time is Redis's own clock, so every replica agrees. A missing epoch means Redis is new or was
# wiped: buckets then start empty as of now, since what they admitted before is unknown.
# Returns each ask's wait in seconds, as strings (Redis truncates Lua numbers to integers).
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local epoch = tonumber(redis.call('GET', KEYS[1]))
if not epoch then
  epoch = now
  redis.call('SET', KEYS[1], string.format('%.6f', now))
end
local since = math.max(epoch, tonumber(ARGV[1]))
local tats = {}
local waits = {}
for i = 2, #KEYS do
  local key = KEYS[i]
  local interval = tonumber(ARGV[2 * i - 2])
  local tolerance = tonumber(ARGV[2 * i - 1])
  local tat = tats[key]
  if tat == nil then
    tat = tonumber(redis.call('GET', key)) or 0
  end
  tat = math.max(tat, since + tolerance + interval)
  local allowed_at = tat - tolerance
  if now + 0.000001 < allowed_at then
    waits[i - 1] = string.format('%.6f', allowed_at - now)
  else
    tat = math.max(tat, now) + interval
    waits[i - 1] = '0'
  end
  tats[key] = tat
end
for key, tat in pairs(tats) do
  local ttl = math.ceil((tat - now) * 1000) + 1000
  redis.call('SET', key, string.format('%.6f', tat), 'PX', ttl)
end
return waits
"""


class RedisLimiter:
    """Buckets in Redis (one script call per claim); Postgres takes over while Redis is down.

    Each switch between the two stores raises buckets to empty as of the switch, because the
    store taken over may hold older state: the limit holds through the change at the price of
    one burst's delay. Redis is only ever a cache of rate state; nothing durable lives there.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        timeout: float = 0.5,
        retry_every: float = 2.0,
    ) -> None:
        # Cluster-safe: every key shares the hash tag {rl}, so one script may touch them all.
        self._prefix = f"{prefix}{{rl}}:"
        self._redis: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._script = self._redis.register_script(_GCRA)
        self._fallback = SqlLimiter()
        self._retry_every = retry_every
        self._down_until = 0.0  # monotonic; until then Postgres decides without asking Redis
        self._falling_back = False
        self._since = 0.0
        self.fallbacks = 0

    @property
    def degraded(self) -> bool:
        return self._down_until > time.monotonic()

    async def acquire(self, conn: Connection, asks: Sequence[Ask], now: float) -> list[float]:
        if self._falling_back:
            if self.degraded:
                return await self._fallback.acquire(conn, asks, now)
            self._since = now  # trying Redis again: its buckets may be older than Postgres's
        keys = [f"{self._prefix}epoch"]
        argv: list[str] = [f"{self._since:.6f}"]
        for bucket, rate in asks:
            keys.append(f"{self._prefix}b:{bucket}")
            argv += [repr(rate.interval), repr(rate.tolerance)]
        try:
            waits = await self._script(keys=keys, args=argv)
        except (RedisError, OSError, TimeoutError) as exc:
            self._down_until = time.monotonic() + self._retry_every
            if not self._falling_back:
                self._falling_back = True
                self._fallback.since = now
                self.fallbacks += 1
                log.warning(
                    "rate limits: Redis is unreachable (%s); Postgres decides until it is back",
                    type(exc).__name__,
                    extra={"event": "rate_limit_fallback"},
                )
            return await self._fallback.acquire(conn, asks, now)
        if self._falling_back:
            self._falling_back = False
            log.warning("rate limits: Redis is back", extra={"event": "rate_limit_recovered"})
        return [float(w) for w in waits]

    async def peek(
        self, conn: Connection, tool: str, rate: Rate, *, keyed: bool, now: float
    ) -> RateUse:
        """A tool's use now (see RateUse), by Redis's clock; from Postgres while Redis is down.

        Nothing changes: no bucket, and no switch between the stores (only `acquire` decides
        that Redis is down, as only it pays for a wrong guess).
        """
        if not (self._falling_back and self.degraded):
            try:
                return await self._peek_redis(tool, rate, keyed=keyed)
            except (RedisError, OSError, TimeoutError):
                pass
        return await self._fallback.peek(conn, tool, rate, keyed=keyed, now=now)

    async def _peek_redis(self, tool: str, rate: Rate, *, keyed: bool) -> RateUse:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.get(f"{self._prefix}epoch")
            if not keyed:
                pipe.get(f"{self._prefix}b:{tool}")
            answers = await pipe.execute()
        seconds, micros = answers[0]
        now = seconds + micros / 1_000_000
        epoch = answers[1]
        # As the script would: a missing epoch, or a return from Postgres, starts buckets full.
        since = now if epoch is None or self._falling_back else max(float(epoch), self._since)
        floor = floor_tat(rate, since)
        if not keyed:
            tat = 0.0 if answers[2] is None else float(answers[2])
            return RateUse(busiest=in_use(max(tat, floor), now, rate))
        names, more = await self._scan(f"{self._prefix}b:{_glob_escape(bucket_key(tool, ''))}*")
        values = await self._redis.mget(names) if names else []
        tats = [max(float(v), floor) for v in values if v is not None]
        return _keyed([t for t in tats if t > now], now=now, rate=rate, more=more)

    async def _scan(self, pattern: str) -> tuple[list[bytes], bool]:
        """Keys matching `pattern`, up to KEYS_COUNTED, from at most SCAN_ROUNDS rounds of SCAN
        (SCAN walks the whole database, so this bounds the keys examined, not just returned);
        and whether there may be more."""
        names: list[bytes] = []
        cursor = 0
        for _ in range(SCAN_ROUNDS):
            cursor, batch = await self._redis.scan(cursor=cursor, match=pattern, count=SCAN_COUNT)
            names += batch
            if cursor == 0 or len(names) > KEYS_COUNTED:
                break
        return names[:KEYS_COUNTED], cursor != 0 or len(names) > KEYS_COUNTED

    async def close(self) -> None:
        await self._redis.aclose()


def _glob_escape(text: str) -> str:
    """`text` matched literally in a Redis MATCH pattern."""
    return "".join(f"\\{ch}" if ch in "*?[]\\" else ch for ch in text)


RateLimiter = MemoryLimiter | SqlLimiter | RedisLimiter
