"""How big and how long each fault scenario runs: `ci` (default) or `long`.

    AGENT_REACH_FAULTS_PROFILE=long make test-faults

The CI profile fits the whole suite in a few minutes on a 2-core machine; the long profile runs
more steps and more faults for longer. Bounds (recovery, timeouts) scale with the profile.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Kills:
    executors: int = 3
    slots: int = 6
    steps: int = 2_000
    steps_per_task: int = 50
    call_delay_s: float = 0.12
    kill_every_s: float = 2.0
    max_kills: int = 20  # kills stop earlier, once 10 % of the steps are left
    recovery_bound_s: float = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause:
    executors: int = 3
    slots: int = 8
    steps: int = 600
    steps_per_task: int = 25
    call_delay_s: float = 0.4
    rounds: int = 2
    max_rounds: int = 5
    recovery_bound_s: float = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PostgresCrash:
    executors: int = 2
    slots: int = 8
    steps: int = 1_500
    steps_per_task: int = 50
    call_delay_s: float = 0.1
    crashes: int = 3
    up_s: float = 3.0
    down_s: float = 2.0
    recovery_bound_s: float = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AmbiguousCommit:
    executors: int = 2
    slots: int = 8
    steps: int = 600
    steps_per_task: int = 20
    keyed_submits: int = 60
    call_delay_s: float = 0.02
    cuts: int = 30
    cut_every: int = 5
    drops: int = 2
    recovery_bound_s: float = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerKill:
    clients: int = 4
    keys: int = 400
    steps_per_task: int = 3
    kills: int = 10  # kills stop earlier, once every client has finished
    kill_every_s: float = 2.5
    down_s: float = 1.0
    recovery_bound_s: float = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Downstream:
    repeat: int = 1  # each downstream case this many times
    recovery_bound_s: float = 15.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Breaker:
    steps: int = 40
    cooldown_s: float = 2.0
    recovery_bound_s: float = 15.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Overload:
    max_queued_steps: int = 300
    steps_per_task: int = 20
    load_s: float = 8.0
    max_submits: int = 600
    load_clients: int = 2  # patient: they wait Retry-After after a 429
    impatient_clients: int = 2  # they do not
    executor_slots: int = 4
    call_delay_s: float = 0.05
    rss_growth_bound_mib: float = 150.0
    recovery_bound_s: float = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RollingRestart:
    clients: int = 3
    keys: int = 240
    steps_per_task: int = 2
    executors: int = 3
    pause_s: float = 1.5  # between one component's restart and the next
    shutdown_delay_s: float = 1.0  # controllers: not ready, still serving, before closing
    recovery_bound_s: float = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    name: str
    timeout_s: float  # per scenario, the hard pytest timeout
    kills: Kills
    pause: Pause
    postgres: PostgresCrash
    commit: AmbiguousCommit
    controller: ControllerKill
    downstream: Downstream
    breaker: Breaker
    overload: Overload
    rolling: RollingRestart


CI = Profile(
    name="ci",
    timeout_s=240,
    kills=Kills(),
    pause=Pause(),
    postgres=PostgresCrash(),
    commit=AmbiguousCommit(),
    controller=ControllerKill(),
    downstream=Downstream(),
    breaker=Breaker(),
    overload=Overload(),
    rolling=RollingRestart(),
)

LONG = Profile(
    name="long",
    timeout_s=1800,
    kills=Kills(steps=10_000, max_kills=150, slots=8),
    pause=Pause(steps=1_500, rounds=6, max_rounds=12),
    postgres=PostgresCrash(steps=5_000, crashes=12),
    commit=AmbiguousCommit(steps=3_000, keyed_submits=300, cuts=200, drops=8),
    controller=ControllerKill(keys=1_500, kills=40),
    downstream=Downstream(repeat=4),
    breaker=Breaker(steps=200),
    overload=Overload(load_s=40.0, max_submits=5_000, rss_growth_bound_mib=200.0),
    rolling=RollingRestart(keys=1_500),
)

PROFILES = {p.name: p for p in (CI, LONG)}


def current() -> Profile:
    name = os.environ.get("AGENT_REACH_FAULTS_PROFILE", "ci").strip().lower() or "ci"
    if name not in PROFILES:
        raise ValueError(f"AGENT_REACH_FAULTS_PROFILE={name!r}: use one of {sorted(PROFILES)}")
    return PROFILES[name]
