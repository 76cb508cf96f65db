"""Connectors: the plugins that turn a tool call into a real effect (HTTP, Python, ...)."""

from agent_reach_connectors.base import (
    Connector,
    ConnectorError,
    Throttled,
    ToolCall,
    load_connectors,
    resolve_secrets,
)
from agent_reach_connectors.pytools import tool

__all__ = [
    "Connector",
    "ConnectorError",
    "Throttled",
    "ToolCall",
    "load_connectors",
    "resolve_secrets",
    "tool",
]
