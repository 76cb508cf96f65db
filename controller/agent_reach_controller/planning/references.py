"""Whole-string `$<step_id>.output[.path]` references in step arguments: finding and resolving them.

Grammar. A string value is a reference when it starts with a single `$`, then a step id, then
`.output` as a whole word, optionally followed by `.<segment>` parts (integer segments index lists,
other segments are mapping keys; keys containing '.' cannot be addressed). `$$` at the start
escapes a literal `$` (`"$$5"` -> `"$5"`). Data is never a reference: a model's arguments and the
values an event fills into a template are `escape`d when read, so `resolve` gives back their
very bytes. Strings that start with `$` but are not of the form
`$<something>.output...` (`"$5"`, `"$HOME"`) are ordinary strings and stay as they are; strings of
that form that are malformed (`"$.output"`, `"$a.output..x"`, `"$a.output[0]"`) are reported.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agent_reach_controller.planning.problems import pointer_join

STEP_ID_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")
_CANDIDATE = re.compile(r"^\$(?!\$)(?P<step>[^.]*)\.output(?![A-Za-z0-9_])(?P<rest>.*)$", re.DOTALL)
_PATH = re.compile(r"^(?:\.[^.]+)+$", re.DOTALL)
_INDEX = re.compile(r"^(?:0|[1-9][0-9]*)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Reference:
    """A well-formed reference at `pointer` (relative to the args root)."""

    pointer: str
    step_id: str
    path: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MalformedReference:
    """A string that looks like a reference but does not follow the grammar."""

    pointer: str
    text: str
    detail: str


class UnresolvedReferenceError(Exception):
    """A reference could not be resolved against the recorded outputs."""

    def __init__(self, pointer: str, detail: str) -> None:
        super().__init__(f"{pointer or '/'}: {detail}")
        self.pointer = pointer
        self.detail = detail


def parse_reference(text: str, *, pointer: str = "") -> Reference | MalformedReference | None:
    """Classify one string: a Reference, a MalformedReference, or None for an ordinary string."""
    match = _CANDIDATE.match(text)
    if match is None:
        return None
    step_id, rest = match.group("step"), match.group("rest")
    if not STEP_ID_PATTERN.match(step_id):
        detail = f"{text!r}: {step_id!r} is not a valid step id (expected $<step_id>.output[.path])"
        return MalformedReference(pointer=pointer, text=text, detail=detail)
    if rest and not _PATH.match(rest):
        detail = f"{text!r}: the path after .output must be .key or .index parts, e.g. .items.0.id"
        return MalformedReference(pointer=pointer, text=text, detail=detail)
    return Reference(pointer=pointer, step_id=step_id, path=tuple(rest.split(".")[1:]))


def _strings(value: Any, pointer: str = "") -> Iterator[tuple[str, str]]:
    """Every string value (not keys) with its pointer, depth first, without recursion limits."""
    stack: list[tuple[Any, str]] = [(value, pointer)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            stack.extend((v, pointer_join(where, k)) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((v, pointer_join(where, i)) for i, v in reversed(list(enumerate(item))))


def find_references(args: Any) -> list[Reference]:
    """Every well-formed reference in `args`, in document order."""
    found = (parse_reference(text, pointer=where) for where, text in _strings(args))
    return [ref for ref in found if isinstance(ref, Reference)]


def find_malformed_references(args: Any) -> list[MalformedReference]:
    """Every string in `args` that looks like a reference but is malformed, in document order."""
    found = (parse_reference(text, pointer=where) for where, text in _strings(args))
    return [ref for ref in found if isinstance(ref, MalformedReference)]


def _step(value: Any, segment: str, trail: str) -> Any:
    if isinstance(value, dict):
        if segment not in value:
            keys = ", ".join(sorted(str(k) for k in value)[:10]) or "none"
            raise LookupError(f"key {segment!r} is missing at {trail} (keys: {keys})")
        return value[segment]
    if isinstance(value, list):
        if not _INDEX.match(segment):
            raise LookupError(f"{trail} is a list; {segment!r} is not an index")
        index = int(segment)
        if index >= len(value):
            raise LookupError(f"index {index} is out of range at {trail} (length {len(value)})")
        return value[index]
    kind = "null" if value is None else type(value).__name__
    raise LookupError(f"{trail} is a {kind}; it has no key {segment!r}")


def follow(value: Any, path: tuple[str, ...], trail: str) -> Any:
    """The part of `value` at `path`; LookupError saying which part is missing (`trail` names
    `value` in that sentence)."""
    for segment in path:
        value = _step(value, segment, trail)
        trail = f"{trail}.{segment}"
    return value


def _lookup(ref: Reference, outputs: Mapping[str, Any]) -> Any:
    if ref.step_id not in outputs:
        raise UnresolvedReferenceError(ref.pointer, f"no output recorded for step {ref.step_id!r}")
    try:
        return follow(outputs[ref.step_id], ref.path, f"${ref.step_id}.output")
    except LookupError as exc:
        raise UnresolvedReferenceError(ref.pointer, str(exc.args[0])) from None


def transform(value: Any, on_string: Callable[[str, str], Any], pointer: str = "") -> Any:
    if isinstance(value, str):
        return on_string(value, pointer)
    if isinstance(value, dict):
        return {k: transform(v, on_string, pointer_join(pointer, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [transform(v, on_string, pointer_join(pointer, i)) for i, v in enumerate(value)]
    return value


def resolve(args: Any, outputs: Mapping[str, Any]) -> Any:
    """A copy of `args` with references replaced by outputs and `$$` escapes unescaped.

    Raises UnresolvedReferenceError (with the pointer and the exact missing key) when a step has
    no recorded output, a path does not exist, or a reference is malformed. `args` is not changed.
    """

    def on_string(text: str, pointer: str) -> Any:
        if text.startswith("$$"):
            return text[1:]
        ref = parse_reference(text, pointer=pointer)
        if isinstance(ref, MalformedReference):
            raise UnresolvedReferenceError(pointer, ref.detail)
        if ref is None:
            return text
        return _lookup(ref, outputs)

    return transform(args, on_string)


def escape(data: Any) -> Any:
    """A copy of `data` that no reading takes for a reference, at any depth: each string that
    starts with `$` gets one more (`resolve` and `unescape` take it off again)."""
    return transform(data, lambda text, _pointer: "$" + text if text.startswith("$") else text)


def unescape(args: Any) -> Any:
    """A copy of `args` with `$$` escapes unescaped and references left in place."""
    return transform(args, lambda text, _pointer: text[1:] if text.startswith("$$") else text)
