"""Receipts: the standard result of a step, its projection, and its bounded model rendering."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_MIN_BUDGET = 64
_TRUNCATED: tuple[dict[str, Any], ...] = (
    {"truncated": True, "note": "output too large to show; ask for fewer fields"},
    {"truncated": True},
)
# Progressively smaller views of the data: (list items, string characters, keys per object, depth).
_LEVELS: tuple[tuple[int, int, int, int], ...] = (
    (5, 500, 50, 8),
    (5, 200, 30, 6),
    (3, 100, 20, 5),
    (2, 60, 10, 4),
    (1, 30, 5, 3),
    (1, 16, 3, 2),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptError:
    """What went wrong, classified: a stable code, a one-line message, and whether to retry."""

    code: str
    message: str
    retryable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptMeta:
    """Where the result came from: tool, step, attempts, timing, trace and environment."""

    tool: str
    step_id: str
    attempts: int
    duration_ms: int
    idempotency_key: str
    trace_id: str
    verified: bool | None = None
    fallback_for: str | None = None  # the tool that failed before this one answered
    environment: str | None = None  # where the step ran: dev, sandbox or prod


@dataclass(frozen=True, slots=True, kw_only=True)
class Receipt:
    """The outcome of one step as the caller and the model see it (ARCHITECTURE.md, "Retries
    and receipts")."""

    status: str
    data: Any = None
    error: ReceiptError | None = None
    meta: ReceiptMeta
    # A fan-out step's record: one row per child (target), whatever the step's outcome.
    targets: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of a receipt; `data` and `error` are left out when None."""
        out: dict[str, Any] = {"status": self.status}
        if self.data is not None:
            out["data"] = self.data
        if self.error is not None:
            out["error"] = {
                "code": self.error.code,
                "message": self.error.message,
                "retryable": self.error.retryable,
            }
        if self.targets is not None:
            out["targets"] = self.targets
        m = self.meta
        out["meta"] = {
            "tool": m.tool,
            "step_id": m.step_id,
            "attempts": m.attempts,
            "duration_ms": m.duration_ms,
            "idempotency_key": m.idempotency_key,
            "trace_id": m.trace_id,
            "verified": m.verified,
        }
        if m.fallback_for is not None:
            out["meta"]["fallback_for"] = m.fallback_for
        if m.environment is not None:
            out["meta"]["environment"] = m.environment
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Receipt:
        """A receipt from its `to_dict()` shape (e.g. as stored); missing meta fields default."""
        err = raw.get("error")
        meta = raw.get("meta") or {}
        return cls(
            status=str(raw.get("status", "")),
            data=raw.get("data"),
            error=ReceiptError(
                code=str(err.get("code", "internal")),
                message=str(err.get("message", "")),
                retryable=bool(err.get("retryable", False)),
            )
            if isinstance(err, Mapping)
            else None,
            targets=raw.get("targets"),
            meta=ReceiptMeta(
                tool=str(meta.get("tool", "")),
                step_id=str(meta.get("step_id", "")),
                attempts=int(meta.get("attempts", 0)),
                duration_ms=int(meta.get("duration_ms", 0)),
                idempotency_key=str(meta.get("idempotency_key", "")),
                trace_id=str(meta.get("trace_id", "")),
                verified=meta.get("verified"),
                fallback_for=meta.get("fallback_for"),
                environment=meta.get("environment"),
            ),
        )


_LEAF = None
_Tree = dict[str, Any]  # field name -> subtree, or _LEAF for "the whole value"


def _field_tree(fields: list[str]) -> _Tree:
    tree: _Tree = {}
    for path in fields:
        node: _Tree | None = tree
        parts = path.split(".")
        for i, part in enumerate(parts):
            if node is None:
                break  # a shorter path already keeps the whole value
            if i == len(parts) - 1:
                node[part] = _LEAF
            else:
                if part in node and node[part] is None:
                    break
                node = node.setdefault(part, {})
    return tree


_MISSING = object()


def _project(value: Any, tree: _Tree | None) -> Any:
    if tree is None:
        return value
    if isinstance(value, dict):
        kept = {k: _project(value[k], sub) for k, sub in tree.items() if k in value}
        return {k: v for k, v in kept.items() if v is not _MISSING}
    if isinstance(value, list):
        items = (_project(item, tree) for item in value)
        return [item for item in items if item is not _MISSING]
    return _MISSING


REDACTED = "[redacted]"


def _redact(value: Any, tree: _Tree | None) -> Any:
    if tree is None:
        return REDACTED
    if isinstance(value, dict):
        return {k: (_redact(v, tree[k]) if k in tree else v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(item, tree) for item in value]
    return value


def redact_output(output: Any, fields: list[str] | None) -> Any:
    """`output` with the value at each dotted path replaced by "[redacted]" (lists: every item).

    Used for what the model and callers are shown (receipts, the full-output handle); the stored
    output keeps the values, so a later step can still reference them without the model seeing
    them.
    """
    if not fields:
        return output
    return _redact(output, _field_tree(fields))


def project_output(output: Any, fields: list[str] | None) -> Any:
    """Keep only the dotted `fields` of `output`; None keeps everything.

    Objects are rebuilt with just the listed paths (missing paths are ignored). A path crossing a
    list applies to every element (`items.id` keeps the id of each item); segments are always keys,
    never list indexes. A scalar output has no fields and is returned unchanged.
    """
    if fields is None:
        return output
    projected = _project(output, _field_tree(fields))
    return output if projected is _MISSING else projected


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…(+{len(text) - limit:,} chars)"


_Level = tuple[int, int, int, int]


def _shrink_dict(value: dict[Any, Any], level: _Level, depth: int) -> Any:
    _items, chars, keys, max_depth = level
    if depth >= max_depth:
        return f"{{…{len(value):,} keys}}"
    out: dict[str, Any] = {}
    for key, item in list(value.items())[:keys]:
        name = base = _cut(str(key), chars)
        suffix = 2
        while name in out:  # cut keys may collide; never let one value overwrite another
            name, suffix = f"{base}#{suffix}", suffix + 1
        out[name] = _shrink(item, level, depth + 1)
    if len(value) > keys:
        out["…"] = f"first {keys} of {len(value):,} keys"
    return out


def _shrink_list(value: list[Any] | tuple[Any, ...], level: _Level, depth: int) -> Any:
    items, _chars, _keys, max_depth = level
    if depth >= max_depth:
        return f"[…{len(value):,} items]"
    kept = [_shrink(v, level, depth + 1) for v in value[:items]]
    if len(value) > items:
        kept.append(f"(first {items} of {len(value):,})")
    return kept


def _shrink(value: Any, level: _Level, depth: int = 0) -> Any:
    """A JSON-safe view of `value` bounded by `level`; NaN/Infinity become strings."""
    if isinstance(value, dict):
        return _shrink_dict(value, level, depth)
    if isinstance(value, list | tuple):
        return _shrink_list(value, level, depth)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return _cut(value if isinstance(value, str) else str(value), level[1])


def _dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _document(status: str, error: str | None, data: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"status": status}
    if error is not None:
        doc["error"] = error
    if data is not None:
        doc["data"] = data
    return doc


def _error_line(error: ReceiptError | None) -> str | None:
    if error is None:
        return None
    message = " ".join(error.message.split())  # one line, whatever the connector sent
    suffix = " (retryable)" if error.retryable else ""
    return f"{error.code}: {message}{suffix}"


def _fit_text(text: str, fits: Any) -> str | None:
    """The longest prefix cut of `text` (halving) for which fits(cut) holds, else None."""
    limit = len(text)
    while limit > 0:
        candidate = _cut(text, limit)
        if fits(candidate):
            return candidate
        limit //= 2
    return None


def render_for_model(receipt: Receipt, *, budget: int = 2000, handle: str | None = None) -> str:
    """A compact JSON string of at most `budget` characters: status, then error, then data.

    Long lists keep their first items plus a note ("first 5 of 1,204"), long strings are cut with
    an ellipsis marker, and views shrink until they fit; if no view fits, data becomes
    {"truncated": true, "note": ...}. When anything was left out and a `handle` is given, the
    document says where the full output is (`full_output`). Meta and stack traces are never
    included. Deterministic.
    """
    if budget < _MIN_BUDGET:
        raise ValueError(f"budget must be at least {_MIN_BUDGET} characters")
    status, error = receipt.status, _error_line(receipt.error)
    views: list[Any] = [None]
    if receipt.data is not None:
        views = [_shrink(receipt.data, level) for level in _LEVELS] + list(_TRUNCATED)
    for view in views:
        document = _document(status, error, view)
        if handle is not None and view is not None and view != receipt.data:
            document["full_output"] = handle  # where the caller can fetch what was left out
        text = _dump(document)
        if len(text) <= budget:
            return text
    if error is not None:  # a huge error message: cut it, then drop data if still too long
        for view in (views[-1], None):
            cut = _fit_text(error, lambda e, v=view: len(_dump(_document(status, e, v))) <= budget)
            if cut is not None:
                return _dump(_document(status, cut, view))
    cut_status = _fit_text(status, lambda s: len(_dump(_document(s, None, None))) <= budget)
    return _dump(_document(cut_status or "", None, None))


def output_handle(task_id: str, step_id: str) -> str:
    """Where a step's whole output is fetched (receipts cut for the model point here)."""
    return f"/v1/tasks/{task_id}/steps/{step_id}/output"


def render_receipt_dict(
    receipt: Mapping[str, Any], *, budget: int = 2000, handle: str | None = None
) -> str:
    """render_for_model for a receipt in its stored `to_dict()` shape."""
    return render_for_model(Receipt.from_dict(receipt), budget=budget, handle=handle)
