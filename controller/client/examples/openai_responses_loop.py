"""An agent loop with the OpenAI Responses API whose function calls run through Agent-Reach.

    OPENAI_BASE_URL=… OPENAI_API_KEY=… AGENT_REACH_URL=… AGENT_REACH_API_KEY=… \
        python openai_responses_loop.py "What does the echo tool say to 'hi'?"
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
        tools = reach.tools(format="openai_responses")
        history: list[Any] = [{"role": "user", "content": prompt}]
        for _ in range(8):
            response = model.responses.create(
                model=os.environ.get("MODEL", "gpt-4o-mini"), input=history, tools=tools
            )
            output = [item.model_dump(exclude_none=True) for item in response.output]
            history.extend(output)
            if not any(item["type"] == "function_call" for item in output):
                return response.output_text
            history.extend(reach.answer(output))  # a function_call_output per call
    raise RuntimeError("no answer after 8 turns")


if __name__ == "__main__":
    print(main(" ".join(sys.argv[1:]) or "Say hi with the echo tool."))
