"""RayClusterWatch reports a RayCluster once per spec change (generation), not per status
update."""

import logging

from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.controller.raywatch import RayClusterWatch


def _rc(generation: int, ns: str = "a", name: str = "rc") -> dict:
    return {"metadata": {"namespace": ns, "name": name, "generation": generation}}


def test_only_generation_changes_count() -> None:
    w = RayClusterWatch(client.ApiClient())
    w._seen(_rc(1), "ADDED")
    w._seen(_rc(1), "MODIFIED")  # a status write: same generation
    assert w.take() == set()
    w._seen(_rc(2), "MODIFIED")
    w._seen(_rc(2, ns="b"), "ADDED")  # new clusters are grouped from their pods anyway
    assert w.take() == {("a", "rc")}
    assert w.take() == set()
    w._seen(_rc(2), "DELETED")
    w._seen(_rc(3), "MODIFIED")  # unknown after deletion: reported
    assert w.take() == {("a", "rc")}


def test_a_relist_reports_what_changed_while_no_watch_ran() -> None:
    """A watch that broke or expired is followed by a list: a cluster whose spec moved in the
    gap is reported, one first seen or unchanged is not."""
    w = RayClusterWatch(client.ApiClient())
    w._seen(_rc(1), "LISTED")
    w._seen(_rc(4, name="other"), "ADDED")
    assert w.take() == set()
    w._seen(_rc(2), "LISTED")
    w._seen(_rc(4, name="other"), "LISTED")
    w._seen(_rc(1, ns="new"), "LISTED")
    assert w.take() == {("a", "rc")}


def test_a_rayclusters_read_ends_the_wait_after_a_404() -> None:
    """KubeRay installed after the scheduler: the first RayCluster the grouper reads makes the
    watch look again at once instead of at its 30 s retry."""
    w = RayClusterWatch(client.ApiClient())
    w.served()
    assert not w._wake.is_set()  # watching (or not yet answered): nothing to end
    w = _Refusing([ApiException(status=403, reason="Forbidden")])
    w._run()
    w.served()
    assert not w._wake.is_set()  # RBAC does not change because a read worked
    w = _Refusing([ApiException(status=404, reason="Not Found")])
    w._run()
    w.served()
    assert w._wake.is_set()
    RayClusterWatch._pause(w, 30.0)  # returns at once; the next wait is a full one again
    assert not w._wake.is_set()


class _Refusing(RayClusterWatch):
    """A watch whose lists the API server answers with `answers` in turn (an exception is
    raised, a dict is a listing); stops itself after the last one."""

    def __init__(self, answers: list) -> None:
        super().__init__(client.ApiClient())
        self.answers = list(answers)
        self.waits: list[float] = []

    def _pause(self, seconds: float) -> None:
        self.waits.append(seconds)
        if not self.answers:
            self.stopping.set()

    def _list(self, **kwargs: object) -> object:
        if kwargs.get("watch"):
            raise ApiException(status=500, reason="watch ends")  # back to the list
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_refused_watch_is_logged_once_per_change_and_shown(caplog) -> None:
    forbidden = ApiException(status=403, reason="Forbidden")
    w = _Refusing([forbidden, forbidden, forbidden, {"items": [], "metadata": {}}, forbidden])
    with caplog.at_level(logging.INFO, logger="kai_ray.controller.raywatch"):
        w._run()
    lines = [r.getMessage() for r in caplog.records]
    refused = [m for m in lines if "refused" in m]
    # three refusals in a row: one line; allowed again: one line; refused again: one more
    assert len(refused) == 2, lines
    assert refused[0] == ("watch of rayclusters.ray.io refused (403 Forbidden): the "
                          "scheduler's RBAC lacks list/watch; minReplicas changes are not "
                          "followed at once, only at the pod grouper's periodic resync")
    assert sum("works again" in m for m in lines) == 1
    assert w.waits[:3] == [30.0, 30.0, 30.0]  # not every second
    state = w.state()
    assert state["ok"] is True and state["watching"] is False
    assert "403 Forbidden" in str(state["detail"])
    assert RayClusterWatch(client.ApiClient()).state() == {"ok": True, "watching": True}
