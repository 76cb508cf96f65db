"""A trigger through real processes: "new order → check stock → compute the ship date → tell the
customer". A signed event starts the stored template in `reach dev`; the stock comes over HTTP,
the date from a Python tool, and the customer hears by a signed webhook and an email, once, even
when the shop sends the event twice."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from tests.e2e.processes import all_terminal, api, cluster, wait_until
from tests.e2e.test_notify import SECRET as NOTIFY_SECRET
from tests.e2e.test_notify import notify_tool
from tests.support.sink import Response, Sink
from tests.support.smtp import SmtpServer

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

TEMPLATE: dict[str, Any] = {
    "goal": "ship a new order and tell the customer",
    "steps": [
        {"step_id": "stock", "tool": "stock.check", "args": {"sku": "$event.sku"}},
        {
            "step_id": "ship",
            "tool": "orders.ship_date",
            "args": {"ordered": "$event.placed_at", "days": "$stock.output.days"},
            "depends_on": ["stock"],
            "when": "steps.stock.output.available >= context.event.qty",
        },
        {
            "step_id": "tell",
            "tool": "notify",
            "args": {
                "subject": "Your order",
                "message": "$ship.output.ships_on",
                "targets": [
                    {"channel": "webhook", "url": "$event.customer.hook"},
                    {"channel": "email", "to": "$event.customer.email"},
                ],
            },
            "depends_on": ["ship"],
        },
    ],
}


def tools(sink: Sink, smtp: SmtpServer) -> list[dict[str, Any]]:
    return [
        {
            "name": "stock.check",
            "description": "How many of a SKU the warehouse has, and how soon it ships.",
            "connector": "http",
            "config": {"method": "POST", "url": f"{sink.url}/stock", "allow_hosts": ["127.0.0.1"]},
            "input_schema": {
                "type": "object",
                "required": ["sku"],
                "properties": {"sku": {"type": "string"}},
            },
            "idempotent": True,
        },
        {
            "name": "orders.ship_date",
            "description": "The day an order ships.",
            "connector": "python",
            "config": {"function": "tests.support.order_tools:ship_date"},
            "input_schema": {
                "type": "object",
                "required": ["ordered", "days"],
                "properties": {"ordered": {"type": "string"}, "days": {"type": "integer"}},
            },
            "idempotent": True,
        },
        notify_tool(sink, smtp),
    ]


def signed(secret: str, event: dict[str, Any], event_id: str) -> dict[str, Any]:
    body = json.dumps(event)
    now = datetime.now(UTC)
    return {
        "content": body,
        "headers": {
            "content-type": "application/json",
            "webhook-id": event_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(secret).sign(event_id, now, body),
        },
    }


def test_a_new_order_is_checked_dated_and_told_once(tmp_path: Path) -> None:
    with Sink() as sink, SmtpServer() as smtp:
        sink.script("/stock", [Response(json={"available": 5, "days": 2})])
        sink.script("/phone", [Response(status=200)])
        catalogue = tmp_path / "tools.yaml"
        catalogue.write_text(json.dumps({"tools": tools(sink, smtp)}))
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {"NOTIFY_WEBHOOK_SECRET": NOTIFY_SECRET, "PYTHONPATH": path}
        with cluster(tmp_path, env=env) as c:
            dev = c.dev("dev", tools=catalogue)
            with api(dev) as client:
                saved = client.put("/v1/triggers/orders.new", json={"template": TEMPLATE})
                assert saved.status_code == 200, saved.text
                secret = saved.json()["secret"]
                order = {
                    "order_id": "o-1042",
                    "sku": "UMB-RED",
                    "qty": 2,
                    "placed_at": "2026-12-04T16:20:00+08:00",  # a Friday
                    "customer": {"hook": f"{sink.url}/phone", "email": "ann@example.org"},
                }
                url = f"http://{dev.info['http']}/v1/triggers/orders.new"
                with httpx.Client(timeout=30) as shop:  # the shop holds no API key
                    first = shop.post(url, **signed(secret, order, "order-1042"))
                    retried = shop.post(url, **signed(secret, order, "order-1042"))
                assert (first.status_code, retried.status_code) == (202, 200), retried.text
                task_id = first.json()["task_id"]
                assert retried.json()["task_id"] == task_id
                (task,) = wait_until(
                    lambda: all_terminal(client, [task_id]), within=60, what="the order's task"
                )
        assert task["status"] == "succeeded", json.dumps(task, indent=2)
        steps = {s["step_id"]: s for s in task["steps"]}
        assert steps["ship"]["resolved_args"] == {"ordered": order["placed_at"], "days": 2}
        assert steps["ship"]["receipt"]["data"] == {"ships_on": "2026-12-08"}  # Fri + 2 working
        (stock,) = sink.requests("/stock")
        assert json.loads(stock.body) == {"sku": "UMB-RED"}
        (call,) = sink.requests("/phone")
        told = Webhook(NOTIFY_SECRET).verify(call.body, call.headers)
        assert "2026-12-08" in json.dumps(told)
        (mail,) = smtp.messages
        assert mail.recipients == ("ann@example.org",)
        assert "2026-12-08" in mail.message.get_content()
