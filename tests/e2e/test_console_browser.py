"""The web console in a real browser: Debian's Chromium, driven by Playwright, against `reach dev`
started as a process. Sign in, follow a task live as its steps finish (through forced stream
drops), approve an edited dangerous step and see it run, reject one and read the model-facing
reason, another tenant's task is "not found", the approvals inbox on a phone, the CSP, axe-core,
and an XSS corpus that never runs. Screenshots go to tests/screenshots/ (git-ignored)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from tests.conftest import IN_CI
from tests.e2e.processes import Proc, all_terminal, api, cluster, wait_until
from tests.support.console_tools import XSS
from tests.support.otlp import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "tests" / "screenshots"
CHROMIUM = os.environ.get("AGENT_REACH_TEST_CHROMIUM", "/usr/bin/chromium")
# As the machine notes say: no sandbox as root, and no calls home (the network is closed).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HOSTILE = f"Refund a payment. {XSS[1]}"


def catalogue() -> list[dict[str, Any]]:
    python = "python"
    return [
        {
            "name": "work.gate",
            "description": "Waits until the test lets it through.",
            "connector": python,
            "config": {"function": "tests.support.console_tools:gate"},
            "input_schema": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}},
            },
            "idempotent": True,
            "timeout": 90,
        },
        {
            "name": "bank.refund",
            "description": HOSTILE,
            "connector": python,
            "risk": "dangerous",
            "config": {"function": "tests.support.console_tools:refund"},
            "input_schema": {
                "type": "object",
                "required": ["amount"],
                "properties": {
                    "amount": {"type": "integer", "minimum": 1, "maximum": 500},
                    "note": {"type": "string"},
                },
            },
        },
        {
            "name": "text.echo",
            "description": XSS[0] + XSS[3],
            "connector": python,
            "config": {"function": "tests.support.console_tools:echo"},
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
            "idempotent": True,
        },
    ]


@dataclass
class Stack:
    dev: Proc
    base: str
    admin: httpx.Client  # the bootstrap key: it submits, so it may not approve
    alice: str  # an admin's key, for signing in: she approves what the bootstrap key asked
    gates: Path
    otlp: OtlpReceiver  # every process's spans

    def spans(self, task_id: str, name: str, *, at_least: int = 1) -> list[ReceivedSpan]:
        """The spans called `name` in the task's trace, once there are `at_least` of them."""
        trace_id = self.task(task_id)["trace_id"]

        def found() -> list[ReceivedSpan] | None:
            spans = [s for s in self.otlp.spans() if s.trace_id == trace_id and s.name == name]
            return spans if len(spans) >= at_least else None

        spans: list[ReceivedSpan] = wait_until(found, within=30, what=f"{at_least} {name} span(s)")
        return spans

    def submit(self, plan: dict[str, Any], client: httpx.Client | None = None) -> str:
        answer = (client or self.admin).post("/v1/tasks", json=plan)
        assert answer.status_code == 202, answer.text
        task_id: str = answer.json()["task_id"]
        return task_id

    def task(self, task_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.admin.get(f"/v1/tasks/{task_id}").json()
        return found

    def wait_for_approval(self, task_id: str) -> None:
        wait_until(
            lambda: self.task(task_id)["steps"][0]["status"] == "awaiting_approval" or None,
            within=30,
            what=f"task {task_id}'s step to wait for approval",
        )

    def open_gate(self, name: str) -> None:
        (self.gates / name).write_text("open")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("console")
    tools = work / "tools.yaml"
    tools.write_text(json.dumps({"tools": catalogue()}))
    gates = work / "gates"
    gates.mkdir()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {
        "PYTHONPATH": path,
        "CONSOLE_GATES": str(gates),
        # Streams are cut often, so following a task is also resuming one.
        "AGENT_REACH_CONTROLLER_EVENT_STREAM_MAX_SECONDS": "1.5",
        "AGENT_REACH_CONTROLLER_JAEGER_URL": "http://jaeger.example.test/trace/{trace_id}",
    }
    with OtlpReceiver() as otlp, cluster(work, env=env) as c:
        c.env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        dev = c.dev("dev", tools=tools)
        with api(dev) as admin:
            made = admin.post("/v1/keys", json={"name": "alice", "roles": ["admin"]})
            assert made.status_code == 201, made.text
            yield Stack(
                dev=dev,
                base=f"http://{dev.info['http']}",
                admin=admin,
                alice=made.json()["token"],
                gates=gates,
                otlp=otlp,
            )


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing: `make tools` installs Debian's chromium"
        if IN_CI:
            pytest.fail(message + "; under CI=true this is a failure, not a skip")
        pytest.skip(message)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(chromium: Any, stack: Stack) -> Iterator[Any]:
    """A fresh browser context, signed in as alice through the sign-in form."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    # Any payload that runs sets this, or opens a dialog: both are recorded.
    context.add_init_script("window.__dialogs = 0;")
    tab = context.new_page()
    tab.on("dialog", lambda d: d.dismiss())
    sign_in(tab, stack)
    try:
        yield tab
    finally:
        context.close()


def sign_in(tab: Any, stack: Stack) -> None:
    tab.goto(f"{stack.base}/console")
    assert "/console/login" in tab.url
    tab.get_by_label("API key").fill(stack.alice)
    tab.get_by_role("button", name="Sign in").click()
    tab.wait_for_url(f"{stack.base}/console/tasks")


def shot(tab: Any, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def pwned(tab: Any) -> Any:
    return tab.evaluate("window.__pwned")


def refund_plan(amount: int, note: str) -> dict[str, Any]:
    return {
        "goal": "refund an order",
        "steps": [
            {"step_id": "refund", "tool": "bank.refund", "args": {"amount": amount, "note": note}}
        ],
    }


def test_sign_in_sets_a_session_and_the_csp(chromium: Any, stack: Stack) -> None:
    context = chromium.new_context()
    tab = context.new_page()
    try:
        answer = tab.goto(f"{stack.base}/console/login")
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp
        assert "'unsafe-inline'" not in csp
        tab.get_by_label("API key").fill("ark_000000000000_wrong")
        tab.get_by_role("button", name="Sign in").click()
        assert "not valid" in tab.get_by_role("alert").inner_text()
        sign_in(tab, stack)
        (cookie,) = [c for c in context.cookies() if c["name"] == "ar_console"]
        assert cookie["httpOnly"]
        assert cookie["sameSite"] == "Strict"
        assert tab.evaluate("document.cookie") == ""  # the page's script cannot read it
        shot(tab, "signed-in")
    finally:
        context.close()


def test_a_running_tasks_timeline_follows_its_steps_live(page: Any, stack: Stack) -> None:
    task_id = stack.submit(
        {
            "goal": "two steps, one after the other",
            "steps": [
                {"step_id": "first", "tool": "work.gate", "args": {"name": "g1"}},
                {
                    "step_id": "second",
                    "tool": "work.gate",
                    "args": {"name": "g2"},
                    "depends_on": ["first"],
                },
            ],
        }
    )
    page.goto(f"{stack.base}/console/tasks/{task_id}")
    first = page.locator('li[data-step="first"] .status')
    second = page.locator('li[data-step="second"] .status')
    expect(first).to_have_text("running", timeout=30_000)
    # Longer than a stream lives (1.5 s): the page must resume, and miss nothing.
    page.wait_for_timeout(2500)
    stack.open_gate("g1")
    expect(first).to_have_text("succeeded", timeout=30_000)
    assert second.inner_text() in ("ready", "running", "pending", "leased")
    page.wait_for_timeout(2000)
    stack.open_gate("g2")
    expect(page.locator("#task-status")).to_have_text("succeeded", timeout=30_000)
    assert first.inner_text() == "succeeded"
    expect(second).to_have_text("succeeded", timeout=30_000)
    # The live timeline holds every event of the log once, in order: nothing lost or doubled
    # across the stream's reconnects.
    shown = [int(x) for x in page.locator("#timeline tbody tr td:first-child").all_inner_texts()]
    logged = [e["id"] for e in stack.admin.get(f"/v1/tasks/{task_id}/events").json()["events"]]
    assert shown == logged
    assert page.get_by_role("link", name="open in Jaeger").get_attribute("href") == (
        f"http://jaeger.example.test/trace/{stack.task(task_id)['trace_id']}"
    )
    shot(page, "task")


def test_an_edited_dangerous_step_is_approved_and_runs(page: Any, stack: Stack) -> None:
    task_id = stack.submit(refund_plan(400, "customer asked twice"))
    stack.wait_for_approval(task_id)
    page.goto(f"{stack.base}/console/approvals")
    card = page.locator("li.approval", has=page.locator(f'a[href="/console/tasks/{task_id}"]'))
    assert "bank.refund" in card.inner_text()
    assert "bootstrap" in card.inner_text()  # who asked
    assert '"amount": 400' in card.locator("pre").first.inner_text()
    shot(page, "approvals")
    card.get_by_text("Edit the arguments before approving").click()
    editor = card.get_by_label("Arguments (JSON, checked against the tool's schema)")
    editor.fill('{"amount": 1200')  # not JSON: the page will not send it
    card.get_by_role("button", name="Approve").click()
    assert editor.evaluate("e => e.validity.valid") is False
    editor.fill('{"amount": 1200, "note": "capped"}')  # JSON, but over the schema's maximum
    card.get_by_role("button", name="Approve").click()
    page.wait_for_load_state()
    assert "/amount" in page.locator("main").inner_text()  # the API's pointer, shown
    page.goto(f"{stack.base}/console/approvals")
    card = page.locator("li.approval", has=page.locator(f'a[href="/console/tasks/{task_id}"]'))
    card.get_by_text("Edit the arguments before approving").click()
    card.get_by_label("Arguments (JSON, checked against the tool's schema)").fill(
        '{"amount": 120, "note": "partial refund"}'
    )
    card.get_by_label("Reason (the model reads it on a rejection)").fill("checked the order")
    card.get_by_role("button", name="Approve").click()
    page.wait_for_url("**/console/approvals?done=approved")
    assert page.get_by_role("status").first.inner_text() == "Approved."
    (task,) = wait_until(lambda: all_terminal(stack.admin, [task_id]), within=60, what="the refund")
    assert task["status"] == "succeeded", task
    assert task["steps"][0]["receipt"]["data"]["refunded"] == 120
    events = stack.admin.get(f"/v1/tasks/{task_id}/events").json()["events"]
    decided = [e for e in events if (e.get("data") or {}).get("by") == "alice"]
    assert decided, events
    page.goto(f"{stack.base}/console/tasks/{task_id}")
    assert "alice" in page.locator("#timeline").inner_text()
    # Two decisions were sent: the edit over the schema's maximum (refused: an error span) and
    # the one that ran.
    spans = stack.spans(task_id, "decide_step", at_least=2)
    refused, (decided_span,) = (
        [s for s in spans if s.status_code == 2],
        [s for s in spans if s.status_code != 2],
    )
    assert len(refused) == 1
    assert decided_span.attributes["agent_reach.principal"] == "alice"
    assert decided_span.attributes["agent_reach.decision"] == "approve"
    assert decided_span.attributes["agent_reach.edited"] is True


def test_a_cancel_and_a_rerun_from_the_console_land_in_the_tasks_trace(
    page: Any, stack: Stack
) -> None:
    task_id = stack.submit(
        {"steps": [{"step_id": "wait", "tool": "work.gate", "args": {"name": "never"}}]}
    )
    page.goto(f"{stack.base}/console/tasks/{task_id}")
    expect(page.locator('li[data-step="wait"] .status')).to_have_text("running", timeout=30_000)
    page.get_by_role("button", name="Cancel task").click()
    page.wait_for_url(f"**/console/tasks/{task_id}?done=cancelled")
    expect(page.locator("#task-status")).to_have_text("cancelled", timeout=30_000)
    (cancel,) = stack.spans(task_id, "cancel_task")
    assert cancel.attributes["agent_reach.principal"] == "alice"
    page.get_by_role("button", name="Run again (new task, same trace)").click()
    page.wait_for_url("**/console/tasks/*")
    again = page.url.rsplit("/", 1)[1]
    assert again != task_id
    rerun = stack.task(again)
    assert rerun["trace_id"] == stack.task(task_id)["trace_id"]
    listed = stack.admin.get("/v1/tasks", params={"principal": "alice"}).json()["tasks"]
    assert again in [t["task_id"] for t in listed]  # submitted as the signed-in person
    # The first submit's span and the rerun's share the trace: wait for both, not the first.
    submits = stack.spans(task_id, "submit_task", at_least=2)
    assert any(s.attributes.get("agent_reach.rerun_of") == task_id for s in submits)
    stack.admin.post(f"/v1/tasks/{again}/cancel")


def test_a_rejection_reaches_the_model_with_its_reason(page: Any, stack: Stack) -> None:
    task_id = stack.submit(refund_plan(50, "no receipt"))
    stack.wait_for_approval(task_id)
    page.goto(f"{stack.base}/console/approvals")
    card = page.locator("li.approval", has=page.locator(f'a[href="/console/tasks/{task_id}"]'))
    card.get_by_label("Reason (the model reads it on a rejection)").fill(
        "No receipt was attached; ask the customer for one"
    )
    card.get_by_role("button", name="Reject").click()
    page.wait_for_url("**/console/approvals?done=rejected")
    (task,) = wait_until(lambda: all_terminal(stack.admin, [task_id]), within=30, what="the task")
    receipt = json.dumps(task["steps"][0]["receipt"])
    assert "No receipt was attached" in receipt
    page.goto(f"{stack.base}/console/tasks/{task_id}")
    page.get_by_text("Arguments, receipt and output of refund").click()
    assert "No receipt was attached" in page.locator("pre.receipt").inner_text()


def test_another_tenants_task_is_not_found(page: Any, stack: Stack) -> None:
    made = stack.admin.post(
        "/v1/keys", json={"name": "mallory", "tenant": "acme", "roles": ["admin"]}
    )
    with httpx.Client(
        base_url=stack.base, headers={"Authorization": f"Bearer {made.json()['token']}"}
    ) as theirs:
        task_id = stack.submit(
            {"steps": [{"step_id": "a", "tool": "text.echo", "args": {"text": "theirs"}}]}, theirs
        )
    answer = page.goto(f"{stack.base}/console/tasks/{task_id}")
    assert answer.status == 404
    assert page.get_by_role("heading", level=1).inner_text() == "Not found"
    assert "theirs" not in page.content()


def test_the_approvals_inbox_fits_a_phone(chromium: Any, stack: Stack) -> None:
    task_id = stack.submit(refund_plan(75, "a long note " * 20))
    stack.wait_for_approval(task_id)
    context = chromium.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
    )
    tab = context.new_page()
    try:
        sign_in(tab, stack)
        tab.goto(f"{stack.base}/console/approvals")
        assert tab.locator("li.approval").count() >= 1
        width = tab.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the inbox scrolls sideways on a phone ({width} px wide)"
        shot(tab, "approvals-phone")
    finally:
        context.close()


def test_no_serious_accessibility_findings(page: Any, stack: Stack) -> None:
    from axe_playwright_python.sync_playwright import Axe

    task_id = stack.submit(
        {"steps": [{"step_id": "a", "tool": "text.echo", "args": {"text": "hello"}}]}
    )
    wait_until(lambda: all_terminal(stack.admin, [task_id]), within=30, what="the task")
    axe = Axe()
    found: dict[str, list[str]] = {}
    for name, path in (
        ("tasks", "/console/tasks"),
        ("task-done", f"/console/tasks/{task_id}"),
        ("approvals-inbox", "/console/approvals"),
        ("tools", "/console/tools"),
        ("tool", "/console/tools/bank.refund"),
        ("executors", "/console/executors"),
    ):
        page.goto(f"{stack.base}{path}")
        results = axe.run(page)
        bad = [
            f"{v['id']} ({v['impact']}): {v['help']}"
            for v in results.response["violations"]
            if v["impact"] in ("serious", "critical")
        ]
        if bad:
            found[path] = bad
        shot(page, name)
    assert not found, json.dumps(found, indent=2)


def test_an_xss_corpus_never_runs(page: Any, stack: Stack) -> None:
    echoed = stack.submit(
        {
            "goal": XSS[0],
            "steps": [
                {"step_id": f"s{i}", "tool": "text.echo", "args": {"text": payload}}
                for i, payload in enumerate(XSS)
            ],
        }
    )
    waiting = stack.submit(refund_plan(10, "".join(XSS)))
    wait_until(lambda: all_terminal(stack.admin, [echoed]), within=60, what="the echoes")
    stack.wait_for_approval(waiting)
    for path in (
        "/console/tasks",
        f"/console/tasks/{echoed}",
        f"/console/tasks/{echoed}/steps",
        f"/console/tasks/{waiting}",
        "/console/approvals",
        "/console/tools",
        "/console/tools/text.echo",
        "/console/tools/bank.refund",
    ):
        page.goto(f"{stack.base}{path}")
        for details in page.locator("details").all():
            details.evaluate("d => d.open = true")
        page.wait_for_timeout(100)
        assert pwned(page) is None, path
    # The payloads are on the page, as text.
    page.goto(f"{stack.base}/console/tasks/{echoed}")
    page.get_by_text("Arguments, receipt and output of s0").click()
    assert XSS[0] in page.locator('li[data-step="s0"]').inner_text()
    assert pwned(page) is None
