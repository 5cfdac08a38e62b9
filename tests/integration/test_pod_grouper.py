"""The pod grouper against the real control plane: only pod events that can change grouping
wake its thread (binds and status updates do not), and the pods of one gang that arrive together
(a ReplicaSet's, created at once by the controller manager) write their PodGroup once per pass,
not once per pod (one create answered, the rest refused 409 and then read and replaced)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kai_ray.api_names import PODGROUP
from kai_ray.controller.podgrouper import PodGrouper
from kai_ray.controller.scheduler_loop import LoopConfig, SchedulerLoop
from kai_ray.grouping import GroupingConfig
from kai_ray.k8s import convert, rawapi
from kai_ray.k8s.cache import ClusterCache
from kai_ray.k8s.events import EventRecorder
from kai_ray.testing.cluster import Cluster

from .helpers import wait_for

GANG = 8
# a scheduler name of these tests' own: a `kai-ray run` of other tests (the session's
# kai_scheduler) must not group or bind these pods, nor count in what is measured here
SCHEDULER = "kai-ray-grouper-test"


class CountingClient(client.ApiClient):
    """Every request's method, URL and answer status, as the API server answered them."""

    def __init__(self, configuration: client.Configuration) -> None:
        super().__init__(configuration)
        self.calls: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        resp = super().call_api(method, url, *args, **kwargs)
        with self._lock:
            self.calls.append((method, url, resp.status))
        return resp

    def podgroup_calls(self, namespace: str) -> list[tuple[str, int]]:
        prefix = f"/namespaces/{namespace}/{PODGROUP.plural}"
        with self._lock:
            return [(m, s) for m, u, s in self.calls if prefix in u]


@pytest.fixture
def grouper(cluster: Cluster, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[tuple[PodGrouper, ClusterCache, CountingClient]]:
    monkeypatch.setattr(convert, "SCHEDULER_NAME", SCHEDULER)  # what the cache calls ours
    api = CountingClient(cluster.api_client().configuration)
    cache = ClusterCache(cluster.api_client())
    cache.start()
    g = PodGrouper(api, cache, EventRecorder(cluster.api_client()),
                   GroupingConfig(scheduler_name=SCHEDULER), workers=GANG)
    yield g, cache, api
    cache.stop()
    if g.ray_watch is not None:
        g.ray_watch.stop()
    g.pool.shutdown(wait=False)


def _stable(what: str, count: Any, quiet_s: float = 1.0, timeout: float = 30) -> int:
    """`count()` once it has not moved for `quiet_s`."""
    last, since = count(), time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"{what} still moving after {timeout}s"
        time.sleep(0.1)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
    return int(last)


def test_binding_pods_does_not_wake_the_grouper(cluster: Cluster, gpu_nodes: list[str],
                                                namespace: str, grouper: Any) -> None:
    g, cache, _ = grouper
    passes: list[float] = []
    run_once = g.run_once

    def counting() -> int:
        passes.append(time.monotonic())
        return int(run_once())

    g.run_once = counting
    # a long period: every pass after the first is a wake-up by a pod event
    loop = SchedulerLoop(cluster.api_client(), cache, LoopConfig(period_s=300.0))
    loop.grouper = g
    thread = threading.Thread(target=loop._group_forever, args=(None,), daemon=True)
    thread.start()
    try:
        core = client.CoreV1Api(cluster.api_client())
        names = [f"p{i}" for i in range(4)]
        for name in names:
            core.create_namespaced_pod(namespace, {
                "metadata": {"name": name, "labels": {"kai.scheduler/queue": "default-queue"}},
                "spec": {"schedulerName": SCHEDULER, "containers": [{
                    "name": "main", "image": "busybox",
                    "resources": {"requests": {"cpu": "10m"}}}]}})

        def grouped() -> bool:
            pods = [cache.pods.get(f"{namespace}/{n}") for n in names]
            return all(p and "pod-group-name" in (p["metadata"].get("annotations") or {})
                       for p in pods)

        wait_for("the new pods grouped (woken, not by the 300 s period)", grouped, timeout=30)
        before = _stable("grouper passes", lambda: len(passes))

        for i, name in enumerate(names):
            rawapi.bind(cluster.api_client(), namespace, name, None, gpu_nodes[i % 2])
        wait_for("the bound pods Running in the cache", lambda: all(
            (cache.pods.get(f"{namespace}/{n}") or {}).get("status", {}).get("phase")
            == "Running" for n in names), timeout=60)
        time.sleep(1.0)  # room for a wake-up to show
        assert len(passes) == before, \
            f"binds and status updates woke the grouper {len(passes) - before} times"

        # the count can move: a label change may regroup, so it wakes the grouper
        core.patch_namespaced_pod(names[0], namespace, {"metadata": {"labels": {"x": "y"}}})
        wait_for("a pass after a label change", lambda: len(passes) > before, timeout=10)
    finally:
        loop.stop()
        thread.join(5)


def _replica_set(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
            "spec": {"replicas": GANG, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "schedulerName": SCHEDULER,
                         "containers": [{"name": "main", "image": "busybox",
                                         "resources": {"requests": {"cpu": "10m"}}}]}}}}


def test_a_gang_arriving_together_creates_its_podgroup_once(cluster: Cluster, namespace: str,
                                                            grouper: Any) -> None:
    g, cache, api = grouper
    rs = client.AppsV1Api(cluster.api_client()).create_namespaced_replica_set(
        namespace, _replica_set("gang"))
    wait_for(f"the cache to hold the {GANG} pods",
             lambda: len([p for p in cache.pods.values()
                          if p["metadata"]["namespace"] == namespace]) == GANG, timeout=60)
    assert g.run_once() == GANG  # all eight in one pass

    pg_name = f"pg-gang-{rs.metadata.uid}"
    calls = api.podgroup_calls(namespace)
    creates = [s for m, s in calls if m == "POST"]
    conflicts = [s for m, s in calls if s == 409]
    summary = f"{len(creates)} creates, {len(conflicts)} answered 409, all: {calls}"
    assert calls == [("POST", 201)], summary  # one create; no 409, no read, no replace
    core = client.CoreV1Api(cluster.api_client())
    pods = core.list_namespaced_pod(namespace).items
    assert len(pods) == GANG
    assert {p.metadata.annotations.get("pod-group-name") for p in pods} == {pg_name}
    pg = client.CustomObjectsApi(cluster.api_client()).get_namespaced_custom_object(
        "scheduling.run.ai", "v2alpha2", namespace, PODGROUP.plural, pg_name)
    assert pg["metadata"]["ownerReferences"][0]["uid"] == rs.metadata.uid
