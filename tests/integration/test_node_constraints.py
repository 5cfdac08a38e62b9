"""Taints, tolerations and required node affinity, end to end: `kai-ray run` against the real
control plane with KWOK GPU nodes (the pods' specs are what the API server stored)."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.integration.helpers import (
    create_queues,
    delete_queues,
    pod,
    pod_phase,
    pool_nodes,
    queue,
    scheduled_condition,
    wait_for,
)

pytestmark = pytest.mark.integration

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def test_taints_keep_pods_off_unless_tolerated_and_affinity_pins(cluster, namespace,
                                                                  kai_scheduler):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, (tainted, plain) = pool_nodes(api, 2, gpus=2)
    core.patch_node(tainted, {"spec": {"taints": [GPU_TAINT]}})
    qname = f"taints-{namespace[-5:]}"
    created = create_queues(api, queue(qname))
    selector = {"kai-ray.io/pool": pool}
    try:
        # three one-GPU pods without a toleration: two fit on the untainted node, the third
        # waits although the tainted node has two GPUs free
        for i in range(3):
            core.create_namespaced_pod(namespace, pod(f"plain-{i}", qname, gpus=1,
                                                      node_selector=selector))
        wait_for("two plain pods bound", lambda: sum(
            1 for i in range(3) if pod_phase(core, namespace, f"plain-{i}")[1]) == 2,
            detail=kai_scheduler.log_tail)
        nodes = {pod_phase(core, namespace, f"plain-{i}")[1] for i in range(3)}
        assert nodes == {plain, None}
        waiting = next(f"plain-{i}" for i in range(3)
                       if pod_phase(core, namespace, f"plain-{i}")[1] is None)
        cond = wait_for("the third plain pod's Unschedulable condition",
                        lambda: scheduled_condition(core, namespace, waiting),
                        detail=kai_scheduler.log_tail)
        assert "1 node(s) had untolerated taint {nvidia.com/gpu: present}" in cond.message, \
            cond.message

        # tolerating the taint lets a pod onto the tainted node; a required node affinity on
        # the node's name pins the other one there too
        tolerant = pod("tolerant", qname, gpus=1, node_selector=selector)
        tolerant["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists",
                                            "effect": "NoSchedule"}]
        pinned = pod("pinned", qname, gpus=1)
        pinned["spec"]["tolerations"] = tolerant["spec"]["tolerations"]
        pinned["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In",
                                  "values": [tainted]}]}]}}}
        core.create_namespaced_pod(namespace, pinned)
        core.create_namespaced_pod(namespace, tolerant)
        wait_for("the tolerant and the pinned pod bound", lambda: all(
            pod_phase(core, namespace, n)[1] for n in ("tolerant", "pinned")),
            detail=kai_scheduler.log_tail)
        assert pod_phase(core, namespace, "pinned")[1] == tainted
        assert pod_phase(core, namespace, "tolerant")[1] == tainted
        assert pod_phase(core, namespace, waiting)[1] is None
    finally:
        delete_queues(api, created)
