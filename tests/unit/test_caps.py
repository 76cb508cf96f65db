"""Blast-radius caps as pure rules: declared units, charges, admission, the check at submit."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from pydantic import ValidationError

from agent_reach_controller.decide.caps import (
    NO_TENANT_CAPS,
    Ask,
    Cap,
    TenantCaps,
    admit,
    bucket_start,
    bucket_width,
    caps_for,
    describe_window,
    window_floor,
)
from agent_reach_controller.identity.policy import Policy
from agent_reach_controller.planning.effects import (
    StaticStep,
    UnitsError,
    cap_problems,
    charges_of,
    known_charges,
)
from agent_reach_controller.planning.plan import PlanInvalidError, parse_plan
from agent_reach_controller.tools.catalog import ToolCatalog, ToolSpec

BASE = {"name": "t", "description": "d", "connector": "echo"}


def tool(**fields: Any) -> ToolSpec:
    return ToolSpec.model_validate({**BASE, **fields})


# --- declaring effects ---------------------------------------------------------------------------


def test_a_tool_declares_units_per_class_and_a_cost() -> None:
    spec = tool(effects={"message": 1, "rows": "size(args.rows)"}, cost=0.25)
    assert spec.effects == {"message": 1.0, "rows": "size(args.rows)"}
    assert spec.cost == 0.25


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"effects": {"cost": 1}}, "declare cost units with `cost:`"),
        ({"effects": {"Payment": 1}}, "should match pattern"),
        ({"effects": {"payment": -1}}, "from 0 to"),
        ({"effects": {"payment": True}}, "not a boolean"),
        ({"effects": {"payment": float("nan")}}, "from 0 to"),
        ({"effects": {"payment": 1e13}}, "from 0 to"),
        ({"effects": {"rows": "size(args.rows"}}, "does not compile as CEL"),
        ({"effects": {"rows": " "}}, "1 to 500 characters"),
        ({"cost": "args."}, "does not compile as CEL"),
        ({"effects": {f"c{i}": 1 for i in range(17)}}, "at most 16"),
    ],
)
def test_bad_effect_declarations_are_refused_at_load(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=r"effects|cost") as raised:
        tool(**fields)
    assert fragment in str(raised.value)


def test_tools_without_effects_keep_the_version_they_had() -> None:
    """Adding the fields must not move every stored tool (and its pinned tasks) to a new version."""
    plain = tool()
    assert plain.version == "d21578faeb0f"  # what commit fbcffde, before these fields, computed
    before = plain.model_dump(mode="json")
    added_since = (
        *("effects", "cost", "redact", "fan_out", "verify", "map_args"),
        *("exempt_from_prod_approval", "sandbox", "if_unknown"),
    )
    for later in added_since:
        del before[later]
    canonical = json.dumps(before, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert plain.version == hashlib.sha256(canonical.encode()).hexdigest()[:12]
    assert tool(effects={"message": 1}).version != plain.version
    assert tool(cost=1).version != plain.version
    assert tool(redact=["token"]).version != plain.version
    assert tool(sandbox={"url": "https://sandbox.example"}).version != plain.version
    assert tool(if_unknown="tell_model").version != plain.version


# --- what a call charges -------------------------------------------------------------------------


def test_a_call_charges_numbers_and_expressions_over_its_arguments() -> None:
    spec = tool(
        effects={"message": 1, "rows": "size(args.rows)", "none": 0}, cost="double(args.n) * 0.5"
    )
    assert charges_of(spec, {"rows": [1, 2, 3], "n": 3}) == {"message": 1, "rows": 3, "cost": 1.5}
    # A class at zero is no charge at all.
    assert charges_of(spec, {"rows": [], "n": 0}) == {"message": 1}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({}, "no such key"),
        ({"rows": "abc", "n": "x"}, "could not be computed"),
        ({"rows": [1], "n": -2}, "not a number >= 0"),
    ],
)
def test_units_that_cannot_be_computed_are_an_error(args: dict[str, Any], fragment: str) -> None:
    spec = tool(effects={"rows": "size(args.rows)"}, cost="args.n * 1")
    with pytest.raises(UnitsError, match=fragment):
        charges_of(spec, args)


def test_a_boolean_is_not_a_number_of_units() -> None:
    with pytest.raises(UnitsError, match="not a number"):
        charges_of(tool(effects={"x": "args.flag"}), {"flag": True})


def test_before_a_step_runs_only_what_does_not_depend_on_other_steps_is_known() -> None:
    spec = tool(effects={"message": 1, "rows": "size(args.rows)"})
    assert known_charges(spec, {"rows": [1, 2]}) == {"message": 1, "rows": 2}
    assert known_charges(spec, {"rows": "$fetch.output.rows"}) == {"message": 1}
    assert known_charges(spec, {}) == {"message": 1}  # refused with its reason at dispatch


# --- admission -----------------------------------------------------------------------------------

TASK_CAP = Cap(scope="task:t1", effect="payment", limit=2, owner="the task's")
TENANT_CAP = Cap(
    scope="tenant:acme", effect="payment", limit=3, window_s=3600, owner="tenant acme's"
)


def ask(key: int, units: float = 1, caps: tuple[Cap, ...] = (TASK_CAP,)) -> Ask:
    return Ask(step_key=key, tool="pay", charges={"payment": units}, caps=caps)


@pytest.mark.parametrize(("used", "admitted"), [(0, True), (1, True), (2, False)])
def test_exactly_at_the_cap_is_allowed_and_one_over_is_refused(used: int, admitted: bool) -> None:
    decided = admit([ask(1)], {TASK_CAP.key: used})
    assert (decided.admitted == [1]) is admitted
    assert (1 in decided.refused) is not admitted


def test_steps_are_decided_in_order_against_the_growing_counter() -> None:
    decided = admit([ask(1), ask(2), ask(3)], {})
    assert decided.admitted == [1, 2]
    assert decided.refused[3].used == 2
    assert decided.added == {TASK_CAP.key: 2}


def test_a_step_too_big_for_the_room_left_does_not_block_a_smaller_one() -> None:
    decided = admit([ask(1, units=1.5), ask(2, units=1), ask(3, units=0.5)], {})
    assert decided.admitted == [1, 3]
    assert list(decided.refused) == [2]


def test_all_caps_or_none_a_refused_step_charges_no_counter() -> None:
    both = (TASK_CAP, TENANT_CAP)
    decided = admit([ask(1, caps=both)], {TASK_CAP.key: 0, TENANT_CAP.key: 3})
    assert decided.admitted == []
    assert decided.refused[1].cap == TENANT_CAP
    assert decided.added == {}


def test_a_cap_of_zero_refuses_any_units() -> None:
    zero = Cap(scope="task:t1", effect="payment", limit=0, owner="the task's")
    assert list(admit([ask(1, units=0.000001, caps=(zero,))], {}).refused) == [1]


def test_fractions_add_up_exactly_to_the_cap() -> None:
    cost = Cap(scope="task:t1", effect="cost", limit=0.3, owner="the task's")
    asks = [Ask(step_key=i, tool="t", charges={"cost": 0.1}, caps=(cost,)) for i in range(4)]
    decided = admit(asks, {})
    assert decided.admitted == [0, 1, 2]
    assert decided.added == {cost.key: 0.3}


def test_a_refusal_says_which_cap_its_limit_and_what_was_used() -> None:
    refused = admit([ask(1, caps=(TENANT_CAP,))], {TENANT_CAP.key: 3}).refused[1]
    assert refused.message("pay.charge") == (
        "not run: pay.charge would use 1 of 'payment', but tenant acme's cap on 'payment' is 3 "
        "per 1h and 3 has been used in the last 1h; the tool was not called"
    )
    assert refused.as_dict() == {
        "scope": "tenant:acme",
        "effect": "payment",
        "limit": 3,
        "window_s": 3600,
        "used": 3,
        "asked": 1,
    }


def test_the_task_cap_and_its_tenants_per_task_cap_share_a_counter_and_the_lower_wins() -> None:
    tenant = TenantCaps(windows={"payment": (10, 86400)}, per_task={"payment": 1, "message": 4})
    found = caps_for(
        task_id="t1",
        tenant="acme",
        effects=frozenset({"payment", "message", "rows"}),
        task_caps={"payment": 2, "message": 3},
        tenant_caps=tenant,
    )
    assert [(c.scope, c.effect, c.limit, c.window_s, c.owner) for c in found] == [
        ("task:t1", "message", 3, None, "the task's"),
        ("task:t1", "payment", 1, None, "tenant acme's per-task"),
        ("tenant:acme", "payment", 10, 86400, "tenant acme's"),
    ]
    assert (
        caps_for(
            task_id="t",
            tenant="x",
            effects=frozenset({"rows"}),
            task_caps=None,
            tenant_caps=NO_TENANT_CAPS,
        )
        == []
    )


def test_a_window_is_counted_in_sixtieths_and_never_too_short() -> None:
    assert bucket_width(86400) == 1440
    assert bucket_width(30) == 1
    assert bucket_start(3600, 7259.9) == 7200
    # Every bucket that may hold a charge from within the window is summed.
    assert window_floor(3600, 10_000) == 10_000 - 3600 - 60
    assert [describe_window(s) for s in (86400, 1800, 90, 0.5)] == ["24h", "30m", "90s", "0.5s"]


# --- the tenant policy ---------------------------------------------------------------------------


def test_a_tenants_own_caps_replace_the_defaults_class_by_class() -> None:
    policy = Policy.model_validate(
        {
            "roles": {},
            "tenants": {
                "*": {"caps": {"payment": {"limit": 10, "window": "24h"}}, "per_task": {"x": 1}},
                "acme": {"caps": {"cost": {"limit": 5, "window": "1h"}}, "per_task": {"x": 2}},
            },
        }
    )
    assert policy.caps_for("acme") == TenantCaps(
        windows={"payment": (10, 86400), "cost": (5, 3600)}, per_task={"x": 2}
    )
    assert policy.caps_for("other") == TenantCaps(
        windows={"payment": (10, 86400)}, per_task={"x": 1}
    )
    assert Policy.model_validate({"roles": {}}).caps_for("any") == NO_TENANT_CAPS


@pytest.mark.parametrize(
    "tenant",
    [
        {"caps": {"payment": {"limit": -1, "window": "1h"}}},
        {"caps": {"payment": {"limit": 1}}},
        {"caps": {"payment": {"limit": 1, "window": "40d"}}},
        {"caps": {"payment": {"limit": 1, "window": 32 * 86400}}},
        {"caps": {"Pay": {"limit": 1, "window": "1h"}}},
        {"per_task": {"payment": float("inf")}},
        {"limits": {}},
    ],
)
def test_bad_tenant_caps_are_refused(tenant: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Policy.model_validate({"roles": {}, "tenants": {"acme": tenant}})


# --- the check at submit -------------------------------------------------------------------------

CATALOG = ToolCatalog(
    [
        ToolSpec.model_validate({**BASE, "name": "pay", "effects": {"payment": 1}, "cost": 0.1}),
        ToolSpec.model_validate({**BASE, "name": "rows", "effects": {"rows": "size(args.rows)"}}),
        ToolSpec.model_validate({**BASE, "name": "look"}),
    ]
)


def problems(body: dict[str, Any], *, atomic: bool = False) -> list[tuple[str, str]]:
    try:
        parse_plan(body, CATALOG, atomic=atomic)
    except PlanInvalidError as exc:
        return [(p.pointer, p.code) for p in exc.problems]
    return []


def pays(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"step_id": f"p{i}", "tool": "pay", **extra} for i in range(n)]


@pytest.mark.parametrize(("n", "refused"), [(2, False), (3, True)])
def test_a_plan_at_its_cap_is_accepted_and_one_over_is_refused(n: int, refused: bool) -> None:
    found = problems({"steps": pays(n), "caps": {"payment": 2}})
    assert found == ([("/steps/2", "cap_exceeded")] if refused else [])


def test_the_problem_points_at_the_step_that_crosses_each_cap() -> None:
    body = {
        "steps": [*pays(4), {"step_id": "r", "tool": "rows", "args": {"rows": [1, 2, 3]}}],
        "caps": {"payment": 2, "cost": 0.3, "rows": 2},
    }
    assert problems(body) == [
        ("/steps/2", "cap_exceeded"),  # payment: 3 > 2
        ("/steps/3", "cap_exceeded"),  # cost: 0.4 > 0.3
        ("/steps/4", "cap_exceeded"),  # rows: 3 > 2
    ]


def test_steps_that_may_not_run_are_not_counted_at_submit() -> None:
    body = {
        "steps": [
            {"step_id": "a", "tool": "pay"},
            {"step_id": "gate", "tool": "look", "when": "context.go == true"},
            {"step_id": "b", "tool": "pay", "depends_on": ["gate"]},
            {"step_id": "c", "tool": "pay", "when": "true"},
            {"step_id": "d", "tool": "rows", "args": {"rows": "$a.output"}, "depends_on": ["a"]},
        ],
        "caps": {"payment": 1, "rows": 0},
    }
    assert problems(body) == []


def test_tool_calls_are_checked_the_same_way() -> None:
    calls = [{"id": f"c{i}", "function": {"name": "pay", "arguments": "{}"}} for i in range(2)]
    body = {"tool_calls": calls, "caps": {"payment": 1}}
    assert problems({**body}, atomic=True) == [("/tool_calls/1", "cap_exceeded")]
    # In a model's turn only the call over the cap is refused; the first one runs.
    plan = parse_plan(body, CATALOG)
    assert [s.step_id for s in plan.steps] == ["c0"]
    assert [(r.step_id, [(p.pointer, p.code) for p in r.problems]) for r in plan.refused] == [
        ("c1", [("/tool_calls/1", "cap_exceeded")])
    ]


@pytest.mark.parametrize(
    ("caps", "pointer", "code"),
    [
        ([], "/caps", "invalid_type"),
        ({"Pay": 1}, "/caps/Pay", "invalid_type"),
        ({"pay\n": 1}, "/caps/pay\n", "invalid_type"),
        ({"payment": -1}, "/caps/payment", "invalid_number"),
        ({"payment": 1e13}, "/caps/payment", "too_large"),
        ({"payment": "1"}, "/caps/payment", "invalid_type"),
        ({"payment": True}, "/caps/payment", "invalid_type"),
        ({f"c{i}": 1 for i in range(33)}, "/caps", "too_large"),
    ],
)
def test_bad_caps_are_refused_with_a_pointer(caps: Any, pointer: str, code: str) -> None:
    assert problems({"steps": pays(1), "caps": caps}) == [(pointer, code)]


def test_caps_are_kept_on_the_plan() -> None:
    plan = parse_plan({"steps": pays(1), "caps": {"payment": 1, "cost": 2}}, CATALOG)
    assert plan.caps == {"payment": 1.0, "cost": 2.0}
    assert parse_plan({"steps": pays(1), "caps": {}}, CATALOG).caps is None


def test_a_long_chain_is_walked_without_recursion() -> None:
    chain = [
        StaticStep(
            step_id=f"s{i}",
            pointer=f"/steps/{i}",
            depends_on=[f"s{i - 1}"] if i else [],
            conditional=i == 0,
            charges={"payment": 1},
        )
        for i in range(5000)
    ]
    assert cap_problems(chain, {"payment": 0}) == []  # all hang off a conditional root
