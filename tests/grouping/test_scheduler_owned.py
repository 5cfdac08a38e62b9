"""Annotations only the scheduler writes (issue 20): the pod grouper never copies them from a
user's object into a PodGroup, and a resync keeps the scheduler's own values on the PodGroup."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from grouping_objects import QUEUE, FakeApi, kuberay_pod, obj, pod, ray_cluster, worker_group

from kai_ray import api_names
from kai_ray.api_names import REPLICA_HOSTS_ANNOTATION
from kai_ray.grouping import group_pod, podgroup_update, resolve_top_owner
from kai_ray.grouping.config import is_scheduler_owned, without_scheduler_owned

BIND_INTENT = "kai-ray.io/bind-intent"
LAST_START = "kai.scheduler/last-start-timestamp"
STALE = "kai.scheduler/stale-podgroup-timestamp"
DEMAND = "kai-ray.io/suspended-demand"
FORGED = {
    BIND_INTENT: json.dumps({"rc-headgroup-0": {"node": "the-users-pick"}}),
    LAST_START: "2999-01-01T00:00:00Z",
    STALE: "1970-01-01T00:00:00Z",
    DEMAND: "[]",
    REPLICA_HOSTS_ANNOTATION: json.dumps({"w": 1}),
}
USER_SETTINGS = {
    "kai.scheduler/eviction-strategy": "evict",
    "kai.scheduler/topology": "dc",
    "kai.scheduler/topology-required-placement": "rack",
    "pod-group-name": "x",
    "gpu-fraction": "0.5",
    "runai/shared-gpu-configmap": "p-abc-shared-gpu",
    "kwok.kai-ray.io/exit-code": "0",  # a different domain, not kai-ray.io/
    "note": "mine",
}


def _group(p: dict[str, Any], *objects: dict[str, Any]) -> dict[str, Any]:
    owners = resolve_top_owner(p, FakeApi(*objects).get_owner)
    return group_pod(p, owners, {"train"}).podgroup


@pytest.mark.parametrize("key", sorted(FORGED))
def test_the_scheduler_owns_its_record_keys(key: str) -> None:
    assert is_scheduler_owned(key)


@pytest.mark.parametrize("key", sorted(USER_SETTINGS))
def test_user_settings_stay_copyable(key: str) -> None:
    assert not is_scheduler_owned(key)


def test_the_keys_the_scheduler_reads_are_all_scheduler_owned() -> None:
    from kai_ray.k8s import binder, suspend  # the writers' own constants
    for key in (api_names.BIND_INTENT_ANNOTATION, api_names.LAST_START_ANNOTATION,
                api_names.STALE_ANNOTATION, api_names.REPLICA_HOSTS_ANNOTATION,
                suspend.DEMAND_ANNOTATION):
        assert is_scheduler_owned(key), key
    for key in (suspend.STRATEGY_ANNOTATION, binder.CONFIGMAP_ANNOTATION,
                api_names.POD_GROUP_ANNOTATION):
        assert not is_scheduler_owned(key), key
    assert without_scheduler_owned({**FORGED, **USER_SETTINGS}) == USER_SETTINGS


def test_forged_keys_on_a_raycluster_never_reach_its_podgroup() -> None:
    rc = ray_cluster("rc", worker_group(2, 2, name="w"), labels={QUEUE: "a"},
                     annotations={**FORGED, **USER_SETTINGS})
    ann = _group(kuberay_pod(rc, "headgroup"), rc)["metadata"]["annotations"]
    assert not {k for k in ann if is_scheduler_owned(k)}  # not even a forged replica-hosts
    assert {k: ann[k] for k in USER_SETTINGS} == USER_SETTINGS


def test_forged_keys_on_a_bare_pod_or_a_job_never_reach_the_podgroup() -> None:
    ann = _group(pod("solo", labels={QUEUE: "q"}, annotations=dict(FORGED)))["metadata"][
        "annotations"]
    assert not {k for k in ann if is_scheduler_owned(k)}
    job = obj("batch/v1", "Job", "j", labels={QUEUE: "q"}, annotations=dict(FORGED))
    ann = _group(pod(owner=job, annotations=dict(FORGED)), job)["metadata"]["annotations"]
    assert not {k for k in ann if is_scheduler_owned(k)}


def test_the_grouper_still_writes_its_own_replica_hosts() -> None:
    rc = ray_cluster("rc", worker_group(2, 2, name="w", hosts=2), labels={QUEUE: "a"},
                     annotations={REPLICA_HOSTS_ANNOTATION: json.dumps({"w": 9})})
    ann = _group(kuberay_pod(rc, "headgroup"), rc)["metadata"]["annotations"]
    assert json.loads(ann[REPLICA_HOSTS_ANNOTATION]) == {"w": 2}  # computed, not the forged 9


def _stored(pg: dict[str, Any], **scheduler_written: str) -> dict[str, Any]:
    stored = copy.deepcopy(pg)
    stored["metadata"]["resourceVersion"] = "7"
    stored["metadata"]["annotations"].update(scheduler_written)
    return stored


def test_a_resync_keeps_the_schedulers_own_annotations() -> None:
    rc = ray_cluster("rc", worker_group(2, 2, name="w"), labels={QUEUE: "a"})
    head = kuberay_pod(rc, "headgroup")
    ours = {BIND_INTENT: json.dumps({head["metadata"]["name"]: {"node": "n1"}}),
            LAST_START: "2024-05-01T00:00:00Z", STALE: "2024-05-01T00:01:00Z", DEMAND: "[]"}
    stored = _stored(_group(head, rc), **ours)
    assert podgroup_update(stored, _group(head, rc)) is None  # nothing to write

    # the user forges them on the RayCluster and changes something real: the update keeps ours
    rc["metadata"]["annotations"] = {**FORGED, "note": "new"}
    rc["spec"]["workerGroupSpecs"][0].update(replicas=3, minReplicas=3)
    updated = podgroup_update(stored, _group(head, rc))
    assert updated is not None
    ann = updated["metadata"]["annotations"]
    assert {k: ann[k] for k in ours} == ours
    assert ann["note"] == "new" and REPLICA_HOSTS_ANNOTATION not in ann
    assert updated["spec"]["minMember"] == 4


def test_an_update_never_takes_scheduler_owned_keys_from_desired() -> None:
    """Even a desired PodGroup built elsewhere (or by an older grouper) cannot overwrite them."""
    rc = ray_cluster("rc", worker_group(2, 2, name="w"), labels={QUEUE: "a"})
    head = kuberay_pod(rc, "headgroup")
    stored = _stored(_group(head, rc), **{BIND_INTENT: "{}"})
    desired = _group(head, rc)
    desired["metadata"]["annotations"].update(FORGED)
    desired["metadata"]["annotations"][REPLICA_HOSTS_ANNOTATION] = json.dumps({"w": 2})
    updated = podgroup_update(stored, desired)
    assert updated is not None  # only for the grouper's own replica-hosts
    ann = updated["metadata"]["annotations"]
    assert ann[BIND_INTENT] == "{}"
    assert not {LAST_START, STALE, DEMAND} & set(ann)
    assert json.loads(ann[REPLICA_HOSTS_ANNOTATION]) == {"w": 2}
    del desired["metadata"]["annotations"][REPLICA_HOSTS_ANNOTATION]
    assert podgroup_update(stored, desired) is None

