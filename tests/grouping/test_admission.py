from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from grouping_objects import QUEUE, kuberay_pod, obj, pod, ray_cluster, worker_group
from hypothesis import given
from hypothesis import strategies as st

from kai_ray.grouping import GroupingConfig
from kai_ray.grouping.admission import (
    AdmissionError,
    Verdict,
    gpu_configmap,
    gpu_configmap_data,
    mutate_pod,
    queue_parents,
    validate_pod,
    validate_pod_update,
)

GPU_LIMIT = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}


def _pod(annotations: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    return pod("p", annotations=annotations, **kw)


def denied(p: dict[str, Any], **kw: Any) -> str:
    verdict = validate_pod(p, **kw)
    assert not verdict.allowed
    return verdict.message


# ---- validation: KAI's messages -----------------------------------------------------------------

@pytest.mark.parametrize(
    ("annotations", "containers", "message"),
    [
        ({"mps": "true"}, None, "MPS is only supported with GPU fraction request"),
        ({"gpu-fraction": "0.5"}, [{"name": "c", **GPU_LIMIT}],
         "cannot have both GPU fraction request and whole GPU resource request/limit"),
        ({"gpu-memory": "2000", "gpu-fraction": "0.5"}, None,
         "cannot request both GPU and GPU memory"),
        ({"gpu-memory": "2000"}, [{"name": "c", **GPU_LIMIT}],
         "cannot request both GPU and GPU memory"),
        ({"gpu-fraction-num-devices": "2"}, None,
         "cannot request multiple fractional devices without specifying fraction portion or "
         "gpu-memory"),
        ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"}, None,
         "fraction count annotation value must be a positive integer greater than 0"),
        ({"gpu-memory": "100", "gpu-fraction-num-devices": "two"}, None,
         "fraction count annotation value must be a positive integer greater than 0"),
        ({"gpu-fraction": "NaN"}, None,
         "gpu-fraction annotation value must be a valid number. NaN is not allowed"),
        ({"gpu-fraction": "0x1p-1"}, None,
         "gpu-fraction annotation value must be a float written with a decimal point or a "
         "scientific notation .given value: 0x1p-1"),
    ],
)
def test_kai_validation_messages(annotations: dict[str, str], containers: Any,
                                 message: str) -> None:
    assert denied(_pod(annotations, containers=containers)) == message


@pytest.mark.parametrize("value", ["1.5", "1", "1.0", "0", "-0.5", "abc", "", " 0.5", "Inf", "-inf",
                                   "0.5_0"])
def test_bad_gpu_fraction(value: str) -> None:
    assert denied(_pod({"gpu-fraction": value})) == (
        "gpu-fraction annotation value must be a positive number smaller than 1.0")


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "abc", "", "+5", "18446744073709551616"])
def test_bad_gpu_memory(value: str) -> None:
    assert denied(_pod({"gpu-memory": value})) == (
        "gpu-memory annotation value must be a positive integer greater than 0")


def test_whole_gpu_limit_in_an_init_container_counts_too() -> None:
    p = _pod({"gpu-fraction": "0.5"}, initContainers=[{"name": "init", **GPU_LIMIT}])
    assert denied(p).startswith("cannot have both GPU fraction request")


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpu-fraction": "0.5"}, {"gpu-fraction": "5e-1"}, {"gpu-fraction": ".25"},
        {"gpu-fraction": "0.999"}, {"gpu-memory": "2000"}, {"gpu-memory": "18446744073709551615"},
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2", "mps": "true"},
        {"gpu-memory": "1024", "gpu-fraction-num-devices": "4"},
        {"mps": "false"}, {},
    ],
)
def test_valid_requests(annotations: dict[str, str]) -> None:
    assert validate_pod(_pod(annotations)) == Verdict(True)


def test_whole_gpu_pod_is_allowed() -> None:
    assert validate_pod(_pod(containers=[{"name": "c", **GPU_LIMIT}])).allowed


def test_other_schedulers_pods_are_not_checked() -> None:
    assert validate_pod(_pod({"gpu-fraction": "7"}, scheduler="default-scheduler")).allowed


def test_gpu_sharing_disabled() -> None:
    config = GroupingConfig(gpu_sharing_enabled=False)
    assert denied(_pod({"gpu-memory": "2000"}), config=config) == (
        "attempting to create a pod ns/p with gpu sharing request, while GPU sharing is disabled")
    assert validate_pod(_pod(containers=[{"name": "c", **GPU_LIMIT}]), config=config).allowed


def test_fraction_container_must_exist() -> None:
    p = _pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"})
    assert denied(p) == "container with name nope not found for fraction request"


# ---- validation: queue (kai-ray) ----------------------------------------------------------------

QUEUES = queue_parents([
    obj("scheduling.run.ai/v2", "Queue", "department-1", ns=""),
    obj("scheduling.run.ai/v2", "Queue", "team-a", ns="", spec={"parentQueue": "department-1"}),
    obj("scheduling.run.ai/v2", "Queue", "lost", ns="", spec={"parentQueue": "gone"}),
])
CHECK = GroupingConfig(validate_queue=True)


def test_queue_parents() -> None:
    assert QUEUES == {"department-1": None, "team-a": "department-1", "lost": "gone"}


@pytest.mark.parametrize(
    ("labels", "ns_labels", "message"),
    [
        ({QUEUE: "nope"}, None, "pod ns/p: queue 'nope' does not exist"),
        ({QUEUE: "department-1"}, None,
         "pod ns/p: queue 'department-1' is not a leaf queue (child queues: team-a); pods can only "
         "run in leaf queues"),
        ({QUEUE: "lost"}, None, "pod ns/p: queue 'lost' has parent queue 'gone', which does not "
                                "exist"),
        (None, None, "pod ns/p: queue 'default-queue' does not exist"),
        (None, {"runai/queue": "nope"}, "pod ns/p: queue 'nope' does not exist"),
    ],
)
def test_queue_check(labels: Any, ns_labels: Any, message: str) -> None:
    p = _pod(labels=labels)
    assert denied(p, config=CHECK, queues=QUEUES, namespace_labels=ns_labels) == message


def test_queue_check_allows_leaf_queues_and_is_off_by_default() -> None:
    assert validate_pod(_pod(labels={QUEUE: "team-a"}), config=CHECK, queues=QUEUES).allowed
    assert validate_pod(_pod(labels={"runai/queue": "team-a"}), config=CHECK, queues=QUEUES).allowed
    assert validate_pod(_pod(), config=CHECK, queues=QUEUES,
                        namespace_labels={QUEUE: "team-a"}).allowed
    assert validate_pod(_pod(labels={QUEUE: "nope"}), queues=QUEUES).allowed


# ---- mutation -----------------------------------------------------------------------------------

def apply(p: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return jsonpatch.apply_patch(p, ops)  # type: ignore[no-any-return]


def env_refs(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {e["name"]: (e["valueFrom"]["configMapKeyRef"]["name"],
                        e["valueFrom"]["configMapKeyRef"]["key"])
            for e in container.get("env", []) if "valueFrom" in e}


def test_fraction_pod_gets_env_from_its_configmap() -> None:
    owner = obj("apps/v1", "ReplicaSet", "web-1")
    p = pod("web-1-x", owner=owner, annotations={"gpu-fraction": "0.5"})
    mutated = apply(p, mutate_pod(p, "abcdefg"))
    prefix = mutated["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    assert prefix == "web-1-abcdefg-shared-gpu"
    cm = f"{prefix}-0"
    assert env_refs(mutated["spec"]["containers"][0]) == {
        "NVIDIA_VISIBLE_DEVICES": (cm, "NVIDIA_VISIBLE_DEVICES"),
        "RUNAI_NUM_OF_GPUS": (cm, "RUNAI_NUM_OF_GPUS"),
        "GPU_PORTION": (cm, "GPU_PORTION"),
    }
    assert gpu_configmap(mutated, {})["metadata"]["name"] == cm


def test_gpu_memory_pod_also_gets_the_memory_limit() -> None:
    p = pod("solo", containers=[{"name": "c", "env": [{"name": "A", "value": "1"}]}])
    p["metadata"]["annotations"] = {"gpu-memory": "2000"}
    mutated = apply(p, mutate_pod(p, "zzzzzzz"))
    env = mutated["spec"]["containers"][0]["env"]
    assert env[0] == {"name": "A", "value": "1"}
    assert env_refs(mutated["spec"]["containers"][0])["KAI_RAY_GPU_MEMORY_LIMIT_MIB"] == (
        "solo-zzzzzzz-shared-gpu-0", "KAI_RAY_GPU_MEMORY_LIMIT_MIB")


def test_existing_env_vars_of_the_same_name_are_replaced() -> None:
    p = _pod({"gpu-fraction": "0.25"},
             containers=[{"name": "c", "env": [{"name": "GPU_PORTION", "value": "1"},
                                               {"name": "B", "value": "2"}]}])
    env = apply(p, mutate_pod(p, "aaaaaaa"))["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["GPU_PORTION", "B", "NVIDIA_VISIBLE_DEVICES",
                                        "RUNAI_NUM_OF_GPUS"]
    assert "value" not in env[0]


def test_named_container_and_init_container() -> None:
    containers = [{"name": "sidecar"}, {"name": "trainer"}]
    p = _pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "trainer"},
             containers=containers)
    mutated = apply(p, mutate_pod(p, "bbbbbbb"))
    assert "env" not in mutated["spec"]["containers"][0]
    assert env_refs(mutated["spec"]["containers"][1])["GPU_PORTION"][0].endswith("-shared-gpu-1")
    p = _pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "trainer"},
             containers=[{"name": "main"}], initContainers=[{"name": "trainer"}])
    mutated = apply(p, mutate_pod(p, "ccccccc"))
    assert env_refs(mutated["spec"]["initContainers"][0])["GPU_PORTION"][0].endswith("-i0")
    with pytest.raises(AdmissionError, match="container with name x not found"):
        mutate_pod(_pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "x"}), "d")


def test_mutation_is_idempotent_and_reuses_the_annotation() -> None:
    p = _pod({"gpu-fraction": "0.5", "other": "kept"})
    once = apply(p, mutate_pod(p, "eeeeeee"))
    twice = apply(once, mutate_pod(once, "fffffff"))
    assert twice == once
    assert once["metadata"]["annotations"]["other"] == "kept"


def test_pods_that_need_no_mutation() -> None:
    assert mutate_pod(_pod(), "x") == []
    assert mutate_pod(_pod(containers=[{"name": "c", **GPU_LIMIT}]), "x") == []
    assert mutate_pod(_pod({"gpu-fraction": "0.5"}, scheduler="default-scheduler"), "x") == []


@given(st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?", fullmatch=True),  # DNS names
       st.integers(0, 120))
def test_configmap_names_fit_the_volume_name_limit(owner_name: str, index: int) -> None:
    containers = [{"name": f"c{i}"} for i in range(index + 1)]
    p = _pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": f"c{index}"},
             containers=containers)
    p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                         "name": owner_name, "uid": "u"}]
    mutated = apply(copy.deepcopy(p), mutate_pod(p, "abcdefg"))
    cm = env_refs(mutated["spec"]["containers"][index])["GPU_PORTION"][0]
    assert len(f"{cm}-evar-vol") <= 63
    assert cm.endswith(f"-abcdefg-shared-gpu-{index}")
    assert not cm.startswith(("-", "."))


# ---- ConfigMap data -----------------------------------------------------------------------------

def test_configmap_data() -> None:
    assert gpu_configmap_data(["GPU-1"], 0.5) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-1", "GPU_PORTION": "0.50", "RUNAI_NUM_OF_GPUS": "0.50"}
    data = gpu_configmap_data(["GPU-1", "GPU-2"], 0.125, memory_mib=2000, cdi=True)
    assert data == {
        "NVIDIA_VISIBLE_DEVICES": "k8s.device-plugin.nvidia.com/gpu=GPU-1,"
                                  "k8s.device-plugin.nvidia.com/gpu=GPU-2",
        "GPU_PORTION": "0.12", "RUNAI_NUM_OF_GPUS": "0.12", "KAI_RAY_GPU_MEMORY_LIMIT_MIB": "2000"}


@pytest.mark.parametrize(("ids", "portion", "mib", "message"), [
    ([], 0.5, None, "device_ids is empty"),
    (["g"], 0.0, None, "portion 0.0 is not in"),
    (["g"], 1.5, None, "portion 1.5 is not in"),
    (["g"], 0.5, 0, "memory_mib 0 must be positive"),
])
def test_configmap_data_errors(ids: list[str], portion: float, mib: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gpu_configmap_data(ids, portion, mib)


def test_configmap_manifest_is_owned_by_the_pod() -> None:
    p = _pod({"gpu-fraction": "0.5"})
    mutated = apply(p, mutate_pod(p, "abcdefg"))
    cm = gpu_configmap(mutated, gpu_configmap_data(["GPU-1"], 0.5))
    assert cm["metadata"] == {
        "name": "p-abcdefg-shared-gpu-0", "namespace": "ns",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p"}]}
    assert cm["data"]["GPU_PORTION"] == "0.50"
    with pytest.raises(AdmissionError, match="annotation runai/shared-gpu-configmap is missing"):
        gpu_configmap(p, {})


# ---- KubeRay's GPU-sharing sample shape ---------------------------------------------------------

def test_half_gpu_ray_worker() -> None:
    g = worker_group(2, 2, name="shared-gpu")
    g["template"]["metadata"] = {"annotations": {"gpu-fraction": "0.5"}}
    rc = ray_cluster("raycluster-half-gpu", g, labels={QUEUE: "team-a"})
    worker = kuberay_pod(rc, "shared-gpu")
    assert validate_pod(worker).allowed
    mutated = apply(worker, mutate_pod(worker, "abcdefg"))
    assert env_refs(mutated["spec"]["containers"][0])["GPU_PORTION"][0] == (
        "raycluster-half-gpu-abcdefg-shared-gpu-0")
    head = kuberay_pod(rc, "headgroup")
    assert validate_pod(head).allowed and mutate_pod(head, "x") == []


# ---- annotations only the scheduler writes; UPDATE ---------------------------------------------

BIND_INTENT = "kai-ray.io/bind-intent"
LAST_START = "kai.scheduler/last-start-timestamp"


@pytest.mark.parametrize("key", [BIND_INTENT, LAST_START, "kai.scheduler/stale-podgroup-timestamp",
                                 "kai-ray.io/suspended-demand", "kai-ray.io/anything-new"])
def test_create_with_a_scheduler_owned_annotation_is_refused_naming_it(key: str) -> None:
    message = denied(_pod({key: "x", "gpu-fraction": "0.5"}))
    assert message == f"annotation {key} is written only by the scheduler: pod ns/p may not set it"
    # other schedulers' pods are none of our business (and never reach the webhook)
    assert validate_pod(_pod({key: "x"}, scheduler="default-scheduler")).allowed


def test_user_settings_are_still_admitted_on_create() -> None:
    assert validate_pod(_pod({"kai.scheduler/eviction-strategy": "evict", "pod-group-name": "g",
                              "kai.scheduler/topology": "dc", "kwok.kai-ray.io/exit-code": "0",
                              "runai/shared-gpu-configmap": "p-x-shared-gpu"})).allowed


def updated(old: dict[str, Any], **annotations: str | None) -> dict[str, Any]:
    new = copy.deepcopy(old)
    ann = new["metadata"].setdefault("annotations", {})
    for k, v in annotations.items():
        if v is None:
            ann.pop(k, None)
        else:
            ann[k] = v
    return new


def update_denied(old: dict[str, Any], new: dict[str, Any], **kw: Any) -> str:
    verdict = validate_pod_update(old, new, **kw)
    assert not verdict.allowed
    return verdict.message


def test_update_setting_or_changing_a_scheduler_owned_annotation_is_refused() -> None:
    old = _pod({"gpu-fraction": "0.5"})
    assert update_denied(old, updated(old, **{BIND_INTENT: '{"p": {"node": "n1"}}'})) == (
        f"annotation {BIND_INTENT} is written only by the scheduler: pod ns/p may not set it")
    before = _pod({LAST_START: "2024-01-01T00:00:00Z"})  # admitted before the rule existed
    assert update_denied(before, updated(before, **{LAST_START: "2999-01-01T00:00:00Z"})) == (
        f"annotation {LAST_START} is written only by the scheduler: pod ns/p may not change it")


def test_update_leaving_scheduler_owned_annotations_alone_is_allowed() -> None:
    before = _pod({LAST_START: "2024-01-01T00:00:00Z"}, labels={QUEUE: "a"})
    new = updated(before, note="x")
    new["metadata"]["labels"]["kai.scheduler/subgroup-name"] = "w"
    new["metadata"]["finalizers"] = ["example.com/f"]
    assert validate_pod_update(before, new) == Verdict(True)
    assert validate_pod_update(before, updated(before, **{LAST_START: None})).allowed  # removal


@pytest.mark.parametrize(("annotations", "message"), [
    ({"gpu-fraction": "1.5"}, "gpu-fraction annotation value must be a positive number smaller "
                              "than 1.0"),
    ({"gpu-fraction": None, "gpu-memory": "2GiB"},
     "gpu-memory annotation value must be a positive integer greater than 0"),
    ({"gpu-fraction-num-devices": "0"}, "fraction count annotation value must be a positive "
                                        "integer greater than 0"),
    ({"gpu-fraction-container-name": "nope"}, "container with name nope not found for fraction "
                                              "request"),
])
def test_update_breaking_the_gpu_sharing_rules_is_refused(annotations: dict[str, str | None],
                                                          message: str) -> None:
    old = _pod({"gpu-fraction": "0.5"})
    assert update_denied(old, updated(old, **annotations)) == message


def test_update_to_a_valid_fraction_passes_and_sharing_off_refuses_it() -> None:
    old = _pod({"gpu-fraction": "0.5"})
    assert validate_pod_update(old, updated(old, **{"gpu-fraction": "0.25"})).allowed
    plain = _pod()
    off = GroupingConfig(gpu_sharing_enabled=False)
    assert update_denied(plain, updated(plain, **{"gpu-fraction": "0.5"}), config=off) == (
        "attempting to update a pod ns/p with gpu sharing request, while GPU sharing is disabled")


def test_update_not_touching_gpu_sharing_passes_even_if_the_pod_predates_the_rules() -> None:
    old = _pod({"gpu-fraction": "1.5"}, containers=[{"name": "c", **GPU_LIMIT}])
    assert validate_pod_update(old, updated(old, note="x")).allowed
    # the queue is checked on CREATE only: an UPDATE never fails for a queue deleted since
    assert validate_pod_update(_pod(labels={QUEUE: "gone"}), _pod(labels={QUEUE: "gone"}),
                               config=GroupingConfig(validate_queue=True)).allowed
    other = _pod({"gpu-fraction": "0.5"}, scheduler="default-scheduler")
    assert validate_pod_update(other, updated(other, **{"gpu-fraction": "7",
                                                        BIND_INTENT: "{}"})).allowed


def test_a_bound_pods_gpu_share_cannot_change() -> None:
    """Lowering (or removing) gpu-fraction on a running pod would let the scheduler place more
    on a device whose ConfigMap still gives this pod its old share."""
    old = {"metadata": {"name": "p", "namespace": "ns", "annotations": {"gpu-fraction": "0.9"}},
           "spec": {"schedulerName": "kai-scheduler", "nodeName": "n1",
                    "containers": [{"name": "main"}]}}
    for edited in ({"gpu-fraction": "0.1"}, {}):
        new = {**old, "metadata": {**old["metadata"], "annotations": edited}}
        verdict = validate_pod_update(old, new)
        assert not verdict.allowed and "bound to node n1" in verdict.message
        assert "gpu-fraction cannot change after binding" in verdict.message
    unbound = {**old, "spec": {**old["spec"], "nodeName": None}}
    new = {**unbound, "metadata": {**old["metadata"], "annotations": {"gpu-fraction": "0.1"}}}
    assert validate_pod_update(unbound, new).allowed
