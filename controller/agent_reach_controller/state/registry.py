"""Tool definitions by version: the live catalog plus every version a task was pinned to."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from agent_reach_controller.db.engine import Database
from agent_reach_controller.state import store
from agent_reach_controller.tools.catalog import ToolCatalog, ToolSpec


class UnknownToolVersionError(LookupError):
    """A step names a tool version no longer known to this controller."""


class ToolRegistry:
    """Resolves (name, version) to a ToolSpec; versions are immutable once stored."""

    def __init__(self, catalog: ToolCatalog, db: Database) -> None:
        self.catalog = catalog
        self._db = db
        self._versions: dict[tuple[str, str], ToolSpec] = {
            (tool.name, tool.version): tool for tool in catalog.values()
        }

    async def sync(self) -> None:
        """Store the live catalog's versions so tasks pinned to them survive catalog changes."""
        now = datetime.now(UTC)
        rows = [
            {
                "name": tool.name,
                "version": tool.version,
                "spec": tool.model_dump(mode="json"),
                "created_at": now,
            }
            for tool in self.catalog.values()
        ]
        async with self._db.transaction() as conn:
            await store.save_tool_versions(conn, rows)

    async def ensure(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Load any of these versions not yet cached (before a synchronous `get`)."""
        missing = [p for p in set(pairs) if p not in self._versions]
        if not missing:
            return
        async with self._db.transaction() as conn:
            for name, version in missing:
                spec = await store.load_tool_version(conn, name, version)
                if spec is not None:
                    self._versions[(name, version)] = ToolSpec.model_validate(spec)

    def get(self, name: str, version: str) -> ToolSpec:
        """The exact version a step was validated against."""
        try:
            return self._versions[(name, version)]
        except KeyError:
            raise UnknownToolVersionError(f"tool {name!r} version {version!r} is unknown") from None
