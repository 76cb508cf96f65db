"""charts/agent-reach, offline: rendered and linted (strict) by Helm's own Go SDK with each values
file of tests/fixtures/chart, every manifest validated against the Kubernetes schemas and
cert-manager's models, then the checks a rendering alone cannot make: what the pods run is what
`reach` accepts, probes and services point at declared ports, migrations run before controllers,
executors drain within their grace, only controllers and the migration get the database, every
pod is locked down."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.cert_manager.v1 import Certificate
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from cloudcoil.models.prometheus_operator import v1 as monitoring

from agent_reach_cli.main import build_parser
from agent_reach_controller.api.app import create_app
from agent_reach_controller.identity import policy
from agent_reach_controller.services.autoscaling import PoolDemand
from agent_reach_controller.settings import ControllerSettings
from agent_reach_controller.tools.catalog import ToolCatalog
from agent_reach_executor import ExecutorSettings
from agent_reach_executor.probes import READYZ

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "agent-reach"
FIXTURES = ROOT / "tests" / "fixtures" / "chart"
VALUES = {path.stem: yaml.safe_load(path.read_text()) for path in sorted(FIXTURES.glob("*.yaml"))}
KUBERNETES = "1.30.0"
HOOK = "helm.sh/hook"


def render(values: dict[str, Any], *, namespace: str = "agents") -> list[dict[str, Any]]:
    out = helm.Chart.load(CHART).render(values, name="reach", namespace=namespace, is_install=True)
    docs = []
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def pods(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod spec) of every Deployment and Job."""
    for doc in docs:
        if doc["kind"] in {"Deployment", "Job"}:
            yield doc, doc["spec"]["template"]["spec"]


def component(doc: dict[str, Any]) -> str:
    name: str = doc["metadata"]["labels"]["app.kubernetes.io/component"]
    return name


@pytest.fixture(scope="module", params=sorted(VALUES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(VALUES[request.param])


def test_the_chart_lints_strictly_with_every_values_file() -> None:
    for name, values in VALUES.items():
        report = helm.lint(CHART, values, strict=True, kube_version=KUBERNETES)
        assert report["errors"] == [], (name, report)
        assert report["messages"] == [], (name, report)


def test_every_manifest_is_valid_for_kubernetes(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_MODELS:
            continue
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


# Objects of CRDs, checked against models generated from the CRDs' schemas (cloudcoil-models-*).
CRD_MODELS: dict[tuple[str, str], Any] = {
    ("cert-manager.io/v1", "Certificate"): Certificate,
    ("keda.sh/v1alpha1", "ScaledObject"): ScaledObject,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring.ServiceMonitor,
    ("monitoring.coreos.com/v1", "PodMonitor"): monitoring.PodMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): monitoring.PrometheusRule,
}


def test_custom_resources_match_their_crd_models(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    for doc in docs:
        model = CRD_MODELS.get((doc["apiVersion"], doc["kind"]))
        if model is None:
            continue
        parsed = model.model_validate(doc)
        # The models ignore unknown fields: what they read back must be all that was written.
        assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc


def test_the_certificate_covers_the_controllers_names() -> None:
    (certificate,) = by_kind(render(VALUES["tls"]), "Certificate")
    (controller,) = [
        d for d in by_kind(render(VALUES["tls"]), "Deployment") if component(d) == "controller"
    ]
    volumes = {v["name"]: v for v in controller["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    names = certificate["spec"]["dnsNames"]
    assert "reach-agent-reach-controller-headless.agents.svc" in names


def test_the_values_schema_refuses_typos_and_pools_without_tokens() -> None:
    wrong = copy.deepcopy(VALUES["minimal"])
    wrong["controler"] = {"replicas": 3}
    with pytest.raises(helm.HelmError, match="controler"):
        render(wrong)
    no_token = copy.deepcopy(VALUES["minimal"])
    no_token["executorPools"] = [{"name": "default"}]
    with pytest.raises(helm.HelmError, match="token"):
        render(no_token)
    empty_token = copy.deepcopy(VALUES["minimal"])
    empty_token["executorPools"] = [{"name": "default", "token": {"existingSecret": ""}}]
    with pytest.raises(helm.HelmError, match="executor token Secret"):
        render(empty_token)
    no_database = {"executorPools": VALUES["minimal"]["executorPools"]}
    with pytest.raises(helm.HelmError):
        render(no_database)


def test_what_the_pods_run_is_what_reach_accepts(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    settings = {
        "AGENT_REACH_CONTROLLER_": set(ControllerSettings.model_fields),
        "AGENT_REACH_EXECUTOR_": set(ExecutorSettings.model_fields),
    }
    for _, spec in pods(docs):
        for container in spec["containers"]:
            args = build_parser().parse_args(container["args"])
            assert args.command in {"controller", "executor", "migrate"}
            assert not getattr(args, "migrate", False), "controllers do not migrate in the chart"
            for env in container.get("env", ()):
                for prefix, fields in settings.items():
                    if env["name"].startswith(prefix):
                        assert env["name"].removeprefix(prefix).lower() in fields, env["name"]


def test_probes_and_services_point_at_declared_ports(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    for _, spec in pods(docs):
        for container in spec["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", ())}
            for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = container.get(probe_name)
                if probe is None:
                    continue
                action = probe.get("httpGet") or probe.get("grpc")
                assert action is not None, probe
                port = action["port"]
                assert port in ports or port in ports.values(), (
                    container["name"],
                    probe_name,
                    port,
                )
    deployments = {
        component(d): d for d in by_kind(docs, "Deployment") if component(d) == "controller"
    }
    controller_ports = {
        p["name"]
        for p in deployments["controller"]["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    for service in by_kind(docs, "Service"):
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in controller_ports, service["metadata"]["name"]
    (headless,) = [s for s in by_kind(docs, "Service") if s["spec"].get("clusterIP") == "None"]
    grpc = next(p["port"] for p in headless["spec"]["ports"] if p["name"] == "grpc")
    for workload, spec in pods(docs):
        if component(workload) == "executor":
            target = next(a for a in spec["containers"][0]["args"] if a.startswith("--controller="))
            assert target == f"--controller=dns:///{headless['metadata']['name']}.agents.svc:{grpc}"


def test_migrations_run_before_the_controllers_and_controllers_never_migrate(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    (job,) = by_kind(docs, "Job")
    assert job["metadata"]["annotations"][HOOK] == "pre-install,pre-upgrade"
    job_weight = int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    for doc in docs:
        hook = doc["metadata"].get("annotations", {}).get(HOOK)
        if doc["kind"] in {"Deployment", "Service", "ConfigMap"}:
            assert hook is None, doc["metadata"]["name"]
    # What the Job reads must exist before it: a chart-made database Secret is an earlier hook.
    secret_name = job["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"][
        "secretKeyRef"
    ]["name"]
    made = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == secret_name]
    if VALUES[name]["database"].get("url"):
        (secret,) = made
        assert "pre-install" in secret["metadata"]["annotations"][HOOK]
        assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < job_weight
    else:
        assert made == [], "an existing Secret is the operator's"


def test_executors_drain_within_their_grace(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    executors = [(w, s) for w, s in pods(docs) if component(w) == "executor"]
    assert executors
    for _, spec in executors:
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        drain = float(env["AGENT_REACH_EXECUTOR_DRAIN_GRACE"])
        assert spec["terminationGracePeriodSeconds"] > drain


def test_executors_are_ready_once_registered_and_live_while_they_serve_metrics(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    executors = [spec for w, spec in pods(docs) if component(w) == "executor"]
    assert executors
    for spec in executors:
        (container,) = spec["containers"]
        ready = container["readinessProbe"]
        # What the executor serves (`agent_reach_executor.probes`), on its metrics listener.
        assert ready["httpGet"] == {"path": READYZ, "port": "metrics"}
        assert ready["periodSeconds"] <= 10
        assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        env = {e["name"]: e.get("value") for e in container["env"]}
        (metrics,) = [p for p in container["ports"] if p["name"] == "metrics"]
        assert env["AGENT_REACH_EXECUTOR_METRICS"] == f"0.0.0.0:{metrics['containerPort']}"


def test_only_controllers_and_the_migration_get_the_database(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    for workload, spec in pods(docs):
        names = {e["name"] for c in spec["containers"] for e in c.get("env", ())}
        has_db = "AGENT_REACH_CONTROLLER_DATABASE_URL" in names
        assert has_db == (component(workload) in {"controller", "migrate"}), workload["metadata"][
            "name"
        ]


def test_every_pod_is_locked_down(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    for workload, spec in pods(docs):
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, workload["metadata"]["name"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]


def test_network_policies_keep_executors_off_the_database() -> None:
    docs = render(VALUES["production"])
    policies = {d["metadata"]["name"]: d["spec"] for d in by_kind(docs, "NetworkPolicy")}
    executor = policies["reach-agent-reach-executor"]
    blocks = [
        peer["ipBlock"]
        for rule in executor["egress"]
        for peer in rule.get("to", ())
        if "ipBlock" in peer
    ]
    v4 = next(b for b in blocks if b["cidr"] == "0.0.0.0/0")
    assert v4["except"] == VALUES["production"]["networkPolicy"]["database"]["cidrs"]
    controller = policies["reach-agent-reach-controller"]
    to_database = [
        r for r in controller["egress"] if {p["port"] for p in r["ports"]} == {5432, 6379}
    ]
    assert to_database[0]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/24"}}]


def test_the_catalogue_and_policy_in_values_load_in_the_controller(tmp_path: Path) -> None:
    docs = render(VALUES["production"])
    maps = {d["metadata"]["name"]: d["data"] for d in by_kind(docs, "ConfigMap")}
    tools_file = tmp_path / "tools.yaml"
    tools_file.write_text(maps["reach-agent-reach-tools"]["tools.yaml"])
    catalogue = ToolCatalog.from_yaml_files([tools_file])
    assert set(catalogue) == {"weather.forecast", "refunds.issue"}
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(maps["reach-agent-reach-policy"]["policy.yaml"])
    assert policy.load(policy_file).allows(["approver"], policy.Action.APPROVE, "refunds.issue")
    secrets = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret")}
    tokens = yaml.safe_load(
        secrets["reach-agent-reach-executor-tokens"]["stringData"]["tokens.yaml"]
    )
    assert [t["name"] for t in tokens["tokens"]] == ["general", "payments"]


def test_a_changed_catalogue_rolls_the_controllers() -> None:
    def checksum(values: dict[str, Any]) -> str:
        (controller,) = [
            d for d in by_kind(render(values), "Deployment") if component(d) == "controller"
        ]
        value: str = controller["spec"]["template"]["metadata"]["annotations"]["checksum/tools"]
        return value

    changed = copy.deepcopy(VALUES["production"])
    changed["tools"]["catalogue"]["tools"][0]["description"] = "Another description."
    assert checksum(changed) != checksum(VALUES["production"])


def test_pools_are_deployments_of_their_own() -> None:
    docs = render(VALUES["production"])
    executors = {
        d["metadata"]["labels"]["agent-reach/pool"]: d
        for d in by_kind(docs, "Deployment")
        if component(d) == "executor"
    }
    assert set(executors) == {"general", "payments"}
    payments = executors["payments"]["spec"]["template"]["spec"]
    assert payments["containers"][0]["image"] == "registry.example.com/agent-reach-payments:0.2.0-1"
    assert payments["containers"][0]["envFrom"] == [{"secretRef": {"name": "payments-connector"}}]
    assert payments["terminationGracePeriodSeconds"] > 120
    general = executors["general"]["spec"]
    assert general["replicas"] == 4
    assert "--slots=32" in general["template"]["spec"]["containers"][0]["args"]
    assert {p["metadata"]["name"] for p in by_kind(docs, "PodDisruptionBudget")} >= {
        "reach-agent-reach-executor-general",
        "reach-agent-reach-executor-payments",
        "reach-agent-reach-controller",
    }
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == 3
    (controller,) = [d for d in by_kind(docs, "Deployment") if component(d) == "controller"]
    assert "replicas" not in controller["spec"], "the HPA owns the replica count"


# Objects the README describes as one value (not key by key).
WHOLE = {
    "requests",
    "limits",
    "catalogue",
    "matrix",
    "issuerRef",
    "podSecurityContext",
    "securityContext",
}


def _value_keys(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        if isinstance(value, dict) and value and key not in WHOLE:
            yield from _value_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_the_readme_describes_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`")
        for line in readme.splitlines()
        if line.startswith("| `")
    }
    keys = set(_value_keys(yaml.safe_load((CHART / "values.yaml").read_text())))
    assert keys - rows == set(), "values without a README row"
    assert rows - keys == set(), "README rows for values that do not exist"


def test_keda_scales_each_pool_on_what_the_rules_and_the_controller_define() -> None:
    docs = render(VALUES["keda"])
    scaled = {d["spec"]["scaleTargetRef"]["name"]: d["spec"] for d in by_kind(docs, "ScaledObject")}
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    assert set(scaled) == {"reach-agent-reach-executor-general", "reach-agent-reach-executor-batch"}
    for name in scaled:
        assert "replicas" not in deployments[name]["spec"], "KEDA owns the replica count"
    general = scaled["reach-agent-reach-executor-general"]
    assert general["minReplicaCount"] == 0  # from zero
    (trigger,) = general["triggers"]
    assert trigger["type"] == "prometheus"
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "autoscaling.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"]}
    rule = trigger["metadata"]["query"].split("(", 1)[1].split("{", 1)[0]
    assert rule in recorded
    assert 'pool="general"' in trigger["metadata"]["query"]
    (api_trigger,) = scaled["reach-agent-reach-executor-batch"]["triggers"]
    assert api_trigger["type"] == "metrics-api"
    url = api_trigger["metadata"]["url"]
    (service,) = [
        s
        for s in by_kind(docs, "Service")
        if s["metadata"]["name"] == "reach-agent-reach-controller"
    ]
    http = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    assert url == f"http://reach-agent-reach-controller.agents.svc:{http}/metrics/pools/batch"
    app = create_app(None)  # type: ignore[arg-type]
    assert app.url_path_for("pool_demand", pool="batch") == "/metrics/pools/batch"
    answer = PoolDemand(
        pool="batch", queued=1, running=0, oldest_ready_age_seconds=0.0, slots_per_executor=None
    ).to_json()
    assert api_trigger["metadata"]["valueLocation"] in answer


def test_controllers_stop_within_their_grace() -> None:
    docs = render(VALUES["production"])
    (controller,) = [d for d in by_kind(docs, "Deployment") if component(d) == "controller"]
    spec = controller["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    delay = float(env["AGENT_REACH_CONTROLLER_SHUTDOWN_DELAY"])
    # Not ready for the delay, then up to 5 s for HTTP requests and 5 s for gRPC calls.
    assert spec["terminationGracePeriodSeconds"] > delay + 10
    short = copy.deepcopy(VALUES["minimal"])
    short["controller"] = {"shutdownDelaySeconds": 25, "terminationGracePeriodSeconds": 30}
    with pytest.raises(helm.HelmError, match="terminationGracePeriodSeconds must exceed"):
        render(short)


def test_the_controllers_environment_is_a_value_the_controller_accepts() -> None:
    def controller_env(values: dict[str, Any]) -> dict[str, Any]:
        (controller,) = [
            d for d in by_kind(render(values), "Deployment") if component(d) == "controller"
        ]
        container = controller["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert controller_env(VALUES["minimal"])["AGENT_REACH_CONTROLLER_ENVIRONMENT"] == "dev"
    prod = copy.deepcopy(VALUES["minimal"])
    prod["controller"] = {"environment": "prod"}
    assert controller_env(prod)["AGENT_REACH_CONTROLLER_ENVIRONMENT"] == "prod"
    prod["controller"] = {"environment": "staging"}
    with pytest.raises(helm.HelmError, match="environment"):
        render(prod)


def test_the_consoles_values_reach_the_controller_as_settings_it_accepts() -> None:
    from agent_reach_controller.settings import ControllerSettings

    def console_env(controller: dict[str, Any]) -> dict[str, str]:
        values = copy.deepcopy(VALUES["minimal"])
        values["controller"] = controller
        (deployment,) = [
            d for d in by_kind(render(values), "Deployment") if component(d) == "controller"
        ]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        return {
            e["name"]: e["value"]
            for e in container["env"]
            if "CONSOLE" in e["name"] or "JAEGER" in e["name"]
        }

    default = console_env({})
    assert default["AGENT_REACH_CONTROLLER_CONSOLE_SECURE_COOKIE"] == "auto"
    assert "AGENT_REACH_CONTROLLER_JAEGER_URL" not in default
    behind_tls = console_env(
        {
            "console": {"secureCookie": "always", "sessionSeconds": 900},
            "jaegerUrl": "https://jaeger.example/trace/{trace_id}",
        }
    )
    prefix = "AGENT_REACH_CONTROLLER_"
    fields: dict[str, Any] = {k.removeprefix(prefix).lower(): v for k, v in behind_tls.items()}
    settings = ControllerSettings(**fields)
    assert (settings.console, settings.console_secure_cookie) == (True, "always")
    assert settings.console_session_seconds == 900
    assert settings.jaeger_url == "https://jaeger.example/trace/{trace_id}"
    for wrong in ({"console": {"secureCookie": "sometimes"}}, {"jaegerUrl": "https://j/"}):
        with pytest.raises(helm.HelmError):
            console_env(wrong)


def test_prometheus_finds_every_replica_and_gets_the_rules_the_repository_tests() -> None:
    docs = render(VALUES["production"])
    (monitor,) = by_kind(docs, "ServiceMonitor")
    (service,) = [
        s
        for s in by_kind(docs, "Service")
        if s["metadata"]["name"] == "reach-agent-reach-controller"
    ]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    (pod_monitor,) = by_kind(docs, "PodMonitor")
    executors = [w for w, _ in pods(docs) if component(w) == "executor"]
    for executor in executors:
        labels = executor["spec"]["template"]["metadata"]["labels"]
        assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = executor["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in ports}
    (rule,) = by_kind(docs, "PrometheusRule")
    shipped = [
        group
        for name in ("alerts.yml", "autoscaling.yml")
        for group in yaml.safe_load((ROOT / "deploy" / "prometheus" / name).read_text())["groups"]
    ]
    assert rule["spec"]["groups"] == shipped
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
