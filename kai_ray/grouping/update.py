"""Updating an existing PodGroup as KAI's podgrouper does, and resizing a
Ray gang when its RayCluster changes.

``podgroup_update(existing, desired, config=None) -> dict | None``: the object to write back
(``existing`` with ``desired``'s spec and ownerReferences, labels and annotations merged in), or
None when nothing changed. Kept from ``existing``: ``spec.queue``, ``spec.markUnschedulable``,
``spec.schedulingBackoff``, and its queue and node-pool labels (the node-pool label is never
added by an update). Labels and annotations are merged, never removed. Annotations only the
scheduler writes (``config.is_scheduler_owned``: bind intent, last start, stale since, suspended
demand) are never taken from ``desired``, so a resync keeps the scheduler's values as they are;
of those, only the grouper's own (``kai-ray.io/replica-hosts``) is updated. ``metadata`` fields
such as ``resourceVersion`` and the ``status`` stay as they were, so the result can be PUT as is.

``ray_gang_update(existing, cluster) -> dict | None``: the PodGroup of a RayCluster (or of its
RayJob/RayService) with ``spec.minMember`` and ``spec.subGroups`` recomputed from ``cluster``
(e.g. after ``minReplicas`` changed or a worker group was suspended), or None when they are
unchanged. Pods a group has above its minimum are elastic and need no PodGroup change; a changed
minimum does, and KAI only notices it on the next pod event, so the controller calls this on
RayCluster events.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kai_ray.grouping.config import (
    GROUPER_OWNED_ANNOTATIONS,
    GroupingConfig,
    is_scheduler_owned,
)
from kai_ray.grouping.objects import Obj
from kai_ray.grouping.ray import ray_gang

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
    owners = new_meta.get("ownerReferences") or []

    if (
        _pruned(spec) == _pruned(old_spec)
        and _pruned(owners) == _pruned(old_meta.get("ownerReferences") or [])
        and _covers(old_labels, new_labels)
        and _covers(old_meta.get("annotations"), new_annotations)
    ):
        return None
    updated = copy.deepcopy(dict(existing))
    m = updated.setdefault("metadata", {})
    m["labels"] = {**old_labels, **new_labels}
    m["annotations"] = {**(old_meta.get("annotations") or {}), **new_annotations}
    m["ownerReferences"] = copy.deepcopy(list(owners))
    updated["spec"] = copy.deepcopy(spec)
    return updated


def ray_gang_update(existing: Obj, cluster: Obj) -> dict[str, Any] | None:
    """See the module docstring."""
    gang = ray_gang(cluster)
    old_spec = existing.get("spec") or {}
    subgroups = [dict(s) for s in gang.subgroups]
    if old_spec.get("minMember") == gang.min_member and _pruned(
        old_spec.get("subGroups") or []
    ) == _pruned(subgroups):
        return None
    updated = copy.deepcopy(dict(existing))
    updated.setdefault("spec", {}).update(minMember=gang.min_member, subGroups=subgroups)
    return updated
