"""Request media types: a route that reads a JSON body refuses a body of any other type (415).

Without this a plan sent as `text/plain` (or with `curl -d`, form-urlencoded) was parsed as JSON
anyway on the routes that read the raw body, and refused with a misleading 422 ("should be a valid
dictionary") on the routes FastAPI parses. A body without a Content-Type is refused too: FastAPI
already declines to parse one as JSON, and guessing would accept what the caller did not declare.
A request without a body is left to the route (a missing body is the route's 400 or 422).
"""

from __future__ import annotations

from email.message import Message

from fastapi import Request, params
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

JSON = "application/json"


def is_json(content_type: str) -> bool:
    """`application/json` or a structured-syntax `application/*+json` (RFC 6839), any parameters."""
    plain = content_type.partition(";")[0].strip().lower()
    if plain == JSON:  # what nearly every request sends: no parsing on the hot path
        return True
    message = Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def reads_json(route: object) -> bool:
    """Whether a route's body can only be JSON.

    A route that reads the raw body declares what it accepts in `openapi_extra` (the submit route:
    JSON; the tools import: YAML or JSON, left to the route); one with a model body is JSON unless
    the body is a form.
    """
    if not isinstance(route, APIRoute):
        return False
    declared = ((route.openapi_extra or {}).get("requestBody") or {}).get("content")
    if declared:
        return all(is_json(media_type) for media_type in declared)
    body = route.body_field
    return body is not None and not isinstance(body.field_info, params.Form)


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in request.headers


async def require_json_body(request: Request) -> None:
    """A dependency: 415 when the route reads JSON and the request's body is declared otherwise.

    Raised as an HTTPException so that the app's one handler for them answers problem+json with
    the code `unsupported_media_type`.
    """
    if not _has_body(request) or not reads_json(request.scope.get("route")):
        return
    content_type = request.headers.get("content-type", "").strip()
    if content_type and is_json(content_type):
        return
    expected = f"send Content-Type: {JSON} (or an application/*+json type)"
    got = f"the body is {content_type!r}" if content_type else "the body has no Content-Type"
    raise StarletteHTTPException(415, detail=f"{got}; this route reads JSON: {expected}")
