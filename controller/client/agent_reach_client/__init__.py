"""A typed client of the Agent-Reach controller's REST API (sync `Client`, async `AsyncClient`)."""

from agent_reach_client._async import AsyncClient
from agent_reach_client._sync import Client
from agent_reach_client.errors import PendingCalls, ProblemError
from agent_reach_client.types import (
    Accepted,
    Agent,
    Event,
    Memory,
    MemorySubject,
    MemorySubjects,
    MemoryType,
    PendingCall,
    Run,
    RunEntry,
    RunLimits,
    RunTokens,
    Task,
    TaskError,
    Turn,
)

__all__ = [
    "Accepted",
    "Agent",
    "AsyncClient",
    "Client",
    "Event",
    "Memory",
    "MemorySubject",
    "MemorySubjects",
    "MemoryType",
    "PendingCall",
    "PendingCalls",
    "ProblemError",
    "Run",
    "RunEntry",
    "RunLimits",
    "RunTokens",
    "Task",
    "TaskError",
    "Turn",
]
