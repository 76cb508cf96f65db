"""deploy/compose.yaml's own services, run as plain processes with their own commands and
environments: the migration job, the demo downstream, two controllers and two executors, each
health check run as compose would run it, the umbrella demo carried out through the demo tools
(SSRF guard on), and traces arriving from every controller and executor.

Nothing is rewritten but what compose's network would resolve: a service name and port becomes
127.0.0.1 and a free port, and a mounted file its path in the repository. The executor pool token
is made and provisioned the way `make compose-token` does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from agent_reach_cli.demo import umbrella_plan
from tests.e2e.processes import REACH, Proc, wait_until
from tests.support.otlp import OtlpReceiver
from tests.support.pgserver import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SERVICES = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]


class Stack:
    """Runs compose services as processes; `where` maps each compose `host:port` to 127.0.0.1."""

    def __init__(self, workdir: Path, where: dict[str, str], urls: dict[str, str]) -> None:
        self.workdir = workdir
        self.where = where  # "demo:8000" -> "127.0.0.1:40123"
        self.urls = urls  # replaced first, whole: the database and Redis URLs, dns:/// targets
        self.procs: list[Proc] = []

    def translate(self, value: str, listen: dict[str, str]) -> str:
        for before, after in {**self.urls, **listen}.items():
            value = value.replace(before, after)
        return re.sub(
            r"(?<![\w.-])([a-z][\w-]*:\d+)",
            lambda m: self.where.get(m.group(1), m.group(1)),
            value,
        )

    def env_of(
        self, service: dict[str, Any], listen: dict[str, str], extra: dict[str, str]
    ) -> dict[str, str]:
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        for name, written in service.get("environment", {}).items():
            # compose's `${NAME:-default}`: the caller's variable, else the default.
            value = re.sub(
                r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m[1], m[2]), str(written)
            )
            env[name] = self.translate(value, listen)
        return {**env, **extra}

    def mounted(self, service: dict[str, Any], value: str) -> str:
        for volume in service.get("volumes", ()):
            source, target = volume.split(":")[:2]
            value = value.replace(target, str((DEPLOY / source).resolve()))
        return value

    def start(
        self,
        name: str,
        *,
        listen: dict[str, str] | None = None,
        extra: dict[str, str] | None = None,
        files: dict[str, str] | None = None,
    ) -> tuple[Proc, dict[str, str]]:
        """Start compose service `name` (a replica of it: `listen` maps its 0.0.0.0 listeners)."""
        service = SERVICES[name.split("-", maxsplit=1)[0]]
        listen = listen or {}
        env = self.env_of(service, listen, extra or {})
        for target, path in (files or {}).items():
            env = {k: v.replace(target, path) for k, v in env.items()}
        args = [self.mounted(service, self.translate(part, listen)) for part in service["command"]]
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [*REACH, *args], cwd=self.workdir, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        proc = Proc(name=name, popen=popen, log=log)
        self.procs.append(proc)
        return proc, env

    def healthy(self, proc: Proc, env: dict[str, str], listen: dict[str, str]) -> None:
        """Run the service's compose health check (or the image's) until it passes."""
        service = SERVICES[proc.name.split("-", maxsplit=1)[0]]
        test = service.get("healthcheck", {}).get("test")
        command = (
            [self.translate(part, listen) for part in test[1:]]
            if test
            else ["python", "-m", "agent_reach_cli.health"]
        )
        assert command[:3] == ["python", "-m", "agent_reach_cli.health"]

        def passes() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(f"{proc.name} exited:\n{proc.output()[-3000:]}")
            return (
                subprocess.run(
                    [*REACH[:1], *command[1:]], check=False, env=env, capture_output=True
                ).returncode
                == 0
            )

        wait_until(passes, within=60, what=f"{proc.name}'s health check", every=0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def test_the_compose_services_run_as_written_and_carry_out_the_demo(
    tmp_path: Path, postgres_url: str, redis_url: str, otlp: OtlpReceiver
) -> None:
    compose_db = SERVICES["migrate"]["environment"]["AGENT_REACH_CONTROLLER_DATABASE_URL"]
    compose_redis = SERVICES["controller"]["environment"]["AGENT_REACH_CONTROLLER_REDIS_URL"]
    demo_port, smtp_port = free_port(), free_port()
    http_ports, grpc_ports = [free_port(), free_port()], [free_port(), free_port()]
    stack = Stack(
        tmp_path,
        where={
            "demo:8000": f"127.0.0.1:{demo_port}",
            "jaeger:4318": otlp.url.removeprefix("http://"),
        },
        urls={
            compose_db: postgres_url,
            compose_redis: redis_url,
            # compose's DNS name for both controller replicas: the executor's dns:/// target.
            "dns:///controller:50051": ",".join(f"127.0.0.1:{p}" for p in grpc_ports),
        },
    )
    # The pool token as `make compose-token` makes it: the token for executors, its hash in
    # the controller's provisioning file.
    made = subprocess.run(
        [*REACH, "executors", "create-token", "--offline", "--name", "compose"],
        capture_output=True,
        text=True,
        check=True,
    )
    token = made.stdout.strip()
    tokens_file = tmp_path / "executor-tokens.yaml"
    tokens_file.write_text(made.stderr[made.stderr.index("tokens:") :])
    try:
        migrate, _ = stack.start("migrate")
        assert migrate.popen.wait(60) == 0, migrate.output()

        demo, demo_env = stack.start(
            "demo",
            listen={
                "0.0.0.0:8000": f"127.0.0.1:{demo_port}",
                "0.0.0.0:2525": f"127.0.0.1:{smtp_port}",
            },
        )
        stack.healthy(demo, demo_env, {"127.0.0.1:8000": f"127.0.0.1:{demo_port}"})

        for i in range(2):
            listen = {
                "0.0.0.0:8080": f"127.0.0.1:{http_ports[i]}",
                "0.0.0.0:50051": f"127.0.0.1:{grpc_ports[i]}",
            }
            proc, env = stack.start(
                f"controller-{i}",
                listen=listen,
                files={"/etc/reach/executor-tokens.yaml": str(tokens_file)},
            )
            stack.healthy(proc, env, {"127.0.0.1:8080": f"127.0.0.1:{http_ports[i]}"})
        for i in range(2):
            metrics = free_port()
            listen = {
                "0.0.0.0:9464": f"127.0.0.1:{metrics}",
                "127.0.0.1:9464": f"127.0.0.1:{metrics}",
            }
            proc, env = stack.start(
                f"executor-{i}",
                listen=listen,
                # compose's `demo` host name, as a name and a port apart.
                extra={
                    "AGENT_REACH_EXECUTOR_TOKEN": token,
                    "AGENT_REACH_DEMO_SMTP_HOST": "127.0.0.1",
                    "AGENT_REACH_DEMO_SMTP_PORT": str(smtp_port),
                },
            )
            stack.healthy(proc, env, listen)

        made_key = subprocess.run(
            [
                *REACH,
                "keys",
                "create",
                "--database-url",
                postgres_url,
                "--name",
                "compose-test",
                "--role",
                "admin",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        key = next(word for word in made_key.stdout.split() if word.startswith("ark_"))
        task_ids = []
        for port in http_ports:  # the load balancer would spread callers over both
            with httpx.Client(
                base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"}
            ) as api:
                at = datetime.now(UTC) + timedelta(seconds=3)
                plan = umbrella_plan("wuhan", demo_url=f"http://127.0.0.1:{demo_port}", at=at)
                answer = api.post("/v1/tasks", json=plan, params={"wait": 30})
                assert answer.status_code in (200, 202), answer.text
                task_ids.append(answer.json()["task_id"])

        def finished() -> list[dict[str, Any]] | None:
            with httpx.Client(
                base_url=f"http://127.0.0.1:{http_ports[0]}",
                headers={"Authorization": f"Bearer {key}"},
            ) as api:
                tasks = [api.get(f"/v1/tasks/{t}").json() for t in task_ids]
            return (
                tasks
                if all(t["status"] in {"succeeded", "failed", "cancelled"} for t in tasks)
                else None
            )

        for task in wait_until(finished, within=60, what="the demo tasks to finish"):
            assert task["status"] == "succeeded", json.dumps(task)[:2000]
            steps = {s["step_id"]: s for s in task["steps"]}
            assert steps["weather"]["receipt"]["data"]["rain"] is True  # from the demo service
            assert steps["remind"]["status"] == "succeeded"
            assert steps["remind"]["receipt"]["meta"]["verified"] is True
            channels = [r["output"]["channel"] for r in steps["tell"]["receipt"]["targets"]]
            assert channels == ["webhook", "email"]
        with httpx.Client(base_url=f"http://127.0.0.1:{demo_port}") as demo_api:
            delivered = demo_api.get("/deliveries").json()
        assert len(delivered["webhooks"]) == len(delivered["emails"]) == len(task_ids)

        def traced_by_both() -> set[str]:
            services = {span.service for span in otlp.spans()}
            return (
                services
                if {"agent-reach-controller", "agent-reach-executor"} <= services
                else set()
            )

        wait_until(traced_by_both, within=30, what="spans from controllers and executors")
    finally:
        stack.stop()
    for proc in stack.procs:
        assert proc.popen.returncode == 0, f"{proc.name}:\n{proc.output()[-3000:]}"
