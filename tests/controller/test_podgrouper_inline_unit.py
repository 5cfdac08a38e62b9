"""A pass of the pod grouper registers a bare pod's PodGroup (kai_ray.k8s.provisional) in its
own thread: the pool is for pods whose grouping reads or writes through the API server."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kai_ray.k8s.provisional import WRITE, ProvisionalGroups
from tests.controller.test_podgrouper_faults_unit import RS, Rig, _pod


class _Pool:
    """The grouper's pool, recording the pods handed to it."""

    def __init__(self) -> None:
        self.inner = ThreadPoolExecutor(2)
        self.pods: list[str] = []

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Any:
        items = list(items)
        self.pods += [item[0] for item in items if isinstance(item, tuple)]  # pods, not names
        return self.inner.map(fn, items)

    def shutdown(self, wait: bool = True) -> None:
        self.inner.shutdown(wait=wait)


def test_bare_pods_are_registered_without_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = _pod("shared")
    shared["metadata"]["annotations"] = {"gpu-fraction": "0.5"}
    r = Rig(monkeypatch, _pod("bare-a"), _pod("bare-b"), shared, _pod("owned", owner=RS),
            owners={"rs": RS})
    r.cache.provisional = ProvisionalGroups()  # type: ignore[attr-defined]
    r.g.defer_bare_pods = True
    pool = _Pool()
    r.g.pool.shutdown()
    r.g.pool = pool  # type: ignore[assignment]
    try:
        _check(r, pool)
    finally:
        pool.shutdown()


def _check(r: Rig, pool: _Pool) -> None:
    assert r.g.run_once() == 4
    # registered, not written: in this thread
    view, by_pod = r.cache.provisional.view()  # type: ignore[attr-defined]
    assert sorted(by_pod) == ["ns/bare-a", "ns/bare-b"]
    assert all(view[job]["metadata"]["namespace"] == "ns" for job in by_pod.values())
    # a shared GPU needs its PodGroup written first; an owned pod reads its owner: the pool
    assert sorted(pool.pods) == ["ns/owned", "ns/shared"]
    assert len(r.podgroups) == 2 and set(r.patched) == {"owned", "shared"}
    assert not r.events.emitted


def test_a_bare_pod_the_loop_asked_written_goes_to_the_pool(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod the cycle could not place gets its PodGroup written (two round trips): through
    the pool, as many at a time as it has threads, not one by one in the pass."""
    r = Rig(monkeypatch, _pod("waits"))
    registry = ProvisionalGroups()
    r.cache.provisional = registry  # type: ignore[attr-defined]
    r.g.defer_bare_pods = True
    pool = _Pool()
    r.g.pool.shutdown()
    r.g.pool = pool  # type: ignore[assignment]
    try:
        assert r.g.run_once() == 1 and not pool.pods  # registered in the pass
        (job,) = registry.view()[1].values()
        registry.mark(job, WRITE)  # as the loop does for a pod it could not place
        r.cache.dirty = {"ns/waits"}
        assert r.g.run_once() == 1
        assert pool.pods == ["ns/waits"]
        assert list(r.podgroups) == [job.split("/", 1)[1]] and set(r.patched) == {"waits"}
    finally:
        pool.shutdown()


def test_a_namespace_that_cannot_be_read_sends_its_bare_pods_to_the_pool(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its labels are read once for the pass, on the pool; a failure there is not retried pod
    by pod in the pass: the pods go to the pool, which reads it again (and retries them)."""
    r = Rig(monkeypatch, _pod("a"), _pod("b"))
    r.cache.provisional = ProvisionalGroups()  # type: ignore[attr-defined]
    r.g.defer_bare_pods = True
    reads: list[str] = []

    def unreachable(namespace: str) -> dict[str, str]:
        reads.append(namespace)
        raise TimeoutError("read timed out")

    r.g.namespace_labels = unreachable  # type: ignore[method-assign]
    pool = _Pool()
    r.g.pool.shutdown()
    r.g.pool = pool  # type: ignore[assignment]
    try:
        assert r.g.run_once() == 0
        assert sorted(pool.pods) == ["ns/a", "ns/b"]
        assert len(reads) == 3  # once for the pass, once per pod in the pool
        assert set(r.g.retry) == {"ns/a", "ns/b"}  # tried again later, as any failure
    finally:
        pool.shutdown()
