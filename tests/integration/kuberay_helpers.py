"""RayCluster/RayJob/RayService manifests in the shape users write, and what the Ray autoscaler
does to a RayCluster (its JSON patches), for tests against the real KubeRay operator."""

from __future__ import annotations

import copy
import time
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.integration.helpers import create_queues, pool_nodes, queue

RAY = ("ray.io", "v1")
RAY_IMAGE = "rayproject/ray:2.52.0"
POOL_LABEL = "kai-ray.io/pool"


def _container(name: str, cpu: str, memory: str, gpus: int) -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {"name": name, "image": RAY_IMAGE,
            "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}}


def _template(container: dict[str, Any], pool: str | None,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container]}
    if pool:
        spec["nodeSelector"] = {POOL_LABEL: pool}
    template: dict[str, Any] = {"spec": spec}
    if annotations:
        template["metadata"] = {"annotations": dict(annotations)}
    return template


def worker_group(name: str, replicas: int, min_replicas: int | None = None,
                 max_replicas: int | None = None, gpus: int = 1, hosts: int = 1,
                 pool: str | None = None, annotations: dict[str, str] | None = None,
                 ray_start_params: dict[str, str] | None = None,
                 cpu: str = "500m", memory: str = "512Mi") -> dict[str, Any]:
    group: dict[str, Any] = {
        "groupName": name, "replicas": replicas,
        "minReplicas": replicas if min_replicas is None else min_replicas,
        "maxReplicas": max(replicas, max_replicas or 0),
        "rayStartParams": dict(ray_start_params or {}),
        "template": _template(_container("ray-worker", cpu, memory, gpus), pool, annotations)}
    if hosts != 1:
        group["numOfHosts"] = hosts
    return group


def ray_cluster_spec(workers: list[dict[str, Any]], pool: str | None = None,
                     autoscaling: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "headGroupSpec": {"rayStartParams": {},
                          "template": _template(_container("ray-head", "500m", "1Gi", 0), pool)},
        "workerGroupSpecs": workers}
    if autoscaling:
        spec["enableInTreeAutoscaling"] = True
    return spec


def ray_cluster(name: str, queue: str | None, workers: list[dict[str, Any]],
                pool: str | None = None, priority_class: str | None = None,
                autoscaling: bool = False, labels: dict[str, str] | None = None
                ) -> dict[str, Any]:
    all_labels = dict(labels or {})
    if queue:
        all_labels["kai.scheduler/queue"] = queue
    if priority_class:
        all_labels["ray.io/priority-class-name"] = priority_class
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "labels": all_labels},
            "spec": ray_cluster_spec(workers, pool, autoscaling)}


def create(api: client.ApiClient, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    plural = obj["kind"].lower() + "s"
    result: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        *RAY, namespace, plural, copy.deepcopy(obj))
    return result


def get(api: client.ApiClient, namespace: str, kind: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        *RAY, namespace, kind.lower() + "s", name)
    return result


def delete(api: client.ApiClient, namespace: str, kind: str, name: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            *RAY, namespace, kind.lower() + "s", name)
    except ApiException as e:
        if e.status != 404:
            raise


def json_patch(api: client.ApiClient, namespace: str, name: str,
               ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSON Patch on a RayCluster, sent with the content type the Ray autoscaler uses
    (application/json-patch+json)."""
    result: dict[str, Any] = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *RAY, namespace, "rayclusters", name, ops,
        _content_type="application/json-patch+json")
    return result


def autoscaler_scale(api: client.ApiClient, namespace: str, name: str, group_index: int,
                     replicas: int, workers_to_delete: list[str] | None = None
                     ) -> dict[str, Any]:
    """What Ray's KubeRay node provider sends: replace the group's replicas and, for a
    scale-down of named pods, its scaleStrategy."""
    ops: list[dict[str, Any]] = [{"op": "replace",
                                  "path": f"/spec/workerGroupSpecs/{group_index}/replicas",
                                  "value": replicas}]
    if workers_to_delete is not None:
        ops.append({"op": "replace",
                    "path": f"/spec/workerGroupSpecs/{group_index}/scaleStrategy",
                    "value": {"workersToDelete": list(workers_to_delete)}})
    return json_patch(api, namespace, name, ops)


def ensure_priority_classes(api: client.ApiClient) -> None:
    """KAI's shipped PriorityClasses (train 50, build-preemptible 75, build 100, inference 125)."""
    sched = client.SchedulingV1Api(api)
    for name, value in (("train", 50), ("build-preemptible", 75), ("build", 100),
                        ("inference", 125)):
        try:
            sched.create_priority_class({"metadata": {"name": name}, "value": value})
        except ApiException as e:
            if e.status != 409:
                raise


def ray_pods(core: client.CoreV1Api, namespace: str, cluster: str,
             group: str | None = None) -> list[Any]:
    """The cluster's live pods (not being deleted), by name."""
    selector = f"ray.io/cluster={cluster}"
    if group:
        selector += f",ray.io/group={group}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return sorted((p for p in pods if not p.metadata.deletion_timestamp),
                  key=lambda p: p.metadata.name)


def bound(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.spec.node_name]


def running(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.status.phase == "Running"]


def wait_pods(core: client.CoreV1Api, namespace: str, cluster: str, count: int,
              timeout: float = 60.0, group: str | None = None) -> list[Any]:
    deadline = time.monotonic() + timeout
    pods: list[Any] = []
    while time.monotonic() < deadline:
        pods = ray_pods(core, namespace, cluster, group)
        if len(pods) >= count:
            return pods
        time.sleep(0.2)
    raise AssertionError(f"KubeRay created {len(pods)} of {count} pods for {cluster} "
                         f"in {timeout:.0f}s")


def podgroup_of(api: client.ApiClient, namespace: str, pod: Any) -> dict[str, Any] | None:
    name = (pod.metadata.annotations or {}).get("pod-group-name")
    if not name:
        return None
    try:
        result: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "scheduling.run.ai", "v2alpha2", namespace, "podgroups", name)
        return result
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def describe(core: client.CoreV1Api, namespace: str) -> str:
    """Pods of a namespace and their state, for failure messages."""
    lines = []
    for p in core.list_namespaced_pod(namespace).items:
        cond = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
        lines.append(f"{p.metadata.name}: {p.status.phase} node={p.spec.node_name} "
                     f"deleting={bool(p.metadata.deletion_timestamp)} "
                     f"sched={cond.message if cond else None}")
    return "\n".join(lines)


def limited_leaf(api: client.ApiClient, namespace: str, prefix: str) -> tuple[str, str, list[str]]:
    """A 4-GPU pool node and a parent/leaf queue pair whose leaf may use 2 GPUs (quota = limit
    = 2): the limit, not the node, is what forces preemption between the priority classes
    (created too). Returns (pool, leaf, queues to delete)."""
    ensure_priority_classes(api)
    pool, _ = pool_nodes(api, 1, gpus=4)
    suffix = namespace[-5:]
    parent, leaf = f"{prefix}p-{suffix}", f"{prefix}l-{suffix}"
    created = create_queues(api, queue(parent), queue(leaf, parent, gpu_quota=2, gpu_limit=2))
    return pool, leaf, created
