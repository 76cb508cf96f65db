"""Argument mapping: the model's arguments as the tool's downstream wants them.

A tool's `map_args` renames keys (`case: snake` or `camel` for every key at any depth, `rename`
for exact top-level names), fills `defaults` for missing top-level arguments and `coerce`s values
at dotted paths to `string`, `integer`, `number` or `boolean`. The model still sees and sends the
tool's `input_schema`; the stored `resolved_args` stay the model's (approvals, edits, caps and
replay read them), and the mapped arguments are what an executor is given. They are computed
when a step is queued, where a value that cannot be coerced fails the step (`invalid_arguments`)
and the queueing event shows the result, and again, identically, when it is handed out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from agent_reach_controller.tools.catalog import ArgMap

_CAMEL_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SNAKE_PART = re.compile(r"_+([a-zA-Z0-9])")
_INTEGER = re.compile(r"^[+-]?\d+$")


class ArgMapError(ValueError):
    """An argument that cannot be given to the tool as its map says (names the path)."""


def to_snake(name: str) -> str:
    return _CAMEL_HUMP.sub("_", name).lower()


def to_camel(name: str) -> str:
    head, *_ = name.split("_", 1)
    return head + _SNAKE_PART.sub(lambda m: m.group(1).upper(), name[len(head) :])


def apply(mapping: ArgMap | None, args: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as the tool is called with them; ArgMapError when a value cannot be
    coerced."""
    if mapping is None:
        return dict(args)
    convert = {"snake": to_snake, "camel": to_camel}.get(mapping.case or "")
    out: dict[str, Any] = {}
    for key, value in args.items():
        name = mapping.rename.get(key) or (convert(key) if convert else key)
        out[name] = _keys(value, convert) if convert else value
    for key, value in mapping.defaults.items():
        out.setdefault(key, value)
    for path, kind in mapping.coerce.items():
        _coerce_at(out, path.split("."), kind, path)
    return out


def _keys(value: Any, convert: Any) -> Any:
    if isinstance(value, Mapping):
        return {convert(k): _keys(v, convert) for k, v in value.items()}
    if isinstance(value, list):
        return [_keys(v, convert) for v in value]
    return value


def _coerce_at(node: Any, parts: list[str], kind: str, path: str) -> None:
    head, rest = parts[0], parts[1:]
    if not isinstance(node, dict) or head not in node:
        return  # nothing there to coerce (an optional argument left out)
    if rest:
        _coerce_at(node[head], rest, kind, path)
    else:
        node[head] = coerce(node[head], kind, path)


def coerce(value: Any, kind: str, path: str) -> Any:
    """`value` as a `kind`, or ArgMapError naming `path` (never the value: it may be long)."""
    if value is None:
        return None
    try:
        return _AS[kind](value)
    except (TypeError, ValueError):
        raise ArgMapError(f"argument {path} cannot be given as {kind}") from None


def _as_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise TypeError


def _as_boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    said = str(value).strip().lower() if isinstance(value, str) else None
    if said in _BOOLEANS:
        return _BOOLEANS[said]
    raise ValueError


def _as_integer(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER.match(value.strip()):
        return int(value.strip())
    raise ValueError


def _as_number(value: Any) -> int | float:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int | float):
        return value
    if not isinstance(value, str):
        raise TypeError
    text = value.strip()
    if _INTEGER.match(text):
        return int(text)
    number = float(text)
    if not math.isfinite(number):
        raise ValueError
    return number


_BOOLEANS = {"true": True, "false": False, "1": True, "0": False}
_AS: dict[str, Any] = {
    "string": _as_string,
    "boolean": _as_boolean,
    "integer": _as_integer,
    "number": _as_number,
}
