"""`reach runs show` prints a run's conversation the same way whatever the agent's endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from agent_reach_cli.run_commands import entry_lines

CHAT = [
    ("user", {"role": "user", "content": "Say hi."}),
    (
        "assistant",
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "echo_say", "arguments": '{"text": "hi"}'},
                }
            ],
        },
    ),
    ("tool", {"role": "tool", "tool_call_id": "c0", "content": '{"said": "hi"}'}),
    ("assistant", {"role": "assistant", "content": "It said hi."}),
]
RESPONSES = [
    ("user", {"role": "user", "content": "Say hi."}),
    (
        "assistant",
        {
            "type": "function_call",
            "call_id": "c0",
            "name": "echo_say",
            "arguments": '{"text": "hi"}',
        },
    ),
    ("tool", {"type": "function_call_output", "call_id": "c0", "output": '{"said": "hi"}'}),
    (
        "assistant",
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It said hi."}],
        },
    ),
]
ANTHROPIC = [
    ("user", {"role": "user", "content": "Say hi."}),
    (
        "assistant",
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "c0", "name": "echo_say", "input": {"text": "hi"}}
            ],
        },
    ),
    (
        "tool",
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c0", "content": '{"said": "hi"}'}],
        },
    ),
    ("assistant", {"role": "assistant", "content": [{"type": "text", "text": "It said hi."}]}),
]


@pytest.mark.parametrize(
    "conversation", [CHAT, RESPONSES, ANTHROPIC], ids=["chat", "responses", "anthropic"]
)
def test_each_endpoint_shape_reads_the_same(conversation: list[tuple[str, dict[str, Any]]]) -> None:
    lines = [
        line
        for seq, (role, message) in enumerate(conversation)
        for line in entry_lines({"seq": seq, "round": 1, "role": role, "message": message})
    ]
    assert [" ".join(line.split()) for line in lines] == [
        "[1] user Say hi.",
        '[1] assistant call echo_say {"text": "hi"}',
        '[1] tool result c0: {"said": "hi"}',
        "[1] assistant It said hi.",
    ]


def test_arguments_that_are_not_json_are_shown_as_written() -> None:
    message = {
        "role": "assistant",
        "tool_calls": [{"function": {"name": "f", "arguments": "{cut"}}],
    }
    [line] = entry_lines({"seq": 0, "round": 2, "role": "assistant", "message": message})
    assert line.endswith("call f {cut")
