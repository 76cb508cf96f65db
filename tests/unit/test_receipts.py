"""Receipts: JSON shape, output projection, bounded rendering for the model."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_reach_controller.receipts import (
    Receipt,
    ReceiptError,
    ReceiptMeta,
    project_output,
    render_for_model,
    render_receipt_dict,
)

META = ReceiptMeta(
    tool="order.query",
    step_id="s1",
    attempts=3,
    duration_ms=812,
    idempotency_key="t1:s1",
    trace_id="0af7651916cd43dd8448eb211c80319c",
    verified=True,
)
ERROR = ReceiptError(
    code="downstream_unavailable",
    message="order service returned 503 after 3 attempts",
    retryable=True,
)


def receipt(
    data: Any = None, error: ReceiptError | None = None, status: str = "succeeded"
) -> Receipt:
    return Receipt(status=status, data=data, error=error, meta=META)


def test_to_dict_matches_design_shape() -> None:
    failed = receipt(error=ERROR, status="failed").to_dict()
    assert failed == {
        "status": "failed",
        "error": {
            "code": "downstream_unavailable",
            "message": "order service returned 503 after 3 attempts",
            "retryable": True,
        },
        "meta": {
            "tool": "order.query",
            "step_id": "s1",
            "attempts": 3,
            "duration_ms": 812,
            "idempotency_key": "t1:s1",
            "trace_id": "0af7651916cd43dd8448eb211c80319c",
            "verified": True,
        },
    }
    ok = receipt(data={"id": 1}).to_dict()
    assert ok["data"] == {"id": 1}
    assert "error" not in ok
    assert list(ok) == ["status", "data", "meta"]


def test_a_receipt_says_where_it_ran_and_reads_back_the_same() -> None:
    in_prod = Receipt(status="succeeded", meta=replace(META, environment="prod")).to_dict()
    assert in_prod["meta"]["environment"] == "prod"
    assert Receipt.from_dict(in_prod).to_dict() == in_prod
    assert "environment" not in receipt().to_dict()["meta"]  # stored before environments


def test_project_output() -> None:
    output = {
        "order": {"id": "o1", "total": 12, "customer": {"name": "A", "email": "a@x"}},
        "items": [{"sku": "k1", "qty": 1, "note": "n"}, {"sku": "k2"}, 7],
        "debug": {"trace": "..."},
    }
    projected = project_output(
        output, ["order.id", "order.customer.name", "items.sku", "items.qty", "missing.path"]
    )
    assert projected == {
        "order": {"id": "o1", "customer": {"name": "A"}},
        "items": [{"sku": "k1", "qty": 1}, {"sku": "k2"}],
    }
    assert project_output(output, ["order", "order.id"])["order"] == output["order"]
    assert project_output(output, None) is output
    assert project_output("scalar", ["a"]) == "scalar"
    assert project_output([{"a": 1, "b": 2}], ["a"]) == [{"a": 1}]


def test_render_puts_status_first_then_error_then_data() -> None:
    text = render_for_model(receipt(data={"id": 1}, error=ERROR, status="failed"))
    doc = json.loads(text)
    assert list(doc) == ["status", "error", "data"]
    assert doc["error"] == (
        "downstream_unavailable: order service returned 503 after 3 attempts (retryable)"
    )
    assert "meta" not in doc
    assert text == json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def test_render_summarises_a_1204_item_list() -> None:
    rows = [{"id": i, "name": f"customer {i}", "city": "Wuhan"} for i in range(1204)]
    text = render_for_model(receipt(data={"rows": rows, "count": 1204}), budget=2000)
    assert len(text) <= 2000
    doc = json.loads(text)
    assert doc["data"]["rows"][:5] == rows[:5]
    assert doc["data"]["rows"][5] == "(first 5 of 1,204)"
    assert doc["data"]["count"] == 1204


def test_render_shrinks_further_for_small_budgets() -> None:
    rows = [{"id": i, "text": "x" * 300} for i in range(1204)]
    text = render_for_model(receipt(data=rows), budget=400)
    assert len(text) <= 400
    doc = json.loads(text)
    assert isinstance(doc["data"], list)
    assert doc["data"][-1].startswith("(first ")
    assert doc["data"][-1].endswith(" of 1,204)")
    assert "…(+" in json.dumps(doc["data"][0], ensure_ascii=False)


def test_render_long_string_gets_an_ellipsis_marker() -> None:
    text = render_for_model(receipt(data={"body": "y" * 10_000}), budget=1000)
    body = json.loads(text)["data"]["body"]
    assert body.startswith("y" * 100)
    assert "…(+" in body
    assert len(text) <= 1000


def test_render_falls_back_to_a_truncation_note() -> None:
    wide = {f"{i:0200d}": i for i in range(5000)}
    text = render_for_model(receipt(data=wide), budget=120)
    assert len(text) <= 120
    assert json.loads(text) == {
        "status": "succeeded",
        "data": {"truncated": True, "note": "output too large to show; ask for fewer fields"},
    }
    text = render_for_model(receipt(data=wide), budget=70)
    assert json.loads(text) == {"status": "succeeded", "data": {"truncated": True}}


def test_render_huge_error_message_is_cut_to_one_line() -> None:
    err = ReceiptError(code="connector_error", message="boom\n" * 5000, retryable=False)
    text = render_for_model(receipt(error=err, status="failed"), budget=300)
    assert len(text) <= 300
    doc = json.loads(text)
    assert doc["error"].startswith("connector_error: boom boom")
    assert "\n" not in doc["error"]


def test_render_nan_and_odd_values_stay_valid_json() -> None:
    data = {"x": float("nan"), "y": float("inf"), "t": (1, 2), "b": b"raw"}
    doc = json.loads(render_for_model(receipt(data=data)))
    assert doc["data"] == {"x": "nan", "y": "inf", "t": [1, 2], "b": "b'raw'"}


def test_render_is_deterministic_and_rejects_tiny_budgets() -> None:
    r = receipt(data={"a": list(range(100))})
    assert render_for_model(r, budget=100) == render_for_model(r, budget=100)
    with pytest.raises(ValueError, match="at least"):
        render_for_model(r, budget=10)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300),
    lambda children: (
        st.lists(children, max_size=30)
        | st.dictionaries(st.text(max_size=20), children, max_size=30)
    ),
    max_leaves=200,
)


@settings(max_examples=300, deadline=None)
@given(
    data=json_values,
    status=st.text(max_size=80),
    message=st.none() | st.text(max_size=3000),
    budget=st.integers(min_value=64, max_value=4000),
)
def test_render_is_always_valid_json_within_budget(
    data: Any, status: str, message: str | None, budget: int
) -> None:
    error = (
        None if message is None else ReceiptError(code="timeout", message=message, retryable=True)
    )
    text = render_for_model(receipt(data=data, error=error, status=status), budget=budget)
    assert len(text) <= budget
    doc = json.loads(text)
    assert next(iter(doc)) == "status"


def test_stored_receipts_round_trip_and_render() -> None:
    original = receipt(data={"id": 1, "rows": list(range(20))}, error=ERROR, status="failed")
    stored = json.loads(json.dumps(original.to_dict()))
    assert Receipt.from_dict(stored) == original
    assert render_receipt_dict(stored, budget=300) == render_for_model(original, budget=300)
    assert Receipt.from_dict({"status": "skipped"}).meta.attempts == 0


def test_redaction_replaces_each_path_in_every_list_item_and_nothing_else() -> None:
    from agent_reach_controller.receipts import redact_output

    output = {"a": {"secret": 1, "keep": 2}, "rows": [{"ssn": "x", "n": 1}, {"n": 2}], "s": "t"}
    assert redact_output(output, ["a.secret", "rows.ssn", "missing.path"]) == {
        "a": {"secret": "[redacted]", "keep": 2},
        "rows": [{"ssn": "[redacted]", "n": 1}, {"n": 2}],
        "s": "t",
    }
    assert redact_output(output, []) is output
    assert redact_output("scalar", ["a"]) == "scalar"


def test_a_handle_is_offered_only_when_something_was_left_out() -> None:
    import json

    from agent_reach_controller.receipts import Receipt, ReceiptMeta, render_for_model

    meta = ReceiptMeta(
        tool="t", step_id="s", attempts=1, duration_ms=1, idempotency_key="k", trace_id="0" * 32
    )
    small = Receipt(status="succeeded", data={"n": 1}, meta=meta)
    big = Receipt(status="succeeded", data={"items": list(range(50))}, meta=meta)
    assert "full_output" not in json.loads(render_for_model(small, handle="/h"))
    shown = json.loads(render_for_model(big, handle="/h"))
    assert shown["full_output"] == "/h"
    assert shown["data"]["items"][-1] == "(first 5 of 50)"
    assert "full_output" not in json.loads(render_for_model(big))  # no handle given
