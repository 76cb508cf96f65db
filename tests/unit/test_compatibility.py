"""This release against the previous one (tests/support/releases.py), for clients and executors
built on it: the gRPC contract by `buf breaking` (from the `buf-bin` package), the REST contract
by comparing the OpenAPI documents. Each check is also shown failing on a breaking change."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_reach_controller.api.app import create_app
from tests.support.openapi_compat import breaking_changes
from tests.support.releases import PACKAGES, ROOT, unpack

BUF = Path(sys.executable).parent / "buf"


def _protos(source: Path, target: Path) -> Path:
    """Only the .proto files of `source` (buf reads every file it finds)."""
    for proto in source.rglob("*.proto"):
        destination = target / proto.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(proto, destination)
    return target


def _buf_breaking(new: Path, old: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUF), "breaking", str(new), "--against", str(old)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(tmp_path_factory.mktemp("previous"), *PACKAGES)


def test_the_grpc_contract_breaks_nothing_of_the_previous_release(
    previous: Path, tmp_path: Path
) -> None:
    old = _protos(previous / "proto", tmp_path / "old")
    new = _protos(ROOT / "proto", tmp_path / "new")
    result = _buf_breaking(new, old)
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_reports_a_deleted_field(previous: Path, tmp_path: Path) -> None:
    old = _protos(previous / "proto", tmp_path / "old")
    new = _protos(ROOT / "proto", tmp_path / "new")
    proto = next(new.rglob("executor.proto"))
    proto.write_text(proto.read_text().replace("string executor_id = 1;", "", 1))
    result = _buf_breaking(new, old)
    assert result.returncode != 0
    assert "executor_id" in result.stdout


def _previous_openapi(previous: Path) -> dict[str, Any]:
    paths = os.pathsep.join(str(previous / p) for p in PACKAGES)
    dumped = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json; from agent_reach_controller.api.app import create_app;"
            " print(json.dumps(create_app(None).openapi()))",
        ],
        env={**os.environ, "PYTHONPATH": paths},
        cwd=previous,
        capture_output=True,
        text=True,
        check=True,
    )
    document: dict[str, Any] = json.loads(dumped.stdout)
    return document


def test_the_rest_contract_breaks_nothing_of_the_previous_release(previous: Path) -> None:
    old = _previous_openapi(previous)
    assert old["info"]["version"] == "0.1.0"
    new = create_app(None).openapi()  # type: ignore[arg-type]
    assert breaking_changes(old, new) == []


def _api(**schemas: dict[str, Any]) -> dict[str, Any]:
    return {
        "paths": {
            "/v1/things": {
                "post": {
                    "parameters": [{"in": "query", "name": "wait", "required": False}],
                    "requestBody": {
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/In"}}
                        }
                    },
                    "responses": {
                        "202": {
                            "content": {
                                "application/json": {"schema": {"$ref": "#/components/schemas/Out"}}
                            }
                        }
                    },
                }
            }
        },
        "components": {"schemas": schemas},
    }


OLD = _api(
    In={
        "type": "object",
        "additionalProperties": False,
        "properties": {"goal": {"type": "string"}},
    },
    Out={
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["pending", "succeeded"]},
            "steps": {
                "type": "array",
                "items": {"type": "object", "properties": {"id": {"type": "string"}}},
            },
        },
    },
)


def test_the_openapi_comparison_reports_what_breaks_a_client() -> None:
    assert breaking_changes(OLD, copy.deepcopy(OLD)) == []
    added = copy.deepcopy(OLD)
    added["components"]["schemas"]["Out"]["properties"]["usage"] = {"type": "object"}
    added["paths"]["/v1/other"] = {"get": {"responses": {}}}
    assert breaking_changes(OLD, added) == []

    changed = copy.deepcopy(OLD)
    schemas = changed["components"]["schemas"]
    schemas["Out"]["properties"]["status"]["enum"].remove("succeeded")
    del schemas["Out"]["properties"]["steps"]["items"]["properties"]["id"]
    del schemas["In"]["properties"]["goal"]
    schemas["In"]["required"] = ["steps"]
    changed["paths"]["/v1/things"]["post"]["parameters"][0]["required"] = True
    assert sorted(breaking_changes(OLD, changed)) == sorted(
        [
            "POST /v1/things 202.status: enum value 'succeeded' removed",
            "POST /v1/things 202.steps[].id: field removed",
            "POST /v1/things body.goal: field removed",
            "POST /v1/things body.steps: newly required",
            "POST /v1/things: parameter wait (query) newly required",
        ]
    )
    gone = copy.deepcopy(OLD)
    del gone["paths"]["/v1/things"]
    assert breaking_changes(OLD, gone) == ["POST /v1/things: operation removed"]
