"""Kubernetes objects to core types: the pure conversions the watch cache relies on."""

from kai_ray import api_names
from kai_ray.core.constraints import Requirement, Taint, Toleration
from kai_ray.core.model import PodStatus
from kai_ray.k8s import convert


def _pod(**kw):
    pod = {"metadata": {"name": "p", "namespace": "ns", "annotations": {}, "labels": {}},
           "spec": {"schedulerName": "kai-scheduler", "containers": [
               {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                           "limits": {"nvidia.com/gpu": "2"}}},
               {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "512Mi"}}}]},
           "status": {"phase": "Pending"}}
    for k, v in kw.items():
        pod[k] = v
    return pod


def test_pod_request_sums_containers_and_falls_back_to_limits():
    r = convert.pod_request(_pod())
    assert (r.cpu_m, r.memory, r.gpus) == (1500, 1024**3 + 512 * 1024**2, 2)


def test_fraction_and_memory_annotations_replace_whole_gpus():
    pod = _pod()
    del pod["spec"]["containers"][0]["resources"]["limits"]
    pod["metadata"]["annotations"] = {"gpu-fraction": "0.25"}
    r = convert.pod_request(pod)
    assert (r.gpus, r.gpu_fraction_milli) == (0, 250)
    pod["metadata"]["annotations"] = {"gpu-memory": "2000", "gpu-fraction-num-devices": "2"}
    r = convert.pod_request(pod)
    assert (r.gpu_memory_mib, r.fraction_devices, r.gpus) == (2000, 2, 0)


def test_sharing_values_the_webhook_refuses_are_errors_naming_the_annotation():
    """Never "no GPU": a value the webhook refuses is refused however the pod arrived."""
    bare = _pod()
    del bare["spec"]["containers"][0]["resources"]["limits"]
    cases = [({"gpu-fraction": v}, "gpu-fraction") for v in ("1.5", "nan", "inf", "-0.5",
                                                             "abc", "0", "1", "")]
    cases += [({"gpu-memory": v}, "gpu-memory") for v in ("-5", "0", "abc", "1.5")]
    cases += [({"gpu-fraction": "0.5", "gpu-fraction-num-devices": v},
               "gpu-fraction-num-devices") for v in ("0", "-1", "abc")]
    cases += [({"gpu-fraction": "0.5", "gpu-memory": "100"}, "gpu-memory")]
    for annotations, field in cases:
        pod = {**bare, "metadata": {**bare["metadata"], "annotations": annotations}}
        try:
            convert.pod_request(pod)
        except convert.InvalidField as e:
            assert e.field == f"metadata.annotations[{field}]", (annotations, e.field)
            assert repr(annotations[field]) in e.message
        else:
            raise AssertionError(f"{annotations} accepted")
    whole = _pod()  # a whole-GPU limit and a fraction: the webhook refuses both together
    whole["metadata"]["annotations"] = {"gpu-fraction": "0.25"}
    try:
        convert.pod_request(whole)
    except convert.InvalidField as e:
        assert e.field == "metadata.annotations[gpu-fraction]"
    else:
        raise AssertionError("fraction with a whole GPU accepted")
    # another scheduler's pod: the kubelet gives it what its resources say
    assert convert.pod_request(whole, sharing=False).gpus == 2


def test_pod_status_mapping_and_bind_intent():
    assert convert.pod_status(_pod(), None) == PodStatus.PENDING
    assert convert.pod_status(_pod(), {"node": "n1"}) == PodStatus.BINDING
    bound = _pod(spec={**_pod()["spec"], "nodeName": "n1"})
    assert convert.pod_status(bound, None) == PodStatus.BOUND
    deleting = _pod()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert convert.pod_status(deleting, None) == PodStatus.RELEASING
    p = convert.pod_from(_pod(), {"node": "n1", "gpu_groups": ["g1"]})
    assert (p.status, p.node, p.gpu_groups) == (PodStatus.BINDING, "n1", ("g1",))


def test_malformed_queue_is_a_problem_naming_the_field():
    q = {"metadata": {"name": "team"},
         "spec": {"resources": {"gpu": {"quota": "lots", "limit": -1, "overQuotaWeight": 1}}}}
    problem = convert.queue_from(q)
    assert isinstance(problem, convert.Problem)
    assert "spec.resources.gpu.quota" in str(problem) and "team" in str(problem)


def test_queue_without_resources_gets_zero_everything_like_kai():
    q = convert.queue_from({"metadata": {"name": "bare"}, "spec": {}})
    assert not isinstance(q, convert.Problem)
    assert (q.gpu.quota, q.gpu.limit, q.gpu.weight) == (0.0, 0.0, 0.0)


def test_go_durations():
    assert convert._duration("1h30m") == 5400
    assert convert._duration("250ms") == 0.25
    assert convert._duration("bogus") is None


def test_node_gpu_memory_label_rounding_and_bytes():
    node = {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.memory": "81559"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8",
                                       "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    n = convert.node_from(node)
    assert (n.gpus, n.gpu_memory_mib, n.gpu_memory_synced, n.ready) == (8, 81500, True, True)
    node["metadata"]["labels"]["nvidia.com/gpu.memory"] = str(80 * 1024**3)  # bytes
    assert convert.node_from(node).gpu_memory_mib == 81900


def test_taints_tolerations_and_required_node_affinity_are_read():
    node = convert.node_from({
        "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present",
                             "effect": "NoSchedule"}, "garbage"]},
        "status": {"allocatable": {"cpu": "8"}}})
    assert node.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    spec = {
        "containers": [],
        "tolerations": [{"operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoExecute"}],
        "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                 "matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                  "values": ["n2"]}]},
                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}}
    pod = convert.pod_from({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    assert pod.tolerations == (Toleration("", "Exists"), Toleration("k", "Equal", "v", "NoExecute"))
    assert pod.node_affinity == (
        (Requirement("zone", "In", ("a",)), Requirement("metadata.name", "NotIn", ("n2",), True)),
        (Requirement("gpu", "Exists"),))
    # no required affinity (only preferred, or none): no constraint, not "no node"
    del spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert convert.pod_from({"metadata": {"name": "p"}, "spec": spec}).node_affinity is None


def test_an_intent_entry_out_of_shape_is_no_intent_not_an_unreadable_podgroup() -> None:
    import json as _json

    pg = {"metadata": {"name": "g", "namespace": "ns", "annotations": {
        api_names.BIND_INTENT_ANNOTATION: _json.dumps({"a": "junk", "b": {"node": "n1"}})}},
        "spec": {"queue": "q"}}
    pods = [{"metadata": {"name": n, "namespace": "ns"}, "spec": {"containers": [{"name": "c"}]},
             "status": {"phase": "Pending"}} for n in ("a", "b")]
    job = convert.job_from(pg, pods, {}, None)
    assert [(p.status, p.node) for p in job.pods] == [(PodStatus.PENDING, None),
                                                      (PodStatus.BINDING, "n1")]
