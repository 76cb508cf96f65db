"""Agent profiles and the pure rules of a run: profiles from a tools file, limits that only
tighten, what a reply costs, loop detection, and the ids a model gives its calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent_reach_controller.decide import runs as rules
from agent_reach_controller.domain.records import RunRow, RunStatus
from agent_reach_controller.planning.endpoints import ENDPOINTS, Reply
from agent_reach_controller.tools.agents import AgentProfile, Limits, Prices, profile_of
from agent_reach_controller.tools.catalog import ToolCatalog, ToolFileError

NOW = datetime(2026, 12, 6, tzinfo=UTC)
PROFILE: dict[str, Any] = {
    "endpoint": {
        "kind": "anthropic",
        "base_url": "https://models.example",
        "api_key": "${env:MODEL_KEY}",
    },
    "model": "m-1",
    "system": "Be brief.",
    "tools": ["crm.*"],
    "limits": {"max_rounds": 4, "input_tokens": 1000, "deadline": "2m"},
    "prices": {"input": 3.0, "output": 15.0, "cached_input": 0.3},
}


def run_row(**changes: Any) -> RunRow:
    row: dict[str, Any] = {
        "run_id": "r",
        "tenant": "default",
        "principal": "p",
        "key_id": None,
        "trace_id": "t" * 32,
        "agent": "a",
        "agent_version": "v",
        "subject": None,
        "context": {},
        "status": RunStatus.RUNNING,
        "end_reason": None,
        "round": 1,
        "task_id": "task",
        "limits": {},
        "tools": [],
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_tokens": 0,
        "cost": 0.0,
        "answer": None,
        "ungrounded_claims": None,
        "error": None,
        "calls": {},
        "turn_start": 1,
        "version": 1,
        "created_at": NOW,
        "updated_at": NOW,
        "finished_at": None,
        "deadline": None,
    }
    return RunRow.from_mapping(row | changes)


def test_a_profile_in_a_tools_file_is_a_model_tool_that_reads_back_as_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(
        "agents:\n  - name: support\n"
        + "".join(f"    {k}: {v!r}\n" for k, v in PROFILE.items()).replace("'", '"')
    )
    catalog = ToolCatalog.from_yaml_files([path])
    spec = catalog["support"]
    assert (spec.connector, spec.risk, spec.idempotent) == ("model", "read", True)
    assert spec.config["endpoint"] == "anthropic"
    assert spec.config["api_key"] == "${env:MODEL_KEY}"
    profile = profile_of(spec)
    assert profile == AgentProfile.model_validate(PROFILE, strict=False)
    assert profile.limits.deadline == 120


def test_a_key_written_into_a_profile_is_refused_without_being_repeated(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(
        "agents:\n  - name: leaky\n    model: m\n    endpoint:\n      kind: openai_chat\n"
        "      base_url: https://models.example/v1\n      api_key: sk-live-12345\n"
    )
    with pytest.raises(ToolFileError) as refused:
        ToolCatalog.from_yaml_files([path])
    assert "agent 'leaky'" in str(refused.value)
    assert "reference" in str(refused.value)
    assert "sk-live-12345" not in str(refused.value)


def test_a_callers_limits_may_only_tighten_the_profiles() -> None:
    limits = Limits(max_rounds=4, input_tokens=1000)
    assert limits.overridden({"max_rounds": 2}).max_rounds == 2
    assert limits.overridden({"cost": 0.5}).cost == 0.5  # the profile had none: any is tighter
    with pytest.raises(ValueError, match="max_rounds may only be lowered"):
        limits.overridden({"max_rounds": 5})
    with pytest.raises(ValidationError):
        limits.overridden({"max_rounds": 0})


def test_cost_counts_cached_input_at_its_own_price() -> None:
    prices = Prices(input=3.0, output=15.0, cached_input=0.3)
    cost = prices.cost(input_tokens=1_000_000, output_tokens=100_000, cached_tokens=500_000)
    assert cost == pytest.approx(1.5 + 0.15 + 1.5)


def test_a_reply_is_charged_at_least_what_was_sent() -> None:
    prices = Prices(input=1.0, output=1.0)
    honest = {"reply": {}, "usage": {"input_tokens": 900, "output_tokens": 7}}
    lying = {"reply": {}, "usage": {"input_tokens": 1, "output_tokens": 0, "cached_tokens": 99}}
    assert rules.usage_of(honest, sent_chars=400, prices=prices).input_tokens == 900
    charged = rules.usage_of(lying, sent_chars=4000, prices=prices)
    assert charged.input_tokens == 1000
    assert charged.cached_tokens == 99
    nonsense = {"usage": {"input_tokens": -5, "output_tokens": True}}
    assert rules.usage_of(nonsense, sent_chars=0, prices=prices).output_tokens == 0


def test_the_same_call_a_third_time_is_a_loop_whatever_the_key_order() -> None:
    counts, looping = rules.counted_calls({}, [("t", {"a": 1, "b": 2}), ("t", {"b": 2, "a": 1})])
    assert looping is None
    _, looping = rules.counted_calls(counts, [("u", {}), ("t", {"a": 1, "b": 2})])
    assert looping == "t"


def test_a_round_may_follow_unless_a_limit_is_reached() -> None:
    limits = Limits(max_rounds=3, output_tokens=100)
    assert rules.after_round(run_row(round=2), limits, now=NOW).go_on
    assert rules.after_round(run_row(round=3), limits, now=NOW).reason == "max_rounds"
    # A caller's new message starts a new count of rounds.
    assert rules.after_round(run_row(round=5, turn_start=4), limits, now=NOW).go_on
    spent = run_row(output_tokens=100)
    assert rules.after_round(spent, limits, now=NOW).reason == "budget_exhausted"
    late = run_row(deadline=NOW - timedelta(seconds=1))
    assert rules.after_round(late, limits, now=NOW).reason == "deadline_exceeded"
    assert rules.max_tokens(run_row(output_tokens=70), limits) == 30


@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses", "anthropic"])
def test_call_ids_a_step_cannot_have_are_renamed_where_the_conversation_keeps_them(
    kind: str,
) -> None:
    endpoint = ENDPOINTS[kind]
    given = ["model", "same", "same", "", "bad id!"]
    reply = endpoint.read(_reply(kind, given))
    assert isinstance(reply, Reply)
    ids = endpoint.number_calls(reply, taken={"model"}, prefix="call_1_")
    assert ids == ["call_1_0", "same", "call_1_2", "call_1_3", "call_1_4"]
    # The stored entries carry the new ids: the results will answer them.
    stored = str(reply.entries)
    for new in ids:
        assert new in stored


def _reply(kind: str, ids: list[str]) -> dict[str, Any]:
    if kind == "openai_chat":
        calls = [
            {"id": i, "type": "function", "function": {"name": "t", "arguments": "{}"}} for i in ids
        ]
        return {"choices": [{"message": {"role": "assistant", "tool_calls": calls}}]}
    if kind == "openai_responses":
        items = [
            {"type": "function_call", "call_id": i, "name": "t", "arguments": "{}"} for i in ids
        ]
        return {"output": items}
    return {"content": [{"type": "tool_use", "id": i, "name": "t", "input": {}} for i in ids]}


def test_an_answers_claims_are_checked_against_what_was_read() -> None:
    answer = (
        "Order 12,345 ships 2026-12-08 to bob@x.io (https://x.io/track). It costs 1250.50, "
        "or 999 in points; 3 items. Ask eve@evil.invalid or see https://evil.invalid/x."
    )
    sources = ['{"text": "order 12345, total 1,250.5"}', "mail bob@x.io, track https://x.io/track"]
    assert rules.ungrounded_claims(answer, sources) == [
        "https://evil.invalid/x",
        "eve@evil.invalid",
        "2026-12-08",
        "999",
    ]
    assert rules.ungrounded_claims("Nothing to check here.", []) == []


def test_the_stage_note_follows_the_conversation_and_keeps_anthropics_turns_alternating() -> None:
    from agent_reach_controller.planning.endpoints import Ask

    def last(kind: str, messages: list[dict[str, Any]]) -> Any:
        ask = Ask(
            model="m",
            system="",
            messages=messages,
            tools=[],
            temperature=None,
            max_tokens=9,
            note="NOTE",
        )
        body = ENDPOINTS[kind].request(ask)
        return (body.get("messages") or body.get("input"))[-1]

    user = [{"role": "user", "content": "hi"}]
    said = [*user, {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]
    assert last("anthropic", user) == {
        "role": "user",
        "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "NOTE"}],
    }
    assert last("anthropic", said) == {"role": "user", "content": "NOTE"}
    assert last("openai_chat", user) == {"role": "system", "content": "NOTE"}
    assert last("openai_responses", user) == {"role": "developer", "content": "NOTE"}
    note = rules.stage_note(
        run_row(round=3, calls={"a": 2, "b": 1}, output_tokens=40),
        Limits(max_rounds=3, output_tokens=100),
        goal="Find the order",
    )
    assert note == (
        "[run state] Round 3 of at most 3. Goal: Find the order Done: 3 tool calls in this run, "
        "their results above. Left: 60 output tokens. This is the last round: answer now with "
        "what you have."
    )
