from __future__ import annotations

import pytest
from grouping_objects import ray_cluster, worker_group
from hypothesis import given
from hypothesis import strategies as st

from kai_ray.grouping import GroupingError, ray_gang
from kai_ray.grouping.ray import gang_annotations


def _subgroups(gang) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {s["name"]: s["minMember"] for s in gang.subgroups}


# KAI's documented examples (its Ray pod grouper's tests, ray_grouper_test.go)
def test_kai_example_two_groups() -> None:
    gang = ray_gang(ray_cluster("rc", worker_group(3, 2), worker_group(3, 1)))
    assert gang.min_member == 4
    assert _subgroups(gang) == {"headgroup": 1, "worker-group-0": 2, "worker-group-1": 1}
    assert [s["name"] for s in gang.subgroups] == ["headgroup", "worker-group-0", "worker-group-1"]


@pytest.mark.parametrize("field", ["suspended", "suspend"])  # KAI's name and KubeRay's
def test_kai_example_suspended_group_is_skipped(field: str) -> None:
    gang = ray_gang(ray_cluster("rc", worker_group(3, 2), worker_group(3, 1, **{field: True})))
    assert gang.min_member == 3
    assert _subgroups(gang) == {"headgroup": 1, "worker-group-0": 2}


def test_kai_example_multi_host_groups() -> None:
    gang = ray_gang(ray_cluster("rc", worker_group(3, 2, hosts=2), worker_group(3, 1, hosts=3)))
    assert gang.min_member == 1 + 4 + 3 == 8
    assert _subgroups(gang) == {"headgroup": 1, "worker-group-0": 4, "worker-group-1": 3}


def test_min_replicas_zero_uses_replicas() -> None:
    gang = ray_gang(ray_cluster("rc", worker_group(4, 0, name="gpu"), worker_group(5)))
    assert gang.min_member == 1 + 4 + 5
    assert _subgroups(gang) == {"headgroup": 1, "gpu": 4, "worker-group-1": 5}


def test_groups_with_nothing_and_no_workers() -> None:
    assert ray_gang(ray_cluster("rc", worker_group())).min_member == 1
    assert ray_gang(ray_cluster("rc")).min_member == 1
    assert _subgroups(ray_gang(ray_cluster("rc"))) == {"headgroup": 1}


def test_suspend_false_counts() -> None:
    assert ray_gang(ray_cluster("rc", worker_group(2, 2, suspend=False))).min_member == 3


def test_min_replicas_above_replicas_names_the_field() -> None:
    rc = ray_cluster("x", worker_group(1, 1), worker_group(2, 3))
    with pytest.raises(GroupingError) as e:
        ray_gang(rc)
    assert str(e.value) == "RayCluster ns/x: workerGroupSpecs[1]: minReplicas 3 > replicas 2"


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (worker_group("2"), "[0]: replicas must be a non-negative integer, got '2'"),
        (worker_group(2, -1), "workerGroupSpecs[0]: minReplicas must be a non-negative integer"),
        (worker_group(2, hosts=True), "numOfHosts must be a non-negative integer, got True"),
        (worker_group(2, hosts=0), "workerGroupSpecs[0]: numOfHosts must be at least 1"),
        ("oops", "workerGroupSpecs[0]: must be an object"),
    ],
)
def test_bad_worker_groups(group: object, message: str) -> None:
    with pytest.raises(GroupingError, match=r"^RayCluster ns/rc: ") as e:
        ray_gang(ray_cluster("rc", group))  # type: ignore[arg-type]
    assert message in str(e.value)


def test_topology_per_subgroup() -> None:
    ann = {"kai.scheduler/topology": "dc", "kai.scheduler/topology-required-placement": "rack"}
    g = worker_group(2, name="w")
    g["template"]["metadata"] = {"annotations": ann}
    gang = ray_gang(ray_cluster("rc", g))
    assert gang.subgroups[1]["topologyConstraint"] == {"topology": "dc",
                                                      "requiredTopologyLevel": "rack"}
    assert "topologyConstraint" not in gang.subgroups[0]


def test_placement_without_topology_name_is_an_error() -> None:
    g = worker_group(2, name="w")
    g["template"]["metadata"] = {
        "annotations": {"kai.scheduler/topology-preferred-placement": "rack"}}
    with pytest.raises(GroupingError, match=r"workerGroupSpecs\[0\]: template annotation "
                                            r"kai.scheduler/topology is required"):
        ray_gang(ray_cluster("rc", g))


groups = st.lists(
    st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(1, 4), st.booleans()),
    max_size=6,
)


@given(groups)
def test_min_member_is_head_plus_sum_of_group_minimums(spec: list) -> None:  # type: ignore[type-arg]
    specs = [(max(r, m), m, h, s) for r, m, h, s in spec]  # keep minReplicas <= replicas
    rc = ray_cluster("rc", *(worker_group(r, m, hosts=h, suspend=s) for r, m, h, s in specs))
    gang = ray_gang(rc)
    expected = [(f"worker-group-{i}", (m if m > 0 else r) * h)
                for i, (r, m, h, s) in enumerate(specs) if not s and (r or m)]
    assert gang.min_member == 1 + sum(n for _, n in expected)
    assert [(s["name"], s["minMember"]) for s in gang.subgroups] == [("headgroup", 1), *expected]
    assert all(s["minMember"] >= 1 for s in gang.subgroups)  # the CRD's minimum


@given(st.integers(0, 50), st.integers(1, 50))
def test_min_above_replicas_always_fails(replicas: int, extra: int) -> None:
    with pytest.raises(GroupingError, match=rf"minReplicas {replicas + extra} > replicas "
                                            rf"{replicas}$"):
        ray_gang(ray_cluster("rc", worker_group(replicas, replicas + extra)))


def test_multi_host_groups_record_pods_per_replica() -> None:
    gang = ray_gang(ray_cluster("rc", worker_group(3, 2, hosts=2), worker_group(1, 1)))
    assert gang.replica_hosts == (("worker-group-0", 2),)
    assert ray_gang(ray_cluster("rc", worker_group(1, 1))).replica_hosts == ()


# ---- kai-ray: in-tree autoscaling (KAI counts replicas when minReplicas is 0; we do not) ---

def _autoscaled(*groups: dict, flag: object = True) -> dict:  # type: ignore[type-arg]
    rc = ray_cluster("rc", *groups)
    rc["spec"]["enableInTreeAutoscaling"] = flag
    return rc


def test_autoscaled_group_with_min_replicas_zero_is_all_elastic() -> None:
    """The autoscaler asked for 5 workers: none of them is part of the gang."""
    gang = ray_gang(_autoscaled(worker_group(5, 0, name="gpu")))
    assert gang.min_member == 1
    assert _subgroups(gang) == {"headgroup": 1}  # no subgroup: the CRD's minimum is 1
    assert gang.elastic == ("gpu",)


def test_autoscaled_groups_count_min_replicas_not_replicas() -> None:
    gang = ray_gang(_autoscaled(worker_group(6, 2, name="a"), worker_group(3, 0, name="b"),
                                worker_group(0, 0, name="c"), worker_group(4, 1, hosts=2)))
    assert gang.min_member == 1 + 2 + 0 + 0 + 2
    assert _subgroups(gang) == {"headgroup": 1, "a": 2, "worker-group-3": 2}
    # c has no replicas yet: listed, so the autoscaler's first scale-up needs no PodGroup change
    assert gang.elastic == ("b", "c")
    assert gang.replica_hosts == (("worker-group-3", 2),)


def test_autoscaled_multi_host_group_with_min_zero_keeps_its_replica_size() -> None:
    gang = ray_gang(_autoscaled(worker_group(3, 0, name="tpu", hosts=4)))
    assert gang.min_member == 1 and gang.elastic == ("tpu",)
    assert gang.replica_hosts == (("tpu", 4),)  # an elastic replica is still placed whole
    assert gang_annotations(gang) == {"kai-ray.io/replica-hosts": '{"tpu": 4}',
                                      "kai-ray.io/elastic-subgroups": '["tpu"]'}


@pytest.mark.parametrize("field", ["suspended", "suspend"])
def test_autoscaled_suspended_group_is_neither_counted_nor_elastic(field: str) -> None:
    gang = ray_gang(_autoscaled(worker_group(3, 0, name="off", **{field: True}),
                                worker_group(2, 1, name="on")))
    assert gang.min_member == 2 and gang.elastic == ()
    assert _subgroups(gang) == {"headgroup": 1, "on": 1}


@pytest.mark.parametrize("flag", [False, None, "true"])
def test_without_autoscaling_min_replicas_zero_still_counts_replicas(flag: object) -> None:
    """KAI's rule where nobody scales `replicas` to what fits: it is the cluster the user asked
    for, and minReplicas 0 is only the CRD default (the flag must be the boolean true)."""
    gang = ray_gang(_autoscaled(worker_group(4, 0, name="gpu", hosts=2), flag=flag))
    assert gang.min_member == 1 + 8 and gang.elastic == ()
    assert _subgroups(gang) == {"headgroup": 1, "gpu": 8}


def test_gang_annotations_of_a_plain_gang_are_empty() -> None:
    assert gang_annotations(ray_gang(ray_cluster("rc", worker_group(2, 1)))) == {}


@given(groups, st.booleans())
def test_autoscaled_minimum_is_head_plus_min_replicas(spec: list, autoscaling: bool) -> None:  # type: ignore[type-arg]
    specs = [(max(r, m), m, h, s) for r, m, h, s in spec]
    rc = _autoscaled(*(worker_group(r, m, hosts=h, suspend=s) for r, m, h, s in specs),
                     flag=autoscaling)
    gang = ray_gang(rc)
    live = [(f"worker-group-{i}", r, m, h) for i, (r, m, h, s) in enumerate(specs) if not s]
    if autoscaling:
        counted = [(n, m * h) for n, _, m, h in live if m]
        assert gang.elastic == tuple(n for n, _, m, _ in live if not m)
    else:
        counted = [(n, (m or r) * h) for n, r, m, h in live if r or m]
        assert gang.elastic == ()
    assert gang.min_member == 1 + sum(n for _, n in counted)
    assert [(s["name"], s["minMember"]) for s in gang.subgroups] == [("headgroup", 1), *counted]
    assert all(s["minMember"] >= 1 for s in gang.subgroups)  # the CRD's minimum
