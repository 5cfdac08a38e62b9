"""Kubernetes objects (plain dicts, as the API returns them) -> the core's snapshot types.

Pure functions: the watch cache feeds them, tests call them directly. Anything malformed is
reported as a `Problem` naming the object and the field, and the object is left out, never
crashing the scheduler.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from kubernetes.utils import parse_quantity

from kai_ray.api_names import (
    BIND_INTENT_ANNOTATION,
    ELASTIC_SUBGROUPS_ANNOTATION,
    GPU_GROUP_LABEL,
    LAST_START_ANNOTATION,
    RAISED_MINIMUM_ANNOTATION,
    RAY_REPLICA_LABEL,
    REPLICA_HOSTS_ANNOTATION,
    SCHEDULER_NAME,
    STALE_ANNOTATION,
    SUBGROUP_LABEL,
    TASK_PRIORITY_LABEL,
)
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
from kai_ray.grouping import admission
from kai_ray.grouping.update import parse_raised_minimum

Obj = Mapping[str, Any]

GPU = "nvidia.com/gpu"
DEFAULT_PRIORITY = 50


class InvalidField(ValueError):
    """A value the scheduler must not guess at (a bad `gpu-fraction` is not "no GPU"): `field`
    names where it is (e.g. ``metadata.annotations[gpu-fraction]``), the message what is wrong.
    The cache turns it into a `Problem` on that object; the object is left out, never read as
    a default."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Problem:
    kind: str
    namespace: str | None
    name: str
    field: str
    message: str
    uid: str = ""  # the object's, for the event that reports it

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
    return _qty_of(str(value))


@lru_cache(maxsize=4096)
def _qty_of(text: str) -> float:
    # a cluster repeats a few quantities ("500m", "1Gi") thousands of times, and parsing one
    # (Decimal arithmetic) was a tenth of a first snapshot of 9,000 pods; a bad one raises
    # each time (exceptions are not cached)
    return float(parse_quantity(text))


# ------------------------------------------------------------------------------------ nodes


GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per device, written by GPU feature discovery


def node_gpu_memory(labels: Mapping[str, Any]) -> tuple[int, bool]:
    """(MiB per device, synced) from the node's label, as KAI reads it: no label, the default
    and not synced (gpu-memory pods do not go there). Raises InvalidField for a label that is
    not a whole number above 0: GPU feature discovery never writes one, so the node is
    misconfigured and must be reported, not read as a 100 MiB device."""
    raw = labels.get(GPU_MEMORY_LABEL)
    if raw is None or raw == "":
        return DEFAULT_GPU_MEMORY_MIB, False
    if not isinstance(raw, str) or not re.fullmatch(r"[0-9]{1,18}", raw) or int(raw) == 0:
        raise InvalidField(f"metadata.labels[{GPU_MEMORY_LABEL}]",
                           f"must be a whole number of MiB above 0, got {raw!r}")
    value = int(raw)
    if value >= 1024 * 1024:  # KAI: values past 1 TiB in MiB are bytes
        value //= 1024 * 1024
    return max(100, value // 100 * 100), True


def _allocatable(alloc: Obj, key: str, default: object) -> float:
    value = alloc.get(key, default)
    try:
        amount = _qty(value)
    except (ValueError, ArithmeticError):
        raise InvalidField(f"status.allocatable[{key}]", f"not a quantity: {value!r}") from None
    if not amount >= 0:
        raise InvalidField(f"status.allocatable[{key}]", f"must not be negative, got {value!r}")
    return amount


def node_from(obj: Obj, problems: list[Problem] | None = None) -> Node:
    """The node. A bad `nvidia.com/gpu.memory` label: with `problems`, a Problem naming it is
    appended and the node is kept as KAI keeps one without the label (whole GPUs and
    fractions schedule there, gpu-memory pods do not); without `problems`, InvalidField is
    raised (the caller reports the node and leaves it out). Bad allocatable quantities
    raise InvalidField."""
    status = obj.get("status") or {}
    alloc = status.get("allocatable") or {}
    labels = meta(obj).get("labels") or {}
    try:
        gpu_mem, synced = node_gpu_memory(labels)
    except InvalidField as e:
        if problems is None:
            raise
        m = meta(obj)
        problems.append(Problem("Node", None, str(m.get("name", "?")), e.field,
                                e.message + " (read as unknown: no gpu-memory pods here)",
                                uid=str(m.get("uid") or "")))
        gpu_mem, synced = DEFAULT_GPU_MEMORY_MIB, False
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    return Node(
        name=meta(obj)["name"],
        cpu_m=int(_allocatable(alloc, "cpu", 0) * 1000),
        memory=int(_allocatable(alloc, "memory", 0)),
        gpus=int(_allocatable(alloc, GPU, 0)),
        gpu_memory_mib=gpu_mem,
        gpu_memory_synced=synced,
        max_pods=int(_allocatable(alloc, "pods", 110)),
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


def _container_requests(c: Obj, where: str) -> dict[str, float]:
    res = c.get("resources") or {}
    out: dict[str, float] = {}
    for part in ("limits", "requests"):  # requests win over limits
        for k, v in (res.get(part) or {}).items():
            try:
                out[k] = _qty(v)
            except (ValueError, ArithmeticError):
                raise InvalidField(f"{where}.resources.{part}[{k}]",
                                   f"not a quantity: {v!r}") from None
    return out


SHARING_ANNOTATIONS = (admission.GPU_FRACTION, admission.GPU_MEMORY,
                       admission.GPU_FRACTION_NUM_DEVICES, admission.MPS)


def sharing_problem(pod: Obj) -> InvalidField | None:
    """The first GPU-sharing annotation the webhook would refuse, as an InvalidField naming
    it and its value; None when the pod has none or they are valid. The same rules hold
    however the pod arrived (without the webhook, before it was installed, another
    scheduler's pod), so a value the webhook refuses is never read as "no GPU"."""
    ann = meta(pod).get("annotations") or {}
    if not any(k in ann for k in SHARING_ANNOTATIONS):
        return None
    problem = admission.gpu_request_problem(pod)
    if problem is None:
        return None
    key, message = problem
    return InvalidField(f"metadata.annotations[{key}]", f"{message} (got {ann.get(key)!r})")


def pod_request(pod: Obj, sharing: bool = True) -> Request:
    """Requests as the scheduler sees them: sum of containers (requests, else limits), at least
    the largest init container; GPU-sharing annotations for fractions (`sharing`; False for
    pods another scheduler placed: the kubelet gives them what their resources say, whatever
    their annotations). Raises InvalidField for an annotation the webhook would refuse."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {}
    for i, c in enumerate(spec.get("containers") or []):
        for k, v in _container_requests(c, f"spec.containers[{i}]").items():
            total[k] = total.get(k, 0.0) + v
    for i, c in enumerate(spec.get("initContainers") or []):
        for k, v in _container_requests(c, f"spec.initContainers[{i}]").items():
            total[k] = max(total.get(k, 0.0), v)
    fraction_milli = memory_mib = 0
    devices = 1
    if sharing:
        bad = sharing_problem(pod)
        if bad is not None:
            raise bad
        ann = meta(pod).get("annotations") or {}
        # valid by now: a fraction in (0, 1), whole numbers >= 1 for the others
        if ann.get(admission.GPU_FRACTION):
            fraction_milli = max(1, round(float(ann[admission.GPU_FRACTION]) * 1000))
        elif ann.get(admission.GPU_MEMORY):
            memory_mib = int(ann[admission.GPU_MEMORY])
        if fraction_milli or memory_mib:
            devices = int(ann.get(admission.GPU_FRACTION_NUM_DEVICES) or 1)
    return Request(
        cpu_m=math.ceil(total.get("cpu", 0.0) * 1000),
        memory=int(total.get("memory", 0.0)),
        gpus=0 if (fraction_milli or memory_mib) else int(total.get(GPU, 0.0)),
        gpu_fraction_milli=fraction_milli,
        gpu_memory_mib=memory_mib,
        fraction_devices=devices,
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
    task_priority = None
    if prio_label is not None:
        # an unreadable priority is not "no priority": it would reorder the gang's pods
        if not isinstance(prio_label, str) or not re.fullmatch(r"[+-]?[0-9]{1,18}", prio_label):
            raise InvalidField(f"metadata.labels[{TASK_PRIORITY_LABEL}]",
                               f"must be an integer, got {prio_label!r}")
        task_priority = int(prio_label)
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
    """A Queue, or a Problem naming the first field the CRD's schema should have refused (it
    is not always installed, and tests and files skip it): a value the core would compute
    with is never guessed."""
    m = meta(obj)
    name = m.get("name", "?")

    def problem(field: str, message: str) -> Problem:
        return Problem("Queue", None, name, field, message, uid=str(m.get("uid") or ""))

    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        return problem("spec", f"must be a mapping, got {spec!r}")
    resources = spec.get("resources") or {}
    if not isinstance(resources, Mapping):
        return problem("spec.resources", f"must be a mapping, got {resources!r}")
    quotas: dict[str, ResourceQuota] = {}
    for r in _RESOURCES:
        raw = resources.get(r) or {}
        if not isinstance(raw, Mapping):
            return problem(f"spec.resources.{r}", f"must be a mapping, got {raw!r}")
        values = []
        for key in ("quota", "limit", "overQuotaWeight"):
            value = raw.get(key, 0)
            if not isinstance(value, int | float) or isinstance(value, bool) \
                    or not math.isfinite(value):
                return problem(f"spec.resources.{r}.{key}",
                               f"must be a finite number, got {value!r}")
            # -1 is "unlimited" for quota and limit; a weight is a share, never negative
            if key == "overQuotaWeight" and value < 0:
                return problem(f"spec.resources.{r}.{key}", f"must be >= 0, got {value!r}")
            if key != "overQuotaWeight" and value < 0 and value != -1:
                return problem(f"spec.resources.{r}.{key}",
                               f"must be -1 (unlimited) or >= 0, got {value!r}")
            values.append(float(value))
        quotas[r] = ResourceQuota(*values)
    priority = spec.get("priority", 100)
    if not isinstance(priority, int) or isinstance(priority, bool):
        return problem("spec.priority", f"must be an integer, got {priority!r}")
    parent = spec.get("parentQueue") or None
    if parent is not None and not isinstance(parent, str):
        return problem("spec.parentQueue", f"must be a queue name, got {parent!r}")
    runtimes: dict[str, float | None] = {}
    for key in ("preemptMinRuntime", "reclaimMinRuntime"):
        value = spec.get(key)
        runtimes[key] = _duration(value)
        # a min-runtime that cannot be read is not "none"
        if runtimes[key] is None and value not in (None, ""):
            return problem(f"spec.{key}", "must be a duration such as \"30s\" or \"1h30m\" "
                                          f"(no sign), got {value!r}")
    return Queue(
        name=name, parent=parent, priority=priority,
        gpu=quotas["gpu"], cpu=quotas["cpu"], memory=quotas["memory"],
        created=timestamp(m.get("creationTimestamp")),
        display_name=spec.get("displayName"),
        preempt_min_runtime_s=runtimes["preemptMinRuntime"],
        reclaim_min_runtime_s=runtimes["reclaimMinRuntime"],
    )


# Go's time.ParseDuration units, in seconds
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3,
                   "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def _duration(value: object) -> float | None:
    """A Go duration string ("30s", "5m", "1h30m", "1.5h", "0") in seconds; None when unset or
    not such a string (queue_from reports the latter)."""
    if not isinstance(value, str) or value == "":
        return None
    if value == "0":
        return 0.0
    total, at = 0.0, 0
    while at < len(value):
        part = _DURATION_PART.match(value, at)
        if part is None:
            return None
        total += float(part.group(1)) * _DURATION_UNITS[part.group(2)]
        at = part.end()
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


def _elastic_subgroups(raw: str | None) -> list[str]:
    """Subgroup names from the pod grouper's annotation (a JSON list; bad values: none)."""
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    return [v for v in value if isinstance(v, str) and v] if isinstance(value, list) else []


def job_key(namespace: str, name: str) -> str:
    """A job's identity in the core, results and the loop: namespace and PodGroup name
    (two namespaces may each hold a PodGroup of the same name)."""
    return f"{namespace}/{name}"


PodReader = Callable[[Obj, "Mapping[str, Any] | None"], Pod]


def job_from(pg: Obj, pods: Iterable[Obj], classes: Mapping[str, int],
             default_priority: int | None, read_pod: PodReader | None = None) -> Job:
    """`read_pod`: `pod_from`, or one that gives back what it read before (the cache's)."""
    read = read_pod or pod_from
    m = meta(pg)
    spec = pg.get("spec") or {}
    ann = m.get("annotations") or {}
    intent = bind_intent(pg)
    preemptibility = spec.get("preemptibility") or ""
    if preemptibility not in _PREEMPTIBILITY:
        raise InvalidField("spec.preemptibility", "must be preemptible or non-preemptible, "
                                                  f"got {preemptibility!r}")
    queue = spec.get("queue") or ""
    if not isinstance(queue, str):
        raise InvalidField("spec.queue", f"must be a queue name, got {queue!r}")
    replica_hosts = _replica_hosts(ann.get(REPLICA_HOSTS_ANNOTATION))
    subgroups: list[SubGroup] = []
    for i, sg in enumerate(spec.get("subGroups") or []):
        where = f"spec.subGroups[{i}]"
        if not isinstance(sg, Mapping):
            raise InvalidField(where, f"must be a mapping, got {sg!r}")
        name = sg.get("name")
        # a nameless or repeated subgroup would silently lose its pods or its minimum
        if not isinstance(name, str) or not name:
            raise InvalidField(f"{where}.name", f"must be a non-empty string, got {name!r}")
        if any(s.name == name for s in subgroups):
            raise InvalidField(f"{where}.name", f"{name!r} is named twice")
        subgroups.append(SubGroup(name, _min_member(sg.get("minMember"), f"{where}.minMember"),
                                  replica_size=replica_hosts.get(name, 1)))
    if subgroups:
        # subgroups of minimum 0 (autoscaled Ray groups with minReplicas 0), which the CRD
        # cannot hold in spec.subGroups; a name spec.subGroups has keeps its minimum there
        for name in _elastic_subgroups(ann.get(ELASTIC_SUBGROUPS_ANNOTATION)):
            if all(s.name != name for s in subgroups):
                subgroups.append(SubGroup(name, 0, replica_size=replica_hosts.get(name, 1)))
    # the lowest minimums of this run of the gang, when a spec change raised them since it
    # started (recorded by the pod grouper for the run whose last-start stamp it saw; a record
    # of an earlier run does not count)
    raised = parse_raised_minimum(ann.get(RAISED_MINIMUM_ANNOTATION))
    admitted: int | None = None
    if raised is not None and raised[0] == ann.get(LAST_START_ANNOTATION):
        admitted = raised[1]
        subgroups = [dataclasses.replace(s, admitted_min_member=raised[2].get(s.name, 0))
                     for s in subgroups]
    namespace = m.get("namespace", "default")
    return Job(
        name=job_key(namespace, m["name"]), namespace=namespace,
        queue=queue,
        priority=priority_of(spec.get("priorityClassName"), classes, default_priority),
        # an entry out of shape is no intent here (the binder drops it next cycle)
        pods=tuple(read(p, e if isinstance(e := intent.get(meta(p)["name"]), dict) else None)
                   for p in pods),
        min_member=_min_member(spec.get("minMember"), "spec.minMember"),
        created=timestamp(m.get("creationTimestamp")),
        preemptible=_PREEMPTIBILITY[preemptibility],
        subgroups=tuple(subgroups),
        stale_since=_annotation_time(ann, STALE_ANNOTATION),
        last_start=_annotation_time(ann, LAST_START_ANNOTATION),
        uid=m.get("uid", ""),
        admitted_min_member=admitted,
    )


_PREEMPTIBILITY: dict[str, bool | None] = {"": None, "preemptible": True,
                                           "non-preemptible": False}


def _min_member(value: object, field: str) -> int:
    """A gang minimum: unset is 1; anything but a whole number >= 1 is refused, as the CRD
    refuses it (a gang of 0 or of 2.5 pods is not a gang of 1)."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidField(field, f"must be an integer >= 1, got {value!r}")
    return value


def _annotation_time(ann: Mapping[str, Any], key: str) -> float | None:
    raw = ann.get(key)
    if not raw:
        return None
    try:
        return timestamp(raw)
    except (TypeError, ValueError, AttributeError):
        raise InvalidField(f"metadata.annotations[{key}]",
                           f"must be an RFC 3339 time, got {raw!r}") from None
