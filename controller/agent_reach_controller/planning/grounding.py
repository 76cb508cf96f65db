"""Grounded arguments: values the model may not invent.

A tool lists arguments that must be grounded (`grounded: [to, amount]`). Each such argument's
value must either come from an earlier step's output (a `$step.output…` reference, resolved by
the controller, never typed by the model) or appear in the context the caller submitted (the
user's message, the ticket…): every string, number and nested scalar of the value must occur in
the context: a string as a case-insensitive substring of one of its values, a number as a whole
number written in one of them. The check runs before
anything is stored, so an invented account number never reaches a tool.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from agent_reach_controller.planning.problems import Problem, ProblemCode
from agent_reach_controller.planning.references import Reference, parse_reference, unescape


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _texts(context: Mapping[str, Any]) -> list[str]:
    return [
        str(leaf).casefold()
        for leaf in _leaves(dict(context))
        if isinstance(leaf, str | int | float) and not isinstance(leaf, bool)
    ]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _found(leaf: Any, texts: list[str]) -> bool:
    if leaf is None or isinstance(leaf, bool):
        return True  # nothing a model could invent that the context would show
    if isinstance(leaf, int | float):
        # A whole number of the context, not a digit inside one: 5 is not grounded by "500".
        return any(float(n) == leaf for text in texts for n in _NUMBER.findall(text))
    needle = str(leaf).strip().casefold()
    return bool(needle) and any(needle in text for text in texts)


def problems(
    grounded: list[str], args: Mapping[str, Any], context: Mapping[str, Any], *, base: str
) -> list[Problem]:
    """One problem per grounded argument whose value is neither referenced nor in the context."""
    texts = _texts(context)
    found = []
    for name in grounded:
        if name not in args:
            continue
        value = args[name]
        if isinstance(value, str) and isinstance(parse_reference(value), Reference):
            continue  # taken from an earlier step's output by the controller
        # The value as written: a `$` that escapes data is not part of it.
        missing = [leaf for leaf in _leaves(unescape(value)) if not _found(leaf, texts)]
        if missing:
            found.append(
                Problem(
                    pointer=f"{base}/{name}",
                    code=ProblemCode.UNGROUNDED_ARGUMENT,
                    detail=f"argument {name!r} must come from the submitted context or an "
                    f"earlier step's output; {str(missing[0])[:80]!r} appears in neither",
                )
            )
    return found
