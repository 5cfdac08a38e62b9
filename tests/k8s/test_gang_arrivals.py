"""GangArrivals: pods counted per PodGroup as the watch sees them, and `whole` set when a gang
has its minMember (the loop then starts a cycle without its pause)."""

from __future__ import annotations

from typing import Any

from kai_ray.k8s.gang_arrivals import GangArrivals, min_member


def _pod(name: str, group: str | None, ns: str = "ns") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if group:
        meta["annotations"] = {"pod-group-name": group}
    return {"metadata": meta, "spec": {}}


def _pg(name: str, min_member: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"minMember": min_member}}


def test_a_gang_is_whole_when_its_minimum_of_pods_has_arrived() -> None:
    gangs = GangArrivals()
    pg = _pg("g", 3)
    for i in range(2):
        assert gangs.pod_event("ADDED", f"ns/g-{i}", _pod(f"g-{i}", "g"), None) == "ns/g"
        assert not gangs.check("ns/g", pg)
    assert not gangs.whole.is_set()
    gangs.pod_event("ADDED", "ns/g-2", _pod("g-2", "g"), None)
    assert gangs.check("ns/g", pg) and gangs.whole.is_set()


def test_a_pod_counts_once_and_leaves_its_gang_when_deleted_or_regrouped() -> None:
    gangs = GangArrivals()
    p = _pod("p", "a")
    gangs.pod_event("ADDED", "ns/p", p, None)
    assert gangs.pod_event("MODIFIED", "ns/p", p, p) is None  # a status update: no join
    assert gangs.count("ns/a") == 1
    moved = _pod("p", "b")
    assert gangs.pod_event("MODIFIED", "ns/p", moved, p) == "ns/b"
    assert (gangs.count("ns/a"), gangs.count("ns/b")) == (0, 1)
    gangs.pod_event("DELETED", "ns/p", moved, moved)
    assert gangs.count("ns/b") == 0


def test_a_pod_the_grouper_annotates_later_joins_then() -> None:
    gangs = GangArrivals()
    bare = _pod("w", None)
    assert gangs.pod_event("ADDED", "ns/w", bare, None) is None
    assert gangs.pod_event("MODIFIED", "ns/w", _pod("w", "g"), bare) == "ns/g"


def test_no_early_start_without_the_podgroup_or_with_a_bad_minimum() -> None:
    gangs = GangArrivals()
    gangs.pod_event("ADDED", "ns/g-0", _pod("g-0", "g"), None)
    assert not gangs.check("ns/g", None)  # its PodGroup not seen yet: it checks on arrival
    for bad in (0, -1, "2", 1.5, True):
        assert min_member(_pg("g", bad)) is None
        assert not gangs.check("ns/g", _pg("g", bad))
    assert not gangs.whole.is_set()
    assert min_member({"spec": {}}) == 1  # unset is a gang of one, as the CRD says


def test_a_gang_all_bound_starts_nothing_when_its_podgroup_arrives() -> None:
    """A bare pod's PodGroup written after its bind (or a relist of bound gangs): whole, but
    nothing to place, so no early cycle."""
    gangs = GangArrivals()
    bound = _pod("b-0", "b")
    bound["spec"]["nodeName"] = "n1"
    gangs.pod_event("ADDED", "ns/b-0", bound, None)
    assert not gangs.check("ns/b", _pg("b", 1)) and not gangs.whole.is_set()
    pending = _pod("p-0", "p")
    gangs.pod_event("ADDED", "ns/p-0", pending, None)
    placed = _pod("p-0", "p")
    placed["spec"]["nodeName"] = "n1"
    gangs.pod_event("MODIFIED", "ns/p-0", placed, pending)  # its bind: no longer waiting
    assert not gangs.check("ns/p", _pg("p", 1))
