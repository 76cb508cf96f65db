"""The plan dialect: steps with ids, dependencies, conditions and `$step.output` references.

A plan is all or nothing: a problem in any step refuses the whole plan, since its steps depend
on one another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from agent_reach_controller.planning.dialects.base import (
    PRIORITY_RANGE,
    Answer,
    Dialect,
    Options,
    StepDraft,
)
from agent_reach_controller.planning.problems import ProblemCollector
from agent_reach_controller.tools.catalog import DURATION_SCHEMA


class PlanStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step_id: str = Field(description="Unique within the plan", examples=["weather"])
    tool: str = Field(description="Tool name", examples=["weather.forecast"])
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments; a whole string `$<step_id>.output[.path]` is replaced by that "
        "step's output",
    )
    depends_on: list[str] = Field(default_factory=list)
    when: str | None = Field(None, description="CEL condition over `steps` and `context`")
    retry: dict[str, Any] | None = Field(
        None, description="Overrides of the tool's retry policy for this step, field by field"
    )
    timeouts: dict[str, Any] | None = Field(
        None,
        description="This step's own timeouts, each replacing the tool's: `timeout`, "
        '`schedule_to_start`, `schedule_to_close`, `heartbeat`, each seconds or e.g. "30s"',
    )
    priority: int | None = Field(
        None,
        ge=PRIORITY_RANGE[0],
        le=PRIORITY_RANGE[1],
        description="Dispatch priority (higher first); default the plan's",
    )
    run_at: str | None = Field(
        None,
        description="Run no earlier than this: RFC 3339 with an offset, or a local time in the "
        "plan's `timezone` (a time skipped by a DST change moves forward; a repeated one is its "
        "first occurrence)",
        examples=["2026-12-03T08:00:00+08:00", "2026-12-03T08:00"],
    )
    delay: Annotated[Any, WithJsonSchema(DURATION_SCHEMA)] = Field(
        None, description="Run no earlier than this long after the task is accepted"
    )


class PlanSubmission(Options):
    """A plan: steps that may depend on one another, run as their dependencies allow."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    goal: str | None = Field(None, description="What the plan is for (shown with the task)")
    timezone: str | None = Field(
        None,
        description="The IANA time zone of local `run_at` times",
        examples=["Asia/Shanghai"],
    )
    steps: list[PlanStep] = Field(min_length=1)


class PlanDialect(Dialect):
    name = "plan"
    body = PlanSubmission
    calls = "steps"
    per_call = False
    call_noun = "step"

    def recognises(self, body: dict[str, Any]) -> bool:
        return "steps" in body

    def goal(self, model: Any) -> str | None:
        goal: str | None = model.goal
        return goal

    def drafts(self, model: Any, *, prefix: str, out: ProblemCollector) -> list[StepDraft]:
        drafts = []
        for position, step in enumerate(model.steps):
            base = f"/steps/{position}"
            drafts.append(
                StepDraft(
                    position=position,
                    base=base,
                    step_id=step.step_id,
                    tool=step.tool,
                    args=step.args,
                    depends_on=step.depends_on,
                    when=step.when,
                    retry=step.retry,
                    timeouts=step.timeouts,
                    priority=step.priority,
                    run_at=step.run_at,
                    delay=step.delay,
                    pointers={k: f"{base}/{k}" for k in PlanStep.model_fields},
                )
            )
        return drafts

    def replies(self, answers: Sequence[Answer]) -> list[dict[str, Any]]:
        return []  # a plan's caller reads receipts, not a conversation
