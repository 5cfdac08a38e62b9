"""Pure pod-grouper and admission rules (KAI-compatible); no Kubernetes client, no I/O.

Objects are plain camelCase dicts as the API returns them. The controllers call, per pod:

1. ``should_group(pod, config)``: is it ours and not pre-grouped;
2. ``resolve_top_owner(pod, get_owner)``: the owner chain (the caller does the GETs);
3. ``group_pod(pod, owners, priority_classes, config, namespace_labels)``: the PodGroup to create,
   the pod's subgroup and the pod patch (``Grouping``);
4. ``podgroup_update(existing, desired, config)``: what to write when the PodGroup exists;
5. on RayCluster changes, ``ray_gang_update(existing, cluster)``.

Admission (``kai_ray.grouping.admission``): ``validate_pod``, ``validate_pod_update``,
``mutate_pod``, ``gpu_configmap_data`` and ``gpu_configmap``. Each module's docstring states its
rules. ``is_scheduler_owned(key)``: the annotations only the scheduler writes, which the grouper
never copies from a user's object and the webhook refuses on pods.
"""

from kai_ray.grouping.config import GroupingConfig, is_scheduler_owned
from kai_ray.grouping.objects import GroupingError, OwnerExpired, RayClusterPending
from kai_ray.grouping.owners import GetOwner, Owners, ray_cluster_name, resolve_top_owner
from kai_ray.grouping.podgroup import (
    Grouping,
    group_pod,
    resolve_preemptibility,
    resolve_priority_class,
    resolve_queue,
    should_group,
)
from kai_ray.grouping.ray import RayGang, ray_gang
from kai_ray.grouping.update import podgroup_update, ray_gang_update

__all__ = [
    "GetOwner",
    "Grouping",
    "GroupingConfig",
    "GroupingError",
    "OwnerExpired",
    "Owners",
    "RayClusterPending",
    "RayGang",
    "group_pod",
    "is_scheduler_owned",
    "podgroup_update",
    "ray_cluster_name",
    "ray_gang",
    "ray_gang_update",
    "resolve_preemptibility",
    "resolve_priority_class",
    "resolve_queue",
    "resolve_top_owner",
    "should_group",
]
