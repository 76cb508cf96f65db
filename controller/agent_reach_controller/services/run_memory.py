"""What runs remember, inside the transactions that move them: the memories a run starts with
(recalled when it is created), and the memories its extraction proposed (stored when the
extraction's model step succeeds, with their provenance).

The rules are pure (decide/run_memory.py, decide/memory.py); the store is MemoryService's. A
proposal that may not be stored is recorded on the run by where it is and why, never by what
it said (it may hold a secret).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from agent_reach_controller.decide import run_memory as rules
from agent_reach_controller.domain.records import RunRow, StepRow
from agent_reach_controller.services.memory import (
    Entry,
    MemoryInputError,
    MemoryQuotaError,
    MemoryService,
    Writer,
)
from agent_reach_controller.storage.engine import Connection
from agent_reach_controller.tools.agents import AgentProfile


class RunMemory:
    """Recall for a starting run, and the store of an extraction's proposals."""

    def __init__(self, memory: MemoryService) -> None:
        self._memory = memory

    async def recalled(
        self,
        conn: Connection,
        *,
        tenant: str,
        subject: str | None,
        profile: AgentProfile,
        messages: Sequence[dict[str, Any]],
    ) -> dict[str, Any] | None:
        """The `memory` entry a run starting with `messages` records (None: it recalls
        nothing, having no subject or a profile that recalls nothing)."""
        if subject is None or profile.memory.recall == 0:
            return None
        found = await self._memory.recall_in(
            conn,
            tenant,
            subject,
            rules.query_of(messages),
            top_k=profile.memory.recall,
            token_cap=profile.memory.recall_tokens,
        )
        return rules.recall_record(found)

    async def store(
        self,
        conn: Connection,
        run: RunRow,
        step: StepRow,
        proposals: Sequence[dict[str, Any]],
        *,
        types: Sequence[str],
        now: datetime,
    ) -> dict[str, Any]:
        """Store what an extraction proposed, each proposal checked alone; the `extraction`
        entry that says what was stored, what was already known, and what was refused."""
        assert run.subject is not None
        provenance = await self._memory.provenance(conn, run.run_id, current_task=step.task_id)
        source = {"run": run.run_id, "task": step.task_id, "step": step.step_id}
        stored: list[dict[str, Any]] = []
        refused: list[dict[str, str]] = []
        seen: set[tuple[str, str]] = set()
        for index, proposal in enumerate(proposals):
            at = f"/memories/{index}"
            problems = rules.proposal_problems(proposal, at=at, types=types, seen=seen)
            if problems:
                refused += [{"pointer": p.pointer, "detail": p.detail} for p in problems]
                continue
            seen.add((proposal["type"], proposal["key"]))
            entry = Entry(
                type=proposal["type"],
                key=proposal["key"],
                text=proposal["text"],
                value=proposal.get("value"),
                confidence=float(proposal.get("confidence", 1.0)),
            )
            writer = Writer(
                tenant=run.tenant,
                actor=f"run:{run.run_id}",
                origin=provenance.origin(entry),
                source=source,
            )
            try:
                written = await self._memory.write_in(conn, writer, run.subject, entry, now=now)
            except MemoryInputError as exc:  # a caller's entry at this key, say
                refused += [{"pointer": at + p.pointer, "detail": p.detail} for p in exc.problems]
                continue
            except MemoryQuotaError as exc:
                refused.append({"pointer": at, "detail": str(exc)})
                continue
            action = "created" if written.created else "updated" if written.changed else "unchanged"
            stored.append(
                {
                    "memory_id": written.entry.memory_id,
                    "type": entry.type,
                    "key": entry.key,
                    "origin": writer.origin.value,
                    "action": action,
                }
            )
        return {"state": "done", "source": source, "stored": stored, "refused": refused}
