"""RayJob and RayService through the real KubeRay operator: their RayClusters become one gang
each, named after and owned by the RayJob/RayService (as KAI's Ray grouper does)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from kai_ray.k8s.suspend import DEMAND_ANNOTATION
from tests.integration.helpers import create_queues, delete_queues, pool_nodes, queue, wait_for
from tests.integration.kuberay_helpers import (
    bound,
    create,
    delete,
    describe,
    get,
    limited_leaf,
    podgroup_of,
    ray_cluster,
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


@contextlib.contextmanager
def _train_rayjob(cluster, namespace: str, kai_scheduler, mode: str) -> Iterator[tuple]:
    """A priority-"train" RayJob `job` (head + 2 GPU workers, not yet created) in a leaf queue
    limited to 2 GPUs on a 4-GPU node, for a "build" RayCluster to preempt; cleans up after.
    Yields (api, core, pool, leaf, job, detail)."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, leaf, created = limited_leaf(api, namespace, "t")
    detail = lambda: (f"RayJob status: {get(api, namespace, 'RayJob', 'job').get('status')}\n"  # noqa: E731
                      + describe(core, namespace) + "\n" + kai_scheduler.log_tail())
    job = ray_job("job", leaf, pool, 2, mode)
    job["metadata"]["labels"]["ray.io/priority-class-name"] = "train"
    try:
        yield api, core, pool, leaf, job, detail
    finally:
        delete(api, namespace, "RayJob", "job")
        delete(api, namespace, "RayCluster", "build")
        delete_queues(api, created)


def podgroup(api: client.ApiClient, namespace: str, name: str) -> dict:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        "scheduling.run.ai", "v2alpha2", namespace, "podgroups", name)


def _deployment_status(api: client.ApiClient, namespace: str, name: str) -> str | None:
    return (get(api, namespace, "RayJob", name).get("status") or {}).get("jobDeploymentStatus")


@pytest.mark.usefixtures("kuberay_operator")
def test_preempted_sidecar_rayjob_is_suspended_and_resumes(cluster, namespace,
                                                            kai_scheduler) -> None:
    """KubeRay v1.6.2 does not re-create the head pod of a provisioned SidecarMode RayJob and
    marks the RayJob Failed ("Ray head pod not found.") when it disappears, so evicting its
    pods would kill the job (KAI issue #1401). kai-ray suspends the RayJob instead
    (spec.suspend: KubeRay deletes its RayCluster) and resumes it when the gang fits again,
    with the chart's RBAC (the session's scheduler runs on it), leaving no suspended demand
    behind."""
    with _train_rayjob(cluster, namespace, kai_scheduler, "SidecarMode") as (
            api, core, pool, leaf, job, detail):
        job["spec"]["shutdownAfterJobFinishes"] = True
        create(api, namespace, job)
        first = wait_for("the RayJob's cluster", lambda: _cluster_name(
            api, namespace, "RayJob", "job"), timeout=60)
        wait_for("RayJob Running on a running gang", lambda: _deployment_status(
            api, namespace, "job") == "Running" and len(running(ray_pods(
                core, namespace, first))) == 3, timeout=90, detail=detail)
        pg_name = ray_pods(core, namespace, first)[0].metadata.annotations["pod-group-name"]

        create(api, namespace, ray_cluster("build", leaf, [worker_group("gpu", 2, pool=pool)],
                                           pool=pool, priority_class="build"))
        wait_for("the RayJob suspended", lambda: _deployment_status(
            api, namespace, "job") == "Suspended", timeout=60, detail=detail)
        wait_for("build running", lambda: len(running(ray_pods(core, namespace, "build")))
                 == 3, timeout=60, detail=detail)
        # build fits beside them (the node has 4 GPUs; the queue limit no longer counts the
        # releasing pods), so it may run before KubeRay's RayCluster deletion removes them
        wait_for("the suspended RayJob's pods gone", lambda: ray_pods(core, namespace, first)
                 == [], timeout=60, detail=detail)
        wait_for("the RayJob's Suspended event", lambda: any(
            e.reason == "Suspended" and "build" in e.message
            for e in core.list_namespaced_event(
                namespace, field_selector="involvedObject.kind=RayJob").items), timeout=10)
        # suspended, not evicted: the scheduler (the chart's RBAC: patch on rayjobs) evicted
        # none of the gang's pods; KubeRay deleted them with the RayCluster
        assert not [e for e in core.list_namespaced_event(
            namespace, field_selector="reason=Preempted").items
            if e.involved_object.name.startswith(first)], describe(core, namespace)
        assert "not suspended" not in kai_scheduler.log_tail(100000)
        # the gang's demand is still seen: the PodGroup keeps it and says why it waits
        pg = podgroup(api, namespace, pg_name)
        assert pg["metadata"]["name"] == pg_name
        assert DEMAND_ANNOTATION in pg["metadata"]["annotations"]
        wait_for("the suspended gang's PodGroup condition", lambda: (podgroup(
            api, namespace, pg_name).get("status") or {}).get("schedulingConditions"),
            timeout=30)

        delete(api, namespace, "RayCluster", "build")
        wait_for("the RayJob resumed on a new running gang", lambda: (
            (name := _cluster_name(api, namespace, "RayJob", "job")) and name != first
            and len(running(ray_pods(core, namespace, name))) == 3), timeout=120,
            detail=detail)
        assert get(api, namespace, "RayJob", "job")["spec"].get("suspend") is False
        wait_for("the RayJob's Resumed event", lambda: any(
            e.reason == "Resumed" for e in core.list_namespaced_event(
                namespace, field_selector="involvedObject.kind=RayJob").items), timeout=10)
        # resumed, the stand-ins are gone: no demand left behind to hold room twice
        annotations = podgroup(api, namespace, pg_name)["metadata"].get("annotations") or {}
        assert DEMAND_ANNOTATION not in annotations, annotations


@pytest.mark.usefixtures("kuberay_operator")
def test_preempted_interactive_rayjob_gets_its_pods_back_from_kuberay(cluster, namespace,
                                                                      kai_scheduler) -> None:
    """An InteractiveMode RayJob waiting for its job id cannot be suspended (KubeRay suspends
    only Running/Initializing RayJobs): its pods are evicted, and KubeRay v1.6.2 re-creates the
    head and the workers (only SidecarMode clusters skip the head), which wait as a gang and run
    again once room returns; the RayJob never fails."""
    with _train_rayjob(cluster, namespace, kai_scheduler, "InteractiveMode") as (
            api, core, pool, leaf, job, detail):
        create(api, namespace, job)
        name = wait_for("the RayJob's cluster", lambda: _cluster_name(
            api, namespace, "RayJob", "job"), timeout=60)
        wait_for("the gang running", lambda: len(running(ray_pods(core, namespace, name)))
                 == 3, timeout=60, detail=detail)
        first = {p.metadata.uid for p in ray_pods(core, namespace, name)}
        create(api, namespace, ray_cluster("build", leaf, [worker_group("gpu", 2, pool=pool)],
                                           pool=pool, priority_class="build"))
        wait_for("build running", lambda: len(running(ray_pods(core, namespace, "build")))
                 == 3, timeout=60, detail=detail)
        wait_for("KubeRay re-created head and workers", lambda: len(ray_pods(
            core, namespace, name)) == 3 and not first & {p.metadata.uid for p in ray_pods(
                core, namespace, name)}, timeout=60, detail=detail)
        assert bound(ray_pods(core, namespace, name)) == []
        assert _deployment_status(api, namespace, "job") not in ("Failed", "Suspended")
        delete(api, namespace, "RayCluster", "build")
        wait_for("the RayJob's gang runs again", lambda: len(running(ray_pods(
            core, namespace, name))) == 3, timeout=90, detail=detail)
        assert _deployment_status(api, namespace, "job") != "Failed"
