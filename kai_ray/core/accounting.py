"""Queue accounting for one session (KAI's proportion plugin's numbers): the queue tree as the
cycle uses it, and per queue what its jobs are allocated and request, charged along the path
from the job's leaf queue to its root.

Amounts are (cpu milli, memory bytes, GPUs) as floats; -1 in a quota or limit is unlimited."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kai_ray.core.jobs import JobState
from kai_ray.core.model import MILLI, MIN_NODE_GPU_MEMORY_MIB, Amounts, Request, Snapshot
from kai_ray.core.queuetree import excluded_queues


@dataclass
class QueueState:
    name: str
    parent: str | None
    priority: int
    created: float
    deserved: list[float]
    limit: list[float]
    weight: list[float]
    fair_share: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    allocated: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    allocated_np: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    request: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    children: list[str] = field(default_factory=list)
    preempt_min_runtime: float | None = None
    reclaim_min_runtime: float | None = None

    def allocatable(self, r: int) -> float:
        if self.deserved[r] == -1:
            return self.limit[r]
        value = max(self.deserved[r], self.fair_share[r])
        if self.limit[r] != -1:
            value = min(self.limit[r], value)
        return value


def add_amounts(amounts: list[float], add: Amounts) -> None:
    """Add to per-resource amounts element by element (the Rust core adds in the same order)."""
    for r in range(3):
        amounts[r] = amounts[r] + add[r]


def leq(a: Sequence[float], b: Sequence[float]) -> bool:
    """KAI's LessEqual over resources, where -1 is infinite."""
    if len(a) != len(b):
        raise ValueError(f"leq: {len(a)} resources against {len(b)}")
    for i in range(len(a)):
        x, y = a[i], b[i]
        if x == -1:
            if y != -1:
                return False
            continue
        if y == -1:
            continue
        if x > y + 1e-9:
            return False
    return True


def pending_amount(req: Request) -> Amounts:
    """What a pending pod asks of its queue: a gpu-memory pod's share is counted against the
    smallest GPU KAI assumes (it has no node yet)."""
    if req.gpus:
        gpu = float(req.gpus)
    elif req.gpu_fraction_milli:
        gpu = req.gpu_fraction_milli / MILLI * req.fraction_devices
    elif req.gpu_memory_mib:
        gpu = req.fraction_devices * req.gpu_memory_mib / MIN_NODE_GPU_MEMORY_MIB
    else:
        gpu = 0.0
    return (float(req.cpu_m), float(req.memory), gpu)


class QueueAccounting(Mapping[str, QueueState]):
    """The session's queues by name (a queue on a parent cycle, or under a missing parent, is
    left out with its descendants), with the tree's paths and what each queue is charged."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._queues: dict[str, QueueState] = {}
        for q in snapshot.queues:
            mem_q = max(-1.0, q.memory.quota * 1e6) if q.memory.quota != -1 else -1.0
            mem_l = max(-1.0, q.memory.limit * 1e6) if q.memory.limit != -1 else -1.0
            self._queues[q.name] = QueueState(
                name=q.name, parent=q.parent, priority=q.priority, created=q.created,
                deserved=[q.cpu.quota, mem_q, q.gpu.quota],
                limit=[q.cpu.limit, mem_l, q.gpu.limit],
                weight=[q.cpu.weight, q.memory.weight, q.gpu.weight],
                preempt_min_runtime=q.preempt_min_runtime_s,
                reclaim_min_runtime=q.reclaim_min_runtime_s,
            )
        # a queue on a parent cycle never reaches a root (and a walk up from it never ends):
        # removed with all its descendants, each with why (its jobs' pending message)
        parents = {name: q.parent or "" for name, q in self._queues.items()}
        self.excluded: dict[str, str] = excluded_queues(parents)
        for name in self.excluded:
            del self._queues[name]
        # orphans (parent missing) are removed with all their descendants
        changed = True
        while changed:
            changed = False
            for name in list(self._queues):
                parent = self._queues[name].parent
                if parent and parent not in self._queues:
                    del self._queues[name]
                    changed = True
        for qs in self._queues.values():
            if qs.parent:
                self._queues[qs.parent].children.append(qs.name)
        for qs in self._queues.values():
            qs.children.sort(key=lambda c: (self._queues[c].created, c))
        self._roots = sorted(q.name for q in self._queues.values() if not q.parent)

    def __getitem__(self, name: str) -> QueueState:
        return self._queues[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._queues)

    def __len__(self) -> int:
        return len(self._queues)

    def roots(self) -> list[str]:
        """The roots of the tree by name."""
        return self._roots

    def is_leaf(self, queue: str) -> bool:
        q = self._queues.get(queue)
        return q is not None and not q.children

    def path(self, queue: str) -> tuple[QueueState, ...]:
        """Leaf first, root last."""
        walk = []
        q = self._queues.get(queue)
        while q is not None:
            walk.append(q)
            q = self._queues.get(q.parent) if q.parent else None
        return tuple(walk)

    def charge(self, job: JobState, amounts: Amounts, sign: int) -> None:
        """Add (sign +1) or take back (-1) an allocated task's amounts along its job's path;
        a non-preemptible job's are counted apart too (KAI's non-preemptible quota rule)."""
        if job.queue not in self._queues:
            return
        if sign < 0:
            amounts = (-amounts[0], -amounts[1], -amounts[2])
        for q in self.path(job.queue):
            add_amounts(q.allocated, amounts)
            if not job.preemptible:
                add_amounts(q.allocated_np, amounts)

    def load(self, job: JobState, amounts: Amounts, allocated: bool) -> None:
        """A snapshot's task in its queues' numbers: its request, and its allocation when it
        holds resources (`allocated`)."""
        if job.queue not in self._queues:
            return
        for q in self.path(job.queue):
            if allocated:
                add_amounts(q.allocated, amounts)
            add_amounts(q.request, amounts)
            if allocated and not job.preemptible:
                add_amounts(q.allocated_np, amounts)
