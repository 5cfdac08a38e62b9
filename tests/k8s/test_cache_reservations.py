"""The watch cache's view of GPU reservation pods: a live one stands for its shared device (its
GPU is not counted twice while a readable pod shares it); a terminating one still holds its GPU
on the node."""

from __future__ import annotations

from kubernetes import client

from kai_ray import api_names
from kai_ray.k8s import convert
from kai_ray.k8s.cache import ClusterCache
from kai_ray.testing.nodes import gpu_node_manifest


def _reservation(name: str, deleting: bool) -> dict:
    meta: dict = {"name": name, "namespace": api_names.RESERVATION_NAMESPACE, "uid": name,
                  "labels": {api_names.GPU_GROUP_LABEL: f"group-{name}"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running"},
            "spec": {"nodeName": "n0", "containers": [{"name": "reservation", "resources": {
                "limits": {convert.GPU: "1"}, "requests": {convert.GPU: "1"}}}]}}


def _sharer(group: str) -> dict:
    """A running pod of PodGroup "pg" with half of the device `group`."""
    return {"metadata": {"name": f"sharer-{group}", "namespace": "ns", "uid": group,
                         "labels": {api_names.GPU_GROUP_LABEL: group},
                         "annotations": {"pod-group-name": "pg", "gpu-fraction": "0.5"}},
            "status": {"phase": "Running"},
            "spec": {"nodeName": "n0", "schedulerName": api_names.SCHEDULER_NAME,
                     "containers": [{"name": "c"}]}}


def _foreign_gpus(*pods: dict) -> int:
    cache = ClusterCache(client.ApiClient(client.Configuration()))
    cache.nodes.items = {"n0": gpu_node_manifest("n0", 0, 2)}
    cache.pods.items = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    cache.podgroups.items = {"ns/pg": {"metadata": {"name": "pg", "namespace": "ns"},
                                       "spec": {"queue": "q"}}}
    snapshot, problems, _ = cache.snapshot()
    assert not problems
    (node,) = snapshot.nodes
    return node.foreign_gpus


def test_a_live_reservation_pod_is_not_foreign_use() -> None:
    assert _foreign_gpus(_reservation("live", deleting=False), _sharer("group-live")) == 0


def test_a_live_reservation_pod_no_readable_pod_shares_is_foreign_use() -> None:
    assert _foreign_gpus(_reservation("live", deleting=False)) == 1


def test_a_terminating_reservation_pod_still_holds_its_gpu() -> None:
    assert _foreign_gpus(_reservation("live", deleting=False), _sharer("group-live"),
                         _reservation("going", deleting=True)) == 1


def test_the_configured_reservation_namespace_is_where_reservations_are_read() -> None:
    """A reservation pod counts as one only in the namespace the scheduler is configured with
    (reservation.namespace); elsewhere it is a foreign pod holding a GPU."""
    def foreign(cache_ns: str) -> int:
        res = _reservation("live", deleting=False)
        res["metadata"]["namespace"] = "gpu-holders"
        cache = ClusterCache(client.ApiClient(client.Configuration()),
                             reservation_namespace=cache_ns)
        cache.nodes.items = {"n0": gpu_node_manifest("n0", 0, 2)}
        cache.pods.items = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
                            for p in (res, _sharer("group-live"))}
        cache.podgroups.items = {"ns/pg": {"metadata": {"name": "pg", "namespace": "ns"},
                                           "spec": {"queue": "q"}}}
        (node,) = cache.snapshot()[0].nodes
        return node.foreign_gpus

    assert foreign("gpu-holders") == 0
    assert foreign(api_names.RESERVATION_NAMESPACE) == 1
