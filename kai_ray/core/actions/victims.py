"""Victim units: what of a victim job is still there to take, and in which pieces (KAI clones
the victim job with those tasks), and the victim candidates of a set of jobs."""

from __future__ import annotations

from collections.abc import Iterable

from kai_ray.core.jobs import JobState, Task
from kai_ray.core.model import QUEUE_ALLOCATED, Amounts, PodStatus
from kai_ray.core.state import Session

_VICTIM_STATES = (PodStatus.ALLOCATED, PodStatus.BINDING, PodStatus.BOUND, PodStatus.RUNNING)


class VictimUnit:
    """Part of a victim job still available to take (KAI clones the job with these tasks)."""

    __slots__ = ("amount", "by_set", "job", "key", "number", "tasks")

    def __init__(self, job: JobState, tasks: list[Task]) -> None:
        self.job = job
        self.tasks = tasks
        by_set: dict[str, list[Task]]
        if not job.uses_subgroups:
            by_set = {"default": list(tasks)}  # the one podset (most jobs)
        else:
            by_set = {name: [] for name in job.podsets}
            default = by_set.get("default")
            for t in tasks:
                into = by_set.get(t.subgroup, default)
                if into is not None:  # a pod of no podset counts in none
                    into.append(t)
        self.by_set = by_set
        self.key = (-job.priority, self._rank(), job.created, job.name)

    @property
    def queue(self) -> str:
        return self.job.queue

    def _rank(self) -> int:
        at_min = True
        for name, ps in self.job.podsets.items():
            count = len(self.by_set[name])
            if count < ps.min_member:
                return 0
            if count > ps.min_member:
                at_min = False
        return 1 if at_min else 2

    def order_number(self, sess: Session) -> int:
        return sess.order_number(self.key)

    def victim_amount(self) -> Amounts:
        """What the victim order counts as gone from the queue with this unit: all its tasks a
        queue's allocation counts, not just those the next take evicts (KAI subtracts the
        popped or peeked job clone's `Allocated`: a pipelined pod counts nothing). The same
        whenever asked during one victim order: every scenario is rolled back before the next
        pop, so its tasks' states do not change meanwhile (the Rust core counts it later)."""
        cpu = mem = 0
        gpu = 0.0
        # added one by one, as the Rust core does (Python 3.12's float `sum` compensates)
        for t in self.tasks:
            if t.status in QUEUE_ALLOCATED:
                cpu += t.req.cpu_m
                mem += t.req.memory
                gpu += t.accepted_gpu
        return (float(cpu), float(mem), gpu)

    def take_unrecorded(self, recorded: set[int]) -> tuple[list[Task], VictimUnit | None]:
        """`take` when the tasks whose ids are in `recorded` are already victims: if the next
        take would touch one, nothing is taken and what is left is the unit without them."""
        taken, rest = self.take()
        if not any(id(t) in recorded for t in taken):
            return taken, rest
        remaining = [t for t in self.tasks if id(t) not in recorded]
        return [], (VictimUnit(self.job, remaining) if remaining else None)

    def take(self) -> tuple[list[Task], VictimUnit | None]:
        """Tasks to evict next: one extra task of a podset above its minimum (with the other
        hosts of its replica: a replica is never split), else all."""
        if len(self.tasks) == 1:
            return list(self.tasks), None  # taking its one task leaves nothing either way
        above = [(name, ts) for name, ts in self.by_set.items()
                 if len(ts) > self.job.podsets[name].min_member]
        if above:
            # a minimum of 0 (an all-elastic podset) counts as 1 in the ratio
            _, ts = max(above, key=lambda item: (
                len(item[1]) / max(self.job.podsets[item[0]].min_member, 1), item[0]))
            victim = max(ts, key=Task.sort_key)
            replica = victim.pod.replica
            taken = [victim] if replica is None else [t for t in ts if t.pod.replica == replica]
            rest = [t for t in self.tasks if all(t is not v for v in taken)]
            return taken, (VictimUnit(self.job, rest) if rest else None)
        return list(self.tasks), None


def victim_units(jobs: Iterable[JobState]) -> list[VictimUnit]:
    """Victim candidates: pods placed when the cycle began, and pods pipelined in this cycle
    (KAI's active-allocated pods: a pipelined pod taken back is not bound; it stays pending, and
    the cycle reports it neither pipelined nor evicted). A pod allocated in this cycle is not: it
    is bound when the cycle ends, and a later action of the same cycle taking it back would split
    its gang's first bind or evict what was just bound (KAI binds it and evicts it)."""
    return [unit for job in jobs if (unit := unit_of(job)) is not None]


def unit_of(job: JobState) -> VictimUnit | None:
    tasks = [t for t in job.tasks if t.status == PodStatus.PIPELINED or (
        t.status in _VICTIM_STATES and t.moved is None and t.orig_status in _VICTIM_STATES)]
    return VictimUnit(job, tasks) if tasks else None
