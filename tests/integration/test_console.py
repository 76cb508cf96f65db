"""The web console over real storage: sign-in and its cookie, CSRF on every action, the session
ending with its key, the trusted proxy, tenants, and escaping of everything a tool or model wrote.
Its browser behaviour is in tests/e2e/test_console_browser.py."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import yaml

from agent_reach_controller.api.app import create_app
from agent_reach_controller.runtime import Components
from agent_reach_controller.storage import identity as storage
from agent_reach_controller.storage.schema import audit_log
from tests.integration.stack import TOOLS, components_for, ok, write_tools

XSS = [
    "<script>window.__pwned=1</script>",
    '"><img src=x onerror="window.__pwned=1">',
    "javascript:window.__pwned=1",
    "</textarea><svg onload=window.__pwned=1>",
    "{{7*7}}<b>bold</b>",
]
DANGEROUS = {
    "name": "bank.refund",
    "description": "Refund a payment. <img src=x onerror=window.__pwned=1>",
    "connector": "echo",
    "risk": "dangerous",
    "input_schema": {
        "type": "object",
        "required": ["amount"],
        "properties": {"amount": {"type": "integer", "maximum": 500}, "note": {"type": "string"}},
    },
    "retry": {"maximum_attempts": 1},
}


def browser(c: Components, *, peer: str = "127.0.0.1", **headers: str) -> httpx.AsyncClient:
    """A client that keeps cookies, like a browser, and sends no API key."""
    transport = httpx.ASGITransport(app=create_app(c), client=(peer, 5555))
    return httpx.AsyncClient(
        transport=transport, base_url="http://reach.test", headers=headers, follow_redirects=False
    )


@asynccontextmanager
async def signed_in(
    c: Components,
    *,
    roles: tuple[str, ...] = ("admin",),
    tenant: str = "default",
    name: str = "ann",
) -> AsyncIterator[tuple[httpx.AsyncClient, str, str]]:
    """A browser signed in with a new key: (the browser, its CSRF token, the key)."""
    _, token = await c.keys.create(name=name, tenant=tenant, roles=list(roles), created_by="t")
    async with browser(c) as web:
        answer = await web.post("/console/login", data={"api_key": token, "next": "/console/tasks"})
        assert answer.status_code == 303, answer.text
        page = await web.get("/console/tasks")
        assert page.status_code == 200, page.text
        yield web, csrf_of(page.text), token


def csrf_of(html: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([0-9a-f]{32})">', html)
    assert found, "the page carries no CSRF token"
    return found.group(1)


@asynccontextmanager
async def console_stack(
    database_url: str, tmp_path: Path, **settings: Any
) -> AsyncIterator[Components]:
    tools = write_tools(tmp_path, [*TOOLS, DANGEROUS])
    async with components_for(database_url, tools, **settings) as c:
        yield c


async def test_a_key_signs_in_to_a_short_lived_strict_httponly_session(
    database_url: str, tmp_path: Path
) -> None:
    async with console_stack(database_url, tmp_path, console_session_seconds=600) as c:
        async with browser(c) as web:
            first = await web.get("/console/tasks")
            assert first.status_code == 303
            # An action's form is not a page to come back to after signing in.
            posted = await web.post("/console/tasks/x/cancel")
            assert posted.headers["location"] == "/console/login?next=/console/tasks"
            assert first.headers["location"].startswith("/console/login?next=/console/tasks")
            _, token = await c.keys.create(
                name="ann", tenant="default", roles=["admin"], created_by="t"
            )
            wrong = await web.post("/console/login", data={"api_key": "ark_nope"})
            assert wrong.status_code == 401
            assert "not valid" in wrong.text
            answer = await web.post(
                "/console/login", data={"api_key": token, "next": "//evil.test/x"}
            )
            assert answer.status_code == 303
            assert answer.headers["location"] == "/console/tasks"  # no open redirect
            cookie = answer.headers["set-cookie"]
            assert "ar_console=ars_" in cookie
            assert "HttpOnly" in cookie
            assert "SameSite=strict" in cookie
            max_age = int(re.search(r"Max-Age=(\d+)", cookie).group(1))  # type: ignore[union-attr]
            assert 590 <= max_age <= 600
            assert "Secure" not in cookie  # plain http and 'auto'
            assert token not in cookie
            page = await web.get("/console/tasks")
            assert page.status_code == 200
            assert "ann" in page.text
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp
            assert "unsafe-inline" not in csp
            assert "frame-ancestors 'none'" in csp
            assert page.headers["cache-control"] == "no-store"
            assert "<script>" not in page.text
            assert "style=" not in page.text
        # The table holds only a hash of the cookie's secret.
        async with c.db.transaction() as conn:
            secret = cookie.split("ar_console=", 1)[1].split(";", 1)[0]
            row = await storage.load_console_session(conn, secret)
            assert row is None
            hashed = await storage.load_console_session(conn, _sha(secret))
            assert hashed is not None
            assert hashed.principal == "ann"
            assert hashed.expires_at <= datetime.now(UTC) + timedelta(seconds=601)


async def audit_entries(c: Components) -> set[tuple[str, str, str]]:
    async with c.db.transaction() as conn:
        rows = await conn.execute(
            sa.select(audit_log.c.actor, audit_log.c.action, audit_log.c.target)
        )
        return {(r.actor, r.action, r.target) for r in rows}


def _sha(value: str) -> str:
    import hashlib

    return hashlib.sha256(value.encode()).hexdigest()


async def test_the_secure_flag_is_configurable_for_tls_ending_at_an_ingress(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with console_stack(sqlite_url, tmp_path, console_secure_cookie="always") as c:
        _, token = await c.keys.create(
            name="ann", tenant="default", roles=["admin"], created_by="t"
        )
        async with browser(c) as web:
            answer = await web.post("/console/login", data={"api_key": token})
            assert "Secure" in answer.headers["set-cookie"]


async def test_every_action_needs_the_session_csrf_token(database_url: str, tmp_path: Path) -> None:
    async with console_stack(database_url, tmp_path) as c, signed_in(c) as (web, csrf, _):
        submitted = await web.post(
            "/v1/tasks",
            json={"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "x"}}]},
        )
        assert submitted.status_code == 403
        assert submitted.json()["code"] == "csrf_failed"
        submitted = await web.post(
            "/v1/tasks",
            json={"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "x"}}]},
            headers={"X-CSRF-Token": "0" * 32},
        )
        assert submitted.status_code == 403
        submitted = await web.post(
            "/v1/tasks",
            json={"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "x"}}]},
            headers={"X-CSRF-Token": csrf},
        )
        assert submitted.status_code == 202, submitted.text
        task_id = submitted.json()["task_id"]
        # A form without the token changes nothing.
        refused = await web.post(f"/console/tasks/{task_id}/cancel", data={})
        assert refused.status_code == 403
        assert "csrf_failed" in refused.text
        assert (await web.get(f"/v1/tasks/{task_id}")).json()["status"] != "cancelled"
        done = await web.post(f"/console/tasks/{task_id}/cancel", data={"csrf": csrf})
        assert done.status_code == 303
        assert (await web.get(f"/v1/tasks/{task_id}")).json()["status"] == "cancelled"
        # Reads need no token.
        assert (await web.get(f"/v1/tasks/{task_id}/events")).status_code == 200
        # The cancel is the signed-in person's, in the event log and the audit log.
        events = (await web.get(f"/v1/tasks/{task_id}/events")).json()["events"]
        assert "cancelled by ann" in json.dumps(events)
        trace = (await web.get(f"/v1/tasks/{task_id}/trace")).json()
        assert "cancelled by ann" in json.dumps(trace)
        assert ("ann", "task.cancel", f"task:{task_id}") in await audit_entries(c)


async def test_a_session_ends_with_its_key_and_on_sign_out(
    database_url: str, tmp_path: Path
) -> None:
    async with console_stack(database_url, tmp_path) as c:
        async with signed_in(c) as (web, csrf, token):
            key_id = token.split("_")[1]
            assert await c.keys.revoke(key_id)
            gone = await web.get("/console/tasks")
            assert gone.status_code == 303
            assert "/console/login" in gone.headers["location"]
            assert (await web.get("/v1/tasks")).status_code == 401
        async with signed_in(c, name="bob") as (web, csrf, _):
            out = await web.post("/console/logout", data={"csrf": csrf})
            assert out.status_code == 303
            assert (await web.get("/v1/tasks")).status_code == 401


async def test_another_tenants_task_is_not_found(database_url: str, tmp_path: Path) -> None:
    async with console_stack(database_url, tmp_path) as c:
        async with signed_in(c, tenant="acme", name="eve") as (theirs, csrf, _):
            made = await theirs.post(
                "/v1/tasks",
                json={"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "x"}}]},
                headers={"X-CSRF-Token": csrf},
            )
            task_id = made.json()["task_id"]
            assert (await theirs.get(f"/console/tasks/{task_id}")).status_code == 200
        async with signed_in(c, tenant="default", name="ann") as (mine, csrf, _):
            page = await mine.get(f"/console/tasks/{task_id}")
            assert page.status_code == 404
            assert "Not found" in page.text
            cancel = await mine.post(f"/console/tasks/{task_id}/cancel", data={"csrf": csrf})
            assert cancel.status_code == 404


async def test_a_trusted_proxy_signs_people_in_by_its_header(
    sqlite_url: str, tmp_path: Path
) -> None:
    users = tmp_path / "users.yaml"
    users.write_text(
        yaml.safe_dump(
            {"users": {"carol@example.test": {"tenant": "default", "roles": ["viewer"]}}}
        )
    )
    async with console_stack(
        sqlite_url,
        tmp_path,
        console_proxy_header="X-Forwarded-User",
        console_proxy_users=users,
        console_proxy_trusted=["10.0.0.0/8"],
    ) as c:
        header = {"X-Forwarded-User": "carol@example.test"}
        # From the proxy's address: signed in, as the mapped principal.
        async with browser(c, peer="10.1.2.3", **header) as web:
            page = await web.get("/console/tasks")
            assert page.status_code == 200
            assert "carol@example.test" in page.text
            assert "ar_console=ars_" in page.headers["set-cookie"]
            assert (await web.get("/v1/tasks")).status_code == 200
            # The proxy stops naming her: the session is over.
            del web.headers["X-Forwarded-User"]
            assert (await web.get("/v1/tasks")).status_code == 401
        # The same header from anywhere else is ignored.
        async with browser(c, peer="192.0.2.7", **header) as web:
            assert (await web.get("/console/tasks")).status_code == 303
        # A user the file does not map is not signed in.
        async with browser(c, peer="10.1.2.3", **{"X-Forwarded-User": "mallory"}) as web:
            assert (await web.get("/console/tasks")).status_code == 303


async def test_hostile_text_from_tools_and_models_is_escaped_everywhere(
    database_url: str, tmp_path: Path
) -> None:
    async with console_stack(database_url, tmp_path) as c, signed_in(c) as (web, csrf, _):
        steps = [
            {"step_id": f"s{i}", "tool": "echo.say", "args": {"text": payload}}
            for i, payload in enumerate(XSS)
        ]
        made = await web.post(
            "/v1/tasks", json={"goal": XSS[0], "steps": steps}, headers={"X-CSRF-Token": csrf}
        )
        assert made.status_code == 202, made.text
        task_id = made.json()["task_id"]
        claimed = await c.leasing.poll(executor_id="t", connectors=["echo"], limit=10, wait=2)
        await c.reporting.report(executor_id="t", results=[ok(s, {"said": XSS}) for s in claimed])
        pages = [
            await web.get(f"/console/tasks/{task_id}"),
            await web.get(f"/console/tasks/{task_id}/steps"),
            await web.get("/console/tasks"),
            await web.get("/console/tools"),
            await web.get("/console/tools/bank.refund"),
        ]
        for page in pages:
            assert page.status_code == 200, page.text
            for payload in XSS:
                if any(ch in payload for ch in '<>"'):
                    assert payload not in page.text, (page.url, payload)
            assert re.search(r"<(script|img|svg)[^>]*(onerror|onload|>window)", page.text) is None


async def test_a_form_is_small_and_urlencoded_or_it_does_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with console_stack(sqlite_url, tmp_path) as c, signed_in(c) as (web, csrf, _):
        made = await web.post(
            "/v1/tasks",
            json={"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "x"}}]},
            headers={"X-CSRF-Token": csrf},
        )
        task_id = made.json()["task_id"]
        cancel = f"/console/tasks/{task_id}/cancel"
        huge = await web.post(cancel, data={"csrf": csrf, "pad": "x" * 300_000})
        assert huge.status_code == 413
        multipart = await web.post(cancel, files={"csrf": (None, csrf)})
        assert multipart.status_code == 403
        assert "csrf_failed" in multipart.text
        many = await web.post(cancel, data={"csrf": csrf, **{f"f{i}": "1" for i in range(20)}})
        assert many.status_code == 403
        not_utf8 = await web.post(
            cancel,
            content=b"csrf=" + csrf.encode() + b"&x=%ff\xff",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert not_utf8.status_code == 403
        assert (await web.get(f"/v1/tasks/{task_id}")).json()["status"] != "cancelled"


BAD_QUERIES: list[tuple[str, dict[str, str] | httpx.QueryParams, str, str]] = [
    # (page, query, the parameter named, words of what is wrong)
    ("/console/tasks", {"status": "x" * 300}, "status", "must be one of: pending, running"),
    ("/console/tasks", {"status": "lost"}, "status", "must be one of"),
    ("/console/tasks", {"before": "yesterday"}, "before", "is not a task id"),
    ("/console/tasks", {"before": "0193A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B"}, "before", "task id"),
    ("/console/tasks", {"since": "last tuesday"}, "since", "is not a time"),
    ("/console/tasks", {"since": "1764921600"}, "since", "is not a time"),
    ("/console/tasks", {"until": "2026-02-30T08:00"}, "until", "date and time that exists"),
    ("/console/tasks", {"until": "2026-12-05T08:00:00.5"}, "until", "is not a time"),
    (
        "/console/tasks",
        {"since": "2026-12-05T09:00", "until": "2026-12-05T08:00:00Z"},
        "until",
        "must be later than since",
    ),
    ("/console/tasks", {"tool": "no such tool!"}, "tool", "is not a tool name"),
    ("/console/tasks", {"tool": "a" * 129}, "tool", "is not a tool name"),
    ("/console/tasks", {"principal": "p" * 129}, "principal", "129 characters long"),
    ("/console/tasks", {"stauts": "failed"}, "stauts", "not a parameter of this page"),
    (
        "/console/tasks",
        httpx.QueryParams([("status", "failed"), ("status", "running")]),
        "status",
        "given 2 times",
    ),
    ("/console/tasks/{task}", {"done": "hacked"}, "done", "must be one of: cancelled"),
    ("/console/tasks/{task}", {"status": "failed"}, "status", "not a parameter"),
    ("/console/tasks/{task}/steps", {"done": "cancelled"}, "done", "it reads none"),
    ("/console/approvals", {"done": "x" * 300}, "done", "must be one of"),
    ("/console/approvals", {"limit": "0"}, "limit", "not a parameter"),
    ("/console/tools", {"done": "<b>enabled</b>"}, "done", "must be one of"),
    ("/console/tools/echo.say", {"done": "nope"}, "done", "must be one of"),
    ("/console/executors", {"page": "2"}, "page", "it reads none"),
]


def assert_bad_query_page(answer: httpx.Response, name: str, words: str) -> None:
    """The console's own page (its CSP and all), 400, naming the parameter and the fault."""
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"].startswith("text/html"), answer.headers
    assert answer.headers["content-security-policy"].startswith("default-src 'none'")
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["cache-control"] == "no-store"
    assert "<!doctype html>" in answer.text
    assert f"<li><code>{name}</code> " in answer.text, answer.text
    assert words in answer.text, answer.text


async def test_a_bad_query_parameter_is_a_console_page_naming_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with console_stack(sqlite_url, tmp_path) as c, signed_in(c) as (web, csrf, _):
        made = await web.post(
            "/v1/tasks",
            json={"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "x"}}]},
            headers={"X-CSRF-Token": csrf},
        )
        task = made.json()["task_id"]
        for path, params, name, words in BAD_QUERIES:
            answer = await web.get(path.format(task=task), params=params)
            assert_bad_query_page(answer, name, words)
            assert "ann" in answer.text  # the page of someone signed in, with the console's bar
        # Every fault at once, each named; a made-up name is shown escaped and cut short.
        many = await web.get(
            "/console/tasks",
            params={"status": "lost", "before": "x", "<script>" + "y" * 100: "1"},
        )
        assert_bad_query_page(many, "status", "3 query parameters are wrong")
        assert "<li><code>before</code> " in many.text
        assert "<script>" not in many.text
        assert "&lt;script&gt;" + "y" * 55 + "…</code>" in many.text
        # Good values, and the form's empty "any", still list tasks.
        good = [
            {"status": "", "tool": "", "principal": "", "since": "", "until": ""},
            {"status": "pending", "tool": "echo.say", "principal": "ann"},
            {"since": "2000-01-01T00:00", "until": "2100-01-01T00:00:00"},
            {"since": "2000-01-01T08:00:00+08:00", "until": "2100-01-01t00:00:00.5z"},
            {"before": "ffffffff-ffff-7fff-bfff-ffffffffffff"},
        ]
        for params in good:
            listed = await web.get("/console/tasks", params=params)
            assert listed.status_code == 200, (params, listed.text)
            assert f"/console/tasks/{task}" in listed.text, params
        # A `before` is read: the list starts after it (it was ignored when malformed too).
        after = await web.get("/console/tasks", params={"before": task})
        assert after.status_code == 200
        assert f"/console/tasks/{task}" not in after.text
        for path in ("/console/approvals", "/console/tools", f"/console/tasks/{task}"):
            shown = await web.get(path, params={"done": "approved"})
            assert shown.status_code == 200
            assert "Approved." in shown.text


async def test_the_sign_in_page_names_a_bad_next_and_sign_in_comes_first(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with console_stack(sqlite_url, tmp_path) as c, browser(c) as web:
        for bad in ("https://evil.test/x", "//evil.test/x", "/v1/tasks"):
            answer = await web.get("/console/login", params={"next": bad})
            assert_bad_query_page(answer, "next", "is not a page of this console")
        answer = await web.get("/console/login", params={"next": "/console", "x": "1"})
        assert_bad_query_page(answer, "x", "it reads next")
        answer = await web.get("/console", params=[("x", "1"), ("x", "2")])
        assert_bad_query_page(answer, "x", "it reads none")
        fine = await web.get("/console/login", params={"next": "/console/tasks?status=failed"})
        assert fine.status_code == 200
        assert 'value="/console/tasks?status=failed"' in fine.text
        # Someone not signed in is sent to sign in first, the page's query kept; the page then
        # names what is wrong with it.
        first = await web.get("/console/tasks", params={"status": "lost"})
        assert first.status_code == 303
        assert first.headers["location"] == "/console/login?next=/console/tasks%3Fstatus%3Dlost"
        sign_in = await web.get(first.headers["location"])
        assert sign_in.status_code == 200
        _, token = await c.keys.create(
            name="ann", tenant="default", roles=["admin"], created_by="t"
        )
        back = await web.post(
            "/console/login", data={"api_key": token, "next": "/console/tasks?status=lost"}
        )
        assert back.status_code == 303
        assert_bad_query_page(await web.get(back.headers["location"]), "status", "must be one of")
