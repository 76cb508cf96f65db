"""The compose file and Dockerfile run commands and settings that really exist."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent_reach_cli.main import build_parser
from agent_reach_controller.settings import ControllerSettings
from agent_reach_executor import ExecutorSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
OURS = {name: s for name, s in COMPOSE["services"].items() if s.get("image") == "agent-reach:dev"}


def test_our_services_exist() -> None:
    assert set(OURS) == {"migrate", "controller", "executor"}


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
    for variable in OURS[name]["environment"]:
        for prefix, fields in prefixes.items():
            if variable.startswith(prefix):
                assert variable.removeprefix(prefix).lower() in fields, variable


def test_mounted_tools_file_exists_and_dockerfile_inputs_exist() -> None:
    source = OURS["controller"]["volumes"][0].split(":")[0]
    assert (ROOT / "deploy" / source).resolve().is_file()
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for path in line.split()[1:-1]:
                assert (ROOT / path).exists(), path
    assert 'ENTRYPOINT ["reach"]' in dockerfile


def test_compose_executors_authenticate_with_the_token_the_controller_knows() -> None:
    controller, executor = OURS["controller"], OURS["executor"]
    tokens_file = controller["environment"]["AGENT_REACH_CONTROLLER_EXECUTOR_TOKENS"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in controller["volumes"]}
    assert mounts[tokens_file] == "./executor-tokens.yaml"  # written by `make compose-token`
    assert executor["environment"]["AGENT_REACH_EXECUTOR_TOKEN"].startswith(
        "${AGENT_REACH_EXECUTOR_TOKEN:?"
    )
    makefile = (ROOT / "Makefile").read_text()
    assert "deploy/executor-tokens.yaml" in makefile
    assert "AGENT_REACH_EXECUTOR_TOKEN=" in makefile
