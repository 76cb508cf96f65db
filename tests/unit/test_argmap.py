"""Argument mapping: names, defaults and types as a downstream wants them."""

from __future__ import annotations

from typing import Any

import pytest

from agent_reach_controller.planning.argmap import ArgMapError, apply, to_camel, to_snake
from agent_reach_controller.tools.catalog import ArgMap


@pytest.mark.parametrize(
    ("camel", "snake"),
    [("orderId", "order_id"), ("customerEmailAddress", "customer_email_address"), ("id", "id")],
)
def test_names_go_both_ways(camel: str, snake: str) -> None:
    assert to_snake(camel) == snake
    assert to_camel(snake) == camel


def test_acronyms_and_digits_read_as_words() -> None:
    assert to_snake("HTTPServerURL") == "http_server_url"
    assert to_snake("line2Total") == "line2_total"


def test_case_renames_every_key_rename_wins_and_defaults_fill_in() -> None:
    mapping = ArgMap(case="camel", rename={"qty": "quantity"}, defaults={"currency": "EUR"})
    args = {
        "order_id": "A1",
        "qty": 2,
        "ship_to": {"post_code": "430000", "lines": [{"sku_id": 1}]},
    }
    assert apply(mapping, args) == {
        "orderId": "A1",
        "quantity": 2,
        "shipTo": {"postCode": "430000", "lines": [{"skuId": 1}]},
        "currency": "EUR",
    }
    assert apply(mapping, {"currency": "CNY"})["currency"] == "CNY"  # a default never overrides


@pytest.mark.parametrize(
    ("kind", "given", "wanted"),
    [
        ("string", 42, "42"),
        ("string", True, "true"),
        ("integer", "17", 17),
        ("integer", 3.0, 3),
        ("number", "2.5", 2.5),
        ("number", "7", 7),
        ("boolean", "TRUE", True),
        ("boolean", 0, False),
        ("integer", None, None),
    ],
)
def test_values_are_coerced(kind: str, given: Any, wanted: Any) -> None:
    mapping = ArgMap.model_validate({"coerce": {"a.b": kind}})
    assert apply(mapping, {"a": {"b": given}}) == {"a": {"b": wanted}}


@pytest.mark.parametrize(
    ("kind", "given"),
    [("integer", "3.5"), ("integer", True), ("number", "nan"), ("boolean", "yes"), ("string", [1])],
)
def test_a_value_that_cannot_be_coerced_names_its_argument_not_its_value(
    kind: str, given: Any
) -> None:
    mapping = ArgMap.model_validate({"coerce": {"amount": kind}})
    with pytest.raises(ArgMapError, match=f"^argument amount cannot be given as {kind}$"):
        apply(mapping, {"amount": given})


def test_an_absent_optional_argument_is_left_alone() -> None:
    mapping = ArgMap.model_validate({"coerce": {"note.text": "string"}})
    assert apply(mapping, {"x": 1}) == {"x": 1}


def test_two_arguments_may_not_become_one() -> None:
    with pytest.raises(ValueError, match="rename maps two arguments to one name"):
        ArgMap(rename={"a": "x", "b": "x"})
