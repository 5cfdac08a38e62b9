"""The snapshot the core schedules: plain, immutable input types in integer units.

Units: CPU in millicores, memory in bytes, whole GPUs as device counts, GPU fractions in
thousandths of a device (milli), GPU memory in MiB. Times are seconds on the caller's clock
(`now` is passed to `schedule`, never read here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from kai_ray.core.constraints import Taint, Term, Toleration

UNLIMITED = -1.0
# a shared GPU device's usage is counted in milli of the device
MILLI = 1000
# per-resource amounts: (cpu milli, memory bytes, GPUs)
Amounts = tuple[float, float, float]
# KAI's minNodeGpuMemory is effectively always 100 MiB; pending gpu-memory requests
# are converted to GPUs with it for fair share, queue order and reclaim.
MIN_NODE_GPU_MEMORY_MIB = 100
DEFAULT_GPU_MEMORY_MIB = 100


class PodStatus(StrEnum):
    PENDING = "Pending"
    GATED = "Gated"
    ALLOCATED = "Allocated"
    PIPELINED = "Pipelined"
    BINDING = "Binding"
    BOUND = "Bound"
    RUNNING = "Running"
    RELEASING = "Releasing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


ACTIVE_ALLOCATED = frozenset(
    {PodStatus.ALLOCATED, PodStatus.PIPELINED, PodStatus.BINDING, PodStatus.BOUND,
     PodStatus.RUNNING}
)
ACTIVE_USED = ACTIVE_ALLOCATED | {PodStatus.RELEASING}
# counted in queue "allocated" at snapshot time
QUEUE_ALLOCATED = frozenset(
    {PodStatus.ALLOCATED, PodStatus.BINDING, PodStatus.BOUND, PodStatus.RUNNING}
)
# KAI's aliveStatuses: a releasing pod is not alive
ALIVE = ACTIVE_ALLOCATED | {PodStatus.PENDING, PodStatus.GATED}


@dataclass(frozen=True, slots=True)
class Request:
    """What one pod asks for. At most one of gpus / gpu_fraction_milli / gpu_memory_mib is set."""

    cpu_m: int = 0
    memory: int = 0
    gpus: int = 0
    gpu_fraction_milli: int = 0
    gpu_memory_mib: int = 0
    fraction_devices: int = 1

    @property
    def is_shared(self) -> bool:
        return self.gpu_fraction_milli > 0 or self.gpu_memory_mib > 0

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.is_shared


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_m: int
    memory: int
    gpus: int = 0
    gpu_memory_mib: int = DEFAULT_GPU_MEMORY_MIB
    gpu_memory_synced: bool = True
    max_pods: int = 110
    labels: tuple[tuple[str, str], ...] = ()
    ready: bool = True
    unschedulable: bool = False
    # requests of active pods on this node that another scheduler placed (not ours to manage)
    foreign_cpu_m: int = 0
    foreign_memory: int = 0
    foreign_gpus: int = 0
    foreign_pods: int = 0
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    """One resource of a queue, in queue units (GPUs, millicores, bytes). -1 = unlimited."""

    quota: float = 0.0
    limit: float = 0.0
    weight: float = 0.0


@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    parent: str | None = None
    priority: int = 100
    gpu: ResourceQuota = ResourceQuota()
    cpu: ResourceQuota = ResourceQuota()
    memory: ResourceQuota = ResourceQuota()
    created: float = 0.0
    display_name: str | None = None
    preempt_min_runtime_s: float | None = None
    reclaim_min_runtime_s: float | None = None


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    request: Request
    status: PodStatus = PodStatus.PENDING
    node: str | None = None
    # shared-GPU group ids (label runai-gpu-group) for placed fractional pods, one per device
    gpu_groups: tuple[str, ...] = ()
    namespace: str = "default"
    task_priority: int | None = None
    created: float = 0.0
    is_ray_head: bool = False
    subgroup: str | None = None
    uid: str = ""
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    node_affinity: tuple[Term, ...] | None = None  # required terms; None: no constraint
    # pods of one podset with the same replica key only make sense together (the hosts of a
    # multi-host Ray replica): above the podset's minimum they are placed and evicted as a unit
    replica: str | None = None


@dataclass(frozen=True, slots=True)
class SubGroup:
    name: str
    # 0: every pod of the subgroup is elastic (an autoscaled Ray group with minReplicas 0)
    min_member: int
    # pods per replica (Pod.replica) in this subgroup: a replica above the minimum is placed only
    # once all its pods exist (KubeRay creates a multi-host replica's pods one by one)
    replica_size: int = 1
    # see Job.admitted_min_member
    admitted_min_member: int | None = None


@dataclass(frozen=True, slots=True)
class Job:
    """A PodGroup and its pods."""

    name: str
    queue: str
    priority: int
    pods: tuple[Pod, ...]
    min_member: int = 1
    namespace: str = "default"
    created: float = 0.0
    preemptible: bool | None = None  # None: derived from priority (< 100 preemptible)
    subgroups: tuple[SubGroup, ...] = ()
    stale_since: float | None = None
    last_start: float | None = None
    uid: str = ""
    # The lowest minimum this run of the gang had before a spec change raised min_member (None:
    # not raised since it started). A running gang is stale below it, not below min_member:
    # members it was never asked to have when it was placed are not members lost.
    admitted_min_member: int | None = None

    @property
    def is_preemptible(self) -> bool:
        if self.preemptible is not None:
            return self.preemptible
        return self.priority < 100


@dataclass(frozen=True, slots=True)
class NodePlacement:
    gpu: str = "binpack"  # binpack | spread
    cpu: str = "binpack"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    placement: NodePlacement = NodePlacement()
    # device choice for fractional pods: gpupack (fullest device that fits) | gpuspread
    gpu_device_order: str | None = None  # None: gpupack with gpu binpack, gpuspread with spread
    # node and device choice for GPU pods: "kai" (KAI's binpack/gpupack scores), or a packing
    # policy of kai_ray.core.packing ("lookahead" beats FGD on the Alibaba openb trace)
    gpu_packing: str = "kai"
    actions: tuple[str, ...] = ("allocate", "consolidation", "reclaim", "preempt",
                                "stalegangeviction")
    staleness_grace_period_s: float = 60.0
    max_consolidation_preemptees: int = 16
    k_value: float = 1.0
    allow_consolidating_reclaim: bool = True
    reclaimer_saturation_multiplier: float = 1.0
    default_preempt_min_runtime_s: float = 0.0
    default_reclaim_min_runtime_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    jobs: tuple[Job, ...]
    priority_classes: tuple[tuple[str, int], ...] = field(default=())
