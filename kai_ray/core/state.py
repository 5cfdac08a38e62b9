"""The mutable session: nodes as numpy arrays, tasks, jobs, queue accounting, and an undo log.

Every virtual decision (allocate, pipeline, evict) goes through `Session` and is recorded, so a
gang that does not fit is rolled back to a checkpoint without a trace (KAI's Statement).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kai_ray.core.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_USED,
    ALIVE,
    MIN_NODE_GPU_MEMORY_MIB,
    QUEUE_ALLOCATED,
    Job,
    Pod,
    PodStatus,
    Request,
    SchedulerConfig,
    Snapshot,
)
from kai_ray.core.queuetree import excluded_queues
from kai_ray.core.result import GPU
from kai_ray.core.scratch import Scratch

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
MILLI = 1000


class Task:
    """One pod inside the session."""

    __slots__ = (
        "accepted_gpu",
        "constraints",
        "created",
        "gpu_mem_cost",
        "groups",
        "idx",
        "is_head",
        "job",
        "moved",
        "name",
        "namespace",
        "node",
        "node_affinity",
        "node_selector",
        "orig_groups",
        "orig_node",
        "orig_status",
        "origin",
        "replica",
        "req",
        "shape",
        "status",
        "subgroup",
        "task_priority",
        "tolerations",
    )

    def __init__(self, idx: int, job: JobState, pod: Pod, node: int) -> None:
        self.idx = idx
        self.job = job
        self.name = pod.name
        self.namespace = pod.namespace
        self.req: Request = pod.request
        self.status: PodStatus = pod.status
        self.node = node
        self.groups: tuple[str, ...] = pod.gpu_groups
        self.orig_status = pod.status
        self.orig_node = node
        self.orig_groups = pod.gpu_groups
        self.task_priority = pod.task_priority
        self.created = pod.created
        self.is_head = pod.is_ray_head
        self.subgroup = pod.subgroup or "default"
        self.node_selector = pod.node_selector
        self.tolerations = pod.tolerations
        self.node_affinity = pod.node_affinity
        # what limits the task's nodes besides resources (equal: the same nodes)
        self.constraints = (pod.node_selector, pod.tolerations, pod.node_affinity)
        self.shape = -1  # same request and constraints, same number (`Session.shape_of`)
        self.replica = pod.replica
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
        has_prio = self.task_priority is not None
        return (0 if self.is_head else 1, 0 if has_prio else 1,
                -(self.task_priority or 0), self.created, self.name)


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
        "changes",
        "created",
        "last_start",
        "name",
        "namespace",
        "podsets",
        "preemptible",
        "priority",
        "queue",
        "requested",
        "signature",
        "source",
        "stale_since",
        "tasks",
        "to_allocate",
        "uses_subgroups",
    )

    def __init__(self, job: Job) -> None:
        self.source = job
        self.name = job.name
        self.namespace = job.namespace
        self.queue = job.queue
        self.priority = job.priority
        self.preemptible = job.is_preemptible
        self.created = job.created
        self.stale_since = job.stale_since
        self.last_start = job.last_start
        self.tasks: list[Task] = []
        # bumped by the session on every change to one of the job's tasks (and its undo), so
        # derived values can be cached until the job changes
        self.changes = 0
        # made on first use (most jobs of a busy cluster never need them)
        self.to_allocate: dict[bool, tuple[int, list[Task]]] | None = None
        self.requested: dict[bool, tuple[int, tuple[float, float, float]]] | None = None
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

    def order_number(self, sess: Session) -> int:
        """`order_key` as `Session.order_number` numbers it (not kept: the rank changes)."""
        return sess.order_number(self.order_key())

    def victim_amount(self) -> tuple[float, float, float]:
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
        cache = self.to_allocate
        if cache is None:
            cache = self.to_allocate = {}
        cached = cache.get(simulation)
        if cached is None or cached[0] != self.changes:
            cached = cache[simulation] = (self.changes, self._tasks_to_allocate(simulation))
        return list(cached[1])

    def _tasks_to_allocate(self, simulation: bool) -> list[Task]:

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
        if t.replica is None:
            return [t]
        size = sum(1 for u in ps.tasks if u.replica == t.replica and u.status in ALIVE
                   and u.origin is None)
        if size >= ps.replica_size:
            return [u for u in pending if u.replica == t.replica]
    return []


def by_replica(tasks: list[Task]) -> list[Task]:
    """`tasks` (in task order) with the pods of one replica kept together, at the place of the
    replica's first pod, so a count of pods taken from the front covers whole replicas."""
    out: list[Task] = []
    seen: set[str] = set()
    for t in tasks:
        if t.replica is None:
            out.append(t)
        elif t.replica not in seen:
            seen.add(t.replica)
            out.extend(u for u in tasks if u.replica == t.replica)
    return out


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


@dataclass
class JobError:
    """Why a job's last attempt failed (becomes the PodGroup/pod condition)."""

    reason: str
    message: str
    fit: dict[str, int] | None = None


class EvictInfo:
    __slots__ = ("action", "describe", "preemptor")

    def __init__(self, action: str, preemptor: str | None, describe: Callable[[], str]) -> None:
        self.action, self.preemptor = action, preemptor
        # built only for the evictions that are kept: most are simulated and rolled back
        self.describe = describe

    @property
    def message(self) -> str:
        return self.describe()


class Group:
    """A shared GPU device (KAI GPU group): usage in milli of the device. As KAI counts it
    (gpu_sharing_node_info.go), a pipelined sharer is not charged to the device's idle room
    but to its releasing room: `used` is the active sharers but pipelined ones (releasing
    ones included; KAI's AllocatedSharedGPUsMemory), `releasing` the releasing ones less the
    pipelined ones (KAI's ReleasingSharedGPUsMemory: may be negative), `pipelined` what the
    pipelined ones take. So the room, `MILLI - used + releasing`, counts every sharer once,
    and `used + pipelined` is all of them (KAI's UsedSharedGPUsMemory). `from_idle`: an
    unpipelined sharer opened the device, so KAI took it from the idle GPUs
    (gpu_sharing_node_info.go:120-127) and gives it back only once no sharer at all is left
    (:212-217): pipelined sharers alone then keep it out of idle; one a pipelined sharer
    opened is taken from releasing (:113-119)."""

    __slots__ = ("from_idle", "gid", "pipelined", "releasing", "tasks", "used")

    def __init__(self, gid: str, used: int = 0, releasing: int = 0) -> None:
        self.gid, self.used, self.releasing = gid, used, releasing
        self.pipelined = 0
        self.from_idle = False
        self.tasks: set[int] = set()


def _add3(amounts: list[float], cpu: float, memory: float, gpu: float) -> None:
    """Add to per-resource amounts element by element: typed float arithmetic when compiled
    (a loop over `range(3)` adds boxed floats). A zero is not added (most pods ask no GPU):
    x + 0.0 is x, as the sums are never -0.0."""
    # (`+=` on an item is a generic Python add when compiled)
    if cpu:
        amounts[0] = amounts[0] + cpu
    if memory:
        amounts[1] = amounts[1] + memory
    if gpu:
        amounts[2] = amounts[2] + gpu


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


class _Load:
    """What loading the snapshot's pods collects on the way (see `Session._load_task`)."""

    __slots__ = ("gpu_nodes", "groups", "pending", "pipelined", "releasing")

    def __init__(self) -> None:
        self.gpu_nodes: dict[int, bool] = {}  # GPU nodes, and whether shared devices changed
        self.releasing: list[Task] = []
        self.pipelined: list[Task] = []
        self.pending: set[int] = set()  # ids of jobs with a pending task
        self.groups: set[str] = set()  # shared-device ids in use


class Session:
    """Cluster, jobs and queues for one cycle, with checkpoint/rollback."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig, now: float) -> None:
        self.config = config
        self.now = now
        nodes = sorted((n for n in snapshot.nodes), key=lambda n: n.name)
        self.nodes = nodes
        self.node_index = {n.name: i for i, n in enumerate(nodes)}
        self._name_rank: dict[str, int] | None = None
        self._order_ranks: tuple[dict[int, int], dict[float, int], int, int] | None = None
        self._paths: dict[str, tuple[QueueState, ...]] = {}
        self._roots: list[str] | None = None
        self._widest: int | None = None
        count = len(nodes)
        ready = np.array([n.ready and not n.unschedulable for n in nodes], dtype=bool)
        self.schedulable = ready
        self.cap_cpu = np.array([n.cpu_m - n.foreign_cpu_m for n in nodes], dtype=np.int64)
        self.cap_mem = np.array([n.memory - n.foreign_memory for n in nodes], dtype=np.int64)
        self.cap_gpu = np.array([n.gpus - n.foreign_gpus for n in nodes], dtype=np.int64)
        self.max_pods = np.array([n.max_pods - n.foreign_pods for n in nodes], dtype=np.int64)
        self.gpu_mem = np.array([max(n.gpu_memory_mib, 1) for n in nodes], dtype=np.int64)
        self.gpu_mem_synced = np.array([n.gpu_memory_synced for n in nodes], dtype=bool)
        self.node_labels = [dict(n.labels) for n in nodes]
        self.node_taints = [n.taints for n in nodes]
        self.any_taints = any(self.node_taints)
        # usage as KAI's NodeInfo splits it (addTaskResources): "used" is what idle lacks
        # (cap - used is KAI's Idle): all active pods, releasing ones included, but pipelined
        # ones; "rel" is KAI's Releasing: the releasing pods less the pipelined ones, which
        # wait for them (so it may be negative). cap - used + rel counts every pod once.
        self.used_cpu = np.zeros(count, dtype=np.int64)
        self.rel_cpu = np.zeros(count, dtype=np.int64)
        self.used_mem = np.zeros(count, dtype=np.int64)
        self.rel_mem = np.zeros(count, dtype=np.int64)
        self.used_pods = np.zeros(count, dtype=np.int64)
        # whole-GPU pods' devices, and the releasing part, split as above (one node at a
        # time only: lists)
        self.whole_used = [0] * count
        self.whole_rel = [0] * count
        self.used_gpu = np.zeros(count, dtype=np.int64)  # whole + one per shared group
        self.rel_gpu = np.zeros(count, dtype=np.int64)
        self.groups: list[dict[str, Group]] = [{} for _ in range(count)]
        # shared devices as arrays (node x slot), mirrored from `groups` for vectorised fits
        width = max(1, int(self.cap_gpu.max()) if count else 1)
        self.dev_used = np.zeros((count, width), dtype=np.int64)
        self.dev_rel = np.zeros((count, width), dtype=np.int64)
        self.dev_on = np.zeros((count, width), dtype=bool)
        self.undo: list[tuple[object, ...]] = []
        self.job_errors: dict[str, JobError] = {}
        # the only nodes placement may use while set, in node order (a victim scenario's)
        self.node_filter: list[int] | None = None
        self.evict_info: dict[int, EvictInfo] = {}
        # what other modules derive once per session, under their own typed keys
        self.scratch = Scratch()

        self.jobs: dict[str, JobState] = {}
        self.tasks: list[Task] = []
        self._shapes: dict[tuple[object, ...], int] = {}  # see `shape_of`
        self._build_queues(snapshot)
        # one pass over the pods builds the tasks and loads what they use (a pass over every
        # pod of a big cluster is mostly waiting for memory: each one counts)
        load = _Load()
        for job in snapshot.jobs:
            js = JobState(job)
            self.jobs[job.name] = js
            for pod in job.pods:
                node = self.node_index.get(pod.node, -1) if pod.node else -1
                task = Task(len(self.tasks), js, pod, node)
                self.tasks.append(task)
                js.tasks.append(task)
                self._load_task(task, load)
                podset = js.podsets.get(task.subgroup)
                if podset is None:
                    # KAI drops a pod whose subgroup is not a leaf of its PodGroup
                    if js.uses_subgroups:
                        continue
                    podset = js.podsets["default"]
                podset.tasks.append(task)
        # no task becomes pending during a cycle (only a rollback restores one), so the jobs
        # with a pending task at any time are among these: passes for pending work take them
        # instead of every job (a busy cluster's jobs are nearly all running)
        self.pending_jobs = [js for js in self.jobs.values() if id(js) in load.pending]
        self.known_groups = load.groups
        self._finish_load(load)

    # ------------------------------------------------------------------ setup
    def _build_queues(self, snapshot: Snapshot) -> None:
        self.queues: dict[str, QueueState] = {}
        for q in snapshot.queues:
            mem_q = max(-1.0, q.memory.quota * 1e6) if q.memory.quota != -1 else -1.0
            mem_l = max(-1.0, q.memory.limit * 1e6) if q.memory.limit != -1 else -1.0
            self.queues[q.name] = QueueState(
                name=q.name, parent=q.parent, priority=q.priority, created=q.created,
                deserved=[q.cpu.quota, mem_q, q.gpu.quota],
                limit=[q.cpu.limit, mem_l, q.gpu.limit],
                weight=[q.cpu.weight, q.memory.weight, q.gpu.weight],
                preempt_min_runtime=q.preempt_min_runtime_s,
                reclaim_min_runtime=q.reclaim_min_runtime_s,
            )
        # a queue on a parent cycle never reaches a root (and a walk up from it never ends):
        # removed with all its descendants, each with why (its jobs' pending message)
        parents = {name: q.parent or "" for name, q in self.queues.items()}
        self.excluded_queues: dict[str, str] = excluded_queues(parents)
        for name in self.excluded_queues:
            del self.queues[name]
        # orphans (parent missing) are removed with all their descendants
        changed = True
        while changed:
            changed = False
            for name in list(self.queues):
                parent = self.queues[name].parent
                if parent and parent not in self.queues:
                    del self.queues[name]
                    changed = True
        for qs in self.queues.values():
            if qs.parent:
                self.queues[qs.parent].children.append(qs.name)
        for qs in self.queues.values():
            qs.children.sort(key=lambda c: (self.queues[c].created, c))

    def shape_of(self, task: Task) -> int:
        """A number per request and constraints: equal numbers, the same request on the same
        nodes. Numbered when first asked (only tasks being placed are: most pods just run)."""
        if task.shape < 0:
            r = task.req
            # the request's numbers as a flat tuple (hashes in C; hashing the dataclass runs
            # its generated __hash__, several thousand instructions)
            key = (r.cpu_m, r.memory, r.gpus, r.gpu_fraction_milli, r.gpu_memory_mib,
                   r.fraction_devices, task.constraints)
            task.shape = self._shapes.setdefault(key, len(self._shapes))
        return task.shape

    def is_leaf(self, queue: str) -> bool:
        q = self.queues.get(queue)
        return q is not None and not q.children

    def widest_gpu_node(self) -> int:
        """The node whose GPUs have the most memory (the first of them), 0 when none."""
        if self._widest is None:
            self._widest = int(np.argmax(self.gpu_mem)) if len(self.nodes) else 0
        return self._widest

    def name_rank(self, job_name: str) -> int:
        """A job's position among all job names in sorted order (numeric sort keys)."""
        if self._name_rank is None:
            self._name_rank = {name: i for i, name in enumerate(sorted(self.jobs))}
        return self._name_rank[job_name]

    def order_number(self, key: tuple[int, int, float, str]) -> int:
        """A job order key (-priority, elastic rank 0..2, created, name) as one int in the same
        order: each part by its rank among the session's jobs (heap entries then compare as
        one number, not as tuples element by element)."""
        ranks = self._order_ranks
        if ranks is None:
            jobs = self.jobs.values()
            by_priority = {p: i for i, p in enumerate(sorted({-j.priority for j in jobs}))}
            by_created = {c: i for i, c in enumerate(sorted({j.created for j in jobs}))}
            ranks = self._order_ranks = (by_priority, by_created, len(by_created),
                                         len(self.jobs))
        by_priority, by_created, n_created, n_jobs = ranks
        return (((by_priority[key[0]] * 3 + key[1]) * n_created + by_created[key[2]]) * n_jobs
                + self.name_rank(key[3]))

    def root_queues(self) -> list[str]:
        """The roots of the queue tree by name (fixed for the session: remembered)."""
        if self._roots is None:
            self._roots = sorted(q.name for q in self.queues.values() if not q.parent)
        return self._roots

    def queue_path(self, queue: str) -> tuple[QueueState, ...]:
        """Leaf first, root last (the tree is fixed for the session: remembered)."""
        path = self._paths.get(queue)
        if path is None:
            walk = []
            q = self.queues.get(queue)
            while q is not None:
                walk.append(q)
                q = self.queues.get(q.parent) if q.parent else None
            path = self._paths[queue] = tuple(walk)
        return path

    def _load_task(self, task: Task, load: _Load) -> None:
        """A snapshot's pod on its node and in its queue's numbers (GPU nodes are recounted
        once, by `_finish_load`, not pod by pod as `_place_resources` does)."""
        node, req, status = task.node, task.req, task.status
        if task.groups:
            load.groups.update(task.groups)
        if status == PodStatus.PENDING:
            load.pending.add(id(task.job))
        if node >= 0 and status in ACTIVE_USED:
            self.used_cpu[node] += req.cpu_m
            self.used_mem[node] += req.memory
            self.used_pods[node] += 1
            if req.wants_gpu:  # (a pod without GPUs has nothing to hold: node and charge set)
                self._hold_gpus(task, node, task.groups, status == PodStatus.PIPELINED)
                load.gpu_nodes[node] = load.gpu_nodes.get(node, False) or not req.gpus
            if status == PodStatus.RELEASING:
                load.releasing.append(task)
            elif status == PodStatus.PIPELINED:
                load.pipelined.append(task)
        job = task.job
        if job.queue not in self.queues:
            return
        if status in QUEUE_ALLOCATED:
            cpu, memory, gpu = self.task_queue_amount(task)
            for q in self.queue_path(job.queue):
                _add3(q.allocated, cpu, memory, gpu)
                _add3(q.request, cpu, memory, gpu)
                if not job.preemptible:
                    _add3(q.allocated_np, cpu, memory, gpu)
        elif status == PodStatus.PENDING:
            cpu, memory, gpu = self.pending_queue_amount(req)
            for q in self.queue_path(job.queue):
                _add3(q.request, cpu, memory, gpu)

    def _finish_load(self, load: _Load) -> None:
        for node, devices in load.gpu_nodes.items():
            self._refresh_gpu(node, devices=devices)
        for task in load.releasing:
            self._mark_releasing(task, +1)
        for task in load.pipelined:
            self._pipeline_charge(task, +1)
        self.total = [float(self.cap_cpu[self.schedulable].sum()),
                      float(self.cap_mem[self.schedulable].sum()),
                      float(self.cap_gpu[self.schedulable].sum())]

    # ------------------------------------------------------------------ amounts
    def device_cost(self, req: Request, node: int) -> int:
        """Milli of one device a shared request takes on this node."""
        if req.gpu_fraction_milli:
            return req.gpu_fraction_milli
        return math.ceil(req.gpu_memory_mib * MILLI / int(self.gpu_mem[node]))

    def portion(self, req: Request, node: int) -> float:
        """GPU portion recorded for a shared pod on this node (gpu-memory rounds up to 1/100)."""
        if req.gpu_fraction_milli:
            return req.gpu_fraction_milli / MILLI
        return math.ceil(req.gpu_memory_mib / int(self.gpu_mem[node]) * 100) / 100

    def task_queue_amount(self, task: Task) -> tuple[float, float, float]:
        req = task.req
        if req.gpus:
            gpu = float(req.gpus)
        elif req.is_shared and task.node >= 0:
            gpu = self.portion(req, task.node) * req.fraction_devices
        else:
            gpu = 0.0
        return (float(req.cpu_m), float(req.memory), gpu)

    @staticmethod
    def pending_queue_amount(req: Request) -> tuple[float, float, float]:
        if req.gpus:
            gpu = float(req.gpus)
        elif req.gpu_fraction_milli:
            gpu = req.gpu_fraction_milli / MILLI * req.fraction_devices
        elif req.gpu_memory_mib:
            gpu = req.fraction_devices * req.gpu_memory_mib / MIN_NODE_GPU_MEMORY_MIB
        else:
            gpu = 0.0
        return (float(req.cpu_m), float(req.memory), gpu)

    # ------------------------------------------------------------------ node bookkeeping
    def _refresh_gpu(self, node: int, devices: bool = True) -> None:
        """Recount the node's GPUs and mirror its shared devices into the device arrays
        (`devices` false: they did not change, a whole-GPU pod came or went)."""
        groups = self.groups[node]
        used = self.whole_used[node]
        rel = self.whole_rel[node]
        # a device some unpipelined sharer holds is not idle; one all of whose sharers are
        # releasing is releasing; one only pipelined sharers hold is taken from releasing
        # (KAI: a sharer pipelined onto an empty or all-releasing device takes one releasing
        # GPU, and leaves the idle ones alone), unless an unpipelined sharer opened it (a job
        # allocate pipelines whole once one of its pods is: Group.from_idle)
        for g in groups.values():
            if g.used > 0 or g.from_idle:
                used += 1
                if g.used == g.releasing:
                    rel += 1
            else:
                rel -= 1
        self.used_gpu[node] = used
        self.rel_gpu[node] = rel
        if not devices:
            return
        count = len(groups)
        if count > self.dev_used.shape[1]:
            self._grow_devices(count)
        pad = [0] * (self.dev_used.shape[1] - count)
        self.dev_on[node] = [True] * count + [False] * len(pad)
        self.dev_used[node] = [g.used for g in groups.values()] + pad
        self.dev_rel[node] = [g.releasing for g in groups.values()] + pad

    def _grow_devices(self, width: int) -> None:
        pad = width - self.dev_used.shape[1]
        count = self.dev_used.shape[0]
        self.dev_used = np.hstack([self.dev_used, np.zeros((count, pad), dtype=np.int64)])
        self.dev_rel = np.hstack([self.dev_rel, np.zeros((count, pad), dtype=np.int64)])
        self.dev_on = np.hstack([self.dev_on, np.zeros((count, pad), dtype=bool)])

    def _place_resources(self, task: Task, node: int, groups: tuple[str, ...],
                         pipelined: bool = False) -> None:
        req = task.req
        self._add_usage(node, req.cpu_m, req.memory, 1)
        self._hold_gpus(task, node, groups, pipelined)
        if pipelined:
            self._pipeline_charge(task, +1, refresh=False)
        if req.wants_gpu:
            self._refresh_gpu(node, devices=not req.gpus)

    def _hold_gpus(self, task: Task, node: int, groups: tuple[str, ...],
                   pipelined: bool) -> None:
        """The task on `node`: its whole GPUs or its share of devices `groups`, and what it is
        charged (the node's GPU counts are left to `_refresh_gpu`)."""
        req = task.req
        if req.gpus:
            self.whole_used[node] = self.whole_used[node] + req.gpus
        elif req.is_shared:
            cost = self.device_cost(req, node)
            task.gpu_mem_cost = cost
            for gid in groups:
                group = self.groups[node].get(gid)
                if group is None:
                    group = Group(gid)
                    group.from_idle = not pipelined
                    self.groups[node][gid] = group
                group.used += cost
                group.tasks.add(task.idx)
        task.node = node
        task.groups = groups
        task.accepted_gpu = self.task_queue_amount(task)[GPU]

    def _remove_resources(self, task: Task) -> None:
        if task.status == PodStatus.PIPELINED:
            self._pipeline_charge(task, -1, refresh=False)
        node, req = task.node, task.req
        self._add_usage(node, -req.cpu_m, -req.memory, -1)
        if req.gpus:
            self.whole_used[node] = self.whole_used[node] - req.gpus
        elif req.is_shared:
            for gid in task.groups:
                group = self.groups[node][gid]
                group.used -= task.gpu_mem_cost
                group.tasks.discard(task.idx)
                if not group.tasks:
                    del self.groups[node][gid]
        if req.wants_gpu:
            self._refresh_gpu(node, devices=not req.gpus)
        task.node = -1
        task.groups = ()

    def _add_usage(self, node: int, cpu: int, memory: int, pods: int) -> None:
        self.used_cpu[node] += cpu
        self.used_mem[node] += memory
        self.used_pods[node] += pods

    def _mark_releasing(self, task: Task, sign: int) -> None:
        node, req = task.node, task.req
        if node < 0:
            return  # a pod on a node the snapshot does not have: nothing of ours to release
        self.rel_cpu[node] += sign * req.cpu_m
        self.rel_mem[node] += sign * req.memory
        if req.gpus:
            self.whole_rel[node] = self.whole_rel[node] + sign * req.gpus
        elif req.is_shared:
            for gid in task.groups:
                self.groups[node][gid].releasing += sign * task.gpu_mem_cost
        if req.wants_gpu:
            self._refresh_gpu(node, devices=not req.gpus)

    def _pipeline_charge(self, task: Task, sign: int, refresh: bool = True) -> None:
        """A placed task becomes pipelined (sign +1) or stops being so (-1). KAI charges a
        Pipelined pod to the node's releasing resources and leaves its idle ones alone
        (NodeInfo.addTaskResources: Releasing -= request, Idle unchanged): the task's amounts
        leave `used` and `rel` both (see `__init__`), so the room with releasing stays."""
        node, req = task.node, task.req
        if node < 0:
            return
        cpu, memory = sign * req.cpu_m, sign * req.memory
        self._add_usage(node, -cpu, -memory, 0)
        self.rel_cpu[node] -= cpu
        self.rel_mem[node] -= memory
        if req.gpus:
            self.whole_used[node] = self.whole_used[node] - sign * req.gpus
            self.whole_rel[node] = self.whole_rel[node] - sign * req.gpus
        elif req.is_shared:
            cost = sign * task.gpu_mem_cost
            for gid in task.groups:
                group = self.groups[node][gid]
                group.used -= cost
                group.releasing -= cost
                group.pipelined += cost
                if len(group.tasks) == 1:
                    # KAI moves a pod between Allocated and Pipelined by removing and adding
                    # it: its device alone, it empties and the pod opens it again
                    group.from_idle = sign < 0
        if refresh and req.wants_gpu:
            self._refresh_gpu(node, devices=not req.gpus)

    def _set_charge(self, task: Task, old: PodStatus, new: PodStatus) -> None:
        """The node charge of a task whose status goes from `old` to `new` (both placed)."""
        if old == PodStatus.PIPELINED and new != PodStatus.PIPELINED:
            self._pipeline_charge(task, -1)
        elif new == PodStatus.PIPELINED and old != PodStatus.PIPELINED:
            self._pipeline_charge(task, +1)

    def _queue_add(self, task: Task, sign: int) -> None:
        if task.job.queue not in self.queues:
            return
        cpu, memory, gpu = self.task_queue_amount(task)
        if sign < 0:
            cpu, memory, gpu = -cpu, -memory, -gpu
        np_job = not task.job.preemptible
        for q in self.queue_path(task.job.queue):
            _add3(q.allocated, cpu, memory, gpu)
            if np_job:
                _add3(q.allocated_np, cpu, memory, gpu)

    def new_group_id(self, node: int, besides: Sequence[str] = ()) -> str:
        """A shared-device id that no pod in the snapshot and no device on the node uses:
        the first free number on the node, so it depends on the state alone (not on attempts
        rolled back before, which a running counter would), unlike KAI's UUIDs. `besides`: ids
        already picked for the same pod."""
        k = 0
        while True:
            k += 1
            gid = f"{self.nodes[node].name}-gpu-{k}"
            if (gid not in self.known_groups and gid not in self.groups[node]
                    and gid not in besides):
                return gid

    # ------------------------------------------------------------------ virtual decisions
    def checkpoint(self) -> int:
        return len(self.undo)

    def allocate(self, task: Task, node: int, groups: tuple[str, ...], pipelined: bool) -> None:
        """Place a pending (or virtually evicted) task."""
        if task.status == PodStatus.RELEASING and task.node == node and task.groups == groups:
            # a victim that goes back where it was is simply not evicted
            self.unevict(task)
            return
        if task.status == PodStatus.RELEASING:
            self._move(task, node, groups)
            return
        prev = (task.status, task.node, task.groups)
        self._place_resources(task, node, groups, pipelined)
        task.status = PodStatus.PIPELINED if pipelined else PodStatus.ALLOCATED
        self._queue_add(task, +1)
        self.undo.append(("alloc", task, prev))
        task.job.changes += 1

    def _move(self, task: Task, node: int, groups: tuple[str, ...]) -> None:
        pod = Pod(name=task.name, request=task.req, namespace=task.namespace,
                  task_priority=task.task_priority, created=task.created, is_ray_head=task.is_head,
                  subgroup=task.subgroup, node_selector=task.node_selector,
                  tolerations=task.tolerations, node_affinity=task.node_affinity,
                  replica=task.replica)
        copy = Task(len(self.tasks), task.job, pod, -1)
        copy.origin = task
        copy.shape = task.shape
        self.tasks.append(copy)
        task.job.tasks.append(copy)
        podset = task.job.podsets.get(task.subgroup) or task.job.podsets["default"]
        podset.tasks.append(copy)
        task.moved = copy
        self._place_resources(copy, node, groups, True)
        copy.status = PodStatus.PIPELINED
        self._queue_add(copy, +1)
        self.undo.append(("move", task, copy))
        task.job.changes += 1

    def set_status(self, task: Task, status: PodStatus) -> None:
        """Switch between Allocated and Pipelined (same resources, same queue charge; the
        node charge moves between idle and releasing, `_pipeline_charge`)."""
        self.undo.append(("status", task, task.status))
        self._set_charge(task, task.status, status)
        task.status = status
        task.job.changes += 1

    def evict(self, task: Task) -> None:
        prev = task.status
        self._queue_add(task, -1)
        self._set_charge(task, prev, PodStatus.RELEASING)
        task.status = PodStatus.RELEASING
        self._mark_releasing(task, +1)
        self.undo.append(("evict", task, prev))
        task.job.changes += 1

    def unevict(self, task: Task) -> None:
        entry = next(e for e in reversed(self.undo) if e[0] == "evict" and e[1] is task)
        prev_status = entry[2]
        assert isinstance(prev_status, PodStatus)
        self._mark_releasing(task, -1)
        self._set_charge(task, PodStatus.RELEASING, prev_status)
        task.status = prev_status
        self._queue_add(task, +1)
        self.undo.append(("unevict", task, prev_status))
        task.job.changes += 1

    def rollback(self, checkpoint: int) -> None:
        while len(self.undo) > checkpoint:
            op, task, prev = self.undo.pop()
            assert isinstance(task, Task)
            task.job.changes += 1
            if op == "alloc":
                assert isinstance(prev, tuple)
                self._queue_add(task, -1)
                self._remove_resources(task)
                task.status, task.node, task.groups = prev
            elif op == "evict":
                assert isinstance(prev, PodStatus)
                self._mark_releasing(task, -1)
                self._set_charge(task, PodStatus.RELEASING, prev)
                task.status = prev
                self._queue_add(task, +1)
            elif op == "status":
                assert isinstance(prev, PodStatus)
                self._set_charge(task, task.status, prev)
                task.status = prev
            elif op == "move":
                assert isinstance(prev, Task)
                copy = prev
                self._queue_add(copy, -1)
                self._remove_resources(copy)
                task.moved = None
                copy.job.tasks.remove(copy)
                for ps in copy.job.podsets.values():
                    if copy in ps.tasks:
                        ps.tasks.remove(copy)
                self.tasks.pop()
            elif op == "unevict":
                self._queue_add(task, -1)
                self._set_charge(task, task.status, PodStatus.RELEASING)
                task.status = PodStatus.RELEASING
                self._mark_releasing(task, +1)

    # ------------------------------------------------------------------ queries
    def free_cpu(self) -> IntArray:
        return self.cap_cpu - self.used_cpu + self.rel_cpu

    def free_gpu(self) -> IntArray:
        return self.cap_gpu - self.used_gpu + self.rel_gpu
