"""Secret canaries for the connectors that reach the real world: an SMTP password (notify's
email channel), a database password in the sql connector's URL, and an MCP server's bearer token.

`reach dev` (SQLite, everything logged at DEBUG) gets the canaries through its environment only,
referenced as `${env:…}` by the tools. Each connector is driven to success and to failure (a mail
server that refuses mail, a broken statement, a server that answers an error, a closed port).
Then every canary, in every spelling, is looked for in every API answer, every database row and
every file the process wrote: it may be nowhere. The downstreams must have received it (the SMTP
server's logins, the MCP server's `whoami`), which proves the canaries were really used.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.processes import all_terminal, cluster, wait_until
from tests.e2e.test_secret_canaries import spellings, sqlite_rows, stop, with_password
from tests.support.mcp_server import McpServer
from tests.support.server import free_port
from tests.support.smtp import SmtpServer

pytestmark = pytest.mark.e2e


def canary(kind: str) -> str:
    return f"canary-{kind}-{uuid.uuid4().hex[:12]}"


def tools(smtp_port: int, closed: int, mcp_url: str) -> list[dict[str, Any]]:
    def notify(name: str, port: int) -> dict[str, Any]:
        return {
            "name": name,
            "description": "Mail someone.",
            "connector": "notify",
            "risk": "write",
            "fan_out": {"over": "targets", "as": "target"},
            "config": {
                "smtp": {
                    "host": "127.0.0.1",
                    "port": port,
                    "starttls": False,
                    "from": "reach@example.org",
                    "username": "agent",
                    "password": "${env:CANARY_SMTP_PASSWORD}",
                },
                "allow_hosts": ["127.0.0.1"],
                "destinations": ["@example.org"],
            },
            "input_schema": {"type": "object", "properties": {"targets": {"type": "array"}}},
            "retry": {"maximum_attempts": 1},
        }

    def sql(name: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "description": "Ask the database.",
            "connector": "sql",
            "config": {
                "url": "${env:CANARY_SQL_URL}",
                "query": query,
                "allow_hosts": ["127.0.0.1"],
            },
            "retry": {"maximum_attempts": 1},
        }

    def mcp(name: str, tool: str) -> dict[str, Any]:
        return {
            "name": name,
            "description": "Ask the MCP server.",
            "connector": "mcp",
            "config": {
                "url": mcp_url,
                "tool": tool,
                "headers": {"Authorization": "Bearer ${env:CANARY_MCP_TOKEN}"},
                "allow_hosts": ["127.0.0.1"],
            },
            "retry": {"maximum_attempts": 1},
        }

    return [
        notify("mail.ok", smtp_port),
        notify("mail.closed", closed),
        sql("db.ok", "SELECT current_user AS who, 1 AS one"),
        sql("db.broken", "SELECT * FROM no_such_table"),
        mcp("remote.whoami", "whoami"),
        mcp("remote.fail", "fail"),
    ]


ADA, FULL = "ada@example.org", "full@example.org"
STEPS = [
    ("mail_ok", "mail.ok", {"message": "hi", "targets": [{"channel": "email", "to": ADA}]}),
    ("mail_refused", "mail.ok", {"message": "hi", "targets": [{"channel": "email", "to": FULL}]}),
    ("mail_closed", "mail.closed", {"message": "hi", "targets": [{"channel": "email", "to": ADA}]}),
    ("db_ok", "db.ok", {}),
    ("db_broken", "db.broken", {}),
    ("mcp_ok", "remote.whoami", {}),
    ("mcp_fail", "remote.fail", {}),
]


def test_connector_credentials_never_leak(postgres_url: str, tmp_path: Path) -> None:
    secrets = {
        "smtp": canary("smtp"),
        "sql": canary("sqlpass"),
        "mcp": canary("mcptoken"),
        "admin": canary("admin"),
    }
    sql_url = with_password(postgres_url, secrets["sql"])
    assert sql_url is not None, postgres_url  # trust auth ignores the password: it still connects
    seen: list[tuple[str, str]] = []
    with (
        SmtpServer(password=secrets["smtp"]) as smtp,
        McpServer(token=secrets["mcp"]) as remote,
    ):
        smtp.refused["full@example.org"] = "552 5.2.2 mailbox full"
        tools_file = tmp_path / "tools.yaml"
        tools_file.write_text(yaml.safe_dump({"tools": tools(smtp.port, free_port(), remote.url)}))
        env = {
            "AGENT_REACH_CONTROLLER_DATABASE_URL": f"sqlite:///{tmp_path / 'dev.db'}",
            "AGENT_REACH_CONTROLLER_BOOTSTRAP_KEY": secrets["admin"],
            "AGENT_REACH_API_KEY": secrets["admin"],
            "AGENT_REACH_CONTROLLER_LOG_LEVEL": "DEBUG",
            "CANARY_SMTP_PASSWORD": secrets["smtp"],
            "CANARY_SQL_URL": sql_url,
            "CANARY_MCP_TOKEN": secrets["mcp"],
        }
        with cluster(tmp_path, env=env) as c:
            dev = c.dev("dev", tools=tools_file)
            auth = {"Authorization": f"Bearer {secrets['admin']}"}
            with httpx.Client(base_url=f"http://{dev.info['http']}", headers=auth) as client:

                def look(label: str, response: httpx.Response) -> httpx.Response:
                    seen.append((label, response.text))
                    return response

                steps = [{"step_id": s, "tool": t, "args": a} for s, t, a in STEPS]
                answer = look("submit", client.post("/v1/tasks", json={"steps": steps}))
                assert answer.status_code == 202, answer.text
                task_id = answer.json()["task_id"]
                [task] = wait_until(
                    lambda: all_terminal(client, [task_id]), within=60, what="the task"
                )
                look("task", client.get(f"/v1/tasks/{task_id}"))
                for path in ("events", "replay", "trace"):
                    look(path, client.get(f"/v1/tasks/{task_id}/{path}"))
                for step in task["steps"]:
                    output = client.get(f"/v1/tasks/{task_id}/steps/{step['step_id']}/output")
                    look(f"output {step['step_id']}", output)
                for fmt in ("native", "openai_chat", "mcp"):
                    look(f"tools {fmt}", client.get("/v1/tools", params={"format": fmt}))
            stop(c)
    statuses = {s["step_id"]: s["status"] for s in task["steps"] if "[" not in s["step_id"]}
    assert statuses == {
        "mail_ok": "succeeded",
        "mail_refused": "failed",
        "mail_closed": "failed",
        "db_ok": "succeeded",
        "db_broken": "failed",
        "mcp_ok": "succeeded",
        "mcp_fail": "failed",
    }, json.dumps(task)[:3000]
    for path in sorted(tmp_path.rglob("*")):
        if path.is_file() and path.suffix != ".db":
            seen.append((f"file {path.name}", path.read_text(errors="replace")))
    for table, row in sqlite_rows(tmp_path / "dev.db"):
        seen.append((f"db {table}", row))
    leaks = [
        f"{name} ({form!r}) in {label}"
        for label, text in seen
        for name, value in secrets.items()
        for form in spellings(value)
        if form.lower() in text.lower()
    ]
    assert not leaks, "secret canaries leaked:\n" + "\n".join(leaks[:50])
    # The downstreams got them: the mail server the password, the MCP server the token.
    assert ("agent", secrets["smtp"]) in smtp.logins
    assert any(call.name == "whoami" for call in remote.calls)
    assert remote.requests > 0
