"""Settings and well-known keys shared by the grouper and the admission rules.

``GroupingConfig`` holds what KAI makes configurable (scheduler name, queue label key, default
queue, node-pool label key, GPU sharing on/off) plus kai-ray's extensions (the legacy
``runai/queue`` key read as well, the namespace's queue label, the admission queue check).
Defaults match KAI's, except where noted on the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kai_ray.api_names import (
    ELASTIC_SUBGROUPS_ANNOTATION,
    LAST_START_ANNOTATION,
    LEGACY_QUEUE_LABEL,
    NODE_POOL_LABEL,
    QUEUE_LABEL,
    REPLICA_HOSTS_ANNOTATION,
    SCHEDULER_NAME,
    SCHEDULER_OWNED_PREFIX,
    STALE_ANNOTATION,
)

# Annotations only the scheduler (and its pod grouper) writes: its own record of decisions, read
# back from the PodGroup. A user who could set them would steer the scheduler (a bind intent binds
# a pod where it says, a future last-start makes a job immune to preemption), so the grouper never
# copies them from an owner or a pod and the webhook refuses them on pods (is_scheduler_owned):
# every kai-ray.io/ key (bind-intent, suspended-demand, replica-hosts, ...) and these of KAI's.
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


@dataclass(frozen=True)
class GroupingConfig:
    scheduler_name: str = SCHEDULER_NAME
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
