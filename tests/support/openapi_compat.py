"""What a new OpenAPI document breaks for clients generated from an older one.

Breaking, within a major version: an operation removed; a field removed from a request body or
a response; a value removed from an enum; a request field newly required; a field's type
changed. Additions are not breaking. `$ref`s are followed (a ref that does not resolve is
compared by name only).
"""

from __future__ import annotations

from typing import Any

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def _resolve(doc: dict[str, Any], schema: Any, seen: frozenset[str] = frozenset()) -> Any:
    while isinstance(schema, dict) and "$ref" in schema:
        ref = schema["$ref"]
        if ref in seen or not ref.startswith("#/"):
            return {}
        seen = seen | {ref}
        target: Any = doc
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        if target is None:
            return {}
        schema = target
    return schema


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, list):
        return set(kind)
    return {kind} if isinstance(kind, str) else set()


def _compare(
    where: str,
    old_doc: dict[str, Any],
    old: Any,
    new_doc: dict[str, Any],
    new: Any,
    *,
    request: bool,
    problems: list[str],
    depth: int = 0,
) -> None:
    old, new = _resolve(old_doc, old), _resolve(new_doc, new)
    if not isinstance(old, dict) or not isinstance(new, dict) or depth > 12:
        return
    old_types, new_types = _types(old), _types(new)
    if old_types and new_types and not old_types <= new_types:
        problems.append(f"{where}: type {sorted(old_types)} became {sorted(new_types)}")
    if "enum" in old and "enum" in new:
        for value in old["enum"]:
            if value not in new["enum"]:
                problems.append(f"{where}: enum value {value!r} removed")
    old_props, new_props = old.get("properties", {}), new.get("properties", {})
    for name, old_prop in old_props.items():
        if name not in new_props:
            # A response without it breaks readers; a request without it, only senders whose
            # field is now refused.
            if not request or new.get("additionalProperties") is False:
                problems.append(f"{where}.{name}: field removed")
            continue
        _compare(
            f"{where}.{name}",
            old_doc,
            old_prop,
            new_doc,
            new_props[name],
            request=request,
            problems=problems,
            depth=depth + 1,
        )
    if request:
        for name in set(new.get("required", ())) - set(old.get("required", ())):
            problems.append(f"{where}.{name}: newly required")
    if "items" in old and "items" in new:
        _compare(
            f"{where}[]",
            old_doc,
            old["items"],
            new_doc,
            new["items"],
            request=request,
            problems=problems,
            depth=depth + 1,
        )


def _json_schema(body: dict[str, Any] | None) -> Any:
    content = (body or {}).get("content", {})
    return content.get("application/json", {}).get("schema")


def breaking_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every change from `old` to `new` that breaks a client generated from `old`."""
    problems: list[str] = []
    for path, old_item in old.get("paths", {}).items():
        new_item = new.get("paths", {}).get(path)
        for method in METHODS:
            if method not in old_item:
                continue
            operation = f"{method.upper()} {path}"
            if new_item is None or method not in new_item:
                problems.append(f"{operation}: operation removed")
                continue
            old_op, new_op = old_item[method], new_item[method]
            old_params = {(p.get("in"), p.get("name")): p for p in old_op.get("parameters", ())}
            new_params = {(p.get("in"), p.get("name")): p for p in new_op.get("parameters", ())}
            for key, param in new_params.items():
                if param.get("required") and not old_params.get(key, {}).get("required"):
                    problems.append(f"{operation}: parameter {key[1]} ({key[0]}) newly required")
            old_body = _json_schema(_resolve(old, old_op.get("requestBody")))
            new_body = _json_schema(_resolve(new, new_op.get("requestBody")))
            if old_body is not None and new_body is not None:
                _compare(
                    f"{operation} body",
                    old,
                    old_body,
                    new,
                    new_body,
                    request=True,
                    problems=problems,
                )
            for status, old_response in old_op.get("responses", {}).items():
                if not str(status).startswith("2"):
                    continue
                new_response = new_op.get("responses", {}).get(status)
                if new_response is None:
                    problems.append(f"{operation}: response {status} removed")
                    continue
                old_schema = _json_schema(_resolve(old, old_response))
                new_schema = _json_schema(_resolve(new, new_response))
                if old_schema is not None and new_schema is not None:
                    _compare(
                        f"{operation} {status}",
                        old,
                        old_schema,
                        new,
                        new_schema,
                        request=False,
                        problems=problems,
                    )
    return problems
