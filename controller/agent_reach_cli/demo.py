"""The umbrella demo: a local weather and reminder service, two plans, and their receipts."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from agent_reach.addresses import split_address
from agent_reach_cli.client_commands import describe_task

TOOLS_FILE = Path(__file__).parent / "demo_assets" / "tools.yaml"
ENV_URL = "AGENT_REACH_DEMO_URL"
FORECASTS = {
    "wuhan": (True, "Light rain from 07:00, 12-16 °C, 80% chance of rain"),
    "dubai": (False, "Sunny, 24-31 °C, no rain expected"),
}


def umbrella_plan(city: str) -> dict[str, Any]:
    """'If it rains in CITY tomorrow, remind me at 08:00 to take an umbrella.'"""
    return {
        "goal": f"remind me to take an umbrella at 08:00 if it rains in {city} tomorrow",
        "steps": [
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
                    "at": "2026-12-01T08:00:00+08:00",
                    "text": "Take an umbrella",
                    "evidence": "$weather.output.summary",
                },
            },
        ],
    }


class _DemoHandler(BaseHTTPRequestHandler):
    reminders: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

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
        if parts.path != "/forecast":
            self._send(404, {"error": "not found"})
            return
        city = parse_qs(parts.query).get("city", [""])[0]
        rain, summary = FORECASTS.get(city.lower(), (False, "Clear skies, no rain expected"))
        self._send(200, {"city": city, "day": "tomorrow", "rain": rain, "summary": summary})

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/reminders":
            self._send(404, {"error": "not found"})
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
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


def serve(args: argparse.Namespace) -> int:
    """`reach demo-service`: the demo downstream on its own, until SIGTERM or SIGINT (compose's
    `demo` service; the demo tools reach it through AGENT_REACH_DEMO_URL)."""
    host, port = split_address(args.http)
    server = ThreadingHTTPServer((host, port), _DemoHandler)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"demo service listening on {host}:{server.server_address[1]}", flush=True)
    server.serve_forever()
    server.server_close()
    return 0


@contextlib.contextmanager
def running_demo_service() -> Iterator[str]:
    """Serve the demo downstream on 127.0.0.1 and point the demo tools at it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DemoHandler)
    thread = threading.Thread(target=server.serve_forever, name="demo-service", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    os.environ[ENV_URL] = url
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


async def run_demo(base_url: str, *, api_key: str) -> None:
    """Submit the plan for a rainy and a dry city, wait for each, and print what happened."""
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=60, headers=headers) as client:
        for city in ("Wuhan", "Dubai"):
            response = await client.post("/v1/tasks", params={"wait": 30}, json=umbrella_plan(city))
            response.raise_for_status()
            print(f"\n== If it rains in {city} tomorrow, remind me at 08:00 to take an umbrella")
            print(describe_task(response.json()), flush=True)


def print_quick_start(
    base_url: str, *, api_key: str, demo_mode: bool, executor: tuple[str, str] | None = None
) -> None:
    """`executor`: (gRPC address, pool token) for executors started by hand against it."""
    plan = json.dumps(umbrella_plan("Wuhan"))
    more = (
        "An executor pool token, for more executors started by hand:\n\n"
        f"  reach executor --controller {executor[0]} --token {executor[1]}\n\n"
        if executor is not None
        else ""
    )
    print(
        f"\nAgent-Reach is up: REST {base_url} (OpenAPI at {base_url}/docs)\n"
        f"A dev API key (tenant default, role admin), shown once:\n\n  {api_key}\n\n"
        "Submit a plan and wait up to 10 s for its receipts:\n\n"
        f"  export AGENT_REACH_API_KEY={api_key}\n"
        f"  curl -s -X POST '{base_url}/v1/tasks?wait=10' -H 'Content-Type: application/json' \\\n"
        '       -H "Authorization: Bearer $AGENT_REACH_API_KEY" \\\n'
        f"       -d '{plan}'\n\n"
        + more
        + ("" if demo_mode else "(start with --demo to get the demo tools)\n")
        + "Press Ctrl-C to stop.",
        flush=True,
    )
