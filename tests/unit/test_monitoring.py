"""deploy/'s alert and autoscaling rules, their tests, the Prometheus config and the Grafana
dashboard: valid for promtool, and naming only metrics the code exports."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_executor.metrics import ExecutorMetrics

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
AUTOSCALING = PROMETHEUS / "autoscaling.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "agent-reach.json"
OURS = re.compile(r"\bagent_reach_[a-z0-9_]+")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def promtool_ok(promtool: str, *args: str) -> str:
    done = subprocess.run([promtool, *args], capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def exported(registry: CollectorRegistry) -> set[str]:
    """Every series name `registry` can expose, labelled children or not."""
    names = set()
    for family in registry.collect():
        suffixes = SUFFIXES.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
    return names


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every query in the dashboard."""
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", ()):
            yield panel["title"], target["expr"]


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_alert_rules_are_valid(promtool: str) -> None:
    said = promtool_ok(promtool, "check", "rules", str(ALERTS))
    assert f"SUCCESS: {len(alert_rules())} rules found" in said


def test_the_alert_rules_pass_their_unit_tests(promtool: str) -> None:
    promtool_ok(promtool, "test", "rules", str(PROMETHEUS / "alerts_test.yml"))


def test_the_autoscaling_rules_are_valid_and_compute_what_they_say(promtool: str) -> None:
    assert "SUCCESS: 7 rules found" in promtool_ok(promtool, "check", "rules", str(AUTOSCALING))
    promtool_ok(promtool, "test", "rules", str(PROMETHEUS / "autoscaling_test.yml"))


def test_every_autoscaling_signal_is_tested() -> None:
    groups = yaml.safe_load(AUTOSCALING.read_text())["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"]}
    tests = yaml.safe_load((PROMETHEUS / "autoscaling_test.yml").read_text())["tests"]
    checked = {case["expr"] for test in tests for case in test.get("promql_expr_test", ())}
    assert recorded <= checked


def test_every_alert_is_unit_tested_firing() -> None:
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", ())
        if case["exp_alerts"]
    }
    assert fired == {rule["alert"] for rule in alert_rules()}


def test_the_compose_prometheus_config_is_valid(promtool: str) -> None:
    promtool_ok(promtool, "check", "config", str(PROMETHEUS / "prometheus.yml"))


def test_every_dashboard_query_parses(promtool: str, tmp_path: Path) -> None:
    """Each query as a recording rule, Grafana's variables filled in, through promtool."""
    rules = [
        {
            "record": f"dashboard:query_{i}",
            "expr": expr.replace("$__rate_interval", "5m").replace("$tool", ".*"),
        }
        for i, (_, expr) in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool_ok(promtool, "check", "rules", str(path))


def test_deploy_names_only_metrics_the_code_exports() -> None:
    known = exported(ControllerMetrics().registry) | exported(ExecutorMetrics(slots=1).registry)
    used = {
        f"{where}: {name}"
        for where, text in [
            ("alerts.yml", ALERTS.read_text()),
            ("alerts_test.yml", (PROMETHEUS / "alerts_test.yml").read_text()),
            ("autoscaling.yml", AUTOSCALING.read_text()),
            ("autoscaling_test.yml", (PROMETHEUS / "autoscaling_test.yml").read_text()),
            *((f"dashboard panel {title!r}", expr) for title, expr in dashboard_queries()),
        ]
        for name in OURS.findall(text)
        if name not in known
    }
    assert not used, sorted(used)


def test_the_dashboard_shows_every_metric_the_code_exports() -> None:
    queried = {name for _, expr in dashboard_queries() for name in OURS.findall(expr)}
    missing = [
        family.name
        for registry in (ControllerMetrics().registry, ExecutorMetrics(slots=1).registry)
        for family in registry.collect()
        if family.name.startswith("agent_reach_")
        and not {family.name + s for s in SUFFIXES.get(family.type, ("",))} & queried
    ]
    assert not missing


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_every_alert_says_how_bad_and_what_to_do(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in {"warning", "critical"}
    assert rule["annotations"]["summary"]
    assert len(rule["annotations"]["description"]) > 40
