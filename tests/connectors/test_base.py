"""The connector protocol: discovery, secret resolution, and error classification defaults."""

from __future__ import annotations

import pytest

from agent_reach_connectors import Connector, ConnectorError, load_connectors, resolve_secrets

ALL = {"http", "python", "echo", "sleep", "script", "notify"}


def test_load_connectors_finds_every_built_in_one() -> None:
    found = load_connectors()
    assert set(found) >= ALL
    for name in ALL:
        assert isinstance(found[name], Connector)
        assert found[name].name == name


def test_load_connectors_by_name() -> None:
    assert set(load_connectors(["echo", "http"])) == {"echo", "http"}
    with pytest.raises(LookupError, match="nope"):
        load_connectors(["nope"])


async def test_every_connector_starts_and_closes_twice() -> None:
    for connector in load_connectors(ALL).values():
        await connector.start()
        await connector.close()
        await connector.close()


def test_resolve_secrets_walks_nested_values() -> None:
    env = {"A": "1", "B": "two"}
    config = {"x": ["${env:A}-${env:B}", 3, None], "y": {"z": "${env:B}"}, "k": "plain"}
    assert resolve_secrets(config, env) == {
        "x": ["1-two", 3, None],
        "y": {"z": "two"},
        "k": "plain",
    }


def test_resolve_secrets_does_not_expand_twice() -> None:
    assert resolve_secrets("${env:A}", {"A": "${env:B}", "B": "no"}) == "${env:B}"


def test_missing_secret_names_the_variable_only() -> None:
    with pytest.raises(ConnectorError) as info:
        resolve_secrets({"h": "Bearer ${env:MISSING_TOKEN}"}, {"OTHER": "hunter2"})
    assert "MISSING_TOKEN" in info.value.message
    assert "hunter2" not in info.value.message
    assert (info.value.code, info.value.retryable) == ("connector_error", False)


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        ("timeout", True),
        ("downstream_unavailable", True),
        ("rate_limited", True),
        ("connection_error", True),
        ("downstream_rejected", False),
        ("unauthorized", False),
        ("not_found", False),
        ("invalid_arguments", False),
        ("no_such_code", False),
    ],
)
def test_connector_error_retryability_defaults_to_the_code(code, retryable) -> None:
    error = ConnectorError(code, "m")
    assert (error.code, error.retryable, error.maybe_applied, error.retry_after) == (
        code,
        retryable,
        False,
        None,
    )
    assert ConnectorError(code, "m", retryable=not retryable).retryable is (not retryable)
