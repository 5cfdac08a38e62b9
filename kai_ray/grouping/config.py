"""Settings and well-known keys shared by the grouper and the admission rules.

``GroupingConfig`` holds what KAI makes configurable (scheduler name, queue label key, default
queue, node-pool label key, GPU sharing on/off) plus kai-ray's extensions (the legacy
``runai/queue`` key read as well, the namespace's queue label, the admission queue check).
Defaults match KAI's, except where noted on the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Labels and annotations (KAI's names).
QUEUE_LABEL = "kai.scheduler/queue"
LEGACY_QUEUE_LABEL = "runai/queue"
PROJECT_LABEL = "project"
NODE_POOL_LABEL = "kai.scheduler/node-pool"
USER_KEY = "user"
PRIORITY_LABEL = "priorityClassName"
RAY_PRIORITY_LABEL = "ray.io/priority-class-name"
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
POD_GROUP_ANNOTATION = "pod-group-name"
TOP_OWNER_METADATA_ANNOTATION = "kai.scheduler/top-owner-metadata"
TOPOLOGY_ANNOTATION = "kai.scheduler/topology"
TOPOLOGY_REQUIRED_ANNOTATION = "kai.scheduler/topology-required-placement"
TOPOLOGY_PREFERRED_ANNOTATION = "kai.scheduler/topology-preferred-placement"
RAY_GROUP_LABEL = "ray.io/group"
RAY_HEAD_GROUP = "headgroup"
# kai-ray: PodGroup annotation {subgroup: pods per replica} for multi-host Ray worker groups
REPLICA_HOSTS_ANNOTATION = "kai-ray.io/replica-hosts"
# kai-ray: PodGroup annotation, a JSON list of the subgroups whose minimum is 0 (autoscaled Ray
# groups with minReplicas 0): the CRD refuses such a subgroup in spec.subGroups
ELASTIC_SUBGROUPS_ANNOTATION = "kai-ray.io/elastic-subgroups"
# kai-ray: PodGroup annotation written when a spec change raises the minimum of a gang that has
# started: {"start": <its last-start timestamp>, "minMember": n, "subGroups": {name: n}}, the
# lowest minimums of that run before the raise (a subgroup not named: 0). Stale-gang eviction
# counts a running gang's members against them, not against a minimum it was never admitted at.
RAISED_MINIMUM_ANNOTATION = "kai-ray.io/raised-minimum"

# Annotations only the scheduler (and its pod grouper) writes: its own record of decisions, read
# back from the PodGroup. A user who could set them would steer the scheduler (a bind intent binds
# a pod where it says, a future last-start makes a job immune to preemption), so the grouper never
# copies them from an owner or a pod and the webhook refuses them on pods (is_scheduler_owned).
SCHEDULER_OWNED_PREFIX = "kai-ray.io/"  # bind-intent, suspended-demand, replica-hosts, ...
LAST_START_ANNOTATION = "kai.scheduler/last-start-timestamp"  # min-runtime protection
STALE_ANNOTATION = "kai.scheduler/stale-podgroup-timestamp"  # stale-gang eviction
SCHEDULER_OWNED_ANNOTATIONS = frozenset({LAST_START_ANNOTATION, STALE_ANNOTATION})
# of those, the ones the grouper computes from the owner and (re)writes on the PodGroup it builds
# (and removes when the owner no longer calls for them); it also keeps RAISED_MINIMUM_ANNOTATION,
# computed from the PodGroup itself on each update
GROUPER_OWNED_ANNOTATIONS = frozenset({REPLICA_HOSTS_ANNOTATION, ELASTIC_SUBGROUPS_ANNOTATION})


def is_scheduler_owned(key: str) -> bool:
    """True for an annotation key only kai-ray writes (``kai-ray.io/...``, KAI's last-start and
    stale-PodGroup timestamps). User settings (``kai.scheduler/eviction-strategy``, topology,
    ``pod-group-name``, the GPU-sharing annotations, ``runai/shared-gpu-configmap``) are not."""
    return key.startswith(SCHEDULER_OWNED_PREFIX) or key in SCHEDULER_OWNED_ANNOTATIONS


def without_scheduler_owned(annotations: Mapping[str, str]) -> dict[str, str]:
    """``annotations`` less the scheduler-owned keys (what may be copied from user objects)."""
    return {k: v for k, v in annotations.items() if not is_scheduler_owned(k)}

# Shipped PriorityClasses that serve as per-kind defaults.
TRAIN, BUILD, INFERENCE = "train", "build", "inference"
PREEMPTIBILITIES = ("preemptible", "non-preemptible")

PODGROUP_API_VERSION = "scheduling.run.ai/v2alpha2"


@dataclass(frozen=True)
class GroupingConfig:
    scheduler_name: str = "kai-scheduler"
    queue_label_key: str = QUEUE_LABEL
    # Read after queue_label_key on each object; None turns it off (KAI reads only one key).
    legacy_queue_label_key: str | None = LEGACY_QUEUE_LABEL
    default_queue: str = "default-queue"
    node_pool_label_key: str = NODE_POOL_LABEL
    # kai-ray extension: the namespace's queue label comes after the pod's.
    namespace_queue: bool = True
    # KAI's helm default is false; kai-ray ships GPU sharing on.
    gpu_sharing_enabled: bool = True
    # Admission: reject pods whose queue is missing or not a leaf (needs the queue set).
    validate_queue: bool = False

    def queue_keys(self) -> tuple[str, ...]:
        """Label keys naming a queue, in the order they are read on one object."""
        if self.legacy_queue_label_key and self.legacy_queue_label_key != self.queue_label_key:
            return (self.queue_label_key, self.legacy_queue_label_key)
        return (self.queue_label_key,)
