"""`@tool`: a Python function as a tool, its JSON Schema read from its signature and type hints.

    from agent_reach_connectors import tool

    @tool(risk="write", idempotent=True, timeout="10s")
    def refund(order_id: Annotated[str, Field(description="The order")], cents: int) -> dict:
        '''Refund part of an order.'''

The function is unchanged; it gains a description of itself (`tool_of`). `reach tools
import-python MODULE` reads the decorated functions of a module into the catalogue as tools of
the `python` connector, so the controller never imports the code: it stores the definition (the
schema pydantic derives from the hints, the first paragraph of the docstring as the description,
and any other tool field given to `@tool`). On the executor the `python` connector validates each
call's arguments with the same hints (`pydantic.validate_call`), so the function gets the types it
declared (a `datetime` from an RFC 3339 string, a model from an object).

pydantic does both halves: `TypeAdapter(function).json_schema()` is its public JSON Schema of a
call's arguments, and `generate_arguments_schema` (pydantic.experimental, pinned with the rest of
pydantic) validates arguments without calling, so an error raised inside the function is never
mistaken for bad arguments.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar, cast, overload

from pydantic import TypeAdapter, ValidationError
from pydantic.experimental.arguments_schema import generate_arguments_schema
from pydantic_core import ArgsKwargs, SchemaValidator

F = TypeVar("F", bound=Callable[..., Any])
_ATTR = "__agent_reach_tool__"


@dataclass(frozen=True, slots=True)
class PythonTool:
    """What `@tool` learnt of a function: its tool definition, and how to check a call."""

    name: str
    function: str  # "package.module:qualname", as the python connector's config names it
    description: str
    input_schema: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)  # other tool fields (risk, timeout…)
    validator: SchemaValidator | None = field(default=None, compare=False, repr=False)

    def definition(self) -> dict[str, Any]:
        """The tool as a tools file holds it."""
        return {
            "name": self.name,
            "description": self.description,
            "connector": "python",
            "config": {"function": self.function},
            "input_schema": self.input_schema,
            **self.options,
        }

    def arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        """`args` converted to the declared types; `ValidationError` when they do not fit."""
        assert self.validator is not None
        _, kwargs = self.validator.validate_python(ArgsKwargs((), args))
        return dict(kwargs)


@overload
def tool(function: F, /) -> F: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, **options: Any
) -> Callable[[F], F]: ...


def tool(
    function: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    **options: Any,
) -> F | Callable[[F], F]:
    """Mark `function` as a tool (bare, or with the tool's name, description and other fields)."""

    def mark(target: F) -> F:
        setattr(target, _ATTR, _describe(target, name, description, options))
        return target

    return mark(function) if function is not None else mark


def tool_of(function: Any) -> PythonTool | None:
    """What `@tool` recorded on `function`; None for any other callable."""
    found = getattr(function, _ATTR, None)
    return found if isinstance(found, PythonTool) else None


def tools_in(module: ModuleType) -> list[PythonTool]:
    """The `@tool` functions defined in `module`, in source order."""
    found = [tool_of(value) for value in vars(module).values()]
    mine = [t for t in found if t is not None and t.function.startswith(f"{module.__name__}:")]
    return sorted(mine, key=lambda t: t.function)


def _describe(
    function: Callable[..., Any], name: str | None, description: str | None, options: Any
) -> PythonTool:
    where = f"{function.__module__}:{function.__qualname__}"
    if "<locals>" in function.__qualname__:
        raise TypeError(f"@tool: {where} is not importable by path; define it at module level")
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"@tool: {where} takes *{parameter.name}; name every argument")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(f"@tool: {where}: {parameter.name} is positional-only")
    said = description or (inspect.getdoc(function) or "").split("\n\n")[0].strip()
    if not said:
        raise TypeError(f"@tool: {where} needs a docstring or description=: the model reads it")
    for reserved in ("connector", "config", "input_schema"):
        if reserved in options:
            raise TypeError(f"@tool: {reserved} is set by @tool itself")
    return PythonTool(
        name=name or function.__name__,
        function=where,
        description=" ".join(said.split()),
        input_schema=_without_titles(TypeAdapter(cast(Any, function)).json_schema()),
        options=dict(options),
        validator=SchemaValidator(generate_arguments_schema(function)),
    )


def _without_titles(schema: Any, *, names: bool = False) -> Any:
    """The schema without pydantic's generated `title`s (noise to a model); `names`: `schema`
    is a map of property or definition names, whose keys are not keywords."""
    if isinstance(schema, list):
        return [_without_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if not names and key == "title" and isinstance(value, str):
            continue
        out[key] = _without_titles(value, names=not names and key in ("properties", "$defs"))
    return out


__all__ = ["PythonTool", "ValidationError", "tool", "tool_of", "tools_in"]
