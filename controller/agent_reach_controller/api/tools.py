"""The tool registry over HTTP: read the catalogue, change it, export and import it as YAML.

Reading shows a caller the tools it may submit (and, with `admin`, those it administers).
Changing a tool needs `admin` on its name. Every change is a new immutable version; `ETag` is the
tool's revision and `If-Match` makes a write conditional on it (412 when it moved).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import yaml
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_reach.times import rfc3339
from agent_reach_controller.api import schemas
from agent_reach_controller.api.auth import Caller, ForbiddenError, require
from agent_reach_controller.api.problems import V1_PROBLEMS, problem_responses
from agent_reach_controller.api.tasks import BadJsonError, Deps, read_body
from agent_reach_controller.identity.policy import Action, Principal
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.limiter import RateUse
from agent_reach_controller.services.registry import (
    CatalogDiff,
    ToolHead,
    ToolNotFoundError,
)
from agent_reach_controller.services.usage import UsageReader
from agent_reach_controller.tools import shapes
from agent_reach_controller.tools.catalog import ToolSpec

router = APIRouter(prefix="/v1/tools", tags=["tools"], responses=V1_PROBLEMS)
# Catalogue-wide methods (`/v1/tools:export`): no tool name can contain ':'.
catalogue = APIRouter(prefix="/v1", tags=["tools"], responses=V1_PROBLEMS)

IfMatch = Annotated[
    str | None,
    Header(description="Only if the tool is still at this revision (its ETag)", max_length=32),
]
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
# What :import reads (as YAML or JSON) and :export writes: `tools: [definition, ...]`.
TOOLS_DOCUMENT = {
    "type": "object",
    "required": ["tools"],
    "additionalProperties": False,
    "properties": {"tools": {"type": "array", "items": {"type": "object"}}},
}


class ChatFunctionDefinition(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class ChatTool(BaseModel):
    """An OpenAI Chat Completions `tools` entry."""

    type: Literal["function"]
    function: ChatFunctionDefinition


class ResponsesTool(BaseModel):
    """An OpenAI Responses `tools` entry; `strict` where the input schema allows it."""

    type: Literal["function"]
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool


class AnthropicTool(BaseModel):
    """An Anthropic Messages `tools` entry."""

    name: str
    description: str
    input_schema: dict[str, Any]


class McpToolAnnotations(BaseModel):
    readOnlyHint: bool
    destructiveHint: bool
    idempotentHint: bool


class McpTool(BaseModel):
    """An MCP `tools/list` entry, with the tool's own (dotted) name."""

    name: str
    description: str
    inputSchema: dict[str, Any]
    annotations: McpToolAnnotations


class ToolOut(BaseModel):
    """A tool as the catalogue holds it now: its definition plus where it came from."""

    model_config = ConfigDict(extra="allow")
    name: str
    version: str
    revision: int
    enabled: bool
    updated_by: str
    updated_at: schemas.Instant


class Catalogue(BaseModel):
    tools: list[ToolOut]
    revision: int = Field(description="The catalogue's revision (it moves with every change)")


class ToolChangeOut(BaseModel):
    revision: int
    action: str
    version: str | None
    principal: str
    at: schemas.Instant


class ToolHistory(BaseModel):
    name: str
    changes: list[ToolChangeOut]


class CatalogDiffOut(BaseModel):
    revision: int = Field(description="The catalogue's revision after the import")
    dry_run: bool
    created: list[str]
    updated: list[str]
    disabled: list[str]
    enabled: list[str]
    deleted: list[str]
    unchanged: list[str]


class ToolRevisionMismatchError(Exception):
    """An If-Match that is not a revision."""


class ImportInvalidError(Exception):
    """The import document has problems; `errors` holds one per problem, with a pointer."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__(f"{len(errors)} problem(s)")
        self.errors = errors


def _out(head: ToolHead) -> dict[str, Any]:
    return {
        **head.spec.model_dump(mode="json"),
        "version": head.spec.version,
        "revision": head.revision,
        "updated_by": head.updated_by,
        "updated_at": rfc3339(head.updated_at),
    }


def _etag(head: ToolHead) -> dict[str, str]:
    return {"ETag": f'"{head.revision}"'}


def revision_of(if_match: str | None) -> int | None:
    if if_match is None or if_match.strip() == "*":
        return None
    value = if_match.strip().removeprefix("W/").strip('"')
    if not value.isdigit():
        raise ToolRevisionMismatchError(f"If-Match must be a tool revision, got {if_match!r}")
    return int(value)


def _may_see(deps: Components, who: Principal, name: str) -> bool:
    roles = who.roles
    return deps.policy.allows(roles, Action.SUBMIT, name) or deps.policy.allows(
        roles, Action.ADMIN, name
    )


async def _visible_head(deps: Components, who: Principal, name: str) -> ToolHead:
    await deps.registry.refresh()
    head = deps.registry.heads.get(name)
    if head is None or not _may_see(deps, who, name):
        raise ToolNotFoundError(name)
    return head


@router.get(
    "",
    summary="The tool catalogue, natively or as a model API's tool list",
    response_model=Catalogue
    | list[ChatTool]
    | list[ResponsesTool]
    | list[AnthropicTool]
    | list[McpTool],
)
async def list_tools(
    deps: Deps,
    who: Caller,
    format: Annotated[
        shapes.Format,
        Query(
            description="native: definitions; openai_chat (also `openai`), openai_responses, "
            "anthropic, mcp: the tools list that API takes"
        ),
    ] = "native",
    include_disabled: Annotated[
        bool, Query(description="Also disabled tools (native format, tools you administer)")
    ] = False,
) -> Response:
    """Only the tools the caller may submit: a model is never shown what it cannot run."""
    await deps.registry.refresh()
    mine = deps.catalog.only(lambda t: deps.policy.allows(who.roles, Action.SUBMIT, t.name))
    if format != "native":
        return JSONResponse(shapes.tool_list(mine.enabled(), format))
    heads = deps.registry.heads
    shown = [
        _out(heads[t.name])
        for t in deps.catalog.values()
        if (t.enabled and t.name in mine)
        or (include_disabled and deps.policy.allows(who.roles, Action.ADMIN, t.name))
    ]
    return JSONResponse({"tools": shown, "revision": deps.registry.revision})


@router.get("/breakers", summary="Circuit breaker state of every tool that has one")
async def tool_breakers(deps: Deps, who: Caller) -> dict[str, Any]:
    states = await deps.tool_health.breaker_states()
    return {
        "breakers": {
            name: state
            for name, state in states.items()
            if deps.policy.allows(who.roles, Action.SUBMIT, name)
        }
    }


@router.post(
    "",
    status_code=201,
    response_model=ToolOut,
    responses=problem_responses(400, 409),
    summary="Add a tool to the catalogue",
)
async def create_tool(spec: ToolSpec, deps: Deps, who: Caller) -> Response:
    require(deps, who, Action.ADMIN, spec.name)
    head = await deps.registry.create(spec, principal=who.name, tenant=who.tenant)
    headers = {**_etag(head), "Location": f"/v1/tools/{spec.name}"}
    return JSONResponse(_out(head), status_code=201, headers=headers)


@router.get("/{name}", response_model=ToolOut, responses=problem_responses(404), summary="One tool")
async def get_tool(name: str, deps: Deps, who: Caller) -> Response:
    head = await _visible_head(deps, who, name)
    return JSONResponse(_out(head), headers=_etag(head))


@router.get(
    "/{name}/usage",
    response_model=schemas.ToolUsageOut,
    responses=problem_responses(404),
    summary="A tool's rate limit, concurrency and breaker, and what it uses of them now",
)
async def tool_usage(name: str, deps: Deps, who: Caller) -> schemas.ToolUsageOut:
    """Shared by every caller and replica: the buckets, running steps and breaker are global."""
    spec = (await _visible_head(deps, who, name)).spec
    reader = UsageReader(db=deps.db, limiter=deps.limiter, tool_health=deps.tool_health)
    usage = await reader.read(spec)
    return schemas.ToolUsageOut(
        name=spec.name,
        version=spec.version,
        rate_limit=_rate_out(spec, usage.rate),
        concurrency=schemas.ConcurrencyOut(
            limit=spec.concurrency,
            per_key=None
            if spec.concurrency_per_key is None
            else schemas.PerKeyConcurrencyOut(
                limit=spec.concurrency_per_key.limit, key=spec.concurrency_per_key.key
            ),
            running=usage.running,
        ),
        breaker=None if usage.breaker is None else schemas.BreakerOut(**usage.breaker),
    )


def _rate_out(spec: ToolSpec, use: RateUse | None) -> schemas.RateUseOut | None:
    limit = spec.rate_limit
    if limit is None or use is None:
        return None
    return schemas.RateUseOut(
        per_second=limit.per_second,
        burst=limit.burst,
        key=limit.key,
        use=schemas.BucketUseOut(in_use=use.busiest.calls, frees_in=use.busiest.frees_in),
        keys=use.keys,
        more_keys=use.more_keys,
    )


@router.put(
    "/{name}",
    response_model=ToolOut,
    responses=problem_responses(400, 404, 409, 412),
    summary="Replace a tool's definition (a new version; the same definition changes nothing)",
)
async def update_tool(
    name: str, spec: ToolSpec, deps: Deps, who: Caller, if_match: IfMatch = None
) -> Response:
    if spec.name != name:
        raise ImportInvalidError(
            [
                {
                    "pointer": "/body/name",
                    "code": "name_mismatch",
                    "detail": f"the body names {spec.name!r}, the path {name!r}",
                }
            ]
        )
    await _admin_of_existing(deps, who, name)
    head = await deps.registry.update(
        spec, principal=who.name, tenant=who.tenant, if_revision=revision_of(if_match)
    )
    return JSONResponse(_out(head), headers=_etag(head))


async def _admin_of_existing(deps: Components, who: Principal, name: str) -> None:
    """404 for a tool the caller cannot see, 403 for one it sees but may not change."""
    await _visible_head(deps, who, name)
    require(deps, who, Action.ADMIN, name)


async def _switch(
    name: str, enabled: bool, deps: Components, who: Principal, if_match: str | None
) -> Response:
    await _admin_of_existing(deps, who, name)
    head = await deps.registry.set_enabled(
        name, enabled, principal=who.name, tenant=who.tenant, if_revision=revision_of(if_match)
    )
    return JSONResponse(_out(head), headers=_etag(head))


@router.post(
    "/{name}:disable",
    response_model=ToolOut,
    responses=problem_responses(404, 412),
    summary="Disable a tool: queued steps of it are refused from the next dispatch on",
)
async def disable_tool(name: str, deps: Deps, who: Caller, if_match: IfMatch = None) -> Response:
    return await _switch(name, False, deps, who, if_match)


@router.post(
    "/{name}:enable",
    response_model=ToolOut,
    responses=problem_responses(404, 412),
    summary="Enable a disabled tool",
)
async def enable_tool(name: str, deps: Deps, who: Caller, if_match: IfMatch = None) -> Response:
    return await _switch(name, True, deps, who, if_match)


@router.delete(
    "/{name}",
    status_code=204,
    responses=problem_responses(404, 409, 412),
    summary="Delete a tool (its versions stay for the tasks pinned to them)",
)
async def delete_tool(name: str, deps: Deps, who: Caller, if_match: IfMatch = None) -> Response:
    await _admin_of_existing(deps, who, name)
    await deps.registry.delete(
        name, principal=who.name, tenant=who.tenant, if_revision=revision_of(if_match)
    )
    return Response(status_code=204)


@router.get(
    "/{name}/versions",
    response_model=ToolHistory,
    responses=problem_responses(404),
    summary="Every change to a tool, newest first",
)
async def tool_history(name: str, deps: Deps, who: Caller) -> ToolHistory:
    if not _may_see(deps, who, name):
        raise ToolNotFoundError(name)
    changes = await deps.registry.history(name)
    return ToolHistory(
        name=name,
        changes=[
            ToolChangeOut(
                revision=c.revision,
                action=c.action,
                version=c.version,
                principal=c.principal,
                at=c.created_at,
            )
            for c in changes
        ],
    )


@router.get(
    "/{name}/versions/{version}",
    responses=problem_responses(404),
    summary="One immutable version of a tool (current or not)",
)
async def tool_version(name: str, version: str, deps: Deps, who: Caller) -> dict[str, Any]:
    if not _may_see(deps, who, name):
        raise ToolNotFoundError(name)
    spec = await deps.registry.version(name, version)
    return {**spec.model_dump(mode="json"), "version": spec.version}


@catalogue.get(
    "/tools:export",
    responses={
        200: {
            "content": {
                "application/json": {"schema": TOOLS_DOCUMENT},
                "application/yaml": {"schema": TOOLS_DOCUMENT},
            }
        }
    },
    response_class=JSONResponse,
    summary="The catalogue as a tools YAML file (what `:import` and --tools read)",
)
async def export_tools(
    deps: Deps,
    who: Caller,
    include_disabled: Annotated[bool, Query(description="Keep disabled tools")] = True,
) -> Response:
    """Tools the caller administers, defaults left out; importing it back changes nothing."""
    await deps.registry.refresh()
    specs = [
        spec.model_dump(mode="json", exclude_defaults=True)
        for spec in deps.catalog.values()
        if deps.policy.allows(who.roles, Action.ADMIN, spec.name)
        and (include_disabled or spec.enabled)
    ]
    text = yaml.safe_dump({"tools": specs}, sort_keys=False, allow_unicode=True)
    headers = {"ETag": f'"{deps.registry.revision}"'}
    return Response(text, media_type="application/yaml", headers=headers)


@catalogue.post(
    "/tools:import",
    response_model=CatalogDiffOut,
    responses=problem_responses(400, 409, 413),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/yaml": {"schema": TOOLS_DOCUMENT},
                "application/json": {"schema": TOOLS_DOCUMENT},
            },
        }
    },
    summary="Make the catalogue hold a tools file's definitions (GitOps)",
)
async def import_tools(
    request: Request,
    deps: Deps,
    who: Caller,
    prune: Annotated[bool, Query(description="Delete tools the file does not define")] = False,
    dry_run: Annotated[bool, Query(description="Say what would change; change nothing")] = False,
) -> CatalogDiffOut:
    raw = await read_body(request, deps.settings.max_body_bytes)
    specs = _parse_document(raw, request.headers.get("content-type", ""))
    for spec in specs:
        require(deps, who, Action.ADMIN, spec.name)
    if prune and not deps.policy.is_admin(who.roles):
        raise ForbiddenError(who, Action.ADMIN)
    diff = await deps.registry.apply(
        specs, principal=who.name, tenant=who.tenant, prune=prune, dry_run=dry_run
    )
    return _diff_out(diff, dry_run=dry_run)


def _diff_out(diff: CatalogDiff, *, dry_run: bool) -> CatalogDiffOut:
    return CatalogDiffOut(
        revision=diff.revision,
        dry_run=dry_run,
        created=diff.created,
        updated=diff.updated,
        disabled=diff.disabled,
        enabled=diff.enabled,
        deleted=diff.deleted,
        unchanged=diff.unchanged,
    )


def _parse_document(raw: bytes, content_type: str) -> list[ToolSpec]:
    """A tools document (`tools: [...]`) as YAML or JSON → specs, or every problem."""
    try:
        text = raw.decode("utf-8")
        if content_type.split(";", maxsplit=1)[0].strip().lower() in YAML_TYPES:
            document = yaml.safe_load(text)
        else:
            document = json.loads(text)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:
        raise BadJsonError(f"not a YAML or JSON tools document: {exc}") from None
    if isinstance(document, dict) and set(document) == {"tools"}:
        document = document["tools"]
    else:
        raise ImportInvalidError(
            [{"pointer": "", "code": "invalid_type", "detail": 'expected {"tools": [...]}'}]
        )
    if not isinstance(document, list):
        raise ImportInvalidError(
            [{"pointer": "/tools", "code": "invalid_type", "detail": "'tools' must be a list"}]
        )
    specs: list[ToolSpec] = []
    errors: list[dict[str, str]] = []
    seen: set[str] = set()
    for index, entry in enumerate(document):
        try:
            spec = ToolSpec.model_validate(entry)
        except ValidationError as exc:
            errors += [
                {
                    "pointer": "/".join(["/tools", str(index), *(str(p) for p in err["loc"])]),
                    "code": err["type"],
                    "detail": err["msg"],
                }
                for err in exc.errors()
            ]
            continue
        if spec.name in seen:
            errors.append(
                {
                    "pointer": f"/tools/{index}/name",
                    "code": "duplicate_tool",
                    "detail": f"tool {spec.name!r} is defined twice",
                }
            )
        seen.add(spec.name)
        specs.append(spec)
    if errors:
        raise ImportInvalidError(errors)
    return specs
