"""RFC 9457 problem details: every error the API returns has this shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

PROBLEM_MEDIA_TYPE = "application/problem+json"


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these statuses: each is problem+json (never application/json)."""
    schema = {"$ref": "#/components/schemas/Problem"}  # added by api/openapi.py
    return {code: {"content": {PROBLEM_MEDIA_TYPE: {"schema": schema}}} for code in codes}


# Any /v1 route: no or a bad key (401), roles that do not allow it (403), a request that does not
# validate (422), storage down (503).
V1_PROBLEMS = problem_responses(401, 403, 422, 503)


def problem_response(
    status: int,
    *,
    code: str,
    title: str,
    detail: str,
    errors: Sequence[dict[str, Any]] = (),
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """A problem+json response; `errors` lists each problem with a JSON pointer."""
    body: dict[str, Any] = {
        "type": f"urn:agent-reach:problem:{code}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if errors:
        body["errors"] = list(errors)
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def pointer_from_loc(loc: Sequence[str | int]) -> str:
    """A FastAPI error location → an RFC 6901 pointer (`query`, `body` prefixes kept)."""
    tokens = [str(t).replace("~", "~0").replace("/", "~1") for t in loc]
    return "/" + "/".join(tokens) if tokens else ""


async def single_query_values(request: Request) -> None:
    """Every query parameter of this API is one value: `?a=1&a=2` is a 422, not "the last wins".

    The console's pages check their own queries, after signing in, and answer with a page
    (api/console/query.py).
    """
    if request.url.path == "/console" or request.url.path.startswith("/console/"):
        return
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name in seen:
            raise RequestValidationError(
                [{"loc": ("query", name), "type": "repeated", "msg": "given more than once"}]
            )
        seen.add(name)
