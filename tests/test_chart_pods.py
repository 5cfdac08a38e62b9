"""What the chart gives its own pods and what `helm uninstall` removes, from `helm template`:
log level and priority class reach both Deployments, a PodDisruptionBudget each, two webhook
replicas spread over nodes, the scheduler's Lease and the default queues as ordinary (deletable)
objects. tests/integration/test_incluster.py installs the chart for real."""

from __future__ import annotations

import pytest

from kai_ray.testing import binaries
from tests.test_chart import CHART, by_kind, render, run_helm


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        return str(binaries.require("helm")["helm"])
    except binaries.BinariesMissing as e:
        pytest.skip(f"helm not built: {e}")


def _args(deployment: dict) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_log_level_and_priority_class_reach_both_deployments(helm: str) -> None:
    deployments = by_kind(render(helm, "logLevel=debug", "priorityClassName=my-critical"),
                          "Deployment")
    for name in ("kai-ray-scheduler", "kai-ray-webhook"):
        spec = deployments[name]["spec"]["template"]["spec"]
        assert "--log-level=debug" in _args(deployments[name]), name
        assert spec["priorityClassName"] == "my-critical", name
    default = by_kind(render(helm), "Deployment")["kai-ray-scheduler"]["spec"]["template"]
    assert default["spec"]["priorityClassName"] == "system-cluster-critical"
    assert "--log-level=info" in _args(by_kind(render(helm), "Deployment")["kai-ray-scheduler"])
    none = by_kind(render(helm, "priorityClassName="), "Deployment")["kai-ray-webhook"]
    assert "priorityClassName" not in none["spec"]["template"]["spec"]


def test_a_bad_log_level_is_a_schema_error(helm: str) -> None:
    out = run_helm(helm, "template", "kai-ray", str(CHART), "--set", "logLevel=loud",
                   check=False)
    assert out.returncode != 0 and "logLevel" in out.stderr, out.stderr


def test_two_webhook_replicas_spread_and_a_budget_per_component(helm: str) -> None:
    docs = render(helm)
    webhook = by_kind(docs, "Deployment")["kai-ray-webhook"]
    assert webhook["spec"]["replicas"] == 2
    anti = webhook["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    budgets = by_kind(docs, "PodDisruptionBudget")
    assert set(budgets) == {"kai-ray-scheduler", "kai-ray-webhook"}
    for name, budget in budgets.items():
        assert budget["spec"]["maxUnavailable"] == 1
        component = name.rsplit("-", 1)[1]
        assert budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == \
            component
    assert set(by_kind(render(helm, "webhook.enabled=false"), "PodDisruptionBudget")) == {
        "kai-ray-scheduler"}
    assert not by_kind(render(helm, "podDisruptionBudget.enabled=false"), "PodDisruptionBudget")
    # a user's affinity replaces the default spread
    custom = by_kind(render(helm, "webhook.affinity.nodeAffinity.x=1"), "Deployment")
    assert custom["kai-ray-webhook"]["spec"]["template"]["spec"]["affinity"] == {
        "nodeAffinity": {"x": 1}}


def test_uninstall_takes_the_lease_and_the_default_queues(helm: str) -> None:
    docs = render(helm)
    (lease,) = by_kind(docs, "Lease").values()
    assert lease["metadata"]["name"] == "kai-ray-scheduler"
    assert lease["metadata"]["namespace"] == "kai-ray"
    # the scheduler's --lease-name names the chart's Lease
    assert "--lease-name=kai-ray-scheduler" in _args(by_kind(docs, "Deployment")[
        "kai-ray-scheduler"])
    for queue in by_kind(docs, "Queue").values():
        annotations = queue["metadata"].get("annotations") or {}
        assert "helm.sh/hook" not in annotations and "helm.sh/resource-policy" not in annotations
    kept = by_kind(render(helm, "defaultQueues.keepOnUninstall=true"), "Queue")
    assert all(q["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
               for q in kept.values()) and len(kept) == 2
    namespace = by_kind(docs, "Namespace")["kai-resource-reservation"]
    assert "helm.sh/resource-policy" not in (namespace["metadata"].get("annotations") or {})
    assert not by_kind(render(helm, "scheduler.leaderElection=false"), "Lease")
