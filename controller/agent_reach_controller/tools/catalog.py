"""Tool specifications loaded from YAML, their retry policy, and catalog exports for models."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from agent_reach_controller.tools.destinations import destinations_problem
from agent_reach_controller.tools.expressions import TOOL_VARIABLES, check_names

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_OPENAI_NAME_MAX = 64


def parse_duration(value: Any) -> Any:
    """Seconds from a number or a string such as "500ms", "2s", "1m", "1h".

    Anything else is returned unchanged so that pydantic reports the type error.
    """
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"invalid duration {value!r}; use seconds or e.g. '500ms', '2s', '1m'")
        return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


# As published: seconds, or a string with a unit (what parse_duration reads).
DURATION_SCHEMA = {
    "oneOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": _DURATION.pattern, "examples": ["500ms", "30s", "2m"]},
    ],
    "description": "Seconds, or a duration with a unit: ms, s, m, h",
}
Seconds = Annotated[
    float,
    BeforeValidator(parse_duration),
    Field(gt=0, allow_inf_nan=False),
    WithJsonSchema(DURATION_SCHEMA, mode="validation"),
]

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*$")


def parse_rate(value: Any) -> Any:
    """Calls per second from a number or a string such as "10/s", "600/m", "5000/h"."""
    if isinstance(value, str):
        match = _RATE.match(value)
        if match is None:
            raise ValueError(
                f"invalid rate {value!r}; use calls per second or e.g. '10/s', '600/m'"
            )
        return float(match.group(1)) / _UNIT_SECONDS[match.group(2)]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


_RATE_SCHEMA = {
    "oneOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": _RATE.pattern, "examples": ["10/s", "600/m", "5000/h"]},
    ],
    "description": "Calls per second, or a rate per unit of time: /s, /m, /h",
}
PerSecond = Annotated[
    float,
    BeforeValidator(parse_rate),
    Field(gt=0, allow_inf_nan=False),
    WithJsonSchema(_RATE_SCHEMA, mode="validation"),
]


class RetryPolicy(BaseModel):
    """How often and how far apart a failed step is tried again (durations in seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    initial_interval: Seconds = 1.0
    backoff_coefficient: float = Field(default=2.0, ge=1.0, allow_inf_nan=False)
    maximum_interval: Seconds = 60.0
    maximum_attempts: int = Field(default=3, ge=1)
    non_retryable_error_types: list[str] = Field(default_factory=list)
    jitter: bool = True
    # The longest Retry-After (or quota reset) honoured; a downstream asking for more gets this.
    maximum_retry_after: Seconds = 300.0

    @model_validator(mode="after")
    def _interval_order(self) -> RetryPolicy:
        if self.maximum_interval < self.initial_interval:
            raise ValueError("maximum_interval must be >= initial_interval")
        return self


class BreakerPolicy(BaseModel):
    """When to stop calling a failing downstream, and how to try it again."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    failure_rate: float = Field(default=0.5, gt=0, le=1, allow_inf_nan=False)
    minimum_calls: int = Field(default=10, ge=1)
    window: Seconds = 60.0
    cooldown: Seconds = 30.0
    probes: int = Field(default=1, ge=1)
    # While open: "defer" keeps the tool's queued steps waiting for it to close; "fail_fast"
    # ends them at once (circuit_open), each going to its fallback when the tool has one.
    while_open: Literal["defer", "fail_fast"] = "defer"


class RateLimit(BaseModel):
    """At most `rate` calls per second with bursts of `burst`, per tool or per key value.

    `key` is a CEL expression over the step's resolved arguments (`args.customer_id`): each
    value gets its own bucket. Without a key the whole tool shares one bucket.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    rate: PerSecond
    burst: int = Field(default=1, ge=1, le=100_000)
    key: str | None = Field(default=None, min_length=1, max_length=500)

    @property
    def per_second(self) -> float:
        return self.rate

    @field_validator("key")
    @classmethod
    def _key_compiles(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _cel_key(value, info=info)


class KeyedLimit(BaseModel):
    """At most `limit` steps running at once for each value of `key` (CEL over `args`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    limit: int = Field(ge=1)
    key: str = Field(min_length=1, max_length=500)

    @field_validator("key")
    @classmethod
    def _key_compiles(cls, value: str, info: ValidationInfo) -> str:
        return _cel_key(value, info=info)


# Validation context of a tool version read back from storage: it was checked when it was
# written, and a check made stricter since must not make a stored version unloadable (every
# submit and dispatch would fail). `ToolSpec.model_validate(spec, context=STORED)`.
STORED = {"stored": True}


def _cel_key(value: str, what: str = "key", info: ValidationInfo | None = None) -> str:
    """A CEL expression over `args` that compiles and names nothing else (ValueError if not)."""
    if info is not None and (info.context or {}).get("stored"):
        return value
    return check_names(value, variables=TOOL_VARIABLES, what=what)


# A class of side effects a tool declares and a cap counts (`message`, `payment`, `rows`).
EFFECT_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
EFFECT_CLASS = f"^{EFFECT_NAME.pattern}$"
# The class a tool's `cost` is counted under.
COST = "cost"
# The largest number of units one call may declare, or one cap allow.
MAX_UNITS = 1e12


def _units(value: Any, info: ValidationInfo) -> Any:
    """A number of units (>= 0) or a CEL expression over `args` that gives one per call."""
    if isinstance(value, bool):
        raise ValueError("units must be a number or a CEL expression, not a boolean")
    if isinstance(value, int | float):
        if not 0 <= value <= MAX_UNITS:  # NaN fails this too
            raise ValueError(f"units must be a number from 0 to {MAX_UNITS:g}")
        return float(value)
    if isinstance(value, str):
        if not value.strip() or len(value) > 500:
            raise ValueError("a units expression must have 1 to 500 characters")
        return _cel_key(value, "the units expression", info)
    return value


# Units per call: a number, or a CEL expression over the step's resolved `args`.
Units = Annotated[float | str, BeforeValidator(_units)]
EffectClass = Annotated[str, Field(pattern=EFFECT_CLASS)]
# Fields added after tools were first stored: left out of `version` while at their default, so
# tools that do not use them keep the version (and the pinned tasks) they had.
_VERSIONED_WHEN_SET = (
    "if_unknown",
    "effects",
    "cost",
    "redact",
    "fan_out",
    "verify",
    "map_args",
    "exempt_from_prod_approval",
    "sandbox",
)


class Timeouts(BaseModel):
    """A step's own timeouts, each replacing the tool's (same names and meaning as ToolSpec)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    timeout: Seconds | None = None
    schedule_to_close: Seconds | None = None
    schedule_to_start: Seconds | None = None
    heartbeat: Seconds | None = None

    @classmethod
    def effective(cls, tool: ToolSpec, overrides: Mapping[str, Any] | None) -> Timeouts:
        """The tool's timeouts with a step's overrides applied.

        Both were validated already (the tool when loaded, the overrides when the plan was
        parsed), and this runs for every unblock and every assignment: no validation again.
        """
        values = {name: getattr(tool, name) for name in cls.model_fields}
        return cls.model_construct(**(values | {k: v for k, v in (overrides or {}).items() if v}))


def _destinations_checked(
    value: dict[str, Any], config: dict[str, Any], info: ValidationInfo
) -> dict[str, Any]:
    """`value` (config or sandbox), if the config a step would run with lists its destinations
    where the connector needs it (tools/destinations.py); refused at `<field>.destinations`."""
    connector = info.data.get("connector")
    if (info.context or {}).get("stored") or not isinstance(connector, str):
        return value  # a stored tool lacking them is disabled at start, not made unloadable
    problem = destinations_problem(connector, config)
    if problem is None:
        return value
    code, message = problem
    error = PydanticCustomError(code, message)
    raise ValidationError.from_exception_data(
        "ToolSpec", [InitErrorDetails(type=error, loc=("destinations",), input=value)]
    )


def backoff_delay(policy: RetryPolicy, attempt: int, *, rng: random.Random | None = None) -> float:
    """Seconds to wait before attempt `attempt + 1` after attempt `attempt` (1-based) failed.

    The delay is min(maximum_interval, initial_interval * backoff_coefficient ** (attempt - 1));
    with jitter it is drawn uniformly from [0, that] ("full jitter", which spreads retries of
    many clients best). Written by hand rather than with tenacity/backoff: those libraries sleep
    in the caller, whereas a step's backoff must be a durable `not_before` timestamp computed by
    the controller so that a retry survives restarts and runs on any executor.
    """
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    try:
        ceiling = policy.initial_interval * policy.backoff_coefficient ** (attempt - 1)
    except OverflowError:
        ceiling = policy.maximum_interval
    delay = min(policy.maximum_interval, ceiling)
    if policy.jitter:
        return (rng or random.Random()).uniform(0.0, delay)
    return delay


def _check_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ValueError(
            f"not a valid JSON Schema (Draft 2020-12) at {where}: {exc.message}"
        ) from None
    return schema


class FanOut(BaseModel):
    """A step of the tool runs as one child step per element of its array argument `over`
    (each with its own attempts, backoff and idempotency key; the element is the child's argument
    `as`), and ends with a record of every child: `notify` delivering to several targets."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    over: str = Field(min_length=1)
    as_: str = Field(alias="as", min_length=1)
    # The most children one step may have (the array's length is fixed at submit).
    max: int = Field(20, ge=1, le=100)


class ArgMap(BaseModel):
    """The model's arguments as the downstream wants them (planning/argmap.py): keys renamed
    (`case` at every depth, `rename` exactly at the top), `defaults` filled, values `coerce`d."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    case: Literal["snake", "camel"] | None = None
    rename: dict[str, str] = Field(default_factory=dict)
    defaults: dict[str, Any] = Field(default_factory=dict)
    coerce: dict[str, Literal["string", "integer", "number", "boolean"]] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _renames_are_distinct(self) -> ArgMap:
        targets = list(self.rename.values())
        if len(set(targets)) != len(targets):
            raise ValueError("rename maps two arguments to one name")
        return self


# What a write's check sees: the write's resolved arguments, its output, and the check's output.
VERIFY_VARIABLES = frozenset({"args", "output", "check"})


class Verify(BaseModel):
    """Read after write: once the write succeeds, `tool` (a read tool) runs with `args` (CEL over
    the write's `args` and `output`), and `condition` (CEL over `args`, `output` and `check`,
    the read's output) must hold. On a mismatch: `fail` (error `unverified`), `retry` (write
    again under the same idempotency key and check again, `attempts` writes in all), or `ask`
    (the step waits in outcome_unknown for a person)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    tool: str = Field(min_length=1)
    args: dict[str, str] = Field(default_factory=dict)
    condition: str = Field(min_length=1)
    on_mismatch: Literal["fail", "retry", "ask"] = "fail"
    attempts: int = Field(2, ge=1, le=5)

    @field_validator("args")
    @classmethod
    def _args_are_cel(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if not (info.context or {}).get("stored"):
            for name, source in value.items():
                check_names(source, variables=frozenset({"args", "output"}), what=f"args.{name}")
        return value

    @field_validator("condition")
    @classmethod
    def _condition_is_cel(cls, value: str, info: ValidationInfo) -> str:
        if (info.context or {}).get("stored"):
            return value
        return check_names(value, variables=VERIFY_VARIABLES, what="condition")

    @property
    def writes(self) -> int:
        """How many times the write may run."""
        return self.attempts if self.on_mismatch == "retry" else 1


class ToolSpec(BaseModel):
    """One tool: a named, configured use of a connector, as the model and the executor see it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(pattern=r"^[a-zA-Z][a-zA-Z0-9_.-]{0,127}$")
    description: str = Field(min_length=1)
    connector: str = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    output: list[str] | None = None
    # Output fields never shown to the model or callers (dotted paths; "[redacted]" instead).
    # The stored output keeps them, so a later step may still reference them.
    redact: list[str] = Field(default_factory=list)
    # start_to_close: one attempt, from the executor taking it to its result.
    timeout: Seconds = 30.0
    # The whole step, retries and waits included: no attempt starts or runs past it.
    schedule_to_close: Seconds | None = None
    # The longest an attempt may wait in the queue for an executor; then the step fails (or
    # goes to its fallback). Waits for a rate-limit token count; a backoff does not.
    schedule_to_start: Seconds | None = None
    # The longest a running call may stay silent (see ToolCall.heartbeat) before it is stopped
    # as hung and tried again.
    heartbeat: Seconds | None = None
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    risk: Literal["read", "write", "dangerous"] = "read"
    # For `write` tools: how long a ready step waits before it may run, so that it can still
    # be cancelled (an undo window); None: it runs at once.
    hold: Seconds | None = None
    # For `write` tools: run in the `prod` environment without waiting for approval (there
    # every other write waits for a person; a `dangerous` tool always does, in every
    # environment). See tools/environments.py.
    exempt_from_prod_approval: bool = False
    # Connector config overrides used when a step runs in the `sandbox` environment, merged
    # over `config` key by key at the top level (`sandbox_config`): where the tool's effects go
    # there, checked as `config` is. In sandbox a write or dangerous tool without it is refused.
    sandbox: dict[str, Any] | None = None
    # Arguments the model may not invent: each must appear in the submitted context or come
    # from an earlier step's output (see planning/grounding.py).
    grounded: list[str] = Field(default_factory=list)
    idempotent: bool = False
    # Another tool to try, with the same arguments, once this one has failed for good.
    fallback: str | None = None
    # The most steps of this tool running at once, across every controller and executor.
    concurrency: int | None = Field(None, ge=1)
    # The most steps running at once for each value of a key, e.g. per customer account.
    concurrency_per_key: KeyedLimit | None = None
    # A circuit breaker shared by every replica; None: no breaker.
    breaker: BreakerPolicy | None = None
    # Calls per second across every replica, enforced when steps are leased; None: no limit.
    rate_limit: RateLimit | None = None
    # Side effects of one call, per class, counted against blast-radius caps (`flow/caps.py`):
    # `{message: 1}`, `{rows: "size(args.rows)"}`.
    effects: dict[EffectClass, Units] = Field(default_factory=dict, max_length=16)
    # Cost units of one call (a number or CEL over `args`), counted against `cost` caps.
    cost: Units | None = None
    # Run each element of an array argument as its own child step (see FanOut).
    fan_out: FanOut | None = None
    # Check a write by reading it back (see Verify).
    verify: Verify | None = None
    # The model's arguments as the downstream wants them (see ArgMap).
    map_args: ArgMap | None = None
    # In an agent run, a call whose outcome is unknown: the run waits for a person's verdict
    # (None, the default, as a task does), or `tell_model`: the call ends `unverified` at once
    # and the model reads that its effect may or may not have happened.
    if_unknown: Literal["tell_model"] | None = None
    enabled: bool = True

    @field_validator("input_schema")
    @classmethod
    def _valid_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_json_schema(value)

    @field_validator("config")
    @classmethod
    def _config_lists_destinations(
        cls, value: dict[str, Any], info: ValidationInfo
    ) -> dict[str, Any]:
        return _destinations_checked(value, value, info)

    @field_validator("sandbox")
    @classmethod
    def _sandbox_lists_destinations(
        cls, value: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        config = info.data.get("config")
        if value is None or config is None:
            return value
        return _destinations_checked(value, {**config, **value}, info)

    @model_validator(mode="after")
    def _hold_is_for_writes(self) -> ToolSpec:
        if self.hold is not None and self.risk != "write":
            raise ValueError("hold applies to tools with risk: write")
        return self

    @model_validator(mode="after")
    def _grounded_are_arguments(self) -> ToolSpec:
        known = self.input_schema.get("properties")
        if isinstance(known, dict):
            unknown = [name for name in self.grounded if name not in known]
            if unknown:
                raise ValueError(f"grounded names arguments the schema does not: {unknown}")
        return self

    @model_validator(mode="after")
    def _fan_out_is_over_an_array(self) -> ToolSpec:
        if self.fan_out is None:
            return self
        known = self.input_schema.get("properties") or {}
        over = known.get(self.fan_out.over)
        if not isinstance(over, dict) or over.get("type") != "array":
            raise ValueError(f"fan_out.over names no array argument: {self.fan_out.over!r}")
        if self.fan_out.as_ in known:
            raise ValueError(f"fan_out.as names an argument the tool has: {self.fan_out.as_!r}")
        return self

    @model_validator(mode="after")
    def _exemption_is_for_writes(self) -> ToolSpec:
        if self.exempt_from_prod_approval and self.risk != "write":
            raise ValueError(
                "exempt_from_prod_approval applies to tools with risk: write (a dangerous tool "
                "always waits for approval)"
            )
        return self

    @model_validator(mode="after")
    def _writes_declare_their_risk(self) -> ToolSpec:
        # A connector that can write asks for it in its config (`sql`: `write: true`): in every
        # config a step may run with, the sandbox's (`sandbox` merged over `config`) too.
        for name, config in (("config", self.config), ("sandbox", self.sandbox_config or {})):
            if config.get("write") is True and self.risk == "read":
                raise ValueError(f"{name}.write: true needs risk: write or dangerous")
        return self

    @model_validator(mode="after")
    def _sandbox_is_a_target(self) -> ToolSpec:
        if self.sandbox == {}:
            raise ValueError("sandbox must override at least one config key (its sandbox target)")
        return self

    @cached_property
    def sandbox_config(self) -> dict[str, Any] | None:
        """The connector config of a step in the `sandbox` environment: `sandbox` over `config`,
        key by key at the top level. None when the tool has no sandbox target."""
        return None if self.sandbox is None else {**self.config, **self.sandbox}

    @model_validator(mode="after")
    def _verify_is_for_writes(self) -> ToolSpec:
        if self.verify is not None and self.risk == "read":
            raise ValueError("verify applies to tools with risk: write or dangerous")
        if self.verify is not None and self.fan_out is not None:
            raise ValueError("a tool may fan out or verify, not both")
        return self

    @cached_property
    def child_schema(self) -> dict[str, Any]:
        """The input schema of one child of a fan-out step: the array argument replaced by one
        of its elements. The tool's own schema when it does not fan out."""
        if self.fan_out is None:
            return self.input_schema
        over, one = self.fan_out.over, self.fan_out.as_
        schema = dict(self.input_schema)
        properties = dict(schema["properties"])
        properties[one] = properties.pop(over).get("items", {})
        schema["properties"] = properties
        if over in schema.get("required", ()):
            schema["required"] = [one if name == over else name for name in schema["required"]]
        return schema

    @model_validator(mode="after")
    def _cost_is_its_own_field(self) -> ToolSpec:
        if COST in self.effects:
            raise ValueError(f"declare cost units with `cost:`, not as effects.{COST}")
        return self

    @cached_property
    def version(self) -> str:
        """First 12 hex chars of the sha256 of the spec's canonical JSON."""
        dumped = self.model_dump(mode="json")
        for name in _VERSIONED_WHEN_SET:
            if not dumped[name]:
                del dumped[name]
        canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def openai_name(name: str) -> str:
    """The function name a tool has in OpenAI/Anthropic tool lists (only [a-zA-Z0-9_-]{1,64}).

    '.' becomes '_'; a name still longer than 64 characters keeps its first 55 characters plus
    '_' and 8 hex chars of its sha256. The catalog refuses two tools with the same mapped name,
    so the mapping can always be reversed.
    """
    mapped = name.replace(".", "_")
    if len(mapped) <= _OPENAI_NAME_MAX:
        return mapped
    return f"{mapped[:55]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


class ToolFileError(Exception):
    """Tool definitions could not be loaded; `errors` lists every problem found, one per line."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(tool)"


def _validate_entries(
    source: str, key: str, entries: list[Any]
) -> tuple[list[tuple[ToolSpec, str]], list[str]]:
    specs: list[tuple[ToolSpec, str]] = []
    errors: list[str] = []
    for index, entry in enumerate(entries):
        where = f"{key}[{index}]"
        if not isinstance(entry, dict):
            errors.append(f"{source}: {where}: expected a mapping, got {type(entry).__name__}")
            continue
        name = entry.get("name")
        label = f"tool {name!r} ({where})" if isinstance(name, str) else where
        try:
            specs.append((ToolSpec.model_validate(entry), where))
        except ValidationError as exc:
            errors.extend(
                f"{source}: {label}: {_field_path(err['loc'])}: {err['msg']}"
                for err in exc.errors()
            )
    return specs, errors


def _entries_of(source: str, document: Any) -> list[tuple[str, list[Any]]] | str:
    """The file's (key, entries): `tools`, and `agents` (profiles, stored as `model` tools)."""
    if isinstance(document, list):
        return [("tools", document)]
    if isinstance(document, dict):
        unknown = sorted(str(k) for k in document if k not in ("tools", "agents"))
        if unknown:
            return f"{source}: unknown top-level keys: {', '.join(unknown)}"
        found = []
        for key in ("tools", "agents"):
            # A file may hold only agents; one without either key is a mistake worth naming.
            entries = document.get(key, [] if "agents" in document or key == "agents" else None)
            if not isinstance(entries, list):
                return f"{source}: {key!r} must be a list of {key[:-1]} definitions"
            found.append((key, entries))
        return found
    return f"{source}: expected a mapping with 'tools' or a list of tools"


def _load_file(path: Path) -> tuple[list[tuple[ToolSpec, str]], list[str]]:
    from agent_reach_controller.tools.agents import agent_specs  # agents build on this module

    source = str(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return [], [f"{source}: cannot read tool file: {exc}"]
    found = _entries_of(source, document)
    if isinstance(found, str):
        return [], [found]
    specs: list[tuple[ToolSpec, str]] = []
    errors: list[str] = []
    for key, entries in found:
        read = agent_specs if key == "agents" else _validate_entries
        more, wrong = read(source, key, entries)
        specs += more
        errors += wrong
    return specs, errors


def _verify_errors(tools: Mapping[str, ToolSpec]) -> list[str]:
    """Every check names another known tool that only reads."""
    errors = []
    for spec in tools.values():
        if spec.verify is None:
            continue
        check, named = tools.get(spec.verify.tool), f"tool {spec.name!r}: verify.tool"
        if check is None:
            errors.append(f"{named} {spec.verify.tool!r} is not a known tool")
        elif check.risk != "read" or check.verify is not None or check.fan_out is not None:
            errors.append(f"{named} {check.name!r} must be a plain read tool")
    return errors


def _fallback_errors(tools: Mapping[str, ToolSpec]) -> list[str]:
    """Every fallback names another known tool, and no chain of fallbacks loops."""
    errors = []
    for spec in tools.values():
        if spec.fallback is None:
            continue
        if spec.fallback not in tools:
            errors.append(f"tool {spec.name!r}: fallback {spec.fallback!r} is not a known tool")
            continue
        seen: list[str] = [spec.name]
        following: str | None = spec.fallback
        while following is not None and following in tools and following not in seen:
            seen.append(following)
            following = tools[following].fallback
        if following is not None and following in seen:
            chain = " -> ".join([*seen, following])
            errors.append(f"tool {spec.name!r}: fallbacks loop ({chain})")
    return errors


class ToolCatalog(Mapping[str, ToolSpec]):
    """An immutable mapping of tool name to ToolSpec, with exports for model APIs."""

    __slots__ = ("_by_openai", "_tools")

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        """Build a catalog; raises ToolFileError on duplicate names or colliding OpenAI names."""
        tools: dict[str, ToolSpec] = {}
        by_openai: dict[str, str] = {}
        errors: list[str] = []
        for spec in specs:
            if spec.name in tools:
                errors.append(f"tool {spec.name!r}: duplicate tool name")
                continue
            mapped = openai_name(spec.name)
            if mapped in by_openai:
                errors.append(
                    f"tool {spec.name!r}: its OpenAI name {mapped!r} is also that of tool "
                    f"{by_openai[mapped]!r}"
                )
                continue
            tools[spec.name] = spec
            by_openai[mapped] = spec.name
        errors += _fallback_errors(tools)
        errors += _verify_errors(tools)
        if errors:
            raise ToolFileError(errors)
        self._tools: Mapping[str, ToolSpec] = MappingProxyType(tools)
        self._by_openai: Mapping[str, str] = MappingProxyType(by_openai)

    @classmethod
    def from_yaml_files(cls, paths: Iterable[str | Path]) -> ToolCatalog:
        """Load every file (`tools: [...]` or a top-level list); all errors are raised at once."""
        errors: list[str] = []
        specs: list[ToolSpec] = []
        first_seen: dict[str, str] = {}
        for path in paths:
            loaded, file_errors = _load_file(Path(path))
            errors.extend(file_errors)
            for spec, where in loaded:
                if spec.name in first_seen:
                    errors.append(
                        f"{path}: tool {spec.name!r} ({where}): duplicate tool name "
                        f"(first defined in {first_seen[spec.name]})"
                    )
                    continue
                first_seen[spec.name] = f"{path} {where}"
                specs.append(spec)
        if errors:
            raise ToolFileError(errors)
        return cls(specs)

    def __getitem__(self, name: str) -> ToolSpec:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolCatalog({sorted(self._tools)!r})"

    def only(self, keep: Callable[[ToolSpec], bool]) -> ToolCatalog:
        """The tools `keep` accepts (fallbacks outside the selection are not checked again)."""
        selected = ToolCatalog.__new__(ToolCatalog)
        tools = {name: spec for name, spec in self._tools.items() if keep(spec)}
        selected._tools = MappingProxyType(tools)
        selected._by_openai = MappingProxyType(
            {k: v for k, v in self._by_openai.items() if v in tools}
        )
        return selected

    def names(self) -> list[str]:
        """Tool names in definition order."""
        return list(self._tools)

    def resolve_openai_name(self, name: str) -> str | None:
        """The tool name for a function name from a model (mapped or the real dotted name)."""
        if name in self._tools:
            return name
        return self._by_openai.get(name)

    def enabled(self) -> list[ToolSpec]:
        """The tools that may be called, in definition order."""
        return [spec for spec in self._tools.values() if spec.enabled]
