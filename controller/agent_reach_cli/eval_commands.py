"""`reach eval`: an agent judged by what it gets done on a suite of goals, each checked in CEL.

reach eval SUITE.yaml --agent NAME[@VERSION]              run each case, print the table
reach eval SUITE.yaml --agent NAME --vs NAME@VERSION      the same suite on two versions
reach eval SUITE.yaml --agent NAME --json                 the table as JSON (for CI)

A suite is a YAML list of cases: {name, input, check, limits?, subject?, context?}. Each case
starts a run (one after another), waits for its end, and evaluates `check` over `answer`,
`end_reason`, `status`, `rounds`, `tokens` ({input, output}), `cost`, `ungrounded_claims` and
`receipts` (the run's tool calls: [{tool, status, data, error}]), e.g.
`end_reason == "answered" && answer.contains("42") && receipts.all(r, r.status == "succeeded")`.

Exit 0: every check held; 1: one did not (or could not be evaluated); 2: the suite or the
controller could not be used.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agent_reach_cli.agent_commands import ask, print_json
from agent_reach_cli.client_commands import add_client_flags
from agent_reach_cli.eval_report import Outcome, Side, as_json, table
from agent_reach_cli.failures import CommandError
from agent_reach_controller.planning.conditions import (
    ConditionError,
    compile_condition,
    evaluate_over,
)
from agent_reach_controller.tools.expressions import unknown_names

ENDED = frozenset({"succeeded", "failed", "cancelled"})
# What a check may read.
VARIABLES = frozenset(
    {
        "answer",
        "end_reason",
        "status",
        "rounds",
        "tokens",
        "cost",
        "ungrounded_claims",
        "receipts",
    }
)
# The step of a round that calls the model (services/runs.py MODEL_STEP): not a tool call.
MODEL_STEP = "model"
# The longest one request holds for a run to end (the server caps it too).
WAIT_STEP_S = 60.0


class Case(BaseModel):
    """One goal of a suite."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    input: str | list[dict[str, Any]]
    check: str = Field(min_length=1, description="CEL, true when the run did what it should")
    limits: dict[str, Any] | None = None
    subject: str | None = None
    context: dict[str, Any] | None = None


Suite = TypeAdapter(Annotated[list[Case], Field(min_length=1)])


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """An agent version a suite runs on; `pin`: name the version when starting runs (it is not
    the agent's current one)."""

    agent: str
    version: str
    pin: bool


def load_suite(path: str) -> list[Case]:
    """The suite's cases, each check compiled and reading only what a check is given."""
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if isinstance(document, dict) and set(document) == {"cases"}:
        document = document["cases"]
    try:
        cases = Suite.validate_python(document)
    except ValidationError as exc:
        said = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise CommandError(f"{path} is not a suite (a list of cases): {said}") from exc
    seen: set[str] = set()
    for case in cases:
        if case.name in seen:
            raise CommandError(f"{path}: two cases are named {case.name!r}")
        seen.add(case.name)
        try:
            compile_condition(case.check)
            problems = unknown_names(case.check, variables=VARIABLES).sentences(VARIABLES)
        except (ConditionError, ValueError) as exc:
            raise CommandError(f"{path}: case {case.name!r}: {exc}") from exc
        if problems:
            raise CommandError(f"{path}: case {case.name!r}: the check {problems[0]}")
    return cases


def target(given: str, args: argparse.Namespace) -> Target:
    """NAME or NAME@VERSION, against the agent the controller has."""
    name, _, version = given.partition("@")
    if not name:
        raise CommandError(f"{given!r}: name an agent (NAME or NAME@VERSION)")
    current = ask("GET", f"/v1/agents/{name}", args).json()["version"]
    return Target(agent=name, version=version or current, pin=bool(version) and version != current)


def _body(case: Case, on: Target) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": on.agent, "input": case.input}
    if on.pin:
        body["version"] = on.version
    for key in ("limits", "subject", "context"):
        if (value := getattr(case, key)) is not None:
            body[key] = value
    return body


def _ended(args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    """The run once it ended; cancelled (and read again) if it has not within --timeout."""
    until = time.monotonic() + args.timeout
    path = f"/v1/runs/{run['run_id']}"
    while run["status"] not in ENDED:
        left = until - time.monotonic()
        if left <= 0:
            ask("POST", f"{path}/cancel", args)
            return dict(ask("GET", path, args).json())
        wait = min(left, WAIT_STEP_S)
        run = ask("GET", path, args, params={"wait": wait}, wait=wait).json()
    return dict(ask("GET", path, args).json())  # with its rounds


def _receipts(args: argparse.Namespace, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's tool calls, round by round: {tool, status, data, error}."""
    found = []
    for round_ in run.get("rounds") or []:
        task = ask("GET", f"/v1/tasks/{round_['task_id']}", args).json()
        for step in task["steps"]:
            if step["step_id"] == MODEL_STEP:
                continue
            receipt = step.get("receipt") or {}
            found.append(
                {
                    "tool": step["tool"],
                    "status": step["status"],
                    "data": receipt.get("data"),
                    "error": receipt.get("error"),
                }
            )
    return found


def _checked(case: Case, variables: dict[str, Any]) -> tuple[bool, str | None]:
    try:
        held = evaluate_over(case.check, variables)
    except ConditionError as exc:
        return False, str(exc)
    if not isinstance(held, bool):
        return False, f"the check gave {type(held).__name__}, not bool"
    return held, None


def run_case(args: argparse.Namespace, case: Case, on: Target) -> Outcome:
    wait = min(args.timeout, WAIT_STEP_S)
    started = ask("POST", "/v1/runs", args, json=_body(case, on), params={"wait": wait}, wait=wait)
    run = _ended(args, started.json())
    receipts = _receipts(args, run)
    claims = run.get("ungrounded_claims") or []
    variables = {
        "answer": run.get("answer") or "",
        "end_reason": run.get("end_reason") or "",
        "status": run["status"],
        "rounds": run["round"],
        "tokens": {"input": run["tokens"]["input"], "output": run["tokens"]["output"]},
        "cost": float(run["cost"]),
        "ungrounded_claims": claims,
        "receipts": receipts,
    }
    passed, why = _checked(case, variables)
    return Outcome(
        case=case.name,
        run_id=run["run_id"],
        passed=passed,
        why=why,
        status=run["status"],
        end_reason=run.get("end_reason"),
        rounds=run["round"],
        input_tokens=run["tokens"]["input"],
        output_tokens=run["tokens"]["output"],
        cost=float(run["cost"]),
        ungrounded=bool(claims),
        tool_steps=len(receipts),
        tool_errors=sum(r["status"] == "failed" for r in receipts),
    )


def evaluate(args: argparse.Namespace) -> int:
    cases = load_suite(args.suite)
    targets = [target(args.agent, args)]
    if args.vs is not None:
        targets.append(target(args.vs, args))
    sides = [
        Side(agent=on.agent, version=on.version, outcomes=[run_case(args, c, on) for c in cases])
        for on in targets
    ]
    if args.json:
        print_json(as_json(args.suite, sides))
    else:
        print(table(args.suite, [c.name for c in cases], sides))
    return 0 if all(o.passed for side in sides for o in side.outcomes) else 1


def add_parser(sub: Any) -> None:
    """`reach eval`."""
    p = sub.add_parser(
        "eval",
        help="run a suite of goals on an agent (version) and print what it got done",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_client_flags(p)
    p.add_argument("suite", metavar="SUITE.yaml")
    p.add_argument("--agent", required=True, metavar="NAME[@VERSION]")
    p.add_argument("--vs", metavar="NAME@VERSION", help="the same suite on this version too")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long one case's run may take before it is cancelled (default 300)",
    )
    p.set_defaults(handler=evaluate)
