"""RayClusterWatch reports a RayCluster once per spec change (generation), not per status
update; a refused list (no KubeRay CRD, no RBAC) is retried slowly, logged once per change and
shown on the health endpoints."""

import json
import logging
import threading
import time
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.controller.raywatch import RayClusterWatch


def _rc(generation: int, ns: str = "a", name: str = "rc") -> dict:
    return {"metadata": {"namespace": ns, "name": name, "generation": generation,
                         "resourceVersion": str(generation)}}


class _Listing:
    def __init__(self, items: list[dict]) -> None:
        self.data = json.dumps({"items": items, "metadata": {"resourceVersion": "9"}}).encode()


class _Server:
    """The API server's answers to the watch's lists, in turn: an exception is raised, a list
    is a listing. A watch ends at once (back to a list); when the answers run out, the watch
    stops itself."""

    def __init__(self, watch: RayClusterWatch, answers: list[Any]) -> None:
        self.watch, self.answers = watch, list(answers)
        self.lists = 0
        self.done = threading.Event()

    def __call__(self, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            time.sleep(0.01)
            raise ApiException(status=410, reason="Gone")  # expired: list again
        if not self.answers:
            self.watch.stop()
            self.done.set()
            raise ApiException(status=500, reason="the test is over")
        self.lists += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return _Listing(answer)


def _watch(answers: list[Any], retry_s: float = 0.01) -> tuple[RayClusterWatch, _Server]:
    w = RayClusterWatch(client.ApiClient())
    server = _Server(w, answers)
    w.informer.list_fn = server
    w.informer.refused_retry_s = retry_s
    return w, server


def test_only_generation_changes_count() -> None:
    w, _ = _watch([])
    w._seen("ADDED", _rc(1), None)  # new clusters are grouped from their pods anyway
    w._seen("MODIFIED", _rc(1), _rc(1))  # a status write: same generation
    assert w.take() == set()
    w._seen("MODIFIED", _rc(2), _rc(1))
    w._seen("ADDED", _rc(2, ns="b"), None)
    assert w.take() == {("a", "rc")}
    assert w.take() == set()
    w._seen("DELETED", _rc(2), _rc(2))
    assert w.take() == set()


def test_a_relist_reports_what_changed_while_no_watch_ran() -> None:
    """A watch that broke or expired is followed by a list: a cluster whose spec moved in the
    gap is reported, one first seen or unchanged is not."""
    w, _ = _watch([[_rc(1), _rc(4, name="other")],
                   [_rc(2), _rc(4, name="other"), _rc(1, ns="new")]])
    w.informer._list()
    assert w.take() == set()
    w.informer._list()
    assert w.take() == {("a", "rc")}


def test_a_refused_watch_is_retried_slowly_logged_once_per_change_and_shown(caplog) -> None:
    forbidden = ApiException(status=403, reason="Forbidden")
    w, server = _watch([forbidden, forbidden, forbidden, [_rc(1)], forbidden])
    assert w.state() == {"ok": True, "watching": True}
    with caplog.at_level(logging.INFO, logger="kai_ray.k8s.cache"):
        w.start()
        assert server.done.wait(10)
    lines = [r.getMessage() for r in caplog.records]
    refused = [m for m in lines if "refused" in m]
    # three refusals in a row: one line; allowed again: one line; refused again: one more
    assert refused == ["list of rayclusters refused (403 Forbidden); trying again every 0s"] * 2
    assert sum("works again" in m for m in lines) == 1
    state = w.state()
    assert state["ok"] is True and state["watching"] is False
    assert "403 Forbidden" in str(state["detail"]) and "RBAC" in str(state["detail"])


def test_a_rayclusters_read_ends_the_wait_after_a_refusal() -> None:
    """KubeRay installed after the scheduler: the first RayCluster the grouper reads makes the
    watch look again at once instead of at its 30 s retry."""
    missing = ApiException(status=404, reason="Not Found")
    w, server = _watch([missing, [_rc(1)]], retry_s=30.0)
    w.served()  # watching (or not yet answered): nothing to end
    assert not w.informer._wake.is_set()
    w.start()
    deadline = time.monotonic() + 5
    while server.lists < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert w.informer.refused is not None and "KubeRay" in str(w.state()["detail"])
    w.served()
    assert w.informer.synced.wait(5)  # well before the 30 s retry
    assert w.state()["watching"] is True
    w.stop()
