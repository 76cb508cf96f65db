"""Agent profiles: the model an agent run calls, how, with which tools and within which limits.

A profile is stored as a catalogue tool of the `model` connector: its endpoint (kind, base URL,
credential reference) is the connector's configuration, and the rest (model, system prompt, tool
patterns, limits, prices) rides beside it under `config.agent`. So a profile is versioned,
audited, rate-limited, retried and guarded by a circuit breaker exactly as any tool, its
credentials are only ever `${env:NAME}` references resolved on the executor, and writing one is
as privileged as writing a tool. Runs pin the version they started with.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from agent_reach.destinations import Destinations
from agent_reach_controller.tools.catalog import (
    BreakerPolicy,
    RateLimit,
    RetryPolicy,
    Seconds,
    ToolSpec,
)

MODEL_CONNECTOR = "model"
EndpointKind = Literal["openai_chat", "openai_responses", "anthropic"]
# A credential is a reference, resolved on the executor: never a value stored or shown.
_SECRET_REFERENCE = re.compile(r"^\$\{env:[A-Za-z_][A-Za-z0-9_]*\}$")
DEFAULT_MAX_ROUNDS = 5
# What a reply's text may be at most before the run stops reading it (the connector's own cap).
DEFAULT_MAX_OUTPUT_TOKENS = 4096
# The memory types a run's extraction may propose: decide/memory.py's TYPES without the reserved
# ones (identity: only a caller writes it). Spelled here because profiles sit below the rules'
# layer; a unit test holds the two lists together.
ExtractType = Literal["preference", "fact", "goal", "project", "constraint"]
EXTRACT_TYPES: tuple[ExtractType, ...] = ("preference", "fact", "goal", "project", "constraint")


class Endpoint(BaseModel):
    """Where the model is, and how it is spoken to."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: EndpointKind
    base_url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://")
    api_key: str = Field(
        description="A `${env:NAME}` reference, resolved on the executor; never a key itself",
    )
    allow_hosts: list[str] = Field(default_factory=list, max_length=64)
    destinations: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Host names (or `*.suffix`) the model endpoint may be reached at",
    )
    max_reply_bytes: int | None = Field(default=None, ge=1024, le=64 * 1024 * 1024)

    @field_validator("destinations")
    @classmethod
    def _destinations_parse(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            Destinations.parse(value)  # a ValueError names the bad entry
        return value

    @field_validator("api_key")
    @classmethod
    def _reference_only(cls, value: str) -> str:
        if not _SECRET_REFERENCE.match(value):
            raise ValueError(
                "api_key must be a reference such as ${env:OPENAI_API_KEY}, never the key itself"
            )
        return value


class Limits(BaseModel):
    """When a run stops: rounds, tokens (sent and received), cost, time."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_rounds: int = Field(default=DEFAULT_MAX_ROUNDS, ge=1, le=100)
    input_tokens: int | None = Field(default=None, ge=1)
    output_tokens: int | None = Field(default=None, ge=1)
    cost: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    deadline: Seconds | None = None
    max_output_tokens: int = Field(default=DEFAULT_MAX_OUTPUT_TOKENS, ge=1, le=1_000_000)

    def overridden(self, changes: dict[str, Any]) -> Limits:
        """These limits with a caller's overrides, which may only tighten them."""
        merged = self.model_dump() | {k: v for k, v in changes.items() if v is not None}
        tighter = Limits.model_validate(merged)
        for name in ("max_rounds", "input_tokens", "output_tokens", "cost", "deadline"):
            mine, theirs = getattr(self, name), getattr(tighter, name)
            if mine is not None and theirs is not None and theirs > mine:
                raise ValueError(f"limits.{name} may only be lowered ({theirs} > {mine})")
        return tighter


class EmbeddingSettings(BaseModel):
    """Where a run's recall gets its embeddings: an OpenAI-compatible `/embeddings`, called as an
    executor step through the agent's own model tool (the controller holds no model key)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    model: str = Field(
        min_length=1, max_length=128, description="The embedding model (`text-embedding-3-small`)"
    )
    base_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        pattern=r"^https?://",
        description="Another endpoint's base URL for embeddings (needed when the profile's "
        "endpoint is `anthropic`, which has no /embeddings); by default the profile's own. Its "
        "host must be one the profile's `allow_hosts` or `destinations` admit",
    )
    api_key: str | None = Field(
        default=None,
        description="With `base_url`, that endpoint's key: a `${env:NAME}` reference",
    )

    @field_validator("api_key")
    @classmethod
    def _reference_only(cls, value: str | None) -> str | None:
        if value is not None and not _SECRET_REFERENCE.match(value):
            raise ValueError(
                "api_key must be a reference such as ${env:OPENAI_API_KEY}, never the key itself"
            )
        return value

    @model_validator(mode="after")
    def _both_or_neither(self) -> EmbeddingSettings:
        # The chat endpoint's key is never sent to another host by default.
        if (self.api_key is None) != (self.base_url is None):
            raise ValueError("base_url and api_key are given together, or neither")
        return self

    def endpoint(self) -> dict[str, str] | None:
        """The model tool's `config.embeddings` (None: the chat endpoint's)."""
        if self.base_url is None or self.api_key is None:
            return None
        return {"base_url": self.base_url, "api_key": self.api_key}


class MemorySettings(BaseModel):
    """What a run remembers of its subject (the end user a caller names on the run): what it is
    reminded of when it starts, and whether it proposes memories when it ends. A run without a
    subject does neither."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    recall: int = Field(
        default=5,
        ge=0,
        le=50,
        description="The most matching memories a run starts with, beside its subject's pinned "
        "ones (0: none, and no pinned ones either)",
    )
    recall_tokens: int = Field(
        default=800,
        ge=1,
        le=100_000,
        description="The most tokens the recalled memories may take in the prompt (estimated "
        "at four characters to a token)",
    )
    extract: bool = Field(
        default=False,
        description="After its answer, one more model call proposes memories (its own round, "
        "in the published memory schema); they are validated and stored with their provenance",
    )
    extract_types: list[ExtractType] = Field(
        default_factory=lambda: list(EXTRACT_TYPES),
        min_length=1,
        max_length=len(EXTRACT_TYPES),
        description="The types extraction may propose (a reserved type, such as profile, never)",
    )

    embeddings: EmbeddingSettings | None = Field(
        default=None,
        # Settings without embeddings read, and are stored, as they were before there were any
        # (a profile's version is a hash of what is stored).
        exclude_if=lambda value: value is None,
        description="Recall by embeddings: the run's input and its subject's memories are "
        "embedded (a step before the first model call; each memory once per model, at most 63 "
        "a run) and the nearest by cosine are recalled; without it, full-text search",
    )

    @field_validator("extract_types")
    @classmethod
    def _once_each(cls, value: list[ExtractType]) -> list[ExtractType]:
        if len(set(value)) != len(value):
            raise ValueError("extract_types names a type twice")
        return value


class Prices(BaseModel):
    """What a million tokens cost, in the profile's currency (units are the operator's)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    input: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    output: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    cached_input: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    def cost(self, *, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> float:
        cached = min(cached_tokens, input_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        return (
            (input_tokens - cached) * self.input
            + cached * cached_price
            + output_tokens * self.output
        ) / 1_000_000


class AgentProfile(BaseModel):
    """An agent: its model endpoint, its instructions, the tools it may call, its limits."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    description: str = Field(default="An agent", min_length=1, max_length=2000)
    endpoint: Endpoint
    model: str = Field(min_length=1, max_length=200)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    system: str = Field(default="", max_length=100_000)
    tools: list[str] = Field(
        default_factory=list,
        max_length=200,
        description="Tool name patterns (`crm.*`); at run time also cut to the caller's rights",
    )
    mode: Literal["react", "plan", "auto"] = Field(
        "react",
        description="react: the model calls tools round by round; plan: it writes a whole plan "
        "(our plan shape), which runs as one round, then answers from its results; auto: a "
        "first model call (the router) picks answer, react or plan for each message",
    )
    category_threshold: int = Field(
        10,
        ge=1,
        le=10_000,
        description="With more tools than this, the model first picks a category of them "
        "(a tool's name up to its first dot), then sees only that category's tools",
    )
    limits: Limits = Field(default_factory=Limits)
    prices: Prices = Field(default_factory=Prices)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    # The model call as a downstream: how long one may take, how it is retried and throttled.
    timeout: Seconds = 120.0
    retry: RetryPolicy = Field(default_factory=lambda: RetryPolicy(maximum_attempts=3))
    rate_limit: RateLimit | None = None
    breaker: BreakerPolicy | None = None

    @field_validator("memory")
    @classmethod
    def _embeddings_reachable(cls, value: MemorySettings, info: ValidationInfo) -> MemorySettings:
        endpoint = info.data.get("endpoint")
        wanted = value.embeddings
        if wanted is None or wanted.base_url is not None or endpoint is None:
            return value
        if endpoint.kind == "anthropic":
            raise ValidationError.from_exception_data(
                "MemorySettings",
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "value_error",
                            "an anthropic endpoint has no /embeddings: give the embeddings' own "
                            "base_url and api_key",
                        ),
                        loc=("embeddings", "base_url"),
                        input=None,
                    )
                ],
            )
        return value

    def allows(self, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.tools)

    def as_tool(self, name: str) -> ToolSpec:
        """The catalogue entry this profile is stored as."""
        endpoint = self.endpoint.model_dump(exclude_none=True)
        agent = self.model_dump(
            mode="json",
            include={
                "model",
                "temperature",
                "system",
                "tools",
                "mode",
                "category_threshold",
                "limits",
                "prices",
            },
        )
        config: dict[str, Any] = {k: v for k, v in endpoint.items() if k != "kind"}
        if self.memory != MemorySettings():  # a profile without it keeps the version it had
            agent["memory"] = self.memory.model_dump(mode="json")
            embeddings = self.memory.embeddings
            if embeddings is not None:
                # An endpoint of its own goes where the connector reads it (model_embeddings.py),
                # stored once: the profile's copy keeps the model.
                agent["memory"]["embeddings"] = {"model": embeddings.model}
                if (elsewhere := embeddings.endpoint()) is not None:
                    config["embeddings"] = elsewhere
        return ToolSpec.model_validate(
            {
                "name": name,
                "description": self.description,
                "connector": MODEL_CONNECTOR,
                "config": config | {"endpoint": endpoint["kind"], "agent": agent},
                # A model call changes nothing downstream: safe to send again.
                "risk": "read",
                "idempotent": True,
                "timeout": self.timeout,
                "retry": self.retry.model_dump(),
                **({"rate_limit": self.rate_limit.model_dump()} if self.rate_limit else {}),
                **({"breaker": self.breaker.model_dump()} if self.breaker else {}),
            }
        )


def is_agent(spec: ToolSpec) -> bool:
    return spec.connector == MODEL_CONNECTOR


def profile_of(spec: ToolSpec) -> AgentProfile:
    """The profile a `model` tool was stored from."""
    config = dict(spec.config)
    agent = dict(config.pop("agent", {}))
    elsewhere = config.pop("embeddings", None)
    if isinstance(elsewhere, dict) and isinstance(agent.get("memory"), dict):
        memory = dict(agent["memory"])
        memory["embeddings"] = dict(memory.get("embeddings") or {}) | elsewhere
        agent["memory"] = memory
    endpoint = {"kind": config.pop("endpoint")} | {
        k: v for k, v in config.items() if k in Endpoint.model_fields
    }
    return AgentProfile.model_validate(
        {
            "description": spec.description,
            "endpoint": endpoint,
            **agent,
            "timeout": spec.timeout,
            "retry": spec.retry.model_dump(),
            **({"rate_limit": spec.rate_limit.model_dump()} if spec.rate_limit else {}),
            **({"breaker": spec.breaker.model_dump()} if spec.breaker else {}),
        },
        strict=False,
    )


def agent_specs(
    source: str, key: str, entries: list[Any]
) -> tuple[list[tuple[ToolSpec, str]], list[str]]:
    """A tools file's `agents:` entries (`name` beside the profile's fields) as `model` tools."""
    specs: list[tuple[ToolSpec, str]] = []
    errors: list[str] = []
    for index, entry in enumerate(entries):
        where = f"{key}[{index}]"
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(name, str):
            errors.append(f"{source}: {where}: expected a mapping with a 'name'")
            continue
        label = f"agent {name!r} ({where})"
        try:
            profile = AgentProfile.model_validate(
                {k: v for k, v in entry.items() if k != "name"}, strict=False
            )
            specs.append((profile.as_tool(name), where))
        except ValidationError as exc:
            errors.extend(
                f"{source}: {label}: {'.'.join(str(p) for p in err['loc']) or '(agent)'}: "
                f"{err['msg']}"
                for err in exc.errors()
            )
    return specs, errors
