"""The binder's reservation pods: one name per (node, device group), whatever the lengths, and
found by KAI's group label (so a reservation pod KAI created is found too)."""

from __future__ import annotations

from kubernetes import client

from kai_ray import api_names
from kai_ray.k8s.binder import Binder, BinderConfig
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
    ns = api_names.RESERVATION_NAMESPACE

    def res(name: str, node: str, group: str, deleting: bool = False) -> dict:
        meta = {"name": name, "namespace": ns, "labels": {api_names.GPU_GROUP_LABEL: group}}
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


class _Core:
    """Records the reservation calls the binder makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def read_namespaced_service_account(self, name: str, namespace: str) -> None:
        self.calls.append(("read-sa", namespace, name))

    def create_namespaced_pod(self, namespace: str, body: dict) -> None:
        assert body["metadata"]["namespace"] == namespace
        self.calls.append(("create", namespace, body["metadata"]["name"]))

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self.calls.append(("delete", namespace, name))


def test_reservation_pods_live_in_the_configured_namespace() -> None:
    """reservation.namespace of the scheduler's config (BinderConfig) is where the binder
    creates, finds, and collects reservation pods, and checks their ServiceAccount."""
    api = client.ApiClient(client.Configuration())
    binder = Binder(api, EventRecorder(api), BinderConfig(reservation_namespace="gpu-holders"))
    core = _Core()
    binder.core = core  # type: ignore[assignment]
    binder._create_reservation("node-a", "g1")
    name = Binder.reservation_name("node-a", "g1")
    # the account found: nothing else is tried (the chart grants the scheduler only this read)
    assert core.calls == [("read-sa", "gpu-holders", "kai-ray-reservation"),
                          ("create", "gpu-holders", name)]
    pod = {"metadata": {"name": name, "namespace": "gpu-holders",
                        "labels": {"app": "kai-resource-reservation",
                                   api_names.GPU_GROUP_LABEL: "g1"}},
           "spec": {"nodeName": "node-a"}}
    assert binder._reservation("node-a", "g1", {f"gpu-holders/{name}": pod}) is pod
    binder._reservations = None
    assert binder._reservation("node-a", "g1", {
        f"{api_names.RESERVATION_NAMESPACE}/{name}": pod}) is None  # not where it looks
    # the same pod in the default namespace is none of its business
    stray = {**pod, "metadata": {**pod["metadata"], "namespace": api_names.RESERVATION_NAMESPACE}}
    assert binder.collect_reservations([stray]) == 0
    assert binder.collect_reservations([pod]) == 1  # no pod shares g1 any more
    assert core.calls[-1] == ("delete", "gpu-holders", name)
