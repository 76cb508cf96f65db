"""The umbrella demo: a local weather and reminder service, two plans, and their receipts."""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import signal
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo

import httpx
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from agent_reach.addresses import split_address
from agent_reach_cli.client_commands import describe_task

TOOLS_FILE = Path(__file__).parent / "demo_assets" / "tools.yaml"
ENV_URL = "AGENT_REACH_DEMO_URL"
ENV_SMTP_HOST = "AGENT_REACH_DEMO_SMTP_HOST"
ENV_SMTP_PORT = "AGENT_REACH_DEMO_SMTP_PORT"
ENV_WEBHOOK_SECRET = "AGENT_REACH_DEMO_WEBHOOK_SECRET"
# The demo model's key: any value does (it checks none), but a profile names keys only by
# reference, so it is one.
ENV_MODEL_KEY = "AGENT_REACH_DEMO_MODEL_KEY"
DEMO_MODEL = "demo-umbrella-1"
AGENT = "umbrella"
# The user of the demo lives in Wuhan: "08:00" is 08:00 there.
USER_ZONE = "Asia/Shanghai"
FORECASTS = {
    "wuhan": (True, "Light rain from 07:00, 12-16 °C, 80% chance of rain"),
    "dubai": (False, "Sunny, 24-31 °C, no rain expected"),
}


def umbrella_plan(
    city: str, *, demo_url: str | None = None, at: datetime | None = None
) -> dict[str, Any]:
    """'If it rains in CITY tomorrow, remind me at 08:00 to take an umbrella.'

    With `demo_url` the whole scenario: the reminder is written and read back (verified), and at
    `at` (08:00 in the user's zone, or the demo's compressed stand-in for it) a notification goes
    to the user's phone (a signed webhook of the demo service) and inbox (its SMTP server).
    """
    when = (at or datetime(2026, 12, 1, 8, tzinfo=ZoneInfo(USER_ZONE))).astimezone(
        ZoneInfo(USER_ZONE)
    )
    steps: list[dict[str, Any]] = [
        {
            "step_id": "weather",
            "tool": "weather.forecast",
            "args": {"city": city, "day": "tomorrow"},
        },
        {
            "step_id": "remind",
            "tool": "reminder.create",
            "depends_on": ["weather"],
            "when": "steps.weather.output.rain == true",
            "args": {
                "at": when.isoformat(timespec="seconds"),
                "text": "Take an umbrella",
                "evidence": "$weather.output.summary",
            },
        },
    ]
    plan: dict[str, Any] = {
        "goal": f"remind me to take an umbrella at 08:00 if it rains in {city} tomorrow",
        "steps": steps,
    }
    if demo_url is None:
        return plan
    steps.append(
        {
            "step_id": "tell",
            "tool": "notify",
            "depends_on": ["weather", "remind"],
            # A local time in the plan's zone: the controller turns it into an instant.
            "run_at": when.replace(tzinfo=None).isoformat(timespec="seconds"),
            "args": {
                "subject": "Take an umbrella",
                "message": "$weather.output.summary",
                "targets": [
                    {"channel": "webhook", "url": f"{demo_url}/hooks/phone"},
                    {"channel": "email", "to": "you@example.org"},
                ],
            },
        }
    )
    return {**plan, "timezone": USER_ZONE}


def scripted_model(request: dict[str, Any]) -> dict[str, Any]:
    """The demo's model, an OpenAI Chat Completions endpoint with no model behind it: it asks for
    the forecast of the city the user named, sets a reminder if the forecast says rain, and then
    answers with what the tools said. No API key and no network: the loop, visible."""
    messages = request.get("messages") or []
    said = " ".join(m.get("content") or "" for m in messages if m.get("role") == "user")
    city = (re.findall(r"rains? in ([A-Z][\w-]*)", said) or ["Wuhan"])[-1]
    results = [_read(m.get("content")) for m in messages if m.get("role") == "tool"]
    weather = next((r for r in results if "rain" in r), None)
    reminder = next((r for r in results if "reminder_id" in r), None)
    if weather is None:
        return _completion(call=("weather_forecast", {"city": city, "day": "tomorrow"}))
    if weather["rain"] and reminder is None:
        at = datetime.now(ZoneInfo(USER_ZONE)).replace(hour=8, minute=0, second=0, microsecond=0)
        args = {
            "at": (at + timedelta(days=1)).isoformat(timespec="seconds"),
            "text": "Take an umbrella",
            "evidence": weather.get("summary", ""),
        }
        return _completion(call=("reminder_create", args))
    if reminder is not None:
        text = (
            f"It will rain in {city} tomorrow ({weather.get('summary')}). I set reminder "
            f"{reminder['reminder_id']} for 08:00: take an umbrella."
        )
    else:
        text = f"No rain in {city} tomorrow ({weather.get('summary')}): no reminder needed."
    return _completion(text=text)


def _read(content: Any) -> dict[str, Any]:
    """A tool result's data, as the model reads it (a receipt rendered as JSON)."""
    try:
        receipt = json.loads(content) if isinstance(content, str) else {}
    except ValueError:
        return {}
    data = receipt.get("data") if isinstance(receipt, dict) else None
    return data if isinstance(data, dict) else {}


def _completion(*, text: str | None = None, call: tuple[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if call is not None:
        name, args = call
        message["tool_calls"] = [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ]
    return {
        "id": f"chatcmpl-{secrets.token_hex(6)}",
        "object": "chat.completion",
        "created": int(datetime.now().timestamp()),
        "model": DEMO_MODEL,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


class _DemoHandler(BaseHTTPRequestHandler):
    reminders: dict[str, dict[str, Any]] = {}
    hooks: dict[str, dict[str, Any]] = {}  # by webhook-id: a repeat is the same delivery
    emails: list[dict[str, Any]] = []
    lock = threading.Lock()
    secret: str = ""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path.startswith("/reminders/"):
            wanted = parts.path.removeprefix("/reminders/")
            with self.lock:
                found = [r for r in self.reminders.values() if r["reminder_id"] == wanted]
            self._send(200, found[0]) if found else self._send(404, {"error": "no such reminder"})
            return
        if parts.path == "/deliveries":
            with self.lock:
                self._send(200, {"webhooks": list(self.hooks.values()), "emails": self.emails})
            return
        if parts.path != "/forecast":
            self._send(404, {"error": "not found"})
            return
        city = parse_qs(parts.query).get("city", [""])[0]
        rain, summary = FORECASTS.get(city.lower(), (False, "Clear skies, no rain expected"))
        self._send(200, {"city": city, "day": "tomorrow", "rain": rain, "summary": summary})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if path == "/v1/chat/completions":
            self._send(200, scripted_model(json.loads(raw or b"{}")))
            return
        if path.startswith("/hooks/"):
            self._hook(path.removeprefix("/hooks/"), raw)
            return
        if path != "/reminders":
            self._send(404, {"error": "not found"})
            return
        body = json.loads(raw or b"{}")
        key = self.headers.get("Idempotency-Key") or hashlib.sha256(repr(body).encode()).hexdigest()
        with self.lock:  # the same key is one reminder, however often it is retried
            created = key not in self.reminders
            if created:
                self.reminders[key] = {
                    "reminder_id": f"rem_{len(self.reminders) + 1}",
                    "at": body.get("at"),
                    "text": body.get("text"),
                    "evidence": body.get("evidence"),
                }
            self._send(201 if created else 200, {**self.reminders[key], "created": created})

    def _hook(self, name: str, raw: bytes) -> None:
        """A signed notification for the user's `name` device: checked, kept once per id."""
        try:
            payload = Webhook(self.secret).verify(raw, dict(self.headers))
        except WebhookVerificationError:
            self._send(401, {"error": "bad signature"})
            return
        key = self.headers["webhook-id"]
        with self.lock:
            self.hooks.setdefault(key, {"id": key, "device": name, "data": payload.get("data")})
        self.send_response(204)  # no body follows a 204
        self.end_headers()


class _Inbox:
    """The demo's SMTP server (aiosmtpd): every message it takes, kept for `/deliveries`."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        import email
        import email.policy

        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with _DemoHandler.lock:
            _DemoHandler.emails.append(
                {
                    "to": list(envelope.rcpt_tos),
                    "subject": str(message["Subject"]),
                    "message_id": str(message["Message-ID"]),
                }
            )
        return "250 OK"


@contextlib.contextmanager
def _smtp(host: str, port: int) -> Iterator[int]:
    """The demo inbox on (host, port); yields the port it took (0: any free one)."""
    import asyncio

    from aiosmtpd.controller import Controller

    class _Any(Controller):  # aiosmtpd's controller asks for a fixed port: take any free one
        def _create_server(self) -> Any:
            made = super()._create_server()

            async def create() -> asyncio.Server:
                server = cast(asyncio.Server, await made)
                self.port = server.sockets[0].getsockname()[1]  # the one it then checks
                return server

            return create()

    logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every SMTP line
    inbox = _Any(_Inbox(), hostname=host, port=port)
    inbox.start()
    try:
        yield int(inbox.port)
    finally:
        inbox.stop()


def _new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


SERVICE_HELP = "serve the demo's weather, reminders, phone (webhooks) and inbox (SMTP)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`reach demo-service` flags."""
    p.add_argument("--http", default="127.0.0.1:8000", help="HOST:PORT (default 127.0.0.1:8000)")
    p.add_argument("--smtp", default="127.0.0.1:2525", help="the inbox, HOST:PORT (default :2525)")


def serve(args: argparse.Namespace) -> int:
    """`reach demo-service`: the demo downstream on its own, until SIGTERM or SIGINT (compose's
    `demo` service; the demo tools reach it through AGENT_REACH_DEMO_URL and its inbox through
    AGENT_REACH_DEMO_SMTP_HOST/PORT; webhooks are signed with AGENT_REACH_DEMO_WEBHOOK_SECRET)."""
    host, port = split_address(args.http)
    _DemoHandler.secret = os.environ.get(ENV_WEBHOOK_SECRET) or _new_secret()
    server = ThreadingHTTPServer((host, port), _DemoHandler)
    smtp_host, smtp_port = split_address(args.smtp)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with _smtp(smtp_host, smtp_port) as bound:
        print(
            f"demo service listening on {host}:{server.server_address[1]}, "
            f"its inbox (SMTP) on {smtp_host}:{bound}",
            flush=True,
        )
        server.serve_forever()
    server.server_close()
    return 0


@contextlib.contextmanager
def running_demo_service() -> Iterator[str]:
    """Serve the demo downstream and its inbox on 127.0.0.1 and point the demo tools at them."""
    _DemoHandler.secret = os.environ.get(ENV_WEBHOOK_SECRET) or _new_secret()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DemoHandler)
    thread = threading.Thread(target=server.serve_forever, name="demo-service", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with _smtp("127.0.0.1", 0) as smtp_port:
            os.environ.update(
                {
                    ENV_URL: url,
                    ENV_SMTP_HOST: "127.0.0.1",
                    ENV_SMTP_PORT: str(smtp_port),
                    ENV_WEBHOOK_SECRET: _DemoHandler.secret,
                    ENV_MODEL_KEY: "demo",
                }
            )
            yield url
    finally:
        server.shutdown()
        server.server_close()


async def run_demo(base_url: str, *, api_key: str, demo_url: str, delay: float = 8.0) -> None:
    """The scenario for a rainy and a dry city: wait for each, and print what happened. "08:00"
    is compressed to `delay` seconds from now (in the user's zone)."""
    headers = {"Authorization": f"Bearer {api_key}"}
    at = datetime.now(ZoneInfo(USER_ZONE)) + timedelta(seconds=delay)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, headers=headers) as client:
        for city in ("Wuhan", "Dubai"):
            plan = umbrella_plan(city, demo_url=demo_url, at=at)
            response = await client.post("/v1/tasks", json=plan)
            response.raise_for_status()
            task_id = response.json()["task_id"]
            print(f"\n== If it rains in {city} tomorrow, remind me at 08:00 to take an umbrella")
            local = f"{at:%H:%M:%S} in {USER_ZONE}"
            print(f"   (time is compressed: '08:00' is {local}, {delay:.0f} s from now;")
            print(f"    follow it live with  reach status {task_id} --watch)", flush=True)
            task = await _ended(client, task_id, within=delay + 30)
            print(describe_task(task), flush=True)
        await _agent_run(client, demo_url)
        delivered = (await client.get(f"{demo_url}/deliveries")).json()
    print(
        f"\nThe demo service received {len(delivered['webhooks'])} signed webhook(s) on the "
        f"phone and {len(delivered['emails'])} email(s) in the inbox.",
        flush=True,
    )


def agent_profile(demo_url: str) -> dict[str, Any]:
    """The umbrella agent: the demo's scripted model, allowed the weather and the reminders."""
    return {
        "description": "Reminds you to take an umbrella when it will rain.",
        "endpoint": {
            "kind": "openai_chat",
            "base_url": f"{demo_url}/v1",
            "api_key": f"${{env:{ENV_MODEL_KEY}}}",
            "allow_hosts": ["127.0.0.1"],
        },
        "model": DEMO_MODEL,
        "system": "You help with the weather. Use the tools; never guess a forecast.",
        "tools": ["weather.*", "reminder.create"],
        "limits": {"max_rounds": 5},
    }


async def _agent_run(client: httpx.AsyncClient, demo_url: str) -> None:
    """The same request as an agent run: the model decides, the controller runs it."""
    put = await client.put(f"/v1/agents/{AGENT}", json=agent_profile(demo_url))
    put.raise_for_status()
    ask = "If it rains in Wuhan tomorrow, remind me at 08:00 to take an umbrella."
    print(f"\n== The same, as an agent run: the model decides, Agent-Reach runs it\n   > {ask}")
    started = await client.post("/v1/runs?wait=30", json={"agent": AGENT, "input": ask})
    started.raise_for_status()
    run = (await client.get(f"/v1/runs/{started.json()['run_id']}")).json()
    for entry in run["messages"]:
        message = entry["message"]
        for call in message.get("tool_calls") or []:
            function = call["function"]
            print(f"   [{entry['round']}] model calls {function['name']} {function['arguments']}")
    print(f"   {run['status']} ({run['end_reason']}) in {run['round']} rounds: {run['answer']}")
    print(f"   (reach runs show {run['run_id']} prints the whole conversation)", flush=True)


async def _ended(client: httpx.AsyncClient, task_id: str, *, within: float) -> dict[str, Any]:
    """The task once it has ended, or as it is after `within` seconds."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + within
    while True:
        task: dict[str, Any] = (await client.get(f"/v1/tasks/{task_id}")).json()
        done = task["status"] in ("succeeded", "failed", "cancelled")
        if done or asyncio.get_running_loop().time() > deadline:
            return task
        await asyncio.sleep(0.5)
