"""The names kai-ray shares with KAI-Scheduler on the wire: its custom resources, and the labels
and annotations on pods, PodGroups and nodes that it reads or writes.

One place for each name, so that a new API version or a renamed key is one edit. Tests keep the
literal names on purpose: they check the product against KAI's API, not against this module.
This module imports nothing (an import contract keeps it so): every layer may use it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CustomResource:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def crd_name(self) -> str:
        """The CustomResourceDefinition's metadata.name."""
        return f"{self.plural}.{self.group}"

    @property
    def gvp(self) -> tuple[str, str, str]:
        """(group, version, plural): the leading arguments of kubernetes' CustomObjectsApi."""
        return (self.group, self.version, self.plural)

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path of the collection (all namespaces, or one) or of one object."""
        ns = f"/namespaces/{namespace}" if namespace is not None else ""
        tail = f"/{name}" if name is not None else ""
        return f"/apis/{self.group}/{self.version}{ns}/{self.plural}{tail}"


KAI_GROUP = "scheduling.run.ai"
PODGROUP = CustomResource(KAI_GROUP, "v2alpha2", "podgroups", "PodGroup")
QUEUE = CustomResource(KAI_GROUP, "v2", "queues", "Queue")

SCHEDULER_NAME = "kai-scheduler"

# --- on the objects the pod grouper reads (owners and pods) ------------------------------------
QUEUE_LABEL = "kai.scheduler/queue"
LEGACY_QUEUE_LABEL = "runai/queue"
PROJECT_LABEL = "project"
NODE_POOL_LABEL = "kai.scheduler/node-pool"
USER_KEY = "user"
PRIORITY_LABEL = "priorityClassName"
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
TOP_OWNER_METADATA_ANNOTATION = "kai.scheduler/top-owner-metadata"
TOPOLOGY_ANNOTATION = "kai.scheduler/topology"
TOPOLOGY_REQUIRED_ANNOTATION = "kai.scheduler/topology-required-placement"
TOPOLOGY_PREFERRED_ANNOTATION = "kai.scheduler/topology-preferred-placement"
# KubeRay's
RAY_PRIORITY_LABEL = "ray.io/priority-class-name"
RAY_GROUP_LABEL = "ray.io/group"
RAY_HEAD_GROUP = "headgroup"
# KubeRay (RayMultiHostIndexing, on by default since v1.6) names each multi-host replica here
RAY_REPLICA_LABEL = "ray.io/worker-group-replica-name"

# --- pods --------------------------------------------------------------------------------------
POD_GROUP_ANNOTATION = "pod-group-name"  # the PodGroup a pod belongs to
SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
TASK_PRIORITY_LABEL = "kai.scheduler/task-priority"
# the shared-device group of a placed fractional pod (one label per device: runai-gpu-group/<i>)
GPU_GROUP_LABEL = "runai-gpu-group"
GPU_FRACTION_ANNOTATION = "gpu-fraction"
GPU_MEMORY_ANNOTATION = "gpu-memory"
SHARED_GPU_CONFIGMAP_ANNOTATION = "runai/shared-gpu-configmap"
# where GPU reservation pods live unless the scheduler's config (reservation.namespace) says else
RESERVATION_NAMESPACE = "kai-resource-reservation"

# --- PodGroups: KAI's annotations --------------------------------------------------------------
LAST_START_ANNOTATION = "kai.scheduler/last-start-timestamp"  # min-runtime protection
STALE_ANNOTATION = "kai.scheduler/stale-podgroup-timestamp"  # stale-gang eviction

# --- PodGroups: kai-ray's own annotations (only the scheduler and its grouper write kai-ray.io/)
SCHEDULER_OWNED_PREFIX = "kai-ray.io/"
# {subgroup: pods per replica} for multi-host Ray worker groups, written by the pod grouper
REPLICA_HOSTS_ANNOTATION = "kai-ray.io/replica-hosts"
# a JSON list of the subgroups whose minimum is 0 (autoscaled Ray groups with minReplicas 0): the
# CRD refuses such a subgroup in spec.subGroups
ELASTIC_SUBGROUPS_ANNOTATION = "kai-ray.io/elastic-subgroups"
# written when a spec change raises the minimum of a gang that has started: {"start": <its
# last-start timestamp>, "minMember": n, "subGroups": {name: n}}, the lowest minimums of that run
# before the raise (a subgroup not named: 0). Stale-gang eviction counts a running gang's members
# against them, not against a minimum it was never admitted at.
RAISED_MINIMUM_ANNOTATION = "kai-ray.io/raised-minimum"
# the durable bind intent, one atomic write per gang (see k8s.binder)
BIND_INTENT_ANNOTATION = "kai-ray.io/bind-intent"
