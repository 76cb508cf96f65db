"""Arguments against a tool's JSON Schema: at submit (references excused) and after resolution."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from agent_reach_controller.planning.problems import Problem, ProblemCode, pointer_join
from agent_reach_controller.tools.catalog import ToolSpec

_MAX_DETAIL = 300
_CACHE_SIZE = 1024
_validators: dict[tuple[str, str, bool], Draft202012Validator] = {}


def validator_for(tool: ToolSpec, *, child: bool = False) -> Draft202012Validator:
    """The validator of a tool's input schema (or of its fan-out children's), cached per (name,
    version)."""
    key = (tool.name, tool.version, child)
    validator = _validators.get(key)
    if validator is None:
        if len(_validators) >= _CACHE_SIZE:
            _validators.clear()
        schema = tool.child_schema if child else tool.input_schema
        validator = _validators[key] = Draft202012Validator(schema)
    return validator


def _pointer_of(error: ValidationError) -> str:
    return pointer_join("", *error.absolute_path)


def _under(pointer: str, references: frozenset[str]) -> bool:
    """Whether `pointer` is a reference or lies inside one (a reference on the path to it)."""
    return any(pointer == ref or pointer.startswith(ref + "/") for ref in references)


def _excused(error: ValidationError, references: frozenset[str]) -> bool:
    """Whether the error may vanish once references are resolved.

    `required` errors never are. An error at (or below) a reference is. An anyOf/oneOf failure is
    when one of its branches fails only because of references.
    """
    if error.validator == "required":
        return False
    if _under(_pointer_of(error), references):
        return True
    if error.validator in ("anyOf", "oneOf") and error.context:
        branches: dict[Any, list[ValidationError]] = defaultdict(list)
        for sub in error.context:
            branches[sub.relative_schema_path[0]].append(sub)
        return any(all(_excused(e, references) for e in errs) for errs in branches.values())
    return False


def _detail(error: ValidationError) -> str:
    message = error.message
    return message if len(message) <= _MAX_DETAIL else message[: _MAX_DETAIL - 1] + "…"


def schema_problems(
    tool: ToolSpec,
    args: Any,
    *,
    base: str,
    references: Iterable[str] = (),
    addressable: bool = True,
    child: bool = False,
) -> list[Problem]:
    """invalid_arguments problems of `args`; pointers are `base` + the error's instance path.

    Errors at or below the pointers in `references` (relative to args) are excused. When the args
    are not addressable by pointer (an OpenAI `arguments` JSON string), the inner path goes into
    the detail instead.
    """
    refs = frozenset(references)
    errors = sorted(validator_for(tool, child=child).iter_errors(args), key=_pointer_of)
    problems: list[Problem] = []
    for error in errors:
        if _excused(error, refs):
            continue
        inner = _pointer_of(error)
        if addressable:
            problems.append(
                Problem(
                    pointer=base + inner, code=ProblemCode.INVALID_ARGUMENTS, detail=_detail(error)
                )
            )
        else:
            detail = f"at {inner or '/'}: {_detail(error)}"
            problems.append(
                Problem(pointer=base, code=ProblemCode.INVALID_ARGUMENTS, detail=detail)
            )
    return problems


def validate_resolved_args(tool: ToolSpec, args: Any, *, child: bool = False) -> list[Problem]:
    """Dispatch-time check of resolved arguments (`child`: of a fan-out step's child); pointers
    are relative to `/args`."""
    return schema_problems(tool, args, base="/args", child=child)
