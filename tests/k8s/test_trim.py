"""The watch cache's trimming (kai_ray.k8s.trim): a trimmed object converts and groups exactly as
the untrimmed one, on pods as the API server returns a KubeRay cluster's (env, probes, volumes,
mounts, managedFields, a full status), and is several times smaller."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kai_ray import api_names
from kai_ray.grouping.owners import resolve_top_owner
from kai_ray.grouping.podgroup import group_pod, should_group
from kai_ray.grouping.update import podgroup_update
from kai_ray.k8s import convert, trim
from kai_ray.k8s.binder import Binder, BinderConfig
from kai_ray.k8s.cache import may_regroup
from kai_ray.k8s.suspend import demand_of

NS = "ml"
CLUSTER, CLUSTER_UID = "raycluster-gpu", "5d1c8a2e-0c5f-4a53-9a39-1d6c1b1f0a11"


def _fields_v1(obj: Any) -> Any:
    """managedFields' fieldsV1 for `obj`, as the API server writes it (`f:` per field, `k:`
    per list item keyed by name)."""
    if isinstance(obj, dict):
        return {f"f:{k}": _fields_v1(v) for k, v in obj.items()} | {".": {}}
    if isinstance(obj, list):
        return {(f'k:{{"name":"{i["name"]}"}}' if isinstance(i, dict) and "name" in i
                 else f"v:{json.dumps(i)}"): _fields_v1(i) for i in obj}
    return {}


def _managed(manager: str, operation: str, part: dict[str, Any], sub: str = "") -> dict:
    entry = {"manager": manager, "operation": operation, "apiVersion": "v1",
             "time": "2025-05-01T10:00:00Z", "fieldsType": "FieldsV1",
             "fieldsV1": _fields_v1(part)}
    if sub:
        entry["subresource"] = sub
    return entry


def _env(kind: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "RAY_CLUSTER_NAME", "valueFrom": {"fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.labels['ray.io/cluster']"}}},
        {"name": "RAY_CLOUD_INSTANCE_ID", "valueFrom": {"fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "RAY_NODE_TYPE_NAME", "valueFrom": {"fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.labels['ray.io/group']"}}},
        {"name": "KUBERAY_GEN_RAY_START_CMD", "value": (
            "ray start --head  --block  --dashboard-agent-listen-port=52365  "
            "--dashboard-host=0.0.0.0  --metrics-export-port=8080  --num-cpus=8  "
            "--memory=34359738368  --num-gpus=1 ")},
        {"name": "RAY_PORT", "value": "6379"},
        {"name": "RAY_ADDRESS", "value": f"{CLUSTER}-head-svc.{NS}.svc.cluster.local:6379"},
        {"name": "RAY_USAGE_STATS_KUBERAY_IN_USE", "value": "1"},
        {"name": "RAY_USAGE_STATS_EXTRA_TAGS", "value": "kuberay_version=v1.3.2;"
                                                        "kuberay_crd=RayCluster"},
        {"name": "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "value": "1"},
        {"name": "RAY_gcs_rpc_server_reconnect_timeout_s", "value": "120"},
        {"name": "RAY_timeout_ms_task_wait_for_death_info", "value": "0"},
        {"name": "RAY_gcs_server_request_timeout_seconds", "value": "5"},
        {"name": "RAY_SERVE_KV_TIMEOUT_S", "value": "5"},
        {"name": "HF_HOME", "value": "/data/hf-cache"},
        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb",
                                                                 "key": "api-key"}}},
    ]
    for var, field in (("CPU_REQUEST", "requests.cpu"), ("CPU_LIMITS", "limits.cpu"),
                       ("MEMORY_REQUESTS", "requests.memory"),
                       ("MEMORY_LIMITS", "limits.memory")):
        env.append({"name": var, "valueFrom": {"resourceFieldRef": {
            "containerName": f"ray-{kind}", "divisor": "0", "resource": field}}})
    if kind == "worker":
        env.append({"name": "FQ_RAY_IP", "value": f"{CLUSTER}-head-svc.{NS}.svc.cluster.local"})
        env.append({"name": "RAY_IP", "value": f"{CLUSTER}-head-svc"})
    return env


def _probe(port: int, path: str) -> dict[str, Any]:
    return {"exec": {"command": ["bash", "-c", (
        f"wget -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success "
        f"&& wget -T 10 -q -O- http://localhost:{port}/{path} | grep success")]},
        "failureThreshold": 120, "initialDelaySeconds": 30, "periodSeconds": 5,
        "successThreshold": 1, "timeoutSeconds": 2}


def kuberay_pod(kind: str, index: int = 0, running: bool = False) -> dict[str, Any]:
    """A pod of a KubeRay RayCluster (head or worker) as the API server returns it."""
    name = f"{CLUSTER}-head-x7k2p" if kind == "head" else f"{CLUSTER}-gpu-worker-{index:05d}"
    group = "headgroup" if kind == "head" else "gpu-group"
    uid = f"0f6c2d4e-9b1a-4c3e-8f7a-{index:012d}"
    resources = {"limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
                 "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}}
    ports = [{"containerPort": p, "name": n, "protocol": "TCP"} for n, p in (
        ("gcs-server", 6379), ("dashboard", 8265), ("client", 10001), ("metrics", 8080),
        ("serve", 8000))] if kind == "head" else [
        {"containerPort": 8080, "name": "metrics", "protocol": "TCP"}]
    mounts = [{"mountPath": "/dev/shm", "name": "shared-mem"},
              {"mountPath": "/data", "name": "data"},
              {"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
               "name": "kube-api-access-8rz2q", "readOnly": True}]
    container = {
        "name": f"ray-{kind}", "image": "rayproject/ray-ml:2.46.0-py310-gpu",
        "imagePullPolicy": "IfNotPresent", "command": ["/bin/bash", "-lc", "--"],
        "args": ["ulimit -n 65536; $KUBERAY_GEN_RAY_START_CMD"], "env": _env(kind),
        "ports": ports, "resources": resources, "volumeMounts": mounts,
        "livenessProbe": _probe(8265 if kind == "head" else 52365, "api/gcs_healthz"),
        "readinessProbe": _probe(8265 if kind == "head" else 52365, "api/gcs_healthz"),
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File"}
    init = [] if kind == "head" else [{
        "name": "wait-gcs-ready", "image": "rayproject/ray-ml:2.46.0-py310-gpu",
        "imagePullPolicy": "IfNotPresent", "command": ["/bin/bash", "-lc", "--"],
        "args": ["until ray health-check --address $FQ_RAY_IP:$RAY_PORT > /dev/null 2>&1; "
                 "do echo waiting for the GCS; sleep 5; done"],
        "env": _env(kind)[:6], "resources": {"limits": {"cpu": "200m", "memory": "256Mi"},
                                             "requests": {"cpu": "200m", "memory": "256Mi"}},
        "volumeMounts": mounts[2:], "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File"}]
    labels = {"app.kubernetes.io/created-by": "kuberay-operator",
              "app.kubernetes.io/name": "kuberay", "ray.io/cluster": CLUSTER,
              "ray.io/group": group, "ray.io/identifier": f"{CLUSTER}-{kind}",
              "ray.io/is-ray-node": "yes", "ray.io/node-type": kind,
              "kai.scheduler/queue": "team-a"}
    meta = {
        "name": name, "namespace": NS, "uid": uid, "resourceVersion": str(48213 + index),
        "generateName": f"{CLUSTER}-{kind}-", "creationTimestamp": "2025-05-01T10:00:00Z",
        "labels": labels,
        "annotations": {"ray.io/ft-enabled": "false", "ray.io/overwrite-container-cmd": "true"},
        "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": CLUSTER,
                             "uid": CLUSTER_UID, "controller": True,
                             "blockOwnerDeletion": True}]}
    spec = {
        "containers": [container], "initContainers": init,
        "volumes": [{"name": "shared-mem", "emptyDir": {"medium": "Memory",
                                                        "sizeLimit": "16Gi"}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "ml-data"}},
                    {"name": "kube-api-access-8rz2q", "projected": {
                        "defaultMode": 420, "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607,
                                                     "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [
                                {"key": "ca.crt", "path": "ca.crt"}]}},
                            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                                "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
        "schedulerName": "kai-scheduler", "priorityClassName": "train", "priority": 1000,
        "preemptionPolicy": "PreemptLowerPriority", "restartPolicy": "Always",
        "dnsPolicy": "ClusterFirst", "enableServiceLinks": True,
        "serviceAccountName": "default", "serviceAccount": "default",
        "securityContext": {}, "terminationGracePeriodSeconds": 30,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{
                "key": "node-pool", "operator": "In", "values": ["gpu-a", "gpu-b"]}]}]}}},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300}]}
    if running:
        spec["nodeName"] = "gpu-node-017"
        status: dict[str, Any] = {
            "phase": "Running", "hostIP": "10.0.3.17", "hostIPs": [{"ip": "10.0.3.17"}],
            "podIP": "10.244.17.9", "podIPs": [{"ip": "10.244.17.9"}], "qosClass": "Guaranteed",
            "startTime": "2025-05-01T10:00:05Z",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                            "lastTransitionTime": "2025-05-01T10:00:40Z"} for t in (
                "PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                "PodScheduled")],
            "containerStatuses": [{
                "name": f"ray-{kind}", "ready": True, "restartCount": 0, "started": True,
                "image": "docker.io/rayproject/ray-ml:2.46.0-py310-gpu",
                "imageID": "docker.io/rayproject/ray-ml@sha256:" + "ab12" * 16,
                "containerID": "containerd://" + "9f3e" * 16,
                "state": {"running": {"startedAt": "2025-05-01T10:00:20Z"}},
                "lastState": {}, "volumeMounts": [
                    {**m, "recursiveReadOnly": "Disabled"} if m.get("readOnly") else m
                    for m in mounts],
                "resources": resources}]}
    else:
        status = {"phase": "Pending", "qosClass": "Guaranteed", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "lastProbeTime": None, "lastTransitionTime": "2025-05-01T10:00:02Z",
            "message": "NotEnoughResources: 0/40 nodes have 1 free GPU"}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}
    meta["managedFields"] = [
        _managed("kuberay-operator", "Update", {"metadata": {
            k: v for k, v in meta.items() if k in ("labels", "annotations", "generateName",
                                                   "ownerReferences")}, "spec": spec}),
        _managed("kai-scheduler", "Update", {"metadata": {"annotations": {
            "pod-group-name": ""}}}),
        _managed("kubelet" if running else "kai-scheduler", "Update", {"status": status},
                 "status")]
    return pod


def raycluster() -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": CLUSTER, "namespace": NS, "uid": CLUSTER_UID,
                         "labels": {"kai.scheduler/queue": "team-a"}},
            "spec": {"headGroupSpec": {}, "workerGroupSpecs": [
                {"groupName": "gpu-group", "replicas": 4, "minReplicas": 4}]}}


def node(name: str = "gpu-node-017") -> dict[str, Any]:
    """A GPU node as the API server returns it (images, nodeInfo, managedFields)."""
    obj = {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "uid": "8c1f0e2a-node", "resourceVersion": "99120",
        "creationTimestamp": "2025-04-01T00:00:00Z",
        "labels": {"kubernetes.io/hostname": name, "node-pool": "gpu-a",
                   "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                   "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "8"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": name})}},
        "spec": {"podCIDR": "10.244.17.0/24", "podCIDRs": ["10.244.17.0/24"],
                 "providerID": f"aws:///us-east-1a/{name}",
                 "taints": [{"key": "nvidia.com/gpu", "value": "present",
                             "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "190", "memory": "2000Gi", "nvidia.com/gpu": "8",
                            "pods": "110", "ephemeral-storage": "900Gi"},
            "capacity": {"cpu": "192", "memory": "2048Gi", "nvidia.com/gpu": "8",
                         "pods": "110", "ephemeral-storage": "1000Gi"},
            "conditions": [{"type": t, "status": s, "reason": f"Kubelet{t}",
                            "message": f"kubelet says {t} is {s}",
                            "lastHeartbeatTime": "2025-05-01T10:00:00Z",
                            "lastTransitionTime": "2025-04-01T00:00:00Z"} for t, s in (
                ("MemoryPressure", "False"), ("DiskPressure", "False"),
                ("PIDPressure", "False"), ("Ready", "True"))],
            "addresses": [{"type": "InternalIP", "address": "10.0.3.17"},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"architecture": "amd64", "kernelVersion": "6.1.0",
                         "kubeletVersion": "v1.31.2", "osImage": "Ubuntu 22.04.4 LTS",
                         "containerRuntimeVersion": "containerd://1.7.22"},
            "images": [{"names": [f"registry.example.com/team/image-{i}@sha256:" + "cd34" * 16,
                                  f"registry.example.com/team/image-{i}:v{i}"],
                        "sizeBytes": 1_000_000_000 + i} for i in range(50)]}}
    obj["metadata"]["managedFields"] = [_managed("kubelet", "Update", {"status": obj["status"]},
                                                 "status")]
    return obj


def _owner_reader(cluster: dict[str, Any]) -> Any:
    def get_owner(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        assert (kind, name) == ("RayCluster", CLUSTER)
        return cluster
    return get_owner


PODS = [kuberay_pod("head", running=True), kuberay_pod("worker", 1),
        kuberay_pod("worker", 2, running=True)]


@pytest.mark.parametrize("pod", PODS, ids=["head-running", "worker-pending", "worker-running"])
def test_a_trimmed_pod_converts_and_groups_as_the_whole_one(pod: dict[str, Any]) -> None:
    before = copy.deepcopy(pod)
    small = trim.trim_pod(pod)
    assert pod == before  # the argument is not changed
    assert convert.pod_from(small) == convert.pod_from(pod)
    assert convert.is_ours(small) and should_group(small) == should_group(pod)
    assert convert.pod_request(small, sharing=False) == convert.pod_request(pod, sharing=False)
    get_owner = _owner_reader(raycluster())
    classes = {"train", "inference"}
    whole = group_pod(pod, resolve_top_owner(pod, get_owner), classes, None, {})
    trimmed = group_pod(small, resolve_top_owner(small, get_owner), classes, None, {})
    assert trimmed == whole
    assert demand_of([small]) == demand_of([pod])  # what a suspended RayJob's stand-ins need
    assert not may_regroup(small, pod)  # nothing the grouper reads was lost
    # what status.py and `kai-ray explain` read, and the reservation pod's waiting state
    assert small["status"]["conditions"] == pod["status"]["conditions"]
    assert [c["state"] for c in small["status"].get("containerStatuses", [])] == \
        [c["state"] for c in pod["status"].get("containerStatuses", [])]
    assert "managedFields" not in small["metadata"]
    assert [c["name"] for c in small["spec"]["containers"]] == \
        [c["name"] for c in pod["spec"]["containers"]]
    assert "env" not in small["spec"]["containers"][0]
    assert "volumes" not in small["spec"]


def test_a_bare_pod_groups_as_the_whole_one_with_its_annotations() -> None:
    """A pod without owners is its own top owner: its annotations go to its PodGroup, so
    they are all kept."""
    pod = kuberay_pod("worker", 3)
    pod["metadata"]["ownerReferences"] = []
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    small = trim.trim_pod(pod)
    owners = resolve_top_owner(pod, _owner_reader(raycluster()))
    assert group_pod(small, resolve_top_owner(small, _owner_reader(raycluster())),
                     {"train"}) == group_pod(pod, owners, {"train"})


def test_a_waiting_reservation_pod_reports_the_same_state_trimmed() -> None:
    res = {"metadata": {"name": "gpu-reservation-n1-abc", "namespace":
                        api_names.RESERVATION_NAMESPACE, "managedFields": [{"manager": "x"}]},
           "spec": {"nodeName": "n1", "containers": [{"name": "reservation", "env": [],
                                                     "image": "i"}]},
           "status": {"phase": "Pending", "containerStatuses": [{
               "name": "reservation", "image": "i", "ready": False, "restartCount": 0,
               "state": {"waiting": {"reason": "ImagePullBackOff",
                                     "message": "Back-off pulling image \"i\""}}}]}}
    binder = Binder.__new__(Binder)
    binder._waiting_since = {}
    binder.config = BinderConfig(reservation_timeout_s=60.0, reservation_image="i")
    assert binder._check_reservation(trim.trim_pod(res)) == binder._check_reservation(res)
    assert "ImagePullBackOff" in binder._check_reservation(res)


def test_gpu_sharing_reads_the_same_trimmed() -> None:
    pod = kuberay_pod("worker", 4)
    for c in pod["spec"]["containers"]:
        c["resources"] = {"requests": {"cpu": "1"}}
    pod["metadata"]["annotations"].update({"gpu-fraction": "0.5",
                                           "gpu-fraction-container-name": "ray-worker"})
    small = trim.trim_pod(pod)
    assert convert.pod_request(small) == convert.pod_request(pod)
    assert convert.sharing_problem(small) is None
    from kai_ray.grouping.admission import fraction_container
    assert fraction_container(small) == fraction_container(pod)
    bad = {**pod, "metadata": {**pod["metadata"], "annotations": {"gpu-fraction": "2"}}}
    assert str(convert.sharing_problem(trim.trim_pod(bad))) == str(convert.sharing_problem(bad))


def test_a_trimmed_node_converts_the_same_and_drops_its_images() -> None:
    obj = node()
    small = trim.trim_node(obj)
    assert convert.node_from(small) == convert.node_from(obj)
    assert "images" not in small["status"] and "managedFields" not in small["metadata"]
    not_ready = node("n2")
    not_ready["spec"]["unschedulable"] = True
    not_ready["status"]["conditions"][-1]["status"] = "False"
    assert convert.node_from(trim.trim_node(not_ready)) == convert.node_from(not_ready)
    assert not convert.node_from(trim.trim_node(not_ready)).ready


def test_podgroups_and_queues_lose_only_managed_fields() -> None:
    pg = {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
          "metadata": {"name": "pg-1", "namespace": NS, "resourceVersion": "7",
                       "annotations": {"a": "b"}, "managedFields": [{"manager": "m"}]},
          "spec": {"minMember": 2, "queue": "team-a", "markUnschedulable": False,
                   "schedulingBackoff": 1, "someFutureField": {"x": 1}},
          "status": {"schedulingConditions": [{"message": "m"}]}}
    small = trim.trim_podgroup(pg)
    assert small == {**pg, "metadata": {k: v for k, v in pg["metadata"].items()
                                        if k != "managedFields"}}
    assert "managedFields" in pg["metadata"]
    desired = {"metadata": {"name": "pg-1", "annotations": {"c": "d"}},
               "spec": {"minMember": 3, "queue": "x"}}
    updated = podgroup_update(small, desired)  # the body the grouper PUTs: nothing erased
    assert updated is not None and updated["spec"]["schedulingBackoff"] == 1
    q = {"metadata": {"name": "q", "managedFields": []}, "spec": {"priority": 3}}
    assert trim.trim_queue(q) == {"metadata": {"name": "q"}, "spec": {"priority": 3}}
    assert convert.queue_from(trim.trim_queue(q)) == convert.queue_from(q)


@pytest.mark.parametrize("fn", [trim.trim_pod, trim.trim_node, trim.trim_podgroup])
@pytest.mark.parametrize("obj", [
    {}, {"metadata": None}, {"metadata": {"name": "x"}, "spec": "bad", "status": []},
    {"metadata": {"name": "x"}, "spec": {"containers": "bad", "initContainers": [1, None]},
     "status": {"containerStatuses": {"not": "a list"}, "conditions": 7}}])
def test_an_object_of_odd_shape_is_kept_not_refused(fn: Any, obj: dict[str, Any]) -> None:
    """A trim must never raise: the informer would re-list forever. convert.py reports the
    bad value as it would untrimmed."""
    out = fn(obj)
    assert isinstance(out, dict)
    if isinstance(obj.get("spec"), str):
        assert out["spec"] == "bad"


def test_trimming_saves_most_of_a_pod() -> None:
    """Serialized size as a proxy for memory: a running pod shrinks several times."""
    for pod in PODS:
        whole = len(json.dumps(pod))
        small = len(json.dumps(trim.trim_pod(pod)))
        assert small * 3 < whole, (whole, small)
    assert len(json.dumps(trim.trim_node(node()))) * 5 < len(json.dumps(node()))
