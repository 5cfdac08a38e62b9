"""The session's virtual decisions and their undo (KAI's Statement): allocate or pipeline a task,
evict one, switch one between allocated and pipelined, and roll all of it back to a checkpoint,
so a gang that does not fit, or a victim scenario that does not work, leaves no trace.

Every decision moves the task's resources on its node (`ClusterState`) and its queues' charge
(`QueueAccounting`) together."""

from __future__ import annotations

import dataclasses

from kai_ray.core.accounting import QueueAccounting
from kai_ray.core.cluster import ClusterState
from kai_ray.core.jobs import Task
from kai_ray.core.model import PodStatus

# (what, task, what to restore): "alloc" (status, node, devices before), "move" (the copy),
# "status" / "evict" / "unevict" (the status before)
Undo = tuple[str, Task, object]


class Statement:
    """Decisions on `tasks` (the session's: a moved victim's copy is appended to it)."""

    def __init__(self, cluster: ClusterState, queues: QueueAccounting, tasks: list[Task]) -> None:
        self.cluster, self.queues, self.tasks = cluster, queues, tasks
        self.undo: list[Undo] = []

    def checkpoint(self) -> int:
        return len(self.undo)

    def _charge(self, task: Task, sign: int) -> None:
        self.queues.charge(task.job, self.cluster.queue_amount(task), sign)

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
        self.cluster.place(task, node, groups, pipelined)
        task.status = PodStatus.PIPELINED if pipelined else PodStatus.ALLOCATED
        self._charge(task, +1)
        self.undo.append(("alloc", task, prev))

    def _move(self, task: Task, node: int, groups: tuple[str, ...]) -> None:
        """A victim placed elsewhere: it keeps releasing where it is, and a pipelined copy
        (`task.moved`, pointing back through `origin`) holds the new place."""
        pod = dataclasses.replace(task.pod, status=PodStatus.PENDING, node=None, gpu_groups=())
        copy = Task(len(self.tasks), task.job, pod, -1)
        copy.origin = task
        copy.shape = task.shape
        self.tasks.append(copy)
        task.job.tasks.append(copy)
        podset = task.job.podsets.get(task.subgroup) or task.job.podsets["default"]
        podset.tasks.append(copy)
        task.moved = copy
        self.cluster.place(copy, node, groups, True)
        copy.status = PodStatus.PIPELINED
        self._charge(copy, +1)
        self.undo.append(("move", task, copy))

    def set_status(self, task: Task, status: PodStatus) -> None:
        """Switch between Allocated and Pipelined (same resources, same queue charge; the
        node charge moves between idle and releasing)."""
        self.undo.append(("status", task, task.status))
        self.cluster.set_charge(task, task.status, status)
        task.status = status

    def evict(self, task: Task) -> None:
        prev = task.status
        self._to_releasing(task)
        self.undo.append(("evict", task, prev))

    def unevict(self, task: Task) -> None:
        entry = next(e for e in reversed(self.undo) if e[0] == "evict" and e[1] is task)
        prev_status = entry[2]
        assert isinstance(prev_status, PodStatus)
        self._from_releasing(task, prev_status)
        self.undo.append(("unevict", task, prev_status))

    def _to_releasing(self, task: Task) -> None:
        """Off its queues' charge, its node's resources counted as releasing."""
        self._charge(task, -1)
        self.cluster.set_charge(task, task.status, PodStatus.RELEASING)
        task.status = PodStatus.RELEASING
        self.cluster.mark_releasing(task, +1)

    def _from_releasing(self, task: Task, status: PodStatus) -> None:
        """`_to_releasing` undone: back to `status` and its queues' charge."""
        self.cluster.mark_releasing(task, -1)
        self.cluster.set_charge(task, PodStatus.RELEASING, status)
        task.status = status
        self._charge(task, +1)

    def rollback(self, checkpoint: int) -> None:
        cluster = self.cluster
        while len(self.undo) > checkpoint:
            op, task, prev = self.undo.pop()
            if op == "alloc":
                assert isinstance(prev, tuple)
                self._charge(task, -1)
                cluster.remove(task)
                task.status, task.node, task.groups = prev
            elif op == "evict":
                assert isinstance(prev, PodStatus)
                self._from_releasing(task, prev)
            elif op == "status":
                assert isinstance(prev, PodStatus)
                cluster.set_charge(task, task.status, prev)
                task.status = prev
            elif op == "move":
                assert isinstance(prev, Task)
                copy = prev
                self._charge(copy, -1)
                cluster.remove(copy)
                task.moved = None
                copy.job.tasks.remove(copy)
                for ps in copy.job.podsets.values():
                    if copy in ps.tasks:
                        ps.tasks.remove(copy)
                self.tasks.pop()
            elif op == "unevict":
                self._to_releasing(task)
