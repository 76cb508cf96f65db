"""Generated malformed submissions: each is a 4xx problem+json, none is stored, none a 5xx."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_reach_controller.api.app import create_app
from tests.integration.stack import components_for, key_for, write_tools

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
step_ids = st.sampled_from(["a", "b", "c", "", "a b", "x" * 80, "$a", "a\x00"]) | st.integers()
tools = st.sampled_from(["echo.say", "echo.count", "nope", "", "echo_say"]) | st.integers()
steps = st.fixed_dictionaries(
    {"step_id": step_ids, "tool": tools},
    optional={
        "args": st.dictionaries(
            st.sampled_from(["text", "n", "x"]),
            st.sampled_from(["$a.output", "$b.output.k", "$.output", 1, "s", None]),
        )
        | json_values,
        "depends_on": st.lists(step_ids, max_size=3) | json_values,
        "when": st.sampled_from(["true", "steps.a.output > 1", "(((", "steps.zz.output", "1 +"])
        | json_values,
        "extra": json_values,
    },
)
plans = st.fixed_dictionaries(
    {"steps": st.lists(steps, max_size=5) | json_values},
    optional={"goal": json_values, "context": json_values, "junk": json_values},
)
tool_calls = st.fixed_dictionaries(
    {
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": step_ids,
                    "function": st.fixed_dictionaries(
                        {"name": tools, "arguments": st.text(max_size=30) | json_values}
                    ),
                }
            ),
            max_size=3,
        )
        | json_values
    }
)
bodies = plans | tool_calls | json_values


def _valid_or_problem(response: httpx.Response) -> bool:
    if response.status_code == 202:
        return True
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == response.status_code
    if response.status_code == 422 and problem["code"] == "invalid_plan":
        assert problem["errors"], problem
        assert all(e["pointer"].startswith("/") or e["pointer"] == "" for e in problem["errors"])
    return False


def test_generated_bodies_never_crash_and_never_store_invalid_plans(
    tmp_path: Path, sqlite_url: str
) -> None:
    loop = asyncio.new_event_loop()
    ctx = components_for(sqlite_url, write_tools(tmp_path))
    components = loop.run_until_complete(ctx.__aenter__())
    headers = loop.run_until_complete(key_for(components))
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(components)),
        base_url="http://t",
        headers=headers,
    )
    accepted = 0

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(body=bodies)
    def check(body: Any) -> None:
        nonlocal accepted
        response = loop.run_until_complete(
            client.post(
                "/v1/tasks", content=json.dumps(body), headers={"content-type": "application/json"}
            )
        )
        accepted += _valid_or_problem(response)

    try:
        check()
        stored = loop.run_until_complete(client.get("/v1/tasks", params={"limit": 500})).json()[
            "tasks"
        ]
        assert len(stored) == accepted
    finally:
        loop.run_until_complete(client.aclose())
        loop.run_until_complete(ctx.__aexit__(None, None, None))
        loop.close()
