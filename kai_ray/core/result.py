"""What one scheduling cycle decided, and why: the core's only output."""

from __future__ import annotations

from dataclasses import dataclass, field

# The four per-pod classes below (tens of thousands per cycle) and JobStatus write their own
# `__init__`, whose positional order the Rust core calls (RESULT_TYPES; native/python/src/lib.rs),
# and keep their fields in slots. Not frozen (a frozen dataclass sets each field through
# `object.__setattr__`, several times slower): treat them as read-only.


@dataclass(init=False, slots=True)
class Bind:
    """Allocate a pending pod: the binder writes the Binding (and GPU-sharing state)."""

    job: str
    namespace: str
    pod: str
    node: str
    gpu_groups: tuple[str, ...]
    new_gpu_groups: tuple[str, ...]
    gpu_portion: float  # per device, for fractional pods (GPU_PORTION)
    gpu_memory_mib: int  # per device, for gpu-memory pods
    action: str

    def __init__(self, job: str, namespace: str, pod: str, node: str,
                 gpu_groups: tuple[str, ...] = (), new_gpu_groups: tuple[str, ...] = (),
                 gpu_portion: float = 0.0, gpu_memory_mib: int = 0,
                 action: str = "allocate") -> None:
        self.job, self.namespace, self.pod, self.node = job, namespace, pod, node
        self.gpu_groups, self.new_gpu_groups = gpu_groups, new_gpu_groups
        self.gpu_portion, self.gpu_memory_mib, self.action = gpu_portion, gpu_memory_mib, action


@dataclass(init=False, slots=True)
class Pipeline:
    """Placed on resources still being released: nothing is written but an event."""

    job: str
    namespace: str
    pod: str
    node: str
    action: str

    def __init__(self, job: str, namespace: str, pod: str, node: str, action: str) -> None:
        self.job, self.namespace, self.pod, self.node, self.action = (job, namespace, pod, node,
                                                                      action)


@dataclass(init=False, slots=True)
class Evict:
    job: str
    namespace: str
    pod: str
    node: str | None
    action: str
    message: str
    preemptor: str | None

    def __init__(self, job: str, namespace: str, pod: str, node: str | None, action: str,
                 message: str, preemptor: str | None = None) -> None:
        self.job, self.namespace, self.pod, self.node = job, namespace, pod, node
        self.action, self.message, self.preemptor = action, message, preemptor


@dataclass(frozen=True, slots=True)
class NodeFitSummary:
    """How many nodes failed each predicate for one task (the 'no node fits' histogram)."""

    reasons: tuple[tuple[str, int], ...]

    def message(self) -> str:
        parts = [f"{count} node(s) {reason}" for reason, count in self.reasons]
        return "no nodes with enough resources were found: " + ", ".join(parts) + "."


@dataclass(init=False, slots=True)
class JobStatus:
    """Why a job (PodGroup) with pending pods did not get everything it asked for."""

    job: str
    namespace: str
    reason: str  # OverLimit | NonPreemptibleOverQuota | QueueDoesNotExist | QueueParentCycle | ...
    message: str
    pending_pods: tuple[str, ...]
    fit: NodeFitSummary | None
    details: tuple[tuple[str, str], ...]

    def __init__(self, job: str, namespace: str, reason: str, message: str,
                 pending_pods: tuple[str, ...] = (), fit: NodeFitSummary | None = None,
                 details: tuple[tuple[str, str], ...] = ()) -> None:
        self.job, self.namespace, self.reason, self.message = job, namespace, reason, message
        self.pending_pods, self.fit, self.details = pending_pods, fit, details


# the index of each resource in QueueShare's tuples (and in the session's per-resource lists)
CPU, MEM, GPU = 0, 1, 2


@dataclass(frozen=True, slots=True)
class QueueShare:
    """Per-resource numbers of one queue as (CPU millicores, memory bytes, GPUs)."""

    name: str
    parent: str | None
    deserved: tuple[float, float, float]
    limit: tuple[float, float, float]
    fair_share: tuple[float, float, float]
    allocated: tuple[float, float, float]
    allocated_non_preemptible: tuple[float, float, float]
    requested: tuple[float, float, float]


@dataclass(init=False, slots=True)
class PodOutcome:
    status: str
    node: str | None
    gpu_groups: tuple[str, ...]

    def __init__(self, status: str, node: str | None, gpu_groups: tuple[str, ...]) -> None:
        self.status, self.node, self.gpu_groups = status, node, gpu_groups


@dataclass
class CycleResult:
    binds: list[Bind] = field(default_factory=list)
    pipelined: list[Pipeline] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    job_status: dict[str, JobStatus] = field(default_factory=dict)
    # PodGroup stale timestamps to write (job -> time) and to clear
    stale_set: dict[str, float] = field(default_factory=dict)
    stale_cleared: list[str] = field(default_factory=list)
    queues: dict[str, QueueShare] = field(default_factory=dict)
    # final state of every pod in the session (for simulators and explanations)
    pods: dict[str, PodOutcome] = field(default_factory=dict)
    action_seconds: dict[str, float] = field(default_factory=dict)


# the result's classes, handed to the Rust core to build its answer with, in this order
# (kai_ray.core.schedule; native/python/src/lib.rs reads them by position)
RESULT_TYPES = (CycleResult, Bind, Pipeline, Evict, JobStatus, NodeFitSummary, QueueShare,
                PodOutcome)
