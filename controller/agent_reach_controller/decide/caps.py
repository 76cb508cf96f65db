"""Blast-radius caps as pure rules: what one call charges, and which charges a set of caps admits.

A tool declares the side effects of one call per class (`effects: {payment: 1}`, `{rows:
"size(args.rows)"}`) and its `cost`. A cap bounds the units of one class over a scope: one
task's whole life (the plan's `caps`, and the `per_task` caps of its tenant's policy) or a
tenant's rolling window (`caps` of the tenant in the policy file). A step is charged once, just
before it first runs: all of its capped classes, or (when one would go over) none of them.
What a call charges is computed in `planning/effects.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent_reach_controller.planning.effects import PRECISION

# A tenant's window is counted in buckets of a sixtieth of it (at least a second): a charge
# counts against the window for between `window` and `window + window / 60` after it was made,
# so the cap is never exceeded and frees up at most one bucket late.
BUCKETS_PER_WINDOW = 60

Key = tuple[str, str]  # (scope, effect class): one counter


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantCaps:
    """A tenant's caps from the policy: per rolling window, and for each of its tasks."""

    # effect class -> (limit, window in seconds)
    windows: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # effect class -> limit over each task's life, besides the task's own caps
    per_task: Mapping[str, float] = field(default_factory=dict)


NO_TENANT_CAPS = TenantCaps()


@dataclass(frozen=True, slots=True, kw_only=True)
class Cap:
    """A limit on one class of effects over one scope: a task's life, or a tenant's window."""

    scope: str  # "task:<task id>" or "tenant:<name>": whose counter
    effect: str
    limit: float
    window_s: float | None = None  # None: the task's whole life
    owner: str  # who set it, for receipts: "the task's", "tenant acme's"

    @property
    def key(self) -> Key:
        return (self.scope, self.effect)


def caps_for(
    *,
    task_id: str,
    tenant: str,
    effects: frozenset[str],
    task_caps: Mapping[str, float] | None,
    tenant_caps: TenantCaps,
) -> list[Cap]:
    """The caps that bound a step of this task charging these classes (task caps first).

    A task's own cap and its tenant's `per_task` cap count on the same counter: the lower wins.
    """
    found: list[Cap] = []
    own = task_caps or {}
    for effect in sorted(effects):
        limits = [(own[effect], "the task's")] if effect in own else []
        if effect in tenant_caps.per_task:
            limits.append((tenant_caps.per_task[effect], f"tenant {tenant}'s per-task"))
        if limits:
            limit, owner = min(limits, key=lambda item: item[0])
            found.append(Cap(scope=f"task:{task_id}", effect=effect, limit=limit, owner=owner))
    for effect in sorted(effects & set(tenant_caps.windows)):
        limit, window = tenant_caps.windows[effect]
        found.append(
            Cap(
                scope=f"tenant:{tenant}",
                effect=effect,
                limit=limit,
                window_s=window,
                owner=f"tenant {tenant}'s",
            )
        )
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """One step about to run: what it charges and the caps that bound it."""

    step_key: int
    tool: str
    charges: Mapping[str, float]
    caps: Sequence[Cap]


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """The cap a step would have gone over, with the figures its receipt gives."""

    cap: Cap
    asked: float
    used: float

    def message(self, tool: str) -> str:
        cap = self.cap
        within = when = ""
        if cap.window_s is not None:
            within = f" per {describe_window(cap.window_s)}"
            when = f" in the last {describe_window(cap.window_s)}"
        return (
            f"not run: {tool} would use {self.asked:g} of {cap.effect!r}, but {cap.owner} cap "
            f"on {cap.effect!r} is {cap.limit:g}{within} and {self.used:g} has been used{when}; "
            "the tool was not called"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "scope": self.cap.scope,
            "effect": self.cap.effect,
            "limit": self.cap.limit,
            "window_s": self.cap.window_s,
            "used": self.used,
            "asked": self.asked,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """What `admit` decided: the steps charged, the refused, and what each counter gained."""

    admitted: list[int]
    refused: dict[int, Refusal]
    added: dict[Key, float]


def admit(asks: Sequence[Ask], used: Mapping[Key, float]) -> Admission:
    """Decide asks in order against the counters' current use.

    A step is admitted when every cap that bounds it stays within its limit (exactly at the
    limit is within); then every one of its counters grows. Otherwise nothing is charged and
    the first cap it would exceed is its refusal.
    """
    now_used = dict(used)
    admitted: list[int] = []
    refused: dict[int, Refusal] = {}
    added: dict[Key, float] = {}
    for ask in asks:
        over = next(
            (
                Refusal(cap=cap, asked=ask.charges[cap.effect], used=now_used.get(cap.key, 0.0))
                for cap in ask.caps
                if cap.effect in ask.charges
                and _sum(now_used.get(cap.key, 0.0), ask.charges[cap.effect]) > cap.limit
            ),
            None,
        )
        if over is not None:
            refused[ask.step_key] = over
            continue
        admitted.append(ask.step_key)
        for key in {cap.key for cap in ask.caps if cap.effect in ask.charges}:
            units = ask.charges[key[1]]
            now_used[key] = _sum(now_used.get(key, 0.0), units)
            added[key] = _sum(added.get(key, 0.0), units)
    return Admission(admitted=admitted, refused=refused, added=added)


def _sum(a: float, b: float) -> float:
    return round(a + b, PRECISION)


def bucket_width(window_s: float) -> int:
    """Seconds per counting bucket of a window."""
    return max(1, int(window_s // BUCKETS_PER_WINDOW))


def bucket_start(window_s: float, now_s: float) -> int:
    """The start (Unix seconds) of the bucket `now_s` is counted in."""
    width = bucket_width(window_s)
    return int(now_s // width) * width


def window_floor(window_s: float, now_s: float) -> float:
    """Buckets starting after this may hold charges made within the window ending now."""
    return now_s - window_s - bucket_width(window_s)


def describe_window(seconds: float) -> str:
    """`86400` -> "24h", `90` -> "90s", `1800` -> "30m"."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
