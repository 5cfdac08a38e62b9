"""Pod admission for GPU sharing, as KAI's webhook does it, without I/O.

``validate_pod(pod, config=None, queues=None, namespace_labels=None) -> Verdict``
    Pods whose ``spec.schedulerName`` is not ours are allowed untouched. Otherwise, in order:
    a fraction or memory request while GPU sharing is off is denied; the GPU-sharing annotations
    are checked with KAI's messages (``validate_gpu_request``); the container named by
    ``gpu-fraction-container-name`` must exist; and, when ``config.validate_queue`` is on and
    ``queues`` (queue name → parentQueue or None) is given, the pod's queue must exist, have an
    existing parent and be a leaf. The pod's queue at admission is its own queue label (then the
    legacy key), then the namespace's, then the default queue.

    Before all that, an annotation only the scheduler writes (``config.is_scheduler_owned``:
    ``kai-ray.io/...``, KAI's last-start and stale-PodGroup timestamps) is denied, naming it.

``validate_pod_update(old, new, config=None) -> Verdict``
    An UPDATE of one of our pods: setting or changing a scheduler-owned annotation is denied
    (removing one, or leaving it as it was, is not); when any GPU-sharing annotation changed, the
    GPU-sharing rules above are applied to ``new``. An update that leaves them alone is allowed
    even if the pod predates the rules (kubelets and controllers update pods all the time).
    The queue is not checked again (the PodGroup keeps its queue).

``mutate_pod(pod, suffix, config=None) -> list[dict]``
    JSON patch (RFC 6902) for a pod with ``gpu-fraction`` or ``gpu-memory``: the fraction
    container (``gpu-fraction-container-name``, init containers first, else container 0) gets env
    ``NVIDIA_VISIBLE_DEVICES``, ``RUNAI_NUM_OF_GPUS``, ``GPU_PORTION`` (and for ``gpu-memory`` pods
    ``KAI_RAY_GPU_MEMORY_LIMIT_MIB``), each a configMapKeyRef to the pod's ConfigMap
    ``<prefix>-<index>`` (``-i<index>`` for an init container). The prefix
    ``<owner-or-pod>-<suffix>-shared-gpu`` is stored in annotation ``runai/shared-gpu-configmap``
    and reused when already there; ``suffix`` is the caller's random string (KAI: 7 characters).
    Unlike KAI, no ConfigMap volume and no ``-evar`` envFrom are added: the env references alone
    make the kubelet wait for the ConfigMap.

``gpu_configmap_data(device_ids, portion, memory_mib=None, cdi=False) -> dict[str, str]``
    The ConfigMap data the binder writes once the pod's devices are chosen: device ids (or CDI
    names) comma-joined, the portion with two decimals in ``GPU_PORTION`` and
    ``RUNAI_NUM_OF_GPUS``, and the memory limit in MiB when given.

``gpu_configmap(pod, data) -> dict``
    The ConfigMap manifest (name from the pod's annotation, owned by the pod).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kai_ray.api_names import SHARED_GPU_CONFIGMAP_ANNOTATION
from kai_ray.grouping.config import GroupingConfig, is_scheduler_owned
from kai_ray.grouping.objects import GroupingError, Obj

GPU_FRACTION = "gpu-fraction"
GPU_MEMORY = "gpu-memory"
GPU_FRACTION_NUM_DEVICES = "gpu-fraction-num-devices"
GPU_FRACTION_CONTAINER_NAME = "gpu-fraction-container-name"
MPS = "mps"
GPU_RESOURCE = "nvidia.com/gpu"
CONFIGMAP_ANNOTATION = SHARED_GPU_CONFIGMAP_ANNOTATION
# what an UPDATE must leave alone to skip the GPU-sharing checks
SHARING_ANNOTATIONS = (GPU_FRACTION, GPU_MEMORY, GPU_FRACTION_NUM_DEVICES,
                       GPU_FRACTION_CONTAINER_NAME, MPS)

NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
RUNAI_NUM_OF_GPUS = "RUNAI_NUM_OF_GPUS"
GPU_PORTION = "GPU_PORTION"
GPU_MEMORY_LIMIT = "KAI_RAY_GPU_MEMORY_LIMIT_MIB"

_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_HEX_FLOAT = re.compile(r"[+-]?0[xX][0-9a-fA-F_.]+[pP][+-]?\d+")  # Go needs the p exponent
_UINT = re.compile(r"[0-9]+")
_UINT64_MAX = 2**64 - 1


class AdmissionError(GroupingError):
    """A pod the mutation cannot handle (validation reports the same problem as a denial)."""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""


@dataclass(frozen=True)
class ContainerRef:
    field: str  # "containers" or "initContainers"
    index: int
    name: str

    @property
    def configmap_suffix(self) -> str:
        return f"i{self.index}" if self.field == "initContainers" else str(self.index)


def _pod_name(pod: Obj) -> str:
    m = pod.get("metadata") or {}
    return f"{m.get('namespace', '')}/{m.get('name') or m.get('generateName') or ''}"


def _annotations(pod: Obj) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def requests_gpu_sharing(pod: Obj) -> bool:
    """True for pods with a ``gpu-fraction`` or ``gpu-memory`` annotation."""
    ann = _annotations(pod)
    return GPU_FRACTION in ann or GPU_MEMORY in ann


def _parse_go_uint(value: str) -> int | None:
    """Like Go's ``strconv.ParseUint(value, 10, 64)``: digits only, at most 2^64-1."""
    if not _UINT.fullmatch(value) or int(value) > _UINT64_MAX:
        return None
    return int(value)


def _parse_go_float(value: str) -> tuple[float | None, bool]:
    """``(value or None, is a Kubernetes quantity)``, close to Go's ``strconv.ParseFloat``."""
    if _DECIMAL.fullmatch(value):
        return float(value), True
    lowered = value.lower().lstrip("+-")
    if lowered in ("nan", "inf", "infinity"):
        return float(value.lower().replace("infinity", "inf")), False
    if _HEX_FLOAT.fullmatch(value):
        try:
            return float.fromhex(value.replace("_", "")), False
        except ValueError:
            return None, False
    return None, False


def _whole_gpu_limit(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if GPU_RESOURCE in ((container.get("resources") or {}).get("limits") or {}):
            return True
    return False


def validate_gpu_request(pod: Obj) -> str | None:
    """KAI's GPU-sharing checks, in KAI's order; the first failure's message, or None."""
    problem = gpu_request_problem(pod)
    return problem[1] if problem else None


def gpu_request_problem(pod: Obj) -> tuple[str, str] | None:
    """KAI's GPU-sharing checks, in KAI's order: (the annotation at fault, KAI's message) of
    the first failure, or None."""
    ann = _annotations(pod)
    fraction, memory = ann.get(GPU_FRACTION), ann.get(GPU_MEMORY)
    count = ann.get(GPU_FRACTION_NUM_DEVICES)
    whole = _whole_gpu_limit(pod)
    if fraction is None and memory is None and ann.get(MPS) == "true":
        return MPS, "MPS is only supported with GPU fraction request"
    if fraction is not None and whole:
        return GPU_FRACTION, ("cannot have both GPU fraction request and whole GPU resource "
                              "request/limit")
    if memory is not None and (fraction is not None or whole):
        return GPU_MEMORY, "cannot request both GPU and GPU memory"
    if count is not None and fraction is None and memory is None:
        return GPU_FRACTION_NUM_DEVICES, ("cannot request multiple fractional devices without "
                                          "specifying fraction portion or gpu-memory")
    if memory is not None and not _parse_go_uint(memory):
        return GPU_MEMORY, "gpu-memory annotation value must be a positive integer greater than 0"
    if fraction is not None:
        value, is_quantity = _parse_go_float(fraction)
        if value is None or value <= 0 or value >= 1:
            return GPU_FRACTION, ("gpu-fraction annotation value must be a positive number "
                                  "smaller than 1.0")
        if math.isnan(value):
            return GPU_FRACTION, ("gpu-fraction annotation value must be a valid number. NaN "
                                  "is not allowed")
        if not is_quantity:
            return GPU_FRACTION, ("gpu-fraction annotation value must be a float written with "
                                  f"a decimal point or a scientific notation .given value: "
                                  f"{fraction}")
    if count is not None and not _parse_go_uint(count):
        return GPU_FRACTION_NUM_DEVICES, ("fraction count annotation value must be a positive "
                                          "integer greater than 0")
    return None


def fraction_container(pod: Obj) -> ContainerRef:
    """The container that receives the GPU env (KAI: init containers are searched first)."""
    spec = pod.get("spec") or {}
    name = _annotations(pod).get(GPU_FRACTION_CONTAINER_NAME)
    if name is None:
        containers = spec.get("containers") or []
        if not containers:
            raise AdmissionError(f"pod {_pod_name(pod)}: spec.containers is empty")
        return ContainerRef("containers", 0, str(containers[0].get("name", "")))
    for field in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(field) or []):
            if container.get("name") == name:
                return ContainerRef(field, i, name)
    raise AdmissionError(f"container with name {name} not found for fraction request")


def pod_queue(pod: Obj, config: GroupingConfig,
              namespace_labels: Mapping[str, str] | None = None) -> str:
    """The queue a pod names at admission: its label, then its namespace's, then the default."""
    sources = [(pod.get("metadata") or {}).get("labels") or {}]
    if config.namespace_queue and namespace_labels:
        sources.append(namespace_labels)
    for source in sources:
        for key in config.queue_keys():
            if source.get(key):
                return str(source[key])
    return config.default_queue


def _queue_problem(queue: str, queues: Mapping[str, str | None]) -> str | None:
    if queue not in queues:
        return f"queue '{queue}' does not exist"
    parent = queues[queue]
    if parent and parent not in queues:
        return f"queue '{queue}' has parent queue '{parent}', which does not exist"
    children = sorted(q for q, p in queues.items() if p == queue)
    if children:
        return (f"queue '{queue}' is not a leaf queue (child queues: {', '.join(children)}); "
                "pods can only run in leaf queues")
    return None


def queue_parents(queue_objects: Sequence[Obj]) -> dict[str, str | None]:
    """``{name: spec.parentQueue or None}`` from Queue objects, for ``validate_pod``."""
    return {str(q["metadata"]["name"]): (q.get("spec") or {}).get("parentQueue") or None
            for q in queue_objects}


def scheduler_owned_problem(pod: Obj, old: Obj | None = None) -> str | None:
    """The denial for the first scheduler-owned annotation ``pod`` sets, or changes from
    ``old`` (an UPDATE's object before it); None when there is none."""
    before = _annotations(old) if old is not None else {}
    after = _annotations(pod)
    for key in sorted(after):
        if is_scheduler_owned(key) and (key not in before or before[key] != after[key]):
            verb = "change" if key in before else "set"
            return (f"annotation {key} is written only by the scheduler: pod {_pod_name(pod)} "
                    f"may not {verb} it")
    return None


def _sharing_problem(pod: Obj, config: GroupingConfig, verb: str) -> str | None:
    sharing = requests_gpu_sharing(pod)
    if sharing and not config.gpu_sharing_enabled:
        return (f"attempting to {verb} a pod {_pod_name(pod)} with gpu sharing request, while "
                "GPU sharing is disabled")
    if problem := validate_gpu_request(pod):
        return problem
    if sharing:
        try:
            fraction_container(pod)
        except AdmissionError as e:
            return str(e)
    return None


def validate_pod(
    pod: Obj,
    config: GroupingConfig | None = None,
    queues: Mapping[str, str | None] | None = None,
    namespace_labels: Mapping[str, str] | None = None,
) -> Verdict:
    """See the module docstring."""
    config = config or GroupingConfig()
    if (pod.get("spec") or {}).get("schedulerName") != config.scheduler_name:
        return Verdict(True)
    if problem := scheduler_owned_problem(pod):
        return Verdict(False, problem)
    if problem := _sharing_problem(pod, config, "create"):
        return Verdict(False, problem)
    if config.validate_queue and queues is not None:
        queue = pod_queue(pod, config, namespace_labels)
        if problem := _queue_problem(queue, queues):
            return Verdict(False, f"pod {_pod_name(pod)}: {problem}")
    return Verdict(True)


def validate_pod_update(old: Obj, new: Obj, config: GroupingConfig | None = None) -> Verdict:
    """See the module docstring."""
    config = config or GroupingConfig()
    if (new.get("spec") or {}).get("schedulerName") != config.scheduler_name:
        return Verdict(True)
    if problem := scheduler_owned_problem(new, old):
        return Verdict(False, problem)
    before, after = _annotations(old), _annotations(new)
    changed = [k for k in SHARING_ANNOTATIONS if before.get(k) != after.get(k)]
    if not changed:
        return Verdict(True)
    node = (old.get("spec") or {}).get("nodeName")
    if node:
        # its share of the device was set at bind time (its ConfigMap); the scheduler counts
        # bound pods by these annotations, so a lower value would over-commit the device
        m = new.get("metadata") or {}
        return Verdict(False, f"pod {m.get('namespace')}/{m.get('name')} is bound to node "
                              f"{node}: annotation {changed[0]} cannot change after binding "
                              "(delete and recreate the pod to change its GPU share)")
    if problem := _sharing_problem(new, config, "update"):
        return Verdict(False, problem)
    return Verdict(True)


def configmap_prefix(pod: Obj, container: ContainerRef, suffix: str) -> str:
    """``<owner-or-pod>-<suffix>-shared-gpu``, short enough for ``<name>-<index>-evar-vol``."""
    m = pod.get("metadata") or {}
    owners = m.get("ownerReferences") or []
    base = owners[0].get("name", "") if owners else m.get("name") or m.get("generateName") or ""
    # 63 (volume name) - 4 ("-vol") - 2 hyphens - 7 random - "shared-gpu" - "-<idx>" - "-evar"
    limit = 63 - 13 - len("shared-gpu") - (len(str(container.index)) + 1) - 5
    base = base[:limit].rstrip(".-") or "pod"
    return f"{base}-{suffix}-shared-gpu"


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _env_ref(name: str, configmap: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": configmap, "key": name}}}


def mutate_pod(pod: Obj, suffix: str, config: GroupingConfig | None = None) -> list[dict[str, Any]]:
    """See the module docstring; ``[]`` for pods that need no change."""
    config = config or GroupingConfig()
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") != config.scheduler_name or not requests_gpu_sharing(pod):
        return []
    container = fraction_container(pod)
    ops: list[dict[str, Any]] = []
    ann = _annotations(pod)
    prefix = ann.get(CONFIGMAP_ANNOTATION)
    if prefix is None:
        prefix = configmap_prefix(pod, container, suffix)
        if (pod.get("metadata") or {}).get("annotations") is None:
            ops.append({"op": "add", "path": "/metadata/annotations",
                        "value": {CONFIGMAP_ANNOTATION: prefix}})
        else:
            key = _escape(CONFIGMAP_ANNOTATION)
            ops.append({"op": "add", "path": f"/metadata/annotations/{key}", "value": prefix})
    configmap = f"{prefix}-{container.configmap_suffix}"
    names = [NVIDIA_VISIBLE_DEVICES, RUNAI_NUM_OF_GPUS, GPU_PORTION]
    if GPU_MEMORY in ann:
        names.append(GPU_MEMORY_LIMIT)
    path = f"/spec/{container.field}/{container.index}/env"
    env = spec[container.field][container.index].get("env")
    if env is None:
        ops.append({"op": "add", "path": path, "value": [_env_ref(n, configmap) for n in names]})
        return ops
    existing = {e.get("name"): i for i, e in enumerate(env)}
    for n in names:
        if n in existing:
            ops.append({"op": "replace", "path": f"{path}/{existing[n]}",
                        "value": _env_ref(n, configmap)})
        else:
            ops.append({"op": "add", "path": f"{path}/-", "value": _env_ref(n, configmap)})
    return ops


def gpu_configmap_data(
    device_ids: Sequence[str], portion: float, memory_mib: int | None = None, cdi: bool = False
) -> dict[str, str]:
    """See the module docstring."""
    if not device_ids:
        raise ValueError("gpu_configmap_data: device_ids is empty")
    if not 0 < portion <= 1:
        raise ValueError(f"gpu_configmap_data: portion {portion} is not in (0, 1]")
    ids = [f"k8s.device-plugin.nvidia.com/gpu={d}" if cdi else d for d in device_ids]
    data = {NVIDIA_VISIBLE_DEVICES: ",".join(ids), GPU_PORTION: f"{portion:.2f}",
            RUNAI_NUM_OF_GPUS: f"{portion:.2f}"}
    if memory_mib is not None:
        if memory_mib <= 0:
            raise ValueError(f"gpu_configmap_data: memory_mib {memory_mib} must be positive")
        data[GPU_MEMORY_LIMIT] = str(memory_mib)
    return data


def gpu_configmap(pod: Obj, data: Mapping[str, str]) -> dict[str, Any]:
    """See the module docstring; the pod must already carry its ConfigMap annotation."""
    m = pod.get("metadata") or {}
    prefix = _annotations(pod).get(CONFIGMAP_ANNOTATION)
    if not prefix:
        raise AdmissionError(f"pod {_pod_name(pod)}: annotation {CONFIGMAP_ANNOTATION} is missing "
                             "(was the pod admitted by the kai-ray webhook?)")
    container = fraction_container(pod)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{prefix}-{container.configmap_suffix}",
            "namespace": m.get("namespace", ""),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": m.get("name", ""),
                                 "uid": m.get("uid", "")}],
        },
        "data": dict(data),
    }
