"""The PodGroup KAI's podgrouper builds for a pod, per top-owner kind.

``should_group(pod, config) -> bool``: the pod is for our scheduler and not pre-grouped (a pod with
``pod-group-name`` and no owners was grouped by its author).

``group_pod(pod, owners, priority_classes, config=None, namespace_labels=None) -> Grouping``:
``owners`` comes from ``resolve_top_owner``; ``priority_classes`` is the set of PriorityClass
names that exist; ``namespace_labels`` are the labels of the pod's namespace (kai-ray reads a queue
label there). ``Grouping.podgroup`` is the PodGroup manifest to create; ``Grouping.subgroup`` the
value of the pod's ``kai.scheduler/subgroup-name`` label (or None); ``Grouping.pod_patch()`` the
merge patch for the pod (annotation ``pod-group-name`` and that label); ``Grouping.warnings`` the
things a user should hear about (default queue used, invalid preemptibility, Ray pod outside any
subgroup), to be reported as events.

Per top owner (``apiVersion``/``kind``):

| top owner | PodGroup name | owner | minMember | default priority |
|---|---|---|---|---|
| ``ray.io`` RayCluster, RayJob, RayService | ``pg-<top>-<topUID>`` | top | Ray gang | train |
| ``batch/v1`` Job | ``pg-<pod>-<jobUID>`` | Job | 1 | train |
| ``apps/v1`` Deployment | ``pg-<pod>-<podUID>`` | the pod | 1 | inference |
| ``v1`` Pod (no owners) | ``pg-<pod>-<podUID>`` | the pod | 1 | train |
| ``kubeflow.org/v1beta1`` Notebook | ``pg-<top>-<topUID>`` | top | 1 | build |
| anything else (ReplicaSet, StatefulSet, …) | ``pg-<top>-<topUID>`` | top | 1 | train |

Ray kinds match versions ``v1`` and ``v1alpha1``. Only the last row reads priority and
preemptibility from every owner in the chain; the others read the top owner only, as KAI's
specialised plugins do.

Queue: the first non-empty label ``kai.scheduler/queue`` (then the legacy ``runai/queue``) on the
top owner, then the pod, then (kai-ray) the namespace; then label ``project`` on the top owner or
the pod (``<project>-<node-pool>`` when the pod has the node-pool label); else the default queue.

Priority class: for each owner, its label ``priorityClassName``, else the pod's label, else the
pod's ``spec.priorityClassName``; the first naming an existing class wins, else the kind's
default. Ray: the top owner's label ``ray.io/priority-class-name`` overrides, unchecked.
Preemptibility: label ``kai.scheduler/preemptibility`` on an owner, then on the pod.

Annotations: the top owner's (the pod's when it has no owner), as KAI copies them, except the
keys only the scheduler writes (``config.is_scheduler_owned``: ``kai-ray.io/...``, KAI's
last-start and stale-PodGroup timestamps), which are never copied from a user's object; plus
``kai.scheduler/top-owner-metadata``, the pod's ``user`` annotation and, for Ray gangs, the
grouper's own ``kai-ray.io/replica-hosts`` (multi-host groups) and
``kai-ray.io/elastic-subgroups`` (autoscaled groups with minReplicas 0, whose pods are labelled
with their subgroup name though ``spec.subGroups`` has no entry for them: see ``ray``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kai_ray.api_names import (
    POD_GROUP_ANNOTATION,
    PODGROUP,
    PREEMPTIBILITY_LABEL,
    PRIORITY_LABEL,
    PROJECT_LABEL,
    RAY_GROUP_LABEL,
    RAY_PRIORITY_LABEL,
    SUBGROUP_LABEL,
    TOP_OWNER_METADATA_ANNOTATION,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
    USER_KEY,
)
from kai_ray.grouping.config import (
    BUILD,
    INFERENCE,
    PREEMPTIBILITIES,
    TRAIN,
    GroupingConfig,
    without_scheduler_owned,
)
from kai_ray.grouping.objects import (
    GroupingError,
    Obj,
    annotations_of,
    api_group,
    labels_of,
    meta,
    name_uid,
    owner_ref,
    ref,
)
from kai_ray.grouping.owners import Owners, as_pod, is_ray_kind
from kai_ray.grouping.ray import gang_annotations, ray_gang


@dataclass(frozen=True)
class Grouping:
    podgroup: dict[str, Any]
    subgroup: str | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return str(self.podgroup["metadata"]["name"])

    def pod_patch(self) -> dict[str, Any]:
        """Merge patch for the pod: its PodGroup annotation and, if any, its subgroup label."""
        m: dict[str, Any] = {"annotations": {POD_GROUP_ANNOTATION: self.name}}
        if self.subgroup is not None:
            m["labels"] = {SUBGROUP_LABEL: self.subgroup}
        return {"metadata": m}


def should_group(pod: Obj, config: GroupingConfig | None = None) -> bool:
    """True when the grouper must handle ``pod`` (KAI podgrouper step 1)."""
    config = config or GroupingConfig()
    if (pod.get("spec") or {}).get("schedulerName") != config.scheduler_name:
        return False
    m = meta(pod)
    return not (POD_GROUP_ANNOTATION in (m.get("annotations") or {})
                and not m.get("ownerReferences"))


def resolve_queue(
    top: Obj, pod: Obj, config: GroupingConfig, namespace_labels: Mapping[str, str] | None = None
) -> tuple[str, str | None]:
    """``(queue, warning)``; the warning is set when the default queue had to be used."""
    sources: list[Mapping[str, str]] = [labels_of(top), labels_of(pod)]
    if config.namespace_queue and namespace_labels:
        sources.append(namespace_labels)
    for source in sources:
        for key in config.queue_keys():
            if source.get(key):
                return source[key], None
    project = labels_of(top).get(PROJECT_LABEL) or labels_of(pod).get(PROJECT_LABEL)
    if project:
        pool = labels_of(pod).get(config.node_pool_label_key)
        return (f"{project}-{pool}" if pool else project), None
    keys = " or ".join(config.queue_keys())
    where = "the pod" if top is pod else f"{ref(top)}, the pod"
    ns = ", its namespace" if config.namespace_queue else ""
    return config.default_queue, (
        f"{ref(pod)}: no {keys} label on {where}{ns}: using the default queue "
        f"'{config.default_queue}'"
    )


def resolve_priority_class(
    owners: Sequence[Obj], pod: Obj, priority_classes: Collection[str], default: str
) -> str:
    """First existing class among the per-owner candidates (see module docstring), else default."""
    pod_label = labels_of(pod).get(PRIORITY_LABEL)
    pod_spec = (pod.get("spec") or {}).get("priorityClassName") or ""
    for owner in owners:
        owner_labels = labels_of(owner)
        if PRIORITY_LABEL in owner_labels:  # present but unknown hides the pod's (as KAI)
            candidate = owner_labels[PRIORITY_LABEL]
        elif pod_label is not None:
            candidate = pod_label
        else:
            candidate = pod_spec
        if candidate and candidate in priority_classes:
            return candidate
    return default


def resolve_preemptibility(owners: Sequence[Obj], pod: Obj) -> tuple[str, list[str]]:
    """``(preemptibility or "", warnings about invalid label values)``."""
    warnings: list[str] = []
    for obj in [*owners, pod]:
        value = labels_of(obj).get(PREEMPTIBILITY_LABEL)
        if value is None:
            continue
        if value in PREEMPTIBILITIES:
            return value, warnings
        warnings.append(
            f"{ref(obj)}: label {PREEMPTIBILITY_LABEL}={value!r} is not one of "
            f"{', '.join(PREEMPTIBILITIES)}; ignored"
        )
    return "", warnings


def _top_owner_metadata(top: Obj) -> str:
    group, version = api_group(str(top.get("apiVersion", "")))
    name, uid = name_uid(top)
    fields = {"name": name, "uid": uid, "group": group, "version": version,
              "kind": str(top.get("kind", ""))}
    return "".join(f"{k}: {v if v else chr(34) * 2}\n" for k, v in fields.items())


def _kind(top: Obj) -> str:
    if is_ray_kind(top, "RayCluster", "RayJob", "RayService"):
        return "ray"
    group, version = api_group(str(top.get("apiVersion", "")))
    return {
        ("batch", "v1", "Job"): "job",
        ("apps", "v1", "Deployment"): "deployment",
        ("", "v1", "Pod"): "pod",
        ("kubeflow.org", "v1beta1", "Notebook"): "notebook",
    }.get((group, version, str(top.get("kind", ""))), "default")


def group_pod(
    pod: Obj,
    owners: Owners,
    priority_classes: Collection[str],
    config: GroupingConfig | None = None,
    namespace_labels: Mapping[str, str] | None = None,
) -> Grouping:
    """The PodGroup for ``pod`` (see the module docstring)."""
    config = config or GroupingConfig()
    pod = as_pod(pod)
    top = pod if owners.top.get("kind") == "Pod" and not owners.chain else owners.top
    kind = _kind(top)
    pod_name, pod_uid = name_uid(pod)
    top_name, top_uid = name_uid(top)
    namespace = meta(pod).get("namespace") or ""

    # Only the default grouper sees the whole chain; specialised plugins pass the top owner.
    prio_owners: list[Obj] = list(owners.chain) if kind == "default" and owners.chain else [top]
    default_prio = {"deployment": INFERENCE, "notebook": BUILD}.get(kind, TRAIN)
    priority = resolve_priority_class(prio_owners, pod, priority_classes, default_prio)
    preemptibility, warnings = resolve_preemptibility(prio_owners, pod)
    queue, queue_warning = resolve_queue(top, pod, config, namespace_labels)
    if queue_warning:
        warnings.append(queue_warning)

    pg_labels = labels_of(top)
    for key, source in ((USER_KEY, labels_of(pod)), (config.node_pool_label_key, labels_of(pod))):
        if key not in pg_labels and key in source:
            pg_labels[key] = source[key]
    pg_annotations: dict[str, str] = {}
    if USER_KEY in annotations_of(pod):
        pg_annotations[USER_KEY] = annotations_of(pod)[USER_KEY]
    pg_annotations[TOP_OWNER_METADATA_ANNOTATION] = _top_owner_metadata(top)
    # the owner's (or bare pod's) annotations, less those only the scheduler writes: a forged
    # bind intent or last-start must never reach the PodGroup the scheduler reads them from
    pg_annotations.update(without_scheduler_owned(annotations_of(top)))

    name, owner, min_member = f"pg-{top_name}-{top_uid}", owner_ref(top), 1
    if kind == "job":
        name = f"pg-{pod_name}-{top_uid}"
    elif kind == "deployment":
        name, owner = f"pg-{pod_name}-{pod_uid}", owner_ref(pod)

    spec: dict[str, Any] = {"minMember": min_member, "queue": queue, "priorityClassName": priority}
    if preemptibility:
        spec["preemptibility"] = preemptibility
    top_ann = annotations_of(top)
    topology = {
        "topology": top_ann.get(TOPOLOGY_ANNOTATION, ""),
        "requiredTopologyLevel": top_ann.get(TOPOLOGY_REQUIRED_ANNOTATION, ""),
        "preferredTopologyLevel": top_ann.get(TOPOLOGY_PREFERRED_ANNOTATION, ""),
    }
    if any(topology.values()):
        spec["topologyConstraint"] = {k: v for k, v in topology.items() if v}

    subgroup = None
    if kind == "ray":
        if owners.ray_cluster is None:
            raise GroupingError(f"{ref(top)}: the RayCluster was not looked up (use "
                                "resolve_top_owner)")
        gang = ray_gang(owners.ray_cluster)
        spec["minMember"], spec["subGroups"] = gang.min_member, [dict(s) for s in gang.subgroups]
        pg_annotations.update(gang_annotations(gang))
        if labels_of(top).get(RAY_PRIORITY_LABEL):
            spec["priorityClassName"] = labels_of(top)[RAY_PRIORITY_LABEL]
        group = labels_of(pod).get(RAY_GROUP_LABEL)
        if group in {s["name"] for s in gang.subgroups} or group in gang.elastic:
            subgroup = group
        else:
            why = (f"has no label {RAY_GROUP_LABEL}" if group is None
                   else f"has {RAY_GROUP_LABEL}={group!r}, which is not a subgroup (suspended?)")
            warnings.append(f"{ref(pod)}: {why}; it is in no subgroup of PodGroup "
                            f"{namespace}/{name} and will not be scheduled")

    podgroup = {
        "apiVersion": PODGROUP.api_version,
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": pg_labels,
            "annotations": pg_annotations,
            "ownerReferences": [owner],
        },
        "spec": spec,
    }
    return Grouping(podgroup=podgroup, subgroup=subgroup, warnings=tuple(warnings))

