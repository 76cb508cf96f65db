"""Environments: the one approval rule, sandbox targets, where a tenant runs, and what a submit in
the sandbox may not ask for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent_reach_controller.identity.policy import PolicyFileError, load
from agent_reach_controller.planning.plan import PlanInvalidError, parse_plan
from agent_reach_controller.settings import ControllerSettings
from agent_reach_controller.tools.catalog import ToolCatalog, ToolFileError, ToolSpec
from agent_reach_controller.tools.environments import (
    connector_config,
    needs_approval,
    sandbox_refusal,
)


def tool(**fields: Any) -> ToolSpec:
    return ToolSpec.model_validate(
        {"name": "t.x", "description": "A tool.", "connector": "http", **fields}
    )


@pytest.mark.parametrize(
    ("risk", "exempt", "waits_in"),
    [
        ("read", False, set()),
        ("write", False, {"prod"}),
        ("write", True, set()),
        ("dangerous", False, {"dev", "sandbox", "prod"}),
    ],
)
def test_which_steps_wait_for_a_person_is_one_rule(
    risk: str, exempt: bool, waits_in: set[str]
) -> None:
    spec = tool(risk=risk, exempt_from_prod_approval=exempt)
    assert {env for env in ("dev", "sandbox", "prod") if needs_approval(spec, env)} == waits_in


def test_only_a_write_tool_may_be_exempted() -> None:
    """A dangerous tool always waits; exempting a read tool would say nothing."""
    for risk in ("read", "dangerous"):
        with pytest.raises(ValidationError, match="exempt_from_prod_approval applies to tools"):
            tool(risk=risk, exempt_from_prod_approval=True)


def test_the_sandbox_config_is_merged_over_the_config_key_by_key() -> None:
    config = {"method": "POST", "url": "https://live.example/pay", "headers": {"A": "1"}}
    spec = tool(
        risk="write",
        config=config,
        sandbox={"url": "https://sandbox.example/pay", "headers": {"B": "2"}},
    )
    sandboxed = {
        "method": "POST",
        "url": "https://sandbox.example/pay",
        "headers": {"B": "2"},  # top level only: a nested object is replaced, not merged
    }
    assert connector_config(spec, "sandbox") == sandboxed
    assert connector_config(spec, "dev") == config
    assert connector_config(spec, "prod") == config
    reader = tool(config=config, sandbox={"url": "https://sandbox.example/read"})
    assert connector_config(reader, "sandbox")["url"] == "https://sandbox.example/read"
    assert connector_config(tool(config=config), "sandbox") == config  # reads may read live


def test_in_the_sandbox_a_tool_that_writes_needs_a_target() -> None:
    for risk in ("write", "dangerous"):
        refusal = sandbox_refusal(tool(risk=risk), "sandbox")
        assert refusal is not None
        assert "'t.x'" in refusal
        assert "sandbox" in refusal
        assert sandbox_refusal(tool(risk=risk), "prod") is None
        assert sandbox_refusal(tool(risk=risk, sandbox={"url": "x"}), "sandbox") is None
    assert sandbox_refusal(tool(), "sandbox") is None


@pytest.mark.parametrize(
    ("fields", "phrase"),
    [
        ({"sandbox": {}}, "sandbox must override at least one config key"),
        ({"sandbox": {"write": True}}, "sandbox.write: true needs risk: write or dangerous"),
        ({"sandbox": ["url"]}, "valid dictionary"),
        ({"sandbox": {"url": "x"}, "config": {"write": True}}, "config.write: true needs risk"),
    ],
)
def test_a_bad_sandbox_is_refused_as_a_bad_config_is(fields: dict[str, Any], phrase: str) -> None:
    with pytest.raises(ValidationError, match=phrase):
        tool(**fields)


def test_a_tools_file_with_a_bad_sandbox_does_not_load(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(json.dumps({"tools": [{**tool().model_dump(), "sandbox": {"write": True}}]}))
    with pytest.raises(ToolFileError, match=r"sandbox\.write: true needs risk"):
        ToolCatalog.from_yaml_files([path])


def test_the_environment_setting_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ControllerSettings().environment == "dev"
    monkeypatch.setenv("AGENT_REACH_CONTROLLER_ENVIRONMENT", "prod")
    assert ControllerSettings().environment == "prod"
    monkeypatch.setenv("AGENT_REACH_CONTROLLER_ENVIRONMENT", "staging")
    with pytest.raises(ValidationError, match="environment"):
        ControllerSettings()


def _policy(tmp_path: Path, tenants: dict[str, Any]) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(json.dumps({"roles": {"agent": []}, "tenants": tenants}))
    return path


def test_a_tenants_own_environment_beats_the_wildcards_which_beats_the_default(
    tmp_path: Path,
) -> None:
    policy = load(
        _policy(
            tmp_path,
            {"*": {"environment": "prod"}, "lab": {"environment": "sandbox"}, "acme": {}},
        )
    )
    assert policy.environment_for("lab", "dev") == "sandbox"
    assert policy.environment_for("acme", "dev") == "prod"  # an entry without one: the "*"'s
    assert policy.environment_for("anyone", "dev") == "prod"
    plain = load(_policy(tmp_path, {"lab": {"environment": "sandbox"}}))
    assert plain.environment_for("anyone", "dev") == "dev"
    assert plain.environment_for("anyone", "prod") == "prod"


def test_an_unknown_environment_in_the_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match=r"tenants\.lab\.environment"):
        load(_policy(tmp_path, {"lab": {"environment": "staging"}}))


SANDBOX_CATALOG = ToolCatalog(
    [
        tool(name="read.it"),
        tool(name="write.live", risk="write"),
        tool(name="write.safe", risk="write", sandbox={"url": "https://sandbox.example"}),
        tool(name="check.live"),
        tool(
            name="write.checked",
            risk="write",
            sandbox={"url": "https://sandbox.example"},
            verify={"tool": "check.live", "condition": "true"},
        ),
    ]
)


def test_a_plan_in_the_sandbox_is_refused_at_the_tool_of_each_write_without_a_target() -> None:
    body = {
        "steps": [
            {"step_id": "a", "tool": "read.it", "args": {}},
            {"step_id": "b", "tool": "write.live", "args": {}},
            {"step_id": "c", "tool": "write.safe", "args": {}},
            {"step_id": "d", "tool": "write.checked", "args": {}},
        ]
    }
    with pytest.raises(PlanInvalidError) as refused:
        parse_plan(body, SANDBOX_CATALOG, environment="sandbox")
    found = {(p.pointer, p.code): p.detail for p in refused.value.problems}
    assert set(found) == {("/steps/1/tool", "forbidden"), ("/steps/3/tool", "forbidden")}
    assert "'write.live'" in found["/steps/1/tool", "forbidden"]
    assert "sandbox environment" in found["/steps/1/tool", "forbidden"]
    assert "would read production" in found["/steps/3/tool", "forbidden"]
    for environment in ("dev", "prod"):  # elsewhere the same plan is fine
        assert len(parse_plan(body, SANDBOX_CATALOG, environment=environment).steps) > 4


def test_a_turn_in_the_sandbox_refuses_only_the_call_that_would_write_live() -> None:
    turn = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_it", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "write_live", "arguments": "{}"}},
            {"id": "c3", "type": "function", "function": {"name": "write_safe", "arguments": "{}"}},
        ],
    }
    plan = parse_plan(turn, SANDBOX_CATALOG, environment="sandbox")
    assert [s.step_id for s in plan.steps] == ["c1", "c3"]
    [refused] = plan.refused
    assert (refused.step_id, refused.code.value) == ("c2", "forbidden")
    assert "may not run in the sandbox environment" in refused.reason()
