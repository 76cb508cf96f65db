"""Subjects: the end user a run or a task acts for, named by its caller (never by a model).

The rule of what a subject may be lives here, below every layer that checks one: a plan's reader
(`planning/`), memory's rules (`decide/memory.py`) and the API all ask `subject_problem`.
"""

from __future__ import annotations

import re
from typing import Any

MAX_SUBJECT = 256
_SUBJECT = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")


def subject_problem(subject: Any) -> str | None:
    """Why `subject` cannot name a subject (None: it can)."""
    if not isinstance(subject, str) or not _SUBJECT.match(subject) or subject != subject.strip():
        return (
            f"a subject is 1-{MAX_SUBJECT} characters without control characters or "
            "surrounding spaces"
        )
    return None
