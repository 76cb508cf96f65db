"""An agent loop with OpenAI Chat Completions whose tool calls run through Agent-Reach.

    OPENAI_BASE_URL=… OPENAI_API_KEY=… AGENT_REACH_URL=… AGENT_REACH_API_KEY=… \
        python openai_chat_loop.py "What does the echo tool say to 'hi'?"

MODEL picks the model (default gpt-4o-mini). Every tool call is a governed task; a call that is
refused (bad arguments, a forbidden tool) comes back as a tool message the model can act on.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from agent_reach_client import Client
from openai import OpenAI


def main(prompt: str) -> str:
    model = OpenAI()
    with Client() as reach:
        tools = reach.tools(format="openai_chat")
        messages: list[Any] = [{"role": "user", "content": prompt}]
        for _ in range(8):
            completion = model.chat.completions.create(
                model=os.environ.get("MODEL", "gpt-4o-mini"), messages=messages, tools=tools
            )
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content or ""
            messages.extend(reach.answer(message.model_dump()))  # one reply per tool call
    raise RuntimeError("no answer after 8 turns")


if __name__ == "__main__":
    print(main(" ".join(sys.argv[1:]) or "Say hi with the echo tool."))
