"""Which pod events wake the pod grouper: a new pod, or a change of its owners, labels or
annotations; never a bind or a status update."""

from __future__ import annotations

import copy

import pytest

from kai_ray.k8s.cache import may_regroup

POD = {"metadata": {"name": "p", "namespace": "ns", "labels": {"kai.scheduler/queue": "q"},
                    "annotations": {}, "ownerReferences": [{"kind": "ReplicaSet", "uid": "1"}],
                    "resourceVersion": "1"},
       "spec": {"schedulerName": "kai-scheduler"}, "status": {"phase": "Pending"}}


def _changed(path: tuple[str, ...], value: object) -> dict:
    pod = copy.deepcopy(POD)
    target = pod
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    pod["metadata"]["resourceVersion"] = "2"
    return pod


def test_a_pod_new_to_the_cache_may_regroup() -> None:
    assert may_regroup(POD, None)


@pytest.mark.parametrize("path,value", [
    (("metadata", "labels"), {"kai.scheduler/queue": "other"}),
    (("metadata", "annotations"), {"pod-group-name": "pg"}),
    (("metadata", "ownerReferences"), [{"kind": "ReplicaSet", "uid": "2"}]),
])
def test_owner_label_and_annotation_changes_may_regroup(path: tuple[str, ...],
                                                        value: object) -> None:
    assert may_regroup(_changed(path, value), POD)


@pytest.mark.parametrize("path,value", [
    (("spec", "nodeName"), "n1"),
    (("status", "phase"), "Running"),
    (("status", "conditions"), [{"type": "PodScheduled", "status": "False"}]),
    (("metadata", "deletionTimestamp"), "2026-01-01T00:00:00Z"),
])
def test_binds_and_status_updates_do_not(path: tuple[str, ...], value: object) -> None:
    assert not may_regroup(_changed(path, value), POD)
