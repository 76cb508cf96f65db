"""Plans: parsing and validating submitted plans, references between steps, and conditions."""

from agent_reach_controller.planning.conditions import (
    CompiledCondition,
    ConditionError,
    compile_condition,
    evaluate,
)
from agent_reach_controller.planning.limits import PlanLimits
from agent_reach_controller.planning.plan import Plan, PlannedStep, parse_plan
from agent_reach_controller.planning.problems import PlanInvalidError, Problem, ProblemCode
from agent_reach_controller.planning.references import (
    Reference,
    UnresolvedReferenceError,
    find_references,
    resolve,
)
from agent_reach_controller.planning.schema import validate_resolved_args

__all__ = [
    "CompiledCondition",
    "ConditionError",
    "Plan",
    "PlanInvalidError",
    "PlanLimits",
    "PlannedStep",
    "Problem",
    "ProblemCode",
    "Reference",
    "UnresolvedReferenceError",
    "compile_condition",
    "evaluate",
    "find_references",
    "parse_plan",
    "resolve",
    "validate_resolved_args",
]
