from __future__ import annotations

from typing import Any

import pytest
from grouping_objects import (
    QUEUE,
    FakeApi,
    kuberay_pod,
    obj,
    owned_by,
    pod,
    ray_cluster,
    worker_group,
)

from kai_ray.grouping import GroupingConfig, group_pod, resolve_top_owner, should_group

CLASSES = {"train", "build-preemptible", "build", "inference"}


def group(p: dict[str, Any], *objects: dict[str, Any], classes: set[str] = CLASSES,
          config: GroupingConfig | None = None, ns_labels: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    owners = resolve_top_owner(p, FakeApi(*objects).get_owner)
    return group_pod(p, owners, classes, config, ns_labels)


# ---- Ray ----------------------------------------------------------------------------------------

def _team_cluster(**kw: Any) -> dict[str, Any]:
    return ray_cluster("raycluster-sample", worker_group(2, 2, name="worker"),
                       labels={QUEUE: "team-a"}, **kw)


def test_raycluster_pods_share_one_gang_podgroup() -> None:
    rc = _team_cluster()
    pods = [kuberay_pod(rc, "headgroup"), *(kuberay_pod(rc, "worker", i) for i in (0, 1))]
    results = [group(p, rc) for p in pods]
    assert {r.name for r in results} == {"pg-raycluster-sample-uid-raycluster-sample"}
    pg = results[0].podgroup
    assert pg["apiVersion"] == "scheduling.run.ai/v2alpha2" and pg["kind"] == "PodGroup"
    assert pg["metadata"]["namespace"] == "ns"
    assert pg["metadata"]["ownerReferences"] == [{
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "raycluster-sample",
        "uid": "uid-raycluster-sample"}]
    assert pg["spec"] == {
        "minMember": 3, "queue": "team-a", "priorityClassName": "train",
        "subGroups": [{"name": "headgroup", "minMember": 1}, {"name": "worker", "minMember": 2}]}
    assert pg["metadata"]["labels"] == {QUEUE: "team-a"}
    assert [r.subgroup for r in results] == ["headgroup", "worker", "worker"]
    assert results[1].pod_patch() == {"metadata": {
        "annotations": {"pod-group-name": "pg-raycluster-sample-uid-raycluster-sample"},
        "labels": {"kai.scheduler/subgroup-name": "worker"}}}
    assert all(r.warnings == () for r in results)


def test_ray_priority_label_overrides_without_existence_check() -> None:
    rc = _team_cluster()
    rc["metadata"]["labels"].update({"ray.io/priority-class-name": "custom",
                                     "priorityClassName": "build"})
    assert group(kuberay_pod(rc, "headgroup"), rc).podgroup["spec"]["priorityClassName"] == "custom"


def test_ray_priority_class_label_on_the_cluster() -> None:
    rc = _team_cluster()
    rc["metadata"]["labels"]["priorityClassName"] = "build"
    assert group(kuberay_pod(rc, "worker"), rc).podgroup["spec"]["priorityClassName"] == "build"


def test_rayjob_podgroup_is_named_after_and_owned_by_the_rayjob() -> None:
    job = obj("ray.io/v1", "RayJob", "job", labels={QUEUE: "q"},
              status={"rayClusterName": "job-rc"})
    rc = ray_cluster("job-rc", worker_group(3, 1, name="w"), owners=[owned_by(job)])
    result = group(kuberay_pod(rc, "w"), job, rc)
    assert result.name == "pg-job-uid-job"
    assert result.podgroup["metadata"]["ownerReferences"][0]["kind"] == "RayJob"
    assert result.podgroup["spec"]["minMember"] == 2 and result.podgroup["spec"]["queue"] == "q"
    assert result.subgroup == "w"


def test_rayservice_sizes_come_from_the_active_cluster() -> None:
    svc = obj("ray.io/v1", "RayService", "svc", status={
        "activeServiceStatus": {"rayClusterName": "a"},
        "pendingServiceStatus": {"rayClusterName": "b"}})
    a = ray_cluster("a", worker_group(1, name="w"), owners=[owned_by(svc)])
    b = ray_cluster("b", worker_group(5, name="w"), owners=[owned_by(svc)])
    result = group(kuberay_pod(b, "w"), svc, a, b)
    assert result.name == "pg-svc-uid-svc" and result.podgroup["spec"]["minMember"] == 2


def test_ray_pod_outside_any_subgroup_gets_a_warning() -> None:
    rc = ray_cluster("rc", worker_group(1, name="w"), worker_group(2, name="off", suspend=True))
    p = kuberay_pod(rc, "off")
    result = group(p, rc)
    assert result.subgroup is None
    assert "kai.scheduler/subgroup-name" not in result.pod_patch()["metadata"].get("labels", {})
    assert any("ray.io/group='off', which is not a subgroup" in w for w in result.warnings)
    del p["metadata"]["labels"]["ray.io/group"]
    assert any("has no label ray.io/group" in w for w in group(p, rc).warnings)


def test_autoscaled_elastic_group_pods_keep_their_subgroup_label() -> None:
    """minReplicas 0 under in-tree autoscaling: no spec subgroup (the CRD refuses minMember 0),
    the group is named in kai-ray.io/elastic-subgroups and its pods still carry their subgroup
    label, so the scheduler places them one by one above the gang minimum."""
    rc = ray_cluster("rc", worker_group(3, 0, name="gpu"), worker_group(2, 1, name="cpu"),
                     labels={QUEUE: "q"})
    rc["spec"]["enableInTreeAutoscaling"] = True
    result = group(kuberay_pod(rc, "gpu"), rc)
    pg = result.podgroup
    assert pg["spec"]["minMember"] == 2
    assert pg["spec"]["subGroups"] == [{"name": "headgroup", "minMember": 1},
                                       {"name": "cpu", "minMember": 1}]
    assert pg["metadata"]["annotations"]["kai-ray.io/elastic-subgroups"] == '["gpu"]'
    assert result.subgroup == "gpu" and result.warnings == ()
    assert result.pod_patch()["metadata"]["labels"] == {"kai.scheduler/subgroup-name": "gpu"}


def test_rayjob_with_autoscaling_is_sized_from_its_raycluster() -> None:
    """KubeRay copies a RayJob's rayClusterSpec (enableInTreeAutoscaling included) into the
    RayCluster it creates; the gang is sized from that RayCluster."""
    job = obj("ray.io/v1", "RayJob", "job", labels={QUEUE: "q"},
              status={"rayClusterName": "job-rc"})
    rc = ray_cluster("job-rc", worker_group(4, 0, name="w"), owners=[owned_by(job)])
    rc["spec"]["enableInTreeAutoscaling"] = True
    result = group(kuberay_pod(rc, "w"), job, rc)
    assert result.podgroup["spec"]["minMember"] == 1 and result.subgroup == "w"
    assert result.podgroup["metadata"]["annotations"]["kai-ray.io/elastic-subgroups"] == '["w"]'


# ---- other kinds --------------------------------------------------------------------------------

def test_batch_job_gets_one_podgroup_per_pod() -> None:
    job = obj("batch/v1", "Job", "train", labels={QUEUE: "q"})
    a, b = group(pod("train-a", owner=job), job), group(pod("train-b", owner=job), job)
    assert (a.name, b.name) == ("pg-train-a-uid-train", "pg-train-b-uid-train")
    assert a.podgroup["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert a.podgroup["spec"] == {"minMember": 1, "queue": "q", "priorityClassName": "train"}
    assert a.subgroup is None and "labels" not in a.pod_patch()["metadata"]


def test_deployment_pod_gets_its_own_podgroup_owned_by_the_pod_with_inference_priority() -> None:
    dep = obj("apps/v1", "Deployment", "web", labels={QUEUE: "q"})
    rs = obj("apps/v1", "ReplicaSet", "web-1", owners=[owned_by(dep)])
    result = group(pod("web-1-x", owner=rs), dep, rs)
    assert result.name == "pg-web-1-x-uid-web-1-x"
    assert result.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "web-1-x", "uid": "uid-web-1-x"}]
    assert result.podgroup["spec"]["priorityClassName"] == "inference"
    assert result.podgroup["metadata"]["labels"] == {QUEUE: "q"}  # metadata of the Deployment


def test_deployment_reads_priority_from_the_top_owner_only() -> None:
    dep = obj("apps/v1", "Deployment", "web")
    rs = obj("apps/v1", "ReplicaSet", "web-1", labels={"priorityClassName": "build"},
             owners=[owned_by(dep)])
    assert group(pod(owner=rs), dep, rs).podgroup["spec"]["priorityClassName"] == "inference"


def test_bare_pod() -> None:
    result = group(pod("solo", labels={QUEUE: "q"}, priorityClassName="build"))
    assert result.name == "pg-solo-uid-solo"
    assert result.podgroup["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    assert result.podgroup["spec"] == {"minMember": 1, "queue": "q", "priorityClassName": "build"}


def test_replicaset_without_deployment_is_one_podgroup_for_all_its_pods() -> None:
    rs = obj("apps/v1", "ReplicaSet", "rs")
    names = {group(pod(n, owner=rs), rs).name for n in ("a", "b")}
    assert names == {"pg-rs-uid-rs"}


def test_other_owner_kinds_use_the_default_grouper_with_the_whole_chain() -> None:
    widget = obj("example.com/v1", "Widget", "w")
    rs = obj("apps/v1", "ReplicaSet", "rs", labels={"priorityClassName": "inference"},
             owners=[owned_by(widget)])
    result = group(pod(owner=rs), widget, rs)
    assert result.name == "pg-w-uid-w"
    assert result.podgroup["metadata"]["ownerReferences"][0]["kind"] == "Widget"
    assert result.podgroup["spec"]["priorityClassName"] == "inference"  # nearest owner's label


def test_notebook_defaults_to_build() -> None:
    nb = obj("kubeflow.org/v1beta1", "Notebook", "nb")
    assert group(pod(owner=nb), nb).podgroup["spec"]["priorityClassName"] == "build"


# ---- queue --------------------------------------------------------------------------------------

def _queue(top_labels: dict[str, str] | None, pod_labels: dict[str, str] | None,
           ns_labels: dict[str, str] | None = None,
           config: GroupingConfig | None = None) -> tuple[str, tuple[str, ...]]:
    job = obj("batch/v1", "Job", "j", labels=top_labels)
    result = group(pod("p", owner=job, labels=pod_labels), job, config=config, ns_labels=ns_labels)
    return result.podgroup["spec"]["queue"], result.warnings


@pytest.mark.parametrize(
    ("top", "pod_labels", "ns", "queue"),
    [
        ({QUEUE: "top"}, {QUEUE: "pod"}, {QUEUE: "ns"}, "top"),
        (None, {QUEUE: "pod"}, {QUEUE: "ns"}, "pod"),
        ({"runai/queue": "legacy-top"}, {QUEUE: "pod"}, None, "legacy-top"),
        ({QUEUE: "", "runai/queue": "legacy"}, None, None, "legacy"),
        (None, {"runai/queue": "legacy-pod"}, {QUEUE: "ns"}, "legacy-pod"),
        (None, None, {QUEUE: "ns"}, "ns"),
        (None, None, {"runai/queue": "ns-legacy"}, "ns-legacy"),
        (None, {"project": "p1"}, None, "p1"),
        ({"project": "p0"}, {"project": "p1", "kai.scheduler/node-pool": "a100"}, None, "p0-a100"),
        (None, {"project": "p1"}, {QUEUE: "ns"}, "ns"),
    ],
)
def test_queue_resolution_order(top, pod_labels, ns, queue) -> None:  # type: ignore[no-untyped-def]
    assert _queue(top, pod_labels, ns) == (queue, ())


def test_default_queue_with_a_warning_naming_where_it_looked() -> None:
    queue, warnings = _queue(None, None)
    assert queue == "default-queue"
    assert warnings == ("Pod ns/p: no kai.scheduler/queue or runai/queue label on Job ns/j, the "
                        "pod, its namespace: using the default queue 'default-queue'",)


def test_queue_keys_and_namespace_lookup_are_configurable() -> None:
    config = GroupingConfig(queue_label_key="runai/queue", legacy_queue_label_key=None,
                            namespace_queue=False, default_queue="fallback")
    assert _queue({QUEUE: "ignored"}, None, {"runai/queue": "ns"}, config)[0] == "fallback"
    assert _queue(None, {"runai/queue": "pod"}, None, config)[0] == "pod"


# ---- priority and preemptibility ----------------------------------------------------------------

@pytest.mark.parametrize(
    ("owner_labels", "pod_labels", "spec_class", "classes", "expected"),
    [
        ({"priorityClassName": "build"}, {"priorityClassName": "inference"}, "x", CLASSES, "build"),
        (None, {"priorityClassName": "inference"}, "build", CLASSES, "inference"),
        (None, None, "build", CLASSES, "build"),
        (None, None, None, CLASSES, "train"),
        # an owner label naming a missing class hides the pod's label and spec (as KAI)
        ({"priorityClassName": "missing"}, {"priorityClassName": "build"}, "build", CLASSES,
         "train"),
        # existence is checked against the known classes
        (None, {"priorityClassName": "build"}, None, {"train"}, "train"),
    ],
)
def test_priority_fallbacks(owner_labels, pod_labels, spec_class, classes, expected) -> None:  # type: ignore[no-untyped-def]
    job = obj("batch/v1", "Job", "j", labels=owner_labels)
    extra = {"priorityClassName": spec_class} if spec_class else {}
    p = pod(owner=job, labels=pod_labels, **extra)
    assert group(p, job, classes=classes).podgroup["spec"]["priorityClassName"] == expected


def test_default_grouper_tries_each_owner_in_turn() -> None:
    top = obj("example.com/v1", "Widget", "w")
    rs = obj("apps/v1", "ReplicaSet", "rs", labels={"priorityClassName": "missing"},
             owners=[owned_by(top)])
    p = pod(owner=rs, labels={"priorityClassName": "build"})
    # rs: its own label (missing) loses; w: no label, so the pod's label is its candidate
    assert group(p, top, rs).podgroup["spec"]["priorityClassName"] == "build"


def test_preemptibility_from_owner_then_pod_and_invalid_values_are_reported() -> None:
    job = obj("batch/v1", "Job", "j", labels={"kai.scheduler/preemptibility": "non-preemptible"})
    p = pod(owner=job, labels={"kai.scheduler/preemptibility": "preemptible"})
    assert group(p, job).podgroup["spec"]["preemptibility"] == "non-preemptible"
    job["metadata"]["labels"]["kai.scheduler/preemptibility"] = "sometimes"
    result = group(p, job)
    assert result.podgroup["spec"]["preemptibility"] == "preemptible"
    assert any("Job ns/j: label kai.scheduler/preemptibility='sometimes'" in w
               for w in result.warnings)
    assert "preemptibility" not in group(pod()).podgroup["spec"]


# ---- metadata -----------------------------------------------------------------------------------

def test_labels_and_annotations_as_kai_builds_them() -> None:
    job = obj("batch/v1", "Job", "j", labels={QUEUE: "q", "team": "x"},
              annotations={"note": "from-job", "user": "job-user",
                           "kai.scheduler/topology": "dc",
                           "kai.scheduler/topology-preferred-placement": "rack"})
    p = pod(owner=job, labels={"user": "alice", "kai.scheduler/node-pool": "a100", "other": "no"},
            annotations={"user": "alice"})
    pg = group(p, job).podgroup
    assert pg["metadata"]["labels"] == {QUEUE: "q", "team": "x", "user": "alice",
                                        "kai.scheduler/node-pool": "a100"}
    ann = pg["metadata"]["annotations"]
    assert ann["note"] == "from-job" and ann["user"] == "job-user"  # top owner wins
    assert ann["kai.scheduler/top-owner-metadata"] == (
        "name: j\nuid: uid-j\ngroup: batch\nversion: v1\nkind: Job\n")
    assert pg["spec"]["topologyConstraint"] == {"topology": "dc", "preferredTopologyLevel": "rack"}


def test_should_group() -> None:
    assert should_group(pod())
    assert not should_group(pod(scheduler="default-scheduler"))
    assert not should_group(pod(annotations={"pod-group-name": "mine"}))
    job = obj("batch/v1", "Job", "j")
    assert should_group(pod(owner=job, annotations={"pod-group-name": "old"}))
    assert not should_group(pod(), GroupingConfig(scheduler_name="other"))


def test_bare_pod_default_queue_warning_names_only_the_pod() -> None:
    result = group(pod("solo"), config=GroupingConfig(namespace_queue=False))
    assert result.podgroup["spec"]["queue"] == "default-queue"
    assert result.warnings == ("Pod ns/solo: no kai.scheduler/queue or runai/queue label on the "
                               "pod: using the default queue 'default-queue'",)
