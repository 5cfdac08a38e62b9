"""Kubernetes objects (plain dicts, as the API returns them) -> the core's snapshot types.

Pure functions: the watch cache feeds them, tests call them directly. Anything malformed is
reported as a `Problem` naming the object and the field, and the object is left out, never
crashing the scheduler.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.utils import parse_quantity

from kai_ray.core.constraints import Requirement, Taint, Term, Toleration
from kai_ray.core.model import (
    DEFAULT_GPU_MEMORY_MIB,
    Job,
    Node,
    Pod,
    PodStatus,
    Queue,
    Request,
    ResourceQuota,
    SubGroup,
)

Obj = Mapping[str, Any]

SCHEDULER_NAME = "kai-scheduler"
GPU = "nvidia.com/gpu"
POD_GROUP_ANNOTATION = "pod-group-name"
SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
# KubeRay (RayMultiHostIndexing, on by default since v1.6) names each multi-host replica here;
# the hosts of one replica are placed and evicted together above the gang minimum
RAY_REPLICA_LABEL = "ray.io/worker-group-replica-name"
REPLICA_HOSTS_ANNOTATION = "kai-ray.io/replica-hosts"  # written by the pod grouper
TASK_PRIORITY_LABEL = "kai.scheduler/task-priority"
GPU_GROUP_LABEL = "runai-gpu-group"
STALE_ANNOTATION = "kai.scheduler/stale-podgroup-timestamp"
LAST_START_ANNOTATION = "kai.scheduler/last-start-timestamp"
# our durable bind intent, one atomic write per gang on the PodGroup (see binder.py)
BIND_INTENT_ANNOTATION = "kai-ray.io/bind-intent"
RESERVATION_NAMESPACE = "kai-resource-reservation"
DEFAULT_PRIORITY = 50


@dataclass(frozen=True)
class Problem:
    kind: str
    namespace: str | None
    name: str
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}: {self.field}: {self.message}"


def meta(obj: Obj) -> Mapping[str, Any]:
    m: Mapping[str, Any] = obj.get("metadata") or {}
    return m


def timestamp(value: str | None) -> float:
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _qty(value: Any) -> float:
    return float(parse_quantity(str(value)))


# ------------------------------------------------------------------------------------ nodes


def node_from(obj: Obj) -> Node:
    status = obj.get("status") or {}
    alloc = status.get("allocatable") or {}
    labels = meta(obj).get("labels") or {}
    mem_label = labels.get("nvidia.com/gpu.memory")
    gpu_mem, synced = DEFAULT_GPU_MEMORY_MIB, False
    if mem_label:
        try:
            value = int(mem_label)
            if value >= 1024 * 1024:  # KAI: values past 1 TiB in MiB are bytes
                value //= 1024 * 1024
            gpu_mem, synced = max(100, value // 100 * 100), True
        except ValueError:
            pass
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    return Node(
        name=meta(obj)["name"],
        cpu_m=int(_qty(alloc.get("cpu", 0)) * 1000),
        memory=int(_qty(alloc.get("memory", 0))),
        gpus=int(_qty(alloc.get(GPU, 0))),
        gpu_memory_mib=gpu_mem,
        gpu_memory_synced=synced,
        max_pods=int(_qty(alloc.get("pods", 110))),
        labels=tuple(sorted(labels.items())),
        ready=ready,
        unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
        taints=tuple(Taint(str(t.get("key", "")), str(t.get("value") or ""),
                           str(t.get("effect", "")))
                     for t in (obj.get("spec") or {}).get("taints") or []
                     if isinstance(t, dict)),
    )


def _tolerations(spec: Obj) -> tuple[Toleration, ...]:
    return tuple(Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"),
                            str(t.get("value") or ""), str(t.get("effect") or ""))
                 for t in spec.get("tolerations") or [] if isinstance(t, dict))


def _node_affinity(spec: Obj) -> tuple[Term, ...] | None:
    """The required node affinity's terms (None when the pod has none). The API server has
    validated the shape; anything unexpected matches no node rather than every node."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not isinstance(required, dict):
        return None
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        if not isinstance(term, dict):
            continue
        reqs = [Requirement(str(r.get("key", "")), str(r.get("operator", "")),
                            tuple(str(v) for v in r.get("values") or ()), field)
                for field, part in ((False, "matchExpressions"), (True, "matchFields"))
                for r in term.get(part) or [] if isinstance(r, dict)]
        terms.append(tuple(reqs))
    return tuple(terms)


# ------------------------------------------------------------------------------------ pods


def _container_requests(c: Obj) -> dict[str, float]:
    res = c.get("resources") or {}
    out = {k: _qty(v) for k, v in (res.get("limits") or {}).items()}
    out.update({k: _qty(v) for k, v in (res.get("requests") or {}).items()})
    return out


def pod_request(pod: Obj) -> Request:
    """Requests as the scheduler sees them: sum of containers (requests, else limits), at least
    the largest init container; GPU-sharing annotations for fractions."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        for k, v in _container_requests(c).items():
            total[k] = total.get(k, 0.0) + v
    for c in spec.get("initContainers") or []:
        for k, v in _container_requests(c).items():
            total[k] = max(total.get(k, 0.0), v)
    ann = meta(pod).get("annotations") or {}
    fraction = ann.get("gpu-fraction")
    memory = ann.get("gpu-memory")
    devices = int(ann.get("gpu-fraction-num-devices") or 1)
    fraction_milli = 0
    if fraction:
        f = float(fraction)
        if 0 < f < 1:  # KAI ignores values outside (0, 1)
            fraction_milli = max(1, round(f * 1000))
    return Request(
        cpu_m=math.ceil(total.get("cpu", 0.0) * 1000),
        memory=int(total.get("memory", 0.0)),
        gpus=0 if (fraction_milli or memory) else int(total.get(GPU, 0.0)),
        gpu_fraction_milli=fraction_milli,
        gpu_memory_mib=int(memory) if memory and not fraction_milli else 0,
        fraction_devices=devices if (fraction_milli or memory) else 1,
    )


def gpu_groups(pod: Obj) -> tuple[str, ...]:
    labels = meta(pod).get("labels") or {}
    multi = sorted(v for k, v in labels.items() if k.startswith(GPU_GROUP_LABEL + "/"))
    if multi:
        return tuple(multi)
    single = labels.get(GPU_GROUP_LABEL)
    return (single,) if single else ()


def pod_status(pod: Obj, intent: Mapping[str, Any] | None) -> PodStatus:
    if meta(pod).get("deletionTimestamp"):
        return PodStatus.RELEASING
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    spec = pod.get("spec") or {}
    if phase == "Succeeded":
        return PodStatus.SUCCEEDED
    if phase == "Failed":
        return PodStatus.FAILED
    if phase == "Running":
        return PodStatus.RUNNING
    if spec.get("nodeName"):
        return PodStatus.BOUND
    if intent is not None:
        return PodStatus.BINDING
    if spec.get("schedulingGates"):
        return PodStatus.GATED
    return PodStatus.PENDING


def pod_from(pod: Obj, intent: Mapping[str, Any] | None = None) -> Pod:
    m = meta(pod)
    labels = m.get("labels") or {}
    status = pod_status(pod, intent)
    node = (pod.get("spec") or {}).get("nodeName")
    groups = gpu_groups(pod)
    if status == PodStatus.BINDING and intent is not None:
        node = intent.get("node")
        groups = tuple(intent.get("gpu_groups") or ())
    prio_label = labels.get(TASK_PRIORITY_LABEL)
    try:
        task_priority = int(prio_label) if prio_label is not None else None
    except ValueError:
        task_priority = None
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    return Pod(
        name=m["name"], namespace=m.get("namespace", "default"), request=pod_request(pod),
        status=status, node=node, gpu_groups=groups, task_priority=task_priority,
        created=timestamp(m.get("creationTimestamp")),
        is_ray_head=labels.get("ray.io/node-type") == "head",
        subgroup=labels.get(SUBGROUP_LABEL), uid=m.get("uid", ""),
        node_selector=tuple(sorted(selector.items())),
        tolerations=_tolerations(spec), node_affinity=_node_affinity(spec),
        replica=labels.get(RAY_REPLICA_LABEL) or None,
    )


def is_ours(pod: Obj) -> bool:
    return (pod.get("spec") or {}).get("schedulerName") == SCHEDULER_NAME


# ------------------------------------------------------------------------------------ queues

_RESOURCES = ("gpu", "cpu", "memory")


def queue_from(obj: Obj) -> Queue | Problem:
    m = meta(obj)
    name = m.get("name", "?")
    spec = obj.get("spec") or {}
    resources = spec.get("resources")
    quotas: dict[str, ResourceQuota] = {}
    for r in _RESOURCES:
        raw = (resources or {}).get(r) or {}
        values = []
        for key in ("quota", "limit", "overQuotaWeight"):
            value = raw.get(key, 0)
            if not isinstance(value, int | float) or isinstance(value, bool):
                return Problem("Queue", None, name, f"spec.resources.{r}.{key}",
                               f"must be a number, got {value!r}")
            values.append(float(value))
        quotas[r] = ResourceQuota(*values)
    priority = spec.get("priority", 100)
    if not isinstance(priority, int):
        return Problem("Queue", None, name, "spec.priority",
                       f"must be an integer, got {priority!r}")
    return Queue(
        name=name, parent=spec.get("parentQueue") or None, priority=priority,
        gpu=quotas["gpu"], cpu=quotas["cpu"], memory=quotas["memory"],
        created=timestamp(m.get("creationTimestamp")),
        display_name=spec.get("displayName"),
        preempt_min_runtime_s=_duration(spec.get("preemptMinRuntime")),
        reclaim_min_runtime_s=_duration(spec.get("reclaimMinRuntime")),
    )


def _duration(value: str | None) -> float | None:
    """Go duration strings such as "30s", "5m", "1h30m"."""
    if not value:
        return None
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    total, number = 0.0, ""
    i = 0
    while i < len(value):
        ch = value[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if value[i:i + 2] == "ms" else ch
        i += len(unit)
        if unit not in units or not number:
            return None
        total += float(number) * units[unit]
        number = ""
    return total


# ------------------------------------------------------------------------------------ jobs


def priority_of(class_name: str | None, classes: Mapping[str, int], default: int | None) -> int:
    if class_name and class_name in classes:
        return classes[class_name]
    return default if default is not None else DEFAULT_PRIORITY


def now_rfc3339() -> str:
    """Now, as the API server writes timestamps (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_object(raw: str | None) -> dict[str, Any]:
    """An annotation holding a JSON object; missing or malformed: empty."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def bind_intent(podgroup: Obj) -> dict[str, Any]:
    """The binder's pending decisions for this gang: {pod name: {node, gpu_groups, ...}}."""
    return _json_object((meta(podgroup).get("annotations") or {}).get(BIND_INTENT_ANNOTATION))


def _replica_hosts(raw: str | None) -> dict[str, int]:
    """{subgroup: pods per replica} from the pod grouper's annotation (bad values: none)."""
    return {str(k): v for k, v in _json_object(raw).items() if isinstance(v, int) and v >= 1}


def job_from(pg: Obj, pods: Iterable[Obj], classes: Mapping[str, int],
             default_priority: int | None) -> Job:
    m = meta(pg)
    spec = pg.get("spec") or {}
    ann = m.get("annotations") or {}
    intent = bind_intent(pg)
    preemptibility = spec.get("preemptibility") or ""
    replica_hosts = _replica_hosts(ann.get(REPLICA_HOSTS_ANNOTATION))
    subgroups = tuple(SubGroup(sg["name"], max(1, int(sg.get("minMember", 1))),
                               replica_size=replica_hosts.get(sg["name"], 1))
                      for sg in spec.get("subGroups") or [] if sg.get("name"))
    stale = ann.get(STALE_ANNOTATION)
    last_start = ann.get(LAST_START_ANNOTATION)
    return Job(
        name=m["name"], namespace=m.get("namespace", "default"),
        queue=spec.get("queue") or "",
        priority=priority_of(spec.get("priorityClassName"), classes, default_priority),
        pods=tuple(pod_from(p, intent.get(meta(p)["name"])) for p in pods),
        min_member=max(1, int(spec.get("minMember") or 1)),
        created=timestamp(m.get("creationTimestamp")),
        preemptible={"preemptible": True, "non-preemptible": False}.get(preemptibility),
        subgroups=subgroups,
        stale_since=timestamp(stale) if stale else None,
        last_start=timestamp(last_start) if last_start else None,
        uid=m.get("uid", ""),
    )
