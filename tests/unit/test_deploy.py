"""The compose stack and the image deliver what they show: every service, setting, port, mount and
file they name exists and fits the others. (tests/e2e/test_compose_processes.py then runs the
same commands with the same environments as plain processes.)"""

from __future__ import annotations

import fnmatch
import importlib.resources
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from agent_reach.destinations import Destinations
from agent_reach_cli.main import build_parser
from agent_reach_connectors import netguard
from agent_reach_controller.settings import ControllerSettings
from agent_reach_executor import ExecutorSettings
from agent_reach_executor.probes import READYZ

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
OURS = {name: s for name, s in SERVICES.items() if s.get("image") == "agent-reach:dev"}
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
OTLP_HTTP = "http://jaeger:4318"


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _flag(service: dict[str, Any], flag: str) -> str:
    command = service["command"]
    value: str = command[command.index(flag) + 1]
    return value


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts."""
    found = {}
    for volume in service.get("volumes", ()):
        source, target = volume.split(":")[:2]
        found[target] = (DEPLOY / source).resolve()
    return found


def test_the_compose_file_is_valid_for_the_compose_specification() -> None:
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(COMPOSE), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


def test_the_stack_has_every_part_it_advertises() -> None:
    assert set(OURS) == {"migrate", "demo", "controller", "executor"}
    assert {"postgres", "redis", "jaeger", "prometheus", "grafana", "lb"} <= set(SERVICES)
    assert SERVICES["controller"]["deploy"]["replicas"] == 2
    assert SERVICES["executor"]["deploy"]["replicas"] == 2


@pytest.mark.parametrize("name", sorted(OURS))
def test_commands_parse(name: str) -> None:
    args = build_parser().parse_args(OURS[name]["command"])
    assert args.command == OURS[name]["command"][0]


@pytest.mark.parametrize("name", sorted(OURS))
def test_environment_names_real_settings(name: str) -> None:
    prefixes = {
        "AGENT_REACH_CONTROLLER_": set(ControllerSettings.model_fields),
        "AGENT_REACH_EXECUTOR_": set(ExecutorSettings.model_fields),
    }
    for variable in OURS[name].get("environment", {}):
        for prefix, fields in prefixes.items():
            if variable.startswith(prefix):
                assert variable.removeprefix(prefix).lower() in fields, variable


@pytest.mark.parametrize("name", sorted(OURS))
def test_our_containers_run_locked_down(name: str) -> None:
    service = OURS[name]
    assert service["read_only"] is True
    assert service["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in service["security_opt"]


def test_only_controllers_and_the_migration_get_the_database() -> None:
    for name, service in OURS.items():
        env = service.get("environment", {})
        has_db = "AGENT_REACH_CONTROLLER_DATABASE_URL" in env
        assert has_db == (name in {"controller", "migrate"}), name


@pytest.mark.parametrize("name", ["controller", "executor"])
def test_controllers_and_executors_send_traces_to_jaeger(name: str) -> None:
    env = OURS[name]["environment"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == OTLP_HTTP
    assert env["OTEL_SERVICE_NAME"] == f"agent-reach-{name}"
    jaeger = SERVICES["jaeger"]
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert "16686:16686" in jaeger["ports"]


def test_the_demo_tools_reach_the_demo_service_through_the_ssrf_guard() -> None:
    demo_url = OURS["executor"]["environment"]["AGENT_REACH_DEMO_URL"]
    host, port = demo_url.removeprefix("http://").split(":")
    assert host in SERVICES
    assert int(port) == _port(_flag(OURS["demo"], "--http"))
    tools_file = _mounts(OURS["controller"])["/etc/reach/tools.yaml"]
    tools = yaml.safe_load(tools_file.read_text())["tools"]
    demo_tools = [t for t in tools if "AGENT_REACH_DEMO_URL" in t["config"].get("url", "")]
    assert demo_tools
    for tool in demo_tools:
        allow = netguard.Allowlist.parse(tool["config"]["allow_hosts"])
        assert allow.admits_name(host, int(port)), tool["name"]
    # The notify tool reaches the demo's phone (its HTTP port) and inbox (its SMTP port).
    [notify] = [t for t in tools if t["connector"] == "notify"]
    allow = netguard.Allowlist.parse(notify["config"]["allow_hosts"])
    smtp_host = OURS["executor"]["environment"]["AGENT_REACH_DEMO_SMTP_HOST"]
    smtp_port = int(OURS["executor"]["environment"]["AGENT_REACH_DEMO_SMTP_PORT"])
    assert smtp_port == _port(_flag(OURS["demo"], "--smtp"))
    assert allow.admits_name(smtp_host, smtp_port)
    assert allow.admits_name(host, int(port))
    # Its targets come from the model: it lists them, and the demo's phone and inbox are on it.
    listed = Destinations.parse(notify["config"]["destinations"])
    assert listed.admits_host(host)
    assert listed.admits_recipient("you@example.org")
    assert OURS["executor"]["depends_on"]["demo"] == {"condition": "service_healthy"}


def test_executors_reach_every_controller_and_authenticate_with_the_token_it_knows() -> None:
    controller, executor = OURS["controller"], OURS["executor"]
    grpc_port = _port(_flag(controller, "--grpc"))
    assert _flag(executor, "--controller") == f"dns:///controller:{grpc_port}"
    tokens_file = controller["environment"]["AGENT_REACH_CONTROLLER_EXECUTOR_TOKENS"]
    assert _mounts(controller)[tokens_file] == DEPLOY / "executor-tokens.yaml"
    assert executor["environment"]["AGENT_REACH_EXECUTOR_TOKEN"].startswith(
        "${AGENT_REACH_EXECUTOR_TOKEN:?"
    )
    makefile = (ROOT / "Makefile").read_text()
    assert "deploy/executor-tokens.yaml" in makefile  # written by `make compose-token`
    assert "AGENT_REACH_EXECUTOR_TOKEN=" in makefile


def test_executors_stop_within_compose_grace() -> None:
    executor = OURS["executor"]
    drain = float(executor["environment"]["AGENT_REACH_EXECUTOR_DRAIN_GRACE"])
    assert float(executor["stop_grace_period"].removesuffix("s")) > drain


def test_the_load_balancer_sends_rest_and_grpc_to_the_controllers_ports() -> None:
    conf = (DEPLOY / "nginx.conf").read_text()
    controller = OURS["controller"]
    servers = re.findall(r"server (controller:\d+) resolve;", conf)
    assert servers == [
        f"controller:{_port(_flag(controller, '--http'))}",
        f"controller:{_port(_flag(controller, '--grpc'))}",
    ]
    listens = [int(p) for p in re.findall(r"listen (\d+);", conf)]
    lb = SERVICES["lb"]
    assert _mounts(lb)["/etc/nginx/nginx.conf"] == DEPLOY / "nginx.conf"
    assert sorted(int(p.split(":")[1]) for p in lb["ports"]) == sorted(listens)
    assert "grpc_pass grpc://controllers_grpc;" in conf
    assert "http2 on;" in conf


def test_health_checks_ask_what_each_service_serves() -> None:
    controller, executor, demo = OURS["controller"], OURS["executor"], OURS["demo"]
    assert (
        f"http://127.0.0.1:{_port(_flag(controller, '--http'))}/readyz"
        in (controller["healthcheck"]["test"])
    )
    metrics = executor["environment"]["AGENT_REACH_EXECUTOR_METRICS"]
    # Readiness (`agent_reach_executor.probes`), on the metrics listener.
    assert executor["environment"]["AGENT_REACH_HEALTH_URL"] == (
        f"http://127.0.0.1:{_port(metrics)}{READYZ}"
    )
    assert any(f":{_port(_flag(demo, '--http'))}/" in part for part in demo["healthcheck"]["test"])


def test_prometheus_scrapes_every_replica_where_it_serves_metrics() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job["dns_sd_configs"][0] for job in config["scrape_configs"]}
    executor_metrics = OURS["executor"]["environment"]["AGENT_REACH_EXECUTOR_METRICS"]
    assert jobs["agent-reach-executor"] == {"names": ["executor"], "type": "A", "port": 9464}
    assert jobs["agent-reach-executor"]["port"] == _port(executor_metrics)
    assert jobs["agent-reach-controller"]["names"] == ["controller"]
    assert jobs["agent-reach-controller"]["port"] == _port(_flag(OURS["controller"], "--http"))
    assert _mounts(SERVICES["prometheus"])["/etc/prometheus"] == DEPLOY / "prometheus"


def test_grafana_loads_the_dashboard_from_the_stack_prometheus() -> None:
    grafana = SERVICES["grafana"]
    mounts = _mounts(grafana)
    provisioning = mounts["/etc/grafana/provisioning"]
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    (datasource,) = source["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    assert datasource["isDefault"] is True
    provider = yaml.safe_load((provisioning / "dashboards" / "agent-reach.yaml").read_text())
    folder = provider["providers"][0]["options"]["path"]
    dashboards = [target for target in mounts if target.startswith(folder + "/")]
    assert dashboards
    assert all(mounts[d] == DEPLOY / "grafana" / "agent-reach.json" for d in dashboards)


# The image.


def _copied_sources() -> list[str]:
    return [
        path
        for line in DOCKERFILE.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for path in line.split()[1:-1]
    ]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore-style `patterns` (last match wins, `!` re-includes) leave out
    `path` or its parent folders."""
    parts = path.split("/")
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").removeprefix("**/")
        for i in range(1, len(parts) + 1):
            candidate = "/".join(parts[:i]) if "/" in glob else parts[i - 1]
            if fnmatch.fnmatchcase(candidate, glob):
                ignored = not negated
                break
    return ignored


def test_the_dockerignore_passes_exactly_what_the_image_copies() -> None:
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for source in _copied_sources():
        assert (ROOT / source).exists(), source
        assert not _ignored(source, patterns), source
    for kept_out in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", ".reach/dev.db"):
        assert _ignored(kept_out, patterns), kept_out
    assert _ignored("controller/agent_reach_cli/__pycache__/main.cpython-311.pyc", patterns)


def test_the_image_runs_unprivileged_without_writing() -> None:
    final_stage = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    user = re.search(r"^USER (\d+)(?::(\d+))?$", final_stage, re.M)
    assert user is not None
    assert int(user.group(1)) != 0
    assert "PYTHONDONTWRITEBYTECODE=1" in final_stage
    assert "compileall" in DOCKERFILE
    assert "tzdata" in final_stage
    assert 'CMD ["python", "-m", "agent_reach_cli.health"]' in final_stage
    assert 'ENTRYPOINT ["reach"]' in final_stage


def test_the_operators_guide_covers_every_alert_and_its_commands_exist() -> None:
    guide = (DEPLOY / "OPERATIONS.md").read_text()
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    names = [rule["alert"] for group in alerts["groups"] for rule in group["rules"]]
    headings = re.findall(r"^### (\w+)$", guide, re.M)
    assert headings == names, "one section per alert, in the rules' order"
    commands = re.findall(r"`(reach [a-z-]+(?: [a-z-]+)?)", guide)
    assert commands
    parser = build_parser()
    for command in commands:
        words = command.split()[1:]
        with pytest.raises(SystemExit) as shown:
            parser.parse_args([*words, "--help"])
        assert shown.value.code == 0, command
