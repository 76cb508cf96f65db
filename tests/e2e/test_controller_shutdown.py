"""A controller told to stop answers the requests it holds open instead of having them cut: a
`?wait=` submit whose task cannot finish (no executor) gets its 202 with the task as it stands,
and the process exits cleanly with nothing logged as an application error."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx

from tests.e2e.processes import api, cluster, wait_until


def _echo_tools(directory: Path) -> Path:
    tools = directory / "tools.yaml"
    tools.write_text(
        "tools:\n  - {name: echo.say, description: Echo, connector: echo,"
        " input_schema: {type: object}, risk: read, idempotent: true}\n"
    )
    return tools


def test_a_waiting_submit_is_answered_when_the_controller_stops(
    postgres_url: str, tmp_path: Path
) -> None:
    tools = _echo_tools(tmp_path)
    answers: list[httpx.Response | BaseException] = []
    with cluster(tmp_path) as c:
        controller = c.controller("ctl", database_url=postgres_url, tools=tools)

        def submit() -> None:
            with api(controller) as client:
                body = {"steps": [{"step_id": "s", "tool": "echo.say", "args": {}}]}
                try:
                    answers.append(client.post("/v1/tasks", json=body, params={"wait": 60}))
                except httpx.HTTPError as exc:
                    answers.append(exc)

        waiting = threading.Thread(target=submit)
        waiting.start()
        with api(controller) as client:  # the submit is in: its task exists, pending
            wait_until(
                lambda: client.get("/v1/tasks", params={"limit": 1}).json()["tasks"],
                within=30,
                what="the waiting submit's task",
            )
        controller.popen.send_signal(signal.SIGTERM)
        waiting.join(30)
        assert controller.popen.wait(30) == 0
    (answer,) = answers
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "pending"
    assert answer.headers["Location"].startswith("/v1/tasks/")
    assert "Exception in ASGI application" not in controller.output()


def test_a_stopping_controller_says_not_ready_and_still_serves_for_its_delay(
    postgres_url: str, tmp_path: Path
) -> None:
    tools = _echo_tools(tmp_path)
    with cluster(tmp_path, {"AGENT_REACH_CONTROLLER_SHUTDOWN_DELAY": "4"}) as c:
        controller = c.controller("ctl", database_url=postgres_url, tools=tools)
        with api(controller) as client:
            assert client.get("/readyz").status_code == 200
            controller.popen.send_signal(signal.SIGTERM)
            not_ready = wait_until(
                lambda: (r := client.get("/readyz")).status_code == 503 and r,
                within=10,
                what="/readyz to say not ready",
            )
            assert not_ready.json()["code"] == "shutting_down"
            assert not_ready.headers["Retry-After"]
            # Still serving what is sent to it meanwhile, and still alive.
            assert client.get("/healthz").status_code == 200
            assert client.get("/v1/tasks").status_code == 200
        assert controller.popen.wait(30) == 0
    assert "controller_stopping" in controller.output()
