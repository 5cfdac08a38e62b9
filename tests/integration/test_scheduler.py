"""`kai-ray run` against the real control plane with KWOK GPU nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.integration.helpers import (
    create_queues,
    delete_queues,
    gang,
    pod,
    pod_phase,
    pool_nodes,
    queue,
    scheduled_condition,
    wait_for,
)

pytestmark = pytest.mark.integration
DATA = Path(__file__).parent / "data"


def _running(core: client.CoreV1Api, ns: str, names: list[str]) -> bool:
    return all(pod_phase(core, ns, n)[0] == "Running" for n in names)


def test_kai_quickstart_pods_run_and_share_a_device(cluster, gpu_nodes, namespace,
                                                      kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    for doc in yaml.safe_load_all((DATA / "kai-default-queues.yaml").read_text()):
        try:
            custom.create_cluster_custom_object("scheduling.run.ai", "v2", "queues", doc)
        except client.ApiException as e:
            assert e.status == 409
    # KAI's quick-start shapes: a whole GPU, two half GPUs, a gpu-memory request. They get a
    # node pool of their own: in this shared test cluster other tests leave partly used shared
    # devices behind, and packing onto those is right but would make this check ambiguous.
    pool, _ = pool_nodes(api, 1, gpus=4)
    sel = {"kai-ray.io/pool": pool}
    whole = pod("gpu-pod", "default-queue", gpus=1, node_selector=sel)
    halves = [pod(f"half-{i}", "default-queue", annotations={"gpu-fraction": "0.5"},
                  node_selector=sel) for i in range(2)]
    memory = pod("memory-pod", "default-queue", annotations={"gpu-memory": "2000"},
                 node_selector=sel)
    # the halves first: a gpu-memory pod that lands on a half's device first (0.5 + 2000 MiB)
    # rightly leaves no room there for the other half
    for p in (whole, *halves):
        core.create_namespaced_pod(namespace, p)
    wait_for("the whole-GPU and half-GPU pods Running", lambda: _running(
        core, namespace, ["gpu-pod", "half-0", "half-1"]), timeout=90,
        detail=kai_scheduler.log_tail)
    core.create_namespaced_pod(namespace, memory)
    names = ["gpu-pod", "half-0", "half-1", "memory-pod"]
    wait_for("all quick-start pods Running", lambda: _running(core, namespace, names),
             timeout=90, detail=kai_scheduler.log_tail)

    got = {n: core.read_namespaced_pod(n, namespace) for n in names}
    groups = {n: (got[n].metadata.labels or {}).get("runai-gpu-group") for n in names}
    assert groups["half-0"] and groups["half-0"] == groups["half-1"], groups
    assert got["half-0"].spec.node_name == got["half-1"].spec.node_name
    assert groups["memory-pod"] and groups["gpu-pod"] is None

    def env_of(name: str) -> dict[str, str]:
        prefix = got[name].metadata.annotations["runai/shared-gpu-configmap"]
        cms = [c for c in core.list_namespaced_config_map(namespace).items
               if c.metadata.name.startswith(prefix)]
        assert len(cms) == 1, [c.metadata.name for c in cms]
        return cms[0].data

    a, b = env_of("half-0"), env_of("half-1")
    assert a["NVIDIA_VISIBLE_DEVICES"] == b["NVIDIA_VISIBLE_DEVICES"] != ""
    assert a["GPU_PORTION"] == "0.50"
    mem = env_of("memory-pod")
    assert mem["KAI_RAY_GPU_MEMORY_LIMIT_MIB"] == "2000"
    # one reservation pod pins each shared device
    reservations = core.list_namespaced_pod("kai-resource-reservation",
                                            label_selector=f"runai-gpu-group={groups['half-0']}")
    assert len(reservations.items) == 1
    # events are written off the bind path: wait for them rather than read once
    wait_for("a Scheduled event per pod", lambda: {e.involved_object.name for e in
             core.list_namespaced_event(namespace, field_selector="reason=Scheduled").items}
             >= set(names), timeout=10)


def test_gang_waits_whole_then_binds_in_one_cycle(cluster, namespace, kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 1, gpus=4)
    qname = f"gang-{namespace[-5:]}"
    created = create_queues(api, queue(qname))
    try:
        names = gang(api, namespace, "train", qname, size=5, gpus=1,
                     node_selector={"kai-ray.io/pool": pool})
        cond = wait_for("an Unschedulable condition on the gang's pods",
                        lambda: scheduled_condition(core, namespace, names[0]),
                        detail=kai_scheduler.log_tail)
        assert cond.status == "False" and cond.reason == "Unschedulable"
        assert "gang" in cond.message and "5" in cond.message, cond.message
        # nothing of the gang may be bound while it cannot fit whole
        assert all(pod_phase(core, namespace, n)[1] is None for n in names)
        pool_nodes(api, 1, gpus=4, pool=pool, start=1)
        wait_for("all 5 gang pods bound", lambda: all(
            pod_phase(core, namespace, n)[1] for n in names), timeout=30,
            detail=kai_scheduler.log_tail)
        nodes = {pod_phase(core, namespace, n)[1] for n in names}
        assert nodes <= {f"{pool}-0", f"{pool}-1"}
    finally:
        delete_queues(api, created)


def _ensure_priority_classes(api: client.ApiClient) -> None:
    sched = client.SchedulingV1Api(api)
    for name, value in (("train", 50), ("build-preemptible", 75), ("build", 100),
                        ("inference", 125)):
        try:
            sched.create_priority_class({"metadata": {"name": name}, "value": value})
        except client.ApiException as e:
            assert e.status == 409


def test_build_preempts_train_in_a_limited_queue(cluster, namespace, kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    _ensure_priority_classes(api)
    pool, _ = pool_nodes(api, 1, gpus=1)
    parent, leaf = f"lp-{namespace[-5:]}", f"limited-{namespace[-5:]}"
    created = create_queues(api, queue(parent),
                            queue(leaf, parent, gpu_quota=1, gpu_limit=1, gpu_weight=1))
    sel = {"kai-ray.io/pool": pool}
    try:
        core.create_namespaced_pod(namespace, pod("train-pod", leaf, gpus=1, node_selector=sel,
                                                  priority_class="train"))
        wait_for("train pod running", lambda: pod_phase(core, namespace, "train-pod")[0]
                 == "Running", detail=kai_scheduler.log_tail)
        core.create_namespaced_pod(namespace, pod("build-pod", leaf, gpus=1, node_selector=sel,
                                                  priority_class="build"))
        wait_for("build pod running", lambda: pod_phase(core, namespace, "build-pod")[0]
                 == "Running", timeout=60, detail=kai_scheduler.log_tail)
        remaining = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
        assert "train-pod" not in remaining, "the train pod should have been preempted"
        wait_for("the Preempted event", lambda: any(
            e.reason == "Preempted" and "higher priority" in e.message
            for e in core.list_namespaced_event(namespace).items), timeout=10)
    finally:
        delete_queues(api, created)


def test_reclaim_returns_gpus_to_a_queue_below_its_share(cluster, namespace, kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 1, gpus=4)
    sel = {"kai-ray.io/pool": pool}
    suffix = namespace[-5:]
    dept, qa, qb = f"dept-{suffix}", f"qa-{suffix}", f"qb-{suffix}"
    created = create_queues(api, queue(dept), queue(qa, dept, gpu_quota=2, gpu_weight=1),
                            queue(qb, dept, gpu_quota=2, gpu_weight=1))
    try:
        for i in range(4):  # queue A takes the idle pool, over its quota of 2
            core.create_namespaced_pod(namespace, pod(f"a-{i}", qa, gpus=1, node_selector=sel))
        wait_for("queue A on all 4 GPUs", lambda: _running(core, namespace,
                                                           [f"a-{i}" for i in range(4)]),
                 detail=kai_scheduler.log_tail)
        for i in range(2):
            core.create_namespaced_pod(namespace, pod(f"b-{i}", qb, gpus=1, node_selector=sel))
        wait_for("queue B gets its share of 2 GPUs", lambda: _running(core, namespace,
                                                                      ["b-0", "b-1"]),
                 timeout=60, detail=kai_scheduler.log_tail)
        left = [p.metadata.name for p in core.list_namespaced_pod(namespace).items
                if p.metadata.name.startswith("a-") and not p.metadata.deletion_timestamp]
        assert len(left) == 2, left
    finally:
        delete_queues(api, created)


def test_bad_input_is_reported_and_the_rest_still_schedules(cluster, namespace, kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    pool, _ = pool_nodes(api, 1, gpus=2)
    sel = {"kai-ray.io/pool": pool}
    suffix = namespace[-5:]
    good, orphan = f"good-{suffix}", f"orphan-{suffix}"
    created = create_queues(api, queue(good), queue(orphan, parent=f"missing-{suffix}"))
    try:
        core.create_namespaced_pod(namespace, pod("orphaned", orphan, gpus=1, node_selector=sel))
        core.create_namespaced_pod(namespace, pod("unknown", f"nope-{suffix}", gpus=1,
                                                  node_selector=sel))
        core.create_namespaced_pod(namespace, pod("fine", good, gpus=1, node_selector=sel))
        wait_for("the good pod runs", lambda: pod_phase(core, namespace, "fine")[0] == "Running",
                 detail=kai_scheduler.log_tail)
        for name, queue_name in (("orphaned", orphan), ("unknown", f"nope-{suffix}")):
            cond = wait_for(f"{name}: Unschedulable condition",
                            lambda n=name: scheduled_condition(core, namespace, n))
            assert "QueueDoesNotExist" in cond.message and queue_name in cond.message
        status = wait_for("the orphan queue's Orphan condition", lambda: (
            custom.get_cluster_custom_object("scheduling.run.ai", "v2", "queues", orphan)
            .get("status") or {}).get("conditions"))
        assert status[0]["type"] == "Orphan" and f"missing-{suffix}" in status[0]["message"]
        assert kai_scheduler.alive()
    finally:
        delete_queues(api, created)


def test_two_processes_exactly_one_schedules_and_hands_over(cluster, namespace, kai_scheduler,
                                                            tmp_path):
    """The session's scheduler holds the Lease; a second `kai-ray run` waits. Killing the
    holder hands scheduling to the other within the lease duration (15 s) plus a cycle."""
    from kai_ray.testing.scheduler_process import KaiRayProcess

    api = cluster.api_client()
    core = client.CoreV1Api(api)
    coordination = client.CoordinationV1Api(api)
    holder = wait_for("a lease holder", lambda: coordination.read_namespaced_lease(
        "kai-ray-scheduler", "kube-system").spec.holder_identity)
    second = KaiRayProcess(cluster.kubeconfig, tmp_path)
    second.start()
    try:
        second.wait_ready()
        import time as _time
        _time.sleep(3)
        assert "became leader" not in second.log_tail(500), "two leaders at once"
        assert coordination.read_namespaced_lease(
            "kai-ray-scheduler", "kube-system").spec.holder_identity == holder
        kai_scheduler.kill()
        pool, _ = pool_nodes(api, 1, gpus=1)
        qname = f"ho-{namespace[-5:]}"
        created = create_queues(api, queue(qname))
        try:
            core.create_namespaced_pod(namespace, pod("after-handover", qname, gpus=1,
                                                      node_selector={"kai-ray.io/pool": pool}))
            wait_for("the second process schedules", lambda: pod_phase(
                core, namespace, "after-handover")[0] == "Running", timeout=40,
                detail=second.log_tail)
            assert "became leader" in second.log_tail(500)
        finally:
            delete_queues(api, created)
    finally:
        second.stop()
        kai_scheduler.start()  # later tests keep a scheduler
        kai_scheduler.wait_ready()


def test_same_named_podgroups_in_two_namespaces_each_schedule(cluster, namespace,
                                                              kai_scheduler):
    """A job is its namespace and name: two PodGroups named alike in two namespaces are two
    gangs that both bind, and each one's status lands on its own PodGroup."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    other = f"{namespace[:50]}-b"
    core.create_namespace({"metadata": {"name": other, "labels": {"kai-ray.io/test": "true"}}})
    cluster.wait_service_account(other)
    pool, _ = pool_nodes(api, 1, gpus=4)
    qname = f"same-{namespace[-5:]}"
    created = create_queues(api, queue(qname))
    where = {"kai-ray.io/pool": pool}
    both = (namespace, other)

    def conditions(ns: str, name: str) -> list:
        pg = custom.get_namespaced_custom_object("scheduling.run.ai", "v2alpha2", ns,
                                                 "podgroups", name)
        return (pg.get("status") or {}).get("schedulingConditions") or []

    def bound(ns: str, names: list[str]) -> bool:
        return all(pod_phase(core, ns, n)[1] for n in names)

    try:
        small = {ns: gang(api, ns, "same", qname, size=2, gpus=1, node_selector=where)
                 for ns in both}
        wait_for("both gangs named 'same' bound (4 of 4 GPUs)", lambda: all(
            bound(ns, small[ns]) for ns in both), timeout=30, detail=kai_scheduler.log_tail)
        big = {ns: gang(api, ns, "big", qname, size=1, gpus=3, node_selector=where)
               for ns in both}
        wait_for("each gang named 'big' has its own Unschedulable condition", lambda: all(
            conditions(ns, "big") for ns in both), timeout=30, detail=kai_scheduler.log_tail)
        for ns in both:  # room for one of them
            for n in small[ns]:
                core.delete_namespaced_pod(n, ns, grace_period_seconds=0)
        wait_for("one 'big' gang bound", lambda: any(bound(ns, big[ns]) for ns in both),
                 timeout=60, detail=kai_scheduler.log_tail)
        won, lost = both if bound(namespace, big[namespace]) else both[::-1]
        wait_for("the bound one's condition cleared", lambda: not conditions(won, "big"),
                 timeout=30, detail=kai_scheduler.log_tail)
        assert conditions(lost, "big"), "the waiting one's condition was cleared with it"
        assert not bound(lost, big[lost])
    finally:
        delete_queues(api, created)
        core.delete_namespace(other)


def test_forged_scheduler_annotations_are_ignored_without_the_webhook(cluster, namespace,
                                                                      kai_scheduler):
    """With no webhook to refuse them, a bind intent and a last-start stamp a user put on a
    bare pod never reach its PodGroup: the pod is placed by its own nodeSelector, not bound
    where the forged intent says, and min-runtime is not given a start in the future."""
    import json

    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    allowed, _ = pool_nodes(api, 1, gpus=1)
    _, (forbidden,) = pool_nodes(api, 1, gpus=1)
    qname = f"forge-{namespace[-5:]}"
    created = create_queues(api, queue(qname))
    try:
        forged = {"kai-ray.io/bind-intent": json.dumps({"forger": {"node": forbidden}}),
                  "kai.scheduler/last-start-timestamp": "2999-01-01T00:00:00Z"}
        core.create_namespaced_pod(namespace, pod("forger", qname, gpus=1, annotations=forged,
                                                  node_selector={"kai-ray.io/pool": allowed}))
        wait_for("the pod bound", lambda: pod_phase(core, namespace, "forger")[1], timeout=30,
                 detail=kai_scheduler.log_tail)
        assert pod_phase(core, namespace, "forger")[1] == f"{allowed}-0"
        group = core.read_namespaced_pod("forger", namespace).metadata.annotations[
            "pod-group-name"]
        pg = custom.get_namespaced_custom_object("scheduling.run.ai", "v2alpha2", namespace,
                                                 "podgroups", group)
        annotations = pg["metadata"].get("annotations") or {}
        assert "kai-ray.io/bind-intent" not in annotations
        assert annotations.get("kai.scheduler/last-start-timestamp") != "2999-01-01T00:00:00Z"
    finally:
        delete_queues(api, created)
