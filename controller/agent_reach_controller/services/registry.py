"""The tool catalogue, stored: live heads every replica shares, and every version ever used.

A change (create, update, disable, enable, delete, or a whole import) is one transaction that
holds the catalogue's revision row: it checks the catalogue that would result as a whole (names,
fallbacks), stores any new immutable version, moves the heads, appends one history row and one
audit entry per tool, and bumps the revision. Replicas compare that revision at each claim (and
before validating a submit) and reload when it moved, so a disabled tool is refused from the next
dispatch on, in every replica. Tasks keep the versions they were validated against.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from agent_reach_controller.audit import log as audit
from agent_reach_controller.storage import catalog
from agent_reach_controller.storage.catalog import ChangeRow, HeadRow
from agent_reach_controller.storage.engine import Connection, Database
from agent_reach_controller.tools.catalog import STORED, ToolCatalog, ToolFileError, ToolSpec
from agent_reach_controller.tools.destinations import destinations_problem

log = logging.getLogger(__name__)
ChangeAction = Literal["create", "update", "disable", "enable", "delete"]
# Paths under /v1/tools that are not tools.
RESERVED_NAMES = frozenset({"breakers"})
# Who disabled a stored tool that sends where its arguments say without `config.destinations`
# (shown as the tool's `updated_by`, and in its history and audit entry).
UNDECLARED_DESTINATIONS_BY = "agent-reach (config.destinations required)"


class UnknownToolVersionError(LookupError):
    """A step names a tool version no longer known to this controller."""


class ToolNotFoundError(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"tool {name!r} is not in the catalogue")
        self.name = name


class ToolExistsError(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(f"tool {name!r} already exists; update it instead")
        self.name = name


class StaleRevisionError(Exception):
    """The caller's If-Match names a revision the tool has moved past."""

    def __init__(self, name: str, expected: int, current: int) -> None:
        super().__init__(
            f"tool {name!r} is at revision {current}, not {expected}: read it again, then retry"
        )
        self.current = current


class CatalogRejectedError(ToolFileError):
    """The catalogue a change would leave is not valid; `errors` says why, one per line."""


@dataclass(frozen=True, slots=True)
class ToolHead:
    """A tool as the catalogue holds it now."""

    spec: ToolSpec
    revision: int
    updated_by: str
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Planned:
    name: str
    action: ChangeAction
    spec: ToolSpec | None  # None: deleted
    reason: str | None = None  # why, when the controller made the change itself


@dataclass(slots=True)
class CatalogDiff:
    """What a change did (or, dry, would do)."""

    revision: int
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    enabled: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def add(self, planned: Planned) -> None:
        action = planned.action
        getattr(self, "created" if action == "create" else f"{action}d").append(planned.name)


Editor = Callable[[Mapping[str, ToolHead]], list[Planned]]


def respec(spec: ToolSpec, *, stored: bool = False, **changes: Any) -> ToolSpec:
    """A new spec with some fields changed (validated again; a copy would keep the old version).

    `stored`: validated as a stored version is, so checks made stricter since it was written
    do not refuse it (to disable it, or to compare it); enabling one checks it as new.
    """
    dumped = {**spec.model_dump(mode="json"), **changes}
    return ToolSpec.model_validate(dumped, context=STORED if stored else None)


def undeclared_destinations(spec: ToolSpec) -> str | None:
    """Why a stored tool may not run as it is: it sends where its arguments say and does not
    list its `destinations` (in `config`, or in its sandbox's config). None when it may."""
    for field_name, config in (("config", spec.config), ("sandbox", spec.sandbox_config)):
        problem = None if config is None else destinations_problem(spec.connector, config)
        if problem is not None:
            return f"{field_name}.{problem[1]}"
    return None


def _planned_update(old: ToolSpec, new: ToolSpec) -> Planned | None:
    if old.version == new.version:
        return None
    if respec(old, stored=True, enabled=new.enabled).version == new.version:
        return Planned(new.name, "enable" if new.enabled else "disable", new)
    return Planned(new.name, "update", new)


# The version of a refused call's step whose tool is not in the catalogue (planning.RefusedCall).
UNCATALOGUED = ""


@functools.lru_cache(maxsize=1024)
def uncatalogued(name: str) -> ToolSpec:
    """A stand-in for a tool the catalogue does not have: only ever named by a failed step."""
    return ToolSpec.model_construct(name=name, description="not in the catalogue", connector="-")


class ToolRegistry:
    """Resolves (name, version) to a ToolSpec, and changes the live catalogue."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.catalog = ToolCatalog()
        self.heads: Mapping[str, ToolHead] = {}
        self.revision = -1
        self._versions: dict[tuple[str, str], ToolSpec] = {}

    # --- reading ------------------------------------------------------------------------------

    async def refresh(self, conn: Connection | None = None, *, revision: int | None = None) -> None:
        """Reload the live catalogue if another change committed since the last look (or if
        `revision`, just read in this transaction, is not the one installed)."""
        if conn is None:
            async with self._db.transaction() as fresh:
                await self.refresh(fresh)
            return
        if revision is None:
            revision = await catalog.revision(conn)
        if revision != self.revision:
            self._install(await catalog.load_heads(conn), revision)

    def _install(self, rows: Iterable[HeadRow], revision: int) -> None:
        if revision < self.revision:
            return  # a slower reload of an older state
        heads = {
            row.name: ToolHead(
                # Versions are immutable: one parsed before (schemas, CEL) is reused.
                spec=self._versions.get((row.name, row.version))
                or ToolSpec.model_validate(row.spec, context=STORED),
                revision=row.revision,
                updated_by=row.updated_by,
                updated_at=row.updated_at,
            )
            for row in rows
        }
        for head in heads.values():
            self._versions.setdefault((head.spec.name, head.spec.version), head.spec)
        self.catalog = ToolCatalog(head.spec for head in heads.values())
        self.heads = heads
        self.revision = revision

    async def ensure(
        self, pairs: Iterable[tuple[str, str]], *, conn: Connection | None = None
    ) -> None:
        """Load any of these versions not yet cached (before a synchronous `get`).

        Inside a transaction, pass its `conn`: a second transaction would wait for the first on
        SQLite (one writer) and take a second pooled connection under row locks on Postgres.
        """
        missing = [p for p in set(pairs) if p not in self._versions and p[1] != UNCATALOGUED]
        if not missing:
            return
        if conn is None:
            async with self._db.transaction() as fresh:
                await self.ensure(missing, conn=fresh)
            return
        for name, version in missing:
            spec = await catalog.load_version(conn, name, version)
            if spec is not None:
                self._versions[(name, version)] = ToolSpec.model_validate(spec, context=STORED)

    def get(self, name: str, version: str) -> ToolSpec:
        """The exact version a step was validated against (for a refused call to a tool the
        catalogue does not have, a stand-in that runs nothing)."""
        try:
            return self._versions[(name, version)]
        except KeyError:
            if version == UNCATALOGUED:
                return uncatalogued(name)
            raise UnknownToolVersionError(f"tool {name!r} version {version!r} is unknown") from None

    async def version(self, name: str, version: str) -> ToolSpec:
        """Any stored version of a tool, current or not."""
        await self.ensure([(name, version)])
        try:
            return self.get(name, version)
        except UnknownToolVersionError:
            raise ToolNotFoundError(f"{name}@{version}") from None

    async def history(self, name: str, *, limit: int = 100) -> list[ChangeRow]:
        async with self._db.transaction() as conn:
            changes = await catalog.history(conn, name, limit=limit)
        if not changes:
            raise ToolNotFoundError(name)
        return changes

    # --- changing -----------------------------------------------------------------------------

    async def create(self, spec: ToolSpec, *, principal: str, tenant: str | None) -> ToolHead:
        def edit(heads: Mapping[str, ToolHead]) -> list[Planned]:
            if spec.name in heads:
                raise ToolExistsError(spec.name)
            return [Planned(spec.name, "create", spec)]

        await self._change(edit, principal=principal, tenant=tenant)
        return self.heads[spec.name]

    async def update(
        self, spec: ToolSpec, *, principal: str, tenant: str | None, if_revision: int | None = None
    ) -> ToolHead:
        """Replace a tool's definition; the same definition again changes nothing."""

        def edit(heads: Mapping[str, ToolHead]) -> list[Planned]:
            old = self._current(heads, spec.name, if_revision)
            planned = _planned_update(old.spec, spec)
            return [planned] if planned else []

        await self._change(edit, principal=principal, tenant=tenant)
        return self.heads[spec.name]

    async def set_enabled(
        self,
        name: str,
        enabled: bool,
        *,
        principal: str,
        tenant: str | None,
        if_revision: int | None = None,
    ) -> ToolHead:
        def edit(heads: Mapping[str, ToolHead]) -> list[Planned]:
            old = self._current(heads, name, if_revision).spec
            if old.enabled is enabled:
                return []
            try:
                changed = respec(old, stored=not enabled, enabled=enabled)
            except ValidationError as exc:  # stored before a check it fails now: fix it first
                raise CatalogRejectedError(
                    [f"tool {name!r}: {_where(e['loc'])}: {e['msg']}" for e in exc.errors()]
                ) from None
            return [Planned(name, "enable" if enabled else "disable", changed)]

        await self._change(edit, principal=principal, tenant=tenant)
        return self.heads[name]

    async def disable_undeclared(self) -> list[str]:
        """Disable every enabled tool that sends where its arguments say but lists no
        `destinations` (stored before they were required); the names disabled.

        Run at start: such a tool stays in the catalogue, disabled, with the reason in its
        history and audit entry, and the controller starts. Enabling it again checks it as a
        new definition, so it needs its `destinations` first.
        """

        def edit(heads: Mapping[str, ToolHead]) -> list[Planned]:
            planned: list[Planned] = []
            for name, head in heads.items():
                reason = undeclared_destinations(head.spec) if head.spec.enabled else None
                if reason is not None:
                    spec = respec(head.spec, stored=True, enabled=False)
                    planned.append(Planned(name, "disable", spec, reason=reason))
            return planned

        diff = await self._change(edit, principal=UNDECLARED_DESTINATIONS_BY, tenant=None)
        for name in diff.disabled:
            log.warning(
                "tool %s: disabled: %s",
                name,
                undeclared_destinations(self.heads[name].spec),
                extra={"event": "tool_disabled_undeclared_destinations", "tool": name},
            )
        return diff.disabled

    async def delete(
        self, name: str, *, principal: str, tenant: str | None, if_revision: int | None = None
    ) -> None:
        """Take a tool out of the catalogue; its versions stay for the tasks pinned to them."""

        def edit(heads: Mapping[str, ToolHead]) -> list[Planned]:
            self._current(heads, name, if_revision)
            return [Planned(name, "delete", None)]

        await self._change(edit, principal=principal, tenant=tenant)

    async def apply(
        self,
        specs: Iterable[ToolSpec],
        *,
        principal: str,
        tenant: str | None = None,
        prune: bool = False,
        dry_run: bool = False,
    ) -> CatalogDiff:
        """Make the catalogue hold these definitions (an import; also the --tools files).

        Tools not named stay, unless `prune`: then they are deleted.
        """
        wanted = {spec.name: spec for spec in specs}

        def edit(heads: Mapping[str, ToolHead]) -> list[Planned]:
            planned: list[Planned] = []
            for name, spec in wanted.items():
                head = heads.get(name)
                if head is None:
                    planned.append(Planned(name, "create", spec))
                elif (change := _planned_update(head.spec, spec)) is not None:
                    planned.append(change)
            if prune:
                planned += [Planned(n, "delete", None) for n in heads if n not in wanted]
            return planned

        diff = await self._change(edit, principal=principal, tenant=tenant, dry_run=dry_run)
        touched = {*diff.created, *diff.updated, *diff.disabled, *diff.enabled}
        diff.unchanged = sorted(n for n in wanted if n not in touched)
        return diff

    async def seed(self, specs: Iterable[ToolSpec], *, principal: str) -> list[str]:
        """Create these tools where the catalogue has never held a tool of their name; the
        names created.

        Seeding gives a default once; the catalogue's history owns what follows: a tool an
        admin changed, disabled or deleted since stays so.
        """
        wanted = list(specs)
        async with self._db.transaction() as conn:
            known = {s.name for s in wanted if await catalog.history(conn, s.name, limit=1)}

        def edit(heads: Mapping[str, ToolHead]) -> list[Planned]:
            return [
                Planned(s.name, "create", s)
                for s in wanted
                if s.name not in heads and s.name not in known
            ]

        return (await self._change(edit, principal=principal, tenant=None)).created

    @staticmethod
    def _current(heads: Mapping[str, ToolHead], name: str, if_revision: int | None) -> ToolHead:
        head = heads.get(name)
        if head is None:
            raise ToolNotFoundError(name)
        if if_revision is not None and if_revision != head.revision:
            raise StaleRevisionError(name, if_revision, head.revision)
        return head

    async def _change(
        self, edit: Editor, *, principal: str, tenant: str | None, dry_run: bool = False
    ) -> CatalogDiff:
        async with self._db.transaction() as conn:
            revision = await catalog.revision(conn, lock=True)
            rows = await catalog.load_heads(conn)
            self._install(rows, revision)
            planned = edit(self.heads)
            _check(self.heads, planned)
            diff = CatalogDiff(revision=revision)
            for item in planned:
                diff.add(item)
            if dry_run or not planned:
                return diff
            now = datetime.now(UTC)
            changes = [
                ChangeRow(
                    revision=revision + n,
                    name=item.name,
                    action=item.action,
                    version=item.spec.version if item.spec else None,
                    principal=principal,
                    created_at=now,
                )
                for n, item in enumerate(planned, start=1)
            ]
            specs = {i.spec.version: i.spec.model_dump(mode="json") for i in planned if i.spec}
            await catalog.write_changes(conn, changes, specs=specs)
            for change, item in zip(changes, planned, strict=True):
                data: dict[str, Any] = {"version": change.version, "revision": change.revision}
                if item.reason is not None:
                    data["reason"] = item.reason
                await audit.record(
                    conn,
                    actor=principal,
                    tenant=tenant,
                    action=f"tool.{change.action}",
                    target=f"tool:{change.name}",
                    data=data,
                    now=now,
                )
            diff.revision = changes[-1].revision
            rows = await catalog.load_heads(conn)
        self._install(rows, diff.revision)
        return diff


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(tool)"


def _check(heads: Mapping[str, ToolHead], planned: list[Planned]) -> None:
    """The catalogue after `planned` must be valid as a whole, or nothing is changed."""
    after = {name: head.spec for name, head in heads.items()}
    errors: list[str] = []
    for item in planned:
        if item.spec is None:
            after.pop(item.name, None)
            continue
        if item.name in RESERVED_NAMES:
            errors.append(f"tool {item.name!r}: the name is reserved")
        after[item.name] = item.spec
    try:
        ToolCatalog(after.values())
    except ToolFileError as exc:
        errors += exc.errors
    if errors:
        raise CatalogRejectedError(errors)
