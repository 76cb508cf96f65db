"""Trigger templates: `$event` references found when saved, filled from each event."""

from __future__ import annotations

from typing import Any

import pytest

from agent_reach_controller.planning import templates
from agent_reach_controller.planning.problems import PlanInvalidError, Problem
from agent_reach_controller.planning.templates import EventReference

ORIGIN = {"name": "t", "version": 1, "event_id": "e"}


def plan(args: Any, context: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"steps": [{"step_id": "a", "tool": "x", "args": args}]}
    if context is not None:
        body["context"] = context
    return body


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("$event", EventReference("", ())),
        ("$event.a.0.b", EventReference("", ("a", "0", "b"))),
        ("$events", None),
        ("$$event.a", None),
        ("event.a", None),
        ("$step.output.x", None),
    ],
)
def test_what_is_a_reference(text: str, read: Any) -> None:
    assert templates.parse(text) == read


@pytest.mark.parametrize("text", ["$event.", "$event..a", "$event.a."])
def test_malformed_references_are_problems(text: str) -> None:
    read = templates.parse(text, "/steps/0/args/x")
    assert isinstance(read, Problem)
    assert (read.pointer, read.code) == ("/steps/0/args/x", "invalid_reference")


def test_fill_keeps_the_event_types_and_reaches_into_lists() -> None:
    event = {"qty": 3, "ok": True, "lines": [{"sku": "A"}, {"sku": "B"}], "none": None}
    args = {
        "n": "$event.qty",
        "ok": "$event.ok",
        "sku": "$event.lines.1.sku",
        "all": "$event",
        "nothing": "$event.none",
        "said": "order $event.qty",  # not a whole string: text
        "literal": "$$event.qty",  # escaped: unescaped at submit, never filled
        "nested": ["$event.lines.0"],
    }
    filled = templates.fill(plan(args, {"who": "$event.lines.0.sku"}), event, ORIGIN)
    assert filled["steps"][0]["args"] == {
        "n": 3,
        "ok": True,
        "sku": "B",
        "all": event,
        "nothing": None,
        "said": "order $event.qty",
        "literal": "$$event.qty",
        "nested": [{"sku": "A"}],
    }
    assert filled["context"] == {"who": "A", "event": event, "trigger": ORIGIN}


def test_fill_names_every_missing_part_where_the_template_reads_it() -> None:
    args = {"a": "$event.customer.email", "b": "$event.lines.5", "c": "$event.qty.x"}
    with pytest.raises(PlanInvalidError) as raised:
        templates.fill(plan(args), {"lines": [], "qty": 1}, ORIGIN)
    said = {p.pointer: (p.code, p.detail) for p in raised.value.problems}
    assert set(said) == {"/steps/0/args/a", "/steps/0/args/b", "/steps/0/args/c"}
    assert {code for code, _ in said.values()} == {"missing_event_field"}
    assert "key 'customer' is missing at $event" in said["/steps/0/args/a"][1]
    assert "out of range" in said["/steps/0/args/b"][1]
    assert "$event.qty is a int" in said["/steps/0/args/c"][1]


def test_fill_leaves_the_template_unchanged() -> None:
    template = plan({"n": "$event.qty"})
    templates.fill(template, {"qty": 1}, ORIGIN)
    assert template == plan({"n": "$event.qty"})
