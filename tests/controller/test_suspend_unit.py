"""The pure parts of RayJob suspension: which PodGroups, which RayJobs, and the stand-in pods
that keep a suspended gang's demand in the snapshot."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.k8s import convert
from kai_ray.k8s.suspend import (
    DEMAND_ANNOTATION,
    Suspender,
    demand_of,
    stand_in_pods,
    wants_suspend,
)


def _pg(owner_kind: str = "RayJob", annotations: dict | None = None) -> dict:
    return {"metadata": {"name": "pg-job-1", "namespace": "ns", "annotations": annotations or {},
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": owner_kind,
                                              "name": "job", "uid": "1"}]}}


def _pod(name: str, group: str, gpus: int = 0, fraction: str | None = None) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    ann = {"pod-group-name": "pg-job-1", "unrelated": "x"}
    if fraction:
        ann["gpu-fraction"] = fraction
    return {"metadata": {"name": name, "namespace": "ns", "annotations": ann,
                         "labels": {"ray.io/group": group, "kai.scheduler/subgroup-name": group,
                                    "ray.io/node-type": "head" if group == "headgroup"
                                    else "worker"}},
            "spec": {"schedulerName": "kai-scheduler", "nodeSelector": {"pool": "p"},
                     "nodeName": "n0",
                     "containers": [{"name": "ray", "image": "ray", "resources": {
                         "requests": {"cpu": "1", "memory": "1Gi"}, "limits": limits}}]},
            "status": {"phase": "Running"}}


def test_only_rayjob_podgroups_suspend_unless_the_strategy_says_otherwise() -> None:
    assert wants_suspend(_pg())
    assert not wants_suspend(_pg("RayCluster"))
    assert not wants_suspend(_pg(annotations={"kai.scheduler/eviction-strategy": "evict"}))


def test_stand_ins_ask_for_what_the_gang_had_and_are_pending() -> None:
    pods = [_pod("h", "headgroup"), _pod("w0", "gpu", gpus=1), _pod("w1", "half", fraction="0.5")]
    pg = _pg(annotations={DEMAND_ANNOTATION: json.dumps(demand_of(pods))})
    stand_ins = stand_in_pods(pg)
    assert [p["metadata"]["name"] for p in stand_ins] == ["h", "w0", "w1"]
    for real, stand_in in zip(pods, stand_ins, strict=True):
        a, b = convert.pod_from(real), convert.pod_from(stand_in)
        assert b.request == a.request and b.subgroup == a.subgroup
        assert b.node_selector == a.node_selector and b.is_ray_head == a.is_ray_head
        assert b.status.value == "Pending" and b.node is None
    assert "unrelated" not in stand_ins[2]["metadata"]["annotations"]
    assert stand_in_pods(_pg()) == []
    assert stand_in_pods(_pg(annotations={DEMAND_ANNOTATION: "not json"})) == []


def test_kuberay_suspend_rules() -> None:
    ok = {"spec": {"shutdownAfterJobFinishes": True},
          "status": {"jobDeploymentStatus": "Running"}}
    assert Suspender.suspendable(ok) is None
    waiting = {**ok, "status": {"jobDeploymentStatus": "Waiting"}}
    assert "Waiting" in Suspender.suspendable(waiting)
    assert "shutdownAfterJobFinishes" in Suspender.suspendable(
        {**ok, "spec": {"shutdownAfterJobFinishes": False}})
    assert "clusterSelector" in Suspender.suspendable(
        {**ok, "spec": {"shutdownAfterJobFinishes": True, "clusterSelector": {"a": "b"}}})


class _Custom:
    """CustomObjectsApi stand-in: the RayJob read, and patches recorded (or refused)."""

    def __init__(self, job: dict, refuse_job_patch: bool) -> None:
        self.job = job
        self.refuse = refuse_job_patch
        self.patches: list[tuple[str, dict]] = []

    def get_namespaced_custom_object(self, group, version, ns, plural, name) -> dict:
        return self.job

    def patch_namespaced_custom_object(self, group, version, ns, plural, name, body) -> None:
        if plural == "rayjobs" and self.refuse:
            raise ApiException(status=403, reason="Forbidden")
        self.patches.append((plural, body))


class _Events:
    def __init__(self) -> None:
        self.emitted: list[str] = []

    def emit(self, obj, reason, message, **kwargs) -> None:
        self.emitted.append(reason)


@pytest.mark.parametrize("refused", [False, True])
def test_a_refused_suspend_leaves_no_demand_behind(refused: bool) -> None:
    """Without RBAC to patch the RayJob, the gang is evicted instead (False) and the demand
    annotation written first is taken back: left, it would outlive the gang's pods as
    stand-ins."""
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob",
           "metadata": {"name": "job", "namespace": "ns", "uid": "1"},
           "spec": {"shutdownAfterJobFinishes": True},
           "status": {"jobDeploymentStatus": "Running"}}
    custom, events = _Custom(job, refused), _Events()
    suspender = Suspender(client.ApiClient(), events)  # type: ignore[arg-type]
    suspender.custom = custom  # type: ignore[assignment]
    done = suspender.suspend(_pg(), [_pod("h", "headgroup")], "preempted by build")
    demand = [body["metadata"]["annotations"][DEMAND_ANNOTATION]
              for plural, body in custom.patches if plural == "podgroups"]
    if refused:
        assert done is False and events.emitted == []
        assert len(demand) == 2 and demand[0] and demand[1] is None
    else:
        assert done is True and events.emitted == ["Suspended"]
        assert len(demand) == 1 and json.loads(demand[0])[0]["name"] == "h"
        assert ("rayjobs", {"spec": {"suspend": True}}) in custom.patches
