"""The Helm chart, rendered by the real helm binary (tools/cluster/build.sh builds it): lint, the
schema rejecting typos, the CRDs identical to the package's, least-privilege RBAC, and values
reaching the objects they configure."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from kai_ray.controller.main import load_config
from kai_ray.k8s import config_file
from kai_ray.k8s.crds import CRD_FILES
from kai_ray.testing import binaries

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "kai-ray"


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        return str(binaries.require("helm")["helm"])
    except binaries.BinariesMissing as e:
        pytest.skip(f"helm not built: {e}")


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


def render(helm: str, *sets: str, namespace: str = "kai-ray") -> list[dict[str, Any]]:
    args = ["template", "kai-ray", str(CHART), "-n", namespace]
    for s in sets:
        args += ["--set", s]
    docs = yaml.safe_load_all(run_helm(helm, *args).stdout)
    return [d for d in docs if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_lint_strict_is_clean(helm: str) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


def test_template_renders_every_component(helm: str) -> None:
    docs = render(helm)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "Role", "RoleBinding", "ConfigMap", "Secret", "PriorityClass", "Queue",
            "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
            "Job", "Namespace"} <= kinds
    assert set(by_kind(docs, "Deployment")) == {"kai-ray-scheduler", "kai-ray-webhook"}


@pytest.mark.parametrize("typo,key", [("scheduler.replica=2", "replica"),
                                      ("webhok.enabled=false", "webhok"),
                                      ("gpuSharing.enable=true", "enable"),
                                      ("metrics.service.enable=false", "enable")])
def test_a_typo_in_values_is_a_schema_error(helm: str, typo: str, key: str) -> None:
    out = run_helm(helm, "template", "kai-ray", str(CHART), "--set", typo, check=False)
    assert out.returncode != 0
    assert f"additional properties '{key}' not allowed" in out.stderr, out.stderr


@pytest.mark.parametrize("bad,field", [("scheduler.placement.gpu=pack", "/scheduler/placement/gpu"),
                                       ("webhook.failurePolicy=Never", "/webhook/failurePolicy"),
                                       ("scheduler.cyclePeriodSeconds=0",
                                        "/scheduler/cyclePeriodSeconds"),
                                       ("scheduler.clientConnection.qps=0",
                                        "/scheduler/clientConnection/qps"),
                                       ("scheduler.clientConnection.burst=0",
                                        "/scheduler/clientConnection/burst")])
def test_a_wrong_value_names_its_field(helm: str, bad: str, field: str) -> None:
    out = run_helm(helm, "template", "kai-ray", str(CHART), "--set", bad, check=False)
    assert out.returncode != 0 and field in out.stderr, out.stderr


def test_several_replicas_need_leader_election(helm: str) -> None:
    out = run_helm(helm, "template", "kai-ray", str(CHART), "--set", "scheduler.replicas=2",
                   "--set", "scheduler.leaderElection=false", check=False)
    assert out.returncode != 0 and "leaderElection" in out.stderr
    docs = render(helm, "scheduler.replicas=3")
    dep = by_kind(docs, "Deployment")["kai-ray-scheduler"]
    assert dep["spec"]["replicas"] == 3
    assert "--leader-election=on" in dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_chart_crds_are_the_package_crds() -> None:
    """scripts/sync-chart-crds copies them; this fails when someone forgets to."""
    chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert chart == sorted(CRD_FILES)
    for name in CRD_FILES:
        package = (ROOT / "kai_ray" / "k8s" / "crds" / name).read_text()
        assert (CHART / "crds" / name).read_text() == package, \
            f"charts/kai-ray/crds/{name} differs: run scripts/sync-chart-crds"


def test_rbac_has_no_wildcards_and_no_secrets(helm: str) -> None:
    docs = render(helm)
    roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            where = f"{role['kind']} {role['metadata']['name']}"
            for key in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule.get(key, []), f"{where}: wildcard in {key}"
            assert "secrets" not in rule["resources"], f"{where} grants Secrets"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), where


def _grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource[/name]) -> verbs of a rendered role."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in rule.get("resourceNames") or [""]:
                    key = (group, f"{resource}/{name}" if name else resource)
                    out.setdefault(key, set()).update(rule["verbs"])
    return out


# every API call of `kai-ray run` (rbac-scheduler.yaml names the code of each), and no more
SCHEDULER_GRANTS = {
    ("", "nodes"): {"list", "watch"},
    ("scheduling.k8s.io", "priorityclasses"): {"list", "watch"},
    ("", "pods"): {"get", "list", "watch", "patch"},
    ("", "pods/binding"): {"create"}, ("", "pods/eviction"): {"create"},
    ("", "pods/status"): {"patch"},
    ("", "configmaps"): {"create", "update", "delete"},
    ("", "events"): {"create", "patch"},
    ("", "namespaces"): {"get"},
    ("scheduling.run.ai", "podgroups"): {"get", "list", "watch", "create", "update", "patch"},
    ("scheduling.run.ai", "podgroups/status"): {"patch"},
    ("scheduling.run.ai", "queues/status"): {"patch"},
    ("scheduling.run.ai", "queues"): {"list", "watch"},
    ("apps", "replicasets"): {"get"}, ("apps", "deployments"): {"get"},
    ("apps", "statefulsets"): {"get"}, ("batch", "jobs"): {"get"},
    ("ray.io", "rayclusters"): {"get", "list", "watch"},
    ("ray.io", "rayjobs"): {"get", "patch"},
    ("ray.io", "rayservices"): {"get"},
}


def test_rbac_is_each_call_and_no_more(helm: str) -> None:
    docs = render(helm, "reservation.serviceAccountName=holder")
    roles = by_kind(docs, "ClusterRole")
    assert _grants(roles["kai-ray-scheduler"]) == SCHEDULER_GRANTS
    assert _grants(roles["kai-ray-webhook"]) == {
        ("scheduling.run.ai", "queues"): {"list", "watch"},
        ("", "namespaces"): {"get", "list", "watch"}}
    local = by_kind(docs, "Role")
    assert _grants(local["kai-ray-scheduler-lease"]) == {
        ("coordination.k8s.io", "leases"): {"create"},
        ("coordination.k8s.io", "leases/kai-ray-scheduler"): {"get", "update"}}
    assert _grants(local["kai-ray-scheduler-reservation"]) == {
        ("", "pods"): {"create", "delete"}, ("", "serviceaccounts/holder"): {"get"}}


def test_the_schedulers_writes_policy_names_its_account(helm: str) -> None:
    """What RBAC cannot narrow (pod patches, ConfigMaps in every namespace) a
    ValidatingAdmissionPolicy holds to the scheduler's own keys, for its account only."""
    docs = render(helm, namespace="sched")
    policy = by_kind(docs, "ValidatingAdmissionPolicy")["kai-ray-scheduler-writes"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConditions"] == [{
        "name": "the-scheduler",
        "expression": "request.userInfo.username == "
                      "'system:serviceaccount:sched:kai-ray-scheduler'"}]
    rules = {(r["resources"][0], tuple(r["operations"]))
             for r in policy["spec"]["matchConstraints"]["resourceRules"]}
    assert rules == {("pods", ("UPDATE",)), ("pods/binding", ("CREATE",)),
                     ("configmaps", ("CREATE", "UPDATE", "DELETE"))}
    binding = by_kind(docs, "ValidatingAdmissionPolicyBinding")["kai-ray-scheduler-writes"]
    assert binding["spec"] == {"policyName": "kai-ray-scheduler-writes",
                               "validationActions": ["Deny"]}
    from kai_ray.grouping import admission

    # the keys the binder writes into a pod's ConfigMap are the ones the policy lets through
    keys = set(admission.gpu_configmap_data(["GPU-0"], 0.5, 100))
    text = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert all(f"'{k}'" in text for k in keys), keys


def test_webhook_configurations_name_the_service_and_trust_the_secret_ca(helm: str) -> None:
    docs = render(helm)
    secret = by_kind(docs, "Secret")["kai-ray-webhook-tls"]
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(ca_pem)
    assert serving.issuer == ca.subject
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kai-ray-webhook.kai-ray.svc" in sans.get_values_for_type(x509.DNSName)
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        (config,) = by_kind(docs, kind).values()
        (hook,) = config["webhooks"]
        assert hook["clientConfig"]["service"]["name"] == "kai-ray-webhook"
        assert hook["clientConfig"]["service"]["namespace"] == "kai-ray"
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca_pem
        assert "kai-scheduler" in hook["matchConditions"][0]["expression"]
        assert hook["failurePolicy"] == "Fail"


def test_validation_sees_updates_except_the_schedulers_own(helm: str) -> None:
    docs = render(helm, namespace="sched")
    (validating,) = by_kind(docs, "ValidatingWebhookConfiguration").values()
    (mutating,) = by_kind(docs, "MutatingWebhookConfiguration").values()
    (hook,) = validating["webhooks"]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    from kai_ray.controller.webhook import UPDATE_CHANGES_ANNOTATIONS

    # the same condition as `kai-ray run --webhook` registers
    assert hook["matchConditions"][1] == {"name": "annotations-changed",
                                          "expression": UPDATE_CHANGES_ANNOTATIONS}
    assert hook["matchConditions"][2] == {
        "name": "not-an-exempt-update",
        "expression": "request.operation != 'UPDATE' || !(request.userInfo.username in "
                      "['system:serviceaccount:sched:kai-ray-scheduler'])"}
    assert "kai-ray-scheduler" in by_kind(docs, "ServiceAccount")
    assert mutating["webhooks"][0]["rules"][0]["operations"] == ["CREATE"]
    assert len(mutating["webhooks"][0]["matchConditions"]) == 1


def test_cert_manager_mode_uses_ca_injection(helm: str) -> None:
    docs = render(helm, "webhook.certificate.source=cert-manager")
    assert "kai-ray-webhook" in by_kind(docs, "Certificate")
    assert not by_kind(docs, "Secret")
    (config,) = by_kind(docs, "ValidatingWebhookConfiguration").values()
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        "kai-ray/kai-ray-webhook"
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]


def test_priority_classes_are_kais(helm: str) -> None:
    classes = by_kind(render(helm), "PriorityClass")
    assert {n: c["value"] for n, c in classes.items()} == {
        "train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
    assert not any(c["globalDefault"] for c in classes.values())
    assert not by_kind(render(helm, "priorityClasses.create=false"), "PriorityClass")


def test_scheduler_values_reach_kai_ray_run(helm: str, tmp_path: Path) -> None:
    docs = render(helm, "scheduler.placement.gpu=spread", "scheduler.cyclePeriodSeconds=3",
                  "scheduler.gpuPacking=lookahead",
                  "scheduler.maxConsolidationPreemptees=4", "metrics.port=9100",
                  "scheduler.clientConnection.qps=200")
    config = by_kind(docs, "ConfigMap")["kai-ray-scheduler"]["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(config)
    loop = load_config(str(path))  # the parser `kai-ray run --config` uses
    assert loop.period_s == 3
    assert loop.core.placement.gpu == "spread" and loop.core.placement.cpu == "binpack"
    assert loop.core.max_consolidation_preemptees == 4
    assert loop.core.gpu_packing == "lookahead"
    assert config_file.client_connection(str(path)) == config_file.ClientConnection(200, 100)
    args = by_kind(docs, "Deployment")["kai-ray-scheduler"]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert args[0] == "scheduler"
    assert "--metrics-port=9100" in args and "--lease-name=kai-ray-scheduler" in args
    assert "--lease-namespace=kai-ray" in args


def test_reservation_values_reach_the_binder_and_its_rbac(helm: str, tmp_path: Path) -> None:
    docs = render(helm, "reservation.image.repository=registry.example/kai/reservation",
                  "reservation.image.tag=v9", "reservation.timeoutSeconds=30",
                  "reservation.serviceAccountName=holder")
    path = tmp_path / "config.yaml"
    path.write_text(by_kind(docs, "ConfigMap")["kai-ray-scheduler"]["data"]["config.yaml"])
    binder = load_config(str(path)).binder
    assert binder.reservation_image == "registry.example/kai/reservation:v9"
    assert binder.reservation_timeout_s == 30
    assert binder.reservation_service_account == "holder"
    # the reservation pods' own account: get and patch pods in their namespace, nothing else
    sa = by_kind(docs, "ServiceAccount")["holder"]
    assert sa["metadata"]["namespace"] == "kai-resource-reservation"
    role = by_kind(docs, "Role")["kai-ray-reservation"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["patch"]}]
    binding = by_kind(docs, "RoleBinding")["kai-ray-reservation"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "holder",
                                    "namespace": "kai-resource-reservation"}]
    ns = by_kind(docs, "Namespace")["kai-resource-reservation"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # by default the image is the chart's own version of kai-ray's reservation image
    default = render(helm)
    path.write_text(by_kind(default, "ConfigMap")["kai-ray-scheduler"]["data"]["config.yaml"])
    assert load_config(str(path)).binder.reservation_image.startswith(
        "ghcr.io/kai-ray/reservation:")


def test_reservation_namespace_reaches_the_scheduler_and_its_objects(helm: str,
                                                                      tmp_path: Path) -> None:
    """reservation.namespace moves the namespace, the reservation pods' account and RBAC, and
    the scheduler's own grant there, and reaches the binder and the cache through the
    config (`kai-ray run` reads it: kai_ray.controller.main)."""
    docs = render(helm, "reservation.namespace=gpu-holders")
    path = tmp_path / "config.yaml"
    path.write_text(by_kind(docs, "ConfigMap")["kai-ray-scheduler"]["data"]["config.yaml"])
    assert load_config(str(path)).binder.reservation_namespace == "gpu-holders"
    assert "gpu-holders" in by_kind(docs, "Namespace")
    assert by_kind(docs, "ServiceAccount")["kai-ray-reservation"]["metadata"]["namespace"] == \
        "gpu-holders"
    for kind in ("Role", "RoleBinding"):
        for name in ("kai-ray-reservation", "kai-ray-scheduler-reservation"):
            assert by_kind(docs, kind)[name]["metadata"]["namespace"] == "gpu-holders"
    binding = by_kind(docs, "RoleBinding")["kai-ray-reservation"]
    assert binding["subjects"][0]["namespace"] == "gpu-holders"
    assert not [d for d in docs if "kai-resource-reservation" in yaml.safe_dump(d)]
    # the default is KAI's, as the code's
    default = render(helm)
    path.write_text(by_kind(default, "ConfigMap")["kai-ray-scheduler"]["data"]["config.yaml"])
    assert load_config(str(path)).binder.reservation_namespace == "kai-resource-reservation"


def test_gpu_sharing_value_reaches_the_webhook(helm: str) -> None:
    for value, flag in (("true", "--gpu-sharing=on"), ("false", "--gpu-sharing=off")):
        docs = render(helm, f"gpuSharing.enabled={value}")
        args = by_kind(docs, "Deployment")["kai-ray-webhook"]["spec"]["template"]["spec"][
            "containers"][0]["args"]
        assert flag in args


def test_webhook_can_be_turned_off(helm: str) -> None:
    docs = render(helm, "webhook.enabled=false")
    assert "kai-ray-webhook" not in by_kind(docs, "Deployment")
    assert not by_kind(docs, "ValidatingWebhookConfiguration")
    assert not by_kind(docs, "Secret")


def test_operator_is_not_a_python_package() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert (ROOT / "operator" / "Dockerfile").is_file()


def test_entrypoint_dispatches_to_kai_ray(tmp_path: Path) -> None:
    """The image's entry point maps scheduler/webhook/apply-crds to kai-ray commands."""
    fake = tmp_path / "kai-ray"
    fake.write_text("#!/bin/sh\necho \"kai-ray $*\"\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    for args, want in ((["scheduler", "--config=/c"], "kai-ray run --config=/c"),
                       (["webhook", "--port=9443"], "kai-ray webhook --port=9443"),
                       (["apply-crds"], "kai-ray apply-crds"),
                       (["queues", "-o", "json"], "kai-ray queues -o json"),
                       ([], "kai-ray run")):
        out = subprocess.run(["sh", str(ROOT / "operator" / "entrypoint.sh"), *args],
                             capture_output=True, text=True, env=env, check=True)
        assert out.stdout.strip() == want


def test_schema_knows_every_gpu_packing_policy() -> None:
    import json

    from kai_ray.core.packing import POLICIES

    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["scheduler"]["properties"]["gpuPacking"]["enum"]
    assert sorted(enum) == sorted(POLICIES)


def test_probes_use_the_health_endpoints_and_values_reach_the_config(helm: str,
                                                                     tmp_path: Path) -> None:
    docs = render(helm, "health.port=9091", "health.maxInformerSilenceSeconds=200",
                  "scheduler.clientConnection.watchTimeoutSeconds=90")
    container = by_kind(docs, "Deployment")["kai-ray-scheduler"]["spec"]["template"]["spec"][
        "containers"][0]
    assert "--health-port=9091" in container["args"]
    assert "--health-addr=0.0.0.0" in container["args"]
    assert {"name": "health", "containerPort": 9091} in container["ports"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    path = tmp_path / "config.yaml"
    path.write_text(by_kind(docs, "ConfigMap")["kai-ray-scheduler"]["data"]["config.yaml"])
    file = config_file.load(str(path))
    assert file.health().max_informer_silence_s == 200
    assert file.api_timeouts().watch_s == 90
    # a silence limit the watch length would always pass is refused by the config file
    bad = render(helm, "health.maxInformerSilenceSeconds=30")
    path.write_text(by_kind(bad, "ConfigMap")["kai-ray-scheduler"]["data"]["config.yaml"])
    with pytest.raises(SystemExit, match="maxInformerSilenceSeconds"):
        config_file.load(str(path)).health()
