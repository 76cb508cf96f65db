"""An agent loop with Anthropic Messages whose tool_use blocks run through Agent-Reach.

    ANTHROPIC_BASE_URL=… ANTHROPIC_API_KEY=… AGENT_REACH_URL=… AGENT_REACH_API_KEY=… \
        python anthropic_loop.py "What does the echo tool say to 'hi'?"
"""

from __future__ import annotations

import os
import sys
from typing import Any

from agent_reach_client import Client
from anthropic import Anthropic


def main(prompt: str) -> str:
    model = Anthropic()
    with Client() as reach:
        tools = reach.tools(format="anthropic")
        messages: list[Any] = [{"role": "user", "content": prompt}]
        for _ in range(8):
            message = model.messages.create(
                model=os.environ.get("MODEL", "claude-sonnet-4-5"),
                max_tokens=1024,
                messages=messages,
                tools=tools,
            )
            content = [block.model_dump(exclude_none=True) for block in message.content]
            messages.append({"role": "assistant", "content": content})
            if message.stop_reason != "tool_use":
                return "".join(b.text for b in message.content if b.type == "text")
            messages.extend(reach.answer(message.model_dump()))  # a user message of tool_results
    raise RuntimeError("no answer after 8 turns")


if __name__ == "__main__":
    print(main(" ".join(sys.argv[1:]) or "Say hi with the echo tool."))
