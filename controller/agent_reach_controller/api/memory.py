"""Long-term memory over HTTP: a tenant's subjects, their entries, search, write, patch, delete.

Always the caller's tenant: another tenant's entry answers 404, as one that does not exist, and
another tenant's subject of the same name is a different subject. A subject (the end user a run
acts for) may hold any character but controls, "/" too, so it is a query parameter or a body
field, never a path segment. Reading needs `memory_read`, writing and patching `memory_write`,
deleting `memory_forget` (identity/policy.py). A caller writes with origin `user`; a patch may
set the origin of an entry a tool's output planted to `user` (a person confirms it).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent_reach_controller.api.auth import Caller, require
from agent_reach_controller.api.problems import V1_PROBLEMS, problem_responses
from agent_reach_controller.api.schemas import Instant, Rfc3339
from agent_reach_controller.api.tasks import Deps
from agent_reach_controller.decide.memory import MAX_KEY, MAX_TEXT, TYPES, Problem
from agent_reach_controller.domain.records import MemoryOrigin, MemoryRow
from agent_reach_controller.domain.subjects import MAX_SUBJECT
from agent_reach_controller.identity.policy import Action
from agent_reach_controller.services.memory import (
    Entry,
    MemoryConflictError,
    MemoryInputError,
    Writer,
)

router = APIRouter(prefix="/v1/memory", tags=["memory"], responses=V1_PROBLEMS)

TYPES_TEXT = ", ".join(TYPES)
# The longest search query read (its first words are what count: decide/memory.py `terms`).
MAX_QUERY = 2000
# What decide/memory.py lets a subject be (no control characters); a NUL no database takes.
SUBJECT_PATTERN = r"^[^\x00-\x1f\x7f]+$"
SubjectQuery = Annotated[
    str,
    Query(
        min_length=1,
        max_length=MAX_SUBJECT,
        pattern=SUBJECT_PATTERN,
        description="The end user the memories are of",
    ),
]
MemoryId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9A-Za-z_-]+$")]
IfMatch = Annotated[
    str | None,
    Header(description="Only if the memory is still at this version (its ETag)", max_length=32),
]


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _optional(**kw: Any) -> Any:
    """A patch field: absent leaves it as it is; it is not nullable unless its type says so."""
    return Field(default=None, json_schema_extra=_no_default, **kw)


def _no_nul(value: Any) -> Any:
    """Strings without NUL (no database stores it in text); JSON without NaN or Infinity."""
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError("NaN and Infinity are not JSON") from None
    if "\\u0000" in text:
        raise ValueError("a string may not hold the NUL character")
    return value


class MemoryIn(BaseModel):
    """An entry a caller writes; the same (subject, type, key) updates the one there is."""

    model_config = ConfigDict(extra="forbid")

    subject: str = Field(min_length=1, max_length=MAX_SUBJECT, description="The end user")
    type: str = Field(
        min_length=1,
        max_length=16,
        description=f"One of {TYPES_TEXT}",
        json_schema_extra={"enum": list(TYPES)},
    )
    key: str = Field(
        min_length=1,
        max_length=MAX_KEY,
        description="Letters, digits and _ . : - (starting with a letter or digit); one entry "
        "per (subject, type, key)",
    )
    text: str = Field(min_length=1, max_length=MAX_TEXT, description="What is remembered")
    value: Any = Field(None, description="The same as structured JSON, if it has a shape")
    pinned: bool = Field(False, description="Recalled into every run of the subject")
    confidence: float = Field(1.0, ge=0, le=1, allow_inf_nan=False)
    expires_at: Rfc3339 | None = Field(None, description="Forgotten at this moment")

    _checked = field_validator("subject", "key", "text", "value")(_no_nul)


class MemoryPatch(BaseModel):
    """The fields to change (absent: unchanged). `value` and `expires_at` may be null (none)."""

    model_config = ConfigDict(extra="forbid")

    text: str = _optional(min_length=1, max_length=MAX_TEXT)
    value: Any = _optional()
    pinned: bool = _optional()
    confidence: float = _optional(ge=0, le=1, allow_inf_nan=False)
    expires_at: Rfc3339 | None = _optional()
    origin: Literal["user"] = _optional(
        description="'user': a person confirms an entry a tool's output planted (receipt)"
    )

    _checked = field_validator("text", "value")(_no_nul)


class MemoryOut(BaseModel):
    memory_id: str
    subject: str
    type: str
    key: str
    text: str
    value: Any
    origin: str = Field(
        description="user (a caller wrote it), model (a run, from what its user said) or "
        "receipt (a run, after reading a tool's output)"
    )
    untrusted: bool = Field(
        description="A tool's output planted it (origin receipt): never recalled into a run"
    )
    confidence: float
    pinned: bool
    source: dict[str, Any] | None = Field(description="Where a run wrote it: run, task, step")
    written_by: str = Field(description="A principal, or run:<id>")
    version: int = Field(description="Its ETag")
    created_at: Instant
    updated_at: Instant
    expires_at: Instant | None


class MemoryFound(MemoryOut):
    score: float = Field(description="How well it matches the query (higher is better)")


class MemoryList(BaseModel):
    memories: list[MemoryOut]


class MemorySearch(BaseModel):
    memories: list[MemoryFound]


class SubjectOut(BaseModel):
    subject: str
    entries: int
    updated_at: Instant


class SubjectList(BaseModel):
    subjects: list[SubjectOut]
    next_after: str | None = Field(description="The next page's `after` (null: no more)")


class Forgotten(BaseModel):
    forgotten: int = Field(description="How many entries were deleted")


def _fields(entry: MemoryRow) -> dict[str, Any]:
    return {
        "memory_id": entry.memory_id,
        "subject": entry.subject,
        "type": entry.type,
        "key": entry.key,
        "text": entry.text,
        "value": entry.value,
        "origin": entry.origin.value,
        "untrusted": entry.origin is MemoryOrigin.RECEIPT,
        "confidence": entry.confidence,
        "pinned": entry.pinned,
        "source": entry.source,
        "written_by": entry.written_by,
        "version": entry.version,
        "created_at": entry.created_at,
        "updated_at": entry.updated_at,
        "expires_at": entry.expires_at,
    }


def _out(entry: MemoryRow) -> dict[str, Any]:
    return MemoryOut(**_fields(entry)).model_dump(mode="json")


def _answer(entry: MemoryRow, status: int = 200, **headers: str) -> JSONResponse:
    return JSONResponse(
        _out(entry), status_code=status, headers={"ETag": f'"{entry.version}"', **headers}
    )


def _version_of(if_match: str | None, memory_id: str) -> int | None:
    if if_match is None or if_match.strip() == "*":
        return None
    value = if_match.strip().removeprefix("W/").strip('"')
    if not value.isdigit():
        raise MemoryConflictError(memory_id)  # no version of it is this: it does not match
    return int(value)


def _types(given: str | None) -> list[str]:
    named = [t.strip() for t in (given or "").split(",") if t.strip()]
    unknown = [t for t in named if t not in TYPES]
    if unknown:
        said = f"unknown type {unknown[0][:16]!r}: the types are {TYPES_TEXT}"
        raise RequestValidationError([{"loc": ("query", "type"), "type": "enum", "msg": said}])
    return named


@router.get("/subjects", response_model=SubjectList, summary="The tenant's subjects, by name")
async def list_subjects(
    deps: Deps,
    who: Caller,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    after: Annotated[
        str | None,
        Query(
            max_length=MAX_SUBJECT,
            pattern=SUBJECT_PATTERN,
            description="The previous page's next_after",
        ),
    ] = None,
) -> Response:
    require(deps, who, Action.MEMORY_READ)
    found = await deps.memory.subjects(who.tenant, limit=limit, after=after)
    subjects = [SubjectOut(subject=s, entries=n, updated_at=at) for s, n, at in found]
    page = SubjectList(
        subjects=subjects, next_after=subjects[-1].subject if len(subjects) == limit else None
    )
    return JSONResponse(page.model_dump(mode="json"))


@router.get("", response_model=MemoryList, summary="A subject's memories, newest first")
async def list_memories(
    subject: SubjectQuery,
    deps: Deps,
    who: Caller,
    types: Annotated[
        str | None,
        Query(
            alias="type",
            max_length=200,
            description=f"Only these types, comma-separated ({TYPES_TEXT})",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> Response:
    require(deps, who, Action.MEMORY_READ)
    found = await deps.memory.entries(who.tenant, subject, types=_types(types), limit=limit)
    return JSONResponse({"memories": [_out(e) for e in found]})


@router.get(
    "/search",
    response_model=MemorySearch,
    summary="A subject's memories that match a query, best first",
)
async def search_memory(
    subject: SubjectQuery,
    q: Annotated[str, Query(min_length=1, max_length=MAX_QUERY, description="What to look for")],
    deps: Deps,
    who: Caller,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
) -> Response:
    require(deps, who, Action.MEMORY_READ)
    found = await deps.memory.search(who.tenant, subject, q, limit=limit)
    memories = [MemoryFound(**_fields(e), score=s).model_dump(mode="json") for e, s in found]
    return JSONResponse({"memories": memories})


UPDATED: dict[int | str, dict[str, Any]] = {
    200: {"model": MemoryOut, "description": "Updated (or written again unchanged)"}
}


@router.post(
    "",
    response_model=MemoryOut,
    status_code=201,
    responses=UPDATED | problem_responses(400, 409, 413, 422),
    summary="Remember: 201 when created, 200 when the subject's (type, key) was updated",
)
async def put_memory(body: MemoryIn, deps: Deps, who: Caller) -> Response:
    require(deps, who, Action.MEMORY_WRITE)
    entry = Entry(
        type=body.type,
        key=body.key,
        text=body.text,
        value=body.value,
        pinned=body.pinned,
        confidence=body.confidence,
        expires_at=body.expires_at,
    )
    written = await deps.memory.put(Writer(tenant=who.tenant, actor=who.name), body.subject, entry)
    if written.created:
        where = f"/v1/memory/{written.entry.memory_id}"
        return _answer(written.entry, 201, Location=where)
    return _answer(written.entry)


@router.get(
    "/{memory_id}", response_model=MemoryOut, responses=problem_responses(404), summary="A memory"
)
async def get_memory(memory_id: MemoryId, deps: Deps, who: Caller) -> Response:
    require(deps, who, Action.MEMORY_READ)
    return _answer(await deps.memory.get(who.tenant, memory_id))


@router.patch(
    "/{memory_id}",
    response_model=MemoryOut,
    responses=problem_responses(400, 404, 412, 413),
    summary="Change a memory's text, value, pin, confidence or expiry, or confirm it (origin)",
)
async def patch_memory(
    memory_id: MemoryId, body: MemoryPatch, deps: Deps, who: Caller, if_match: IfMatch = None
) -> Response:
    require(deps, who, Action.MEMORY_WRITE)
    changes = {name: getattr(body, name) for name in sorted(body.model_fields_set)}
    if not changes:
        raise MemoryInputError([Problem("", "name at least one field to change")])
    patched = await deps.memory.patch(
        Writer(tenant=who.tenant, actor=who.name),
        memory_id,
        changes,
        if_version=_version_of(if_match, memory_id),
    )
    return _answer(patched)


@router.delete(
    "/{memory_id}",
    status_code=204,
    responses=problem_responses(404),
    summary="Forget a memory: its text and value go from every table and index",
)
async def forget_memory(memory_id: MemoryId, deps: Deps, who: Caller) -> Response:
    require(deps, who, Action.MEMORY_FORGET)
    await deps.memory.forget(who.tenant, who.name, memory_id)
    return Response(status_code=204)


@router.delete("", response_model=Forgotten, summary="Forget every memory of a subject")
async def forget_subject(subject: SubjectQuery, deps: Deps, who: Caller) -> Response:
    require(deps, who, Action.MEMORY_FORGET)
    gone = await deps.memory.forget_subject(who.tenant, who.name, subject)
    return JSONResponse({"forgotten": gone})
