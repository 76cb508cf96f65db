"""The memory recall benchmark's arithmetic, on cases small enough to work out by hand, and its
labelled set checked (every expected key is one of its subject's memories)."""

from __future__ import annotations

import pytest

from tests.bench.memory_recall import Query, load_labels, precision_at, recall_at, score


def test_precision_and_recall_at_k_by_hand() -> None:
    ranked = ["a", "x", "b", "y"]
    relevant = frozenset({"a", "b", "c"})

    assert precision_at(ranked, relevant, 1) == 1.0  # a
    assert precision_at(ranked, relevant, 3) == pytest.approx(2 / 3)  # a, b of a x b
    assert precision_at(ranked, relevant, 5) == pytest.approx(2 / 5)  # four returned: k counts
    assert recall_at(ranked, relevant, 1) == pytest.approx(1 / 3)
    assert recall_at(ranked, relevant, 3) == pytest.approx(2 / 3)
    assert precision_at([], relevant, 3) == 0.0


def test_scores_are_averaged_over_questions() -> None:
    queries = [
        Query("s", "q1", frozenset({"a"})),
        Query("s", "q2", frozenset({"b", "c"})),
    ]
    found = score([["a", "z"], ["z", "c", "b"]], queries, ks=(1, 3))

    assert found.precision == {1: pytest.approx(0.5), 3: pytest.approx((1 / 3 + 2 / 3) / 2)}
    assert found.recall == {1: pytest.approx(0.5), 3: pytest.approx(1.0)}
    assert found.missed == 0
    assert score([["z"], ["y"]], queries, ks=(1,)).missed == 2


def test_the_labelled_set_is_whole() -> None:
    labels = load_labels()

    assert len(labels.subjects) == 5
    assert sum(len(m) for m in labels.subjects.values()) >= 60
    assert len(labels.queries) == 40
    types = {m.type for memories in labels.subjects.values() for m in memories}
    assert types == {"profile", "preference", "fact", "goal", "project", "constraint"}
