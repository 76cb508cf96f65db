"""References between steps: finding, resolving, escaping, and precise errors."""

from __future__ import annotations

import pytest

from agent_reach_controller.planning.references import (
    MalformedReference,
    Reference,
    UnresolvedReferenceError,
    find_malformed_references,
    find_references,
    parse_reference,
    resolve,
    unescape,
)

OUTPUTS = {
    "search": {"items": [{"id": "a1", "tags": ["x", "y"]}, {"id": "b2"}], "total": 2},
    "weather": {"summary": "rain at 9", "rain": True},
    "plain": "just text",
}


def test_find_references_with_pointers_in_document_order() -> None:
    args = {
        "a": "$search.output",
        "b": ["x", "$weather.output.summary"],
        "c/d": {"e": "$search.output.items.0.id"},
    }
    assert find_references(args) == [
        Reference(pointer="/a", step_id="search", path=()),
        Reference(pointer="/b/1", step_id="weather", path=("summary",)),
        Reference(pointer="/c~1d/e", step_id="search", path=("items", "0", "id")),
    ]


@pytest.mark.parametrize(
    "text", ["$5", "$HOME", "price $weather.output", "$$weather.output", "$5.00", "$a.outputs"]
)
def test_ordinary_strings_are_not_references(text: str) -> None:
    assert parse_reference(text) is None


@pytest.mark.parametrize(
    "text", ["$.output", "$a b.output", "$a.output..x", "$a.output[0]", "$a.output."]
)
def test_malformed_references(text: str) -> None:
    found = parse_reference(text, pointer="/p")
    assert isinstance(found, MalformedReference)
    assert found.pointer == "/p"
    assert find_malformed_references({"p": [text]})[0].pointer == "/p/0"


def test_resolve_whole_outputs_nested_paths_and_list_indexes() -> None:
    args = {
        "all": "$weather.output",
        "first": "$search.output.items.0.id",
        "tag": "$search.output.items.0.tags.1",
        "nested": {"list": ["$search.output.total", "keep $search.output"]},
        "n": 3,
    }
    assert resolve(args, OUTPUTS) == {
        "all": OUTPUTS["weather"],
        "first": "a1",
        "tag": "y",
        "nested": {"list": [2, "keep $search.output"]},
        "n": 3,
    }
    assert args["first"] == "$search.output.items.0.id"  # not mutated


def test_escape_yields_a_literal_dollar() -> None:
    args = {"price": "$$5", "ref": "$$search.output", "triple": "$$$x"}
    expected = {"price": "$5", "ref": "$search.output", "triple": "$$x"}
    assert resolve(args, OUTPUTS) == expected
    assert unescape(args) == expected
    assert find_references(args) == []


@pytest.mark.parametrize(
    ("ref", "detail"),
    [
        (
            "$search.output.missing",
            "key 'missing' is missing at $search.output (keys: items, total)",
        ),
        ("$search.output.items.5", "index 5 is out of range at $search.output.items (length 2)"),
        ("$search.output.items.first", "$search.output.items is a list; 'first' is not an index"),
        ("$search.output.items.1.tags", "key 'tags' is missing at $search.output.items.1"),
        ("$plain.output.x", "$plain.output is a str; it has no key 'x'"),
        ("$nobody.output", "no output recorded for step 'nobody'"),
        ("$.output", "is not a valid step id"),
    ],
)
def test_unresolved_reference_names_the_missing_key(ref: str, detail: str) -> None:
    with pytest.raises(UnresolvedReferenceError) as info:
        resolve({"outer": {"value": ref}}, OUTPUTS)
    assert info.value.pointer == "/outer/value"
    assert detail in info.value.detail
