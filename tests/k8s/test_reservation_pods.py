"""The binder's reservation pods: one name per (node, device group), whatever the lengths, and
found by KAI's group label (so a reservation pod KAI created is found too)."""

from __future__ import annotations

from kubernetes import client

from kai_ray.k8s import convert
from kai_ray.k8s.binder import Binder
from kai_ray.k8s.events import EventRecorder

LONG_NODES = ["gke-prod-default-pool-1a2b3c4d-x9z8",
              "ip-10-0-1-23.us-west-2.compute.internal", "n" * 63, "node-a"]


def test_every_node_and_group_gets_its_own_valid_name() -> None:
    names = set()
    for node in LONG_NODES:
        for k in range(12):
            name = Binder.reservation_name(node, f"{node}-gpu-{k}")
            assert len(name) <= 63 and name == name.lower() and name[-1].isalnum(), name
            names.add(name)
    assert len(names) == len(LONG_NODES) * 12
    assert Binder.reservation_name("node-a", "g") == Binder.reservation_name("node-a", "g")


def test_found_by_label_and_node_not_by_name() -> None:
    binder = Binder(client.ApiClient(client.Configuration()),
                    EventRecorder(client.ApiClient(client.Configuration())))
    ns = convert.RESERVATION_NAMESPACE

    def res(name: str, node: str, group: str, deleting: bool = False) -> dict:
        meta = {"name": name, "namespace": ns, "labels": {convert.GPU_GROUP_LABEL: group}}
        if deleting:
            meta["deletionTimestamp"] = "2026-11-26T00:00:00Z"
        return {"metadata": meta, "spec": {"nodeName": node}}

    pods = {f"{ns}/{p['metadata']['name']}": p for p in (
        res("runai-reservation-gpu-abcde", "node-a", "g1"),  # a name KAI would give it
        res("old", "node-a", "g2", deleting=True),
        res("elsewhere", "node-b", "g3"))}
    found = binder._reservation("node-a", "g1", pods)
    assert found is not None and found["metadata"]["name"] == "runai-reservation-gpu-abcde"
    assert binder._reservation("node-a", "g2", pods) is None  # terminating: not live
    assert binder._reservation("node-a", "g3", pods) is None  # another node's
