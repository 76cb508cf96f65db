"""`make bench-memory`: how well memory search finds what a run needs, on a labelled set.

The set (`memory_recall.yaml`, written by hand) holds five subjects' memories of the six types and
forty questions, each with the keys of the memories it should bring back. Every method stores the
same entries through `MemoryService` in a fresh database and ranks each subject's entries for each
question; the figures are precision@k (of the k returned, the share expected) and recall@k (of
those expected, the share among the k), averaged over the questions, for k = 1, 3, 5. Most
questions expect one memory, so precision@5 is at most about 0.3: the perfect ranking's row says
what each column can reach.

Methods: full text (Postgres tsvector 'english' and ts_rank; SQLite FTS5 porter and bm25), and
embeddings asked of an OpenAI-compatible `/embeddings` endpoint through the `model` connector (the
executor's path: SSRF guard on, 127.0.0.1 allowed) and ranked by `search_vector` (cosine in
Python). Embedders: the scripted one of the tests (a hashed bag of words: it proves the plumbing,
not meaning), and WordLlama's l2_supercat (256 dimensions, weights inside its wheel) when
AGENT_REACH_BENCH_EMBED_PYTHON names a Python that has `wordllama` (`make bench-memory` makes
one). Last, the time of one vector search over a subject of 1,000 entries of 256 floats.

Only 127.0.0.1; every loop is bounded by the set's size. AGENT_REACH_BENCH_POSTGRES: admin URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
import yaml

from agent_reach_connectors import ToolCall
from agent_reach_connectors.model import ModelConnector
from agent_reach_connectors.model_embeddings import MAX_INPUTS
from agent_reach_controller.decide.memory import TYPES
from agent_reach_controller.services.memory import Entry, MemoryLimits, MemoryService, Writer
from agent_reach_controller.storage import migrate
from agent_reach_controller.storage.engine import Database
from tests.bench.machine import header_lines
from tests.support.models import ScriptedModels

LABELS = Path(__file__).with_name("memory_recall.yaml")
SERVER = Path(__file__).with_name("embedding_server.py")
KS = (1, 3, 5)
TENANT = "bench"
WRITER = Writer(tenant=TENANT, actor="bench")
KEY_ENV = "AGENT_REACH_BENCH_MODEL_KEY"  # the scripted and local servers ignore it
SEARCH_ENTRIES, SEARCH_DIMENSIONS, SEARCH_REPEATS = 1000, 256, 20
SERVER_START_S = 60.0
SCRIPTED_NOTE = (
    "NOTE: the scripted embedder is a hashed bag of words (64 dimensions) with no meaning in it: "
    "its rows prove the plumbing (connector, stored vectors, cosine), not semantic recall."
)


# -- the labelled set -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Memory:
    key: str
    type: str
    text: str


@dataclass(frozen=True, slots=True)
class Query:
    subject: str
    text: str
    expect: frozenset[str]


@dataclass(frozen=True, slots=True)
class Labels:
    subjects: dict[str, list[Memory]]
    queries: list[Query]


def load_labels(path: Path = LABELS) -> Labels:
    """The set, checked: keys unique per subject, known types, every expected key a memory's."""
    raw = yaml.safe_load(path.read_text())
    subjects: dict[str, list[Memory]] = {}
    queries: list[Query] = []
    for subject, given in raw["subjects"].items():
        memories = [Memory(m["key"], m["type"], m["text"]) for m in given["memories"]]
        keys = [m.key for m in memories]
        if len(set(keys)) != len(keys) or any(m.type not in TYPES for m in memories):
            raise SystemExit(f"{path}: {subject}: duplicate keys or an unknown type")
        subjects[subject] = memories
        for q in given["queries"]:
            expect = frozenset(q["expect"])
            if not expect or not expect <= set(keys):
                raise SystemExit(f"{path}: {subject}: {q['q']!r} expects unknown keys")
            queries.append(Query(subject, q["q"], expect))
    return Labels(subjects, queries)


# -- the metrics ------------------------------------------------------------------------------


def precision_at(ranked: Sequence[str], relevant: frozenset[str], k: int) -> float:
    """Of the first k returned, the share that is relevant (fewer than k returned count as
    misses: the denominator is k)."""
    return len(set(ranked[:k]) & relevant) / k


def recall_at(ranked: Sequence[str], relevant: frozenset[str], k: int) -> float:
    """Of the relevant, the share among the first k returned."""
    return len(set(ranked[:k]) & relevant) / len(relevant)


@dataclass(frozen=True, slots=True)
class Scores:
    precision: dict[int, float]
    recall: dict[int, float]
    missed: int  # questions with nothing relevant in the first max(KS)


def score(
    rankings: Sequence[Sequence[str]], queries: Sequence[Query], ks: Sequence[int] = KS
) -> Scores:
    """Precision@k and recall@k averaged over the questions (macro average)."""
    pairs = list(zip(rankings, queries, strict=True))
    return Scores(
        precision={k: statistics.fmean(precision_at(r, q.expect, k) for r, q in pairs) for k in ks},
        recall={k: statistics.fmean(recall_at(r, q.expect, k) for r, q in pairs) for k in ks},
        missed=sum(1 for r, q in pairs if not set(r[: max(ks)]) & q.expect),
    )


# -- the stores -------------------------------------------------------------------------------


@contextlib.contextmanager
def backends(admin_url: str) -> Iterator[list[tuple[str, str]]]:
    """(name, URL) of a fresh migrated SQLite file and Postgres database, dropped after."""
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
        sqlite = f"sqlite:///{folder}/memory.db"
        migrate.upgrade(sqlite)
        name = f"bench_memory_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            postgres = admin_url.rsplit("/", 1)[0] + f"/{name}"
            migrate.upgrade(postgres)
            yield [("sqlite", sqlite), ("postgres", postgres)]
        finally:
            with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.asynccontextmanager
async def stored(url: str, labels: Labels) -> AsyncIterator[tuple[Database, MemoryService]]:
    """The set's memories written through MemoryService into the database at `url`."""
    db = Database(url)
    memory = MemoryService(db=db, limits=MemoryLimits(per_subject=SEARCH_ENTRIES + 10))
    try:
        for subject, memories in labels.subjects.items():
            for m in memories:
                await memory.put(WRITER, subject, Entry(type=m.type, key=m.key, text=m.text))
        yield db, memory
    finally:
        await db.close()


async def full_text(memory: MemoryService, labels: Labels) -> list[list[str]]:
    found = []
    for q in labels.queries:
        ranked = await memory.search(TENANT, q.subject, q.text, limit=max(KS))
        found.append([entry.key for entry, _ in ranked])
    return found


# -- embeddings through the model connector ----------------------------------------------------

Embed = Callable[[list[str]], Awaitable[list[list[float]]]]


@dataclass(frozen=True, slots=True)
class Embedder:
    name: str
    model: str
    url: str  # ends in /v1


@contextlib.asynccontextmanager
async def embedding(embedder: Embedder) -> AsyncIterator[Embed]:
    """A function that embeds texts as an executor's model step does (batches of MAX_INPUTS)."""
    os.environ.setdefault(KEY_ENV, "bench-no-key")
    connector = ModelConnector()
    await connector.start()
    config = {
        "endpoint": "openai_chat",
        "base_url": embedder.url,
        "api_key": f"${{env:{KEY_ENV}}}",
        "allow_hosts": ["127.0.0.1"],
    }

    async def embed(texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), MAX_INPUTS):
            batch = texts[start : start + MAX_INPUTS]
            args = {"operation": "embed", "model": embedder.model, "input": batch}
            call = ToolCall(
                tool="bench.embedder",
                task_id="bench",
                step_id=f"embed{start}",
                args=args,
                config=config,
                idempotency_key=f"bench:{start}",
                attempt=1,
                max_attempts=1,
                trace_id="0" * 32,
                traceparent="",
                timeout_s=60.0,
            )
            vectors += (await connector.invoke(call))["vectors"]
        return vectors

    try:
        yield embed
    finally:
        await connector.close()


async def by_vectors(
    db: Database, memory: MemoryService, labels: Labels, embed: Embed, model: str
) -> list[list[str]]:
    """Embed every entry (as the step after a write would), then rank by each question's."""
    for subject in labels.subjects:
        entries = await memory.entries(TENANT, subject, limit=SEARCH_ENTRIES)
        vectors = await embed([e.text for e in entries])
        async with db.transaction() as conn:
            for entry, vector in zip(entries, vectors, strict=True):
                await memory.set_embedding(conn, entry.memory_id, model, vector, mark=entry.mark)
    asked = await embed([q.text for q in labels.queries])
    found = []
    for q, vector in zip(labels.queries, asked, strict=True):
        async with db.transaction() as conn:
            ranked = await memory.search_vector(conn, TENANT, q.subject, model, vector, max(KS))
        found.append([entry.key for entry, _ in ranked])
    return found


@contextlib.contextmanager
def wordllama_server(python: str) -> Iterator[str]:
    """The local WordLlama server's /v1 URL, run by `python`, stopped after."""
    process = subprocess.Popen(
        [python, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], SERVER_START_S)
        line = process.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            raise RuntimeError(f"the embedding server did not start ({python})")
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# -- the time of one search -------------------------------------------------------------------


async def search_time(url: str) -> float:
    """Median seconds of one vector search over a subject of SEARCH_ENTRIES entries."""
    rng = random.Random(7)
    db = Database(url)
    memory = MemoryService(db=db, limits=MemoryLimits(per_subject=SEARCH_ENTRIES))
    try:
        for i in range(SEARCH_ENTRIES):
            written = await memory.put(
                WRITER, "load", Entry(type="fact", key=f"k{i}", text=f"fact number {i}")
            )
            vector = [rng.gauss(0, 1) for _ in range(SEARCH_DIMENSIONS)]
            async with db.transaction() as conn:
                await memory.set_embedding(conn, written.entry.memory_id, "load", vector)
        times = []
        for _ in range(SEARCH_REPEATS):
            query = [rng.gauss(0, 1) for _ in range(SEARCH_DIMENSIONS)]
            started = time.perf_counter()
            async with db.transaction() as conn:
                found = await memory.search_vector(conn, TENANT, "load", "load", query, 5)
            times.append(time.perf_counter() - started)
            assert len(found) == 5
        return statistics.median(times)
    finally:
        await db.close()


# -- the report -------------------------------------------------------------------------------


def row(method: str, backend: str, scores: Scores) -> str:
    cells = [f"{scores.precision[k]:5.2f}" for k in KS] + [f"{scores.recall[k]:5.2f}" for k in KS]
    return f"{method:<52} {backend:<9} " + " ".join(cells) + f"  {scores.missed:>6}"


def header(labels: Labels) -> list[str]:
    memories = sum(len(m) for m in labels.subjects.values())
    ks = [f"P@{k}" for k in KS] + [f"R@{k}" for k in KS]
    return [
        f"set       {LABELS.name}: {len(labels.subjects)} subjects, {memories} memories, "
        f"{len(labels.queries)} questions",
        "",
        f"{'method':<52} {'backend':<9} " + " ".join(f"{k:>5}" for k in ks) + "  missed@5",
    ]


async def measure(admin_url: str, embed_python: str | None) -> list[str]:
    labels = load_labels()
    lines = header(labels)
    perfect = score([sorted(q.expect) for q in labels.queries], labels.queries)
    lines.append(row("a perfect ranking (what each column can reach)", "-", perfect))
    times: dict[str, float] = {}
    with ScriptedModels() as scripted, contextlib.ExitStack() as stack:
        embedders = [
            Embedder("scripted embedder (hashed words, 64 dims)", "scripted", scripted.url)
        ]
        if embed_python:
            url = stack.enter_context(wordllama_server(embed_python))
            embedders.append(Embedder("WordLlama l2_supercat (256 dims)", "wordllama", url))
        with backends(admin_url) as urls:
            for backend, url in urls:
                async with stored(url, labels) as (db, memory):
                    method = "full text: " + (
                        "tsvector 'english', ts_rank" if backend == "postgres" else "FTS5 porter"
                    )
                    lines.append(
                        row(method, backend, score(await full_text(memory, labels), labels.queries))
                    )
                    for embedder in embedders:
                        async with embedding(embedder) as embed:
                            found = await by_vectors(db, memory, labels, embed, embedder.model)
                        lines.append(row(embedder.name, backend, score(found, labels.queries)))
                times[backend] = await search_time(url)
    lines += [
        "",
        f"one vector search over {SEARCH_ENTRIES:,} entries of {SEARCH_DIMENSIONS} floats "
        "(cosine in Python, median of "
        f"{SEARCH_REPEATS}): "
        + ", ".join(f"{backend} {seconds * 1000:.1f} ms" for backend, seconds in times.items()),
        "",
        SCRIPTED_NOTE,
    ]
    if not embed_python:
        lines.append(
            "WordLlama not measured: set AGENT_REACH_BENCH_EMBED_PYTHON to a Python with "
            "wordllama (make bench-memory makes .venv/embed)."
        )
    return lines


def main() -> int:
    admin_url = os.environ.get(
        "AGENT_REACH_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    embed_python = os.environ.get("AGENT_REACH_BENCH_EMBED_PYTHON") or None
    print("Agent-Reach memory recall bench", *header_lines(admin_url), sep="\n", flush=True)
    print(*asyncio.run(measure(admin_url, embed_python)), sep="\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
