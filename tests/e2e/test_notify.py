"""`notify` through real processes: one message to a signed webhook, a Slack-compatible webhook
and an SMTP inbox (aiosmtpd), each target its own step, one record of them all.

`reach dev` runs the controller and an executor; the webhook and Slack endpoints are a `Sink`, the
inbox an `SmtpServer`, all on 127.0.0.1 and admitted by the tool's `allow_hosts`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from tests.e2e.processes import Cluster, Proc, api, cluster, wait_until
from tests.support.sink import Response, Sink
from tests.support.smtp import SmtpServer

pytestmark = pytest.mark.e2e

SECRET = "whsec_" + "Y2FuYXJ5LW5vdGlmeS13ZWJob29rLXNlY3JldA=="  # base64 of a canary
TARGET = {
    "type": "object",
    "properties": {
        "channel": {"enum": ["webhook", "slack", "email"]},
        "url": {"type": "string"},
        "to": {"type": "string"},
    },
    "required": ["channel"],
}


def notify_tool(sink: Sink, smtp: SmtpServer) -> dict[str, Any]:
    sink_host = sink.url.removeprefix("http://")
    return {
        "name": "notify",
        "description": "Send one message to every target; a record per target.",
        "connector": "notify",
        "input_schema": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "subject": {"type": "string"},
                "targets": {"type": "array", "items": TARGET},
            },
            "required": ["message", "targets"],
        },
        "fan_out": {"over": "targets", "as": "target"},
        "retry": {"maximum_attempts": 3, "initial_interval": 0.2, "maximum_interval": 0.5},
        "config": {
            "webhook_secret": "${env:NOTIFY_WEBHOOK_SECRET}",
            "smtp": {
                "host": "127.0.0.1",
                "port": smtp.port,
                "starttls": False,
                "from": "reach@example.org",
            },
            "allow_hosts": [sink_host, f"127.0.0.1:{smtp.port}"],
            "destinations": ["127.0.0.1", "@example.org"],
        },
    }


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Cluster, Proc, Sink, SmtpServer]]:
    with Sink() as sink, SmtpServer() as smtp:
        tools = tmp_path / "tools.yaml"
        tools.write_text(json.dumps({"tools": [notify_tool(sink, smtp)]}))
        with cluster(tmp_path, env={"NOTIFY_WEBHOOK_SECRET": SECRET}) as c:
            dev = c.dev("dev", tools=tools)
            yield c, dev, sink, smtp


def targets(sink: Sink) -> list[dict[str, str]]:
    return [
        {"channel": "webhook", "url": f"{sink.url}/hook"},
        {"channel": "slack", "url": f"{sink.url}/services/T000/B000/slacksecretpath"},
        {"channel": "email", "to": "ada@example.org"},
    ]


def submit(client: httpx.Client, sink: Sink) -> str:
    args = {"message": "Take an umbrella.", "subject": "Rain at 08:00", "targets": targets(sink)}
    answer = client.post(
        "/v1/tasks", json={"steps": [{"step_id": "tell", "tool": "notify", "args": args}]}
    )
    assert answer.status_code == 202, answer.text
    task_id: str = answer.json()["task_id"]
    return task_id


def steps_of(client: httpx.Client, task_id: str) -> dict[str, dict[str, Any]]:
    task = client.get(f"/v1/tasks/{task_id}").json()
    return {s["step_id"]: s for s in task["steps"]}


def ended(client: httpx.Client, task_id: str) -> dict[str, Any] | None:
    task: dict[str, Any] = client.get(f"/v1/tasks/{task_id}").json()
    return task if task["status"] in ("succeeded", "failed", "cancelled") else None


def test_one_message_reaches_every_channel_once_with_a_record_each(
    world: tuple[Cluster, Proc, Sink, SmtpServer],
) -> None:
    _, dev, sink, smtp = world
    sink.script("/hook", [Response(status=503), Response(status=204)])  # retried: same id
    with api(dev) as client:
        task_id = submit(client, sink)
        task = wait_until(lambda: ended(client, task_id), within=60, what="the task to end")
        assert task["status"] == "succeeded", task
        tell = steps_of(client, task_id)["tell"]
        rows = tell["receipt"]["targets"]
        assert [(r["status"], r["attempts"]) for r in rows] == [
            ("succeeded", 2),
            ("succeeded", 1),
            ("succeeded", 1),
        ]
        assert all(r["done_at"] for r in rows)
        assert [r["output"]["channel"] for r in rows] == ["webhook", "slack", "email"]
        # The Slack URL's path is a secret: the records name the host only.
        assert "slacksecretpath" not in json.dumps(tell["receipt"])
        assert rows[1]["output"]["target"] == sink.url.removeprefix("http://")

    first, second = sink.requests("/hook")
    assert first.headers["webhook-id"] == second.headers["webhook-id"]  # receivers deduplicate
    signed = Webhook(SECRET).verify(second.body, dict(second.headers))
    assert signed["data"]["message"] == "Take an umbrella."
    [slack] = sink.requests("/services/T000/B000/slacksecretpath")
    assert "Take an umbrella." in slack.json()["text"]
    [mail] = smtp.messages
    assert mail.recipients == ("ada@example.org",)
    assert mail.message["Subject"] == "Rain at 08:00"
    assert "Take an umbrella." in mail.message.get_content()


def test_a_full_mailbox_is_a_partial_delivery_the_model_can_read(
    world: tuple[Cluster, Proc, Sink, SmtpServer],
) -> None:
    _, dev, sink, smtp = world
    smtp.rcpt_reply = "552 5.2.2 mailbox full"
    with api(dev) as client:
        task_id = submit(client, sink)
        task = wait_until(lambda: ended(client, task_id), within=60, what="the task to end")
        assert task["status"] == "failed"
        tell = steps_of(client, task_id)["tell"]
        error = tell["receipt"]["error"]
        assert error["code"] == "partially_done"
        assert error["message"].startswith("2 of 3 targets succeeded; targets[2] failed: ")
        assert "mailbox full" in error["message"]
        rows = tell["receipt"]["targets"]
        assert [r["status"] for r in rows] == ["succeeded", "succeeded", "failed"]
        assert rows[2]["attempts"] == 1  # a permanent refusal is not tried again
    assert smtp.messages == []


def test_an_email_that_may_have_been_sent_is_not_sent_again_until_an_operator_says(
    world: tuple[Cluster, Proc, Sink, SmtpServer],
) -> None:
    _, dev, sink, smtp = world
    smtp.after_data = "drop"  # the server read the message, then went away without a reply
    with api(dev) as client:
        task_id = submit(client, sink)

        def email_unknown() -> dict[str, Any] | None:
            steps = steps_of(client, task_id)
            others_done = all(steps[f"tell[{n}]"]["status"] == "succeeded" for n in (0, 1))
            unknown = steps["tell[2]"]["status"] == "outcome_unknown"
            return steps if others_done and unknown else None

        steps = wait_until(email_unknown, within=60, what="the email to be outcome_unknown")
        assert steps["tell"]["status"] == "blocked"  # the record waits for the email's verdict
        assert len(smtp.messages) == 1
        # outcome_unknown has no way out but an operator: nothing can send it again by itself.
        verdict = {"action": "succeeded", "reason": "seen in the inbox", "output": {}}
        answer = client.post(f"/v1/tasks/{task_id}/steps/tell[2]/resolve", json=verdict)
        assert answer.status_code == 200, answer.text
        task = wait_until(lambda: ended(client, task_id), within=30, what="the task to end")
        assert task["status"] == "succeeded"
    assert len(smtp.messages) == 1
