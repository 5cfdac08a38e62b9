"""A pod whose owner cannot be read is grouped anyway, or told why; never silently dropped.

The API server accepts any ownerReference, so a pod can name an owner of a kind nobody serves
(apiVersion example.com/v1, kind Widget). With `kai-ray run` up, such a pod must get a PodGroup
or a PodGrouperWarning that names the reference within seconds; the in-process grouper also
shows that the rest of its pass is grouped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kai_ray.controller.podgrouper import PodGrouper
from kai_ray.grouping import GroupingConfig
from kai_ray.k8s import convert
from kai_ray.k8s.cache import ClusterCache
from kai_ray.k8s.events import EventRecorder
from kai_ray.testing.cluster import Cluster
from kai_ray.testing.scheduler_process import KaiRayProcess

from .helpers import PG, pod, wait_for

pytestmark = pytest.mark.integration

WIDGET_REF = {"apiVersion": "example.com/v1", "kind": "Widget", "name": "w1",
              "uid": "0b6c7a52-7d4c-4b35-9d0e-1f2a3b4c5d6e", "controller": True}


def _owned_by_a_widget(name: str, scheduler: str | None = None) -> dict[str, Any]:
    p = pod(name, cpu="10m", memory="16Mi")
    p["metadata"]["ownerReferences"] = [WIDGET_REF]
    if scheduler:
        p["spec"]["schedulerName"] = scheduler
    return p


def _warnings(core: client.CoreV1Api, ns: str, name: str) -> list[str]:
    return [e.message or "" for e in core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}").items
        if e.reason == "PodGrouperWarning"]


def _podgroup_of(core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str, name: str
                 ) -> dict[str, Any] | None:
    annotations = core.read_namespaced_pod(name, ns).metadata.annotations or {}
    group = annotations.get("pod-group-name")
    if not group:
        return None
    found: dict[str, Any] = custom.get_namespaced_custom_object(PG[0], PG[1], ns, PG[2], group)
    return found


def test_kai_ray_groups_a_pod_whose_owner_kind_does_not_exist(
        cluster: Cluster, namespace: str, kai_scheduler: KaiRayProcess) -> None:
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    created = core.create_namespaced_pod(namespace, _owned_by_a_widget("widget-pod"))
    t0 = time.monotonic()

    def grouped_or_told() -> bool:
        return bool(_podgroup_of(core, custom, namespace, "widget-pod")
                    or _warnings(core, namespace, "widget-pod"))

    wait_for("a PodGroup or a PodGrouperWarning for the Widget-owned pod", grouped_or_told,
             timeout=15, detail=kai_scheduler.log_tail)
    assert time.monotonic() - t0 < 15
    # both, in fact: grouped by the pod itself, and told which reference could not be read
    pg = wait_for("its PodGroup", lambda: _podgroup_of(core, custom, namespace, "widget-pod"),
                  timeout=15, detail=kai_scheduler.log_tail)
    assert pg["metadata"]["name"] == f"pg-widget-pod-{created.metadata.uid}"
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    told = wait_for("the warning", lambda: [m for m in _warnings(core, namespace, "widget-pod")
                                            if "Widget w1" in m], timeout=15)
    assert "example.com/v1" in told[0] and "serves no such kind" in told[0], told


SCHEDULER = "kai-ray-grouper-faults-test"


@pytest.fixture
def grouper(cluster: Cluster, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[tuple[PodGrouper, ClusterCache]]:
    # a scheduler name of its own: the session's `kai-ray run` must not group these pods
    monkeypatch.setattr(convert, "SCHEDULER_NAME", SCHEDULER)
    cache = ClusterCache(cluster.api_client())
    cache.start()
    g = PodGrouper(cluster.api_client(), cache, EventRecorder(cluster.api_client()),
                   GroupingConfig(scheduler_name=SCHEDULER))
    yield g, cache
    cache.stop()
    if g.ray_watch is not None:
        g.ray_watch.stop()
    g.pool.shutdown(wait=False)


def test_an_unreadable_owner_does_not_cost_the_rest_of_the_pass(
        cluster: Cluster, namespace: str, grouper: tuple[PodGrouper, ClusterCache]) -> None:
    g, cache = grouper
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespaced_pod(namespace, _owned_by_a_widget("a-widget-pod", SCHEDULER))
    plain = pod("b-plain", cpu="10m", memory="16Mi")
    plain["spec"]["schedulerName"] = SCHEDULER
    core.create_namespaced_pod(namespace, plain)
    wait_for("both pods in the cache", lambda: all(
        cache.pods.get(f"{namespace}/{n}") is not None for n in ("a-widget-pod", "b-plain")),
        timeout=30)
    assert g.run_once() == 2  # one pass, both grouped
    assert g.retry == {}
    for name in ("a-widget-pod", "b-plain"):
        assert _podgroup_of(core, custom, namespace, name) is not None
    g.events.flush()
    told = _warnings(core, namespace, "a-widget-pod")
    assert any("ownerReference Widget w1 (apiVersion example.com/v1)" in m for m in told), told
