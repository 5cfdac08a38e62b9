"""`PodReads`: a snapshot reads again only the pods the watch replaced (or whose bind intent
changed); what it gives back is what `pod_from` gives."""

from __future__ import annotations

import copy

import pytest

from kai_ray import api_names
from kai_ray.core.model import PodStatus
from kai_ray.k8s import convert
from kai_ray.k8s.cache import PodReads


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
