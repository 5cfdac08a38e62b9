from __future__ import annotations

import copy
from typing import Any

from grouping_objects import QUEUE, FakeApi, kuberay_pod, ray_cluster, worker_group

from kai_ray.grouping import (
    group_pod,
    podgroup_update,
    ray_gang_update,
    resolve_top_owner,
)


def _desired(rc: dict[str, Any]) -> dict[str, Any]:
    p = kuberay_pod(rc, "headgroup")
    return group_pod(p, resolve_top_owner(p, FakeApi(rc).get_owner), {"train"}).podgroup


def _as_stored(pg: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns: defaults filled in, resourceVersion and status added."""
    stored = copy.deepcopy(pg)
    stored["metadata"]["resourceVersion"] = "7"
    stored["spec"].update(markUnschedulable=True, schedulingBackoff=-1)
    for sg in stored["spec"].get("subGroups", []):
        sg["parent"] = None
    stored["status"] = {"resourcesStatus": {"allocated": {"cpu": "1"}}}
    return stored


def test_unchanged_podgroup_needs_no_update() -> None:
    rc = ray_cluster("rc", worker_group(2, 2, name="w"), labels={QUEUE: "a"})
    assert podgroup_update(_as_stored(_desired(rc)), _desired(rc)) is None


def test_update_replaces_spec_but_keeps_queue_and_scheduler_fields() -> None:
    rc = ray_cluster("rc", worker_group(2, 2, name="w"), labels={QUEUE: "a"})
    stored = _as_stored(_desired(rc))
    stored["spec"].update(markUnschedulable=False, schedulingBackoff=1)
    rc["metadata"]["labels"][QUEUE] = "b"  # a queue change is never applied
    rc["metadata"]["labels"]["priorityClassName"] = "train"
    rc["spec"]["workerGroupSpecs"][0].update(replicas=4, minReplicas=3)
    updated = podgroup_update(stored, _desired(rc))
    assert updated is not None
    assert updated["spec"]["queue"] == "a"
    assert updated["spec"]["markUnschedulable"] is False
    assert updated["spec"]["schedulingBackoff"] == 1
    assert updated["spec"]["minMember"] == 4
    assert updated["spec"]["subGroups"][1] == {"name": "w", "minMember": 3}
    assert updated["metadata"]["labels"][QUEUE] == "a"  # the old queue label is kept too
    assert updated["metadata"]["resourceVersion"] == "7" and updated["status"] == stored["status"]
    assert stored["spec"]["minMember"] == 3  # the input is not modified


def test_labels_and_annotations_are_merged_never_removed() -> None:
    rc = ray_cluster("rc", worker_group(1, name="w"), labels={QUEUE: "a", "keep": "1"})
    stored = _as_stored(_desired(rc))
    stored["metadata"]["annotations"]["added-by-someone"] = "x"
    del rc["metadata"]["labels"]["keep"]
    rc["metadata"]["labels"]["new"] = "2"
    updated = podgroup_update(stored, _desired(rc))
    assert updated is not None
    assert updated["metadata"]["labels"] == {QUEUE: "a", "keep": "1", "new": "2"}
    assert updated["metadata"]["annotations"]["added-by-someone"] == "x"
    # removing a label alone is not a change
    del rc["metadata"]["labels"]["new"]
    assert podgroup_update(updated, _desired(rc)) is None


def test_node_pool_label_is_never_added_or_changed_by_an_update() -> None:
    rc = ray_cluster("rc", worker_group(1, name="w"), labels={QUEUE: "a"})
    stored = _as_stored(_desired(rc))
    rc["metadata"]["labels"]["kai.scheduler/node-pool"] = "a100"
    assert podgroup_update(stored, _desired(rc)) is None
    stored["metadata"]["labels"]["kai.scheduler/node-pool"] = "h100"
    rc["metadata"]["labels"]["other"] = "x"
    updated = podgroup_update(stored, _desired(rc))
    assert updated is not None
    assert updated["metadata"]["labels"]["kai.scheduler/node-pool"] == "h100"


def test_owner_change_is_an_update() -> None:
    rc = ray_cluster("rc", worker_group(1, name="w"), labels={QUEUE: "a"})
    stored = _as_stored(_desired(rc))
    stored["metadata"]["ownerReferences"][0]["uid"] = "older"
    updated = podgroup_update(stored, _desired(rc))
    assert updated is not None and updated["metadata"]["ownerReferences"][0]["uid"] == "uid-rc"


def test_ray_gang_update_follows_min_replicas() -> None:
    rc = ray_cluster("rc", worker_group(6, 2, name="w"), labels={QUEUE: "a"})
    stored = _as_stored(_desired(rc))
    assert stored["spec"]["minMember"] == 3
    rc["spec"]["workerGroupSpecs"][0]["replicas"] = 2  # autoscaler scales within the gang: no-op
    assert ray_gang_update(stored, rc) is None
    rc["spec"]["workerGroupSpecs"][0].update(replicas=6, minReplicas=4)
    updated = ray_gang_update(stored, rc)
    assert updated is not None and updated["spec"]["minMember"] == 5
    assert updated["spec"]["subGroups"] == [{"name": "headgroup", "minMember": 1},
                                            {"name": "w", "minMember": 4}]
    assert updated["spec"]["queue"] == "a" and updated["metadata"]["resourceVersion"] == "7"
    rc["spec"]["workerGroupSpecs"][0]["suspend"] = True
    suspended = ray_gang_update(updated, rc)
    assert suspended is not None and suspended["spec"]["minMember"] == 1
