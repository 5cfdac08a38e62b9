"""The pod grouper never silently drops a pod: each kind of owner-lookup or write failure is
caught per pod (the rest of the pass is grouped), retried with its own back-off, and told on a
PodGrouperWarning event; an owner whose kind the API server does not serve groups the pod by
the owners read so far, with an event naming the reference."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from kai_ray.controller.podgrouper import (
    RETRY_MAX_S,
    WARN_AFTER,
    OwnerNotFound,
    PodGrouper,
    retry_delay,
)
from kai_ray.grouping.objects import RayClusterPending
from kai_ray.k8s import rawapi

NS = "ns"
GetOwner = Callable[[str, str, str, str], dict[str, Any] | None]


def _obj(api_version: str, kind: str, name: str, owner: dict[str, Any] | None = None
         ) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}",
                         "labels": {"kai.scheduler/queue": "q"}}
    if owner is not None:
        om = owner["metadata"]
        m["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                 "name": om["name"], "uid": om["uid"], "controller": True}]
    return {"apiVersion": api_version, "kind": kind, "metadata": m}


def _pod(name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    p = _obj("v1", "Pod", name, owner)
    p["spec"] = {"schedulerName": "kai-scheduler", "containers": [{"name": "main"}]}
    return p


RS = _obj("apps/v1", "ReplicaSet", "rs")
WIDGET = _obj("example.com/v1", "Widget", "w1")


class _Cache:
    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {f"{NS}/{p['metadata']['name']}": p for p in pods}
        self.podgroups: dict[str, Any] = {}
        self.priority_classes: dict[str, Any] = {}
        self.dirty = set(self.pods)

    def take_dirty_pods(self) -> list[str]:
        keys, self.dirty = sorted(self.dirty), set()
        return keys


class _Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, str, str]] = []  # (pod, reason, message)
        self._lock = threading.Lock()

    def emit(self, obj: dict[str, Any], reason: str, message: str, **_: Any) -> None:
        with self._lock:
            self.emitted.append((obj["metadata"]["name"], reason, message))

    def about(self, pod: str) -> list[str]:
        return [m for p, r, m in self.emitted if p == pod and r == "PodGrouperWarning"]


class _NoRayWatch:
    def take(self) -> set[tuple[str, str]]:
        return set()

    def stop(self) -> None:
        pass


class Rig:
    """A PodGrouper with fake reads and writes; `owners` answers get_owner by name, and an
    exception there is raised instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *pods: dict[str, Any],
                 owners: dict[str, Any] | None = None) -> None:
        self.cache = _Cache(*pods)
        self.events = _Events()
        self.owners: dict[str, Any] = dict(owners or {})
        self.calls: list[str] = []
        self.podgroups: dict[str, dict[str, Any]] = {}
        self.write_error: Exception | None = None
        self.patched: dict[str, str] = {}
        g = PodGrouper(client.ApiClient(client.Configuration()), self.cache,  # type: ignore[arg-type]
                       self.events, workers=4)  # type: ignore[arg-type]
        g.ray_watch = _NoRayWatch()  # type: ignore[assignment]
        g.get_owner = self.get_owner  # type: ignore[method-assign, assignment]
        g.namespace_labels = lambda namespace: {}  # type: ignore[method-assign]
        g._write_podgroup = self.write  # type: ignore[method-assign]
        monkeypatch.setattr(rawapi, "patch_pod", self.patch_pod)
        self.g = g

    def get_owner(self, api_version: str, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        self.calls.append(name)
        found = self.owners[name]
        if isinstance(found, Exception):
            raise found
        return {k: v for k, v in found.items() if k not in ("apiVersion", "kind")}

    def write(self, ns: str, name: str, desired: dict[str, Any]) -> None:
        if self.write_error is not None:
            raise self.write_error
        self.podgroups[name] = desired

    def patch_pod(self, api: Any, ns: str, name: str, patch: dict[str, Any]) -> None:
        self.patched[name] = patch["metadata"]["annotations"]["pod-group-name"]

    def make_due(self) -> None:
        """As if each pod's back-off had passed."""
        self.g.retry = {k: (n, 0.0) for k, (n, _) in self.g.retry.items()}


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(*pods: dict[str, Any], owners: dict[str, Any] | None = None) -> Rig:
        made.append(Rig(monkeypatch, *pods, owners=owners))
        return made[-1]

    yield make
    for r in made:
        r.g.pool.shutdown(wait=True)


TRANSIENT = [
    pytest.param(ApiException(status=503, reason="Service Unavailable"), id="api-503"),
    pytest.param(ApiException(status=429, reason="Too Many Requests"), id="api-429"),
    pytest.param(urllib3.exceptions.ProtocolError("Connection aborted.",
                                                  ConnectionResetError(104, "reset")),
                 id="urllib3-reset"),
    pytest.param(urllib3.exceptions.MaxRetryError(
        None, "/apis", ConnectionRefusedError()),  # type: ignore[arg-type]
        id="urllib3-maxretry"),
    pytest.param(ConnectionResetError(104, "Connection reset by peer"), id="oserror-reset"),
    pytest.param(TimeoutError("timed out"), id="timeout"),
    pytest.param(OwnerNotFound("ReplicaSet ns/rs (apiVersion apps/v1) does not exist"),
                 id="owner-404"),
]


@pytest.mark.parametrize("error", TRANSIENT)
def test_a_transient_failure_is_retried_with_backoff_and_told_after_a_few(
        rig: Callable[..., Rig], error: Exception) -> None:
    r = rig(_pod("bad", owner=RS), _pod("good"), owners={"rs": error})
    t0 = time.monotonic()
    assert r.g.run_once() == 1  # the failure stays with its pod: the other one is grouped
    assert r.patched == {"good": "pg-good-uid-good"}
    attempts, at = r.g.retry[f"{NS}/bad"]
    assert attempts == 1 and t0 + 0.8 <= at <= time.monotonic() + 1.2
    assert r.events.about("bad") == []  # one blip is not news

    r.calls.clear()
    assert r.g.run_once() == 0
    assert "rs" not in r.calls, "retried before its back-off passed"

    for n in range(2, WARN_AFTER + 2):
        r.make_due()
        r.g.run_once()
        assert r.g.retry[f"{NS}/bad"][0] == n
        told = r.events.about("bad")
        assert len(told) == (1 if n >= WARN_AFTER else 0), told
    assert "retries with back-off" in told[0]
    if isinstance(error, OwnerNotFound):
        assert "ReplicaSet ns/rs (apiVersion apps/v1) does not exist" in told[0]

    r.owners["rs"] = RS  # the API server is back
    r.make_due()
    assert r.g.run_once() == 1
    assert r.patched["bad"] == "pg-rs-uid-rs"
    assert r.g.retry == {}


@pytest.mark.parametrize("error", [
    pytest.param(KeyError("status"), id="a-bug"),
    pytest.param(ApiException(status=400, reason="Bad Request"), id="api-400"),
    pytest.param(ApiException(status=422, reason="Unprocessable Entity"), id="api-422"),
])
def test_an_unexpected_failure_is_told_at_once_and_still_retried(
        rig: Callable[..., Rig], error: Exception) -> None:
    r = rig(_pod("bad", owner=RS), _pod("good"), owners={"rs": error})
    assert r.g.run_once() == 1
    assert r.patched == {"good": "pg-good-uid-good"}
    told = r.events.about("bad")
    assert len(told) == 1 and "cannot be grouped yet" in told[0], r.events.emitted
    assert r.g.retry[f"{NS}/bad"][0] == 1
    r.make_due()
    r.g.run_once()
    assert r.g.retry[f"{NS}/bad"][0] == 2
    assert len(r.events.about("bad")) == 2  # the fake keeps every emit; the recorder dedupes


def test_a_failing_podgroup_write_is_retried(rig: Callable[..., Rig]) -> None:
    r = rig(_pod("a"), owners={})
    r.write_error = ApiException(status=500, reason="Internal Server Error")
    assert r.g.run_once() == 0
    assert r.g.retry[f"{NS}/a"][0] == 1
    r.write_error = None
    r.make_due()
    assert r.g.run_once() == 1 and r.g.retry == {}


def test_an_unserved_owner_kind_groups_by_the_pod_and_says_why(rig: Callable[..., Rig]) -> None:
    r = rig(_pod("p", owner=WIDGET), _pod("q"),
            owners={"w1": ResourceNotFoundError("No matches found for Widget")})
    assert r.g.run_once() == 2
    assert r.patched == {"p": "pg-p-uid-p", "q": "pg-q-uid-q"}
    assert r.g.retry == {}
    told = r.events.about("p")
    assert len(told) == 1
    assert "ownerReference Widget w1 (apiVersion example.com/v1)" in told[0]
    assert "grouped by Pod ns/p" in told[0]
    r.cache.dirty = {f"{NS}/p"}
    r.g.run_once()
    assert len(r.events.about("p")) == 1  # told once, not on every regroup


def test_an_unserved_kind_higher_up_groups_by_the_owners_read(rig: Callable[..., Rig]) -> None:
    rs = _obj("apps/v1", "ReplicaSet", "rs", owner=WIDGET)
    r = rig(_pod("p", owner=rs), owners={"rs": rs, "w1": ResourceNotFoundError("none")})
    assert r.g.run_once() == 1
    assert r.patched == {"p": "pg-rs-uid-rs"}
    assert r.podgroups["pg-rs-uid-rs"]["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    told = r.events.about("p")
    assert len(told) == 1 and "Widget w1" in told[0] and "ReplicaSet ns/rs" in told[0]


def test_grouping_errors_are_told_and_pending_ray_clusters_retried(
        rig: Callable[..., Rig]) -> None:
    expired = dict(RS, metadata={**RS["metadata"], "uid": "another"})
    r = rig(_pod("expired", owner=RS), _pod("ray", owner=WIDGET),
            owners={"rs": expired, "w1": RayClusterPending("RayJob ns/j: not yet")})
    assert r.g.run_once() == 0
    assert "owner expired" in r.events.about("expired")[0]
    assert f"{NS}/expired" not in r.g.retry  # told; a change to the pod regroups it
    assert r.g.retry[f"{NS}/ray"] == (0, 0.0)  # next pass, no back-off, no event
    assert r.events.about("ray") == []


def test_a_deleted_pod_leaves_the_retries(rig: Callable[..., Rig]) -> None:
    r = rig(_pod("bad", owner=RS), owners={"rs": TimeoutError()})
    r.g.run_once()
    assert f"{NS}/bad" in r.g.retry
    del r.cache.pods[f"{NS}/bad"]
    r.make_due()
    r.g.run_once()
    assert r.g.retry == {}


def test_retry_delay_doubles_to_a_minute_with_jitter() -> None:
    for attempts, base in ((1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (50, 60.0)):
        delays = [retry_delay(attempts) for _ in range(50)]
        assert all(0.8 * base <= d <= 1.2 * base for d in delays), (attempts, delays)
        assert len(set(delays)) > 1  # jittered
    assert RETRY_MAX_S == 60.0


class _Resource:
    namespaced = True

    def __init__(self, error: ApiException | None) -> None:
        self.error = error

    def get(self, name: str, namespace: str | None) -> Any:
        if self.error is not None:
            raise self.error
        raise AssertionError("not reached")


class _Resources:
    def __init__(self) -> None:
        self.lookups: list[tuple[str, str]] = []
        self.answers: dict[str, Any] = {}

    def get(self, api_version: str, kind: str) -> Any:
        self.lookups.append((api_version, kind))
        answer = self.answers[kind]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_get_owner_maps_api_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    g = PodGrouper(client.ApiClient(client.Configuration()), _Cache(), _Events())  # type: ignore[arg-type]
    resources = _Resources()
    g._dynamic = type("D", (), {"resources": resources})()
    resources.answers = {
        "Widget": ResourceNotFoundError("No matches found for Widget"),
        "Gone": _Resource(ApiException(status=404, reason="Not Found")),
        "Secret": _Resource(ApiException(status=403, reason="Forbidden")),
        "Flaky": _Resource(ApiException(status=503, reason="Service Unavailable")),
    }
    for _ in range(2):
        with pytest.raises(ResourceNotFoundError):
            g.get_owner("example.com/v1", "Widget", NS, "w1")
    # a kind the server does not serve is remembered: one rediscovery, not one per pod
    assert resources.lookups.count(("example.com/v1", "Widget")) == 1
    with pytest.raises(OwnerNotFound, match="Gone ns/x"):
        g.get_owner("example.com/v1", "Gone", NS, "x")
    assert g.get_owner("v1", "Secret", NS, "s") is None
    with pytest.raises(ApiException) as e:
        g.get_owner("v1", "Flaky", NS, "f")
    assert e.value.status == 503
    g.pool.shutdown()


def test_podgroups_of_bound_bare_pods_wait_for_the_end_of_the_bind_phase(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The binder hands over each bound bare pod's PodGroup; none is sent until the binder's
    phase ends (its after_binds hook), then all are, on the grouper's pool."""
    g = PodGrouper(client.ApiClient(client.Configuration()), _Cache(), _Events())  # type: ignore[arg-type]
    sent: list[str] = []
    monkeypatch.setattr(g, "_create_after_bind", lambda pg: sent.append(pg["metadata"]["name"]))
    for name in ("a", "b"):
        g.create_after_bind({"metadata": {"name": name, "namespace": NS}})
    assert sent == []
    g.flush_after_binds()
    g.pool.shutdown(wait=True)
    assert sorted(sent) == ["a", "b"]
    g.pool = ThreadPoolExecutor(1)  # the first was shut down to wait for its work
    g.flush_after_binds()  # nothing left: nothing sent twice
    g.pool.shutdown(wait=True)
    assert len(sent) == 2
