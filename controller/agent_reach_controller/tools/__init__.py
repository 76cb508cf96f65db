"""Tool definitions: the catalog the model sees and the retry policy each tool runs under."""

from agent_reach_controller.tools.catalog import (
    RetryPolicy,
    ToolCatalog,
    ToolFileError,
    ToolSpec,
    backoff_delay,
    openai_name,
    parse_duration,
)

__all__ = [
    "RetryPolicy",
    "ToolCatalog",
    "ToolFileError",
    "ToolSpec",
    "backoff_delay",
    "openai_name",
    "parse_duration",
]
