"""`reach` subcommands; each flag also has an environment variable (see --help)."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from typing import Any

from agent_reach_cli import (
    agent_commands,
    audit_commands,
    client_commands,
    demo,
    eval_commands,
    executor_commands,
    failures,
    health,
    key_commands,
    memory_commands,
    process_commands,
    replay_commands,
    run_commands,
    tool_commands,
    trigger_commands,
)

Handler = Callable[[argparse.Namespace], int]


def _add_controller_flags(p: argparse.ArgumentParser, *, dev: bool) -> None:
    env = "AGENT_REACH_CONTROLLER_"
    p.add_argument("--http", help=f"REST listener HOST:PORT (default 127.0.0.1:8080; {env}HTTP)")
    p.add_argument("--grpc", help=f"gRPC listener HOST:PORT (default 127.0.0.1:50051; {env}GRPC)")
    p.add_argument(
        "--tools", action="append", metavar="FILE", help=f"tool YAML file, repeatable ({env}TOOLS)"
    )
    p.add_argument("--database-url", help=f"postgresql://… or sqlite:///… ({env}DATABASE_URL)")
    p.add_argument("--redis-url", help=f"redis://… ({env}REDIS_URL)")
    p.add_argument(
        "--policy", help=f"permission matrix YAML (roles → tools → actions; {env}POLICY)"
    )
    p.add_argument(
        "--environment",
        choices=["dev", "sandbox", "prod"],
        help="where tenants' tasks run unless the policy says (default dev; sandbox: writes to "
        f"sandbox targets only; prod: writes wait for approval; {env}ENVIRONMENT)",
    )
    p.add_argument(
        "--lease-seconds",
        type=float,
        help=f"how long a silent executor keeps its leases (default 6; {env}LEASE_SECONDS)",
    )
    p.add_argument(
        "--executor-auth",
        choices=["token", "off"],
        help=f"'off' admits executors without a token: only for upgrades ({env}EXECUTOR_AUTH)",
    )
    p.add_argument(
        "--executor-tokens",
        metavar="FILE",
        help=f"provisioned executor pools, by token hash ({env}EXECUTOR_TOKENS)",
    )
    p.add_argument("--ready-file", help="write the bound addresses here as JSON once listening")
    p.add_argument("--log-format", choices=["json", "text"], help=f"({env}LOG_FORMAT)")
    if dev:
        p.add_argument("--slots", type=int, default=8, help="in-process executor slots")
        p.add_argument(
            "--demo", action="store_true", help="start the demo weather service and run the demo"
        )
    else:
        p.add_argument(
            "--migrate", action="store_true", default=None, help="apply migrations at start"
        )
        p.add_argument(
            "--workers",
            type=int,
            help=f"processes serving the same ports, to use N cores (Postgres; {env}WORKERS)",
        )


EXECUTOR_HELP = "run an executor that pulls steps over gRPC"


def _add_executor_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--controller",
        help="controller gRPC HOST:PORT, several comma-separated, or dns:///NAME:PORT "
        "(AGENT_REACH_EXECUTOR_CONTROLLER)",
    )
    p.add_argument("--token", help="the pool's executor token (AGENT_REACH_EXECUTOR_TOKEN)")
    p.add_argument("--tls-ca", help="CA of the controller's certificate: use TLS (…_TLS_CA)")
    p.add_argument("--tls-cert", help="client certificate, for mutual TLS (…_TLS_CERT)")
    p.add_argument("--tls-key", help="its private key (…_TLS_KEY)")
    p.add_argument("--tls-server-name", help="name expected in the controller's certificate")
    p.add_argument("--slots", type=int, help="steps run at once (AGENT_REACH_EXECUTOR_SLOTS)")
    p.add_argument(
        "--pollers", type=int, help="long polls kept open at once (AGENT_REACH_EXECUTOR_POLLERS)"
    )
    p.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="heartbeats, and polls and reports while it holds a step or two, as messages on a "
        "stream per poller; --no-stream (the default): a unary call each "
        "(AGENT_REACH_EXECUTOR_STREAM)",
    )
    p.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (AGENT_REACH_EXECUTOR_METRICS)",
    )
    p.add_argument("--connectors", help="comma-separated connector names (default: all installed)")
    p.add_argument("--log-format", choices=["json", "text"], default="json")


def _add_trace_parser(sub: Any) -> None:
    trace = sub.add_parser("trace", help="a task's trace", description="a task's trace")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True, metavar="COMMAND")
    p = trace_sub.add_parser(
        "export",
        help="write a task's trace as Jaeger JSON (the UI's Upload JSON), from its event log",
    )
    p.set_defaults(handler=client_commands.trace_export)
    p.add_argument("task_id")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    client_commands.add_client_flags(p)


def _version() -> str:
    try:
        return importlib.metadata.version("agent-reach")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reach", description="Agent-Reach: the execution layer for LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"reach {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers: dict[str, Handler] = {}

    def add(name: str, handler: Handler, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        handlers[name] = handler
        return p

    p = add("dev", process_commands.dev, "embedded stack: controller + executor on SQLite")
    _add_controller_flags(p, dev=True)
    p = add("controller", process_commands.controller, "run a controller (REST + gRPC)")
    _add_controller_flags(p, dev=False)
    _add_executor_flags(add("executor", process_commands.executor, EXECUTOR_HELP))
    p = add("migrate", process_commands.migrate, "apply (or roll back) database migrations")
    p.add_argument("--database-url", help="(AGENT_REACH_CONTROLLER_DATABASE_URL)")
    p.add_argument("--revision", default="head", help="target revision (default head)")
    p.add_argument("--downgrade", action="store_true", help="move down to --revision")
    audit_commands.add_parser(sub)
    health.add_arguments(add("health", health.check, "exit 0 if a health URL answers 2xx"))
    demo.add_arguments(add("demo-service", demo.serve, demo.SERVICE_HELP))

    for name, handler, help_ in (
        ("submit", client_commands.submit, "submit a plan from a JSON file ('-' for stdin)"),
        ("status", client_commands.status, "show a task and its receipts"),
        ("resolve", client_commands.resolve, "resolve a step whose outcome is unknown"),
        ("approve", client_commands.approve, "approve (or --reject) a step awaiting approval"),
    ):
        p = add(name, handler, help_)
        client_commands.add_client_flags(p)
        p.add_argument("--json", action="store_true", help="print the answer as JSON")
        if name == "submit":
            p.add_argument("file")
            p.add_argument(
                "--wait",
                type=float,
                default=30,
                help="seconds to wait for the receipts (default 30)",
            )
            p.add_argument("--no-wait", action="store_true", help="answer once it is accepted")
            p.add_argument("--idempotency-key")
            p.add_argument(
                "--subject",
                help="the end user the task acts for (memory's tools act for it); set in the "
                "body's `subject`",
            )
        elif name == "status":
            p.add_argument("task_id")
            p.add_argument(
                "--watch",
                action="store_true",
                help="follow the task live as a tree of its steps until it ends "
                "(exit 0 if it succeeded, 1 otherwise)",
            )
        elif name == "resolve":
            p.add_argument("task_id")
            p.add_argument("step_id")
            p.add_argument("--action", required=True, choices=["retry", "succeeded", "failed"])
            p.add_argument("--by", help="on whose behalf, if not the key's own principal")
            p.add_argument("--reason", help="why (recorded; the model reads it)")
            p.add_argument("--output", help="the step's output as JSON, with --action succeeded")
        elif name == "approve":
            p.add_argument("task_id")
            p.add_argument("step_id")
            p.add_argument("--reject", action="store_true", help="reject instead of approving")
            p.add_argument("--reason", help="why (recorded; on a rejection the model reads it)")
            p.add_argument("--args", help="approve these arguments instead (a JSON object)")
    for add_commands in (
        tool_commands.add_parser,
        agent_commands.add_parser,
        run_commands.add_parser,
        memory_commands.add_parser,
        eval_commands.add_parser,
        _add_trace_parser,
        replay_commands.add_parser,
        key_commands.add_parsers,
        executor_commands.add_parser,
        trigger_commands.add_parser,
    ):
        add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` names; what stops it is said in one line (`failures.run`)."""
    args: Any = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return failures.run(handler, args)


if __name__ == "__main__":
    sys.exit(main())
