"""A typed client of the Agent-Reach controller's REST API (sync `Client`, async `AsyncClient`)."""

from agent_reach_client._async import AsyncClient
from agent_reach_client._sync import Client
from agent_reach_client.errors import PendingCalls, ProblemError
from agent_reach_client.types import Accepted, Event, PendingCall, Task, TaskError, Turn

__all__ = [
    "Accepted",
    "AsyncClient",
    "Client",
    "Event",
    "PendingCall",
    "PendingCalls",
    "ProblemError",
    "Task",
    "TaskError",
    "Turn",
]
