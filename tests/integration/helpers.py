"""Small helpers for tests against a real API server: objects in the shapes users write, and
polling with clear failure messages."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.testing.nodes import create_gpu_nodes, wait_nodes_ready

Q = ("scheduling.run.ai", "v2", "queues")
PG = ("scheduling.run.ai", "v2alpha2", "podgroups")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0,
             interval: float = 0.25, detail: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    extra = f"\n{detail()}" if detail else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})"
                         f"{extra}")


def queue(name: str, parent: str | None = None, gpu_quota: float = -1, gpu_limit: float = -1,
          gpu_weight: float = 1, priority: int | None = None) -> dict[str, Any]:
    open_ = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    spec: dict[str, Any] = {"resources": {
        "gpu": {"quota": gpu_quota, "limit": gpu_limit, "overQuotaWeight": gpu_weight},
        "cpu": dict(open_), "memory": dict(open_)}}
    if parent:
        spec["parentQueue"] = parent
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name},
            "spec": spec}


def create_queues(api: client.ApiClient, *queues: dict[str, Any]) -> list[str]:
    custom = client.CustomObjectsApi(api)
    for q in queues:
        custom.create_cluster_custom_object(*Q, q)
    return [q["metadata"]["name"] for q in queues]


def delete_queues(api: client.ApiClient, names: list[str]) -> None:
    custom = client.CustomObjectsApi(api)
    for name in names:
        try:
            custom.delete_cluster_custom_object(*Q, name)
        except ApiException as e:
            if e.status != 404:
                raise


def pod(name: str, queue_name: str | None = None, gpus: int = 0, annotations: dict | None = None,
        labels: dict | None = None, cpu: str = "100m", memory: str = "128Mi",
        node_selector: dict | None = None, priority_class: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    all_labels = dict(labels or {})
    if queue_name:
        all_labels["kai.scheduler/queue"] = queue_name
    spec: dict[str, Any] = {"schedulerName": "kai-scheduler",
                            "containers": [{"name": "main", "image": "busybox",
                                            "resources": resources}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": all_labels, "annotations": annotations or {}},
            "spec": spec}


def podgroup(name: str, queue_name: str, min_member: int,
             priority_class: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": queue_name, "minMember": min_member}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": name}, "spec": spec}


def gang(api: client.ApiClient, namespace: str, name: str, queue_name: str, size: int,
         gpus: int = 1, min_member: int | None = None, node_selector: dict | None = None,
         priority_class: str | None = None) -> list[str]:
    """A PodGroup of `size` pods created up front (as a user or an operator may do)."""
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    custom.create_namespaced_custom_object(
        *PG[:2], namespace, PG[2],
        podgroup(name, queue_name, min_member or size, priority_class))
    names = []
    for i in range(size):
        p = pod(f"{name}-{i}", queue_name, gpus=gpus, annotations={"pod-group-name": name},
                node_selector=node_selector, priority_class=priority_class)
        core.create_namespaced_pod(namespace, p)
        names.append(p["metadata"]["name"])
    return names


def pool_nodes(api: client.ApiClient, count: int, gpus: int, pool: str | None = None,
               start: int = 0) -> tuple[str, list[str]]:
    """Nodes of their own pool (label kai-ray.io/pool), so a test owns its capacity."""
    pool = pool or f"pool-{uuid.uuid4().hex[:6]}"
    names = create_gpu_nodes(api, count, gpus, prefix=f"{pool}-", start=start,
                             labels={"kai-ray.io/pool": pool})
    wait_nodes_ready(api, names)
    return pool, names


def pod_phase(core: client.CoreV1Api, namespace: str, name: str) -> tuple[str, str | None]:
    p = core.read_namespaced_pod(name, namespace)
    return p.status.phase, p.spec.node_name


def scheduled_condition(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    p = core.read_namespaced_pod(name, namespace)
    for c in p.status.conditions or []:
        if c.type == "PodScheduled":
            return c
    return None


def clear_leftovers_for_the_chart(api: client.ApiClient,
                                          name: str = "kai-resource-reservation",
                                          timeout: float = 120.0) -> None:
    """Deletes what an earlier module's out-of-cluster `kai-ray run --webhook` left for the
    chart to own: the webhook configurations it registers (it keeps them when it stops, so pods
    are not admitted unchecked meanwhile) and the reservation namespace it makes when run as
    admin, so that `helm install` can own them; what Helm manages is left alone."""
    adm = client.AdmissionregistrationV1Api(api)
    for kind in ("validating", "mutating"):
        read = getattr(adm, f"read_{kind}_webhook_configuration")
        delete = getattr(adm, f"delete_{kind}_webhook_configuration")
        try:
            config = read("kai-ray-admission")
        except client.ApiException as e:
            if e.status == 404:
                continue
            raise
        if (config.metadata.labels or {}).get("app.kubernetes.io/managed-by") != "Helm":
            delete("kai-ray-admission")
    core = client.CoreV1Api(api)
    try:
        ns = core.read_namespace(name)
    except client.ApiException as e:
        if e.status == 404:
            return
        raise
    if (ns.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "Helm":
        return
    if ns.metadata.deletion_timestamp is None:
        core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except client.ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    wait_for(f"namespace {name} deleted", gone, timeout=timeout, interval=1)


def install_chart_for_tests(node: Any, log: Callable[[str], None] = print) -> Any:
    """kai-ray installed by its chart on the real node's plane (kai_ray.testing.install), after
    clearing what an earlier module's out-of-cluster kai-ray left; KAI's PriorityClasses that
    an earlier module made are kept, as the README tells users (priorityClasses.create=false)."""
    from kai_ray.testing.install import ChartInstall

    api = node.plane.api_client()
    clear_leftovers_for_the_chart(api)
    classes = {c.metadata.name for c in client.SchedulingV1Api(api).list_priority_class().items}
    chart = ChartInstall(node.plane.kubeconfig, node, log=log)
    return chart.install(*(["--set", "priorityClasses.create=false"] if "train" in classes
                           else []))
