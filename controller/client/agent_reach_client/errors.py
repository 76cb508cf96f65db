"""What the client raises."""

from __future__ import annotations

from typing import Any

from agent_reach_client.types import PendingCall


class ProblemError(Exception):
    """The controller refused the request: its RFC 9457 problem document, field by field."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.code: str = str(problem.get("code", "unknown"))
        self.title: str = str(problem.get("title", ""))
        self.detail: str = str(problem.get("detail", ""))
        self.errors: list[dict[str, Any]] = list(problem.get("errors") or [])
        self.problem = problem
        super().__init__(f"{status} {self.code}: {self.detail or self.title}")


class PendingCalls(TimeoutError):
    """A turn still had calls without a reply when the wait ended (an approval, a slow tool)."""

    def __init__(self, task_id: str, pending: list[PendingCall]) -> None:
        self.task_id = task_id
        self.pending = pending
        waiting = ", ".join(f"{p['call_id']} ({p['waiting_for']})" for p in pending)
        super().__init__(f"task {task_id}: no reply yet for {waiting}")
