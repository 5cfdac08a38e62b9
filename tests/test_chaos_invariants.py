"""check_invariants (kai_ray/testing/chaos.py): the chaos harness's verdict from the pods alone,
on crafted pods, nodes and PodGroups."""

from __future__ import annotations

from typing import Any

import pytest

from kai_ray.testing.chaos import check_invariants, find_violations, gang_counts, parse_time

NOW = parse_time("2025-06-01T12:00:00Z")
assert NOW is not None
DEADLINE = 30.0
RES_NS = "kai-resource-reservation"


def ts(seconds_ago: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(NOW - seconds_ago, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, gpus: int = 8, labels: dict[str, str] | None = None,
         memory_mib: int = 81920) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": str(memory_mib),
                                                  **(labels or {})}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"}}}


def pod(name: str, node_name: str | None = None, gpus: int = 1, ns: str = "team",
        group: str | None = None, phase: str | None = None, bound_ago: float = 5.0,
        fraction: str | None = None, gpu_groups: tuple[str, ...] = (),
        selector: dict[str, str] | None = None, terminating: bool = False,
        memory: str | None = None) -> dict[str, Any]:
    ann: dict[str, str] = {}
    labels: dict[str, str] = {}
    if group:
        ann["pod-group-name"] = group
    if fraction:
        ann["gpu-fraction"] = fraction
    if memory:
        ann["gpu-memory"] = memory
    if len(gpu_groups) == 1:
        labels["runai-gpu-group"] = gpu_groups[0]
    else:
        labels.update({f"runai-gpu-group/{g}": g for g in gpu_groups})
    resources: dict[str, Any] = {"requests": {"cpu": "100m"}}
    if gpus and not fraction and not memory:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    meta: dict[str, Any] = {"name": name, "namespace": ns, "annotations": ann, "labels": labels,
                            "creationTimestamp": ts(bound_ago + 1)}
    if terminating:
        meta["deletionTimestamp"] = ts(0)
    status: dict[str, Any] = {"phase": phase or ("Running" if node_name else "Pending")}
    if node_name:
        status["conditions"] = [{"type": "PodScheduled", "status": "True",
                                 "lastTransitionTime": ts(bound_ago)}]
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources}]}
    if node_name:
        spec["nodeName"] = node_name
    if selector:
        spec["nodeSelector"] = selector
    return {"metadata": meta, "spec": spec, "status": status}


def reservation(node_name: str, group: str) -> dict[str, Any]:
    p = pod(f"res-{group}", node_name, gpus=1, ns=RES_NS)
    p["metadata"]["labels"] = {"app": "kai-resource-reservation", "runai-gpu-group": group}
    return p


def pg(name: str, min_member: int, ns: str = "team", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if deleting:
        meta["deletionTimestamp"] = ts(0)
    return {"metadata": meta, "spec": {"minMember": min_member, "queue": "q"}}


def check(pods: list[dict[str, Any]], nodes: list[dict[str, Any]],
          pgs: list[dict[str, Any]] | None = None) -> list[str]:
    return check_invariants(pods, nodes, pgs or [], NOW, DEADLINE)


def test_a_correct_placement_has_no_violation() -> None:
    nodes = [node("n1"), node("n2", labels={"pool": "a"})]
    pods = [pod(f"g1-{i}", "n1", group="g1") for i in range(4)]
    pods += [pod(f"g2-{i}", "n1", group="g2") for i in range(2)]
    pods += [pod(f"g2-{i}", "n2", group="g2", selector={"pool": "a"}) for i in (2, 3)]
    # a pending gang, a shared device on n1 (reservation + two halves): 4 + 2 + 1 = 7 of 8
    pods += [pod(f"g3-{i}", group="g3") for i in range(4)]
    pods += [reservation("n1", "grp-1"),
             pod("half-a", "n1", fraction="0.5", gpu_groups=("grp-1",), group="half-a"),
             pod("half-b", "n1", fraction="0.5", gpu_groups=("grp-1",), group="half-b")]
    pgs = [pg("g1", 4), pg("g2", 4), pg("g3", 4), pg("half-a", 1), pg("half-b", 1)]
    assert check(pods, nodes, pgs) == []
    assert gang_counts(pods, pgs) == {"whole": 4, "partial": 0, "pending": 1}


def test_whole_gpus_over_a_nodes_allocatable() -> None:
    pods = [pod(f"p{i}", "n1", gpus=2) for i in range(5)]  # 10 > 8
    (v,) = check(pods, [node("n1")])
    assert v.startswith("node-gpus n1: 10 GPUs held > 8 allocatable"), v


def test_terminating_pods_still_hold_and_finished_pods_do_not() -> None:
    pods = [pod(f"p{i}", "n1") for i in range(8)]
    pods.append(pod("leaving", "n1", terminating=True))
    assert len(check(pods, [node("n1")])) == 1
    pods[-1] = pod("done", "n1", phase="Succeeded")
    pods.append(pod("failed", "n1", phase="Failed"))
    assert check(pods, [node("n1")]) == []


def test_a_shared_device_counts_once_through_its_reservation_and_sharers() -> None:
    # 7 whole + one device seen through its reservation pod and three sharers: 8 of 8
    pods = [pod(f"p{i}", "n1") for i in range(7)]
    pods += [reservation("n1", "grp-1")]
    pods += [pod(f"s{i}", "n1", fraction="0.3", gpu_groups=("grp-1",)) for i in range(3)]
    assert check(pods, [node("n1")]) == []
    # without its reservation pod (deleted meanwhile) the device still counts once
    assert check(pods[:7] + pods[8:], [node("n1")]) == []
    # a second device is a ninth GPU
    pods.append(pod("other", "n1", fraction="0.5", gpu_groups=("grp-2",)))
    (v,) = check(pods, [node("n1")])
    assert v.startswith("node-gpus n1: 9 GPUs held > 8 allocatable"), v
    assert "2 shared ['grp-1', 'grp-2']" in v


def test_the_same_group_name_on_two_nodes_is_two_devices() -> None:
    pods = [reservation("n1", "grp"), reservation("n2", "grp")]
    pods += [pod(f"p{i}", n, gpus=1) for n in ("n1", "n2") for i in range(1)]
    assert check(pods, [node("n1", gpus=2), node("n2", gpus=2)]) == []
    pods.append(pod("extra", "n2"))
    (v,) = check(pods, [node("n1", gpus=2), node("n2", gpus=2)])
    assert v.startswith("node-gpus n2: 3 GPUs held > 2"), v


def test_fractions_over_one_on_a_shared_device() -> None:
    pods = [reservation("n1", "grp-1"),
            pod("a", "n1", fraction="0.7", gpu_groups=("grp-1",)),
            pod("b", "n1", fraction="0.5", gpu_groups=("grp-1",))]
    (v,) = check(pods, [node("n1")])
    assert v.startswith("shared-gpu n1/grp-1: fractions 1.2 > 1"), v
    # a finished sharer gives its part back
    pods[1]["status"]["phase"] = "Succeeded"
    assert check(pods, [node("n1")]) == []


def test_gpu_memory_is_a_fraction_of_the_nodes_device_memory() -> None:
    pods = [pod("a", "n1", memory="40960", gpu_groups=("g",)),
            pod("b", "n1", memory="40960", gpu_groups=("g",))]
    assert check(pods, [node("n1", memory_mib=81920)]) == []
    (v,) = check(pods, [node("n1", memory_mib=61440)])
    assert v.startswith("shared-gpu n1/g: fractions 1.33333 > 1"), v


def test_multi_device_fractions_count_on_each_device() -> None:
    pods = [pod("a", "n1", fraction="0.6", gpu_groups=("x", "y")),
            pod("b", "n1", fraction="0.6", gpu_groups=("y",))]
    (v,) = check(pods, [node("n1", gpus=2)])
    assert v.startswith("shared-gpu n1/y: fractions 1.2 > 1"), v


def test_a_partial_gang_older_than_the_deadline() -> None:
    pods = [pod("g-0", "n1", group="g", bound_ago=45), pod("g-1", "n1", group="g", bound_ago=2),
            pod("g-2", group="g"), pod("g-3", group="g")]
    (v,) = check(pods, [node("n1")], [pg("g", 4)])
    assert v.startswith("partial-gang team/g: 2/4 pods bound (['g-0', 'g-1'])"), v
    assert "first bound 45s ago, deadline 30s" in v
    # younger than the deadline: a gang being bound, not a violation yet
    young = [pod("g-0", "n1", group="g", bound_ago=10), *pods[1:]]
    assert check(young, [node("n1")], [pg("g", 4)]) == []
    # no PodScheduled condition: the pod's creation time counts
    del pods[0]["status"]["conditions"]
    assert len(check(pods, [node("n1")], [pg("g", 4)])) == 1


def test_whole_pending_deleted_and_other_namespace_gangs_are_not_partial() -> None:
    whole = [pod(f"w-{i}", "n1", group="w", bound_ago=100) for i in range(4)]
    pending = [pod(f"p-{i}", group="p") for i in range(4)]
    # min 2 of 3: two bound is whole enough
    min2 = [pod("m-0", "n1", group="m", bound_ago=100), pod("m-1", "n1", group="m"),
            pod("m-2", group="m")]
    deleting = [pod("d-0", "n1", group="d", bound_ago=100)]
    elsewhere = [pod("x-0", "n1", group="x", ns="other", bound_ago=100)]
    pgs = [pg("w", 4), pg("p", 4), pg("m", 2), pg("d", 4, deleting=True), pg("x", 4)]
    assert check(whole + pending + min2 + deleting + elsewhere, [node("n1", gpus=16)], pgs) == []
    # the same pod in the PodGroup's own namespace makes it partial
    elsewhere[0]["metadata"]["namespace"] = "team"
    (v,) = check(whole + pending + min2 + deleting + elsewhere, [node("n1", gpus=16)],
                 [*pgs[:4], pg("x", 4, ns="team")])
    assert v.startswith("partial-gang team/x: 1/4"), v


def test_finished_members_do_not_count_as_bound() -> None:
    pods = [pod("g-0", "n1", group="g", bound_ago=100),
            *[pod(f"g-{i}", "n1", group="g", bound_ago=100, phase="Succeeded")
              for i in (1, 2, 3)]]
    (v,) = check(pods, [node("n1")], [pg("g", 4)])
    assert v.startswith("partial-gang team/g: 1/4"), v


def test_a_pod_on_a_node_its_selector_excludes() -> None:
    pods = [pod("p", "n1", selector={"pool": "a"}), pod("q", "n2", selector={"pool": "a"})]
    (v,) = check(pods, [node("n1", labels={"pool": "b"}), node("n2", labels={"pool": "a"})])
    assert v == "node-selector team/p: bound to n1, whose labels do not match {'pool': 'a'}"


def test_pods_on_unknown_nodes_are_not_judged() -> None:
    assert check([pod(f"p{i}", "gone", gpus=4) for i in range(4)], [node("n1")]) == []


def test_a_sharer_bound_without_a_device_holds_one_of_its_own() -> None:
    pods = [pod(f"p{i}", "n1") for i in range(8)]
    pods.append(pod("lost", "n1", fraction="0.5"))
    (v,) = check(pods, [node("n1")])
    assert "<no group: team/lost>" in v


def test_each_kind_is_told_apart_and_keys_ignore_age() -> None:
    pods = [pod(f"p{i}", "n1", gpus=3) for i in range(3)]  # 9 > 8
    pods += [reservation("n2", "g"), pod("a", "n2", fraction="0.9", gpu_groups=("g",)),
             pod("b", "n2", fraction="0.9", gpu_groups=("g",))]
    pods += [pod("gang-0", "n2", group="gang", bound_ago=60, selector={"pool": "x"})]
    found = find_violations(pods, [node("n1"), node("n2")], [pg("gang", 2)], NOW, DEADLINE)
    assert sorted(v.kind for v in found) == ["node-gpus", "node-selector", "partial-gang",
                                             "shared-gpu"]
    later = find_violations(pods, [node("n1"), node("n2")], [pg("gang", 2)], NOW + 10,
                            DEADLINE)
    assert [v.key for v in found] == [v.key for v in later]
    assert [str(v) for v in found] != [str(v) for v in later]  # the age moved on


@pytest.mark.parametrize("value, expected", [
    ("2025-06-01T12:00:00Z", NOW), ("2025-06-01T12:00:00.500000Z", NOW + 0.5),
    ("2025-06-01T12:00:00+00:00", NOW), (None, None), ("garbage", None)])
def test_parse_time(value: Any, expected: float | None) -> None:
    assert parse_time(value) == expected


def test_sanitized_client_objects_are_read_too() -> None:
    """As `ApiClient.sanitize_for_serialization` returns them: datetimes become ISO strings
    with +00:00, keys are the API's camelCase."""
    from kubernetes import client

    api = client.ApiClient()
    import datetime as dt

    t = dt.datetime.fromtimestamp(NOW - 60, dt.UTC)
    objs = [client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"g-{i}", namespace="team",
                                     annotations={"pod-group-name": "g"},
                                     creation_timestamp=t),
        spec=client.V1PodSpec(node_name="n1", containers=[client.V1Container(
            name="c", resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}))]),
        status=client.V1PodStatus(phase="Running", conditions=[client.V1PodCondition(
            type="PodScheduled", status="True", last_transition_time=t)]))
        for i in range(2)]
    pods = [api.sanitize_for_serialization(o) for o in objs]
    nodes = [api.sanitize_for_serialization(client.V1Node(
        metadata=client.V1ObjectMeta(name="n1"),
        status=client.V1NodeStatus(allocatable={"nvidia.com/gpu": "1"})))]
    found = check(pods, nodes, [pg("g", 4)])
    assert sorted(v.split(":")[0] for v in found) == ["node-gpus n1", "partial-gang team/g"]


def test_cycles_ending_after_the_lease_was_lost_are_found_in_the_log(tmp_path) -> None:
    from kai_ray.testing.chaos import Replica

    r = Replica("r7", tmp_path / "kubeconfig", tmp_path, [])
    prefix = "2026-01-01 00:00:0{},123 INFO kai_ray"
    cycle = (".controller.scheduler_loop: cycle {}: snapshot of 24 jobs (0.00s), core 0.00s, "
             "{} binds / 0 evictions / 5 pending jobs applied in 19.09s")
    before = prefix.format(0) + cycle.format(2, 16) + "\n"
    r.proc.log_path.write_text(before + "\n".join([
        prefix.format(1) + cycle.format(3, 4),  # while leading: fine
        prefix.format(2) + ": lost leadership",
        prefix.format(3) + cycle.format(4, 0),  # nothing applied: fine
        prefix.format(3) + ".k8s.binder: PodGroup g1: intent not cleared (Fenced: 0.0s)",
        prefix.format(4) + cycle.format(5, 13)]) + "\n")
    assert r.stale_cycles(len(before)) == [
        "r7: a cycle reporting 13 binds / 0 evictions (cycle 5, applied in 19.09s) ended at "
        "2026-01-01 00:00:04,123, after it lost the lease at 2026-01-01 00:00:02,123; 1 log "
        "lines since say fenced"]
    assert r.stale_cycles(r.log_size()) == []


def test_replica_errors_name_the_exception(tmp_path) -> None:
    from kai_ray.testing.chaos import Chaos

    (tmp_path / "r3").mkdir()
    (tmp_path / "r3" / "kai-ray-run-1.log").write_text(
        "2026-01-01 00:00:00,000 INFO kai_ray: fine\n"
        "2026-01-01 00:00:01,000 ERROR kai_ray.controller.scheduler_loop: scheduling cycle "
        "failed\nTraceback (most recent call last):\n  File \"x.py\", line 1, in run\n"
        "    self.cycle()\n    ^^^^\nTypeError: 'type' object is not iterable\n"
        "2026-01-01 00:00:02,000 ERROR kai_ray: plain\n")
    chaos = Chaos.__new__(Chaos)  # no cluster needed to read logs
    chaos.workdir = tmp_path
    assert chaos.replica_errors() == [
        "r3: 2026-01-01 00:00:01,000 ERROR kai_ray.controller.scheduler_loop: scheduling cycle "
        "failed -> TypeError: 'type' object is not iterable",
        "r3: 2026-01-01 00:00:02,000 ERROR kai_ray: plain"]
