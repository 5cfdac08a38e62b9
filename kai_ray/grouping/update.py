"""Updating an existing PodGroup as KAI's podgrouper does, and resizing a
Ray gang when its RayCluster changes.

``podgroup_update(existing, desired, config=None) -> dict | None``: the object to write back
(``existing`` with ``desired``'s spec and ownerReferences, labels and annotations merged in), or
None when nothing changed. Kept from ``existing``: ``spec.queue``, ``spec.markUnschedulable``,
``spec.schedulingBackoff``, and its queue and node-pool labels (the node-pool label is never
added by an update). Other labels and annotations are merged, never removed. Annotations only the
scheduler writes (``config.is_scheduler_owned``: bind intent, last start, stale since, suspended
demand) are never taken from ``desired``, so a resync keeps the scheduler's values as they are;
of those, only the grouper's own (``kai-ray.io/replica-hosts``, ``kai-ray.io/elastic-subgroups``)
are updated, and removed when ``desired`` has none. ``metadata`` fields such as
``resourceVersion`` and the ``status`` stay as they were, so the result can be PUT as is.

kai-ray: when the new spec raises a minimum (``spec.minMember`` or a subgroup's) of a gang that
has started (annotation ``kai.scheduler/last-start-timestamp``), the update records the lowest
minimums of that run before the raise in ``kai-ray.io/raised-minimum`` (``raised_minimum``):
stale-gang eviction holds the running gang to them, since a raised minimum is not a member lost.
The record is dropped once nothing is raised above it, and ignored by the scheduler once the gang
starts again (its start no longer matches the last-start timestamp).

``ray_gang_update(existing, cluster) -> dict | None``: the PodGroup of a RayCluster (or of its
RayJob/RayService) with ``spec.minMember``, ``spec.subGroups`` and the grouper's own annotations
recomputed from ``cluster`` (e.g. after ``minReplicas`` changed or a worker group was
suspended), or None when they are unchanged. Pods a group has above its minimum are elastic and
need no PodGroup change; a changed minimum does, and KAI only notices it on the next pod event,
so the controller calls this on RayCluster events.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from kai_ray.api_names import LAST_START_ANNOTATION, RAISED_MINIMUM_ANNOTATION
from kai_ray.grouping.config import GROUPER_OWNED_ANNOTATIONS, GroupingConfig, is_scheduler_owned
from kai_ray.grouping.objects import Obj
from kai_ray.grouping.ray import gang_annotations, ray_gang

_KEPT_SPEC_FIELDS = ("queue", "markUnschedulable", "schedulingBackoff")


def _pruned(value: Any) -> Any:
    """Drop empty values so defaults filled in by the API server do not count as changes."""
    if isinstance(value, Mapping):
        pruned = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in (None, "", [], {})}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _covers(target: Mapping[str, str] | None, source: Mapping[str, str]) -> bool:
    target = target or {}
    return all(k in target and target[k] == v for k, v in source.items())


def _minimums(spec: Mapping[str, Any]) -> tuple[int, dict[str, int]]:
    """(spec.minMember, {subgroup: minMember}): unset or unreadable minMember is 1, as the
    scheduler reads it; an unreadable subgroup minimum is left out (the scheduler refuses such a
    PodGroup, so nothing of it runs)."""
    total = spec.get("minMember", 1)
    if isinstance(total, bool) or not isinstance(total, int):
        total = 1
    subs: dict[str, int] = {}
    for sg in spec.get("subGroups") or []:
        if isinstance(sg, Mapping) and isinstance(sg.get("name"), str):
            value = sg.get("minMember")
            if isinstance(value, int) and not isinstance(value, bool):
                subs[sg["name"]] = value
    return total, subs


def parse_raised_minimum(raw: object) -> tuple[str, int, dict[str, int]] | None:
    """(start, minMember, {subgroup: minMember}) from the annotation; None when it is missing or
    out of shape (then no record holds: the gang counts against its spec, as in KAI)."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    start, total, subs = value.get("start"), value.get("minMember"), value.get("subGroups", {})
    if not isinstance(start, str) or not start or isinstance(total, bool) \
            or not isinstance(total, int) or total < 0 or not isinstance(subs, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
               for k, v in subs.items()):
        return None
    return start, total, subs


def raised_minimum(existing: Obj, spec: Mapping[str, Any]) -> str | None:
    """The ``kai-ray.io/raised-minimum`` value to keep when ``existing``'s spec becomes ``spec``,
    or None when no record is needed (the gang never started, or nothing is above the lowest
    minimums of its current run)."""
    annotations = (existing.get("metadata") or {}).get("annotations") or {}
    start = annotations.get(LAST_START_ANNOTATION)
    if not isinstance(start, str) or not start:
        return None  # never started: nothing runs that a raise could leave short
    total, subs = _minimums(existing.get("spec") or {})
    prior = parse_raised_minimum(annotations.get(RAISED_MINIMUM_ANNOTATION))
    if prior is not None and prior[0] == start:  # raised before in this run: the lowest counts
        total = min(total, prior[1])
        subs = {n: min(subs.get(n, 0), prior[2].get(n, 0)) for n in {*subs, *prior[2]}}
    new_total, new_subs = _minimums(spec)
    if new_total <= total and all(v <= subs.get(n, 0) for n, v in new_subs.items()):
        return None
    kept = {n: v for n, v in sorted(subs.items()) if v > 0}  # a subgroup not named: 0
    return json.dumps({"start": start, "minMember": total, "subGroups": kept})


def podgroup_update(
    existing: Obj, desired: Obj, config: GroupingConfig | None = None
) -> dict[str, Any] | None:
    """See the module docstring."""
    config = config or GroupingConfig()
    old_meta, new_meta = existing.get("metadata") or {}, desired.get("metadata") or {}
    old_spec = existing.get("spec") or {}
    spec = {k: v for k, v in (desired.get("spec") or {}).items() if k not in _KEPT_SPEC_FIELDS}
    spec.update({k: old_spec[k] for k in _KEPT_SPEC_FIELDS if k in old_spec})

    old_labels = old_meta.get("labels") or {}
    new_labels = dict(new_meta.get("labels") or {})
    new_labels.pop(config.node_pool_label_key, None)
    for key in (config.node_pool_label_key, *config.queue_keys()):
        if key in old_labels:
            new_labels[key] = old_labels[key]
    # the scheduler's own annotations on the PodGroup (bind intent, last start, ...) are its
    # alone: the merge below keeps them, and nothing from ``desired`` may overwrite them
    new_annotations = {k: v for k, v in (new_meta.get("annotations") or {}).items()
                       if not is_scheduler_owned(k) or k in GROUPER_OWNED_ANNOTATIONS}
    old_annotations = old_meta.get("annotations") or {}
    # the grouper's own are computed from the owner each time: one it no longer calls for goes
    dropped = {k for k in GROUPER_OWNED_ANNOTATIONS
               if k in old_annotations and k not in new_annotations}
    record = raised_minimum(existing, spec)
    if record is not None:
        new_annotations[RAISED_MINIMUM_ANNOTATION] = record
    elif RAISED_MINIMUM_ANNOTATION in old_annotations:
        dropped.add(RAISED_MINIMUM_ANNOTATION)
    owners = new_meta.get("ownerReferences") or []

    if (
        not dropped
        and _pruned(spec) == _pruned(old_spec)
        and _pruned(owners) == _pruned(old_meta.get("ownerReferences") or [])
        and _covers(old_labels, new_labels)
        and _covers(old_annotations, new_annotations)
    ):
        return None
    updated = copy.deepcopy(dict(existing))
    m = updated.setdefault("metadata", {})
    m["labels"] = {**old_labels, **new_labels}
    m["annotations"] = {k: v for k, v in {**old_annotations, **new_annotations}.items()
                        if k not in dropped}
    m["ownerReferences"] = copy.deepcopy(list(owners))
    updated["spec"] = copy.deepcopy(spec)
    return updated


def ray_gang_update(existing: Obj, cluster: Obj) -> dict[str, Any] | None:
    """See the module docstring."""
    gang = ray_gang(cluster)
    old_meta = existing.get("metadata") or {}
    desired = {
        "metadata": {"annotations": gang_annotations(gang),
                     "ownerReferences": old_meta.get("ownerReferences") or []},
        "spec": {**(existing.get("spec") or {}), "minMember": gang.min_member,
                 "subGroups": [dict(s) for s in gang.subgroups]},
    }
    return podgroup_update(existing, desired)
