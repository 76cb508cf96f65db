"""The MCP gateway: each caller's permitted tools over MCP Streamable HTTP, at /mcp.

Served by the official `mcp` SDK's Streamable HTTP transport in stateless mode, so any replica
answers any request (no session to pin a client to). The same API keys as /v1 authenticate it
(`Authorization: Bearer ark_…`); `tools/list` shows only the tools the key may submit, with
their annotations; each `tools/call` is a task submitted in the `mcp` dialect, so approvals,
caps, grounding, rate limits, idempotency and tracing apply as to any submit:

- `_meta.idempotency_key` is the task's Idempotency-Key; `_meta.traceparent` is continued;
- progress notifications say what the task is doing while the call waits for it, when the client
  sent a progress token;
- a call that must wait for a person (approval) or outlasts the longest wait answers at once with
  a result that says so and where its outcome will be (`structuredContent.status` is not final);
- a call the controller refuses (unknown tool, bad arguments) is an `isError` result, as a tool's
  own failure is: the model reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from agent_reach.ids import new_task_id, new_trace_id, parse_traceparent
from agent_reach.states import TERMINAL_TASK_STATES, StepStatus
from agent_reach_controller.api.auth import authenticate
from agent_reach_controller.api.serving import NotStartedError, ShuttingDownError
from agent_reach_controller.api.tasks import (
    Acceptance,
    TooManyInFlightError,
    accept_plan,
    approvers,
    submit_span,
)
from agent_reach_controller.api.views import turn_replies
from agent_reach_controller.identity.policy import Action, Principal
from agent_reach_controller.planning.dialects.mcp import STEP_ID
from agent_reach_controller.planning.problems import PlanInvalidError
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.admission import QueueFullError
from agent_reach_controller.services.queries import TaskView
from agent_reach_controller.tools import shapes

log = logging.getLogger(__name__)

# The protocol revisions the gateway is tested with (tests/e2e/test_mcp_gateway.py): the
# initialize handshake's newest and the stateless per-request envelope. The SDK is pinned to the
# minor version these were tested on (pyproject.toml).
TESTED_REVISIONS = ("2025-11-25", "2026-07-28")
# How often a waiting call looks at its task (and reports progress).
_POLL_S = 0.5
IDEMPOTENCY_META = "idempotency_key"


class McpGateway:
    """The MCP server over these components, and its ASGI endpoint (authenticates first)."""

    def __init__(self, deps: Components) -> None:
        self._deps = deps
        self._server: Server[Any] = Server(
            "agent-reach",
            version="0.1.0",
            instructions="Tools governed by Agent-Reach: each call is a durable task with a "
            "receipt. A result whose structuredContent.status is awaiting_approval or running "
            "is not final: its outcome will be at structuredContent.replies_url.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self._manager: StreamableHTTPSessionManager | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve MCP requests inside this block (the transport's task group lives here)."""
        manager = StreamableHTTPSessionManager(
            app=self._server,
            stateless=True,
            json_response=False,  # an SSE answer can carry progress notifications first
            # The bearer key is what admits a request; a page in a browser cannot send it.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=self._deps.settings.max_body_bytes,
        )
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # What is refused here (no key, not serving) is raised for the app's error table.
        who = await authenticate(self._deps, Request(scope, receive))
        manager = self._manager
        if self._deps.stopping:
            raise ShuttingDownError(
                "the MCP gateway is stopping here; use another replica", retry_after=1
            )
        if manager is None:
            raise NotStartedError("the MCP gateway is not serving here yet; retry", retry_after=1)
        scope.setdefault("state", {})["principal"] = who
        await manager.handle_request(scope, receive, send)

    # --- MCP methods ----------------------------------------------------------------------

    def _principal(self, ctx: ServerRequestContext[Any]) -> Principal:
        request = ctx.request
        who = getattr(getattr(request, "state", None), "principal", None)
        if not isinstance(who, Principal):  # pragma: no cover - __call__ always sets it
            raise PermissionError("unauthenticated MCP request")
        return who

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        who = self._principal(ctx)
        deps = self._deps
        await deps.registry.refresh()
        mine = deps.catalog.only(lambda t: deps.policy.allows(who.roles, Action.SUBMIT, t.name))
        listed = shapes.tool_list(mine.enabled(), "mcp")
        return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in listed])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        who = self._principal(ctx)
        deps = self._deps
        meta: dict[str, Any] = dict(params.meta or {})
        parent = parse_traceparent(_text(meta.get("traceparent")))
        trace_id = parent[0] if parent else new_trace_id()
        task_id = new_task_id()
        body = {"name": params.name, "arguments": params.arguments or {}}
        key = _text(meta.get(IDEMPOTENCY_META))
        try:
            to = Acceptance(
                task_id=task_id,
                trace_id=trace_id,
                parent_span_id=parent[1] if parent else None,
                idempotency_key=key[:255] if key else None,
                dialect="mcp",
            )
            with submit_span(
                deps,
                who,
                to,
                parent_span_id=to.parent_span_id,
                attributes={"agent_reach.entry": "mcp"},
            ):
                submitted, _ = await accept_plan(deps, who, body, to)
        except PlanInvalidError as exc:
            said = "; ".join(f"{p.pointer or '/'}: {p.detail}" for p in exc.problems[:5])
            return _error(f"not accepted: {said}")
        except (QueueFullError, TooManyInFlightError) as exc:
            retry = deps.settings.overload_retry_after_seconds
            return _error(f"not accepted: {exc}; nothing was run, retry in {retry} s")
        return await self._outcome(ctx, submitted.task_id, who)

    async def _outcome(
        self, ctx: ServerRequestContext[Any], task_id: str, who: Principal
    ) -> types.CallToolResult:
        """Wait for the call's end (reporting progress), or say why it is not final yet."""
        deps = self._deps
        loop_time = asyncio.get_running_loop().time
        deadline = loop_time() + deps.settings.max_wait_seconds
        said: str | None = None
        polls = 0
        while True:
            view = await deps.queries.wait(task_id, within=_POLL_S)
            step = next(s for s in view.steps if s.step_id == STEP_ID)
            done = view.task.status in TERMINAL_TASK_STATES
            if done or step.status == StepStatus.AWAITING_APPROVAL or loop_time() >= deadline:
                return self._result(view, who)
            polls += 1
            now_saying = f"{step.status} (attempt {step.attempt} of {step.max_attempts})"
            if now_saying != said:
                said = now_saying
                await ctx.session.report_progress(float(polls), None, now_saying)

    def _result(self, view: TaskView, who: Principal) -> types.CallToolResult:
        deps = self._deps
        turn = turn_replies(
            view,
            budget=deps.settings.receipt_budget_chars,
            approvers=approvers(deps),
        )
        assert turn is not None  # the mcp dialect answers in replies
        task = view.task
        status: dict[str, Any] = {
            "task_id": task.task_id,
            "trace_id": task.trace_id,
            "replies_url": f"/v1/tasks/{task.task_id}/replies",
        }
        if turn.replies:
            [reply] = turn.replies
            step = next(s for s in view.steps if s.step_id == STEP_ID)
            receipt = step.receipt or {}
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=reply["content"][0]["text"])],
                structured_content={**status, "status": step.status, "receipt": receipt},
                is_error=bool(reply["isError"]),
            )
        [pending] = turn.pending
        waiting = pending.model_dump(mode="json", exclude_none=True)
        if pending.waiting_for == "approval":
            text = (
                f"Not run yet: {who.name}'s call needs approval by one of "
                f"{', '.join(pending.approvers or []) or 'nobody (no role may approve it)'}"
                f" before {waiting.get('decide_by')}. Task {task.task_id}; its outcome will be at "
                f"{status['replies_url']}."
            )
            state = "awaiting_approval"
        else:
            text = (
                f"Still {pending.status} after the longest wait; not final. Task "
                f"{task.task_id}; its outcome will be at {status['replies_url']}."
            )
            state = "running"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content={**status, "status": state, "pending": waiting},
            is_error=False,
        )


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"status": "refused"},
        is_error=True,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
