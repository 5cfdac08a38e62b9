"""RayJob and RayService through the real KubeRay operator: their RayClusters become one gang
each, named after and owned by the RayJob/RayService (as KAI's Ray grouper does)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from tests.integration.helpers import create_queues, delete_queues, pool_nodes, queue, wait_for
from tests.integration.kuberay_helpers import (
    bound,
    create,
    delete,
    describe,
    get,
    podgroup_of,
    ray_cluster_spec,
    ray_pods,
    running,
    wait_pods,
    worker_group,
)

pytestmark = [pytest.mark.integration, pytest.mark.kuberay, pytest.mark.timeout(240)]
CYCLE_S = 1.0


def ray_job(name: str, queue_name: str, pool: str, workers: int, mode: str) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "labels": {"kai.scheduler/queue": queue_name}},
            "spec": {"submissionMode": mode, "entrypoint": "python -c 'print(1)'",
                     "rayClusterSpec": ray_cluster_spec([worker_group("gpu", workers, pool=pool)],
                                                        pool)}}


def ray_service(name: str, queue_name: str, pool: str, workers: int) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": name, "labels": {"kai.scheduler/queue": queue_name}},
            "spec": {"rayClusterConfig": ray_cluster_spec(
                [worker_group("gpu", workers, pool=pool)], pool)}}


def _cluster_name(api: client.ApiClient, namespace: str, kind: str, name: str) -> str | None:
    status = get(api, namespace, kind, name).get("status") or {}
    if kind == "RayJob":
        return status.get("rayClusterName")
    for key in ("activeServiceStatus", "pendingServiceStatus"):
        value = (status.get(key) or {}).get("rayClusterName")
        if value:
            return str(value)
    return None


def _check_gang(api: client.ApiClient, core: client.CoreV1Api, namespace: str, kind: str,
                name: str, pool: str, detail) -> str:
    """The RayCluster of `kind/name` waits whole on a pool too small, then runs whole."""
    cluster = wait_for(f"{kind} {name}'s RayCluster", lambda: _cluster_name(
        api, namespace, kind, name), timeout=60)
    pods = wait_pods(core, namespace, cluster, 3, timeout=60)
    wait_for("the gang's pods grouped", lambda: all(
        (p.metadata.annotations or {}).get("pod-group-name")
        for p in ray_pods(core, namespace, cluster)), timeout=30, detail=detail)
    pods = ray_pods(core, namespace, cluster)
    pg = podgroup_of(api, namespace, pods[0])
    owner = get(api, namespace, kind, name)
    assert pg["metadata"]["name"] == f"pg-{name}-{owner['metadata']['uid']}"
    assert pg["metadata"]["ownerReferences"][0]["kind"] == kind
    assert pg["spec"]["minMember"] == 3 and pg["spec"]["queue"]
    time.sleep(3 * CYCLE_S)  # one GPU in the pool, two needed: nothing may bind
    assert bound(ray_pods(core, namespace, cluster)) == [], describe(core, namespace)
    pool_nodes(api, 1, gpus=1, pool=pool, start=1)
    wait_for(f"{kind} {name}: head + 2 workers running", lambda: len(running(ray_pods(
        core, namespace, cluster))) == 3, timeout=60, detail=detail)
    return cluster


@pytest.mark.usefixtures("kuberay_operator")
@pytest.mark.parametrize("mode", ["InteractiveMode", "HTTPMode"])
def test_rayjob_cluster_is_one_gang(cluster, namespace, kai_scheduler, mode) -> None:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 1, gpus=1)
    qname = f"rj-{namespace[-5:]}"
    created = create_queues(api, queue(qname))
    detail = lambda: describe(core, namespace) + "\n" + kai_scheduler.log_tail()  # noqa: E731
    try:
        create(api, namespace, ray_job("job", qname, pool, 2, mode))
        _check_gang(api, core, namespace, "RayJob", "job", pool, detail)
    finally:
        delete(api, namespace, "RayJob", "job")
        delete_queues(api, created)


@pytest.mark.usefixtures("kuberay_operator")
def test_rayservice_cluster_is_one_gang(cluster, namespace, kai_scheduler) -> None:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 1, gpus=1)
    qname = f"rs-{namespace[-5:]}"
    created = create_queues(api, queue(qname))
    detail = lambda: describe(core, namespace) + "\n" + kai_scheduler.log_tail()  # noqa: E731
    try:
        create(api, namespace, ray_service("serve", qname, pool, 2))
        _check_gang(api, core, namespace, "RayService", "serve", pool, detail)
    finally:
        delete(api, namespace, "RayService", "serve")
        delete_queues(api, created)
