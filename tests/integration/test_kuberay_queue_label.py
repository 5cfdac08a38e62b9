"""A RayCluster without the kai.scheduler/queue label. KubeRay v1.6.2 only logs "Queue label
missing from parent; child will remain pending" and creates the pods without it. kai-ray tells
the user on the pods (a PodGrouperWarning event naming the label and the RayCluster), uses the
default queue (`default-queue`, as KAI) and, while that queue does not exist, says so on the
pods, the PodGroup and the RayCluster; with the default queue present the cluster runs. A queue
label on the namespace (kai-ray's extension) is used before the default."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.integration.helpers import (
    Q,
    create_queues,
    delete_queues,
    pool_nodes,
    queue,
    scheduled_condition,
    wait_for,
)
from tests.integration.kuberay_helpers import (
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
DATA = Path(__file__).parent / "data"


def _queue_exists(custom: client.CustomObjectsApi, name: str) -> bool:
    try:
        custom.get_cluster_custom_object(*Q, name)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _events(core: client.CoreV1Api, namespace: str, kind: str, name: str, reason: str) -> list:
    return [e for e in core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind}").items
        if e.involved_object.name == name and e.reason == reason]


@pytest.mark.usefixtures("kuberay_operator")
def test_raycluster_without_queue_label_is_told_and_runs_in_the_default_queue(
        cluster, namespace, kai_scheduler) -> None:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    pool, _ = pool_nodes(api, 1, gpus=1)
    detail = lambda: describe(core, namespace) + "\n" + kai_scheduler.log_tail()  # noqa: E731
    added: list[str] = []
    try:
        create(api, namespace, ray_cluster("nolabel", None, [worker_group("gpu", 1, pool=pool)],
                                           pool=pool))
        pods = wait_pods(core, namespace, "nolabel", 2)
        assert all("kai.scheduler/queue" not in (p.metadata.labels or {}) for p in pods)
        warning = wait_for("a PodGrouperWarning on the head", lambda: _events(
            core, namespace, "Pod", ray_pods(core, namespace, "nolabel", "headgroup")[0]
            .metadata.name, "PodGrouperWarning"), timeout=30, detail=detail)[0]
        assert "kai.scheduler/queue" in warning.message
        assert f"RayCluster {namespace}/nolabel" in warning.message
        assert "default queue 'default-queue'" in warning.message
        pg = wait_for("the PodGroup", lambda: podgroup_of(api, namespace, ray_pods(
            core, namespace, "nolabel")[0]), timeout=30)
        assert pg["spec"]["queue"] == "default-queue"

        if not _queue_exists(custom, "default-queue"):
            # nothing silent: the pods, the PodGroup and the RayCluster say what is wrong
            for p in ray_pods(core, namespace, "nolabel"):
                cond = wait_for(f"{p.metadata.name}: Unschedulable condition",
                                lambda n=p.metadata.name: scheduled_condition(
                                    core, namespace, n), timeout=30, detail=detail)
                assert "QueueDoesNotExist" in cond.message and "default-queue" in cond.message
            rc_events = wait_for("the RayCluster's Unschedulable event", lambda: _events(
                core, namespace, "RayCluster", "nolabel", "Unschedulable"), timeout=30)
            assert "Queue 'default-queue' does not exist" in rc_events[0].message
            for doc in yaml.safe_load_all((DATA / "kai-default-queues.yaml").read_text()):
                if not _queue_exists(custom, doc["metadata"]["name"]):
                    custom.create_cluster_custom_object(*Q, doc)
                    added.append(doc["metadata"]["name"])
        wait_for("the cluster runs in the default queue", lambda: len(running(ray_pods(
            core, namespace, "nolabel"))) == 2, timeout=60, detail=detail)
    finally:
        delete(api, namespace, "RayCluster", "nolabel")
        delete_queues(api, list(reversed(added)))


@pytest.mark.usefixtures("kuberay_operator")
def test_namespace_queue_label_is_used_before_the_default(cluster, namespace,
                                                          kai_scheduler) -> None:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    pool, _ = pool_nodes(api, 1, gpus=1)
    qname = f"nsq-{namespace[-5:]}"
    created = create_queues(api, queue(qname))
    core.patch_namespace(namespace, {"metadata": {"labels": {"kai.scheduler/queue": qname}}})
    try:
        create(api, namespace, ray_cluster("nslabel", None, [worker_group("gpu", 1, pool=pool)],
                                           pool=pool))
        wait_for("the cluster runs", lambda: len(running(ray_pods(
            core, namespace, "nslabel"))) == 2, timeout=60,
            detail=lambda: describe(core, namespace) + "\n" + kai_scheduler.log_tail())
        pg = podgroup_of(api, namespace, ray_pods(core, namespace, "nslabel")[0])
        assert pg["spec"]["queue"] == qname
    finally:
        delete(api, namespace, "RayCluster", "nslabel")
        delete_queues(api, created)
