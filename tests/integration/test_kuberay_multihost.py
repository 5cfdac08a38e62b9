"""Multi-host worker groups (numOfHosts > 1): one replica is several pods that only make sense
together. The gang minimum counts hosts, and a replica above the minimum is placed whole or not
at all (KubeRay labels its pods ray.io/worker-group-replica-name)."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

from tests.integration.helpers import create_queues, delete_queues, pool_nodes, queue, wait_for
from tests.integration.kuberay_helpers import (
    autoscaler_scale,
    bound,
    create,
    delete,
    describe,
    podgroup_of,
    ray_cluster,
    ray_pods,
    running,
    wait_pods,
    worker_group,
)

pytestmark = [pytest.mark.integration, pytest.mark.kuberay, pytest.mark.timeout(240)]
CYCLE_S = 1.0
REPLICA_LABEL = "ray.io/worker-group-replica-name"


@pytest.mark.usefixtures("kuberay_operator")
def test_new_multi_host_replica_binds_whole_or_not_at_all(cluster, namespace,
                                                          kai_scheduler) -> None:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 1, gpus=3)  # the minimum replica takes 2, one GPU stays free
    qname = f"mh-{namespace[-5:]}"
    created = create_queues(api, queue(qname))
    detail = lambda: describe(core, namespace) + "\n" + kai_scheduler.log_tail()  # noqa: E731
    try:
        create(api, namespace, ray_cluster("multi", qname, [worker_group(
            "tpu", 1, min_replicas=1, max_replicas=3, hosts=2, pool=pool)], pool=pool))
        wait_for("head + one 2-host replica running", lambda: len(running(ray_pods(
            core, namespace, "multi"))) == 3, timeout=60, detail=detail)
        first = ray_pods(core, namespace, "multi", group="tpu")
        assert len({p.metadata.labels[REPLICA_LABEL] for p in first}) == 1
        pg = podgroup_of(api, namespace, first[0])
        assert pg["spec"]["minMember"] == 3  # 1 head + 1 replica x 2 hosts
        # KubeRay creates a replica's pods one by one: the grouper records how many make one
        assert json.loads(pg["metadata"]["annotations"]["kai-ray.io/replica-hosts"]) == {"tpu": 2}

        autoscaler_scale(api, namespace, "multi", 0, 2)
        wait_pods(core, namespace, "multi", 5, timeout=30)
        new = [p for p in ray_pods(core, namespace, "multi", group="tpu")
               if p.metadata.uid not in {f.metadata.uid for f in first}]
        assert len(new) == 2 and len({p.metadata.labels[REPLICA_LABEL] for p in new}) == 1
        time.sleep(4 * CYCLE_S)  # room for one host only: neither may be bound
        pods = ray_pods(core, namespace, "multi")
        assert len(bound(pods)) == 3, describe(core, namespace)

        pool_nodes(api, 1, gpus=1, pool=pool, start=1)  # now room for both hosts
        wait_for("both hosts of the new replica bound", lambda: len(bound(ray_pods(
            core, namespace, "multi"))) == 5, timeout=30, detail=detail)
    finally:
        delete(api, namespace, "RayCluster", "multi")
        delete_queues(api, created)
