"""The tables: tools, tasks, steps, events and inbound idempotency records."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UtcDateTime(sa.TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend (SQLite stores naive UTC text)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# JSONB on Postgres (indexable, compact), JSON text elsewhere.
Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
# SQLite only autoincrements INTEGER PRIMARY KEY.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _now_column(name: str, **kw: Any) -> sa.Column[datetime]:
    return sa.Column(name, UtcDateTime(), nullable=False, **kw)


tools = sa.Table(
    "tools",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("version", sa.String(16), primary_key=True),
    sa.Column("spec", Json, nullable=False),
    _now_column("created_at"),
)

# The live catalogue: which version of each tool is current (`state/registry.py`). Versions in
# `tools` are immutable and kept after a delete, so tasks pinned to them still resolve.
tool_heads = sa.Table(
    "tool_heads",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("version", sa.String(16), nullable=False),
    # The catalogue revision of this tool's last change (its ETag).
    sa.Column("revision", sa.BigInteger(), nullable=False),
    sa.Column("updated_by", sa.String(128), nullable=False),
    _now_column("updated_at"),
)

# Every change to the catalogue, in order; `revision` numbers the whole catalogue's history.
tool_changes = sa.Table(
    "tool_changes",
    metadata,
    sa.Column("revision", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(128), nullable=False, index=True),
    sa.Column("action", sa.String(16), nullable=False),
    # None for a delete.
    sa.Column("version", sa.String(16)),
    sa.Column("principal", sa.String(128), nullable=False),
    _now_column("created_at"),
)

# One row: the catalogue's current revision. Writers lock it; replicas compare it to reload.
catalog_state = sa.Table(
    "catalog_state",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("revision", sa.BigInteger(), nullable=False),
)

tasks = sa.Table(
    "tasks",
    metadata,
    sa.Column("task_id", sa.String(36), primary_key=True),
    sa.Column("trace_id", sa.String(32), nullable=False, index=True),
    sa.Column("parent_span_id", sa.String(16)),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("principal", sa.String(128), nullable=False),
    # Whose task it is: another tenant's callers are told it does not exist.
    sa.Column("tenant", sa.String(128), nullable=False, server_default="default"),
    sa.Column("goal", sa.Text()),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("request", Json, nullable=False),
    sa.Column("context", Json, nullable=False),
    sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
    _now_column("created_at"),
    _now_column("updated_at"),
    sa.Column("finished_at", UtcDateTime()),
    sa.Column("deadline", UtcDateTime()),
    sa.Column("max_attempts", sa.Integer()),
    # The task's own blast-radius caps, {effect class: units}; NULL: none (see flow/caps.py).
    sa.Column("caps", Json),
    # Model tokens the caller reported spending on this task (POST /v1/tasks/{id}/usage).
    sa.Column("input_tokens", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("output_tokens", sa.BigInteger(), nullable=False, server_default="0"),
    # Where the task's end is announced (a submit's `webhook.url`; 0022).
    sa.Column("webhook_url", sa.String(2048)),
    # Where it runs, fixed at submit: dev, sandbox or prod (0025; NULL, from an older release:
    # dev).
    sa.Column("environment", sa.String(16)),
    # The agent run this task is a round of (0027); NULL for a caller's own task.
    sa.Column("run_id", sa.String(36)),
    # The end user it acts for, named by its caller (0030): a plain task's `subject`, a run's
    # rounds the run's. Memory's tools act for it; NULL: none, and they refuse.
    sa.Column("subject", sa.String(256)),
    sa.Index("ix_tasks_status_created_at", "status", "created_at"),
    sa.Index("ix_tasks_tenant_task_id", "tenant", "task_id"),
    # The task list's filters, each a keyset walk newest first (0026).
    sa.Index("ix_tasks_tenant_status_task_id", "tenant", "status", "task_id"),
    sa.Index("ix_tasks_tenant_principal_task_id", "tenant", "principal", "task_id"),
    # The retention sweep's index: finished tasks, oldest first (0020).
    sa.Index(
        "ix_tasks_finished_at",
        "finished_at",
        postgresql_where=sa.text("finished_at IS NOT NULL"),
        sqlite_where=sa.text("finished_at IS NOT NULL"),
    ),
    # A run's rounds (0028): only the tasks that are rounds of one.
    sa.Index(
        "ix_tasks_run_id",
        "run_id",
        postgresql_where=sa.text("run_id IS NOT NULL"),
        sqlite_where=sa.text("run_id IS NOT NULL"),
    ),
    # A subject's tasks, which a memory delete scrubs (0030): only the tasks that have one.
    sa.Index(
        "ix_tasks_tenant_subject",
        "tenant",
        "subject",
        postgresql_where=sa.text("subject IS NOT NULL"),
        sqlite_where=sa.text("subject IS NOT NULL"),
    ),
    # The deadline sweep's index: only unfinished tasks that have a deadline.
    sa.Index(
        "ix_tasks_open_deadline",
        "deadline",
        postgresql_where=sa.text("deadline IS NOT NULL AND status IN ('pending', 'running')"),
        sqlite_where=sa.text("deadline IS NOT NULL AND status IN ('pending', 'running')"),
    ),
)

steps = sa.Table(
    "steps",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column(
        "task_id",
        sa.String(36),
        sa.ForeignKey("tasks.task_id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("step_id", sa.String(64), nullable=False),
    sa.Column("position", sa.Integer(), nullable=False),
    sa.Column("trace_id", sa.String(32), nullable=False),
    sa.Column("tool", sa.String(128), nullable=False),
    sa.Column("tool_version", sa.String(16), nullable=False),
    sa.Column("connector", sa.String(64), nullable=False),
    sa.Column("args", Json, nullable=False),
    sa.Column("resolved_args", Json),
    sa.Column("depends_on", Json, nullable=False),
    sa.Column("when_expr", sa.Text()),
    sa.Column("status", sa.String(24), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("max_attempts", sa.Integer(), nullable=False),
    # The step's own retry policy when the plan overrode the tool's; NULL means the tool's.
    sa.Column("retry", Json),
    # The tool the step started with, once it has switched to that tool's fallback.
    sa.Column("fallback_from", sa.String(128)),
    # Digest of the tool's rate-limit key value for this step's arguments; NULL: the tool's bucket.
    sa.Column("rate_key", sa.String(32)),
    # Digest of the tool's concurrency_per_key value for this step's arguments; NULL: none.
    sa.Column("concurrency_key", sa.String(32)),
    # The step's own timeouts (overriding the tool's); NULL: the tool's.
    sa.Column("timeouts", Json),
    # When a queued attempt fails for want of an executor (schedule_to_start); NULL: never.
    sa.Column("start_by", UtcDateTime()),
    # Dispatch order: higher priority first; within a priority, tenants take turns.
    sa.Column("priority", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("tenant", sa.String(128), nullable=False, server_default="default"),
    # The API key that submitted the step: its grant is checked again when the step is leased.
    sa.Column("key_id", sa.String(12)),
    # Its task's environment, read where the step's approval and connector config are decided
    # (0025; NULL, from an older release: dev).
    sa.Column("environment", sa.String(16)),
    # The approval of a step that needs one (dangerous; in prod a write): what was asked (tool
    # version, hash of the exact arguments), until when, and the decision once made; checked
    # again when the step is leased.
    sa.Column("approval", Json),
    sa.Column("decide_by", UtcDateTime()),
    sa.Column("not_before", UtcDateTime()),
    # When the step was asked to run (`run_at`, or the submit plus `delay`): it is queued with
    # `not_before` at that time once its dependencies allow (0023).
    sa.Column("run_at", UtcDateTime()),
    # Who holds the lease: an executor session's id (`state/sessions.py`), whose liveness is the
    # lease's; or, for holders without a session (in-process tests), `lease_expires_at` bounds it.
    sa.Column("lease_owner", sa.String(128)),
    sa.Column("lease_expires_at", UtcDateTime()),
    # The holder's poll that took the lease (PollSteps.poll_seq), for heartbeat reconciliation.
    sa.Column("lease_seq", sa.BigInteger()),
    sa.Column("idempotency_key", sa.String(160), nullable=False),
    sa.Column("output", Json),
    sa.Column("error", Json),
    sa.Column("receipt", Json),
    _now_column("created_at"),
    _now_column("updated_at"),
    sa.Column("started_at", UtcDateTime()),
    sa.Column("finished_at", UtcDateTime()),
    sa.UniqueConstraint("task_id", "step_id"),
    # The claim query's index: only ready rows, in connector and id order.
    sa.Index(
        "ix_steps_ready",
        "connector",
        "id",
        postgresql_where=sa.text("status = 'ready'"),
        sqlite_where=sa.text("status = 'ready'"),
    ),
    # When the next deferred step is due (every claim asks): only queued steps not due yet.
    sa.Index(
        "ix_steps_ready_deferred",
        "connector",
        "not_before",
        postgresql_where=sa.text("status = 'ready' AND not_before IS NOT NULL"),
        sqlite_where=sa.text("status = 'ready' AND not_before IS NOT NULL"),
    ),
    # Fair claims: each tenant's queued steps in dispatch order, and the distinct tenants.
    sa.Index(
        "ix_steps_ready_fair",
        "tenant",
        sa.text("priority DESC"),
        "id",
        postgresql_where=sa.text("status = 'ready'"),
        sqlite_where=sa.text("status = 'ready'"),
    ),
    # The approval-expiry sweep's index: only steps waiting for a decision.
    sa.Index(
        "ix_steps_awaiting_decide_by",
        "decide_by",
        postgresql_where=sa.text("status = 'awaiting_approval'"),
        sqlite_where=sa.text("status = 'awaiting_approval'"),
    ),
    # The schedule-to-start sweep's index: only queued rows that have such a timeout.
    sa.Index(
        "ix_steps_ready_start_by",
        "start_by",
        postgresql_where=sa.text("status = 'ready' AND start_by IS NOT NULL"),
        sqlite_where=sa.text("status = 'ready' AND start_by IS NOT NULL"),
    ),
    # The task list's tool filter: a tenant's tasks that call a tool, newest first (0026).
    sa.Index("ix_steps_tenant_tool_task_id", "tenant", "tool", "task_id"),
    # The lease reaper's index: only running rows, by expiry.
    sa.Index(
        "ix_steps_running_lease",
        "lease_expires_at",
        postgresql_where=sa.text("status = 'running'"),
        sqlite_where=sa.text("status = 'running'"),
    ),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("task_id", sa.String(36), nullable=False),
    sa.Column("step_id", sa.String(64)),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("from_status", sa.String(24)),
    sa.Column("to_status", sa.String(24)),
    sa.Column("attempt", sa.Integer()),
    sa.Column("data", Json),
    _now_column("created_at"),
    sa.Index("ix_events_task_id_id", "task_id", "id"),
)

breakers = sa.Table(
    "breakers",
    metadata,
    sa.Column("tool", sa.String(128), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("window_started_at", UtcDateTime(), nullable=False),
    sa.Column("calls", sa.Integer(), nullable=False),
    sa.Column("failures", sa.Integer(), nullable=False),
    sa.Column("opened_at", UtcDateTime()),
    _now_column("updated_at"),
)

# GCRA buckets when Redis is not in use or not reachable: the theoretical arrival time of each
# bucket, in Unix seconds. Only the claim transaction reads and writes them, under row locks.
rate_buckets = sa.Table(
    "rate_buckets",
    metadata,
    sa.Column("bucket", sa.String(200), primary_key=True),
    sa.Column("tat", sa.Float(), nullable=False),
)

# A whole tool held back because its downstream said so (429 Retry-After, X-RateLimit-Reset).
tool_pauses = sa.Table(
    "tool_pauses",
    metadata,
    sa.Column("tool", sa.String(128), primary_key=True),
    sa.Column("until", UtcDateTime(), nullable=False),
    sa.Column("reason", sa.String(200), nullable=False),
    _now_column("updated_at"),
)

# API keys: the secret is stored only as a SHA-256; `key_id` is public.
api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("key_id", sa.String(12), primary_key=True),
    sa.Column("secret_hash", sa.String(64), nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("roles", Json, nullable=False),
    _now_column("created_at"),
    sa.Column("created_by", sa.String(128), nullable=False),
    sa.Column("revoked_at", UtcDateTime()),
)

idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("principal", sa.String(128), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("request_hash", sa.String(64), nullable=False),
    sa.Column("task_id", sa.String(36), nullable=False),
    _now_column("created_at"),
    # A pruned task takes its keys with it (0020).
    sa.Index("ix_idempotency_keys_task_id", "task_id"),
)

# Append-only, hash-chained audit log (`audit/`): rows are inserted unsealed (seq, prev_hash, hash
# NULL) and chained later by the sealer; triggers refuse DELETE and any other UPDATE (0010).
audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    _now_column("at"),
    sa.Column("actor", sa.String(128), nullable=False),
    sa.Column("tenant", sa.String(128)),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("target", sa.String(200), nullable=False),
    sa.Column("data", Json, nullable=False),
    sa.Column("seq", sa.BigInteger(), unique=True),
    sa.Column("prev_hash", sa.String(64)),
    sa.Column("hash", sa.String(64)),
    # The sealer's index: only unsealed rows, in id order.
    sa.Index(
        "ix_audit_log_unsealed",
        "id",
        postgresql_where=sa.text("hash IS NULL"),
        sqlite_where=sa.text("hash IS NULL"),
    ),
)

# Where the audit chain now starts: the seq and hash of the last entry retention removed (0021).
# Rows up to the newest checkpoint's seq are the only ones the audit_log triggers let be deleted;
# verification starts from it as from a genesis.
audit_checkpoints = sa.Table(
    "audit_checkpoints",
    metadata,
    sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("hash", sa.String(64), nullable=False),
    sa.Column("entries", sa.BigInteger(), nullable=False),  # rows removed with this checkpoint
    _now_column("created_at"),
)

# Blast-radius caps (`state/caps.py`): one counter per (scope, effect class). `bucket` 0 is the
# running total, and the row every charge locks; a tenant's window also has one row per bucket
# of a sixtieth of the window (`bucket` = its start in Unix seconds), summed over the window.
cap_usage = sa.Table(
    "cap_usage",
    metadata,
    # "task:<task id>" or "tenant:<name>".
    sa.Column("scope", sa.String(200), primary_key=True),
    sa.Column("effect", sa.String(64), primary_key=True),
    sa.Column("bucket", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("used", sa.Float(), nullable=False),
    _now_column("updated_at"),
)

# What each step was charged, once per step and tool: a retry finds its row and is not charged
# again; a fallback tool is charged for itself.
cap_charges = sa.Table(
    "cap_charges",
    metadata,
    sa.Column(
        "step_key",
        sa.BigInteger(),
        sa.ForeignKey("steps.id", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    ),
    sa.Column("tool", sa.String(128), primary_key=True),
    sa.Column("task_id", sa.String(36), nullable=False, index=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    # {effect class: units}
    sa.Column("units", Json, nullable=False),
    _now_column("charged_at"),
)

# Webhook deliveries not yet acknowledged (`state/webhooks.py`): written in the transaction that
# asks for an approval, sent after it commits, retried with backoff until 2xx or `expires_at`.
webhook_outbox = sa.Table(
    "webhook_outbox",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("payload", Json, nullable=False),
    _now_column("created_at"),
    # When to try next (also a lease: a sender moves it forward before it sends).
    _now_column("due_at"),
    sa.Column("expires_at", UtcDateTime()),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("delivered_at", UtcDateTime()),
    sa.Column("given_up_at", UtcDateTime()),
    sa.Column("last_error", sa.String(300)),
    # Where this delivery goes: a task's own webhook; None: the approval webhook (0022).
    sa.Column("url", sa.String(2048)),
    sa.Index(
        "ix_webhook_outbox_pending",
        "due_at",
        postgresql_where=sa.text("delivered_at IS NULL AND given_up_at IS NULL"),
        sqlite_where=sa.text("delivered_at IS NULL AND given_up_at IS NULL"),
    ),
)

# Executor pool credentials (`identity/pools.py`): `rxt_<token id>_<secret>`, stored as a hash;
# the scope limits what a session opened with the token may lease (NULL: anything).
executor_tokens = sa.Table(
    "executor_tokens",
    metadata,
    sa.Column("token_id", sa.String(12), primary_key=True),
    sa.Column("secret_hash", sa.String(64), nullable=False),
    # The pool: several tokens may share one (rotation).
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("connectors", Json),
    sa.Column("tools", Json),
    sa.Column("tenant", sa.String(128)),
    _now_column("created_at"),
    sa.Column("created_by", sa.String(128), nullable=False),
    sa.Column("revoked_at", UtcDateTime()),
)

# One row per executor process between Register and its end (`state/sessions.py`): leases belong
# to a session and live while it does; it lives while its heartbeats keep `expires_at` ahead.
executor_sessions = sa.Table(
    "executor_sessions",
    metadata,
    # Public: shown in listings, events and logs. The credential is `xs_<id>_<secret>`.
    sa.Column("id", sa.String(16), primary_key=True),
    sa.Column("secret_hash", sa.String(64), nullable=False),
    # Signs the session's lease tokens (HMAC), so any replica can check them without a column.
    sa.Column("lease_key", sa.String(64), nullable=False),
    # What authenticated it: a token id, "file:<name>", "cert:<pool>" or "anonymous".
    sa.Column("credential", sa.String(160), nullable=False),
    sa.Column("pool", sa.String(128), nullable=False),
    sa.Column("scope", Json, nullable=False),
    sa.Column("executor_id", sa.String(128), nullable=False),
    sa.Column("connectors", Json, nullable=False),
    sa.Column("slots", sa.Integer(), nullable=False),
    sa.Column("version", sa.String(64), nullable=False),
    _now_column("registered_at"),
    _now_column("last_seen_at"),
    _now_column("expires_at"),
    sa.Column("ended_at", UtcDateTime()),
    # "expired", "revoked", "registered_again" or "closed".
    sa.Column("end_reason", sa.String(32)),
    # The expiry sweep's index: only live sessions, by expiry.
    sa.Index(
        "ix_executor_sessions_live",
        "expires_at",
        postgresql_where=sa.text("ended_at IS NULL"),
        sqlite_where=sa.text("ended_at IS NULL"),
    ),
)

# Triggers (`services/triggers.py`): a name that starts a stored plan template when a signed
# event is POSTed to it. The head row says which template version is live and whose rights a run
# has; versions are immutable, so a task started by one can always show what it ran.
triggers = sa.Table(
    "triggers",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("version", sa.Integer(), nullable=False),
    sa.Column("enabled", sa.Boolean(), nullable=False),
    # The Standard Webhooks secret ('whsec_…'), or a `${env:NAME}` reference resolved on the
    # controller. Never listed: its fingerprint is.
    sa.Column("secret", sa.Text(), nullable=False),
    # A run is a submit by this principal, with the rights its key has at the time of the run.
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("key_id", sa.String(12)),
    _now_column("created_at"),
    _now_column("updated_at"),
    sa.Column("updated_by", sa.String(128), nullable=False),
)

trigger_versions = sa.Table(
    "trigger_versions",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("template", Json, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("created_by", sa.String(128), nullable=False),
    _now_column("created_at"),
)

# Console sign-ins (`identity/sessions.py`): the browser holds `ars_<secret>` in an HttpOnly
# cookie, the table only its SHA-256. A session made from an API key lives while the key does;
# one made behind the authenticating proxy carries the principal the proxy's header mapped to.
console_sessions = sa.Table(
    "console_sessions",
    metadata,
    sa.Column("secret_hash", sa.String(64), primary_key=True),
    sa.Column("principal", sa.String(128), nullable=False),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("roles", Json, nullable=False),
    # The API key it was exchanged for; NULL for a proxy sign-in.
    sa.Column("key_id", sa.String(12)),
    _now_column("created_at"),
    _now_column("expires_at"),
    sa.Index("ix_console_sessions_expires_at", "expires_at"),
    sa.Index("ix_console_sessions_key_id", "key_id"),
)


# Agent runs (0027): a run is a sequence of rounds, each a task (tasks.run_id); its conversation
# is stored once, message by message, never copied into each round's step arguments.
runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.String(36), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("principal", sa.String(128), nullable=False),
    sa.Column("key_id", sa.String(12)),
    sa.Column("trace_id", sa.String(32), nullable=False),
    # The profile (a `model` tool) and the version the run pinned when it started.
    sa.Column("agent", sa.String(128), nullable=False),
    sa.Column("agent_version", sa.String(12), nullable=False),
    # The end user the run acts for (set by the caller, never by the model), and its context.
    sa.Column("subject", sa.String(256)),
    sa.Column("context", Json, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("end_reason", sa.String(32)),
    sa.Column("round", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("task_id", sa.String(36)),  # the current (or last) round's task
    sa.Column("limits", Json, nullable=False),
    sa.Column("tools", Json, nullable=False),  # the tools the model may call, fixed at start
    sa.Column("input_tokens", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("output_tokens", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("cached_tokens", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("cost", sa.Float(), nullable=False, server_default="0"),
    sa.Column("answer", sa.Text()),
    sa.Column("ungrounded_claims", Json),
    sa.Column("error", Json),
    # How often each (tool, arguments) was called in this run, by fingerprint: loop detection.
    sa.Column("calls", Json, nullable=False),
    # The round the caller's latest message started: max_rounds counts from it.
    sa.Column("turn_start", sa.Integer(), nullable=False, server_default="1"),
    sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
    _now_column("created_at"),
    _now_column("updated_at"),
    sa.Column("finished_at", UtcDateTime()),
    sa.Column("deadline", UtcDateTime()),
    sa.Index("ix_runs_tenant_run_id", "tenant", "run_id"),
)

run_messages = sa.Table(
    "run_messages",
    metadata,
    sa.Column("run_id", sa.String(36), nullable=False),
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("round", sa.Integer(), nullable=False),
    # user, assistant or tool: who said it; `message` is in the endpoint's own shape.
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("message", Json, nullable=False),
    _now_column("created_at"),
    sa.PrimaryKeyConstraint("run_id", "seq", name="pk_run_messages"),
)


# Long-term memory (0029): what runs learned about a subject (the end user a run acts for, named
# by the caller). One entry per (tenant, subject, type, key); its text lives here and nowhere
# else that outlives a delete (services/memory.py scrubs the copies a run made). The full-text
# index is the backend's own: a generated `search` tsvector with a GIN index on Postgres, the
# FTS5 table `memories_fts` (rowid = the entry's rowid) on SQLite; neither is modelled here.
memories = sa.Table(
    "memories",
    metadata,
    sa.Column("memory_id", sa.String(36), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("subject", sa.String(256), nullable=False),
    sa.Column("type", sa.String(16), nullable=False),
    sa.Column("key", sa.String(128), nullable=False),
    sa.Column("text", sa.Text(), nullable=False),
    sa.Column("value", Json),
    # user (a caller wrote it), model (a run wrote it from what the user said), or receipt
    # (a run wrote it after reading a tool's output: never injected as an instruction).
    sa.Column("origin", sa.String(16), nullable=False),
    sa.Column("confidence", sa.Float(), nullable=False, server_default="1"),
    sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("source", Json),  # {run, task, step, receipt}: where it came from
    sa.Column("written_by", sa.String(160), nullable=False),
    sa.Column("mark", sa.String(64), nullable=False),  # HMAC of type, key, text and value
    sa.Column("embedding", sa.LargeBinary()),  # float32s, little-endian
    sa.Column("embedding_model", sa.String(128)),
    sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
    _now_column("created_at"),
    _now_column("updated_at"),
    sa.Column("expires_at", UtcDateTime()),
    sa.UniqueConstraint("tenant", "subject", "type", "key"),
    sa.Index(
        "ix_memories_expires_at",
        "expires_at",
        postgresql_where=sa.text("expires_at IS NOT NULL"),
        sqlite_where=sa.text("expires_at IS NOT NULL"),
    ),
    sa.Index("ix_memories_tenant_updated_at", "tenant", "updated_at"),
)

# The key memory's audit HMACs are made with, when the deployment did not set one (0029).
memory_keys = sa.Table(
    "memory_keys",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("key", sa.String(64), nullable=False),
)
