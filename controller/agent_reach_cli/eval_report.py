"""What `reach eval` prints: each case's outcome, and a suite's totals, for one agent version or
two side by side (as a table, or as JSON for CI)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """One case of a suite, run: how its run ended, what it used, and whether its check held."""

    case: str
    run_id: str
    passed: bool
    why: str | None  # the check's error, when it could not be evaluated
    status: str
    end_reason: str | None
    rounds: int
    input_tokens: int
    output_tokens: int
    cost: float
    ungrounded: bool  # an answer with claims nothing showed
    tool_steps: int
    tool_errors: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    """A suite run on one agent version."""

    agent: str
    version: str
    outcomes: list[Outcome]

    @property
    def label(self) -> str:
        return f"{self.agent}@{self.version}"


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def totals(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """A suite's figures, as GET /v1/agents/{name}/stats counts them (a rate is None when
    nothing it divides by happened)."""
    runs = len(outcomes)
    answered = [o for o in outcomes if o.status == "succeeded"]
    steps = sum(o.tool_steps for o in outcomes)
    errors = sum(o.tool_errors for o in outcomes)
    ungrounded = sum(o.ungrounded for o in answered)
    return {
        "runs": runs,
        "completed": len(answered),
        "completion_rate": _ratio(len(answered), runs),
        "passed": sum(o.passed for o in outcomes),
        "pass_rate": _ratio(sum(o.passed for o in outcomes), runs),
        "average_rounds": _ratio(sum(o.rounds for o in outcomes), runs),
        "tokens_per_run": None
        if not runs
        else {
            "input": sum(o.input_tokens for o in outcomes) / runs,
            "output": sum(o.output_tokens for o in outcomes) / runs,
        },
        "cost_per_run": _ratio(sum(o.cost for o in outcomes), runs),
        "tool_steps": steps,
        "tool_errors": errors,
        "tool_error_rate": _ratio(errors, steps),
        "ungrounded": ungrounded,
        "ungrounded_claim_rate": _ratio(ungrounded, len(answered)),
    }


def as_json(suite: str, sides: Sequence[Side]) -> dict[str, Any]:
    return {
        "suite": suite,
        "passed": all(o.passed for side in sides for o in side.outcomes),
        "results": [
            {
                "agent": side.agent,
                "version": side.version,
                "cases": [asdict(o) for o in side.outcomes],
                "totals": totals(side.outcomes),
            }
            for side in sides
        ],
    }


def _case_cells(o: Outcome | None) -> list[str]:
    if o is None:
        return ["-"] * 5
    return [
        "pass" if o.passed else "FAIL",
        o.end_reason or o.status,
        str(o.rounds),
        f"{o.input_tokens}/{o.output_tokens}",
        f"{o.cost:.6f}",
    ]


def _percent(rate: float | None, part: int, whole: int) -> str:
    return "-" if rate is None else f"{rate:.1%} ({part}/{whole})"


def _total_cells(t: dict[str, Any]) -> list[str]:
    tokens = t["tokens_per_run"]
    return [
        _percent(t["completion_rate"], t["completed"], t["runs"]),
        _percent(t["pass_rate"], t["passed"], t["runs"]),
        "-" if t["average_rounds"] is None else f"{t['average_rounds']:.2f}",
        "-" if tokens is None else f"{tokens['input']:.1f} in, {tokens['output']:.1f} out",
        "-" if t["cost_per_run"] is None else f"{t['cost_per_run']:.6f}",
        _percent(t["tool_error_rate"], t["tool_errors"], t["tool_steps"]),
        _percent(t["ungrounded_claim_rate"], t["ungrounded"], t["completed"]),
    ]


TOTALS = (
    "completion rate",
    "pass rate",
    "average rounds",
    "tokens per run",
    "cost per run",
    "tool error rate",
    "ungrounded-claim rate",
)
CASE_COLUMNS = ("check", "end reason", "rounds", "tokens in/out", "cost")


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def table(suite: str, cases: Sequence[str], sides: Sequence[Side]) -> str:
    """The per-case table then the totals, one block of columns per side."""
    lines = [f"suite {suite}: " + " vs ".join(side.label for side in sides), ""]
    by_side = [{o.case: o for o in side.outcomes} for side in sides]
    head = ["case"]
    for side in sides:
        head += [f"{side.label} {CASE_COLUMNS[0]}", *CASE_COLUMNS[1:]]
    rows = [head]
    for name in cases:
        row = [name]
        for found in by_side:
            row += _case_cells(found.get(name))
        rows.append(row)
    lines += _aligned(rows)
    lines.append("")
    figures = [_total_cells(totals(side.outcomes)) for side in sides]
    total_rows = [["totals", *(side.label for side in sides)]]
    total_rows += [[name, *(f[i] for f in figures)] for i, name in enumerate(TOTALS)]
    lines += _aligned(total_rows)
    failed = [f"{side.label} {o.case}: {o.why}" for side in sides for o in side.outcomes if o.why]
    if failed:
        lines += ["", "checks that could not be evaluated:", *(f"  {f}" for f in failed)]
    return "\n".join(lines)
