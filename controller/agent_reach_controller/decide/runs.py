"""The rules of an agent run: what a model's reply costs, whether the run may go on, and why not.

Pure functions over a run's row, its profile's limits and the round that just ended; the run
service (services/runs.py) applies what they decide in the transaction that ended the round.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach.states import Transition
from agent_reach_controller.decide.outcomes import terminal_values
from agent_reach_controller.domain.records import RunMessage, RunRow, StepChange, StepRow
from agent_reach_controller.tools.agents import AgentProfile, Limits, Prices
from agent_reach_controller.tools.catalog import ToolSpec

# The same tool with the same arguments this many times in one run ends it (`loop_detected`).
LOOP_REPEATS = 3
# Characters per token, for what a request costs when a reply's own `usage` says less: a
# documented estimate (English text and JSON run ~3.5-4.5), so a lying `usage` cannot stretch a
# budget far.
CHARS_PER_TOKEN = 4


class EndReason:
    """Why a run ended, as the caller reads it (`end_reason`)."""

    ANSWERED = "answered"
    MAX_ROUNDS = "max_rounds"
    BUDGET_EXHAUSTED = "budget_exhausted"
    LOOP_DETECTED = "loop_detected"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    MODEL_FAILED = "model_failed"
    INVALID_REPLY = "invalid_reply"
    INVALID_PLAN = "invalid_plan"
    CANCELLED = "cancelled"
    ROUND_FAILED = "round_failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What one model call counted for: tokens in, out, cached, and its cost."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost: float

    def added_to(self, run: RunRow) -> dict[str, Any]:
        return {
            "input_tokens": run.input_tokens + self.input_tokens,
            "output_tokens": run.output_tokens + self.output_tokens,
            "cached_tokens": run.cached_tokens + self.cached_tokens,
            "cost": run.cost + self.cost,
        }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_of(output: Any, *, sent_chars: int, prices: Prices) -> Usage:
    """A model step's usage: the reply's own figures, but never fewer input tokens than what was
    sent would take, nor fewer output tokens than the reply's text would."""
    reported = output.get("usage") if isinstance(output, dict) else None
    reported = reported if isinstance(reported, dict) else {}
    reply_chars = len(json.dumps(output.get("reply"))) if isinstance(output, dict) else 0
    input_tokens = max(_count(reported.get("input_tokens")), sent_chars // CHARS_PER_TOKEN)
    output_tokens = max(_count(reported.get("output_tokens")), reply_chars // (4 * CHARS_PER_TOKEN))
    cached = min(_count(reported.get("cached_tokens")), input_tokens)
    cost = prices.cost(input_tokens=input_tokens, output_tokens=output_tokens, cached_tokens=cached)
    return Usage(
        input_tokens=input_tokens, output_tokens=output_tokens, cached_tokens=cached, cost=cost
    )


def embedding_usage(output: Any, *, sent_chars: int) -> Usage:
    """An embeddings call's usage: its input tokens (never fewer than what was sent would take),
    nothing out, and no cost (a profile's prices are its chat model's, not its embedder's)."""
    reported = output.get("usage") if isinstance(output, dict) else None
    reported = reported if isinstance(reported, dict) else {}
    tokens = max(_count(reported.get("input_tokens")), sent_chars // CHARS_PER_TOKEN)
    return Usage(input_tokens=tokens, output_tokens=0, cached_tokens=0, cost=0.0)


def over_budget(totals: Mapping[str, Any], limits: Limits) -> str | None:
    """Which budget the totals have spent, if any (a sentence)."""
    if limits.input_tokens is not None and totals["input_tokens"] >= limits.input_tokens:
        return f"{totals['input_tokens']:,} input tokens of {limits.input_tokens:,}"
    if limits.output_tokens is not None and totals["output_tokens"] >= limits.output_tokens:
        return f"{totals['output_tokens']:,} output tokens of {limits.output_tokens:,}"
    if limits.cost is not None and totals["cost"] >= limits.cost:
        return f"cost {totals['cost']:.6g} of {limits.cost:.6g}"
    return None


def max_tokens(run: RunRow, limits: Limits) -> int:
    """The next reply's `max_tokens`: the profile's, cut to what the output budget has left."""
    if limits.output_tokens is None:
        return limits.max_output_tokens
    return max(1, min(limits.max_output_tokens, limits.output_tokens - run.output_tokens))


def fingerprint(tool: str, args: Any) -> str:
    canonical = json.dumps([tool, args], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def counted_calls(
    seen: Mapping[str, int], calls: Iterable[tuple[str, Any]]
) -> tuple[dict[str, int], str | None]:
    """The run's call counts with this round's calls added, and the tool called with the same
    arguments `LOOP_REPEATS` times, if one was."""
    counts = dict(seen)
    looping = None
    for tool, args in calls:
        key = fingerprint(tool, args)
        counts[key] = counts.get(key, 0) + 1
        if counts[key] >= LOOP_REPEATS and looping is None:
            looping = tool
    return counts, looping


@dataclass(frozen=True, slots=True)
class Next:
    """After a round: go on with another, or end the run (`reason`, a sentence `detail`)."""

    go_on: bool
    reason: str | None = None
    detail: str | None = None


def after_round(run: RunRow, limits: Limits, *, now: datetime) -> Next:
    """Whether a run whose round ended with tool results may ask the model again."""
    rounds = run.round - run.turn_start + 1
    if rounds >= limits.max_rounds:
        detail = f"{rounds} rounds, the most this run may take"
        return Next(False, EndReason.MAX_ROUNDS, detail)
    if run.deadline is not None and now >= run.deadline:
        return Next(False, EndReason.DEADLINE_EXCEEDED, "the run's deadline passed")
    spent = over_budget(
        {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens, "cost": run.cost},
        limits,
    )
    if spent is not None:
        return Next(False, EndReason.BUDGET_EXHAUSTED, f"spent {spent}")
    return Next(True)


# What a final answer may state only if the input or a receipt said it first.
_CLAIMS = (
    re.compile(r"https?://[^\s<>\"')\]]+", re.IGNORECASE),  # URLs
    re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"),  # email addresses
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),  # ISO dates
    re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\w])"),  # numbers
)
_DIGITS = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def ungrounded_claims(answer: str, sources: Iterable[str], *, most: int = 20) -> list[str]:
    """The URLs, email addresses, dates and numbers of `answer` that no source shows: what a
    model may have made up. A number counts as shown when a source writes the same value (with
    or without thousands separators); one-digit numbers are left out (counts, list items)."""
    seen = " ".join(sources).casefold()
    numbers = {n for n in (_number(t) for t in _DIGITS.findall(seen)) if n is not None}
    found: list[str] = []
    taken: set[str] = set()
    for pattern in _CLAIMS:
        for match in pattern.finditer(answer):
            claim = match.group(0).rstrip(".,;:")
            if claim in taken or any(claim in t for t in found):
                continue
            taken.add(claim)
            value = _number(claim) if pattern is _CLAIMS[3] else None
            if pattern is _CLAIMS[3] and (value is None or len(claim) < 2 or value in numbers):
                continue
            if value is None and claim.casefold() in seen:
                continue
            found.append(claim)
    return found[:most]


def stage_note(run: RunRow, limits: Limits, *, goal: str) -> str:
    """A short note of where the run stands, said to the model each round: the goal, what was
    done, what is left of its rounds and budgets."""
    rounds = run.round - run.turn_start + 1
    calls = sum(run.calls.values())
    parts = [
        f"[run state] Round {rounds} of at most {limits.max_rounds}.",
        f"Goal: {goal[:200]}" if goal else "",
        f"Done: {calls} tool call{'s' if calls != 1 else ''} in this run, their results above."
        if calls
        else "Done: nothing yet.",
    ]
    left = []
    if limits.output_tokens is not None:
        left.append(f"{max(0, limits.output_tokens - run.output_tokens):,} output tokens")
    if limits.input_tokens is not None:
        left.append(f"{max(0, limits.input_tokens - run.input_tokens):,} input tokens")
    if limits.cost is not None:
        left.append(f"{max(0.0, limits.cost - run.cost):.4g} cost")
    if left:
        parts.append("Left: " + ", ".join(left) + ".")
    if rounds >= limits.max_rounds:
        parts.append("This is the last round: answer now with what you have.")
    return " ".join(p for p in parts if p)


UNVERIFIED = (
    "its outcome is unknown: it may or may not have taken effect. Do not call it again before "
    "checking whether it did"
)


def told_unverified(step: StepRow, tool: ToolSpec, *, now: datetime) -> StepChange:
    """A run's call whose outcome is unknown, ended for its model to read (the tool's
    `if_unknown: tell_model`): failed, `unverified`, never run again by itself."""
    error = {"code": ErrorCode.UNVERIFIED.value, "message": UNVERIFIED, "retryable": False}
    values = terminal_values(
        step, tool=tool, transition=Transition.RESOLVE_FAILED, now=now, error=error
    )
    verdict = {"by": "agent-reach (if_unknown: tell_model)", "action": "unverified"}
    return StepChange(
        step=step, transition=Transition.RESOLVE_FAILED, values=values, event_data=verdict
    )


# -- reading a run's conversation --------------------------------------------------------------


def grounds_of(run: RunRow, conversation: Sequence[RunMessage]) -> dict[str, Any]:
    """What a grounded argument may come from in a run: the caller's context and messages, and
    every tool result the model has read; never the model's own words."""
    return {
        "context": run.context,
        "input": [m.message for m in conversation if m.role == "user"],
        "read": [m.message for m in conversation if m.role == "tool"],
    }


def this_turn(conversation: Sequence[RunMessage], role: str) -> list[RunMessage]:
    """The entries of `role` since the caller's latest message."""
    found: list[RunMessage] = []
    for m in conversation:
        if m.role == "user":
            found = []
        elif m.role == role:
            found.append(m)
    return found


def mode_of(profile: AgentProfile, conversation: Sequence[RunMessage], tools: int) -> str:
    """How the next reply is read: `route` (the router's call), `category` (a category of many
    tools), or the profile's mode, or in `auto` what the router chose for the caller's latest
    message."""
    mode: str = profile.mode
    if mode == "auto":
        routed = this_turn(conversation, "route")
        if not routed:
            return "route"
        mode = str(routed[-1].message.get("route", "react"))
    many = tools > profile.category_threshold
    if mode == "react" and many and not this_turn(conversation, "category"):
        return "category"
    return mode


def chosen_category(conversation: Sequence[RunMessage]) -> str | None:
    chosen = this_turn(conversation, "category")
    name = chosen[-1].message.get("category") if chosen else None
    return name if isinstance(name, str) else None


def planning(conversation: Sequence[RunMessage]) -> bool:
    """Planner mode: whether the next reply is a plan (none has run since the caller spoke)."""
    return not this_turn(conversation, "tool")


def round_of(goal: str) -> int:
    """A round's number, from its task's goal (`round N of run …`, as a round is named)."""
    words = goal.split()
    return int(words[1]) if len(words) > 1 and words[1].isdigit() else 0


def goal_of(conversation: Sequence[RunMessage]) -> str:
    """The caller's latest words: what the run is for now."""
    for m in reversed(conversation):
        content = m.message.get("content")
        if m.role == "user" and isinstance(content, str):
            return " ".join(content.split())
    return ""
