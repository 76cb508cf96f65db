"""RFC 9457 problem details: every error the API returns has this shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse

PROBLEM_MEDIA_TYPE = "application/problem+json"


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
