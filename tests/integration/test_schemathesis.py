"""Schemathesis over the published OpenAPI: no 5xx, responses as declared, bad data refused, and
every operation that declares an API key refuses a request without one or with a wrong one."""

from __future__ import annotations

import asyncio
import os
import threading
import traceback
import warnings
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Flaky
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from agent_reach_controller.api.app import create_app
from agent_reach_controller.api.auth import BOOTSTRAP, caller
from agent_reach_controller.runtime import Components
from tests.integration.stack import api_client, components_for, key_for, write_tools

T = TypeVar("T")
MAX_EXAMPLES = 30
SHARDS = 5
# Each commit draws the same examples, so a run that passed here passes in CI: Schemathesis's
# negative mode still has false positives at random (a one-element array sent as a valid string).
# REACH_SCHEMATHESIS_RANDOM=1 draws fresh examples, to explore.
DERANDOMIZE = os.environ.get("REACH_SCHEMATHESIS_RANDOM") != "1"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
]
Asgi = Callable[..., Coroutine[Any, Any, None]]


class AppLoop:
    """The components' own event loop, running in a thread so that Schemathesis (synchronous,
    with its own ASGI loop) and its re-sent auth probes all reach the same open database."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def bridge(self, app: Asgi) -> Asgi:
        """An ASGI app that runs `app` on this loop, relaying receive/send to the caller's loop."""
        loop = self.loop

        async def bridged(scope: Any, receive: Any, send: Any) -> None:
            theirs = asyncio.get_running_loop()

            async def receive_here() -> Any:
                received = asyncio.run_coroutine_threadsafe(receive(), theirs)
                return await asyncio.wrap_future(received)

            async def send_here(message: Any) -> None:
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(send(message), theirs))

            await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(app(scope, receive_here, send_here), loop)
            )

        return bridged

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def stack(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[AppLoop, Components, dict[str, str]]]:
    app_loop = AppLoop()
    ctx = components_for(sqlite_url, write_tools(tmp_path))
    c = app_loop.run(ctx.__aenter__())
    try:
        yield app_loop, c, app_loop.run(key_for(c, roles=("admin",)))
    finally:
        app_loop.run(ctx.__aexit__(None, None, None))
        app_loop.close()


def published_operations(app_loop: AppLoop, c: Components) -> list[Any]:
    """The controller's operations, as Schemathesis reads them from the published document,
    sorted so that every shard takes the same ones on every run."""
    app = create_app(c)
    schema = schemathesis.openapi.from_dict(app.openapi())
    schema.app = app_loop.bridge(app)
    return sorted((result.ok() for result in schema.get_all_operations()), key=lambda op: op.label)


def test_every_operation_is_published_and_every_v1_one_declares_a_key(
    stack: tuple[AppLoop, Components, dict[str, str]],
) -> None:
    app_loop, c, _ = stack
    operations = published_operations(app_loop, c)
    labels = {op.label for op in operations}
    assert {"GET /healthz", "GET /readyz", "POST /v1/tasks", "POST /v1/keys"} <= labels
    v1 = [op for op in operations if op.path.startswith("/v1")]
    assert v1
    assert all(op.definition.raw.get("security") for op in v1), "every /v1 route declares a key"


def chain(exc: BaseException) -> str:
    """The whole exception: a Hypothesis "flaky" report holds the failure it saw first."""
    return "".join(traceback.format_exception(exc))


def modes_for(operation: Any) -> list[GenerationMode]:
    """Positive cases for every operation; negative ones for those that take input."""
    raw = operation.definition.raw
    takes_input = "parameters" in raw or "requestBody" in raw
    return [GenerationMode.POSITIVE] + [GenerationMode.NEGATIVE] * takes_input


@pytest.mark.parametrize("shard", range(SHARDS))
def test_the_published_openapi_holds_under_schemathesis(
    stack: tuple[AppLoop, Components, dict[str, str]], shard: int
) -> None:
    """One shard of the operations, each on a fresh database: one test for all 65 operations
    took over two minutes on a loaded machine, past the per-test timeout."""
    app_loop, c, admin = stack
    operations = published_operations(app_loop, c)[shard::SHARDS]
    cases = 0
    statuses: dict[int, int] = {}
    failures: list[str] = []

    for operation in operations:
        for mode in modes_for(operation):

            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                derandomize=DERANDOMIZE,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case: Any) -> None:
                nonlocal cases
                cases += 1
                response = case.call(headers=admin)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                case.validate_response(response, checks=CHECKS, headers=admin)

            for attempt in (1, 2):
                try:
                    check()
                except Flaky as exc:
                    # A failure Hypothesis saw once and could not replay (seen on a loaded CI
                    # machine, a different operation each run). The run is repeated; only a
                    # failure that comes back fails the test, and the first one is reported.
                    # A 500 fails it either way: every status answered is counted below.
                    report = f"{operation.label} [{mode.value}], run {attempt}:\n{chain(exc)}"
                    if attempt == 2:
                        failures.append(report)
                    warnings.warn(report, stacklevel=1)
                    continue
                except Exception as exc:
                    failures.append(f"{operation.label} [{mode.value}]:\n{chain(exc)}")
                break

    print(f"schemathesis shard {shard}: {len(operations)} operations, {cases} cases, {statuses}")
    assert not failures, "\n\n".join(failures)
    assert 500 not in statuses
    assert cases >= len(operations) * MAX_EXAMPLES // 2


def test_ignored_auth_catches_a_route_that_skips_the_key(
    stack: tuple[AppLoop, Components, dict[str, str]],
) -> None:
    """The check is live: with the key dependency bypassed, it reports the hole."""
    app_loop, c, admin = stack
    app = create_app(c)
    app.dependency_overrides[caller] = lambda: BOOTSTRAP
    schema = schemathesis.openapi.from_dict(app.openapi())
    schema.app = app_loop.bridge(app)
    case = schema["/v1/tasks"]["GET"].Case()
    response = case.call(headers=admin)
    assert response.status_code == 200
    with pytest.raises(FailureGroup, match=r"[Aa]uth"):
        case.validate_response(response, checks=[ignored_auth], headers=admin)


async def test_a_repeated_query_parameter_is_refused_not_last_wins(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Found by negative_data_rejection: `?before=a&before=b` used to answer 200."""
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, api_client(c) as client:
        response = await client.get("/v1/tasks?before=a&before=b")
        assert response.status_code == 422
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["errors"][0]["pointer"] == "/query/before"
        assert (await client.get("/v1/tasks?before=a&limit=5")).status_code == 200
