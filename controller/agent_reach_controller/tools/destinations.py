"""Which tools must list their `destinations`, and whether a list is well formed (when loaded)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_reach.destinations import Destinations, destination_from_arguments

# Connectors that read `config.destinations` (the rest never send where their arguments say).
_READERS = frozenset({"http", "notify"})
_ENTRIES = "host names, *.suffix, addresses"


# A refusal: its code (`destinations_required`, `destinations_invalid`) and what it says.
Problem = tuple[str, str]
REQUIRED = "destinations_required"
INVALID = "destinations_invalid"


def destinations_problem(connector: str, config: Mapping[str, Any]) -> Problem | None:
    """Why a tool's connector config is refused for its `destinations`, or None.

    Required when the destination comes from the call's arguments: an `http` URL with a
    `{placeholder}` in its scheme, host or port, and every `notify` tool (its targets are
    arguments). Where given, every entry must parse; an http tool takes no `@domain`.
    """
    if connector not in _READERS:
        return None
    raw = config.get("destinations")
    if raw is None:
        required = _required(connector, config)
        return None if required is None else (REQUIRED, required)
    if not isinstance(raw, list) or not raw:
        return INVALID, f"destinations must be a non-empty list of {_kinds(connector)}"
    try:
        parsed = Destinations.parse(raw)
    except ValueError as exc:
        return INVALID, str(exc)
    if connector == "http" and parsed.reaches_mail:
        return INVALID, "an @domain entry of destinations names email recipients; http sends none"
    return None


def _required(connector: str, config: Mapping[str, Any]) -> str | None:
    if connector == "notify":
        return (
            "destinations is required: a notify tool's targets come from its arguments; "
            f"list where it may send ({_kinds(connector)})"
        )
    url = config.get("url")
    if isinstance(url, str) and destination_from_arguments(url):
        return (
            "destinations is required: an argument of the url reaches its scheme, host or "
            f"port; list the hosts it may reach ({_kinds(connector)})"
        )
    return None


def _kinds(connector: str) -> str:
    return f"{_ENTRIES}, @domain for email" if connector == "notify" else _ENTRIES
