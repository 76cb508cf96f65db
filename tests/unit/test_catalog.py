"""Tool catalog: YAML loading, error reports, retry policy and model exports."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent_reach_controller.tools import (
    RetryPolicy,
    ToolCatalog,
    ToolFileError,
    ToolSpec,
    backoff_delay,
    openai_name,
)
from agent_reach_controller.tools.catalog import STORED

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tools"


@pytest.fixture
def catalog() -> ToolCatalog:
    return ToolCatalog.from_yaml_files([FIXTURES / "catalog.yaml", FIXTURES / "more.yaml"])


def test_loads_both_yaml_shapes(catalog: ToolCatalog) -> None:
    assert catalog.names() == [
        "weather.forecast",
        "reminder.create",
        "records.delete",
        "order.query",
    ]
    assert len(catalog) == 4
    assert "order.query" in catalog
    assert catalog.get("nope") is None
    weather = catalog["weather.forecast"]
    assert weather.timeout == 5.0
    assert weather.retry.initial_interval == 0.5
    assert weather.retry.maximum_interval == 60.0
    assert weather.retry.maximum_attempts == 4
    assert weather.output == ["summary", "rain"]
    assert catalog["order.query"].idempotent is True
    assert catalog["records.delete"].enabled is False


def test_catalog_is_immutable(catalog: ToolCatalog) -> None:
    with pytest.raises(TypeError):
        catalog["x"] = catalog["order.query"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        catalog.extra = 1  # type: ignore[attr-defined]


def test_errors_name_file_tool_and_field_and_are_all_collected() -> None:
    with pytest.raises(ToolFileError) as info:
        ToolCatalog.from_yaml_files([FIXTURES / "invalid.yaml"])
    errors = info.value.errors
    src = str(FIXTURES / "invalid.yaml")
    assert (
        f"{src}: tool 'order.query' (tools[0]): retry.maximum_attempts: "
        "Input should be greater than or equal to 1"
    ) in errors
    assert any(
        e.startswith(f"{src}: tool 'order.query' (tools[0]): retry.initial_interval:")
        and "soon" in e
        for e in errors
    )
    assert any(e.startswith(f"{src}: tool 'order.query' (tools[0]): risk:") for e in errors)
    assert f"{src}: tools[1]: name: Field required" in errors
    assert any(e.startswith(f"{src}: tools[1]: colour:") for e in errors)
    assert any(
        e.startswith(f"{src}: tool 'bad.schema' (tools[2]): input_schema:") and "JSON Schema" in e
        for e in errors
    )
    assert len(errors) == 6
    assert str(info.value) == "\n".join(errors)


def test_duplicate_names_within_and_across_files(tmp_path: Path) -> None:
    with pytest.raises(ToolFileError, match=r"tool 'order.query' \(tools\[1\]\): duplicate"):
        ToolCatalog.from_yaml_files([FIXTURES / "duplicate.yaml"])
    other = tmp_path / "other.yaml"
    other.write_text("- {name: order.query, description: Again., connector: http}\n")
    with pytest.raises(ToolFileError) as info:
        ToolCatalog.from_yaml_files([FIXTURES / "more.yaml", other])
    assert info.value.errors == [
        f"{other}: tool 'order.query' (tools[0]): duplicate tool name "
        f"(first defined in {FIXTURES / 'more.yaml'} tools[0])"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tools: 3\n", "'tools' must be a list"),
        ("tools: []\nextra: 1\n", "unknown top-level keys: extra"),
        ("42\n", "expected a mapping"),
        ("tools: [\n", "cannot read tool file"),
        ("- 7\n", "tools[0]: expected a mapping, got int"),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ToolFileError, match=r"t\.yaml: ") as info:
        ToolCatalog.from_yaml_files([path])
    assert expected in str(info.value)


def test_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ToolFileError, match=r"missing\.yaml: cannot read"):
        ToolCatalog.from_yaml_files([tmp_path / "missing.yaml"])


def test_durations_accept_numbers_and_units() -> None:
    policy = RetryPolicy.model_validate(
        {"initial_interval": "250ms", "maximum_interval": "2m", "backoff_coefficient": 3}
    )
    assert policy.initial_interval == 0.25
    assert policy.maximum_interval == 120.0
    assert RetryPolicy.model_validate({"initial_interval": 2}).initial_interval == 2.0
    spec = ToolSpec.model_validate(
        {"name": "a", "description": "d", "connector": "http", "timeout": "1h"}
    )
    assert spec.timeout == 3600.0
    with pytest.raises(ValueError, match="greater than 0"):
        RetryPolicy.model_validate({"initial_interval": 0})
    with pytest.raises(ValueError, match="maximum_interval must be >= initial_interval"):
        RetryPolicy.model_validate({"initial_interval": "2m", "maximum_interval": "1m"})


def test_tool_name_pattern() -> None:
    with pytest.raises(ValueError, match="name"):
        ToolSpec.model_validate({"name": "9lives", "description": "d", "connector": "x"})


def test_version_is_stable_and_changes_with_the_spec() -> None:
    base = {"name": "a.b", "description": "d", "connector": "http"}
    one = ToolSpec.model_validate(base)
    assert one.version == ToolSpec.model_validate(dict(base)).version
    assert len(one.version) == 12
    assert int(one.version, 16) >= 0
    assert one.version != ToolSpec.model_validate({**base, "description": "e"}).version
    assert one.version != ToolSpec.model_validate({**base, "timeout": 31}).version


def test_backoff_without_jitter_is_exponential_and_capped() -> None:
    policy = RetryPolicy(
        initial_interval=1.0, backoff_coefficient=2.0, maximum_interval=10.0, jitter=False
    )
    assert [backoff_delay(policy, n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff_delay(policy, 100_000) == 10.0
    with pytest.raises(ValueError, match="1-based"):
        backoff_delay(policy, 0)


def test_backoff_full_jitter_stays_in_range_and_is_seedable() -> None:
    policy = RetryPolicy(initial_interval=1.0, maximum_interval=8.0)
    delays = [backoff_delay(policy, 3, rng=random.Random(seed)) for seed in range(200)]
    assert all(0.0 <= d <= 4.0 for d in delays)
    assert len(set(delays)) > 100
    assert backoff_delay(policy, 3, rng=random.Random(7)) == backoff_delay(
        policy, 3, rng=random.Random(7)
    )


def test_openai_and_anthropic_exports(catalog: ToolCatalog) -> None:
    from agent_reach_controller.tools.shapes import tool_list

    openai = tool_list(catalog.enabled(), "openai_chat")
    names = [t["function"]["name"] for t in openai]
    assert names == ["weather_forecast", "reminder_create", "order_query"]  # disabled left out
    first = openai[0]
    assert first["type"] == "function"
    assert first["function"]["parameters"] == catalog["weather.forecast"].input_schema
    anthropic = tool_list(catalog.values(), "anthropic")
    assert [t["name"] for t in anthropic] == [
        "weather_forecast",
        "reminder_create",
        "records_delete",
        "order_query",
    ]
    assert anthropic[0]["input_schema"] == catalog["weather.forecast"].input_schema
    assert catalog.resolve_openai_name("order_query") == "order.query"
    assert catalog.resolve_openai_name("order.query") == "order.query"
    assert catalog.resolve_openai_name("nothing") is None


def test_openai_names_are_valid_and_collisions_refused() -> None:
    long_name = "a" + ".b" * 60
    mapped = openai_name(long_name)
    assert len(mapped) == 64
    assert mapped == openai_name(long_name)
    assert mapped != openai_name(long_name + "c")
    specs = [
        ToolSpec(name="a.b", description="d", connector="x"),
        ToolSpec(name="a_b", description="d", connector="x"),
    ]
    with pytest.raises(ToolFileError, match=r"OpenAI name 'a_b' is also that of tool 'a\.b'"):
        ToolCatalog(specs)


def test_fallbacks_must_exist_and_must_not_loop() -> None:
    from agent_reach_controller.tools.catalog import ToolFileError, ToolSpec

    def tool(name: str, fallback: str | None = None) -> ToolSpec:
        return ToolSpec(name=name, description="d", connector="echo", fallback=fallback)

    assert len(ToolCatalog([tool("a", "b"), tool("b")])) == 2
    with pytest.raises(ToolFileError) as loop:
        ToolCatalog([tool("a", "b"), tool("b", "a")])
    assert "fallbacks loop (a -> b -> a)" in str(loop.value)
    with pytest.raises(ToolFileError) as unknown:
        ToolCatalog([tool("a", "x")])
    assert "fallback 'x' is not a known tool" in str(unknown.value)


def test_a_stored_version_with_a_name_checked_only_since_still_loads() -> None:
    """A tool stored before keys were checked for undeclared names stays loadable (every submit
    and dispatch reads it), while a new one like it is refused."""
    from pydantic import ValidationError as Invalid

    from agent_reach_controller.tools.catalog import STORED, ToolSpec

    spec = {
        "name": "crm.update",
        "description": "Update a customer.",
        "connector": "http",
        "rate_limit": {"rate": "5/s", "key": "customer.id"},
        "effects": {"rows": "size(rows)"},
    }
    with pytest.raises(Invalid, match="undeclared variable 'customer'"):
        ToolSpec.model_validate(spec)
    loaded = ToolSpec.model_validate(spec, context=STORED)
    assert loaded.rate_limit is not None
    assert loaded.rate_limit.key == "customer.id"


def test_a_tool_that_asks_to_write_must_say_it_writes() -> None:
    reading = {
        "name": "orders.fix",
        "description": "Fixes an order row.",
        "connector": "sql",
        "config": {"write": True, "query": "UPDATE orders SET status = %(status)s"},
    }
    with pytest.raises(ValueError, match=r"config\.write: true needs risk: write or dangerous"):
        ToolSpec.model_validate(reading)
    assert ToolSpec.model_validate({**reading, "risk": "write"}).config["write"] is True


DESTINATION_TOOLS = """\
tools:
  - name: hook.any
    description: Posts to the URL the model gives.
    connector: http
    config: {url: "https://{host}/hook", method: POST}
  - name: notify
    description: Tells people.
    connector: notify
    config: {webhook_secret: "${env:S}"}
  - name: notify.bad
    description: Tells people.
    connector: notify
    config: {destinations: ["*.example.org", "*"]}
  - name: mail.http
    description: An http tool with an email domain.
    connector: http
    config: {url: "https://{host}/", destinations: ["@example.org"]}
  - name: sandbox.open
    description: Its sandbox URL takes the host from the arguments.
    connector: http
    risk: write
    config: {url: "https://api.example.org/x"}
    sandbox: {url: "https://{host}/x"}
"""


def test_a_tool_that_sends_where_its_arguments_say_must_list_destinations(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(DESTINATION_TOOLS)
    with pytest.raises(ToolFileError) as info:
        ToolCatalog.from_yaml_files([path])
    errors = [e.removeprefix(f"{path}: ") for e in info.value.errors]
    assert errors == [
        "tool 'hook.any' (tools[0]): config.destinations: destinations is required: an argument "
        "of the url reaches its scheme, host or port; list the hosts it may reach (host names, "
        "*.suffix, addresses)",
        "tool 'notify' (tools[1]): config.destinations: destinations is required: a notify "
        "tool's targets come from its arguments; list where it may send (host names, "
        "*.suffix, addresses, @domain for email)",
        "tool 'notify.bad' (tools[2]): config.destinations: destinations entry '*' is not a "
        "destination (a list that admits everything restricts nothing)",
        "tool 'mail.http' (tools[3]): config.destinations: an @domain entry of destinations "
        "names email recipients; http sends none",
        "tool 'sandbox.open' (tools[4]): sandbox.destinations: destinations is required: an "
        "argument of the url reaches its scheme, host or port; list the hosts it may reach "
        "(host names, *.suffix, addresses)",
    ]


def test_listed_destinations_load_and_fixed_urls_need_none() -> None:
    fixed = {"name": "a", "description": "d", "connector": "http"}
    ToolSpec.model_validate(fixed | {"config": {"url": "https://api.example.org/{id}"}})
    ToolSpec.model_validate(
        fixed | {"config": {"url": "https://{host}/x", "destinations": ["*.example.org"]}}
    )
    ToolSpec.model_validate(
        fixed | {"connector": "notify", "config": {"destinations": ["hooks.example.org", "@x.org"]}}
    )
    # Other connectors do not read the list: their config keys are their own.
    ToolSpec.model_validate(fixed | {"connector": "python", "config": {"destinations": "any"}})


def test_a_stored_tool_without_destinations_still_loads() -> None:
    stored = {"name": "n", "description": "d", "connector": "notify", "config": {}}
    assert ToolSpec.model_validate(stored, context=STORED).enabled
