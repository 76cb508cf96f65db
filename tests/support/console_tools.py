"""Tools of the console's browser tests, in Python (imported by the executor of `reach dev`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

# The XSS corpus: each payload tries to set window.__pwned if a page ever runs it.
XSS = [
    "<script>window.__pwned=1</script>",
    '"><img src=x onerror="window.__pwned=1">',
    "'><svg onload=window.__pwned=1>",
    "</textarea><img src=x onerror=window.__pwned=1>",
    "</pre><script>window.__pwned=1</script>",
    "javascript:window.__pwned=1",
    '<a href="javascript:window.__pwned=1">click</a>',
    '<iframe srcdoc="<script>parent.__pwned=1</script>"></iframe>',
    "{{constructor.constructor('window.__pwned=1')()}}",
    "<details open ontoggle=window.__pwned=1>",
]


def gate(name: str) -> dict[str, Any]:
    """Wait until the test opens the gate `name` (a file): a step runs as long as a test needs."""
    door = Path(os.environ["CONSOLE_GATES"]) / name
    deadline = time.monotonic() + 60
    while not door.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {name} never opened")
        time.sleep(0.05)
    return {"passed": name}


def refund(amount: int, note: str = "") -> dict[str, Any]:
    """A refund that only says what it would have refunded."""
    return {"refunded": amount, "note": note}


def echo(text: str) -> dict[str, Any]:
    """Hostile output: the arguments back, with every payload of the corpus."""
    return {"said": text, "corpus": XSS}
