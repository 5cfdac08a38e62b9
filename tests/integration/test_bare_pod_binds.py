"""A bare pod is bound before its PodGroup is written (kai_ray.k8s.provisional): two writes on
its way to the node, as kube-scheduler's, and still everything KAI's users read once it runs.
Counted from the API server's own metrics."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from kai_ray.api_names import LAST_START_ANNOTATION
from kai_ray.testing import apimetrics
from tests.integration.helpers import (
    create_queues,
    delete_queues,
    pod,
    pool_nodes,
    queue,
    scheduled_condition,
    wait_for,
)

pytestmark = pytest.mark.integration
PODS = 12


def _podgroup(custom: client.CustomObjectsApi, ns: str, name: str) -> dict | None:
    try:
        return custom.get_namespaced_custom_object("scheduling.run.ai", "v2alpha2", ns,
                                                   "podgroups", name)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_a_bare_pod_is_bound_with_its_podgroup_named_and_the_podgroup_follows(
        cluster, namespace, kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    q = create_queues(api, queue(f"bare-{namespace[-5:]}"))
    try:
        pool, _ = pool_nodes(api, 1, gpus=8)
        before = apimetrics.request_totals(api)
        names = [f"bare-{i}" for i in range(PODS)]
        for n in names:
            core.create_namespaced_pod(namespace, pod(n, q[0], gpus=0,
                                                      node_selector={"kai-ray.io/pool": pool}))

        def bound() -> list[dict] | None:
            pods = [core.read_namespaced_pod(n, namespace).to_dict() for n in names]
            return pods if all(p["spec"]["node_name"] for p in pods) else None

        pods = wait_for("every bare pod bound", bound, timeout=60, detail=kai_scheduler.log_tail)
        for p in pods:  # the annotation came with the Binding
            m = p["metadata"]
            assert m["annotations"]["pod-group-name"] == f"pg-{m['name']}-{m['uid']}"

        def podgroups() -> list[dict] | None:
            pgs = [_podgroup(custom, namespace, p["metadata"]["annotations"]["pod-group-name"])
                   for p in pods]
            return pgs if all(pgs) else None  # type: ignore[return-value]

        pgs = wait_for("each bound pod's PodGroup", podgroups, timeout=30,
                       detail=kai_scheduler.log_tail)
        for pg in pgs:
            assert pg["spec"]["minMember"] == 1 and pg["spec"]["queue"] == q[0]
            assert LAST_START_ANNOTATION in pg["metadata"]["annotations"]  # stamped on create
        time.sleep(2)  # late writes (a regrouping pass, a stamp) would land by now
        diff = apimetrics.difference(apimetrics.request_totals(api), before)
        # the grouper never patched the pods, nor any PodGroup: each pod cost one Binding and
        # one PodGroup create (and its event)
        assert diff.get(("PATCH", "pods", ""), 0) == 0, diff
        assert diff.get(("PATCH", "podgroups", ""), 0) == 0, diff
        assert diff.get(("PUT", "podgroups", ""), 0) == 0, diff
        assert diff.get(("POST", "podgroups", ""), 0) == PODS, diff
        assert diff.get(("POST", "pods", "binding"), 0) == PODS, diff
    finally:
        delete_queues(api, q)


def test_a_bare_pod_that_cannot_be_placed_gets_its_podgroup_and_says_why(
        cluster, namespace, kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    q = create_queues(api, queue(f"wait-{namespace[-5:]}"))
    try:
        core.create_namespaced_pod(namespace, pod("too-big", q[0], cpu="100000"))

        def grouped() -> dict | None:
            p = core.read_namespaced_pod("too-big", namespace)
            name = (p.metadata.annotations or {}).get("pod-group-name")
            pg = _podgroup(custom, namespace, name) if name else None
            return pg if pg and (pg.get("status") or {}).get("schedulingConditions") else None

        pg = wait_for("the waiting pod's PodGroup, with why it waits", grouped, timeout=60,
                      detail=kai_scheduler.log_tail)
        assert "cpu" in pg["status"]["schedulingConditions"][-1]["message"].lower()
        cond = scheduled_condition(core, namespace, "too-big")
        assert cond is not None and cond.status == "False" and cond.reason == "Unschedulable"
        assert LAST_START_ANNOTATION not in (pg["metadata"].get("annotations") or {})
    finally:
        delete_queues(api, q)
