"""Console sign-ins: the CSRF token, and whose word a proxy header is taken on."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from agent_reach_controller.identity.sign_ins import (
    ProxyTrust,
    ProxyUser,
    ProxyUsers,
    ProxyUsersError,
    csrf_matches,
    csrf_token,
    load_proxy_users,
)


def test_the_csrf_token_is_the_sessions_own() -> None:
    one, two = "ars_" + "a" * 43, "ars_" + "b" * 43
    assert csrf_token(one) == csrf_token(one)
    assert csrf_token(one) != csrf_token(two)
    assert len(csrf_token(one)) == 32
    assert csrf_matches(one, csrf_token(one))
    assert not csrf_matches(one, csrf_token(two))
    assert not csrf_matches(one, None)
    assert not csrf_matches(one, "")


def proxy() -> ProxyTrust:
    return ProxyTrust(
        header="X-Forwarded-User",
        networks=(ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128")),
        users=ProxyUsers(users={"ann": ProxyUser(tenant="acme", roles=["approver"])}),
    )


@pytest.mark.parametrize(
    ("peer", "headers", "user"),
    [
        ("10.2.3.4", {"X-Forwarded-User": "ann"}, "ann"),
        ("::1", {"X-Forwarded-User": " ann "}, "ann"),
        ("192.0.2.1", {"X-Forwarded-User": "ann"}, None),  # not the proxy
        ("10.2.3.4", {}, None),
        ("10.2.3.4", {"X-Forwarded-User": "  "}, None),
        (None, {"X-Forwarded-User": "ann"}, None),
        ("not-an-address", {"X-Forwarded-User": "ann"}, None),
    ],
)
def test_only_the_proxy_may_name_a_user(
    peer: str | None, headers: dict[str, str], user: str | None
) -> None:
    assert proxy().user_of(peer, headers) == user


def test_a_named_user_is_a_principal_only_when_the_file_maps_them() -> None:
    found = proxy().principal("ann")
    assert found is not None
    assert (found.tenant, found.roles) == ("acme", ("approver",))
    assert proxy().principal("mallory") is None


def test_a_bad_users_file_is_refused_with_where(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    path.write_text("users:\n  ann: {tenant: acme, roles: [a], extra: 1}\n")
    with pytest.raises(ProxyUsersError, match=r"users\.ann\.extra"):
        load_proxy_users(path)
    path.write_text("users: [\n")
    with pytest.raises(ProxyUsersError, match=str(path)):
        load_proxy_users(path)


def test_settings_refuse_a_proxy_without_users_and_a_trace_link_without_its_id() -> None:
    from pydantic import ValidationError

    from agent_reach_controller.settings import ControllerSettings

    with pytest.raises(ValidationError, match="console_proxy_users"):
        ControllerSettings(console_proxy_header="X-Forwarded-User")
    with pytest.raises(ValidationError, match="trace_id"):
        ControllerSettings(jaeger_url="https://jaeger.example/trace/")
    made = ControllerSettings(console_proxy_trusted="10.0.0.0/8, 192.168.0.0/16")  # type: ignore[arg-type]
    assert made.console_proxy_trusted == ["10.0.0.0/8", "192.168.0.0/16"]
