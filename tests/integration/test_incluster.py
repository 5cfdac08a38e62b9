"""kai-ray as users run it: the image built here, the chart of this checkout installed by
`helm install` into the plane with the real kubelet node, the scheduler and the two webhook
replicas running as pods under the chart's own ServiceAccounts. Against that install, the seed
scenarios: 0.7 + 0.2 of one device (real containers), a gang of 5 on 4 free GPUs binds nothing,
build preempts train in a limited queue (real containers); then `helm upgrade` keeps the webhook
working and `helm uninstall` leaves nothing of kai-ray but its CRDs.

The tests run in file order and share one install (the module fixture); the last one uninstalls.
"""

from __future__ import annotations

import base64
import re
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.k8s.crds import crd_manifests
from kai_ray.testing import binaries, images
from kai_ray.testing.install import NAMESPACE, ChartInstall
from kai_ray.testing.kuberay import start_kuberay_operator
from kai_ray.testing.realnode import RealNode
from tests.integration.helpers import (
    create_queues,
    delete_queues,
    gang,
    install_chart_for_tests,
    pod,
    pod_phase,
    pool_nodes,
    queue,
    scheduled_condition,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.realnode, pytest.mark.timeout(900)]
REAL = {"kai-ray.io/real-node": "true"}
READY_WITHIN_S = 60.0


@pytest.fixture(scope="module")
def install(real_node: RealNode) -> Iterator[ChartInstall]:
    real_node.import_image(images.ensure("busybox"))
    chart = install_chart_for_tests(real_node)
    yield chart
    if chart.pods():  # a test failed before the uninstall test
        print(chart.logs("scheduler", tail=80))
        chart.uninstall()


@pytest.fixture
def ns(real_node: RealNode) -> Iterator[str]:
    core = client.CoreV1Api(real_node.plane.api_client())
    name = f"ic-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    real_node.plane.wait_service_account(name)
    yield name
    core.delete_namespace(name)


def _busybox_pod(name: str, queue_name: str, *, annotations: dict[str, str] | None = None,
                 gpus: int = 0, priority_class: str | None = None,
                 command: str = "sleep 3600") -> dict[str, Any]:
    """A pod that runs for real on the real node (the local busybox image: nothing is pulled)."""
    body = pod(name, queue_name, gpus=gpus, annotations=annotations, node_selector=REAL,
               priority_class=priority_class)
    container = body["spec"]["containers"][0]
    container.update(image=images.ensure("busybox").ref, imagePullPolicy="Never",
                     command=["sh", "-c", command])
    body["spec"]["terminationGracePeriodSeconds"] = 1
    return body


def test_scheduler_and_webhook_run_as_pods_under_the_charts_accounts(
        install: ChartInstall, real_node: RealNode) -> None:
    assert install.timings["ready_s"] <= READY_WITHIN_S, install.timings
    pods = {p.metadata.labels["app.kubernetes.io/component"]: [] for p in install.pods()}
    for p in install.pods():
        pods[p.metadata.labels["app.kubernetes.io/component"]].append(p)
    assert len(pods["scheduler"]) == 1 and len(pods["webhook"]) == 2, install.describe()
    for component, members in pods.items():
        for p in members:
            assert p.spec.service_account_name == f"kai-ray-{component}"
            assert p.spec.node_name == real_node.name
            assert p.spec.priority_class_name == "system-cluster-critical"
            assert all(cs.ready and cs.restart_count == 0 for cs in p.status.container_statuses)
    log = install.logs("scheduler")
    assert "scheduling core: native (Rust)" in log, log
    assert "became leader" in log, log
    # the chart's PodDisruptionBudgets cover both components
    policy = client.PolicyV1Api(install.api)
    budgets = {b.metadata.name: b for b in policy.list_namespaced_pod_disruption_budget(
        NAMESPACE).items}
    assert set(budgets) == {"kai-ray-scheduler", "kai-ray-webhook"}
    wait_for("the webhook budget allows one disruption", lambda: policy.
             read_namespaced_pod_disruption_budget("kai-ray-webhook", NAMESPACE)
             .status.disruptions_allowed == 1, timeout=30)


def test_fractions_of_one_device_run_for_real(install: ChartInstall, real_node: RealNode,
                                              ns: str) -> None:
    """0.7 + 0.2 share one device: both containers run and see the same GPU and their portion."""
    api = install.api
    core = client.CoreV1Api(api)
    leaf = f"frac-{ns[-6:]}"
    created = create_queues(api, queue(f"{leaf}-p"), queue(leaf, f"{leaf}-p"))
    try:
        env = "echo GPU=$NVIDIA_VISIBLE_DEVICES PORTION=$GPU_PORTION; sleep 3600"
        for name, fraction in (("big", "0.7"), ("small", "0.2")):
            core.create_namespaced_pod(ns, _busybox_pod(
                name, leaf, annotations={"gpu-fraction": fraction}, command=env))
        wait_for("both fractional pods Running", lambda: all(
            pod_phase(core, ns, n)[0] == "Running" for n in ("big", "small")), timeout=120,
            detail=lambda: install.logs("scheduler", tail=30))
        seen = {}
        for name in ("big", "small"):
            text = wait_for(f"{name}'s output", lambda n=name: core.read_namespaced_pod_log(n, ns))
            match = re.search(r"GPU=(\S+) PORTION=(\S+)", text)
            assert match, text
            seen[name] = match.groups()
        assert seen["big"][0] == seen["small"][0] and seen["big"][0].startswith("GPU-"), seen
        assert (seen["big"][1], seen["small"][1]) == ("0.70", "0.20"), seen
        # the scheduler's own log shows the cycle that bound them
        assert re.search(r"cycle \d+: .* [12] binds", install.logs("scheduler")), \
            install.logs("scheduler", tail=30)
    finally:
        for name in ("big", "small"):
            core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        delete_queues(api, created)


def test_a_gang_of_5_on_4_free_gpus_binds_nothing(install: ChartInstall, ns: str) -> None:
    api = install.api
    core = client.CoreV1Api(api)
    pool, nodes = pool_nodes(api, 1, gpus=4)  # a KWOK node: 4 GPUs nobody else may use
    leaf = f"gang-{ns[-6:]}"
    created = create_queues(api, queue(leaf))
    try:
        names = gang(api, ns, "train", leaf, size=5, gpus=1,
                     node_selector={"kai-ray.io/pool": pool})
        cond = wait_for("an Unschedulable condition on the gang's pods",
                        lambda: scheduled_condition(core, ns, names[0]), timeout=60,
                        detail=lambda: install.logs("scheduler", tail=30))
        assert cond.status == "False" and cond.reason == "Unschedulable", cond
        assert "5" in cond.message, cond.message
        assert all(pod_phase(core, ns, n)[1] is None for n in names)
    finally:
        for name in nodes:
            core.delete_node(name)
        delete_queues(api, created)


def test_build_preempts_train_in_a_limited_queue(install: ChartInstall, ns: str) -> None:
    """On the real node: the train pod's container runs, then is stopped for the build pod."""
    api = install.api
    core = client.CoreV1Api(api)
    parent, leaf = f"lp-{ns[-6:]}", f"limited-{ns[-6:]}"
    created = create_queues(api, queue(parent),
                            queue(leaf, parent, gpu_quota=1, gpu_limit=1, gpu_weight=1))
    try:
        core.create_namespaced_pod(ns, _busybox_pod("train-pod", leaf, gpus=1,
                                                    priority_class="train"))
        wait_for("train pod Running", lambda: pod_phase(core, ns, "train-pod")[0] == "Running",
                 timeout=90, detail=lambda: install.logs("scheduler", tail=30))
        core.create_namespaced_pod(ns, _busybox_pod("build-pod", leaf, gpus=1,
                                                    priority_class="build"))
        wait_for("build pod Running", lambda: pod_phase(core, ns, "build-pod")[0] == "Running",
                 timeout=90, detail=lambda: install.logs("scheduler", tail=30))
        # the train pod's real container stops, then the kubelet lets the pod go
        wait_for("the train pod preempted and gone", lambda: "train-pod" not in {
            p.metadata.name for p in core.list_namespaced_pod(ns).items}, timeout=60)
        wait_for("the Preempted event", lambda: any(
            e.reason == "Preempted" for e in core.list_namespaced_event(ns).items), timeout=15)
    finally:
        delete_queues(api, created)


class _InstallLogs:
    """The in-cluster scheduler's log where the KubeRay tests read a host process's."""

    def __init__(self, install: ChartInstall) -> None:
        self.install = install

    def log_tail(self, lines: int = 40) -> str:
        return self.install.logs("scheduler", tail=min(lines, 5000))


def test_a_preempted_rayjob_is_suspended_and_resumed_by_the_pod(
        install: ChartInstall, real_node: RealNode, ns: str) -> None:
    """The KubeRay suite's RayJob test (real KubeRay operator; the Ray pods on KWOK nodes of the
    same plane), with the scheduler in the cluster under the chart's RBAC: suspending a RayJob
    needs `patch` on rayjobs, following it the RayCluster watch."""
    from tests.integration import test_kuberay_rayjob as rayjob

    start_kuberay_operator(real_node.plane)  # the plane's one operator, started if need be
    rayjob.test_preempted_sidecar_rayjob_is_suspended_and_resumes(
        real_node.plane, ns, _InstallLogs(install))
    log = install.logs("scheduler", tail=5000)
    assert "refused (403" not in log, log


def _tls_secret(install: ChartInstall) -> dict[str, str]:
    secret = client.CoreV1Api(install.api).read_namespaced_secret("kai-ray-webhook-tls",
                                                                  NAMESPACE)
    return dict(secret.data)


def _admission_works(install: ChartInstall, ns: str, leaf: str) -> None:
    """A bad gpu-fraction is refused by the webhook (naming the field); a good pod is admitted."""
    core = client.CoreV1Api(install.api)
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(ns, _busybox_pod(f"bad-{uuid.uuid4().hex[:4]}", leaf,
                                                    annotations={"gpu-fraction": "1.5"}))
    assert refused.value.status in (400, 403, 422) and "gpu-fraction" in refused.value.body
    name = f"ok-{uuid.uuid4().hex[:4]}"
    core.create_namespaced_pod(ns, _busybox_pod(name, leaf, command="sleep 1"))
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_helm_upgrade_keeps_the_webhook_working(install: ChartInstall, ns: str) -> None:
    api = install.api
    leaf = f"up-{ns[-6:]}"
    created = create_queues(api, queue(leaf))
    try:
        _admission_works(install, ns, leaf)
        before = _tls_secret(install)
        old_pods = {p.metadata.name for p in install.pods()}
        install.upgrade("--set", "logLevel=debug")
        assert _tls_secret(install) == before, "the upgrade changed the webhook's certificate"
        new_pods = {p.metadata.name for p in install.pods()}
        assert not new_pods & old_pods, "the pods did not roll with the new arguments"
        _admission_works(install, ns, leaf)
        # the webhook configurations trust the kept CA
        adm = client.AdmissionregistrationV1Api(api)
        ca = base64.b64decode(before["ca.crt"]) if "ca.crt" in before else None
        bundle = adm.read_validating_webhook_configuration(
            "kai-ray-admission").webhooks[0].client_config.ca_bundle
        if ca is not None:
            assert base64.b64decode(bundle) == ca
        wait_for("debug lines in the new scheduler's log",
                 lambda: "nothing to do" in install.logs("scheduler", tail=50), timeout=30)
    finally:
        delete_queues(api, created)


def _leftovers(install: ChartInstall) -> list[str]:
    """Every object of every listable kind that names kai-ray or lives in its namespaces, but
    the CRDs (Helm never deletes crds/) and the release namespace itself (created by
    --create-namespace, which Helm never deletes)."""
    kubectl = str(binaries.require("kubectl")["kubectl"])
    kinds = subprocess.run(
        [kubectl, "--kubeconfig", str(install.kubeconfig), "api-resources",
         "--verbs=list", "-o", "name"], capture_output=True, text=True, check=True,
        timeout=60).stdout.split()
    crds = {m["metadata"]["name"] for m in crd_manifests()}
    skip = {"events", "events.events.k8s.io", "componentstatuses"}
    found = []
    for kind in kinds:
        if kind in skip:
            continue
        out = subprocess.run(
            [kubectl, "--kubeconfig", str(install.kubeconfig), "get", kind, "-A",
             "-o", "custom-columns=NS:.metadata.namespace,NAME:.metadata.name", "--no-headers"],
            capture_output=True, text=True, timeout=60, check=False)
        for line in out.stdout.splitlines():
            namespace, name = line.split()[:2]
            where = f"{kind} {namespace}/{name}" if namespace != "<none>" else f"{kind} {name}"
            if kind == "customresourcedefinitions.apiextensions.k8s.io" and name in crds:
                continue
            if kind == "namespaces" and name == NAMESPACE:
                continue
            if namespace == NAMESPACE and (
                    (kind == "serviceaccounts" and name == "default")
                    or (kind == "configmaps" and name == "kube-root-ca.crt")):
                continue
            if namespace in (NAMESPACE, "kai-resource-reservation") or (
                    "kai-ray" in name or name in ("default-queue", "default-parent-queue",
                                                  "kai-resource-reservation")):
                found.append(where)
    return found


def test_helm_uninstall_leaves_only_the_crds(install: ChartInstall) -> None:
    install.uninstall()
    # namespaces (the reservation one) take a moment to empty and go
    wait_for("nothing of kai-ray left but its CRDs", lambda: not _leftovers(install),
             timeout=90, interval=2, detail=lambda: "\n".join(_leftovers(install)))
