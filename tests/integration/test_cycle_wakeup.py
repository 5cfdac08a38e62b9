"""New work starts the next scheduling cycle at once: with a cycle period of a minute, a new
gang and a new bare pod are still bound within seconds (the loop waits for its period only
while nothing arrives); and a gang whose last pod arrives starts a cycle without the pause
that lets a gang's pods arrive together."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kai_ray.controller.podgrouper import PodGrouper
from kai_ray.controller.scheduler_loop import LoopConfig, SchedulerLoop
from kai_ray.grouping import GroupingConfig
from kai_ray.k8s import convert
from kai_ray.k8s.cache import ClusterCache
from tests.integration.helpers import (
    create_queues,
    delete_queues,
    pod,
    podgroup,
    pool_nodes,
    queue,
    wait_for,
)

pytestmark = pytest.mark.integration
SCHEDULER = "wakeup-scheduler"  # not the session's kai-ray: this test's loop alone places them
PERIOD_S = 60.0


def _running_loop(cluster: Any, monkeypatch: pytest.MonkeyPatch,
                  config: LoopConfig) -> Iterator[SchedulerLoop]:
    monkeypatch.setattr(convert, "SCHEDULER_NAME", SCHEDULER)
    api = cluster.api_client()
    cache = ClusterCache(api)
    cache.start()
    loop = SchedulerLoop(api, cache, config)
    loop.grouper = PodGrouper(api, cache, loop.events, GroupingConfig(scheduler_name=SCHEDULER))
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        wait_for("the first cycle", lambda: loop.cycles >= 1, timeout=30)
        yield loop
    finally:
        loop.stop()
        thread.join(10)
        cache.stop()
        loop.grouper.pool.shutdown(wait=False)


@pytest.fixture
def slow_loop(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[SchedulerLoop]:
    yield from _running_loop(cluster, monkeypatch, LoopConfig(period_s=PERIOD_S))


@pytest.fixture
def pausing_loop(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[SchedulerLoop]:
    """A loop whose pause after an arrival is most of its period: what starts a cycle within
    seconds is a gang made whole."""
    yield from _running_loop(cluster, monkeypatch,
                             LoopConfig(period_s=PERIOD_S, min_period_s=PERIOD_S / 2))


def _pod(name: str, queue_name: str, selector: dict, annotations: dict | None = None) -> dict:
    body = pod(name, queue_name, node_selector=selector, annotations=annotations)
    body["spec"]["schedulerName"] = SCHEDULER
    return body


def _bound(core: client.CoreV1Api, ns: str, names: list[str]) -> bool:
    return all(core.read_namespaced_pod(n, ns).spec.node_name for n in names)


def _gang(api: Any, ns: str, queue_name: str, size: int) -> tuple[list[str], Any]:
    """A PodGroup g of `size`; its pods' names and a function that creates one of them."""
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "scheduling.run.ai", "v2alpha2", ns, "podgroups", podgroup("g", queue_name, size))
    pool, _ = pool_nodes(api, 1, gpus=8)
    sel = {"kai-ray.io/pool": pool}

    def create(name: str) -> None:
        client.CoreV1Api(api).create_namespaced_pod(
            ns, _pod(name, queue_name, sel, {"pod-group-name": "g"}))
    return [f"g-{i}" for i in range(size)], create


def test_a_new_gang_and_a_new_bare_pod_do_not_wait_for_the_period(cluster, namespace,
                                                                  slow_loop):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    q = create_queues(api, queue(f"wake-{namespace[-5:]}"))
    try:
        pool, _ = pool_nodes(api, 1, gpus=8)
        sel = {"kai-ray.io/pool": pool}
        time.sleep(1.0)  # the loop is in its minute-long wait now
        cycles = slow_loop.cycles
        start = time.monotonic()
        names, create = _gang(api, namespace, q[0], 4)
        for n in names:
            create(n)
        wait_for("the gang bound", lambda: _bound(core, namespace, names), timeout=PERIOD_S / 3)
        took = time.monotonic() - start
        assert took < PERIOD_S / 4, f"the gang waited {took:.1f}s: it waited for the period"
        assert slow_loop.cycles > cycles

        start = time.monotonic()
        core.create_namespaced_pod(namespace, _pod("bare", q[0], sel))
        wait_for("the bare pod bound", lambda: _bound(core, namespace, ["bare"]),
                 timeout=PERIOD_S / 3)
        took = time.monotonic() - start
        assert took < PERIOD_S / 4, f"the bare pod waited {took:.1f}s: it waited for the period"
    finally:
        delete_queues(api, q)


def test_a_gang_made_whole_starts_a_cycle_without_the_pause(cluster, namespace, pausing_loop):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    q = create_queues(api, queue(f"whole-{namespace[-5:]}"))
    try:
        time.sleep(1.0)
        names, create = _gang(api, namespace, q[0], 3)
        cycles = pausing_loop.cycles
        for n in names[:2]:
            create(n)
        time.sleep(2.0)  # two of three: the loop pauses (half a minute), no cycle yet
        assert pausing_loop.cycles == cycles
        start = time.monotonic()
        create(names[2])
        wait_for("the gang bound", lambda: _bound(core, namespace, names), timeout=PERIOD_S / 3)
        took = time.monotonic() - start
        assert took < PERIOD_S / 6, f"the gang waited {took:.1f}s after its last pod"
    finally:
        delete_queues(api, q)
