"""The local control plane: KAI's CRDs with validation, KWOK GPU nodes, bind -> Running."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.testing import binaries
from kai_ray.testing.cluster import Cluster
from kai_ray.testing.nodes import node_ip

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DATA = Path(__file__).parent / "data"
QUEUE_API = ("scheduling.run.ai", "v2", "queues")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def kuberay_queue_docs() -> list[str]:
    """The Queue documents of KubeRay's kai-scheduler sample, as the exact text of the file."""
    text = binaries.kuberay_sample("ray-cluster.kai-scheduler.yaml").read_text()
    docs = [d for d in text.split("\n---\n") if d.strip()]
    queues = [d for d in docs if (yaml.safe_load(d) or {}).get("kind") == "Queue"]
    assert len(queues) == 2, f"expected 2 Queue documents in the KubeRay sample, got {len(queues)}"
    return queues


@pytest.fixture
def queues(cluster: Cluster) -> Iterator[client.CustomObjectsApi]:
    """Queues are cluster-scoped: delete every Queue a test created."""
    api = client.CustomObjectsApi(cluster.api_client())
    before = {q["metadata"]["name"] for q in api.list_cluster_custom_object(*QUEUE_API)["items"]}
    yield api
    for q in api.list_cluster_custom_object(*QUEUE_API)["items"]:
        if q["metadata"]["name"] not in before:
            api.delete_cluster_custom_object(*QUEUE_API, q["metadata"]["name"])


def test_gpu_nodes_report_capacity_and_nvidia_labels(cluster: Cluster, gpu_nodes: list[str],
                                                     core: client.CoreV1Api) -> None:
    for name in gpu_nodes:
        node = core.read_node(name)
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        labels = node.metadata.labels
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/gpu.memory"] == "81920"
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", node.status.conditions
    out = cluster.kubectl("get", "nodes", "-o", "json").stdout
    assert {n["metadata"]["name"] for n in json.loads(out)["items"]} >= set(gpu_nodes)


def test_kai_quickstart_and_kuberay_sample_queues_are_accepted(
        cluster: Cluster, queues: client.CustomObjectsApi) -> None:
    cluster.create_yaml((DATA / "kai-default-queues.yaml").read_text())
    for doc in kuberay_queue_docs():
        cluster.create_yaml(doc)

    team_a = queues.get_cluster_custom_object(*QUEUE_API, "team-a")
    assert team_a["spec"]["parentQueue"] == "department-1"
    assert team_a["spec"]["resources"]["gpu"] == {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    leaf = queues.get_cluster_custom_object(*QUEUE_API, "default-queue")
    assert leaf["spec"]["parentQueue"] == "default-parent-queue"
    assert leaf["spec"]["resources"]["memory"] == {"quota": 0, "limit": -1, "overQuotaWeight": 1}

    table = cluster.kubectl("get", "queues").stdout
    header = table.splitlines()[0].split()
    assert header[:5] == ["NAME", "PRIORITY", "PARENT", "CHILDREN", "DISPLAYNAME"], table
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert rows["team-a"][1] == "department-1"  # empty PRIORITY is not printed; PARENT is next
    assert {"default-parent-queue", "default-queue", "department-1", "team-a"} <= set(rows)


BAD_QUEUES = {
    "quota is a string": ({"gpu": {"quota": "abc", "limit": -1, "overQuotaWeight": 1}},
                          "spec.resources.gpu.quota"),
    "limit below -1": ({"cpu": {"quota": 0, "limit": -5, "overQuotaWeight": 1}},
                       "spec.resources.cpu.limit"),
    "negative weight": ({"memory": {"quota": 0, "limit": -1, "overQuotaWeight": -1}},
                        "spec.resources.memory.overQuotaWeight"),
    "resources is a list": ([1, 2], "spec.resources"),
}


@pytest.mark.parametrize("case", sorted(BAD_QUEUES))
def test_malformed_queue_is_rejected_naming_the_field(
        case: str, cluster: Cluster, queues: client.CustomObjectsApi) -> None:
    resources, field = BAD_QUEUES[case]
    body = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
            "metadata": {"name": "bad-queue"}, "spec": {"resources": resources}}
    with pytest.raises(ApiException) as err:
        queues.create_cluster_custom_object(*QUEUE_API, body)
    assert err.value.status == 422, err.value.body
    assert field in err.value.body, err.value.body


def test_queue_without_resources_and_unknown_fields_are_rejected(
        cluster: Cluster, queues: client.CustomObjectsApi) -> None:
    missing = ("apiVersion: scheduling.run.ai/v2\nkind: Queue\nmetadata: {name: no-resources}\n"
               "spec: {parentQueue: x}\n")
    out = cluster.kubectl("create", "-f", "-", input=missing, check=False)
    assert out.returncode != 0 and "spec.resources: Required value" in out.stderr, out.stderr

    typo = ("apiVersion: scheduling.run.ai/v2\nkind: Queue\nmetadata: {name: typo}\n"
            "spec: {resources: {gpu: {qouta: 1}}}\n")
    out = cluster.kubectl("create", "--validate=strict", "-f", "-", input=typo, check=False)
    assert out.returncode != 0 and "spec.resources.gpu.qouta" in out.stderr, out.stderr


@pytest.mark.parametrize(("spec", "field"), [
    ({"minMember": 0, "queue": "q"}, "spec.minMember"),
    ({"minMember": 1, "preemptibility": "sometimes"}, "spec.preemptibility"),
    ({"subGroups": [{"name": "", "minMember": 1}]}, "spec.subGroups[0].name"),
])
def test_malformed_podgroup_is_rejected_naming_the_field(
        cluster: Cluster, namespace: str, spec: dict[str, Any], field: str) -> None:
    api = client.CustomObjectsApi(cluster.api_client())
    body = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": "bad-pg"}, "spec": spec}
    with pytest.raises(ApiException) as err:
        api.create_namespaced_custom_object("scheduling.run.ai", "v2alpha2", namespace,
                                            "podgroups", body)
    assert err.value.status == 422 and field in err.value.body, err.value.body


def test_podgroup_short_name_and_status_subresource(cluster: Cluster, namespace: str) -> None:
    api = client.CustomObjectsApi(cluster.api_client())
    group = ("scheduling.run.ai", "v2alpha2", namespace, "podgroups")
    api.create_namespaced_custom_object(*group, {
        "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
        "metadata": {"name": "pg-1"},
        "spec": {"minMember": 3, "queue": "team-a", "preemptibility": "non-preemptible",
                 "subGroups": [{"name": "workers", "minMember": 2}]},
        # status on create is dropped: it belongs to the status subresource
        "status": {"phase": "Running"}})
    pg = api.get_namespaced_custom_object(*group, "pg-1")
    assert "status" not in pg or "phase" not in pg["status"]
    api.patch_namespaced_custom_object_status(*group, "pg-1", {"status": {"running": 3}})
    assert api.get_namespaced_custom_object(*group, "pg-1")["status"]["running"] == 3
    out = cluster.kubectl("get", "pg", "-n", namespace).stdout
    assert "pg-1" in out and "team-a" in out, out


def _pod(name: str, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"kai.scheduler/queue": "default-queue"},
                     "annotations": annotations},
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{"name": "main", "image": "example.invalid/app:1",
                            "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"},
                                          "limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


def bind(cluster: Cluster, namespace: str, pod: str, node: str) -> None:
    """POST pods/<pod>/binding, as a scheduler's binder does."""
    body = client.V1Binding(metadata=client.V1ObjectMeta(name=pod),
                            target=client.V1ObjectReference(kind="Node", name=node,
                                                            api_version="v1"))
    # the generated client cannot deserialize the Status this returns: skip deserialising
    client.CoreV1Api(cluster.api_client()).create_namespaced_pod_binding(
        pod, namespace, body, _preload_content=False)


def test_pod_bound_through_binding_subresource_runs_on_kwok_node(
        cluster: Cluster, gpu_nodes: list[str], namespace: str, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(namespace, _pod("trainer"))
    # nothing schedules kai-scheduler pods here: it stays Pending and unbound
    time.sleep(0.5)
    pod = core.read_namespaced_pod("trainer", namespace)
    assert pod.spec.scheduler_name == "kai-scheduler"
    assert pod.spec.node_name is None and pod.status.phase == "Pending"

    bind(cluster, namespace, "trainer", gpu_nodes[1])
    pod = wait_for("pod trainer Running", lambda: (
        p if (p := core.read_namespaced_pod("trainer", namespace)).status.phase == "Running"
        else None))
    assert pod.spec.node_name == gpu_nodes[1]
    assert pod.status.host_ip == node_ip(1)
    assert pod.status.pod_ip
    conditions = {c.type: c.status for c in pod.status.conditions}
    assert conditions["PodScheduled"] == "True" and conditions["Ready"] == "True", conditions
    assert pod.status.container_statuses[0].state.running is not None


@pytest.mark.parametrize(("code", "phase"), [("0", "Succeeded"), ("3", "Failed")])
def test_kwok_completes_a_running_pod_on_request(
        cluster: Cluster, gpu_nodes: list[str], namespace: str, core: client.CoreV1Api,
        code: str, phase: str) -> None:
    core.create_namespaced_pod(namespace, _pod("job", **{
        "kwok.kai-ray.io/exit-code": code, "kwok.kai-ray.io/run-for": "1s"}))
    bind(cluster, namespace, "job", gpu_nodes[0])
    wait_for("pod Running", lambda: core.read_namespaced_pod("job", namespace).status.phase
             in ("Running", phase))
    pod = wait_for(f"pod {phase}", lambda: (
        p if (p := core.read_namespaced_pod("job", namespace)).status.phase == phase else None))
    assert pod.status.container_statuses[0].state.terminated.exit_code == int(code)


def test_deleting_a_running_pod_removes_it(
        cluster: Cluster, gpu_nodes: list[str], namespace: str, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(namespace, _pod("victim"))
    bind(cluster, namespace, "victim", gpu_nodes[0])
    wait_for("pod Running", lambda: core.read_namespaced_pod("victim", namespace)
             .status.phase == "Running")
    core.delete_namespaced_pod("victim", namespace)  # graceful: needs KWOK to finish it

    def gone() -> bool:
        try:
            core.read_namespaced_pod("victim", namespace)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for("pod deleted", gone)
