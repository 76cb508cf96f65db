"""Parse and validate a submitted plan (steps or OpenAI tool calls): a Plan, or every problem."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import ValidationError

from agent_reach.errors import ErrorCode
from agent_reach_controller.domain.subjects import subject_problem
from agent_reach_controller.planning import (
    effects,
    fanout,
    grounding,
    sandbox,
    schedule,
    templates,
    verify,
)
from agent_reach_controller.planning.conditions import (
    ConditionError,
    compile_condition,
    name_problems,
)
from agent_reach_controller.planning.dialects import StepDraft, read_turn
from agent_reach_controller.planning.graph import Node, dependency_problems
from agent_reach_controller.planning.limits import (
    DEFAULT_LIMITS,
    PlanLimits,
    check_size,
    check_value,
)
from agent_reach_controller.planning.problems import (
    PlanInvalidError,
    Problem,
    ProblemCode,
    ProblemCollector,
    pointer_join,
)
from agent_reach_controller.planning.references import (
    STEP_ID_PATTERN,
    find_malformed_references,
    find_references,
    unescape,
)
from agent_reach_controller.planning.schema import schema_problems, validate_resolved_args
from agent_reach_controller.tools.agents import MODEL_CONNECTOR
from agent_reach_controller.tools.catalog import RetryPolicy, Timeouts, ToolCatalog, ToolSpec
from agent_reach_controller.tools.memory import is_memory_tool

__all__ = [
    "Plan",
    "PlanInvalidError",
    "PlannedStep",
    "Problem",
    "RefusedCall",
    "parse_plan",
    "validate_resolved_args",
]

P = ProblemCode


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedStep:
    """A validated step; `args` may still hold `$step.output` references."""

    step_id: str
    tool: str
    tool_version: str
    args: dict[str, Any]
    depends_on: tuple[str, ...]
    when: str | None
    position: int
    retry: RetryPolicy | None = None  # the tool's policy with this step's overrides
    timeouts: Timeouts | None = None  # the step's own timeouts, each replacing the tool's
    priority: int = 0  # higher is dispatched first; the plan's unless the step sets its own
    run_at: datetime | None = None  # not before this instant (UTC)
    delay_s: float | None = None  # not before this long after the task is accepted
    # The step whose idempotency key this one carries (a verified write's every try: its own).
    key_of: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RefusedCall:
    """A call of a model's turn refused before it ran: stored as a failed step, so that the model
    gets a reply for it and replay and audit see it. `tool_version` is "" when the tool is not in
    the catalogue."""

    step_id: str
    tool: str
    tool_version: str
    connector: str
    args: dict[str, Any]
    position: int
    pointer: str  # the call in the submitted body
    args_pointer: str  # its arguments
    problems: tuple[Problem, ...]

    @property
    def code(self) -> ErrorCode:
        """The receipt's error code, from the first problem."""
        return _REFUSAL_CODES.get(self.problems[0].code, ErrorCode.INVALID_ARGUMENTS)

    def reason(self) -> str:
        """Why, for the model: each problem, an argument's located inside the arguments."""
        said = []
        for p in self.problems:
            inner = p.pointer[len(self.args_pointer) :]
            at_arg = p.pointer.startswith(self.args_pointer + "/")
            said.append(f"at {inner}: {p.detail}" if at_arg else p.detail)
        return "refused before it ran: " + "; ".join(said)


_REFUSAL_CODES: dict[str, ErrorCode] = {
    P.UNKNOWN_TOOL: ErrorCode.TOOL_UNAVAILABLE,
    P.TOOL_DISABLED: ErrorCode.TOOL_UNAVAILABLE,
    P.FORBIDDEN: ErrorCode.FORBIDDEN,
    P.CAP_EXCEEDED: ErrorCode.CAP_EXCEEDED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A validated plan: steps in submission order, the task context and the submitted dialect."""

    goal: str | None
    steps: tuple[PlannedStep, ...]
    context: dict[str, Any]
    source: str  # the dialect's name (planning/dialects)
    refused: tuple[RefusedCall, ...] = ()
    webhook_url: str | None = None  # where the task's end is announced (checked by the API)
    deadline_s: float | None = None
    max_attempts: int | None = None
    # The most units of each class of side effects the task may use (see planning/effects.py).
    caps: dict[str, float] | None = None
    # The end user the task acts for (its caller's `subject`; a run's rounds: the run's).
    subject: str | None = None


def _check_ids(drafts: list[StepDraft], out: ProblemCollector) -> None:
    seen: dict[str, int] = {}
    for draft in drafts:
        sid, where = draft.step_id, draft.pointers["step_id"]
        if not STEP_ID_PATTERN.match(sid):
            out.add(where, P.INVALID_STEP_ID, f"{sid!r:.80} must match {STEP_ID_PATTERN.pattern}")
        if sid in seen:
            out.add(
                where, P.DUPLICATE_STEP_ID, f"step id {sid!r} is already used by step {seen[sid]}"
            )
        else:
            seen[sid] = draft.position


def _check_tool(
    draft: StepDraft, catalog: ToolCatalog, out: ProblemCollector, *, no_memory: bool
) -> ToolSpec | None:
    name = catalog.resolve_openai_name(draft.tool)
    spec = catalog.get(name) if name is not None else None
    if spec is None:
        out.add(draft.pointers["tool"], P.UNKNOWN_TOOL, f"no tool named {draft.tool!r:.130}")
        return None
    if not spec.enabled:
        out.add(draft.pointers["tool"], P.TOOL_DISABLED, f"tool {spec.name!r} is disabled")
        return None
    if spec.connector == MODEL_CONNECTOR:
        detail = f"{spec.name!r} is an agent's model: it is called by runs (POST /v1/runs) only"
        out.add(draft.pointers["tool"], P.UNKNOWN_TOOL, detail)
        return None
    if no_memory and is_memory_tool(spec):
        detail = (
            f"{spec.name!r} remembers for the task's subject, and this task names none: give "
            "`subject` (the end user it acts for), or use /v1/memory"
        )
        out.add(draft.pointers["tool"], P.FORBIDDEN, detail)
        return None
    return spec


def _check_subject(subject: str | None, how: _Reading, out: ProblemCollector) -> bool:
    """A subject is named by a task's caller: never in a trigger's template (its events come
    from outside, and what a plan's own arguments say is remembered as its caller's words), nor
    by a run's model (its run's caller named the run's). Returns whether memory's tools are
    refused: in a caller's plan that names no subject."""
    if subject is None:
        return how.outside_run
    if how.template:
        detail = "a trigger's template names no subject: its events are not its caller's words"
        out.add("/subject", P.RESERVED, detail)
    elif not how.outside_run:
        out.add("/subject", P.FORBIDDEN, "a model never names a subject: its run's caller does")
    else:
        wrong = subject_problem(subject)
        if wrong is not None:
            out.add("/subject", P.INVALID_TYPE, wrong)
    return False


def _check_references(
    draft: StepDraft, ids: set[str], out: ProblemCollector, *, template: bool
) -> list[str]:
    """Reference problems of a step; returns the pointers (relative to args) of all references
    (in a trigger's `template`, `$event` ones too: they are filled when it runs)."""
    assert draft.args is not None
    args_pointer, addressable = draft.pointers["args"], draft.args_addressable

    def add(inner: str, code: str, detail: str) -> None:
        if addressable:
            out.add(args_pointer + inner, code, detail)
        else:
            out.add(args_pointer, code, f"at {inner or '/'}: {detail}")

    malformed = find_malformed_references(draft.args)
    for bad in malformed:
        add(bad.pointer, P.INVALID_REFERENCE, bad.detail)
    refs = find_references(draft.args)
    for ref in refs:
        if ref.step_id not in ids:
            add(ref.pointer, P.UNKNOWN_REFERENCE, f"no step {ref.step_id!r} in the plan")
        elif ref.step_id not in draft.depends_on:
            detail = f"step {ref.step_id!r} is referenced but not listed in depends_on"
            add(ref.pointer, P.UNDECLARED_REFERENCE, detail)
    pointers = [r.pointer for r in refs] + [b.pointer for b in malformed]
    if template:
        events, bad_events = templates.references(draft.args)
        for problem in bad_events:
            add(problem.pointer, problem.code, problem.detail)
        pointers += [e.pointer for e in events] + [p.pointer for p in bad_events]
    return pointers


def _check_args(
    draft: StepDraft,
    spec: ToolSpec | None,
    *,
    ids: set[str],
    limits: PlanLimits,
    out: ProblemCollector,
    template: bool = False,
) -> None:
    if draft.args is None:
        return
    where = draft.pointers["args"]
    problems, within_depth = check_value(draft.args, pointer=where, limits=limits)
    if not draft.args_addressable:
        problems = [
            Problem(
                pointer=where,
                code=p.code,
                detail=f"at {p.pointer[len(where) :] or '/'}: {p.detail}",
            )
            for p in problems
        ]
    out.extend(problems)
    if not within_depth:
        return
    too_large = check_size(draft.args, pointer=where, limit=limits.max_args_bytes, what="args")
    if too_large is not None:
        out.extend([too_large])
        return
    references = _check_references(draft, ids, out, template=template)
    if spec is not None and not problems:
        out.extend(
            schema_problems(
                spec,
                unescape(draft.args),
                base=where,
                references=references,
                addressable=draft.args_addressable,
            )
        )


def _check_when(draft: StepDraft, ids: set[str], limits: PlanLimits, out: ProblemCollector) -> None:
    if draft.when is None:
        return
    where = draft.pointers["when"]
    if len(draft.when) > limits.max_condition_length:
        detail = f"condition of {len(draft.when):,} characters; the limit is "
        out.add(where, P.TOO_LARGE, detail + f"{limits.max_condition_length:,}")
        return
    try:
        compiled = compile_condition(draft.when)
    except ConditionError as exc:
        out.add(where, P.INVALID_CONDITION, str(exc))
        return
    for phrase in name_problems(compiled):
        out.add(where, P.INVALID_CONDITION, f"the condition {phrase}")
    for step_id in sorted(compiled.step_ids):
        if step_id not in ids:
            out.add(where, P.INVALID_CONDITION, f"the condition reads unknown step {step_id!r}")
        elif step_id not in draft.depends_on:
            detail = f"the condition reads step {step_id!r}, which is not in depends_on"
            out.add(where, P.INVALID_CONDITION, detail)


def _check_grounding(
    draft: StepDraft,
    spec: ToolSpec,
    context: Mapping[str, Any],
    out: ProblemCollector,
    *,
    template: bool,
) -> None:
    """Grounded arguments must come from the context or a reference (see planning/grounding);
    in a trigger's template, from the event too (a run puts it in the context)."""
    assert draft.args is not None
    where = draft.pointers["args"]
    args = draft.args
    if template:
        args = {k: v for k, v in args.items() if not templates.is_reference(v)}
    found = grounding.problems(spec.grounded, args, context, base=where)
    if not draft.args_addressable:  # a JSON string: point at it, the detail names the argument
        found = [Problem(pointer=where, code=p.code, detail=p.detail) for p in found]
    out.extend(found)


def _step_retry(
    draft: StepDraft, spec: ToolSpec | None, out: ProblemCollector
) -> RetryPolicy | None:
    """The tool's retry policy overridden field by field by the step's `retry`."""
    if draft.retry is None or spec is None:
        return None
    try:
        return RetryPolicy.model_validate({**spec.retry.model_dump(), **draft.retry})
    except ValidationError as exc:
        for error in exc.errors():
            where = pointer_join(f"{draft.base}/retry", *(str(t) for t in error["loc"]))
            code = P.UNKNOWN_FIELD if error["type"] == "extra_forbidden" else P.INVALID_TYPE
            out.add(where, code, error["msg"])
        return None


def _step_timeouts(draft: StepDraft, out: ProblemCollector) -> Timeouts | None:
    """The step's `timeouts` object, checked field by field."""
    if draft.timeouts is None:
        return None
    try:
        return Timeouts.model_validate(draft.timeouts)
    except ValidationError as exc:
        for error in exc.errors():
            where = pointer_join(f"{draft.base}/timeouts", *(str(t) for t in error["loc"]))
            code = P.UNKNOWN_FIELD if error["type"] == "extra_forbidden" else P.INVALID_TYPE
            out.add(where, code, error["msg"])
        return None


def _planned(
    draft: StepDraft,
    spec: ToolSpec,
    retry: RetryPolicy | None,
    timeouts: Timeouts | None,
    priority: int,
) -> PlannedStep:
    assert draft.step_id is not None
    assert draft.args is not None
    return PlannedStep(
        step_id=draft.step_id,
        tool=spec.name,
        tool_version=spec.version,
        args=draft.args,
        depends_on=tuple(dict.fromkeys(draft.depends_on)),
        when=draft.when,
        position=draft.position,
        retry=retry,
        timeouts=timeouts,
        priority=draft.priority if draft.priority is not None else priority,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Reading:
    """How a body is read: see `parse_plan` and `parse_template`."""

    limits: PlanLimits
    dialect: str | None
    atomic: bool
    permits: Callable[[str], bool] | None = None
    template: bool = False
    environment: str = "dev"  # where the task will run (planning/sandbox.py)
    grounds: Mapping[str, Any] | None = None  # what grounded arguments may come from
    outside_run: bool = False  # a caller's plan, not a run's model: memory tools need a subject


def parse_plan(  # noqa: PLR0913 - how to read the body, all by keyword
    body: Any,
    catalog: ToolCatalog,
    *,
    limits: PlanLimits = DEFAULT_LIMITS,
    dialect: str | None = None,
    atomic: bool = False,
    permits: Callable[[str], bool] | None = None,
    environment: str = "dev",
    grounds: Mapping[str, Any] | None = None,
    outside_run: bool = False,
) -> Plan:
    """Validate a submitted body (in `dialect`, or the one it is recognised as) into a Plan.

    Raises PlanInvalidError with every problem found (each with a JSON pointer into `body`).
    In a model's turn (not a plan, and not `atomic`) a problem of one call refuses only that
    call: it is in `Plan.refused`, to be stored as a failed step, and so is a call to a tool
    `permits` does not allow, or one `environment` refuses (planning/sandbox.py). Grounded
    arguments must appear in `grounds` (an agent run's input and what its model has read) when
    given, else in the body's context. `outside_run`: a caller's own plan, which may call the
    memory tools only when it names a `subject` (they act for it); a model's (not
    `outside_run`) may not name one.
    """
    how = _Reading(
        limits=limits,
        dialect=dialect,
        atomic=atomic,
        permits=permits,
        environment=environment,
        grounds=grounds,
        outside_run=outside_run,
    )
    return _parse(body, catalog, how)


def parse_template(body: Any, catalog: ToolCatalog, *, limits: PlanLimits = DEFAULT_LIMITS) -> Plan:
    """Validate a trigger's template: a plan whose step arguments and context may hold `$event`
    references (planning/templates.py), checked as far as they can be before an event fills
    them. Raises PlanInvalidError with every problem found."""
    how = _Reading(limits=limits, dialect="plan", atomic=True, template=True, outside_run=True)
    return _parse(body, catalog, how)


def _parse(body: Any, catalog: ToolCatalog, how: _Reading) -> Plan:
    limits, template, permits = how.limits, how.template, how.permits
    out = ProblemCollector(limits.max_problems)
    turn = read_turn(body, limits, out, dialect=how.dialect)
    if turn is None:
        raise PlanInvalidError(out.items)
    drafts, options = turn.drafts, turn.options
    timezone = _timezone(getattr(options, "timezone", None), out)
    _check_goal(turn.goal, limits, out)
    no_memory = _check_subject(options.subject, how, out)
    context = _check_context(options.context, limits, out)
    _check_ids(drafts, out)
    if template:
        _check_reserved(drafts, context, out)
    ids = {d.step_id for d in drafts}
    nodes = [
        Node(step_id=d.step_id, depends_on=tuple(d.depends_on), pointer=d.pointers["depends_on"])
        for d in drafts
    ]
    out.extend(dependency_problems(nodes))
    per_call = turn.dialect.per_call and not how.atomic
    checked: list[_Checked] = []
    for draft in drafts:
        sink = ProblemCollector(limits.max_problems) if per_call else out
        sink.extend(draft.problems)
        spec = _check_tool(draft, catalog, sink, no_memory=no_memory)
        _check_args(draft, spec, ids=ids, limits=limits, out=sink, template=template)
        _check_when(draft, ids, limits, sink)
        if spec is not None and spec.grounded and draft.args is not None:
            _check_grounding(draft, spec, how.grounds or context, sink, template=template)
        if spec is not None and spec.fan_out is not None and isinstance(draft.args, dict):
            sink.extend(fanout.problems(draft.step_id, spec, draft.args, draft.pointers["args"]))
        if per_call and spec is not None and permits is not None and not permits(spec.name):
            detail = f"you may not call tool {spec.name!r}"
            sink.add(draft.pointers["tool"], P.FORBIDDEN, detail)
        sink.extend(
            sandbox.problems(spec, catalog, how.environment, pointer=draft.pointers["tool"])
        )
        retry, timeouts = _step_retry(draft, spec, sink), _step_timeouts(draft, sink)
        when = _step_schedule(draft, timezone, sink)
        checked.append(_Checked(draft, spec, retry, timeouts, sink.items if per_call else [], when))
    if out.items:
        raise PlanInvalidError(out.items)
    steps = [
        replace(
            _planned(c.draft, c.spec, c.retry, c.timeouts, options.priority),
            run_at=c.schedule[0],
            delay_s=c.schedule[1],
        )
        for c in checked
        if c.spec is not None and not c.problems
    ]
    refused = {c.draft.step_id: c for c in checked if c.problems or c.spec is None}
    caps = options.caps or None
    if caps and steps:
        problems = _cap_problems(steps, drafts, catalog, caps)
        if problems and not per_call:
            raise PlanInvalidError(problems)
        over = {p.pointer for p in problems}
        for c in checked:
            if c.draft.base in over:
                c.problems.extend(p for p in problems if p.pointer == c.draft.base)
                refused[c.draft.step_id] = c
        steps = [s for s in steps if s.step_id not in refused]
    stored = verify.split(fanout.split(steps, catalog), catalog)
    _check_count(len(drafts), len(stored) + len(refused), limits, turn.calls_pointer)
    return Plan(
        goal=turn.goal,
        steps=tuple(stored),
        refused=tuple(_refusal(c) for c in checked if c.draft.step_id in refused),
        context=context,
        source=turn.dialect.name,
        deadline_s=options.deadline_seconds,
        max_attempts=options.budget.max_attempts if options.budget else None,
        caps=caps,
        webhook_url=options.webhook.url if options.webhook else None,
        subject=options.subject,
    )


def _check_count(written: int, stored: int, limits: PlanLimits, pointer: str) -> None:
    """`max_steps` holds for the steps stored: a fan-out's children and a verified write's halves
    count, or one short body could store thousands of steps."""
    if stored > limits.max_steps:
        noun = "step" if written == 1 else "steps"
        detail = f"{written:,} {noun} become {stored:,}; the limit is {limits.max_steps:,}"
        raise PlanInvalidError([Problem(pointer=pointer, code=P.TOO_LARGE, detail=detail)])


@dataclass(slots=True)
class _Checked:
    draft: StepDraft
    spec: ToolSpec | None
    retry: RetryPolicy | None
    timeouts: Timeouts | None
    problems: list[Problem]
    schedule: tuple[datetime | None, float | None] = (None, None)


def _timezone(name: str | None, out: ProblemCollector) -> ZoneInfo | None:
    if name is None:
        return None
    try:
        return schedule.zone(name)
    except schedule.ScheduleError as exc:
        out.add("/timezone", P.INVALID_TYPE, str(exc))
        return None


def _step_schedule(
    draft: StepDraft, timezone: ZoneInfo | None, out: ProblemCollector
) -> tuple[datetime | None, float | None]:
    """A step's `run_at` (an instant) or `delay` (seconds), checked."""
    if draft.run_at is not None and draft.delay is not None:
        out.add(f"{draft.base}/delay", P.INVALID_TYPE, "give 'run_at' or 'delay', not both")
        return None, None
    try:
        if draft.run_at is not None:
            when = schedule.run_at(draft.run_at, timezone)
            schedule.check_ahead(when, datetime.now(UTC))
            return when, None
        if draft.delay is not None:
            return None, schedule.delay(draft.delay)
    except schedule.ScheduleError as exc:
        field = "run_at" if draft.run_at is not None else "delay"
        out.add(f"{draft.base}/{field}", P.INVALID_TYPE, str(exc))
    return None, None


def _refusal(checked: _Checked) -> RefusedCall:
    draft, spec = checked.draft, checked.spec
    return RefusedCall(
        step_id=draft.step_id,
        tool=spec.name if spec is not None else draft.tool[:128],
        tool_version=spec.version if spec is not None else "",
        connector=spec.connector if spec is not None else "",
        args=draft.args or {},
        position=draft.position,
        pointer=draft.base,
        args_pointer=draft.pointers["args"],
        problems=tuple(checked.problems),
    )


def _check_reserved(
    drafts: list[StepDraft], context: dict[str, Any], out: ProblemCollector
) -> None:
    """A template leaves `event` and `trigger` to its runs: no step called `event`, no context
    entry of either."""
    for draft in drafts:
        if draft.step_id == templates.EVENT:
            detail = f"{templates.EVENT!r} is reserved in a trigger's template: it names the event"
            out.add(draft.pointers["step_id"], P.RESERVED, detail)
    for name in (templates.EVENT, templates.ORIGIN):
        if name in context:
            detail = f"{name!r} is reserved in a trigger's template: each run sets it"
            out.add(f"/context/{name}", P.RESERVED, detail)
    _, bad = templates.references(context, "/context")
    out.extend(bad)


def _check_goal(goal: str | None, limits: PlanLimits, out: ProblemCollector) -> None:
    if goal is not None and len(goal) > limits.max_goal_length:
        out.add(
            "/goal",
            P.TOO_LARGE,
            f"the goal is {len(goal):,} characters; the limit is {limits.max_goal_length:,}",
        )


def _check_context(
    context: dict[str, Any], limits: PlanLimits, out: ProblemCollector
) -> dict[str, Any]:
    """The task context, checked for numbers, strings, depth and size."""
    problems, within_depth = check_value(context, pointer="/context", limits=limits)
    out.extend(problems)
    if within_depth:
        size = check_size(
            context, pointer="/context", limit=limits.max_context_bytes, what="context"
        )
        if size is not None:
            out.extend([size])
    return context


def _cap_problems(
    steps: list[PlannedStep],
    drafts: list[StepDraft],
    catalog: ToolCatalog,
    caps: dict[str, float],
) -> list[Problem]:
    """Problems of the steps that must all run and already need more than a cap allows (each
    at its step's pointer)."""
    base = {d.step_id: d.base for d in drafts}
    return effects.cap_problems(
        [
            effects.StaticStep(
                step_id=step.step_id,
                pointer=base[step.step_id],
                depends_on=step.depends_on,
                conditional=step.when is not None,
                charges=_charges(catalog[step.tool], step.args),
            )
            for step in steps
        ],
        caps,
    )


def _charges(tool: ToolSpec, args: dict[str, Any]) -> dict[str, float]:
    """What a step is known to use of each cap at submit; a fan-out step's children's sum."""
    if tool.fan_out is None:
        return effects.known_charges(tool, args)
    total: dict[str, float] = {}
    for child in fanout.child_args(tool, args):
        for name, units in effects.known_charges(tool, child).items():
            total[name] = total.get(name, 0.0) + units
    return total
