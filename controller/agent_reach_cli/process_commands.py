"""`reach dev|controller|executor|migrate`: the long-running processes and migrations."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from agent_reach.addresses import ListenError
from agent_reach.logs import configure_logging
from agent_reach.telemetry import configure_tracing, flush_tracing
from agent_reach_cli.failures import CommandError

DEV_DATABASE = "sqlite:///.reach/dev.db"


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """Flags the user actually passed (unset ones fall through to env and defaults)."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop where it is installed (not on Windows), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def _run(main: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run `main` until it returns or SIGTERM/SIGINT sets its stop event."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            _event_loop_runner()(runner())
    except ListenError as exc:
        print(f"reach: {exc}", file=sys.stderr)
        return 2
    flush_tracing()
    return 0


def _controller_settings(args: argparse.Namespace, **overrides: Any) -> Any:
    from agent_reach_controller.settings import ControllerSettings

    values = _given(
        args,
        "http",
        "grpc",
        "tools",
        "database_url",
        "redis_url",
        "policy",
        "environment",
        "lease_seconds",
        "ready_file",
        "log_format",
        "migrate",
        "executor_auth",
        "executor_tokens",
        "workers",
    )
    values.update(overrides)
    return ControllerSettings(**values)


def controller(args: argparse.Namespace) -> int:
    from agent_reach_controller.server import serve

    settings = _controller_settings(args)
    prepare_database(settings.database_url.get_secret_value())
    configure_logging(fmt=settings.log_format, level=settings.log_level)
    if settings.workers > 1:
        from agent_reach_cli.workers import supervise

        return supervise(settings)
    configure_tracing("agent-reach-controller")
    return _run(lambda stop: serve(settings, stop=stop))


def controller_worker(settings: Any) -> None:
    """One process of `reach controller --workers N` (started by `workers.supervise`)."""
    from agent_reach_controller.server import serve

    configure_logging(fmt=settings.log_format, level=settings.log_level)
    configure_tracing("agent-reach-controller")
    _run(lambda stop: serve(settings, stop=stop))


def executor(args: argparse.Namespace) -> int:
    from agent_reach_executor import ExecutorSettings, run_executor

    values = _given(
        args,
        "controller",
        "slots",
        "pollers",
        "stream",
        "metrics",
        "token",
        "tls_ca",
        "tls_cert",
        "tls_key",
        "tls_server_name",
    )
    if args.connectors:
        values["connectors"] = [c.strip() for c in args.connectors.split(",") if c.strip()]
    settings = ExecutorSettings(**values)
    configure_logging(fmt=args.log_format)
    configure_tracing("agent-reach-executor")
    return _run(lambda stop: run_executor(settings, stop=stop))


def migrate(args: argparse.Namespace) -> int:
    from agent_reach_controller.settings import ControllerSettings
    from agent_reach_controller.storage import migrate as migrations

    configure_logging(fmt="text")
    settings = ControllerSettings(**_given(args, "database_url"))
    url = settings.database_url.get_secret_value()
    prepare_database(url)
    if args.downgrade:
        migrations.downgrade(url, args.revision)
    else:
        migrations.upgrade(url, args.revision)
    return 0


def prepare_database(url: str) -> None:
    """Refuse a URL the storage layer cannot use (CommandError, without the URL: it may hold a
    password), and make a SQLite file's folder."""
    from agent_reach_controller.storage.engine import normalize_url

    try:
        normalize_url(url)
    except Exception as exc:  # ValueError, or SQLAlchemy's ArgumentError for a non-URL
        raise CommandError(f"the database URL cannot be used: {exc}") from None
    _ensure_sqlite_dir(url)


def _ensure_sqlite_dir(url: str) -> None:
    prefix = "sqlite:///"
    if url.startswith(prefix) and ":memory:" not in url:
        Path(url[len(prefix) :]).parent.mkdir(parents=True, exist_ok=True)


def dev(args: argparse.Namespace) -> int:
    """Controller and executor in one process, SQLite storage, migrations applied."""
    from agent_reach_cli import demo

    overrides: dict[str, Any] = {"migrate": True, "log_format": args.log_format or "text"}
    if not args.database_url and not os.environ.get("AGENT_REACH_CONTROLLER_DATABASE_URL"):
        overrides["database_url"] = DEV_DATABASE
    if args.demo:
        overrides["tools"] = [*(args.tools or []), demo.TOOLS_FILE]
    settings = _controller_settings(args, **overrides)
    prepare_database(settings.database_url.get_secret_value())
    configure_logging(fmt=settings.log_format, level=settings.log_level)
    configure_tracing("agent-reach")
    return _run(lambda stop: run_dev(settings, slots=args.slots, demo_mode=args.demo, stop=stop))


async def run_dev(settings: Any, *, slots: int, demo_mode: bool, stop: asyncio.Event) -> None:
    from pydantic import SecretStr

    from agent_reach_cli import demo, quick_start
    from agent_reach_controller.server import running_controller
    from agent_reach_executor import ExecutorSettings, run_executor

    async with contextlib.AsyncExitStack() as stack:
        demo_url = stack.enter_context(demo.running_demo_service()) if demo_mode else None
        components, bound = await stack.enter_async_context(running_controller(settings))
        # A ready key, so the quick start works at once; it is stored hashed like any other.
        _, api_key = await components.keys.create(
            name="dev", tenant="default", roles=["admin"], created_by="reach dev"
        )
        # The in-process executor authenticates like any other, with a pool token of its own.
        _, executor_token = await components.pools.create(name="dev", created_by="reach dev")
        executor_stop = asyncio.Event()
        worker = asyncio.create_task(
            run_executor(
                ExecutorSettings(
                    controller=bound.grpc,
                    slots=slots,
                    drain_grace=5.0,
                    token=SecretStr(executor_token),
                ),
                stop=executor_stop,
                handle_signals=False,
            ),
            name="executor",
        )
        try:
            if demo_url is not None:
                await demo.run_demo(f"http://{bound.http}", api_key=api_key, demo_url=demo_url)
            tools = list(components.catalog.values())
            quick_start.print_quick_start(
                f"http://{bound.http}",
                api_key=api_key,
                plan=quick_start.example_plan(tools, demo_mode=demo_mode),
                tool_names=[t.name for t in tools if t.enabled],
                demo_mode=demo_mode,
                executor=(bound.grpc, executor_token),
            )
            # Stop on a signal, or when the executor ends by itself (its error is raised below).
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({stopping, worker}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
        finally:
            executor_stop.set()
            await worker
