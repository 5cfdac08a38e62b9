"""The session: one cycle's view of the cluster, built from the snapshot and changed by the
actions' virtual decisions. It holds, along KAI's own lines, the nodes and their devices
(`ClusterState`), the queues' accounting (`QueueAccounting`), the jobs and their tasks, and the
Statement that makes and undoes decisions on them (`statement.py`); besides, what the actions
record on the way (why a job failed, why a pod is evicted) and a scratch of values derived once
per session (`scratch.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kai_ray.core.accounting import QueueAccounting, pending_amount
from kai_ray.core.cluster import ClusterState
from kai_ray.core.jobs import JobState, Task
from kai_ray.core.model import (
    ACTIVE_USED,
    QUEUE_ALLOCATED,
    PodStatus,
    Request,
    SchedulerConfig,
    Snapshot,
)
from kai_ray.core.scratch import Scratch
from kai_ray.core.statement import Statement


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


class Session:
    """Cluster, jobs and queues for one cycle, and the Statement that changes them."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig, now: float) -> None:
        self.config = config
        self.now = now
        self.cluster = ClusterState(snapshot.nodes)
        self.queues = QueueAccounting(snapshot)
        self.jobs: dict[str, JobState] = {}
        self.tasks: list[Task] = []
        self.statement = Statement(self.cluster, self.queues, self.tasks)
        self.job_errors: dict[str, JobError] = {}
        self.evict_info: dict[int, EvictInfo] = {}
        # the only nodes placement may use while set, in node order (a victim scenario's)
        self.node_filter: list[int] | None = None
        # what other modules derive once per session, under their own typed keys
        self.scratch = Scratch()
        self._shapes: dict[tuple[Request, tuple[object, ...]], int] = {}  # see `shape_of`
        self._name_rank: dict[str, int] | None = None
        self._order_ranks: tuple[dict[int, int], dict[float, int], int, int] | None = None
        self._load(snapshot)

    def _load(self, snapshot: Snapshot) -> None:
        """The snapshot's jobs and pods as tasks, each on its node and in its queues' numbers.
        A node's GPUs are recounted once it has all its pods, and releasing and pipelined pods
        are charged as such once every pod holds its part (a releasing sharer's device must
        exist to be released)."""
        cluster, node_index = self.cluster, self.cluster.node_index
        gpu_nodes: dict[int, bool] = {}  # GPU nodes, and whether shared devices changed
        releasing: list[Task] = []
        pipelined: list[Task] = []
        for job in snapshot.jobs:
            js = JobState(job)
            self.jobs[job.name] = js
            for pod in job.pods:
                node = node_index.get(pod.node, -1) if pod.node else -1
                task = Task(len(self.tasks), js, pod, node)
                self.tasks.append(task)
                js.tasks.append(task)
                cluster.known_groups.update(task.groups)
                status, req = task.status, task.req
                if node >= 0 and status in ACTIVE_USED:
                    cluster.add_usage(node, req.cpu_m, req.memory, 1)
                    if req.wants_gpu:  # (without GPUs there is nothing to hold)
                        cluster.hold_gpus(task, node, task.groups, status == PodStatus.PIPELINED)
                        gpu_nodes[node] = gpu_nodes.get(node, False) or not req.gpus
                    if status == PodStatus.RELEASING:
                        releasing.append(task)
                    elif status == PodStatus.PIPELINED:
                        pipelined.append(task)
                if status in QUEUE_ALLOCATED:
                    self.queues.load(js, cluster.queue_amount(task), allocated=True)
                elif status == PodStatus.PENDING:
                    self.queues.load(js, pending_amount(req), allocated=False)
                podset = js.podsets.get(task.subgroup)
                if podset is None:
                    # KAI drops a pod whose subgroup is not a leaf of its PodGroup
                    if js.uses_subgroups:
                        continue
                    podset = js.podsets["default"]
                podset.tasks.append(task)
        for node, devices in gpu_nodes.items():
            cluster.refresh_gpu(node, devices=devices)
        for task in releasing:
            cluster.mark_releasing(task, +1)
        for task in pipelined:
            cluster.pipeline_charge(task, +1)

    def shape_of(self, task: Task) -> int:
        """A number per request and constraints: equal numbers, the same request on the same
        nodes. Numbered when first asked (only tasks being placed are: most pods just run)."""
        if task.shape < 0:
            key = (task.req, task.constraints)
            task.shape = self._shapes.setdefault(key, len(self._shapes))
        return task.shape

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
