"""`PodReads`: a snapshot reads again only the pods the watch replaced (or whose bind intent
changed); what it gives back is what `pod_from` gives."""

from __future__ import annotations

import copy

import pytest

from kai_ray import api_names
from kai_ray.core.model import PodStatus
from kai_ray.k8s import convert
from kai_ray.k8s.reads import JobReads, NodeReads, PodReads


def _pod(name: str, node: str | None = None) -> dict:
    spec: dict = {"schedulerName": "kai-scheduler",
                  "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ns", "uid": name,
                         "creationTimestamp": "2026-11-27T10:00:00Z"},
            "spec": spec, "status": {"phase": "Pending"}}


def test_the_same_object_is_read_once_and_equals_pod_from() -> None:
    reads = PodReads()
    pod = _pod("a")
    first = reads.read(pod, None)
    assert first == convert.pod_from(pod)
    assert reads.read(pod, None) is first


def test_a_replaced_object_is_read_again() -> None:
    reads = PodReads()
    pod = _pod("a")
    reads.read(pod, None)
    bound = _pod("a", node="n1")  # what the watch puts in the cache after the bind
    again = reads.read(bound, None)
    assert again.status == PodStatus.BOUND and again.node == "n1"


def test_a_changed_intent_entry_is_read_again() -> None:
    reads = PodReads()
    pod = _pod("a")
    assert reads.read(pod, None).status == PodStatus.PENDING
    intent = {"node": "n2", "gpu_groups": []}
    binding = reads.read(pod, intent)
    assert binding.status == PodStatus.BINDING and binding.node == "n2"
    edited = copy.deepcopy(intent)
    edited["node"] = "n3"
    assert reads.read(pod, edited).node == "n3"


def test_a_bad_pod_raises_every_time_and_is_not_kept() -> None:
    reads = PodReads()
    pod = _pod("a")
    pod["metadata"]["labels"] = {api_names.TASK_PRIORITY_LABEL: "high"}
    for _ in range(2):
        with pytest.raises(convert.InvalidField):
            reads.read(pod, None)


def test_what_a_snapshot_did_not_read_is_forgotten() -> None:
    reads = PodReads()
    a, b = _pod("a"), _pod("b")
    reads.read(a, None)
    reads.read(b, None)
    reads.forget_unseen()
    first_a = reads.read(a, None)  # only a is read in the next snapshot
    reads.forget_unseen()
    assert reads.read(a, None) is first_a
    assert len(reads._held) == 1


def _node(name: str, gpu_memory: str = "81559") -> dict:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": gpu_memory}},
            "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": "8", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_node_is_read_once_until_replaced_and_its_problems_are_said_every_time() -> None:
    reads = NodeReads()
    good = _node("a")
    problems: list = []
    first = reads.read(good, problems)
    assert first == convert.node_from(good) and not problems
    assert reads.read(good, problems) is first
    bad = _node("a", gpu_memory="lots")  # the watch replaced it: read again, its problem kept
    for _ in range(2):
        said: list = []
        node = reads.read(bad, said)
        assert not node.gpu_memory_synced
        assert [p.field for p in said] == [p.field for p in _problems_of(bad)] != []
    reads.forget_unseen()  # looked up in this snapshot: kept
    assert set(reads._held) == {"a"}
    reads.forget_unseen()  # not in the next: dropped
    assert not reads._held


def _problems_of(node: dict) -> list:
    found: list = []
    convert.node_from(node, found)
    return found


def test_a_job_is_kept_while_its_podgroup_members_and_classes_are_the_same() -> None:
    jobs = JobReads()
    pg, members = {"metadata": {"name": "g"}}, [_pod("a"), _pod("b")]
    classes = ((("high", 100),), None)
    job = object()
    assert jobs.get("ns/g", pg, members, classes) is None
    jobs.keep("ns/g", pg, members, classes, job)  # type: ignore[arg-type]
    assert jobs.get("ns/g", pg, list(members), classes) is job
    assert jobs.get("ns/g", pg, [members[0], _pod("b")], classes) is None  # b replaced
    assert jobs.get("ns/g", pg, members[:1], classes) is None  # b gone
    assert jobs.get("ns/g", dict(pg), members, classes) is None  # the PodGroup replaced
    assert jobs.get("ns/g", pg, members, ((("high", 200),), None)) is None
    jobs.forget_unseen()
    jobs.forget_unseen()  # not asked for in the last snapshot: dropped
    assert jobs.get("ns/g", pg, members, classes) is None


def test_pods_of_a_kept_job_stay_read() -> None:
    reads = PodReads()
    a = _pod("a")
    first = reads.read(a, None)
    reads.forget_unseen()
    reads.seen([a])  # its job came from JobReads: not read, still held
    reads.forget_unseen()
    assert reads.read(a, None) is first
