"""What the watch cache keeps of each object: only what the scheduler reads.

The API server's objects carry much the scheduler never looks at: `metadata.managedFields`
(often a third of a pod), and on pods the containers' env, command, probes and mounts, the
volumes, most of the status. Kept whole, 50,000 pods fill a 2 GiB container. Each function
returns a copy without those parts; what it keeps is shared with its argument, which it never
changes (the informer throws its input away).

What is kept, by reader:

- pods: metadata but managedFields (the pod grouper reads owners, labels and annotations, and
  copies a bare pod's annotations to its PodGroup; events name uid and resourceVersion);
  spec fields convert.pod_from and the grouper read (schedulerName, nodeName,
  priorityClassName, nodeSelector, tolerations, affinity, schedulingGates), and of each
  container and init container its name (GPU-sharing env goes to a named container) and
  resources; status phase, conditions (status.py and `kai-ray explain` read PodScheduled) and
  each container status' name and state (the binder reports why a GPU reservation pod waits).
- nodes: name, labels and identity; spec unschedulable and taints; status allocatable and the
  conditions' type and status (Ready). Not the images list, the one big part of a node.
- PodGroups: all but managedFields: the pod grouper PUTs an update built from the cached one,
  so any other part left out would be erased (an update without managedFields keeps them).
- Queues, PriorityClasses: all but managedFields (few, small, Queues are written back too).

A value of an unexpected shape is kept as it is: a trim must never fail, or the informer would
re-list forever; convert.py reports the bad value as a Problem, as it would untrimmed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Obj = Mapping[str, Any]

POD_SPEC = ("schedulerName", "nodeName", "priorityClassName", "nodeSelector", "tolerations",
            "affinity", "schedulingGates")
CONTAINER = ("name", "resources")
POD_STATUS = ("phase", "conditions")
CONTAINER_STATUS = ("name", "state")
NODE_META = ("name", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
             "labels")
NODE_SPEC = ("unschedulable", "taints")
NODE_CONDITION = ("type", "status")


def _pick(obj: Any, keys: Iterable[str]) -> Any:
    """`obj` with only `keys` (an object that is not a mapping: as it is)."""
    if not isinstance(obj, Mapping):
        return obj
    return {k: obj[k] for k in keys if k in obj}


def _each(items: Any, keys: Iterable[str]) -> Any:
    """Each mapping of the list `items` with only `keys` (anything else: as it is)."""
    if not isinstance(items, list):
        return items
    keys = tuple(keys)
    return [_pick(i, keys) for i in items]


def _metadata(obj: Obj) -> Any:
    m = obj.get("metadata")
    if not isinstance(m, Mapping) or "managedFields" not in m:
        return m
    return {k: v for k, v in m.items() if k != "managedFields"}


def _with(obj: Obj, **parts: Any) -> dict[str, Any]:
    """A copy of `obj` with `parts` replaced; parts `obj` does not have stay absent."""
    return {k: parts.get(k, v) for k, v in obj.items()}


def trim_meta(obj: Obj) -> dict[str, Any]:
    """`obj` without metadata.managedFields (for kinds whose every other field is read or
    written back)."""
    return _with(obj, metadata=_metadata(obj))


def trim_pod(obj: Obj) -> dict[str, Any]:
    spec = obj.get("spec")
    if isinstance(spec, Mapping):
        kept = _pick(spec, POD_SPEC)
        for field in ("containers", "initContainers"):
            if field in spec:
                kept[field] = _each(spec[field], CONTAINER)
        spec = kept
    status = obj.get("status")
    if isinstance(status, Mapping):
        kept = _pick(status, POD_STATUS)
        if "containerStatuses" in status:
            kept["containerStatuses"] = _each(status["containerStatuses"], CONTAINER_STATUS)
        status = kept
    return _with(obj, metadata=_metadata(obj), spec=spec, status=status)


def trim_node(obj: Obj) -> dict[str, Any]:
    status = obj.get("status")
    if isinstance(status, Mapping):
        kept = _pick(status, ("allocatable",))
        if "conditions" in status:
            kept["conditions"] = _each(status["conditions"], NODE_CONDITION)
        status = kept
    return _with(obj, metadata=_pick(obj.get("metadata"), NODE_META),
                 spec=_pick(obj.get("spec"), NODE_SPEC), status=status)


trim_podgroup = trim_meta
trim_queue = trim_meta
trim_priority_class = trim_meta
