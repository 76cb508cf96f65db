"""The controller's parts, wired from settings (no globals, nothing built at import time)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_reach_controller import audit
from agent_reach_controller.identity.policy import Policy
from agent_reach_controller.identity.policy import load as load_policy
from agent_reach_controller.identity.pools import PoolTokenService, WatchedTokenFile
from agent_reach_controller.identity.service import Grants, KeyService
from agent_reach_controller.identity.sign_ins import ProxyTrust, SignInService, load_proxy_users
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services import sweeps
from agent_reach_controller.services.admission import AdmissionService
from agent_reach_controller.services.autoscaling import AutoscalingService
from agent_reach_controller.services.expiry import ExpiryService
from agent_reach_controller.services.feed import EventFeed
from agent_reach_controller.services.handoff import HandOff
from agent_reach_controller.services.held import HeldLeases
from agent_reach_controller.services.intake import IntakeService
from agent_reach_controller.services.leases import LeaseKeeper
from agent_reach_controller.services.leasing import Guards, LeaseTimings, LeasingService
from agent_reach_controller.services.limiter import (
    MemoryLimiter,
    RateLimiter,
    RedisLimiter,
    SqlLimiter,
)
from agent_reach_controller.services.memory import MemoryLimits, MemoryService
from agent_reach_controller.services.memory_tools import MemoryTools
from agent_reach_controller.services.operator import OperatorService
from agent_reach_controller.services.queries import TaskQueries
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.services.reporting import ReportingService
from agent_reach_controller.services.retention import RetentionService
from agent_reach_controller.services.runs import RunService
from agent_reach_controller.services.sessions import SessionService
from agent_reach_controller.services.sweeps import Supervision, Sweep
from agent_reach_controller.services.tool_health import ToolHealth
from agent_reach_controller.services.triggers import TriggerService
from agent_reach_controller.services.unit_of_work import UnitOfWork
from agent_reach_controller.services.webhooks import WebhookSender, WebhookTarget
from agent_reach_controller.settings import ControllerSettings, Environment
from agent_reach_controller.storage import migrate
from agent_reach_controller.storage.engine import Database, libpq_conninfo
from agent_reach_controller.storage.wakeups import Notifier, PostgresNotifier, RedisNotifier
from agent_reach_controller.tools.catalog import ToolCatalog
from agent_reach_controller.tools.memory import SEEDED_BY, memory_tools

log = logging.getLogger(__name__)
# Every Redis key and channel lives under this versioned prefix.
REDIS_PREFIX = "agent_reach:v1:"
WAKE_CHANNEL = f"{REDIS_PREFIX}wake"
# Who the audit log and tool history name for changes made by the --tools files.
TOOLS_FILE_PRINCIPAL = "tools-file"


@dataclass(slots=True, kw_only=True)
class Components:
    settings: ControllerSettings
    db: Database
    registry: ToolRegistry
    notifier: Notifier
    metrics: ControllerMetrics  # what `/metrics` serves
    work: UnitOfWork
    # The use cases, one service per job.
    intake: IntakeService
    runs: RunService
    memory: MemoryService  # what runs learned about their subjects
    queries: TaskQueries
    operator: OperatorService
    admission: AdmissionService
    leasing: LeasingService
    reporting: ReportingService
    expiry: ExpiryService
    leases: LeaseKeeper  # heartbeats and the end of executor sessions
    tool_health: ToolHealth  # breakers and downstream pauses
    limiter: RateLimiter
    keys: KeyService
    pools: PoolTokenService  # executor pool tokens
    autoscaling: AutoscalingService  # each pool's share of the work
    retention: RetentionService  # what finished long ago is deleted
    sessions: SessionService  # executor sessions
    policy: Policy
    feed: EventFeed  # live followers of task event logs (SSE)
    triggers: TriggerService  # signed events that start stored plan templates
    sign_ins: SignInService  # the web console's sessions
    webhook: WebhookSender | None = None
    hand_off: HandOff | None = None  # new steps straight to waiting pollers (Postgres)
    # Told to stop: /readyz answers 503 so that load balancers stop sending, while requests
    # already sent are still served (settings.shutdown_delay).
    stopping: bool = False

    @property
    def catalog(self) -> ToolCatalog:
        """The live catalogue as this replica last saw it (see ToolRegistry.refresh)."""
        return self.registry.catalog

    def environment_of(self, tenant: str) -> Environment:
        """Where a tenant's tasks run: the policy's word for it, else the controller's."""
        return self.policy.environment_for(tenant, self.settings.environment)

    async def close(self) -> None:
        await self.feed.close()
        if self.webhook is not None:
            await self.webhook.close()
        await self.limiter.close()
        await self.notifier.close()
        await self.db.close()


def _sign_ins(settings: ControllerSettings, db: Database, keys: KeyService) -> SignInService:
    proxy = None
    if settings.console_proxy_header and settings.console_proxy_users is not None:
        proxy = ProxyTrust(
            header=settings.console_proxy_header,
            networks=tuple(
                ipaddress.ip_network(n, strict=False) for n in settings.console_proxy_trusted
            ),
            users=load_proxy_users(settings.console_proxy_users),
        )
    return SignInService(
        db,
        keys,
        lifetime=timedelta(seconds=settings.console_session_seconds),
        bootstrap_enabled=settings.bootstrap_key is not None,
        proxy=proxy,
    )


def _notifier(settings: ControllerSettings, db: Database) -> Notifier:
    """Redis pub/sub when configured, else LISTEN/NOTIFY on Postgres, else in-process."""
    if settings.redis_url is not None:
        return RedisNotifier(settings.redis_url.get_secret_value(), channel=WAKE_CHANNEL)
    if db.is_postgres:
        return PostgresNotifier(libpq_conninfo(db.url))
    return Notifier()


def _limiter(settings: ControllerSettings, db: Database) -> RateLimiter:
    """Redis (Postgres behind it) when configured, else Postgres, else this process."""
    if settings.redis_url is not None:
        return RedisLimiter(settings.redis_url.get_secret_value(), prefix=REDIS_PREFIX)
    return SqlLimiter() if db.is_postgres else MemoryLimiter()


def _webhook(settings: ControllerSettings, db: Database) -> WebhookSender | None:
    approvals = None
    if settings.approval_webhook_url is not None:
        secret = settings.approval_webhook_secret
        approvals = WebhookTarget(
            url=settings.approval_webhook_url.get_secret_value(),
            secret=secret.get_secret_value() if secret is not None else None,
        )
    tasks = None
    if settings.task_webhook_hosts and settings.task_webhook_secret is not None:
        tasks = WebhookTarget(url="", secret=settings.task_webhook_secret.get_secret_value())
    if approvals is None and tasks is None:
        return None
    return WebhookSender(db, approvals, tasks=tasks)


async def open_components(settings: ControllerSettings) -> Components:
    """Connect storage, load tools, and build the use cases."""
    url = settings.database_url.get_secret_value()
    if settings.migrate:
        await asyncio.to_thread(migrate.upgrade, url)
    db = Database(url, pool_size=settings.db_pool_size, prepare=settings.db_prepare)
    if await db.autovacuum_off():
        log.warning(
            "Postgres runs with autovacuum off: nothing analyses the tables as they grow, and "
            "the controller's prepared statements keep plans made while they were small (whole-"
            "table scans, slower with every task stored). Turn autovacuum on, or ANALYZE the "
            "tasks, steps and events tables regularly.",
            extra={"event": "autovacuum_off"},
        )
    registry = ToolRegistry(db)
    # The files own the tools they define: each start makes the catalogue hold them as written
    # (tools added through the API stay; `reach tools import --prune` is the full sync).
    files = ToolCatalog.from_yaml_files(settings.tools)
    await registry.apply(files.values(), principal=TOOLS_FILE_PRINCIPAL)
    # Every catalogue has the memory tools (a file or an admin may have changed them: kept).
    await registry.seed(memory_tools(), principal=SEEDED_BY)
    # Stored before `destinations` were required: disabled, with the reason, not a failed start.
    await registry.disable_undeclared()
    notifier = _notifier(settings, db)
    # Every event appended, by whichever writer, wakes the followers of its task's log.
    db.observe_commits(notifier.announce_events)
    await notifier.start()
    webhook = _webhook(settings, db)
    metrics = ControllerMetrics()
    work = UnitOfWork(
        db=db,
        registry=registry,
        notifier=notifier,
        metrics=metrics,
        approval_ttl=timedelta(seconds=settings.approval_timeout_seconds),
        announcer=webhook,
    )
    limiter = _limiter(settings, db)
    keys = KeyService(db)
    pools = PoolTokenService(db, file=WatchedTokenFile(settings.executor_tokens))
    admission = AdmissionService(db=db, registry=registry, metrics=metrics)
    sessions = SessionService(db, liveness=timedelta(seconds=settings.lease_seconds))
    policy = load_policy(settings.policy)
    operator = OperatorService(work=work)
    expiry = ExpiryService(work=work, operator=operator)
    tool_health = ToolHealth(db=db, registry=registry, metrics=metrics)
    leases = LeaseKeeper(
        db=db,
        sessions=sessions,
        lease_seconds=settings.lease_seconds,
        metrics=metrics,
        settle=work.settle,
    )
    held = HeldLeases() if db.is_postgres else None
    hand_off = (
        HandOff(registry=registry, notifier=notifier, held=held)
        if settings.hand_off and db.is_postgres
        else None
    )
    leasing = LeasingService(
        work=work,
        timings=LeaseTimings(
            lease=timedelta(seconds=settings.lease_seconds),
            max_poll_wait=settings.max_poll_wait_seconds,
        ),
        guards=Guards(limiter=limiter, grants=Grants(keys, policy), tenant_caps=policy.caps_for),
        leases=leases,
        tool_health=tool_health,
        hand_off=hand_off,
        held=held,
    )
    intake = IntakeService(
        work=work,
        hand_off=hand_off,
        environment_of=lambda tenant: policy.environment_for(tenant, settings.environment),
    )
    memory = MemoryService(
        db=db,
        limits=MemoryLimits(
            per_subject=settings.memory_per_subject,
            retention=timedelta(days=settings.memory_retention_days)
            if settings.memory_retention_days > 0
            else None,
        ),
        key=settings.memory_key.get_secret_value().encode() if settings.memory_key else None,
    )
    work.internal = MemoryTools(memory=memory)  # memory.* steps run in the unit of work
    runs = RunService(
        work=work, intake=intake, memory=memory, receipt_budget=settings.receipt_budget_chars
    )
    work.runs = runs.rounds_keeper
    return Components(
        settings=settings,
        db=db,
        registry=registry,
        notifier=notifier,
        metrics=metrics,
        work=work,
        intake=intake,
        runs=runs,
        memory=memory,
        queries=TaskQueries(db=db, notifier=notifier),
        operator=operator,
        admission=admission,
        leasing=leasing,
        reporting=ReportingService(
            work=work, sessions=sessions, tool_health=tool_health, expiry=expiry, held=held
        ),
        expiry=expiry,
        leases=leases,
        tool_health=tool_health,
        limiter=limiter,
        keys=keys,
        pools=pools,
        autoscaling=AutoscalingService(db=db, pools=pools, admission=admission, metrics=metrics),
        retention=RetentionService(
            db=db,
            days=settings.retention_days,
            audit_days=settings.audit_retention_days,
            batch=settings.retention_batch,
        ),
        sessions=sessions,
        policy=policy,
        feed=EventFeed(db=db, notifier=notifier),
        triggers=TriggerService(db, keys),
        sign_ins=_sign_ins(settings, db, keys),
        webhook=webhook,
        hand_off=hand_off,
    )


def sweeps_of(components: Components) -> list[Sweep]:
    """Every background duty of a replica, each its own supervised loop."""
    settings, expiry = components.settings, components.expiry
    every = min(settings.reap_interval_seconds, settings.lease_seconds / 4)

    async def prune_sessions() -> None:
        await components.sessions.prune(before=datetime.now(UTC) - timedelta(days=1))

    async def seal_audit() -> None:
        await audit.seal(components.db, limit=10_000)

    duties: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("executor_sessions", components.leases.reap_sessions),
        ("expired_leases", expiry.reap_expired),
        ("schedule_to_start", expiry.expire_unstarted),
        ("breaker_fail_fast", expiry.fail_fast_open),
        ("approval_expiry", expiry.expire_approvals),
        ("task_deadlines", expiry.expire_deadlines),
        ("breaker_gauge", lambda: _observe_breakers(components)),
        ("audit_seal", seal_audit),
    ]
    return [Sweep(name=name, run=run, every=every) for name, run in duties] + [
        # Counts every queued step: with a million queued that is a scan, so at most 10% of the
        # time (admission still counts each submit at once in between; see AdmissionService).
        Sweep(
            name="queue_depth",
            # One read of the queue: admission's count, the per-tool gauges, each pool's share.
            run=components.autoscaling.refresh,
            every=every,
            share=0.1,
        ),
        Sweep(name="session_prune", run=prune_sessions, every=600.0),
        # Memories that expired or outlived memory's retention: forgotten, as a delete is.
        Sweep(name="memory_expiry", run=components.memory.prune, every=60.0),
        # Deletes in small batches; a minute apart is plenty for anything kept for days.
        *(
            [Sweep(name="retention", run=components.retention.prune, every=60.0)]
            if components.retention.enabled
            else []
        ),
    ]


async def _observe_breakers(components: Components) -> None:
    """Set the breaker gauge (one read of the guarded tools' rows; none without breakers)."""
    guarded = any(tool.breaker is not None for tool in components.catalog.values())
    components.metrics.breakers(await components.tool_health.breaker_states() if guarded else {})


@contextlib.asynccontextmanager
async def background(components: Components) -> AsyncIterator[None]:
    """Run the sweeps (and the webhook sender, if configured) for the life of the block."""
    supervision = Supervision(
        failed=components.metrics.sweep_failed,
        storage_down=components.leases.storage_down,
    )
    running = sweeps.start(sweeps_of(components), supervision)
    if components.webhook is not None:
        running.append(asyncio.create_task(components.webhook.run_forever(), name="webhook-sender"))
    try:
        yield
    finally:
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError):
                await task
