"""Memory's embeddings on both backends: stored with the entry, searched by cosine over one
subject's entries of one model (in Python: no pgvector, no SQLite extensions here), never a stale
vector, never another subject's or tenant's entry, at most the quota's vectors read."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent_reach_controller.services.memory import Entry, MemoryInputError, Writer
from tests.integration.stack import Components, components_for, write_tools
from tests.support.models import embed

pytestmark = pytest.mark.asyncio

CALLER = Writer(tenant="acme", actor="alice")
MODEL = "embed-test"
FACTS = {
    "city": "Lives in Wuhan, in a flat near the river",
    "channel": "Prefers email over phone calls",
    "diet": "Allergic to peanuts and shellfish",
    "goal": "Training for a marathon in the spring",
}


async def _embedded(c: Components, writer: Writer, subject: str, key: str, text: str) -> str:
    written = await c.memory.put(writer, subject, Entry(type="fact", key=key, text=text))
    async with c.db.transaction() as conn:
        stored = await c.memory.set_embedding(conn, written.entry.memory_id, MODEL, embed(text))
    assert stored
    return written.entry.memory_id


async def _search(
    c: Components, subject: str, query: str, *, tenant: str = "acme", model: str = MODEL
) -> list[tuple[str, float]]:
    async with c.db.transaction() as conn:
        found = await c.memory.search_vector(conn, tenant, subject, model, embed(query), 10)
    return [(e.key, score) for e, score in found]


async def test_the_nearest_entries_of_one_subject_come_first(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [])) as c:
        for key, text in FACTS.items():
            await _embedded(c, CALLER, "u1", key, text)
        await _embedded(c, CALLER, "u2", "city", "Lives in Wuhan too")
        await _embedded(c, Writer(tenant="globex", actor="bob"), "u1", "city", "Lives in Wuhan")

        found = await _search(c, "u1", "Which city does the user live in? Wuhan?")

        assert found[0][0] == "city"
        assert sorted(k for k, _ in found) == sorted(FACTS)  # u1's only, of this tenant
        scores = [s for _, s in found]
        assert scores == sorted(scores, reverse=True)
        assert math.isclose(
            scores[0],
            _cosine(embed("Which city does the user live in? Wuhan?"), embed(FACTS["city"])),
            rel_tol=1e-5,
        )
        async with c.db.transaction() as conn:
            top = await c.memory.search_vector(conn, "acme", "u1", MODEL, embed("peanuts"), 1)
        assert [e.key for e, _ in top] == ["diet"]
        assert await _search(c, "u1", "Wuhan", model="another-model") == []
        assert await _search(c, "nobody", "Wuhan") == []


async def test_a_vector_of_another_size_is_not_compared(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path, [])) as c:
        await _embedded(c, CALLER, "u1", "city", FACTS["city"])
        other = await c.memory.put(CALLER, "u1", Entry(type="fact", key="odd", text="Lives oddly"))
        async with c.db.transaction() as conn:
            await c.memory.set_embedding(conn, other.entry.memory_id, MODEL, [1.0, 0.0, 0.0])

        assert [k for k, _ in await _search(c, "u1", "lives")] == ["city"]


async def test_equal_scores_put_the_most_recently_updated_first(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [])) as c:
        for key in ("older", "newer", "newest"):
            await _embedded(c, CALLER, "u1", key, "Likes green tea")

        assert [k for k, _ in await _search(c, "u1", "green tea")] == ["newest", "newer", "older"]


async def test_a_stale_vector_is_never_stored_and_a_new_text_clears_the_old(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [])) as c:
        first = await c.memory.put(
            CALLER, "u1", Entry(type="fact", key="city", text="Lives in Oslo")
        )
        sent_mark = first.entry.mark  # what the embed step was given
        await c.memory.put(CALLER, "u1", Entry(type="fact", key="city", text="Lives in Wuhan"))
        async with c.db.transaction() as conn:
            late = await c.memory.set_embedding(
                conn, first.entry.memory_id, MODEL, embed("Lives in Oslo"), mark=sent_mark
            )
        assert late is False
        assert (await c.memory.get("acme", first.entry.memory_id)).embedding is None

        fresh = await c.memory.get("acme", first.entry.memory_id)
        async with c.db.transaction() as conn:
            assert await c.memory.set_embedding(
                conn, fresh.memory_id, MODEL, embed(fresh.text), mark=fresh.mark
            )
        stored = await c.memory.get("acme", fresh.memory_id)
        assert (stored.embedding_model, stored.version) == (MODEL, fresh.version)  # no new version
        assert [k for k, _ in await _search(c, "u1", "Wuhan")] == ["city"]

        await c.memory.patch(CALLER, fresh.memory_id, {"text": "Lives in Lima"})
        assert await _search(c, "u1", "Lima") == []  # the old vector went with the old text

        await c.memory.forget("acme", "alice", fresh.memory_id)
        async with c.db.transaction() as conn:
            gone = await c.memory.set_embedding(conn, fresh.memory_id, MODEL, embed("Lima"))
        assert gone is False


@pytest.mark.parametrize(
    ("model", "vector", "pointer"),
    [
        (MODEL, [], "/vector"),
        (MODEL, [0.0, 0.0], "/vector"),
        (MODEL, [1.0, math.nan], "/vector"),
        (MODEL, [1.0, math.inf], "/vector"),
        (MODEL, [True, 1.0], "/vector"),
        (MODEL, [1.0] * 8193, "/vector"),
        ("", [1.0], "/model"),
        ("m" * 129, [1.0], "/model"),
    ],
    ids=["empty", "zeros", "nan", "inf", "bool", "long", "no-model", "long-model"],
)
async def test_a_vector_that_is_not_one_is_refused(
    sqlite_url: str, tmp_path: Path, model: str, vector: list[float], pointer: str
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path, [])) as c:
        written = await c.memory.put(CALLER, "u1", Entry(type="fact", key="k", text="text"))
        async with c.db.transaction() as conn:
            with pytest.raises(MemoryInputError) as refused:
                await c.memory.set_embedding(conn, written.entry.memory_id, model, vector)
        assert refused.value.problems[0].pointer == pointer
        assert (await c.memory.get("acme", written.entry.memory_id)).embedding is None


async def test_a_search_reads_no_more_vectors_than_the_quota(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [])
    async with components_for(database_url, tools, memory_per_subject=10) as c:
        for i in range(5):
            await _embedded(c, CALLER, "u1", f"k{i}", f"Likes colour number {i}")
        assert len(await _search(c, "u1", "colour")) == 5
    # The quota lowered afterwards: the subject holds more than it, and a search reads only as
    # many vectors as it allows (the most recently updated).
    async with components_for(database_url, tools, memory_per_subject=2) as c:
        assert sorted(k for k, _ in await _search(c, "u1", "colour")) == ["k3", "k4"]


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    )
