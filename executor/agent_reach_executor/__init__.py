"""The executor: pulls leased steps from the controller and runs them through connectors."""

from agent_reach_executor.__main__ import run_executor
from agent_reach_executor.client import (
    Assignment,
    Backoff,
    ControllerClient,
    ControllerError,
    HeartbeatReply,
    LeaseKey,
    Registration,
    ResultAck,
    StepFailure,
    StepResult,
)
from agent_reach_executor.runner import StepRunner
from agent_reach_executor.settings import ExecutorSettings
from agent_reach_executor.worker import Worker, WorkerStats

__all__ = [
    "Assignment",
    "Backoff",
    "ControllerClient",
    "ControllerError",
    "ExecutorSettings",
    "HeartbeatReply",
    "LeaseKey",
    "Registration",
    "ResultAck",
    "StepFailure",
    "StepResult",
    "StepRunner",
    "Worker",
    "WorkerStats",
    "run_executor",
]
