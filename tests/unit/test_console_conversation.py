"""The console's reading of a run's conversation: each endpoint's shape, results in place."""

from __future__ import annotations

from typing import Any

import pytest

from agent_reach_controller.api.console.conversation import Call, Result, Said, rounds

TASK = {"task_id": "t1", "steps": [{"step_id": "c1", "tool": "echo.say", "status": "succeeded"}]}
KEPT = [{"round": 1, "task_id": "t1", "status": "succeeded"}]


def entry(seq: int, round_: int, role: str, message: Any) -> dict[str, Any]:
    return {"seq": seq, "round": round_, "role": role, "message": message}


CHAT = [
    entry(1, 1, "user", {"role": "user", "content": "Say hi."}),
    entry(
        2,
        1,
        "assistant",
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "echo_say", "arguments": '{"text": "hi"}'},
                }
            ],
        },
    ),
    entry(3, 1, "tool", {"role": "tool", "tool_call_id": "c1", "content": "said hi"}),
    entry(4, 2, "assistant", {"role": "assistant", "content": "It said hi."}),
]
RESPONSES = [
    entry(1, 1, "user", {"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}),
    entry(2, 1, "assistant", {"type": "reasoning", "summary": []}),
    entry(
        3,
        1,
        "assistant",
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "echo_say",
            "arguments": '{"text": "hi"}',
        },
    ),
    entry(
        4,
        1,
        "assistant",
        {"type": "message", "content": [{"type": "output_text", "text": "Calling."}]},
    ),
    entry(5, 1, "tool", {"type": "function_call_output", "call_id": "c1", "output": "said hi"}),
    entry(
        6,
        2,
        "assistant",
        {"type": "message", "content": [{"type": "output_text", "text": "It said hi."}]},
    ),
]
ANTHROPIC = [
    entry(1, 1, "user", {"role": "user", "content": "Say hi."}),
    entry(
        2,
        1,
        "assistant",
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "c1", "name": "echo_say", "input": {"text": "hi"}},
            ],
        },
    ),
    entry(
        3,
        1,
        "tool",
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "said hi"}],
        },
    ),
    entry(
        4,
        2,
        "assistant",
        {"role": "assistant", "content": [{"type": "text", "text": "It said hi."}]},
    ),
]


@pytest.mark.parametrize(
    "messages", [CHAT, RESPONSES, ANTHROPIC], ids=["chat", "responses", "anthropic"]
)
def test_each_endpoints_shape_reads_as_words_and_calls_with_results_in_place(
    messages: list[dict[str, Any]],
) -> None:
    first, second = rounds(messages, KEPT, {"t1": TASK})
    assert (first.number, first.task_id, second.number, second.task_id) == (1, "t1", 2, None)
    said = [e for e in first.entries if isinstance(e, Said)]
    assert [(s.speaker, s.text) for s in said] == [("Caller", "Say hi."), ("Model", "Calling.")]
    (call,) = [e for e in first.entries if isinstance(e, Call)]
    assert (call.call_id, call.name, call.args, call.result) == (
        "c1",
        "echo_say",
        {"text": "hi"},
        "said hi",
    )
    assert call.step is not None
    assert call.step["tool"] == "echo.say"
    assert not [e for e in first.entries if isinstance(e, Result)]  # folded into its call
    assert second.entries == [Said(kind="assistant", speaker="Model", text="It said hi.")]


def test_odd_entries_are_shown_as_text_never_dropped() -> None:
    messages = [
        entry(
            1,
            1,
            "assistant",
            {
                "role": "assistant",
                "tool_calls": [{"id": "c9", "function": {"name": "x", "arguments": "{cut"}}],
            },
        ),
        entry(
            2,
            1,
            "tool",
            {
                "role": "tool",
                "tool_call_id": "other",
                "content": [{"type": "text", "text": "lost"}],
            },
        ),
        entry(3, 1, "route", {"route": "react", "reason": "<b>tools</b> needed"}),
        entry(
            4, 1, "controller", {"role": "user", "content": "The plan was refused.", "problems": []}
        ),
        entry(5, 1, "mystery", ["not", "an", "object"]),
    ]
    (only,) = rounds(messages, [], {})
    assert only.task_id is None
    call, alone, route, note, mystery = only.entries
    assert isinstance(call, Call)
    assert (call.args, call.result, call.step) == ("{cut", None, None)  # not JSON: as written
    assert isinstance(alone, Result)
    assert (alone.call_id, alone.text) == ("other", "lost")
    assert route == Said(kind="route", speaker="Router", text="react: <b>tools</b> needed")
    assert note == Said(kind="controller", speaker="Agent-Reach", text="The plan was refused.")
    assert mystery == Said(kind="mystery", speaker="mystery", text='["not", "an", "object"]')
