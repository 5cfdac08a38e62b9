"""RayClusterWatch reports a RayCluster once per spec change (generation), not per status
update."""

from kubernetes import client

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
