"""Prometheus vocabulary of every component: metric names, label names and values, buckets.

Names are in base units (seconds) under `agent_reach_`; counters are declared without the
`_total` the exposition adds. Labels stay low-cardinality: a tool name (bounded by the catalogue),
an outcome, a reason (an `ErrorCode` value) or a state — never a task or step id. Alert rules and
the dashboard in `deploy/` use only these names (a test checks it).
"""

from __future__ import annotations

from typing import Final

# Controller: the queue, computed from the database by every replica's background loop.
QUEUE_DEPTH: Final = "agent_reach_queue_depth"  # gauge {tool}: ready steps, due or not
QUEUE_OLDEST_READY_AGE: Final = "agent_reach_queue_oldest_ready_age_seconds"  # gauge {tool}
# Controller: each executor pool's share of the work, for autoscaling a pool (from zero).
POOL_QUEUE_DEPTH: Final = "agent_reach_pool_queue_depth"  # gauge {pool}: ready steps it may take
POOL_RUNNING: Final = "agent_reach_pool_running_steps"  # gauge {pool}: steps its executors hold
POOL_OLDEST_READY_AGE: Final = "agent_reach_pool_queue_oldest_ready_age_seconds"  # gauge {pool}
POOL_SLOTS: Final = "agent_reach_pool_executor_slots"  # gauge {pool}: slots of its last executor
POOL: Final = "pool"
# Controller: dispatch.
SCHEDULE_TO_START: Final = "agent_reach_schedule_to_start_seconds"  # histogram {tool}
STEP_DURATION: Final = "agent_reach_step_duration_seconds"  # histogram {tool, outcome}
STEPS: Final = "agent_reach_steps"  # counter {tool, outcome}
# Leases handed to executors, by how: a claim from the queue, or a hand-off to a waiting poll in
# the submit's own transaction.
STEPS_LEASED: Final = "agent_reach_steps_leased"  # counter {path}: see LEASE_PATHS
RETRIES: Final = "agent_reach_retries"  # counter {tool, reason}
# Attempts to reach one target of a fan-out step (notify), by channel: see CHANNELS.
DELIVERIES: Final = "agent_reach_deliveries"  # counter {tool, channel, outcome}
RATE_LIMITED: Final = "agent_reach_rate_limited"  # counter {tool}: steps a bucket deferred
TOOL_PAUSES: Final = "agent_reach_tool_pauses"  # counter {tool}: a downstream said slow down
BREAKER_STATE: Final = "agent_reach_breaker_state"  # gauge {tool}: see BREAKER_STATES
LEASE_EXPIRATIONS: Final = "agent_reach_lease_expirations"  # counter
RESULTS_REJECTED: Final = "agent_reach_results_rejected"  # counter {reason}
# Executor calls refused before anything was read or applied: no or a bad credential, a session
# that ended, or a connector outside the pool's scope.
EXECUTOR_AUTH_FAILURES: Final = "agent_reach_executor_auth_failures"  # counter {reason}
EXECUTOR_SESSIONS_ENDED: Final = "agent_reach_executor_sessions_ended"  # counter {reason}
SWEEP_FAILURES: Final = "agent_reach_sweep_failures"  # counter {sweep}
# Controller: submits sharing a transaction (group commit), and groups split to run alone.
SUBMIT_GROUP_SIZE: Final = "agent_reach_submit_group_size"  # histogram: submits per transaction
SUBMIT_GROUPS_SPLIT: Final = "agent_reach_submit_groups_split"  # counter
# Agent runs: model calls and what they counted for, per agent and model; runs by their end.
MODEL_CALLS: Final = "agent_reach_model_calls"  # counter {agent, version, model}
MODEL_TOKENS: Final = "agent_reach_model_tokens"  # counter {agent, version, model, kind}
MODEL_COST: Final = "agent_reach_model_cost"  # counter {agent, version, model}: price units
RUNS_ENDED: Final = "agent_reach_runs_ended"  # counter {agent, version, status, reason}
# Per agent version, to judge it by (completion: RUNS_ENDED by reason; these the rest).
RUN_ROUNDS: Final = "agent_reach_run_rounds"  # counter {agent, version}: rounds of ended runs
RUNS_UNGROUNDED: Final = "agent_reach_runs_ungrounded"  # counter {agent, version}
RUN_TOOL_CALLS: Final = "agent_reach_run_tool_calls"  # counter {agent, version, outcome}
TOKEN_KINDS: Final = ("input", "output", "cached")
# Executor.
EXECUTOR_SLOTS: Final = "agent_reach_executor_slots"  # gauge {state}
EXECUTOR_CALL_DURATION: Final = "agent_reach_executor_call_duration_seconds"  # {tool, outcome}
EXECUTOR_RESULTS: Final = "agent_reach_executor_results"  # counter {result}
# Calls to the controller (Register, PollSteps, Heartbeat, ReportResults), by transport.
EXECUTOR_CONTROLLER_CALLS: Final = "agent_reach_executor_controller_calls"  # {method, transport}

# Label names.
TOOL: Final = "tool"
OUTCOME: Final = "outcome"
REASON: Final = "reason"
SWEEP: Final = "sweep"
PATH: Final = "path"
STATE: Final = "state"
RESULT: Final = "result"
CHANNEL: Final = "channel"
AGENT: Final = "agent"
VERSION: Final = "version"
MODEL: Final = "model"
KIND: Final = "kind"
STATUS: Final = "status"
METHOD: Final = "method"
TRANSPORT: Final = "transport"

# The exemplar label every histogram observation carries: the task's W3C trace id.
TRACE_ID: Final = "trace_id"

# `outcome` of an attempt the controller closed: the state the step moved to, or `retried` when
# it went back to the queue (a retry, or its tool's fallback).
RETRIED: Final = "retried"
# `outcome` of a call on the executor.
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
# `reason` of a retry whose error code is not one of ours (a plugin's own code).
OTHER: Final = "other"
# `channel` of a delivery: the target's own word when it is one of these, else OTHER.
CHANNELS: Final = frozenset({"webhook", "slack", "email"})
# `path` of a lease.
CLAIMED: Final = "claimed"
HANDED_OFF: Final = "handed_off"
LEASE_PATHS: Final = (CLAIMED, HANDED_OFF)
# `state` of an executor slot.
BUSY: Final = "busy"
FREE: Final = "free"
# `transport` of an executor's call: a unary call, or a message on its Exchange stream.
UNARY: Final = "unary"
STREAM: Final = "stream"
# `result` of a reported result.
ACCEPTED: Final = "accepted"
REJECTED: Final = "rejected"

# agent_reach_breaker_state values.
BREAKER_STATES: Final = {"closed": 0, "half_open": 1, "open": 2}

# Submits per transaction (group commit).
GROUP_SIZE_BUCKETS: Final = (1, 2, 4, 8, 16, 32)

# Latency buckets (seconds) shared by every latency histogram: 5 ms to 5 minutes.
LATENCY_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
