from __future__ import annotations

import copy
import json
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


# ---- kai-ray: grouper-owned annotations follow the owner; a raised minimum is recorded ---------

ELASTIC = "kai-ray.io/elastic-subgroups"
RAISED = "kai-ray.io/raised-minimum"
LAST_START = "kai.scheduler/last-start-timestamp"


def _autoscaled(*groups: dict[str, Any]) -> dict[str, Any]:
    rc = ray_cluster("rc", *groups, labels={QUEUE: "a"})
    rc["spec"]["enableInTreeAutoscaling"] = True
    return rc


def _started(pg: dict[str, Any], at: str = "2024-05-01T00:00:00Z") -> dict[str, Any]:
    pg["metadata"]["annotations"][LAST_START] = at
    return pg


def test_an_elastic_group_given_a_minimum_leaves_the_elastic_annotation() -> None:
    rc = _autoscaled(worker_group(3, 0, name="w"))
    stored = _as_stored(_desired(rc))
    assert json.loads(stored["metadata"]["annotations"][ELASTIC]) == ["w"]
    assert podgroup_update(stored, _desired(rc)) is None  # the autoscaler's replicas: no change
    rc["spec"]["workerGroupSpecs"][0]["replicas"] = 5
    assert podgroup_update(stored, _desired(rc)) is None
    rc["spec"]["workerGroupSpecs"][0]["minReplicas"] = 2
    updated = podgroup_update(stored, _desired(rc))
    assert updated is not None and ELASTIC not in updated["metadata"]["annotations"]
    assert updated["spec"]["subGroups"][1] == {"name": "w", "minMember": 2}
    assert podgroup_update(updated, _desired(rc)) is None


def test_replica_hosts_go_when_no_group_has_several_hosts() -> None:
    rc = ray_cluster("rc", worker_group(2, 1, name="w", hosts=2), labels={QUEUE: "a"})
    stored = _as_stored(_desired(rc))
    assert "kai-ray.io/replica-hosts" in stored["metadata"]["annotations"]
    del rc["spec"]["workerGroupSpecs"][0]["numOfHosts"]
    updated = podgroup_update(stored, _desired(rc))
    assert updated is not None and "kai-ray.io/replica-hosts" not in (
        updated["metadata"]["annotations"])


def test_raising_a_started_gangs_minimum_records_the_minimum_it_ran_with() -> None:
    rc = ray_cluster("rc", worker_group(2, 2, name="w"), worker_group(1, 1, name="v"),
                     labels={QUEUE: "a"})
    stored = _started(_as_stored(_desired(rc)))
    rc["spec"]["workerGroupSpecs"][0].update(replicas=4, minReplicas=4)
    raised = podgroup_update(stored, _desired(rc))
    assert raised is not None and raised["spec"]["minMember"] == 6
    assert json.loads(raised["metadata"]["annotations"][RAISED]) == {
        "start": "2024-05-01T00:00:00Z", "minMember": 4,
        "subGroups": {"headgroup": 1, "v": 1, "w": 2}}
    assert podgroup_update(raised, _desired(rc)) is None  # a resync keeps it as it is

    # raised again in the same run: the lowest minimum of the run stays the record
    rc["spec"]["workerGroupSpecs"][0].update(replicas=5, minReplicas=5)
    again = podgroup_update(raised, _desired(rc))
    assert again is not None
    assert json.loads(again["metadata"]["annotations"][RAISED])["subGroups"]["w"] == 2
    # a group added by the raise had no minimum before it (0: not named)
    rc["spec"]["workerGroupSpecs"].append(worker_group(1, 1, name="new"))
    added = podgroup_update(again, _desired(rc))
    assert added is not None
    assert "new" not in json.loads(added["metadata"]["annotations"][RAISED])["subGroups"]

    # lowered back to what the gang ran with: nothing is raised, the record goes
    rc["spec"]["workerGroupSpecs"] = [worker_group(2, 2, name="w"), worker_group(1, 1, name="v")]
    lowered = podgroup_update(added, _desired(rc))
    assert lowered is not None and RAISED not in lowered["metadata"]["annotations"]
    assert lowered["metadata"]["annotations"][LAST_START] == "2024-05-01T00:00:00Z"


def test_a_raise_before_the_gang_ever_started_records_nothing() -> None:
    rc = ray_cluster("rc", worker_group(2, 2, name="w"), labels={QUEUE: "a"})
    stored = _as_stored(_desired(rc))
    rc["spec"]["workerGroupSpecs"][0].update(replicas=4, minReplicas=4)
    updated = podgroup_update(stored, _desired(rc))
    assert updated is not None and RAISED not in updated["metadata"]["annotations"]


def test_a_record_of_an_earlier_run_is_replaced_or_dropped() -> None:
    rc = ray_cluster("rc", worker_group(2, 2, name="w"), labels={QUEUE: "a"})
    stored = _started(_as_stored(_desired(rc)), "2024-05-02T00:00:00Z")
    stored["metadata"]["annotations"][RAISED] = json.dumps(
        {"start": "2024-05-01T00:00:00Z", "minMember": 1, "subGroups": {"headgroup": 1}})
    # the gang started again since (at minimum 3): the old record is obsolete
    dropped = podgroup_update(stored, _desired(rc))
    assert dropped is not None and RAISED not in dropped["metadata"]["annotations"]
    rc["spec"]["workerGroupSpecs"][0].update(replicas=3, minReplicas=3)
    updated = podgroup_update(stored, _desired(rc))
    assert updated is not None
    assert json.loads(updated["metadata"]["annotations"][RAISED]) == {
        "start": "2024-05-02T00:00:00Z", "minMember": 3,
        "subGroups": {"headgroup": 1, "w": 2}}


def test_the_record_is_never_taken_from_desired() -> None:
    rc = ray_cluster("rc", worker_group(2, 2, name="w"), labels={QUEUE: "a"},
                     annotations={RAISED: json.dumps({"start": "x", "minMember": 1})})
    desired = _desired(rc)
    assert RAISED not in desired["metadata"]["annotations"]
    desired["metadata"]["annotations"][RAISED] = "forged"
    assert podgroup_update(_started(_as_stored(_desired(rc))), desired) is None


def test_ray_gang_update_records_a_raise_and_the_elastic_groups() -> None:
    rc = _autoscaled(worker_group(2, 1, name="w"))
    stored = _started(_as_stored(_desired(rc)))
    rc["spec"]["workerGroupSpecs"][0]["minReplicas"] = 0
    lowered = ray_gang_update(stored, rc)
    assert lowered is not None and lowered["spec"]["minMember"] == 1
    assert json.loads(lowered["metadata"]["annotations"][ELASTIC]) == ["w"]
    assert RAISED not in lowered["metadata"]["annotations"]
    rc["spec"]["workerGroupSpecs"][0]["minReplicas"] = 2
    raised = ray_gang_update(lowered, rc)
    assert raised is not None and ELASTIC not in raised["metadata"]["annotations"]
    assert json.loads(raised["metadata"]["annotations"][RAISED]) == {
        "start": "2024-05-01T00:00:00Z", "minMember": 1, "subGroups": {"headgroup": 1}}
    assert ray_gang_update(raised, rc) is None


def test_the_scheduler_reads_the_elastic_groups_and_the_record_of_this_run_only() -> None:
    """What the grouper writes, as the scheduler's snapshot reads it (kai_ray.k8s.convert)."""
    from kai_ray.k8s.convert import job_from

    rc = _autoscaled(worker_group(2, 1, name="w"), worker_group(4, 0, name="e", hosts=2))
    stored = _started(_as_stored(_desired(rc)))
    job = job_from(stored, [], {}, None)
    assert [(s.name, s.min_member, s.replica_size, s.admitted_min_member)
            for s in job.subgroups] == [("headgroup", 1, 1, None), ("w", 1, 1, None),
                                        ("e", 0, 2, None)]
    assert job.admitted_min_member is None
    rc["spec"]["workerGroupSpecs"][0]["minReplicas"] = 2
    raised = podgroup_update(stored, _desired(rc))
    assert raised is not None
    job = job_from(raised, [], {}, None)
    assert job.min_member == 3 and job.admitted_min_member == 2
    assert {s.name: (s.min_member, s.admitted_min_member) for s in job.subgroups} == {
        "headgroup": (1, 1), "w": (2, 1), "e": (0, 0)}
    # the gang started again (a new last-start stamp): the record is not this run's
    _started(raised, "2024-06-01T00:00:00Z")
    job = job_from(raised, [], {}, None)
    assert job.admitted_min_member is None
    assert all(s.admitted_min_member is None for s in job.subgroups)
    # an elastic name that spec.subGroups also has keeps the spec's minimum
    raised["metadata"]["annotations"][ELASTIC] = json.dumps(["w", "e", 7])
    assert [(s.name, s.min_member) for s in job_from(raised, [], {}, None).subgroups] == [
        ("headgroup", 1), ("w", 2), ("e", 0)]
