"""The Helm chart installed into a real control plane, then the controllers run out of cluster
with the chart's ServiceAccount tokens and RBAC: proof the RBAC is enough (they schedule) and
not wider than listed (`kubectl auth can-i`). Then `kai-ray explain` against the running
scheduler, and `kai-ray snapshot` + `kai-ray simulate` against the live decisions.

The module starts its own plane: the chart installs cluster-wide objects (PriorityClasses,
default queues, webhook configurations) that must not meet other tests' copies, and the
snapshot test needs a moment with no scheduler running. No chart pod runs (KWOK has no
kubelet and there is no image), which is why the controllers run here, as local processes,
with exactly the credentials the chart gives their pods.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kai_ray.testing import binaries
from kai_ray.testing.plane import ControlPlane
from kai_ray.testing.scheduler_process import KaiRayProcess
from tests.integration.chart_rbac import token_kubeconfig
from tests.integration.helpers import (
    PG,
    Q,
    create_queues,
    gang,
    pod,
    pod_phase,
    pool_nodes,
    queue,
    wait_for,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kai-ray"
NS = "kai-ray"  # release namespace
RELEASE = "kai-ray"
SCHEDULER_SA = "kai-ray-scheduler"
WEBHOOK_SA = "kai-ray-webhook"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _bins() -> dict[str, Path]:
    try:
        return binaries.require(*binaries.CONTROL_PLANE, "helm", "kubectl")
    except binaries.BinariesMissing as e:
        if os.environ.get("KAI_RAY_SKIP_BINARIES"):
            pytest.skip(f"binaries not built: {e}")
        pytest.fail(f"binaries missing; run tools/cluster/build.sh: {e}")


def helm(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    exe = str(_bins()["helm"])
    out = subprocess.run([exe, *args, "--kubeconfig", str(plane.kubeconfig)],
                         capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, f"helm {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
    return out


@pytest.fixture(scope="module")
def release(plane: ControlPlane) -> dict[str, Any]:
    out = helm(plane, "install", RELEASE, str(CHART), "-n", NS, "--create-namespace")
    manifest = helm(plane, "get", "manifest", RELEASE, "-n", NS).stdout
    return {"install": out.stdout,
            "manifest": [d for d in yaml.safe_load_all(manifest) if d]}


@pytest.fixture(scope="module")
def sa_kubeconfigs(plane: ControlPlane, release: dict[str, Any],
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tokens")
    return {sa: token_kubeconfig(plane, sa, NS, d / f"{sa}.kubeconfig")
            for sa in (SCHEDULER_SA, WEBHOOK_SA)}


@pytest.fixture(scope="module")
def no_webhook_configs(plane: ControlPlane, release: dict[str, Any]) -> None:
    """The chart's webhook configurations point at a Service whose pods cannot run here; with
    failurePolicy Fail they would (correctly) refuse every kai-scheduler pod. Remove them once
    the install has been checked."""
    adm = client.AdmissionregistrationV1Api(plane.api_client())
    adm.delete_validating_webhook_configuration("kai-ray-admission")
    adm.delete_mutating_webhook_configuration("kai-ray-admission")


@pytest.fixture(scope="module")
def scheduler(plane: ControlPlane, sa_kubeconfigs: dict[str, Path], no_webhook_configs: None,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[KaiRayProcess]:
    """`kai-ray run` as the chart's scheduler pod runs it: its args, its ConfigMap, its token."""
    work = tmp_path_factory.mktemp("scheduler")
    cm = client.CoreV1Api(plane.api_client()).read_namespaced_config_map(SCHEDULER_SA, NS)
    config = work / "config.yaml"
    config.write_text(cm.data["config.yaml"])
    proc = KaiRayProcess(sa_kubeconfigs[SCHEDULER_SA], work, extra_args=[
        "--config", str(config), "--leader-election", "on", "--lease-namespace", NS,
        "--lease-name", "kai-ray-scheduler"])
    proc.start()
    proc.wait_ready()
    yield proc
    proc.stop()
    assert "Forbidden" not in proc.log_tail(100000), proc.log_tail(200)


@pytest.fixture
def ns(plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = request.node.name.lower().replace("_", "-")[:36].strip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:5]}"  # the last 5 characters name test queues
    core = client.CoreV1Api(plane.api_client())
    core.create_namespace({"metadata": {"name": name}})
    plane.wait_service_account(name)
    yield name


def kai_ray(*args: str, kubeconfig: Path | None, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
    extra = ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
    out = subprocess.run([sys.executable, "-m", "kai_ray.cli", *args, *extra],
                         capture_output=True, text=True, env=ENV, timeout=120, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"kai-ray {' '.join(args)} ({out.returncode}):\n{out.stdout}\n"
                             f"{out.stderr}")
    return out


# ------------------------------------------------------------------------------ the install
def test_helm_install_creates_every_object(plane: ControlPlane, release: dict[str, Any]) -> None:
    api = plane.api_client()
    ext = client.ApiextensionsV1Api(api)
    crds = {c.metadata.name for c in ext.list_custom_resource_definition().items}
    assert {"queues.scheduling.run.ai", "podgroups.scheduling.run.ai",
            "bindrequests.scheduling.run.ai"} <= crds
    apps = client.AppsV1Api(api)
    deps = {d.metadata.name: d for d in apps.list_namespaced_deployment(NS).items}
    assert set(deps) == {"kai-ray-scheduler", "kai-ray-webhook"}
    assert deps["kai-ray-scheduler"].spec.template.spec.service_account_name == SCHEDULER_SA
    assert deps["kai-ray-webhook"].spec.template.spec.service_account_name == WEBHOOK_SA
    core = client.CoreV1Api(api)
    assert {SCHEDULER_SA, WEBHOOK_SA} <= {s.metadata.name for s in
                                          core.list_namespaced_service_account(NS).items}
    assert "kai-ray-webhook" in {s.metadata.name for s in core.list_namespaced_service(NS).items}
    core.read_namespace("kai-resource-reservation")
    rbac = client.RbacAuthorizationV1Api(api)
    cluster_roles = {r.metadata.name for r in rbac.list_cluster_role().items}
    assert {"kai-ray-scheduler", "kai-ray-webhook"} <= cluster_roles
    assert "kai-ray-scheduler-lease" in {r.metadata.name for r in
                                         rbac.list_namespaced_role(NS).items}
    sched = client.SchedulingV1Api(api)
    values = {c.metadata.name: c.value for c in sched.list_priority_class().items}
    assert {k: values.get(k) for k in ("train", "build-preemptible", "build", "inference")} == \
        {"train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
    adm = client.AdmissionregistrationV1Api(api)
    secret = core.read_namespaced_secret("kai-ray-webhook-tls", NS)
    for read in (adm.read_validating_webhook_configuration,
                 adm.read_mutating_webhook_configuration):
        hook = read("kai-ray-admission").webhooks[0]
        assert hook.client_config.service.name == "kai-ray-webhook"
        assert hook.client_config.service.namespace == NS
        assert hook.client_config.ca_bundle == secret.data["ca.crt"]
    custom = client.CustomObjectsApi(api)
    leaf = custom.get_cluster_custom_object(*Q, "default-queue")
    assert leaf["spec"]["parentQueue"] == "default-parent-queue"


def test_upgrade_keeps_the_webhook_certificate(plane: ControlPlane,
                                               release: dict[str, Any]) -> None:
    """helm upgrade re-renders the templates; the self-signed CA must survive it (lookup), or
    the configurations' caBundle would stop matching the running webhook's certificate. (The
    CRD hook is off here: its Job cannot run without a kubelet; test_apply_crds_* covers it.)"""
    core = client.CoreV1Api(plane.api_client())
    before = core.read_namespaced_secret("kai-ray-webhook-tls", NS).data
    helm(plane, "upgrade", RELEASE, str(CHART), "-n", NS, "--set", "crdUpgrade.enabled=false",
         "--set", "scheduler.cyclePeriodSeconds=2")
    after = core.read_namespaced_secret("kai-ray-webhook-tls", NS).data
    assert after == before
    adm = client.AdmissionregistrationV1Api(plane.api_client())
    hook = adm.read_validating_webhook_configuration("kai-ray-admission").webhooks[0]
    assert hook.client_config.ca_bundle == before["ca.crt"]
    cm = core.read_namespaced_config_map("kai-ray-scheduler", NS)
    assert "cyclePeriodSeconds: 2" in cm.data["config.yaml"]
    helm(plane, "upgrade", RELEASE, str(CHART), "-n", NS, "--set", "crdUpgrade.enabled=false")


def test_apply_crds_with_the_upgrade_hooks_rbac(plane: ControlPlane, release: dict[str, Any],
                                                tmp_path: Path) -> None:
    """The pre-upgrade hook's ServiceAccount and role (created here from the chart, as Helm
    would before an upgrade) can server-side apply the CRDs, and nothing else."""
    exe = str(_bins()["helm"])
    text = subprocess.run([exe, "template", RELEASE, str(CHART), "-n", NS, "--show-only",
                           "templates/crd-upgrade.yaml"], capture_output=True, text=True,
                          check=True).stdout
    docs = [d for d in yaml.safe_load_all(text) if d and d["kind"] != "Job"]
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    sa = "kai-ray-crd-upgrade"
    kubeconfig = token_kubeconfig(plane, sa, NS, tmp_path / "hook.kubeconfig")
    out = kai_ray("apply-crds", kubeconfig=kubeconfig)
    assert out.stdout.count("serverside-applied") == 3
    crd = client.ApiextensionsV1Api(plane.api_client()).read_custom_resource_definition(
        "queues.scheduling.run.ai")
    assert "kai-ray" in {m.manager for m in crd.metadata.managed_fields}
    denied = can_i(plane, kubeconfig, "create", "customresourcedefinitions")
    assert denied is False
    plane.kubectl("delete", "-f", "-", input=yaml.safe_dump_all(docs))


# ------------------------------------------------------------------------------ RBAC
def can_i(plane: ControlPlane, kubeconfig: Path, verb: str, resource: str,
          namespace: str | None = None) -> bool:
    """`kubectl auth can-i` as the kubeconfig's user. RESOURCE:SUB names a subresource,
    RESOURCE/NAME an object. Kinds the server does not serve (KubeRay's, when KubeRay is not
    installed) are asked with a SelfSubjectAccessReview, since kubectl answers 'no' for them
    without asking."""
    resource, _, sub = resource.partition(":")
    if resource.endswith(".ray.io"):
        api = client.AuthorizationV1Api(config.new_client_from_config(str(kubeconfig)))
        plural, _, group = resource.partition(".")
        review = api.create_self_subject_access_review({"spec": {"resourceAttributes": {
            "verb": verb, "group": group, "resource": plural, "namespace": namespace or ""}}})
        return bool(review.status.allowed)
    args = ["auth", "can-i", verb, resource, "--kubeconfig", str(kubeconfig)]
    if sub:
        args.append(f"--subresource={sub}")
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    out = subprocess.run([plane.kubectl_path(), *args], capture_output=True, text=True,
                         timeout=30, check=False)
    answer = out.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {out.stdout} {out.stderr}"
    return answer == "yes"


# (verb, resource, namespace or None for all namespaces, allowed): each call of the scheduler
# (rbac-scheduler.yaml names its caller), then what it must not do
SCHEDULER_CAN = [
    ("list", "nodes", None, True), ("watch", "nodes", None, True),
    ("watch", "priorityclasses.scheduling.k8s.io", None, True),
    ("watch", "pods", None, True), ("get", "pods", None, True), ("patch", "pods", None, True),
    ("create", "pods:binding", None, True), ("create", "pods:eviction", None, True),
    ("patch", "pods:status", None, True),
    ("create", "configmaps", "team-a", True), ("update", "configmaps", "team-a", True),
    ("delete", "configmaps", "team-a", True),  # a rolled-back pod's shared-GPU ConfigMap
    ("create", "events", None, True),
    ("patch", "events", None, True),  # the count of a repeated Event
    ("get", "namespaces", None, True),
    ("create", "podgroups.scheduling.run.ai", None, True),
    ("update", "podgroups.scheduling.run.ai", None, True),
    ("patch", "podgroups.scheduling.run.ai", None, True),
    ("patch", "podgroups.scheduling.run.ai:status", None, True),
    ("watch", "queues.scheduling.run.ai", None, True),
    ("patch", "queues.scheduling.run.ai:status", None, True),
    ("get", "replicasets.apps", None, True), ("get", "jobs.batch", None, True),
    ("get", "rayclusters.ray.io", None, True),
    ("list", "rayclusters.ray.io", None, True),  # the minReplicas watch
    ("watch", "rayclusters.ray.io", None, True),
    ("get", "rayjobs.ray.io", None, True),
    ("patch", "rayjobs.ray.io", None, True),  # suspend a preempted RayJob, resume it
    ("get", "rayservices.ray.io", None, True),
    ("create", "leases.coordination.k8s.io", NS, True),
    ("update", "leases.coordination.k8s.io/kai-ray-scheduler", NS, True),
    ("create", "pods", "kai-resource-reservation", True),
    ("delete", "pods", "kai-resource-reservation", True),
    ("get", "serviceaccounts/kai-ray-reservation", "kai-resource-reservation", True),
    # and not
    ("create", "pods", "team-a", False), ("delete", "pods", "team-a", False),
    ("update", "pods", None, False),
    ("get", "secrets", NS, False), ("list", "secrets", None, False),
    ("get", "configmaps", "team-a", False), ("list", "configmaps", None, False),
    ("delete", "events", None, False),
    ("get", "nodes", None, False),  # the cache lists; nothing reads one node
    ("get", "queues.scheduling.run.ai", None, False),
    ("update", "leases.coordination.k8s.io/other-lease", NS, False),
    ("create", "leases.coordination.k8s.io", "kube-system", False),
    ("create", "queues.scheduling.run.ai", None, False),
    ("delete", "podgroups.scheduling.run.ai", None, False),
    ("update", "nodes", None, False), ("create", "namespaces", None, False),
    ("update", "rayclusters.ray.io", None, False), ("patch", "rayclusters.ray.io", None, False),
    ("update", "rayjobs.ray.io", None, False), ("delete", "rayjobs.ray.io", None, False),
    ("list", "rayjobs.ray.io", None, False), ("patch", "rayservices.ray.io", None, False),
    ("get", "serviceaccounts/default", "kai-resource-reservation", False),
    ("create", "serviceaccounts", "kai-resource-reservation", False),
    ("create", "roles.rbac.authorization.k8s.io", "kai-resource-reservation", False),
    ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io", None, False),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", None, False),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None, False),
]
WEBHOOK_CAN = [
    ("list", "queues.scheduling.run.ai", None, True),
    ("watch", "queues.scheduling.run.ai", None, True),
    ("get", "namespaces", None, True), ("watch", "namespaces", None, True),
    ("get", "queues.scheduling.run.ai", None, False),
    ("get", "secrets", NS, False), ("list", "pods", None, False), ("create", "pods", NS, False),
    ("update", "queues.scheduling.run.ai", None, False),
    ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io", None, False),
    ("create", "events", None, False),
]


def test_service_accounts_can_and_cannot(plane: ControlPlane,
                                         sa_kubeconfigs: dict[str, Path]) -> None:
    wrong = []
    for sa, table in ((SCHEDULER_SA, SCHEDULER_CAN), (WEBHOOK_SA, WEBHOOK_CAN)):
        for verb, resource, namespace, allowed in table:
            if can_i(plane, sa_kubeconfigs[sa], verb, resource, namespace) != allowed:
                wrong.append(f"{sa}: {verb} {resource} in {namespace or 'all namespaces'}: "
                             f"expected {'yes' if allowed else 'no'}")
    assert not wrong, "\n".join(wrong)


def test_only_the_scheduler_writes_its_annotations_on_podgroups(
        plane: ControlPlane, sa_kubeconfigs: dict[str, Path], ns: str) -> None:
    """The chart's ValidatingAdmissionPolicy: anyone but the scheduler's ServiceAccount (here
    the plane's admin) may not set or change the bind intent or the scheduler's timestamps on
    a PodGroup; the scheduler may, and other edits pass."""
    admin = client.CustomObjectsApi(plane.api_client())
    sched = client.CustomObjectsApi(config.new_client_from_config(
        str(sa_kubeconfigs[SCHEDULER_SA])))

    def podgroup(name: str, annotations: dict[str, str]) -> dict[str, Any]:
        return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"queue": "default-queue", "minMember": 1}}

    forged = {"kai-ray.io/bind-intent": json.dumps({"p": {"node": "any"}})}
    with pytest.raises(ApiException) as info:
        admin.create_namespaced_custom_object(*PG[:2], ns, PG[2], podgroup("forged", forged))
    assert info.value.status == 403, info.value.body
    assert ("annotation kai-ray.io/bind-intent on a PodGroup is written only by the kai-ray "
            "scheduler") in info.value.body
    admin.create_namespaced_custom_object(*PG[:2], ns, PG[2], podgroup("plain", {"a": "b"}))
    for key, value in (("kai.scheduler/last-start-timestamp", "2999-01-01T00:00:00Z"),
                       ("kai-ray.io/bind-intent", "{}")):
        with pytest.raises(ApiException) as info:
            admin.patch_namespaced_custom_object(
                *PG[:2], ns, PG[2], "plain", {"metadata": {"annotations": {key: value}}})
        assert info.value.status == 403 and key in info.value.body, info.value.body
    # nor on a workload whose annotations the pod grouper reads
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "forger", "annotations": {"kai-ray.io/bind-intent": "{}"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "busybox"}]}}}}
    with pytest.raises(ApiException) as info:
        client.BatchV1Api(plane.api_client()).create_namespaced_job(ns, job)
    assert ("annotation kai-ray.io/bind-intent on a Job is written only by the kai-ray "
            "scheduler") in info.value.body, info.value.body
    # the scheduler writes them; others may then edit the PodGroup around them, or remove them
    sched.patch_namespaced_custom_object(*PG[:2], ns, PG[2], "plain", {"metadata": {
        "annotations": {"kai-ray.io/bind-intent": "{}"}}})
    admin.patch_namespaced_custom_object(*PG[:2], ns, PG[2], "plain", {"metadata": {
        "annotations": {"note": "x"}}})
    admin.patch_namespaced_custom_object(*PG[:2], ns, PG[2], "plain", {"metadata": {
        "annotations": {"kai-ray.io/bind-intent": None}}})


def test_the_schedulers_pod_and_configmap_writes_are_held_to_its_own(
        plane: ControlPlane, release: dict[str, Any], sa_kubeconfigs: dict[str, Path],
        ns: str) -> None:
    """RBAC lets the scheduler patch any pod and write ConfigMaps in any namespace (their
    names are the users'); the chart's policy (rbac-scheduler-writes.yaml) holds those writes
    to what its code writes: the grouper's and binder's own pod labels and annotations, and a
    fractional pod's GPU ConfigMap. The account's token cannot change an image, a Service's
    selector label, or any other ConfigMap."""
    core = client.CoreV1Api(plane.api_client())
    sched = client.CoreV1Api(config.new_client_from_config(str(sa_kubeconfigs[SCHEDULER_SA])))
    made = core.create_namespaced_pod(ns, {
        "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"note": "a"}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox"}]}})

    def refused(call: Any, why: str) -> None:
        with pytest.raises(ApiException) as info:
            call()
        assert info.value.status == 403 and why in info.value.body, info.value.body

    # what the pod grouper and the binder write: allowed, set and removed
    sched.patch_namespaced_pod("web", ns, {"metadata": {
        "annotations": {"pod-group-name": "pg-web", "runai/shared-gpu-configmap": "web-shared-gpu"},
        "labels": {"kai.scheduler/subgroup-name": "s", "runai-gpu-group": "g",
                   "runai-gpu-group/g2": "g2"}}})
    sched.patch_namespaced_pod("web", ns, {"metadata": {"labels": {"runai-gpu-group": None}}})
    for patch, why in (
            ({"spec": {"containers": [{"name": "c", "image": "evil"}]}}, "pod's spec"),
            ({"metadata": {"labels": {"app": "other"}}}, "labels of a pod"),
            ({"metadata": {"labels": {"app": None}}}, "labels of a pod"),
            ({"metadata": {"labels": {"extra": "x"}}}, "labels of a pod"),
            ({"metadata": {"annotations": {"note": "b"}}}, "annotations of a pod"),
            ({"metadata": {"finalizers": ["example.com/hold"]}}, "owners or finalizers")):
        refused(lambda p=patch: sched.patch_namespaced_pod("web", ns, p), why)
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": made.metadata.uid}]
    gpu_env = {"NVIDIA_VISIBLE_DEVICES": "GPU-1", "GPU_PORTION": "0.50",
               "RUNAI_NUM_OF_GPUS": "0.50"}

    def cm(name: str, data: dict[str, str], owners: list[Any] | None = None) -> dict[str, Any]:
        return {"metadata": {"name": name, "ownerReferences": owners}, "data": data}

    sched.create_namespaced_config_map(ns, cm("web-shared-gpu-0", gpu_env, owner))
    sched.replace_namespaced_config_map("web-shared-gpu-0", ns, cm("web-shared-gpu-0", {
        **gpu_env, "KAI_RAY_GPU_MEMORY_LIMIT_MIB": "2000"}, owner))
    sched.delete_namespaced_config_map("web-shared-gpu-0", ns)
    refused(lambda: sched.create_namespaced_config_map(ns, cm("settings", gpu_env, owner)),
            "ConfigMaps of fractional pods")
    refused(lambda: sched.create_namespaced_config_map(ns, cm(
        "web-shared-gpu-i1", {"PATH": "/x"}, owner)), "only the GPU keys")
    refused(lambda: sched.create_namespaced_config_map(ns, cm("web-shared-gpu-1", gpu_env)),
            "owned by its pod")
    core.create_namespaced_config_map(ns, cm("user-shared-gpu-0", {"a": "b"}))  # not a pod's
    refused(lambda: sched.replace_namespaced_config_map("user-shared-gpu-0", ns, cm(
        "user-shared-gpu-0", gpu_env, owner)), "only ConfigMaps owned by a pod")
    refused(lambda: sched.delete_namespaced_config_map("user-shared-gpu-0", ns),
            "only ConfigMaps owned by a pod")
    # a Binding may name the pod's PodGroup (a bare pod is bound so), nothing else
    node = "any-node"  # a Binding does not check that its node exists

    def binding(annotations: dict[str, str]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": "web", "annotations": annotations},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}

    refused(lambda: sched.create_namespaced_pod_binding(
        "web", ns, binding({"pod-group-name": "pg-web", "note": "b"})),
        "only the pod-group-name annotation")
    sched.create_namespaced_pod_binding("web", ns, binding({"pod-group-name": "pg-web"}),
                                        _preload_content=False)
    bound = core.read_namespaced_pod("web", ns)
    assert bound.spec.node_name == node and bound.metadata.annotations["note"] == "a"
    # anyone else is not concerned
    core.patch_namespaced_pod("web", ns, {"metadata": {"labels": {"app": "other"}}})


# ------------------------------------------------------------------------------ scheduling
def test_scheduler_with_the_charts_rbac_schedules(plane: ControlPlane, scheduler: KaiRayProcess,
                                                  ns: str) -> None:
    """A pod-group gang, a Deployment's pod (owner walk through ReplicaSet and Deployment), and
    two fractional pods sharing one device (reservation pod, GPU ConfigMaps) are all bound by
    the scheduler running on the scheduler ServiceAccount's token."""
    api = plane.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 2, gpus=4)
    sel = {"kai-ray.io/pool": pool}
    names = gang(api, ns, "gang", "default-queue", 3, gpus=2, node_selector=sel)
    apps = client.AppsV1Api(api)
    template = pod("ignored", "default-queue", gpus=1, node_selector=sel)
    apps.create_namespaced_deployment(ns, {
        # a Deployment defaults to inference (non-preemptible), which default-queue's quota of
        # 0 refuses (NonPreemptibleOverQuota); the owner label makes it train
        "metadata": {"name": "serve", "labels": {"priorityClassName": "train"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "serve"}},
                 "template": {"metadata": {"labels": {"app": "serve",
                                                      "kai.scheduler/queue": "default-queue"}},
                              "spec": template["spec"]}}})
    for i in range(2):
        core.create_namespaced_pod(ns, pod(f"half-{i}", "default-queue", node_selector=sel,
                                           annotations={"gpu-fraction": "0.5"}))
    wait_for("gang, Deployment pod and fractional pods bound", lambda: all(
        p.spec.node_name for p in core.list_namespaced_pod(ns).items) and len(
        core.list_namespaced_pod(ns).items) == 6, timeout=60, detail=scheduler.log_tail)
    assert {pod_phase(core, ns, n)[1] for n in names} <= {f"{pool}-0", f"{pool}-1"}
    halves = [core.read_namespaced_pod(f"half-{i}", ns) for i in range(2)]
    groups = {p.metadata.labels.get("runai-gpu-group") for p in halves}
    assert len(groups) == 1 and None not in groups, "the two halves share one device"
    cms = core.list_namespaced_config_map(ns).items
    assert any("GPU_PORTION" in (cm.data or {}) for cm in cms)
    lease = client.CoordinationV1Api(api).read_namespaced_lease("kai-ray-scheduler", NS)
    assert lease.spec.holder_identity
    assert "Forbidden" not in scheduler.log_tail(100000)


@pytest.mark.kuberay
def test_scheduler_with_the_charts_rbac_schedules_a_raycluster(
        plane: ControlPlane, scheduler: KaiRayProcess, ns: str) -> None:
    """The real KubeRay operator (--batch-scheduler=kai-scheduler) and the repo's RayCluster
    sample, unchanged: the grouper walks pod -> RayCluster (RBAC get on ray.io), makes one gang
    of head + 2 half-GPU workers, and the scheduler binds all three on its ServiceAccount."""
    from kai_ray.testing.kuberay import start_kuberay_operator

    _bins()
    binaries.require("ray-operator")
    start_kuberay_operator(plane)
    api = plane.api_client()
    pool_nodes(api, 1, gpus=4)  # room even when this test runs alone
    create_queues(api, queue("team-a", "default-parent-queue"))
    plane.kubectl("apply", "-n", ns, "-f",
                  str(ROOT / "ray_samples" / "raycluster-gpu-fraction-capped.yaml"))
    core = client.CoreV1Api(api)

    def ray_pods() -> list[Any]:
        return core.list_namespaced_pod(
            ns, label_selector="ray.io/cluster=raycluster-half-gpu-capped").items

    def why() -> str:
        names = [p.metadata.name for p in ray_pods()]
        return "\n".join(kai_ray("explain", n, "-n", ns, kubeconfig=plane.kubeconfig,
                                  check=False).stdout for n in names) + scheduler.log_tail()

    wait_for("head and two workers bound", lambda: len(ray_pods()) == 3 and all(
        p.spec.node_name for p in ray_pods()), timeout=90, detail=why)
    groups = {(p.metadata.annotations or {}).get("pod-group-name") for p in ray_pods()}
    assert len(groups) == 1 and None not in groups
    pg = client.CustomObjectsApi(api).get_namespaced_custom_object(*PG[:2], ns, PG[2],
                                                                   groups.pop())
    assert pg["spec"]["minMember"] == 3 and pg["spec"]["queue"] == "team-a"
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
    assert "Forbidden" not in scheduler.log_tail(100000)


def test_webhook_runs_on_its_own_rbac(plane: ControlPlane, sa_kubeconfigs: dict[str, Path],
                                      tmp_path: Path) -> None:
    """`kai-ray webhook` as the chart's webhook pod runs it: the chart's certificate, the webhook
    ServiceAccount's token; it lists Queues and namespaces and serves TLS."""
    secret = client.CoreV1Api(plane.api_client()).read_namespaced_secret("kai-ray-webhook-tls",
                                                                         NS)
    for key in ("tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(secret.data[key]))
    log = tmp_path / "webhook.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kai_ray.cli", "webhook", "--kubeconfig",
             str(sa_kubeconfigs[WEBHOOK_SA]), "--port", "0", "--validate-queue",
             "--cert-file", str(tmp_path / "tls.crt"), "--key-file", str(tmp_path / "tls.key")],
            stdout=out, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    try:
        wait_for("webhook ready", lambda: "kai-ray webhook ready" in log.read_text()
                 or proc.poll() is not None, timeout=60, detail=log.read_text)
        assert proc.poll() is None, log.read_text()
        port = int(re.search(r"ready at https://[\d.]+:(\d+)", log.read_text()).group(1))
        # what the API server does through the Service: TLS to the Service's DNS name, trusting
        # the configurations' caBundle, then an AdmissionReview
        (tmp_path / "ca.crt").write_bytes(base64.b64decode(secret.data["ca.crt"]))
        review = admission_review(pod("bad", "default-queue",
                                      annotations={"gpu-fraction": "1.5"}))
        answer = post_review(port, tmp_path / "ca.crt", "/validate-pod", review)
        assert answer["response"]["allowed"] is False
        assert "gpu-fraction" in answer["response"]["status"]["message"]
        missing = admission_review(pod("lost", "no-such-queue"))
        answer = post_review(port, tmp_path / "ca.crt", "/validate-pod", missing)
        assert answer["response"]["allowed"] is False
        assert "no-such-queue" in answer["response"]["status"]["message"]
        good = admission_review(pod("fine", "default-queue", annotations={"gpu-fraction": "0.5"}))
        answer = post_review(port, tmp_path / "ca.crt", "/mutate-pod", good)
        assert answer["response"]["allowed"] is True and answer["response"].get("patch")
        # UPDATEs: an edit to a broken fraction or a forged scheduler annotation is refused,
        # one that leaves them alone passes (even for a queue that no longer exists)
        before = pod("old", "no-such-queue", annotations={"gpu-fraction": "0.5"})
        for annotations, refused in (({"gpu-fraction": "1.5"}, "gpu-fraction"),
                                     ({"kai-ray.io/bind-intent": "{}"}, "kai-ray.io/bind-intent"),
                                     ({"note": "x"}, None)):
            after = {**before, "metadata": {**before["metadata"], "annotations": {
                **before["metadata"]["annotations"], **annotations}}}
            answer = post_review(port, tmp_path / "ca.crt", "/validate-pod",
                                 admission_review(after, old=before))
            assert answer["response"]["allowed"] is (refused is None), answer
            if refused:
                assert refused in answer["response"]["status"]["message"]
    finally:
        proc.terminate()
        proc.wait(15)
    text = log.read_text()
    assert "Forbidden" not in text and "403" not in text, text


def admission_review(obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    """A CREATE review of ``obj``, or an UPDATE from ``old`` to it."""
    def namespaced(o: dict[str, Any]) -> dict[str, Any]:
        return {**o, "metadata": {**o["metadata"], "namespace": "default"}}
    request: dict[str, Any] = {
        "uid": "00000000-0000-0000-0000-000000000001",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "default", "operation": "CREATE", "object": namespaced(obj),
        "userInfo": {"username": "test"}, "dryRun": False}
    if old is not None:
        request.update(operation="UPDATE", oldObject=namespaced(old))
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def post_review(port: int, ca: Path, path: str, review: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    # the certificate is for the Service's DNS name: check it as the API server does
    conn.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                server_hostname="kai-ray-webhook.kai-ray.svc")
    conn.request("POST", path, json.dumps(review), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 200, body
    result: dict[str, Any] = json.loads(body)
    return result


# ------------------------------------------------------------------------------ explain
def _live_reason(api: client.ApiClient, ns: str, group: str) -> str | None:
    try:
        pg = client.CustomObjectsApi(api).get_namespaced_custom_object(*PG[:2], ns, PG[2], group)
    except ApiException:
        return None
    conds = (pg.get("status") or {}).get("schedulingConditions") or []
    return conds[-1]["reasons"][0]["reason"] if conds else None


def test_explain_names_the_real_cause(plane: ControlPlane, scheduler: KaiRayProcess,
                                      ns: str) -> None:
    api = plane.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 2, gpus=4)
    sel = {"kai-ray.io/pool": pool}
    suffix = ns[-5:]
    parent, limited, np_q = f"p-{suffix}", f"limited-{suffix}", f"quota-{suffix}"
    create_queues(api, queue(parent), queue(limited, parent, gpu_quota=0, gpu_limit=1),
                  queue(np_q, parent, gpu_quota=1, gpu_limit=-1))
    gang(api, ns, "over-limit", limited, 1, gpus=2, node_selector=sel)
    gang(api, ns, "np-over-quota", np_q, 1, gpus=2, node_selector=sel, priority_class="build")
    gang(api, ns, "too-big", "default-queue", 2, gpus=6, node_selector=sel)
    core.create_namespaced_pod(ns, pod("lost", f"missing-{suffix}", gpus=1, node_selector=sel))
    lost_group = wait_for("the grouper to group the pod with a missing queue", lambda: (
        core.read_namespaced_pod("lost", ns).metadata.annotations or {}).get("pod-group-name"),
        detail=scheduler.log_tail)
    cases = {"over-limit": ("pod/over-limit-0", "OverLimit"),
             "np-over-quota": ("podgroup/np-over-quota", "NonPreemptibleOverQuota"),
             "too-big": ("too-big-1", "Unschedulable"),
             lost_group: ("lost", "QueueDoesNotExist")}
    for group, (_, reason) in cases.items():
        wait_for(f"the scheduler's reason on {group}", lambda g=group, r=reason:
                 _live_reason(api, ns, g) == r, timeout=30, detail=scheduler.log_tail)
    docs = {}
    for target, reason in cases.values():
        doc = json.loads(kai_ray("explain", target, "-n", ns, "-o", "json",
                                 kubeconfig=plane.kubeconfig).stdout)
        assert doc["reason"] == reason, doc
        assert doc["live"]["podgroup"]["reason"] == reason
        docs[reason] = doc
    changes = {r: " | ".join(d["what_would_have_to_change"]) for r, d in docs.items()}
    assert f"queue {limited}: gpu limit 1 < allocated 0 + requested 2" in changes["OverLimit"]
    assert "raise the limit to at least 2 GPUs" in changes["OverLimit"]
    assert f"queue {np_q}: non-preemptible gpu allocated 0 + requested 2 > quota 1" in \
        changes["NonPreemptibleOverQuota"]
    assert "preemptible" in changes["NonPreemptibleOverQuota"]
    assert f"create Queue 'missing-{suffix}'" in changes["QueueDoesNotExist"]
    big = docs["Unschedulable"]
    assert big["nodes_failed"]["didn't have enough resources: GPUs"] == 2
    assert big["nodes"]["nodes_matching_selector"] == 2
    assert big["nodes"]["nodes_with_enough_free_gpus"] == 0
    assert big["nodes"]["most_free_gpus"] == 4
    assert "each pod needs 6 GPU(s) on one node; 0 of 2 eligible node(s)" in \
        changes["Unschedulable"]
    table = kai_ray("explain", "too-big-0", "-n", ns, kubeconfig=plane.kubeconfig).stdout
    assert "2 node(s) didn't have enough resources: GPUs" in table
    assert "what would have to change" in table
    missing = kai_ray("explain", "nope", "-n", ns, kubeconfig=plane.kubeconfig, check=False)
    assert missing.returncode == 1 and f"pod {ns}/nope not found" in missing.stdout


def test_queues_shows_the_tree_with_fair_share(plane: ControlPlane, scheduler: KaiRayProcess,
                                               ns: str) -> None:
    api = plane.api_client()
    pool, _ = pool_nodes(api, 1, gpus=4)
    sel = {"kai-ray.io/pool": pool}
    suffix = ns[-5:]
    parent, leaf = f"qp-{suffix}", f"ql-{suffix}"
    create_queues(api, queue(parent), queue(leaf, parent, gpu_quota=1, gpu_limit=3))
    names = gang(api, ns, "two", leaf, 1, gpus=2, node_selector=sel)
    core = client.CoreV1Api(api)
    wait_for("the first gang bound", lambda: pod_phase(core, ns, names[0])[1],
             detail=lambda: kai_ray("explain", names[0], "-n", ns,
                                    kubeconfig=plane.kubeconfig, check=False).stdout)
    gang(api, ns, "blocked", leaf, 1, gpus=2, node_selector=sel)
    wait_for("the second gang refused", lambda: _live_reason(api, ns, "blocked") == "OverLimit",
             detail=scheduler.log_tail)
    doc = json.loads(kai_ray("queues", "-o", "json", kubeconfig=plane.kubeconfig).stdout)
    rows = {r["name"]: r for r in doc["queues"]}
    assert rows[leaf]["parent"] == parent and rows[leaf]["depth"] == rows[parent]["depth"] + 1
    g = rows[leaf]["gpu"]
    assert (g["quota"], g["limit"], g["weight"], g["allocated"], g["pending"]) == (1, 3, 1, 2, 2)
    assert g["fair_share"] >= 1  # at least its quota
    table = kai_ray("queues", kubeconfig=plane.kubeconfig).stdout
    assert "FAIR SHARE" in table and f"  {leaf}" in table


# ------------------------------------------------------------------------------ snapshot
def test_snapshot_then_simulate_predicts_the_live_decisions(
        plane: ControlPlane, scheduler: KaiRayProcess, ns: str, tmp_path: Path) -> None:
    """With the scheduler stopped, pending work is created; `kai-ray snapshot` dumps the live
    cluster and `kai-ray simulate` replays it. Then the scheduler starts and does on the live
    cluster what the simulation said: the same pods bound to the same nodes, the same pods
    left pending for the same reason."""
    api = plane.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 3, gpus=4)
    sel = {"kai-ray.io/pool": pool}
    suffix = ns[-5:]
    leaf = f"snap-{suffix}"
    create_queues(api, queue(leaf, "default-parent-queue", gpu_quota=4, gpu_limit=12))
    first = gang(api, ns, "running", leaf, 2, gpus=3, node_selector=sel)
    wait_for("the running gang bound", lambda: all(pod_phase(core, ns, n)[1] for n in first),
             detail=scheduler.log_tail)
    scheduler.stop()
    try:
        gang(api, ns, "pair", leaf, 2, gpus=2, node_selector=sel)
        gang(api, ns, "whole-node", leaf, 1, gpus=4, node_selector=sel)
        gang(api, ns, "over", leaf, 1, gpus=1, node_selector=sel)
        for i in range(3):
            core.create_namespaced_pod(ns, pod(f"frac-{i}", leaf, node_selector=sel,
                                               annotations={"gpu-fraction": "0.3",
                                                            "pod-group-name": f"frac-{i}"}))
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                *PG[:2], ns, PG[2], {"apiVersion": "scheduling.run.ai/v2alpha2",
                                     "kind": "PodGroup", "metadata": {"name": f"frac-{i}"},
                                     "spec": {"queue": leaf, "minMember": 1}})
        snap = tmp_path / "snapshot.yaml"
        kai_ray("snapshot", "-f", str(snap), kubeconfig=plane.kubeconfig)
        sim = json.loads(kai_ray("simulate", str(snap), "-o", "json", kubeconfig=None).stdout)
    finally:
        scheduler.start()
        scheduler.wait_ready()
    job_of = {f"{j}-{i}": j for j, n in (("pair", 2), ("whole-node", 1), ("over", 1))
              for i in range(n)} | {f"frac-{i}": f"frac-{i}" for i in range(3)}
    mine = {p: o for p, o in sim["pods"].items() if p in job_of}
    assert len(mine) == 7
    want_bound = {p: o["node"] for p, o in mine.items() if o["status"] == "Running"}
    want_pending = {p for p, o in mine.items() if o["status"] == "Pending"}
    assert want_bound and want_pending, sim  # the case must exercise both outcomes
    wait_for("the predicted pods bound", lambda: all(
        pod_phase(core, ns, p)[1] for p in want_bound), timeout=60, detail=scheduler.log_tail)
    got = {p: pod_phase(core, ns, p)[1] for p in mine}
    assert {p: n for p, n in got.items() if n} == want_bound
    pending_jobs = {job_of[p] for p in want_pending}
    for job in pending_jobs:
        want = sim["pending"][f"{ns}/{job}"]["reason"]  # jobs are keyed ns/name
        wait_for(f"{job} refused with {want}", lambda j=job, w=want: _live_reason(api, ns, j)
                 == w, timeout=30, detail=scheduler.log_tail)
    assert all(not got[p] for p in want_pending)
