"""The permission matrix: roles → tool name patterns → actions.

    roles:
      agent:    [{tools: "orders.*", actions: [submit]}]
      approver: [{tools: "payments.*", actions: [approve]}]

An action on a tool is allowed when any of the principal's roles has a grant whose pattern
matches the tool's name (shell-style: `*`, `?`, `[...]`). `admin` on `*` manages keys and tools.
Nothing is allowed that no grant names: a role without grants may only read its tenant's tasks.
Long-term memory has its own actions, `memory_read`, `memory_write` and `memory_forget`, granted
on `*` (by default: admin and operator all three, agent read and write, viewer read).

Tenants may have blast-radius caps (see `flow/caps.py`); `"*"` is every tenant's default, and a
tenant's own entry replaces it class by class:

    tenants:
      "*":  {caps: {payment: {limit: 10, window: 24h}}, per_task: {payment: 1}}
      acme: {caps: {payment: {limit: 50, window: 24h}, cost: {limit: 1000, window: 1h}}}

A tenant runs in an environment: `dev`, `sandbox` (writes go to each tool's sandbox target, or
are refused) or `prod` (every write waits for approval unless its tool is exempted). Its own
entry's `environment` decides, else the `"*"` entry's, else the controller's
(AGENT_REACH_CONTROLLER_ENVIRONMENT, default `dev`):

    tenants:
      "*":    {environment: prod}
      lab:    {environment: sandbox}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_reach_controller.decide.caps import TenantCaps
from agent_reach_controller.settings import Environment
from agent_reach_controller.tools.catalog import MAX_UNITS, EffectClass, Seconds, ToolSpec
from agent_reach_controller.tools.memory import FORGET, LIST, SEARCH, is_memory_tool

M = TypeVar("M", bound=BaseModel)

# The longest window a tenant's cap may count over.
MAX_CAP_WINDOW_S = 31 * 24 * 3600.0
CapLimit = Annotated[float, Field(ge=0, le=MAX_UNITS, allow_inf_nan=False)]


class Action(StrEnum):
    SUBMIT = "submit"
    APPROVE = "approve"
    ADMIN = "admin"
    # Long-term memory (/v1/memory): read and search, write and patch, delete. Not per tool:
    # a grant gives them when its pattern is `*`.
    MEMORY_READ = "memory_read"
    MEMORY_WRITE = "memory_write"
    MEMORY_FORGET = "memory_forget"


# What a step of one of memory's tools does to its subject's memory, as a right (by its
# `config.op`); an op memory does not know does nothing but fail, and is asked no more than a save.
_MEMORY_RIGHTS = {
    SEARCH: Action.MEMORY_READ,
    LIST: Action.MEMORY_READ,
    FORGET: Action.MEMORY_FORGET,
}


def memory_action(tool: ToolSpec) -> Action | None:
    """The memory right a step of `tool` needs of whoever has it run (a caller's task, or a run
    the caller started): read for search and list, write for save, forget for forget; None for
    a tool that is not memory's."""
    if not is_memory_tool(tool):
        return None
    return _MEMORY_RIGHTS.get(str(tool.config.get("op")), Action.MEMORY_WRITE)


class Grant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tools: str = Field(min_length=1, max_length=200)
    actions: list[Action] = Field(min_length=1)


class WindowCap(BaseModel):
    """At most `limit` units of one class across all the tenant's tasks in any `window`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: CapLimit
    window: Annotated[Seconds, Field(le=MAX_CAP_WINDOW_S)]


class TenantLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Per rolling window, across the tenant's tasks.
    caps: dict[EffectClass, WindowCap] = Field(default_factory=dict)
    # Over each task's life, besides (and never looser than) the task's own caps.
    per_task: dict[EffectClass, CapLimit] = Field(default_factory=dict)
    # Where the tenant's tasks run; None: the `"*"` entry's, else the controller's.
    environment: Environment | None = None


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    roles: dict[str, list[Grant]]
    tenants: dict[str, TenantLimits] = Field(default_factory=dict)

    def caps_for(self, tenant: str) -> TenantCaps:
        """A tenant's caps: its own entry's classes, then the `"*"` entry's for the others."""
        default = self.tenants.get("*", _NO_LIMITS)
        own = self.tenants.get(tenant, _NO_LIMITS)
        windows = {**default.caps, **own.caps}
        return TenantCaps(
            windows={name: (cap.limit, cap.window) for name, cap in windows.items()},
            per_task={**default.per_task, **own.per_task},
        )

    def environment_for(self, tenant: str, default: Environment) -> Environment:
        """Where a tenant's tasks run: its own entry's environment, else the `"*"` entry's,
        else `default` (the controller's)."""
        for entry in (self.tenants.get(tenant), self.tenants.get("*")):
            if entry is not None and entry.environment is not None:
                return entry.environment
        return default

    def allows(self, roles: Iterable[str], action: Action, tool: str = "*") -> bool:
        for role in roles:
            for grant in self.roles.get(role, ()):
                if action in grant.actions and fnmatchcase(tool, grant.tools):
                    return True
        return False

    def roles_allowed(self, action: Action, tool: str) -> list[str]:
        """The roles that may take `action` on `tool`, sorted."""
        return sorted(role for role in self.roles if self.allows([role], action, tool))

    def is_admin(self, roles: Iterable[str]) -> bool:
        return any(
            Action.ADMIN in g.actions and g.tools == "*"
            for role in roles
            for g in self.roles.get(role, ())
        )


_NO_LIMITS = TenantLimits()
_MEMORY = ["memory_read", "memory_write", "memory_forget"]

DEFAULT = Policy.model_validate(
    {
        "roles": {
            "admin": [{"tools": "*", "actions": ["submit", "approve", "admin", *_MEMORY]}],
            "operator": [{"tools": "*", "actions": ["submit", "approve", *_MEMORY]}],
            "agent": [{"tools": "*", "actions": ["submit", "memory_read", "memory_write"]}],
            "approver": [{"tools": "*", "actions": ["approve"]}],
            "viewer": [{"tools": "*", "actions": ["memory_read"]}],
        }
    }
)


class PolicyFileError(Exception):
    pass


def load(path: Path | None) -> Policy:
    """The policy in a YAML file, or DEFAULT when there is none."""
    if path is None:
        return DEFAULT
    return read_yaml_model(path, Policy, PolicyFileError, what="the policy")


def read_yaml_model(path: Path, model: type[M], error: type[Exception], *, what: str) -> M:
    """A YAML file as a pydantic model; `error` says which file and which field is wrong."""
    try:
        document: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
        return model.model_validate(document)
    except (OSError, yaml.YAMLError) as exc:
        raise error(f"{path}: cannot read {what}: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise error(f"{path}: {problems}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """An authenticated caller."""

    name: str
    tenant: str
    roles: tuple[str, ...]
    key_id: str | None = None

    def labels(self) -> Mapping[str, str]:
        return {"principal": self.name, "tenant": self.tenant}
