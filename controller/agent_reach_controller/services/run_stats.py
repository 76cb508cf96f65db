"""An agent judged by what its runs got done: completion, rounds, tokens, cost, tool errors and
made-up claims, per version, over the tenant's ended runs (those retention still keeps)."""

from __future__ import annotations

from dataclasses import dataclass

from agent_reach_controller.domain.records import ENDED_RUN_STATES, RunStatus
from agent_reach_controller.services.rounds import ROUND_STEPS
from agent_reach_controller.storage import run_stats as store
from agent_reach_controller.storage.engine import Database
from agent_reach_controller.storage.run_stats import VersionSums


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentVersionStats:
    """One version's figures; a rate is None when nothing it divides by happened."""

    version: str
    runs: int  # ended runs
    completed: int  # of them, answered (succeeded)
    completion_rate: float | None
    average_rounds: float | None
    input_tokens_per_run: float | None
    output_tokens_per_run: float | None
    cost_per_run: float | None
    tool_steps: int
    tool_errors: int
    tool_error_rate: float | None
    ungrounded: int  # answered runs with claims nothing showed
    ungrounded_claim_rate: float | None  # over answered runs

    @classmethod
    def of(cls, sums: VersionSums) -> AgentVersionStats:
        return cls(
            version=sums.version,
            runs=sums.runs,
            completed=sums.succeeded,
            completion_rate=_ratio(sums.succeeded, sums.runs),
            average_rounds=_ratio(sums.rounds, sums.runs),
            input_tokens_per_run=_ratio(sums.input_tokens, sums.runs),
            output_tokens_per_run=_ratio(sums.output_tokens, sums.runs),
            cost_per_run=_ratio(sums.cost, sums.runs),
            tool_steps=sums.tool_steps,
            tool_errors=sums.tool_failures,
            tool_error_rate=_ratio(sums.tool_failures, sums.tool_steps),
            ungrounded=sums.ungrounded,
            ungrounded_claim_rate=_ratio(sums.ungrounded, sums.succeeded),
        )

    @classmethod
    def none(cls, version: str) -> AgentVersionStats:
        """A version no ended run of the tenant's used."""
        return cls(
            version=version,
            runs=0,
            completed=0,
            completion_rate=None,
            average_rounds=None,
            input_tokens_per_run=None,
            output_tokens_per_run=None,
            cost_per_run=None,
            tool_steps=0,
            tool_errors=0,
            tool_error_rate=None,
            ungrounded=0,
            ungrounded_claim_rate=None,
        )


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


@dataclass(frozen=True, slots=True)
class RunStatsService:
    """Reads an agent's figures; changes nothing."""

    db: Database

    async def per_version(
        self, tenant: str, agent: str, *, version: str | None = None
    ) -> list[AgentVersionStats]:
        """Each version's figures, newest first (one row for `version` if given, runs or not)."""
        async with self.db.transaction() as conn:
            sums = await store.version_sums(
                conn,
                tenant=tenant,
                agent=agent,
                ended=sorted(ENDED_RUN_STATES),
                succeeded=RunStatus.SUCCEEDED,
                round_steps=sorted(ROUND_STEPS),
                version=version,
            )
        if version is not None and not sums:
            return [AgentVersionStats.none(version)]
        return [AgentVersionStats.of(s) for s in sums]
