"""The console's run pages in a real browser (Debian's Chromium, Playwright, axe-core) against
`reach dev` whose executor calls a scripted model: a finished run's conversation with each tool
result in place, a run approved from its page that then ends live, the list of runs, the links
between a run and its rounds' tasks, and a hostile model whose words never run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from playwright.sync_api import expect

from tests.e2e.agent_stack import KEY, KEY_VARIABLE, TOOLS, profile
from tests.e2e.processes import Proc, api, cluster, wait_until
from tests.e2e.test_console_browser import chromium, pwned, shot, sign_in
from tests.support.console_tools import XSS
from tests.support.models import ScriptedModels, answer, call_tools

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
__all__ = ["chromium"]  # the browser fixture, shared with the task pages' tests

# A model reply that tries everything: markup, a script, a javascript: link in Markdown and bare.
HOSTILE_ANSWER = f"Done. {XSS[0]} [details](javascript:window.__pwned=1) {XSS[6]} {XSS[1]} {XSS[9]}"


@dataclass
class Stack:
    dev: Proc
    base: str
    admin: httpx.Client  # the bootstrap key: it starts runs, so it may not approve their steps
    alice: str  # an admin's key, for signing in: she approves what the bootstrap key's run asked

    def put_agent(self, name: str, models: ScriptedModels, **more: Any) -> None:
        answer_ = self.admin.put(f"/v1/agents/{name}", json=profile(models, **more))
        assert answer_.status_code in (200, 201), answer_.text

    def start(self, agent: str, text: str, *, wait: float = 0) -> dict[str, Any]:
        started = self.admin.post(f"/v1/runs?wait={wait}", json={"agent": agent, "input": text})
        assert started.status_code in (200, 202), started.text
        return dict(started.json())

    def run(self, run_id: str) -> dict[str, Any]:
        got = self.admin.get(f"/v1/runs/{run_id}")
        assert got.status_code == 200, got.text
        return dict(got.json())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("console-runs")
    tools = work / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": TOOLS}))
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {
        "PYTHONPATH": path,
        KEY_VARIABLE: KEY,
        # Streams are cut often, so following a run is also resuming one.
        "AGENT_REACH_CONTROLLER_EVENT_STREAM_MAX_SECONDS": "1.5",
    }
    with cluster(work, env=env) as c:
        dev = c.dev("dev", tools=tools)
        with api(dev) as admin:
            made = admin.post("/v1/keys", json={"name": "alice", "roles": ["admin"]})
            assert made.status_code == 201, made.text
            yield Stack(
                dev=dev,
                base=f"http://{dev.info['http']}",
                admin=admin,
                alice=made.json()["token"],
            )


@pytest.fixture
def page(chromium: Any, stack: Stack) -> Iterator[Any]:
    """A fresh browser context, signed in as alice through the sign-in form."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.on("dialog", lambda d: d.dismiss())
    sign_in(tab, stack)  # type: ignore[arg-type]  # it reads only .base and .alice
    try:
        yield tab
    finally:
        context.close()


def serious(tab: Any) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(tab)
    return [
        f"{v['id']} ({v['impact']}): {v['help']}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def test_a_finished_runs_page_shows_the_conversation_with_results_in_place(
    page: Any, stack: Stack
) -> None:
    script = [
        call_tools([("echo_say", {"text": "hi"}), ("echo_say", {"text": "there"})]),
        answer("The echo said hi and there."),
    ]
    with ScriptedModels(script) as models:
        stack.put_agent("helper", models)
        done = stack.start("helper", "Say hi and there.", wait=60)
    assert (done["status"], done["end_reason"]) == ("succeeded", "answered"), done
    run = stack.run(done["run_id"])
    first_round = run["rounds"][0]["task_id"]

    page.goto(f"{stack.base}/console/runs")
    assert page.get_by_role("link", name="Runs").get_attribute("aria-current") == "page"
    row = page.locator("tr", has=page.locator(f'a[href="/console/runs/{run["run_id"]}"]'))
    assert "answered" in row.inner_text()
    assert "helper" in row.inner_text()
    row.get_by_role("link").first.click()
    page.wait_for_url(f"**/console/runs/{run['run_id']}")

    expect(page.locator("#run-status")).to_have_text("succeeded")
    assert page.locator("#end-reason").inner_text() == "answered"
    assert page.locator("#answer").inner_text() == "The echo said hi and there."
    tokens = page.locator("#tokens").inner_text()
    assert str(run["tokens"]["input"]) in tokens
    assert str(run["tokens"]["output"]) in tokens
    conversation = page.locator("#conversation")
    assert "Say hi and there." in conversation.inner_text()
    # Each call shows its arguments and, in place, its result and its receipt's status.
    calls = conversation.locator("li.call")
    assert calls.count() == 2
    for call, said in zip(calls.all(), ("hi", "there"), strict=True):
        assert f'"text": "{said}"' in call.locator("pre.args").inner_text()
        assert said in call.locator("pre.result").inner_text()
        assert "succeeded" in call.locator(".status").first.inner_text()
        assert "echo.say" in call.inner_text()
    link = calls.first.get_by_role("link")
    assert link.get_attribute("href") == f"/console/tasks/{first_round}#step-call_0"
    assert page.locator("#rounds").get_by_role("link").count() == 2
    assert not serious(page), serious(page)
    shot(page, "run")

    # The call's link opens its round's task at its step, and that task links back to the run.
    link.click()
    page.wait_for_url(f"**/console/tasks/{first_round}#step-call_0")
    assert page.locator("li#step-call_0 details").get_attribute("open") is not None
    back = page.get_by_role("link", name=f"Run {run['run_id']}")
    assert back.get_attribute("href") == f"/console/runs/{run['run_id']}"
    # The task list links each round to its run.
    page.goto(f"{stack.base}/console/tasks")
    task_row = page.locator("tr", has=page.locator(f'a[href="/console/tasks/{first_round}"]'))
    assert task_row.locator(f'a[href="/console/runs/{run["run_id"]}"]').count() == 1
    page.goto(f"{stack.base}/console/runs")
    assert not serious(page), serious(page)


def test_a_run_waiting_for_approval_is_approved_from_its_page_and_ends(
    page: Any, stack: Stack
) -> None:
    script = [call_tools([("pay_send", {"cents": 5})]), answer("Paid 5 cents.")]
    with ScriptedModels(script) as models:
        models.hold()  # the model's first call waits until the page is open
        stack.put_agent("payer", models, tools=["echo.*", "pay.*"])
        run_id = stack.start("payer", "Pay five cents.")["run_id"]
        page.goto(f"{stack.base}/console/runs/{run_id}")
        wait_until(lambda: models.held == 1, within=30, what="the model's first call")
        assert page.locator("#run-status").inner_text() == "running"
        assert page.locator("#conversation li.call").count() == 0
        models.release()
        models.hold(after=1)  # the second call (after the approval) waits too
        # The page follows the run: the model's call arrives, and its step waits for a decision.
        expect(page.locator("#run-status")).to_have_text("waiting", timeout=30_000)
        expect(page.locator("#conversation li.call .status")).to_have_text("awaiting_approval")
        card = page.locator("#waiting li.approval")
        expect(card).to_have_count(1, timeout=30_000)
        assert "pay.send" in card.inner_text()
        assert '"cents": 5' in card.locator("pre").first.inner_text()
        assert not serious(page), serious(page)
        shot(page, "run-waiting")
        card.get_by_label("Reason (the model reads it on a rejection)").fill("five is fine")
        card.get_by_role("button", name="Approve").click()
        page.wait_for_url(f"**/console/runs/{run_id}?done=approved")
        assert page.get_by_role("status").first.inner_text() == "Approved."
        wait_until(lambda: models.held == 1, within=30, what="the model's second call")
        assert page.locator("#run-status").inner_text() in ("running", "waiting")
        models.release()
        # Live: the page learns that the run ended, and shows its answer, without a reload.
        expect(page.locator("#run-status")).to_have_text("succeeded", timeout=30_000)
        expect(page.locator("#answer")).to_have_text("Paid 5 cents.", timeout=30_000)
    call = page.locator("#conversation li.call")
    assert '"cents": 5' in call.locator("pre.args").inner_text()
    assert "succeeded" in call.locator(".status").first.inner_text()
    assert page.locator("#waiting li.approval").count() == 0
    run = stack.run(run_id)
    assert (run["status"], run["end_reason"]) == ("succeeded", "answered")
    events = stack.admin.get(f"/v1/tasks/{run['rounds'][0]['task_id']}/events").json()
    assert any((e.get("data") or {}).get("by") == "alice" for e in events["events"])


def test_a_hostile_model_reply_renders_inert(page: Any, stack: Stack) -> None:
    script = [
        call_tools([("echo_say", {"text": XSS[4] + XSS[5]})]),
        answer(HOSTILE_ANSWER),
    ]
    with ScriptedModels(script) as models:
        stack.put_agent("hostile", models)
        done = stack.start("hostile", XSS[3], wait=60)
    assert done["status"] == "succeeded", done
    for path in ("/console/runs", f"/console/runs/{done['run_id']}"):
        page.goto(f"{stack.base}{path}")
        for details in page.locator("details").all():
            details.evaluate("d => d.open = true")
        page.wait_for_timeout(100)
        assert pwned(page) is None, path
        assert page.locator('[href^="javascript:" i], [src^="javascript:" i]').count() == 0
        assert page.locator("main script, main img, main svg, main iframe").count() == 0
    # The words are on the page, as text.
    assert page.locator("#answer").inner_text() == HOSTILE_ANSWER
    assert XSS[4] in page.locator("#conversation li.call pre.args").inner_text()
    assert XSS[3] in page.locator("#conversation").inner_text()
    assert XSS[0] not in page.content()  # never unescaped in the HTML


def test_a_run_is_cancelled_from_its_page_and_another_tenants_run_is_not_found(
    page: Any, stack: Stack
) -> None:
    with ScriptedModels([answer("never read")]) as models:
        models.hold()  # the model's call stays in flight until the run is cancelled
        stack.put_agent("slow", models)
        run_id = stack.start("slow", "Take your time.")["run_id"]
        page.goto(f"{stack.base}/console/runs/{run_id}")
        page.get_by_role("button", name="Cancel run").click()
        page.wait_for_url(f"**/console/runs/{run_id}?done=cancelled")
        expect(page.locator("#run-status")).to_have_text("cancelled", timeout=30_000)
        assert page.locator("#end-reason").inner_text() == "cancelled"
    assert stack.run(run_id)["status"] == "cancelled"

    made = stack.admin.post(
        "/v1/keys", json={"name": "mallory", "tenant": "acme", "roles": ["admin"]}
    )
    assert made.status_code == 201, made.text
    with ScriptedModels([answer("theirs, secret")]) as models:
        stack.put_agent("theirs", models)
        with httpx.Client(
            base_url=stack.base, headers={"Authorization": f"Bearer {made.json()['token']}"}
        ) as theirs:
            started = theirs.post("/v1/runs?wait=60", json={"agent": "theirs", "input": "Hi."})
            assert started.status_code == 200, started.text
    answer_ = page.goto(f"{stack.base}/console/runs/{started.json()['run_id']}")
    assert answer_.status == 404
    assert page.get_by_role("heading", level=1).inner_text() == "Not found"
    assert "secret" not in page.content()
    page.goto(f"{stack.base}/console/runs")
    assert started.json()["run_id"] not in page.content()
    bad = page.goto(f"{stack.base}/console/runs?before=nope")
    assert bad.status == 400
    assert "before" in page.locator("main").inner_text()
