from __future__ import annotations

import pytest
from grouping_objects import FakeApi, obj, owned_by, pod, ray_cluster

from kai_ray.grouping import (
    GroupingError,
    OwnerExpired,
    RayClusterPending,
    resolve_top_owner,
)


def test_pod_without_owners_is_its_own_top_owner() -> None:
    p = pod("solo")
    owners = resolve_top_owner(p, FakeApi().get_owner)
    assert owners.top["metadata"]["name"] == "solo"
    assert owners.top["kind"] == "Pod" and owners.chain == []
    assert owners.ray_cluster is None


def test_walks_pod_replicaset_deployment() -> None:
    dep = obj("apps/v1", "Deployment", "web")
    rs = obj("apps/v1", "ReplicaSet", "web-1", owners=[owned_by(dep)])
    api = FakeApi(dep, rs)
    owners = resolve_top_owner(pod(owner=rs), api.get_owner)
    assert [o["kind"] for o in owners.chain] == ["ReplicaSet", "Deployment"]
    assert owners.top["kind"] == "Deployment" and owners.top["apiVersion"] == "apps/v1"
    assert api.calls == [("apps/v1", "ReplicaSet", "ns", "web-1"),
                         ("apps/v1", "Deployment", "ns", "web")]


def test_only_the_first_owner_of_the_pod_is_followed() -> None:
    a, b = obj("apps/v1", "ReplicaSet", "a"), obj("apps/v1", "ReplicaSet", "b")
    p = pod()
    p["metadata"]["ownerReferences"] = [owned_by(a), owned_by(b)]
    assert resolve_top_owner(p, FakeApi(a, b).get_owner).top["metadata"]["name"] == "a"


def test_intermediate_owner_with_two_owners_is_an_error() -> None:
    x, y = obj("v1", "Thing", "x"), obj("v1", "Thing", "y")
    rs = obj("apps/v1", "ReplicaSet", "rs", owners=[owned_by(x), owned_by(y)])
    with pytest.raises(GroupingError, match=r"ReplicaSet ns/rs: metadata.ownerReferences has 2 "):
        resolve_top_owner(pod(owner=rs), FakeApi(rs, x, y).get_owner)


def test_uid_mismatch_is_expired() -> None:
    rs = obj("apps/v1", "ReplicaSet", "rs")
    p = pod(owner=rs)
    p["metadata"]["ownerReferences"][0]["uid"] = "old-uid"
    with pytest.raises(OwnerExpired, match="owner expired"):
        resolve_top_owner(p, FakeApi(rs).get_owner)


def test_forbidden_first_owner_falls_back_to_the_pod() -> None:
    rs = obj("apps/v1", "ReplicaSet", "rs")
    owners = resolve_top_owner(pod("p", owner=rs), FakeApi(rs, forbidden=("ReplicaSet",)).get_owner)
    assert owners.top["kind"] == "Pod" and owners.top["metadata"]["name"] == "p"


def test_forbidden_later_owner_falls_back_to_the_last_readable_one() -> None:
    dep = obj("apps/v1", "Deployment", "web")
    rs = obj("apps/v1", "ReplicaSet", "web-1", owners=[owned_by(dep)])
    api = FakeApi(dep, rs, forbidden=("Deployment",))
    owners = resolve_top_owner(pod(owner=rs), api.get_owner)
    assert owners.top["kind"] == "ReplicaSet" and len(owners.chain) == 1


def test_missing_owner_propagates_the_callers_error() -> None:
    rs = obj("apps/v1", "ReplicaSet", "gone")
    with pytest.raises(LookupError, match="gone not found"):
        resolve_top_owner(pod(owner=rs), FakeApi().get_owner)


def test_snake_case_dicts_are_refused_with_a_hint() -> None:
    p = {"api_version": "v1", "kind": "Pod", "metadata": {"name": "p", "owner_references": None}}
    with pytest.raises(GroupingError, match="camelCase"):
        resolve_top_owner(p, FakeApi().get_owner)


def test_raycluster_top_owner_is_its_own_ray_cluster() -> None:
    rc = ray_cluster("rc")
    owners = resolve_top_owner(pod(owner=rc), FakeApi(rc).get_owner)
    assert owners.top["kind"] == "RayCluster"
    assert owners.ray_cluster is owners.top


def _rayjob(status: dict | None) -> dict:
    return obj("ray.io/v1", "RayJob", "job", status=status)


def test_rayjob_finds_its_cluster_through_status() -> None:
    job = _rayjob({"rayClusterName": "job-raycluster-abc"})
    rc = ray_cluster("job-raycluster-abc", owners=[owned_by(job)])
    api = FakeApi(job, rc)
    owners = resolve_top_owner(pod(owner=rc), api.get_owner)
    assert owners.top["kind"] == "RayJob"
    assert owners.ray_cluster is not None
    assert owners.ray_cluster["metadata"]["name"] == "job-raycluster-abc"
    assert api.calls[-1] == ("ray.io/v1", "RayCluster", "ns", "job-raycluster-abc")


@pytest.mark.parametrize("status", [None, {}, {"rayClusterName": ""}])
def test_rayjob_without_cluster_name_is_pending(status: dict | None) -> None:
    job = _rayjob(status)
    rc = ray_cluster("c", owners=[owned_by(job)])
    with pytest.raises(RayClusterPending, match=r"RayJob ns/job: status.rayClusterName is not set"):
        resolve_top_owner(pod(owner=rc), FakeApi(job, rc).get_owner)


def _service(status: dict) -> dict:
    return obj("ray.io/v1", "RayService", "svc", status=status)


@pytest.mark.parametrize(
    ("status", "cluster"),
    [
        ({"activeServiceStatus": {"rayClusterName": "active"},
          "pendingServiceStatus": {"rayClusterName": "pending"}}, "active"),
        ({"activeServiceStatus": {}, "pendingServiceStatus": {"rayClusterName": "pending"}},
         "pending"),
        ({"pendingServiceStatus": {"rayClusterName": "pending"}}, "pending"),
    ],
)
def test_rayservice_uses_active_then_pending_cluster(status: dict, cluster: str) -> None:
    svc = _service(status)
    clusters = [ray_cluster(n, owners=[owned_by(svc)]) for n in ("active", "pending")]
    owners = resolve_top_owner(pod(owner=clusters[0]), FakeApi(svc, *clusters).get_owner)
    assert owners.ray_cluster is not None
    assert owners.ray_cluster["metadata"]["name"] == cluster


def test_rayservice_empty_active_name_stops_the_search() -> None:
    svc = _service({"activeServiceStatus": {"rayClusterName": ""},
                    "pendingServiceStatus": {"rayClusterName": "pending"}})
    rc = ray_cluster("pending", owners=[owned_by(svc)])
    with pytest.raises(RayClusterPending, match=r"activeServiceStatus\.rayClusterName is not set"):
        resolve_top_owner(pod(owner=rc), FakeApi(svc, rc).get_owner)


def test_unreadable_ray_cluster_of_a_rayjob_is_an_error() -> None:
    job = _rayjob({"rayClusterName": "hidden"})
    rc = ray_cluster("c", owners=[owned_by(job)])
    api = FakeApi(job, rc, ray_cluster("hidden"), forbidden=("hidden",))
    with pytest.raises(GroupingError, match="RayJob ns/job: RayCluster ns/hidden cannot be read"):
        resolve_top_owner(pod(owner=rc), api.get_owner)
