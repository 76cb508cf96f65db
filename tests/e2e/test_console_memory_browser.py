"""The console's memory pages in a real browser (Debian's Chromium, Playwright, axe-core) against
`reach dev` whose executor calls a scripted model: from a run's page to the memories it recalled
and stored, a planted one confirmed, one edited, one forgotten, then the whole subject forgotten
behind its typed name; a stranger's markup in a memory never runs."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from tests.e2e.test_console_browser import pwned, shot
from tests.e2e.test_console_runs_browser import Stack, chromium, page, serious, stack
from tests.support.console_tools import XSS
from tests.support.models import ScriptedModels, answer, call_tools

pytestmark = pytest.mark.e2e
__all__ = ["chromium", "page", "stack"]  # the browser, the signed-in tab and `reach dev`

SUBJECT = "ada@example.test"


def remember(stack: Stack, **entry: Any) -> dict[str, Any]:
    made = stack.admin.post("/v1/memory", json={"subject": SUBJECT, **entry})
    assert made.status_code == 201, made.text
    return dict(made.json())


def test_a_subjects_memories_from_a_run_confirmed_edited_and_forgotten(
    page: Any, stack: Stack
) -> None:
    pinned = remember(stack, type="profile", key="name", text="The user is Ada", pinned=True)
    hostile = remember(stack, type="fact", key="markup", text=" ".join(XSS))
    script = [
        call_tools([("echo_say", {"text": "Reports go to the archive"})]),
        answer("Filed."),
        answer(json.dumps({"memories": [{"type": "fact", "key": "archive", "text": "Archive"}]})),
    ]
    with ScriptedModels(script) as models:
        stack.put_agent("keeper", models, memory={"extract": True})
        started = stack.admin.post(
            "/v1/runs?wait=60",
            json={"agent": "keeper", "input": "File the reports.", "subject": SUBJECT},
        )
        assert started.status_code == 200, started.text
    run = stack.run(started.json()["run_id"])
    assert run["extraction"]["state"] == "done", run
    [stored] = run["extraction"]["stored"]
    assert stored["origin"] == "receipt"  # it had read the echo tool's output

    # The run's page: what it recalled and what it stored, each linked to its memory.
    page.goto(f"{stack.base}/console/runs/{run['run_id']}")
    recalled = page.locator("#conversation li.memory-recalled")
    assert "reminded the model of 1" in recalled.inner_text()
    assert "pinned" in recalled.inner_text()
    extracted = page.locator("#conversation li.memory-extraction").last
    assert "untrusted" in extracted.inner_text()
    assert not serious(page), serious(page)
    shot(page, "run-memory")
    extracted.get_by_role("link", name="archive").click()
    page.wait_for_url(f"**/console/memory/subject?subject={quote(SUBJECT, safe='')}#memory-*")
    assert (
        page.get_by_role("link", name="Memory", exact=True).get_attribute("aria-current") == "page"
    )

    # The planted memory, marked untrusted, with its source; confirmed by a person.
    card = page.locator(f"#memory-{stored['memory_id']}")
    assert "untrusted" in card.locator("h2").inner_text()
    assert run["run_id"] in card.get_by_role("link").first.inner_text()
    for details in page.locator("details").all():
        details.evaluate("d => d.open = true")
    assert pwned(page) is None
    assert page.locator("main script, main img, main svg, main iframe").count() == 0
    assert XSS[0] in page.locator(f"#memory-{hostile['memory_id']} p.memory-text").inner_text()
    assert not serious(page), serious(page)
    shot(page, "memory-subject")
    card.get_by_role("button", name="Confirm fact archive").click()
    expect(page.get_by_role("status").first).to_contain_text("Memory confirmed")
    assert "untrusted" not in page.locator(f"#memory-{stored['memory_id']} h2").inner_text()

    # An edit: the text changed and the pin taken off, as the form had them.
    card = page.locator(f"#memory-{pinned['memory_id']}")
    card.locator("summary", has_text="Edit").click()
    card.get_by_label("Text").fill("The user is Ada Lovelace")
    card.get_by_label("Pinned (recalled into every run of this subject)").select_option("no")
    card.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status").first).to_have_text("Memory saved.")
    edited = stack.admin.get(f"/v1/memory/{pinned['memory_id']}").json()
    assert (edited["text"], edited["pinned"]) == ("The user is Ada Lovelace", False)

    # Forget one, then the whole subject: only once its name is typed.
    page.get_by_role("button", name="Forget fact markup").click()
    expect(page.get_by_role("status").first).to_have_text("Memory forgotten.")
    assert page.locator(f"#memory-{hostile['memory_id']}").count() == 0
    page.get_by_label("Type the subject's name to confirm").fill(SUBJECT)
    page.get_by_role("button", name="Forget every memory of this subject").click()
    page.wait_for_url("**/console/memory?done=subject_forgotten")
    assert SUBJECT not in page.locator("main").inner_text()
    assert not serious(page), serious(page)
    left = stack.admin.get("/v1/memory", params={"subject": SUBJECT}).json()
    assert left["memories"] == []
