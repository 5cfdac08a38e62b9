"""A session's jobs and their tasks: a task is one pod as the cycle sees it (its node, devices
and status change as the cycle decides), a job its PodGroup with one pod set per subgroup."""

from __future__ import annotations

from typing import Protocol

from kai_ray.core.model import ACTIVE_ALLOCATED, ALIVE, Amounts, Job, Pod, PodStatus, Request


class OrderRanks(Protocol):
    """What numbers a job order key (the session: `Session.order_number`)."""

    def order_number(self, key: tuple[int, int, float, str]) -> int: ...


class Task:
    """One pod inside the session: what the cycle changes (status, node, devices) and what it
    works out; what never changes is read from its `pod`."""

    __slots__ = (
        "accepted_gpu",
        "constraints",
        "gpu_mem_cost",
        "groups",
        "idx",
        "job",
        "moved",
        "name",
        "namespace",
        "node",
        "orig_status",
        "origin",
        "pod",
        "req",
        "shape",
        "status",
        "subgroup",
    )

    def __init__(self, idx: int, job: JobState, pod: Pod, node: int) -> None:
        self.idx = idx
        self.job = job
        self.pod = pod
        self.name = pod.name
        self.namespace = pod.namespace
        self.req: Request = pod.request
        self.status: PodStatus = pod.status
        self.node = node
        self.groups: tuple[str, ...] = pod.gpu_groups
        self.orig_status = pod.status
        self.subgroup = pod.subgroup or "default"
        # what limits the task's nodes besides resources (equal: the same nodes)
        self.constraints = (pod.node_selector, pod.tolerations, pod.node_affinity)
        self.shape = -1  # same request and constraints, same number (`Session.shape_of`)
        # per-device cost in milli of the device, and the GPU amount charged to the queue;
        # both depend on the node's GPU memory for gpu-memory pods, so set on placement
        self.gpu_mem_cost = 0
        self.accepted_gpu = 0.0
        # a victim re-placed on another node: the releasing original keeps its footprint and
        # a copy (`moved`) holds the new placement; the copy points back through `origin`
        self.moved: Task | None = None
        self.origin: Task | None = None

    def __repr__(self) -> str:
        return f"Task({self.name}, {self.status.value}, node={self.node})"

    def sort_key(self) -> tuple[int, int, int, float, str]:
        """KAI's task order: ray head first, task-priority (higher first), older, name."""
        pod = self.pod
        has_prio = pod.task_priority is not None
        return (0 if pod.is_ray_head else 1, 0 if has_prio else 1,
                -(pod.task_priority or 0), pod.created, self.name)


class PodSet:
    # plain slotted classes here and below: a session holds one per task, job and device
    __slots__ = ("min_member", "name", "replica_size", "stale_min", "tasks")

    def __init__(self, name: str, min_member: int, tasks: list[Task] | None = None,
                 replica_size: int = 1, admitted: int | None = None) -> None:
        self.name, self.min_member, self.replica_size = name, min_member, replica_size
        # fewer members than this running: stale (see Job.admitted_min_member)
        self.stale_min = min_member if admitted is None else min(min_member, max(admitted, 0))
        self.tasks: list[Task] = tasks if tasks is not None else []

    def fill_ratio(self) -> float:
        """Active members per member of the minimum (a minimum of 0 counts as 1)."""
        return self.active_count() / max(self.min_member, 1)

    def active_count(self) -> int:
        return sum(1 for t in self.tasks if t.status in ACTIVE_ALLOCATED)


class JobState:
    __slots__ = (
        "created",
        "last_start",
        "name",
        "namespace",
        "podsets",
        "preemptible",
        "priority",
        "queue",
        "signature",
        "stale_since",
        "tasks",
        "uses_subgroups",
    )

    def __init__(self, job: Job) -> None:
        self.name = job.name
        self.namespace = job.namespace
        self.queue = job.queue
        self.priority = job.priority
        self.preemptible = job.is_preemptible
        self.created = job.created
        self.stale_since = job.stale_since
        self.last_start = job.last_start
        self.tasks: list[Task] = []
        # KAI's scheduling-constraints signature, fixed on first use (actions/solver.py)
        self.signature: tuple[object, ...] | None = None
        self.uses_subgroups = bool(job.subgroups)
        if job.subgroups:
            # a subgroup's minimum may be 0 (all elastic); the job's own is at least 1
            self.podsets = {sg.name: PodSet(sg.name, max(sg.min_member, 0),
                                            replica_size=max(sg.replica_size, 1),
                                            admitted=sg.admitted_min_member)
                            for sg in job.subgroups}
        else:
            self.podsets = {"default": PodSet("default", max(job.min_member, 1),
                                              admitted=job.admitted_min_member)}

    def __repr__(self) -> str:
        return f"JobState({self.name})"

    def ordered_podsets(self) -> list[PodSet]:
        return sorted(self.podsets.values(), key=lambda ps: ps.name)

    def pending_tasks(self) -> list[Task]:
        return [t for t in self.tasks if t.status == PodStatus.PENDING]

    def has_pending(self) -> bool:
        """Whether `pending_tasks` is not empty (without building it: most jobs run)."""
        return any(t.status == PodStatus.PENDING for t in self.tasks)

    def active_count(self) -> int:
        return sum(1 for t in self.tasks if t.status in ACTIVE_ALLOCATED)

    def elastic_rank(self) -> int:
        """0 below min in some podset, 1 exactly at min, 2 above min (KAI's elastic job order)."""
        at_min = True
        for ps in self.podsets.values():
            active = ps.active_count()
            if active < ps.min_member:
                return 0
            if active > ps.min_member:
                at_min = False
        return 1 if at_min else 2

    @property
    def job(self) -> JobState:
        return self

    def order_key(self) -> tuple[int, int, float, str]:
        return (-self.priority, self.elastic_rank(), self.created, self.name)

    def order_number(self, ranks: OrderRanks) -> int:
        """`order_key` as the session numbers it (not kept: the rank changes)."""
        return ranks.order_number(self.order_key())

    def victim_amount(self) -> Amounts:
        return (0.0, 0.0, 0.0)

    def is_ready(self) -> bool:
        for ps in self.podsets.values():
            alive = sum(1 for t in ps.tasks if t.status in ALIVE and t.status != PodStatus.GATED)
            if alive < ps.min_member:
                return False
        return True

    def gang_satisfied(self) -> bool:
        return all(ps.active_count() >= ps.min_member for ps in self.podsets.values())

    def tasks_to_allocate(self, simulation: bool = False) -> list[Task]:
        """KAI's tasks-to-allocate: the missing minimum of every podset below its minimum, or,
        once every podset is satisfied, one more pending task from the least-satisfied podset.
        In a simulation, tasks evicted in this session may be placed again."""

        def allocatable(t: Task) -> bool:
            if t.status == PodStatus.PENDING:
                return True
            return (simulation and t.status == PodStatus.RELEASING and t.moved is None
                    and t.orig_status != PodStatus.RELEASING)

        below = [ps for ps in self.ordered_podsets() if ps.active_count() < ps.min_member]
        if below:
            out: list[Task] = []
            for ps in below:
                pending = by_replica(sorted((t for t in ps.tasks if allocatable(t)),
                                            key=Task.sort_key))
                out.extend(pending[: ps.min_member - ps.active_count()])
            return out
        candidates = [ps for ps in self.ordered_podsets() if any(allocatable(t) for t in ps.tasks)]
        for ps in sorted(candidates, key=lambda ps: (ps.fill_ratio(), ps.name)):
            unit = _next_elastic_unit(ps, sorted((t for t in ps.tasks if allocatable(t)),
                                                 key=Task.sort_key))
            if unit:
                return unit
        return []


def _next_elastic_unit(ps: PodSet, pending: list[Task]) -> list[Task]:
    """The next pod above the podset's minimum, or all pending pods of the next complete replica
    (an elastic replica of several hosts is one unit: all of it or none; one whose pods do not
    all exist yet waits)."""
    for t in pending:
        if t.pod.replica is None:
            return [t]
        size = sum(1 for u in ps.tasks if u.pod.replica == t.pod.replica and u.status in ALIVE
                   and u.origin is None)
        if size >= ps.replica_size:
            return [u for u in pending if u.pod.replica == t.pod.replica]
    return []


def by_replica(tasks: list[Task]) -> list[Task]:
    """`tasks` (in task order) with the pods of one replica kept together, at the place of the
    replica's first pod, so a count of pods taken from the front covers whole replicas."""
    out: list[Task] = []
    seen: set[str] = set()
    for t in tasks:
        if t.pod.replica is None:
            out.append(t)
        elif t.pod.replica not in seen:
            seen.add(t.pod.replica)
            out.extend(u for u in tasks if u.pod.replica == t.pod.replica)
    return out
