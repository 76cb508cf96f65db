"""A run's conversation as the console shows it: who said what, round by round, each tool call
with its result (and its step) in place, whatever endpoint's shape the entries are stored in.

Every value here came from a caller, a model or a tool: it is only ever shown as text.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent_reach_controller.decide.memory import FORGOTTEN
from agent_reach_controller.decide.run_memory import EXTRACTION_ROLE, MEMORY_ROLE

# Who says an entry of each role, as the page names them.
_SPEAKERS = {
    "user": "Caller",
    "assistant": "Model",
    "tool": "Tool results",
    "controller": "Agent-Reach",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Said:
    """Words: the caller's, the model's, a note of the controller's, a router's choice."""

    kind: str  # user, assistant, tool, controller, route, category (or a role we do not know)
    speaker: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One tool call the model asked for, with its result once the round has it."""

    call_id: str
    name: str  # as the model wrote it (the catalogue's name is on the step)
    args: Any
    result: str | None = None
    is_error: bool = False
    step: Mapping[str, Any] | None = None  # the round task's step for this call, if kept
    kind: str = "call"


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """A tool result: shown in place under its call, or alone when its call is not found."""

    call_id: str
    text: str
    is_error: bool = False
    kind: str = "result"


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """One memory a run was reminded of: what it is and why it was chosen, never its text."""

    memory_id: str
    type: str
    key: str
    score: float | None
    pinned: bool
    forgotten: bool  # deleted since: the run's record holds "[forgotten]" for its text


@dataclass(frozen=True, slots=True, kw_only=True)
class Recalled:
    """The subject's memories the run started with (its prompt's data block)."""

    memories: list[Memory]
    kind: str = "recalled"


@dataclass(frozen=True, slots=True, kw_only=True)
class Extraction:
    """The run's extraction: asked (its round runs), skipped or failed and why, or done with
    what it stored and what it refused (where and why, never the proposal's words)."""

    state: str
    reason: str
    stored: list[Mapping[str, Any]]
    refused: list[Mapping[str, Any]]
    kind: str = "extraction"


Entry = Said | Call | Result | Recalled | Extraction


@dataclass(frozen=True, slots=True, kw_only=True)
class Round:
    number: int
    task_id: str | None  # the round's task, unless retention removed it
    task: Mapping[str, Any] | None  # that task as GET /v1/tasks/{id} shows it, if it was read
    entries: list[Entry] = field(default_factory=list)


def rounds(
    messages: Sequence[Mapping[str, Any]],
    kept: Sequence[Mapping[str, Any]],
    tasks: Mapping[str, Mapping[str, Any]],
) -> list[Round]:
    """The conversation by round. `kept` is the run's rounds (round, task_id, status); `tasks`
    the views of those tasks that could be read. Results are folded into their calls."""
    task_ids = {int(r["round"]): str(r["task_id"]) for r in kept}
    by_number = {n: tasks.get(t) for n, t in task_ids.items()}
    numbers = sorted(set(by_number) | {int(m.get("round") or 0) for m in messages})
    return [
        Round(
            number=n,
            task_id=task_ids.get(n),
            task=by_number.get(n),
            entries=_folded(
                [e for m in messages if int(m.get("round") or 0) == n for e in entries_of(m)],
                by_number.get(n),
            ),
        )
        for n in numbers
    ]


def entries_of(stored: Mapping[str, Any]) -> list[Entry]:
    """One stored entry ({seq, round, role, message}) as what the page shows."""
    role = str(stored.get("role") or "")
    message = stored.get("message")
    if not isinstance(message, dict):
        return [Said(kind=role, speaker=role, text=_text(message))]
    if role in ("route", "category"):
        return [_choice(role, message)]
    if role == MEMORY_ROLE:
        return [_recalled(message)]
    if role == EXTRACTION_ROLE:
        return [_extraction(message)]
    parts = _parts(message)
    said = " ".join(p for p in parts if isinstance(p, str) and p.strip())
    shown: list[Entry] = []
    if said:
        shown.append(Said(kind=role, speaker=_SPEAKERS.get(role, role), text=said))
    shown += [p for p in parts if not isinstance(p, str)]
    return shown


def _choice(role: str, message: Mapping[str, Any]) -> Said:
    chose = message.get(role)
    reason = message.get("reason")
    text = f"{_text(chose)}: {_text(reason)}" if reason else _text(chose)
    speaker = "Router" if role == "route" else "Tool category"
    return Said(kind=role, speaker=speaker, text=text)


def _recalled(message: Mapping[str, Any]) -> Recalled:
    listed = message.get("recalled")
    return Recalled(
        memories=[
            Memory(
                memory_id=_id(e.get("memory_id")),
                type=_text(e.get("type")),
                key=_text(e.get("key")),
                score=e["score"] if isinstance(e.get("score"), int | float) else None,
                pinned=e.get("pinned") is True,
                forgotten=e.get("text") == FORGOTTEN,
            )
            for e in (listed if isinstance(listed, list) else [])
            if isinstance(e, dict)
        ]
    )


def _extraction(message: Mapping[str, Any]) -> Extraction:
    def listed(name: str) -> list[Mapping[str, Any]]:
        found = message.get(name)
        return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []

    return Extraction(
        state=_text(message.get("state")),
        reason=_text(message.get("reason")),
        stored=listed("stored"),
        refused=listed("refused"),
    )


def _parts(message: Mapping[str, Any]) -> list[str | Call | Result]:
    """Text, calls and results of one message in any endpoint's shape: Chat's messages and
    tool_calls, Responses' items, Anthropic's content blocks."""
    kind = message.get("type")
    if kind == "function_call":
        return [_call(message.get("call_id"), message.get("name"), message.get("arguments"))]
    if kind == "function_call_output":
        return [Result(call_id=_id(message.get("call_id")), text=_text(message.get("output")))]
    if kind == "reasoning":
        return []
    if "tool_call_id" in message:
        content = _text(message.get("content"))
        return [Result(call_id=_id(message.get("tool_call_id")), text=content)]
    parts = _content(message.get("content"))
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            function = call.get("function")
            function = function if isinstance(function, dict) else {}
            parts.append(_call(call.get("id"), function.get("name"), function.get("arguments")))
    return parts


def _content(content: Any) -> list[str | Call | Result]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    parts: list[str | Call | Result] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "tool_use":
            parts.append(_call(block.get("id"), block.get("name"), block.get("input")))
        elif kind == "tool_result":
            parts.append(
                Result(
                    call_id=_id(block.get("tool_use_id")),
                    text=_text(block.get("content")),
                    is_error=block.get("is_error") is True,
                )
            )
        elif isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif isinstance(block.get("refusal"), str):
            parts.append(block["refusal"])
    return parts


def _call(call_id: Any, name: Any, args: Any) -> Call:
    if isinstance(args, str):  # Chat and Responses send arguments as JSON text
        with contextlib.suppress(ValueError):  # if not JSON, shown as the model wrote it
            args = json.loads(args)
    return Call(call_id=_id(call_id), name=_text(name), args=args)


def _folded(entries: Iterable[Entry], task: Mapping[str, Any] | None) -> list[Entry]:
    """Each result under its call (and each call with its step); a result whose call is not
    in the round stays where it came."""
    listed = list(entries)
    steps = {str(s.get("step_id")): s for s in (task or {}).get("steps") or []}
    called = {e.call_id for e in listed if isinstance(e, Call)}
    results = {e.call_id: e for e in listed if isinstance(e, Result) and e.call_id in called}
    shown: list[Entry] = []
    for e in listed:
        if isinstance(e, Call):
            answered = results.get(e.call_id)
            shown.append(
                replace(
                    e,
                    result=answered.text if answered else None,
                    is_error=answered.is_error if answered else False,
                    step=steps.get(e.call_id),
                )
            )
        elif not (isinstance(e, Result) and e.call_id in called):
            shown.append(e)
    return shown


def _id(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _text(value: Any) -> str:
    """Any value as text: strings as they are, text blocks joined, anything else as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and "text" in b for b in value):
        return " ".join(_text(b.get("text")) for b in value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
