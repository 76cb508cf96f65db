"""Secret canaries: unique fake secrets appear nowhere but at the downstream that needs them.

Fake secrets (`canary-…`) are given to the executor process only, through its environment, and
referenced by `${env:…}` in the places a careless implementation would leak them: a Bearer
Authorization header, another header, a URL query parameter, a URL path segment and a configured
query parameter. Every outcome is driven through the Sink: success, 503/500 retried into a
success, 503 until the attempts run out, 401, 404, a timeout, a connection reset after the
request, a redirect to a refused (metadata) address and a refused connection (a closed port).
The controller gets a canary as its admin key and one as its database password (trust auth
ignores it, so the DSN still works), and a wrong key is offered to see it is not echoed back.

Afterwards every canary, in every spelling (raw, URL-encoded, base64, JSON-escaped), is looked
for in every file the processes wrote (JSON logs), every API response body (tasks, steps and
receipts, full step outputs, events, Jaeger traces, replays, task lists, the tool catalogue in
all three formats, breakers, errors), the `tool_messages` of an OpenAI-style tool_calls submit,
every row of every table of the database and, in the cluster, every span both processes exported
over OTLP. None may be found. The Sink's recorded requests, and only they, must carry the HTTP
canaries: that proves the canaries really were used.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
import psycopg
import pytest
import yaml

from agent_reach_controller.identity.pools import token_hash
from tests.e2e.processes import Cluster, Proc, all_terminal, cluster, wait_until
from tests.support.models import ScriptedModels, answer, call_tools, failure
from tests.support.otlp import OtlpReceiver
from tests.support.server import free_port
from tests.support.sink import Delivery, Response, Sink

pytestmark = pytest.mark.e2e

# The executor's environment variables that hold the HTTP canaries, by where the config uses them.
HTTP_SECRETS = {
    "bearer": "CANARY_BEARER",  # Authorization: Bearer ${env:CANARY_BEARER}
    "header": "CANARY_HEADER",  # X-Api-Key: ${env:CANARY_HEADER}
    "url_query": "CANARY_URL_QUERY",  # url: …?key=${env:CANARY_URL_QUERY}
    "url_path": "CANARY_URL_PATH",  # url: …/p/${env:CANARY_URL_PATH}
    "query": "CANARY_QUERY",  # query: {token: ${env:CANARY_QUERY}}
}

# Every outcome, as the sink scripts it (per path), and the status its step must end in.
OUTCOMES: dict[str, tuple[list[Response], str]] = {
    "ok": ([Response(json={"ok": True})], "succeeded"),
    "flaky": (
        [Response(status=503, retry_after=0), Response(status=500), Response(json={"ok": 1})],
        "succeeded",
    ),
    "down": ([Response(status=503)], "failed"),
    "unauthorized": ([Response(status=401, body="bad token")], "failed"),
    "missing": ([Response(status=404, body="no such thing")], "failed"),
    "slow": ([Response(json={"late": True}, delay=2.5)], "failed"),
    "reset": ([Response(reset=True)], "failed"),
    "redirect": ([], "failed"),  # scripted in the test: its Location holds canaries
}
CLOSED = "closed"  # the closed-port tool


# The executor's variable holding the agent's model key (sent to the scripted model only).
MODEL_KEY = "CANARY_MODEL_KEY"
# What the scripted model answers: a run that calls a tool and answers, then one refused (401).
MODEL_SCRIPT = (
    call_tools([("canary_call", {"case": "plan-ok", "note": "from a run"})]),
    answer("The call went through."),
    failure(401),
)

SESSION = re.compile(r"xs_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")


def canary(kind: str) -> str:
    return f"canary-{kind}-{uuid.uuid4().hex}"


def spellings(value: str) -> set[str]:
    """Every form a leak could take: raw, URL-encoded, base64 (Basic auth) and JSON-escaped."""
    return {
        value,
        quote(value, safe=""),
        quote(value),
        quote_plus(value),
        base64.b64encode(value.encode()).decode(),
        json.dumps(value)[1:-1],
    }


def tools_file(directory: Path, sink_url: str, port: int, models_url: str) -> Path:
    secret = {name: f"${{env:{var}}}" for name, var in HTTP_SECRETS.items()}

    def tool(name: str, base: str, *, url_query: bool) -> dict[str, Any]:
        # A URL's own query and the configured `query` are not combined (httpx's `params`
        # replaces the URL's query), so each tool carries one or the other.
        url = f"{base}/{{case}}/p/{secret['url_path']}"
        where: dict[str, Any] = (
            {"url": f"{url}?key={secret['url_query']}"}
            if url_query
            else {"url": url, "query": {"token": secret["query"]}}
        )
        return {
            "name": name,
            "description": "Call the downstream with every kind of credential.",
            "connector": "http",
            "config": {
                "method": "POST",
                **where,
                "headers": {
                    "Authorization": f"Bearer {secret['bearer']}",
                    "X-Api-Key": secret["header"],
                },
                "allow_hosts": ["127.0.0.1"],  # the sink (the metadata address stays refused)
            },
            "input_schema": {
                "type": "object",
                "required": ["case"],
                "properties": {"case": {"type": "string"}, "note": {"type": "string"}},
            },
            "timeout": "1s",
            "retry": {"initial_interval": "50ms", "maximum_attempts": 3, "jitter": False},
            "idempotent": True,
        }

    path = directory / "tools.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tools": [
                    tool("canary.call", sink_url, url_query=True),
                    tool("canary.closed", f"http://127.0.0.1:{port}", url_query=True),
                    tool("canary.query", sink_url, url_query=False),
                    tool("canary.query_closed", f"http://127.0.0.1:{port}", url_query=False),
                ],
                # An agent whose model key is a canary: its runs, conversation, events and
                # errors are searched like everything else.
                "agents": [
                    {
                        "name": "canary.agent",
                        "endpoint": {
                            "kind": "openai_chat",
                            "base_url": models_url,
                            "api_key": f"${{env:{MODEL_KEY}}}",
                            "allow_hosts": ["127.0.0.1"],
                        },
                        "model": "scripted-1",
                        "tools": ["canary.call"],
                        "retry": {"maximum_attempts": 1},
                    }
                ],
            }
        )
    )
    return path


@dataclass
class Seen:
    """Every place searched: a label and the text found there."""

    places: list[tuple[str, str]] = field(default_factory=list)

    def add(self, label: str, text: str) -> None:
        self.places.append((label, text))

    def record(self, label: str, response: httpx.Response) -> httpx.Response:
        # Headers too: an error could be echoed in one.
        head = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
        self.add(f"api {label} ({response.status_code})", f"{head}\n{response.text}")
        return response


def postgres_rows(url: str) -> Iterator[tuple[str, str]]:
    """(table, row as JSON text) for every row of every table of the public schema."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
            )
        ]
        for table in tables:
            for (row,) in conn.execute(f'SELECT row_to_json(t)::text FROM "{table}" t'):
                yield table, row


def with_password(url: str, password: str) -> str | None:
    """The DSN with `password` added to its user, or None when it has no bare user to add to."""
    scheme, sep, rest = url.partition("://")
    user, at, host = rest.partition("@")
    if not sep or not at or not user or ":" in user:
        return None
    return f"{scheme}://{user}:{quote(password, safe='')}@{host}"


# The plan uses the tools with a secret in the URL's query, the tool calls those with a
# configured `query` parameter.
TOOLS = {"plan": ("canary.call", "canary.closed"), "calls": ("canary.query", "canary.query_closed")}


def plan_steps(prefix: str) -> list[tuple[str, str, dict[str, str]]]:
    """(call id, tool, args) for every outcome, sink paths under `prefix`."""
    tool, closed = TOOLS[prefix]
    calls = [(o, tool, {"case": f"{prefix}-{o}", "note": o}) for o in OUTCOMES]
    return [*calls, (CLOSED, closed, {"case": f"{prefix}-{CLOSED}", "note": CLOSED})]


def sqlite_rows(path: Path) -> Iterator[tuple[str, str]]:
    """(table, row as text) for every row of every table of a SQLite database."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                yield table, repr(row)


@dataclass(frozen=True)
class Canaries:
    http: dict[str, str]  # HTTP_SECRETS name -> value, given to the executor only
    admin_key: str
    wrong_key: str
    db_password: str | None  # None when the DSN cannot carry one
    # The executor's pool token: the controller holds only its hash (a provisioning file).
    executor_token: str = ""
    model_key: str = ""  # the agent's model key: the executor's, sent to the model only

    @classmethod
    def new(cls, *, db_password: bool) -> Canaries:
        http = {name: canary(name) for name in HTTP_SECRETS}
        # Token-like, with the characters base64 secrets carry, where a header takes it whole.
        http["bearer"] = f"canary-bearer-{uuid.uuid4().hex}/+="
        return cls(
            http=http,
            admin_key=canary("admin"),
            wrong_key=canary("wrongkey"),
            db_password=canary("dbpass") if db_password else None,
            executor_token=canary("executor-token"),
            model_key=canary("model-key"),
        )

    def everything(self) -> dict[str, str]:
        others = {
            "admin_key": self.admin_key,
            "wrong_key": self.wrong_key,
            "executor_token": self.executor_token,
            "model_key": self.model_key,
        }
        if self.db_password is not None:
            others["db_password"] = self.db_password
        return {**self.http, **others}

    def executor_env(self) -> dict[str, str]:
        http = {HTTP_SECRETS[name]: value for name, value in self.http.items()}
        return http | {MODEL_KEY: self.model_key}

    def occurrences(self, text: str) -> list[str]:
        """`name (spelling)` for every canary spelling found in `text` (case-insensitively)."""
        lowered = text.lower()
        return [
            f"{name} ({form!r})"
            for name, value in self.everything().items()
            for form in sorted(spellings(value))
            if form.lower() in lowered
        ]


PREFIXES = ("plan", "calls")


def script_sink(sink: Sink, secrets: Canaries) -> None:
    http = secrets.http
    for prefix in PREFIXES:
        for outcome, (scripted, _) in OUTCOMES.items():
            responses = scripted
            if outcome == "redirect":
                # A downstream that bounces to the metadata address, echoing the secrets.
                location = (
                    f"http://169.254.169.254/latest/meta-data/{http['url_path']}"
                    f"?key={http['url_query']}&token={http['query']}"
                )
                responses = [Response(status=302, headers=(("Location", location),))]
            sink.script(f"/{prefix}-{outcome}/p/{http['url_path']}", responses)


def exercise_runs(client: httpx.Client, seen: Seen) -> None:
    """A run that calls a tool and answers, and one whose model refuses the key (401); every
    view of them read back: the run, its conversation, its events, the list, the agent."""
    for expected in ("succeeded", "failed"):
        body = {"agent": "canary.agent", "input": "Call the downstream once."}
        started = seen.record("start run", client.post("/v1/runs", params={"wait": 60}, json=body))
        assert started.status_code == 200, started.text
        run = seen.record("run", client.get(f"/v1/runs/{started.json()['run_id']}")).json()
        assert run["status"] == expected, run
        events = client.get(f"/v1/runs/{run['run_id']}/events", timeout=30)
        assert "event: end" in seen.record("run events", events).text
    assert run["error"]["code"] == "unauthorized", run
    seen.record("runs", client.get("/v1/runs"))
    seen.record("agent", client.get("/v1/agents/canary.agent"))
    seen.record("agents", client.get("/v1/agents"))


@dataclass
class Run:
    plan_task: dict[str, Any]
    calls_task: dict[str, Any]
    messages: list[dict[str, Any]]


def exercise(proc: Proc, secrets: Canaries, seen: Seen) -> Run:
    """Submit every outcome as a plan and as tool calls; read back everything the API shows."""
    base_url = f"http://{proc.info['http']}"
    auth = {"Authorization": f"Bearer {secrets.admin_key}"}
    with httpx.Client(base_url=base_url, timeout=60, headers=auth) as client:
        plan = {
            "goal": "exercise every outcome with credentials",
            "steps": [
                {"step_id": sid, "tool": tool, "args": args}
                for sid, tool, args in plan_steps("plan")
            ],
        }
        submitted = seen.record("submit plan", client.post("/v1/tasks", json=plan))
        assert submitted.status_code == 202, submitted.text
        plan_id = submitted.json()["task_id"]

        calls = {
            "tool_calls": [
                {
                    "id": f"call_{sid}",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps(args)},
                }
                for sid, tool, args in plan_steps("calls")
            ]
        }
        answered = seen.record(
            "submit tool_calls", client.post("/v1/tasks", params={"wait": 60}, json=calls)
        )
        assert answered.status_code == 200, answered.text
        calls_task = answered.json()
        messages: list[dict[str, Any]] = calls_task["tool_messages"]
        assert len(messages) == len(OUTCOMES) + 1
        for message in messages:
            seen.add(f"tool_message {message['tool_call_id']}", message["content"])

        task_ids = [plan_id, calls_task["task_id"]]
        wait_until(lambda: all_terminal(client, task_ids), within=60, what="both tasks to end")
        tasks = []
        for task_id in task_ids:
            task = seen.record("task", client.get(f"/v1/tasks/{task_id}")).json()
            for step in task["steps"]:
                assert step["receipt"] is not None, step
                seen.add(f"receipt {task_id}/{step['step_id']}", json.dumps(step))
                output = client.get(f"/v1/tasks/{task_id}/steps/{step['step_id']}/output")
                seen.record("step output", output)
            tasks.append(task)
            seen.record("events", client.get(f"/v1/tasks/{task_id}/events"))
            assert seen.record("jaeger trace", client.get(f"/v1/tasks/{task_id}/trace")).is_success
            assert seen.record("replay", client.get(f"/v1/tasks/{task_id}/replay")).is_success
        seen.record("task list", client.get("/v1/tasks"))
        for fmt in ("native", "openai", "anthropic"):
            listed = seen.record(f"tools {fmt}", client.get("/v1/tools", params={"format": fmt}))
            assert listed.status_code == 200
        seen.record("breakers", client.get("/v1/tools/breakers"))
        exercise_runs(client, seen)
        # Errors: an unknown task, an invalid plan, and a wrong key (which must not be echoed).
        assert seen.record("404", client.get("/v1/tasks/nope")).status_code == 404
        bad = {"steps": [{"step_id": "x", "tool": "canary.call", "args": {"case": 1}}]}
        assert seen.record("422", client.post("/v1/tasks", json=bad)).status_code == 422
    for header, value in (
        ("Authorization", f"Bearer {secrets.wrong_key}"),
        ("X-API-Key", secrets.wrong_key),
    ):
        denied = httpx.get(f"{base_url}/v1/tasks/{plan_id}", headers={header: value})
        assert seen.record(f"401 via {header}", denied).status_code == 401
    return Run(plan_task=tasks[0], calls_task=tasks[1], messages=messages)


def check(
    run: Run, secrets: Canaries, seen: Seen, deliveries: list[Delivery], workdir: Path
) -> str:
    """Assert the outcomes, no canary anywhere but in the sink; the one-line summary."""
    # Each outcome ended as scripted, in both submissions.
    by_step = {s["step_id"]: s for s in run.plan_task["steps"]}
    by_call = {s["step_id"].removeprefix("call_"): s for s in run.calls_task["steps"]}
    expected = {**{o: status for o, (_, status) in OUTCOMES.items()}, CLOSED: "failed"}
    assert {k: s["status"] for k, s in by_step.items()} == expected
    assert {k: s["status"] for k, s in by_call.items()} == expected
    for steps in (by_step, by_call):
        errors = {k: json.dumps((s["receipt"] or {}).get("error")) for k, s in steps.items()}
        assert "401" in errors["unauthorized"], errors
        assert "404" in errors["missing"], errors
        assert "destination_refused" in errors["redirect"], errors
        assert "169.254.169.254" in errors["redirect"], errors
        assert "connection_error" in errors[CLOSED], errors
        assert steps["flaky"]["attempt"] == 3
        assert steps["down"]["attempt"] == 3

    for path in sorted(workdir.rglob("*")):
        if path.is_file():
            seen.add(f"file {path.name}", path.read_text(errors="replace"))
    assert any(label.startswith("file ") and label.endswith(".log") for label, _ in seen.places)

    leaks = [
        f"{found} in {label}" for label, text in seen.places for found in secrets.occurrences(text)
    ]
    # Executor session credentials are secrets the controller makes: never written anywhere.
    leaks += [
        f"a session credential in {label}" for label, text in seen.places if SESSION.search(text)
    ]
    assert not leaks, "secret canaries leaked:\n" + "\n".join(leaks[:50])

    # The downstream, and only it, got the secrets: proof the canaries were really used.
    http = secrets.http

    def carried(d: Delivery) -> dict[str, bool]:
        query = "url_query" if d.path.startswith("/plan-") else "query"
        return {
            "bearer": d.headers.get("authorization") == f"Bearer {http['bearer']}",
            "header": d.headers.get("x-api-key") == http["header"],
            "url_path": d.path.endswith(f"/p/{http['url_path']}"),
            query: d.query.get("key" if query == "url_query" else "token") == [http[query]],
        }

    assert deliveries, "the sink got no request"
    for delivery in deliveries:
        assert all(carried(delivery).values()), (delivery.path, carried(delivery))
    used = {name for d in deliveries for name, ok in carried(d).items() if ok}
    assert used == set(http), f"canaries never delivered: {set(http) - used}"
    # The search itself works: it finds every HTTP canary in what the sink recorded.
    found = " ".join(secrets.occurrences(repr(deliveries)))
    assert all(f"{name} (" in found for name in http), found
    # Only scripted sink paths were reached (not the closed port, not the metadata address).
    assert {d.path.split("/")[1] for d in deliveries} <= {
        f"{p}-{o}" for p in PREFIXES for o in OUTCOMES
    }

    everything = secrets.everything()
    kinds = Counter(label.split(" ")[0] for label, _ in seen.places)
    return (
        f"{len(everything)} secret canaries ({sum(len(spellings(v)) for v in everything.values())}"
        f" spellings) searched in {len(seen.places)} places "
        f"({sum(len(t) for _, t in seen.places):,} chars: {kinds['file']} process files, "
        f"{kinds['api']} API responses, {kinds['receipt']} steps with receipts, "
        f"{kinds['tool_message']} tool messages, {kinds['db']} database rows, "
        f"{kinds['trace']} exported spans): "
        f"0 occurrences outside the sink; the sink got every HTTP canary it should in each of "
        f"{len(deliveries)} requests"
    )


def test_secret_canaries_never_leak_from_a_cluster(postgres_url: str, tmp_path: Path) -> None:
    """Controller and executor as separate processes, Postgres; the controller logs at DEBUG."""
    started = time.monotonic()
    database_url = with_password(postgres_url, "x")
    secrets = Canaries.new(db_password=database_url is not None)
    if secrets.db_password is not None:
        database_url = with_password(postgres_url, secrets.db_password)
    seen = Seen()
    with Sink() as sink, OtlpReceiver() as otlp, ScriptedModels(MODEL_SCRIPT) as models:
        script_sink(sink, secrets)
        tools = tools_file(tmp_path, sink.url, free_port(), models.url)
        with cluster(tmp_path) as c:
            # Both processes export every span, to be searched too.
            c.env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
            # The controller: a canary admin key and DB password; no HTTP canary at all.
            c.env["AGENT_REACH_CONTROLLER_BOOTSTRAP_KEY"] = secrets.admin_key
            c.env["AGENT_REACH_API_KEY"] = secrets.admin_key
            c.env["AGENT_REACH_CONTROLLER_LOG_LEVEL"] = "DEBUG"
            pools = tmp_path / "canary-pools.json"
            pools.write_text(
                json.dumps(
                    {"tokens": [{"name": "canary", "sha256": token_hash(secrets.executor_token)}]}
                )
            )
            c.env["AGENT_REACH_CONTROLLER_EXECUTOR_TOKENS"] = str(pools)
            ctl = c.controller(
                "controller",
                database_url=database_url or postgres_url,
                tools=tools,
                extra=["--migrate"],
            )
            # The executor: the HTTP canaries, and neither the admin key nor the DB password.
            c.env = {
                k: v
                for k, v in c.env.items()
                if k not in ("AGENT_REACH_CONTROLLER_BOOTSTRAP_KEY", "AGENT_REACH_API_KEY")
            }
            c.env.update(secrets.executor_env())
            c.env["AGENT_REACH_EXECUTOR_TOKEN"] = secrets.executor_token
            c.executor("executor", controller=ctl, slots=8)
            run = exercise(ctl, secrets, seen)
            stop(c)  # every process flushes its logs and spans before they are read
        deliveries = sink.requests()
        spans = otlp.spans()
        assert_model_got_its_key(models, secrets)
    assert any(s.name.startswith("execute_tool") for s in spans), "no executor span arrived"
    for span in spans:
        seen.add(f"trace {span.service} {span.name}", json.dumps(asdict(span)))
    for table, row in postgres_rows(postgres_url):
        seen.add(f"db {table}", row)
    summary = check(run, secrets, seen, deliveries, tmp_path)
    print(f"cluster: {summary}; {time.monotonic() - started:.1f}s")


def test_secret_canaries_never_leak_from_reach_dev(tmp_path: Path) -> None:
    """Controller and executor in one process (`reach dev`, SQLite), everything at DEBUG: the
    executor's own debug logging is seen too."""
    started = time.monotonic()
    secrets = Canaries.new(db_password=False)  # SQLite: no password to give
    db = tmp_path / "dev.db"
    seen = Seen()
    env = {
        "AGENT_REACH_CONTROLLER_DATABASE_URL": f"sqlite:///{db}",
        "AGENT_REACH_CONTROLLER_BOOTSTRAP_KEY": secrets.admin_key,
        "AGENT_REACH_API_KEY": secrets.admin_key,
        "AGENT_REACH_CONTROLLER_LOG_LEVEL": "DEBUG",
        **secrets.executor_env(),
    }
    with Sink() as sink, ScriptedModels(MODEL_SCRIPT) as models:
        script_sink(sink, secrets)
        tools = tools_file(tmp_path, sink.url, free_port(), models.url)
        with cluster(tmp_path, env=env) as c:
            dev = c.dev("dev", tools=tools)
            run = exercise(dev, secrets, seen)
            stop(c)
        deliveries = sink.requests()
        assert_model_got_its_key(models, secrets)
    assert '"level": "debug"' in dev.output(), "the dev process should log at DEBUG"
    for table, row in sqlite_rows(db):
        seen.add(f"db {table}", row)
    summary = check(run, secrets, seen, deliveries, tmp_path)
    print(f"reach dev: {summary}; {time.monotonic() - started:.1f}s")


def assert_model_got_its_key(models: ScriptedModels, secrets: Canaries) -> None:
    """The model, and only it, got the model key (proof the canary was really used)."""
    assert len(models.headers_seen) == 3, models.requests
    for headers in models.headers_seen:
        assert headers.get("authorization") == f"Bearer {secrets.model_key}"


def stop(c: Cluster) -> None:
    for proc in c.procs:
        code = proc.terminate(timeout=20)
        assert code == 0, f"{proc.name} exited {code}:\n{proc.output()[-3000:]}"
