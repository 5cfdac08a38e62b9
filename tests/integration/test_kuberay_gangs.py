"""RayClusters made by the real KubeRay operator, scheduled by kai-ray as gangs: all or nothing,
preempted whole (and re-created by KubeRay), reclaimed across queues elastic workers first.

Each test owns a node pool (label kai-ray.io/pool) and its RayClusters select it, so the
capacity in the test is exact whatever else the session runs.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from tests.integration.helpers import (
    create_queues,
    delete_queues,
    pod,
    pod_phase,
    pool_nodes,
    queue,
    wait_for,
)
from tests.integration.kuberay_helpers import (
    bound,
    create,
    delete,
    describe,
    limited_leaf,
    ray_cluster,
    ray_pods,
    running,
    wait_pods,
    worker_group,
)

pytestmark = [pytest.mark.integration, pytest.mark.kuberay, pytest.mark.timeout(240)]
CYCLE_S = 1.0  # kai-ray run's default cycle period


def _scheduled_condition(p: object) -> object:
    return next((c for c in p.status.conditions or []  # type: ignore[attr-defined]
                 if c.type == "PodScheduled"), None)


@pytest.mark.usefixtures("kuberay_operator")
def test_head_and_four_gpu_workers_wait_whole_then_bind_within_two_cycles(
        cluster, namespace, kai_scheduler) -> None:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    pool, _ = pool_nodes(api, 1, gpus=4)
    suffix = namespace[-5:]
    qname, other = f"rq-{suffix}", f"blk-{suffix}"
    created = create_queues(api, queue(qname), queue(other))
    try:
        # one of the pool's 4 GPUs is taken: 3 free for a gang that needs 4
        core.create_namespaced_pod(namespace, pod("blocker", other, gpus=1,
                                                  node_selector={"kai-ray.io/pool": pool}))
        wait_for("the blocker runs", lambda: pod_phase(core, namespace, "blocker")[0]
                 == "Running", detail=kai_scheduler.log_tail)
        create(api, namespace, ray_cluster("gang", qname, [worker_group("gpu", 4, pool=pool)],
                                           pool=pool))
        pods = wait_pods(core, namespace, "gang", 5)
        wait_for("Unschedulable conditions on all 5 pods", lambda: all(
            _scheduled_condition(p) for p in ray_pods(core, namespace, "gang")), timeout=30,
            detail=lambda: describe(core, namespace))
        time.sleep(3 * CYCLE_S)  # a few more cycles: still nothing bound
        pods = ray_pods(core, namespace, "gang")
        assert bound(pods) == [], describe(core, namespace)
        cond = _scheduled_condition(pods[0])
        assert cond.reason == "Unschedulable" and "gang" in cond.message, cond.message
        # the PodGroup says so too, with the same reason the pods carry
        pg_name = pods[0].metadata.annotations["pod-group-name"]
        pg = custom.get_namespaced_custom_object("scheduling.run.ai", "v2alpha2", namespace,
                                                 "podgroups", pg_name)
        assert pg["spec"]["minMember"] == 5
        sched = (pg.get("status") or {}).get("schedulingConditions") or []
        assert sched and "gang" in sched[-1]["message"], pg.get("status")
        # and the RayCluster itself says why it waits
        # and the RayCluster itself says why it waits (an earlier event may say NotReady: the
        # scheduler saw the gang before KubeRay had created all 5 pods)
        wait_for("the gang's reason as an event on the RayCluster", lambda: [
            e for e in core.list_namespaced_event(
                namespace, field_selector="involvedObject.kind=RayCluster").items
            if e.reason == "Unschedulable" and e.involved_object.name == "gang"
            and "5 pods pending" in e.message and "gang scheduling" in e.message], timeout=10)

        core.delete_namespaced_pod("blocker", namespace, grace_period_seconds=0)
        wait_for("the blocker gone", lambda: not [
            p for p in core.list_namespaced_pod(namespace).items
            if p.metadata.name == "blocker"], timeout=30)
        freed = time.monotonic()
        wait_for("all 5 bound", lambda: len(bound(ray_pods(core, namespace, "gang"))) == 5,
                 timeout=30, interval=0.05, detail=lambda: describe(core, namespace))
        took = time.monotonic() - freed
        # two cycles, plus the watch delay of seeing the GPU free and the binds landing
        assert took <= 2 * CYCLE_S + 1.0, f"bound {took:.2f}s after the GPU was freed"
        print(f"gang of 5 bound {took:.2f}s after the GPU was freed")
    finally:
        delete(api, namespace, "RayCluster", "gang")
        delete_queues(api, created)


@pytest.mark.usefixtures("kuberay_operator")
def test_build_cluster_preempts_train_cluster_whole_and_kuberay_recreates_it(
        cluster, namespace, kai_scheduler) -> None:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, leaf, created = limited_leaf(api, namespace, "g")
    try:
        create(api, namespace, ray_cluster("train", leaf, [worker_group("gpu", 2, pool=pool)],
                                           pool=pool, priority_class="train"))
        wait_for("train running", lambda: len(running(ray_pods(core, namespace, "train")))
                 == 3, timeout=60, detail=lambda: describe(core, namespace))
        first = {p.metadata.name: p.metadata.uid for p in ray_pods(core, namespace, "train")}

        create(api, namespace, ray_cluster("build", leaf, [worker_group("gpu", 2, pool=pool)],
                                           pool=pool, priority_class="build"))
        wait_for("build running", lambda: len(running(ray_pods(core, namespace, "build")))
                 == 3, timeout=60, detail=lambda: describe(core, namespace) + "\n"
                 + kai_scheduler.log_tail())
        # the whole train gang went, head included, never a part of it
        live_uids = {p.metadata.uid for p in core.list_namespaced_pod(namespace).items}
        assert not set(first.values()) & live_uids, describe(core, namespace)
        wait_for("a Preempted event per train pod", lambda: set(first) <= {
            e.involved_object.name for e in core.list_namespaced_event(namespace).items
            if e.reason == "Preempted"}, timeout=10)

        # KubeRay re-creates the train cluster's pods; they wait, none bound
        wait_pods(core, namespace, "train", 3, timeout=60)
        wait_for("re-created train pods marked Unschedulable", lambda: all(
            _scheduled_condition(p) for p in ray_pods(core, namespace, "train")), timeout=30,
            detail=lambda: describe(core, namespace))
        again = ray_pods(core, namespace, "train")
        assert not {p.metadata.uid for p in again} & set(first.values())
        assert bound(again) == [], describe(core, namespace)

        delete(api, namespace, "RayCluster", "build")
        wait_for("train runs again once the build cluster is gone", lambda: len(running(
            ray_pods(core, namespace, "train"))) == 3, timeout=90,
            detail=lambda: describe(core, namespace) + "\n" + kai_scheduler.log_tail())
    finally:
        for name in ("train", "build"):
            delete(api, namespace, "RayCluster", name)
        delete_queues(api, created)


@pytest.mark.usefixtures("kuberay_operator")
def test_reclaim_gives_the_second_queue_its_share_from_elastic_workers(
        cluster, namespace, kai_scheduler) -> None:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 1, gpus=4)
    suffix = namespace[-5:]
    dept, qa, qb = f"d-{suffix}", f"qa-{suffix}", f"qb-{suffix}"
    created = create_queues(api, queue(dept), queue(qa, dept, gpu_quota=2),
                            queue(qb, dept, gpu_quota=2))
    try:
        # queue A's cluster takes the whole idle pool: a gang of head + 2, and 2 elastic workers
        create(api, namespace, ray_cluster("a", qa, [worker_group("gpu", 4, min_replicas=2,
                                                                  pool=pool)], pool=pool))
        wait_for("A on all 4 GPUs", lambda: len(running(ray_pods(core, namespace, "a"))) == 5,
                 timeout=60, detail=lambda: describe(core, namespace))
        head_a = ray_pods(core, namespace, "a", group="headgroup")[0].metadata.uid

        create(api, namespace, ray_cluster("b", qb, [worker_group("gpu", 2, pool=pool)],
                                           pool=pool))
        wait_for("B gets its share (head + 2 one-GPU workers)", lambda: len(running(
            ray_pods(core, namespace, "b"))) == 3, timeout=60,
            detail=lambda: describe(core, namespace) + "\n" + kai_scheduler.log_tail())
        a_pods = ray_pods(core, namespace, "a")
        # A keeps its gang (the same head, 2 workers); KubeRay re-created the 2 reclaimed
        # workers, which wait
        assert len(running(a_pods)) == 3, describe(core, namespace)
        assert ray_pods(core, namespace, "a", group="headgroup")[0].metadata.uid == head_a
        wait_for("A's re-created workers pending", lambda: len(
            ray_pods(core, namespace, "a")) == 5, timeout=30)
        assert len(bound(ray_pods(core, namespace, "a"))) == 3
        wait_for("two pods' reclaim events", lambda: len({
            e.involved_object.name for e in core.list_namespaced_event(namespace).items
            if e.reason in ("Reclaimed", "Preempted", "Evict")
            and e.involved_object.kind == "Pod"}) >= 2, timeout=10)
        events = core.list_namespaced_event(namespace).items
        reclaimed = [e for e in events if e.reason in ("Reclaimed", "Preempted", "Evict")
                     and e.involved_object.kind == "Pod"]
        assert len({e.involved_object.name for e in reclaimed}) == 2, [
            (e.reason, e.involved_object.name, e.message) for e in reclaimed]
    finally:
        for name in ("a", "b"):
            delete(api, namespace, "RayCluster", name)
        delete_queues(api, created)
