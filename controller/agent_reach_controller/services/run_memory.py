"""What runs remember, inside the transactions that move them: the memories a run starts with
(recalled when it is created, by full text; or, when its profile names an embedding model, when
its recall step has embedded its input and its subject's memories), and the memories its
extraction proposed (stored when the extraction's model step succeeds, with their provenance).

The rules are pure (decide/run_memory.py, decide/memory.py); the store is MemoryService's. A
proposal that may not be stored is recorded on the run by where it is and why, never by what
it said (it may hold a secret).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_reach_controller.decide import memory as memory_rules
from agent_reach_controller.decide import run_memory as rules
from agent_reach_controller.domain.records import RunRow, StepRow
from agent_reach_controller.services.memory import (
    Entry,
    MemoryInputError,
    MemoryQuotaError,
    MemoryService,
    Writer,
)
from agent_reach_controller.storage import memory as memory_store
from agent_reach_controller.storage import run_memory as store
from agent_reach_controller.storage.engine import Connection
from agent_reach_controller.tools.agents import AgentProfile


@dataclass(frozen=True, slots=True)
class Start:
    """How a starting run recalls: the `memory` entry it records now (by full text), or the
    arguments of its recall step (by embeddings: the entry is recorded when the step answers).
    Neither: it recalls nothing (no subject, or a profile that recalls nothing)."""

    record: dict[str, Any] | None = None
    embed: dict[str, Any] | None = None


class RunMemory:
    """Recall for a starting run, and the store of an extraction's proposals."""

    def __init__(self, memory: MemoryService) -> None:
        self._memory = memory

    async def starting(
        self,
        conn: Connection,
        *,
        tenant: str,
        subject: str | None,
        profile: AgentProfile,
        messages: Sequence[dict[str, Any]],
    ) -> Start:
        """How a run starting with `messages` recalls: by embeddings when its profile names an
        embedding model (its input and at most 63 of its subject's memories still without a
        vector for that model are embedded first), else by full text, now."""
        wanted = profile.memory.embeddings
        query = rules.query_of(messages)
        if subject is None or profile.memory.recall == 0:
            return Start()
        if wanted is None or not query.strip():
            return Start(record=await self.recalled(conn, tenant, subject, profile, query))
        unembedded = await store.unembedded(
            conn, tenant, subject, wanted.model, limit=rules.MAX_EMBED_MEMORIES
        )
        return Start(embed=rules.embed_args(wanted.model, query, unembedded))

    async def recalled(
        self,
        conn: Connection,
        tenant: str,
        subject: str,
        profile: AgentProfile,
        query: str,
        *,
        fallback: str | None = None,
    ) -> dict[str, Any]:
        """The `memory` entry of a run that recalls by full text what matches `query`
        (`fallback`: why it does so although its profile names an embedding model)."""
        found = await self._memory.recall_in(
            conn,
            tenant,
            subject,
            query,
            top_k=profile.memory.recall,
            token_cap=profile.memory.recall_tokens,
        )
        said = rules.recall_record(found)
        return said if fallback is None else said | {"by": "full_text", "fallback": fallback}

    async def recalled_without_vectors(
        self, conn: Connection, run: RunRow, profile: AgentProfile, why: str
    ) -> dict[str, Any]:
        """The `memory` entry of a run whose recall step failed: full text, saying why."""
        assert run.subject is not None
        said = await memory_store.user_messages(conn, run.run_id)
        query = rules.query_of([m for m in said if isinstance(m, Mapping)])
        return await self.recalled(conn, run.tenant, run.subject, profile, query, fallback=why)

    async def recalled_by_vectors(
        self, conn: Connection, run: RunRow, profile: AgentProfile, step: StepRow, output: Any
    ) -> tuple[dict[str, Any], int]:
        """The `memory` entry of a run whose recall step answered `output`, and how many
        memories' vectors were stored: each memory's vector stored with it (unless its text
        changed since it was sent), then the subject's memories embedded by the model ranked by
        cosine to the input's, merged with the pinned ones under the top K and token cap."""
        assert run.subject is not None
        try:
            embedded = rules.read_embedded(step.args, output)
        except ValueError as exc:
            said = await self.recalled_without_vectors(conn, run, profile, str(exc))
            return said, 0
        stored = 0
        for memory_id, mark, vector in embedded.memories:
            try:
                stored += await self._memory.set_embedding(
                    conn, memory_id, embedded.model, vector, mark=mark
                )
            except MemoryInputError:  # not a vector we can compare: that memory stays unranked
                continue
        top_k = profile.memory.recall
        ranked = await self._memory.search_vector(
            conn, run.tenant, run.subject, embedded.model, embedded.query, limit=top_k * 3
        )
        pinned = await memory_store.list_entries(
            conn, run.tenant, run.subject, limit=self._memory.limits.per_subject, pinned=True
        )
        found = memory_rules.recall(
            rules.near_enough(ranked),
            pinned,
            top_k=top_k,
            token_cap=profile.memory.recall_tokens,
        )
        said = rules.recall_record(found) | {"by": "embeddings", "model": embedded.model}
        return said, stored

    async def put_down(
        self, conn: Connection, step: StepRow, output: Mapping[str, Any] | Any, *, embedded: int
    ) -> None:
        """The recall step's output (and its receipt's copy) without the vectors: they live
        with the memories only, so a delete leaves none behind."""
        await store.put_output(conn, step.id, rules.embed_summary(output, embedded=embedded))

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
