"""The victim solver shared by reclaim, preempt and consolidation (kai-spec §6.4).

For a pending job it grows prefixes of its tasks-to-allocate. Each prefix starts from the victims
recorded for the previous one and adds potential victims in victim order, one job (or one extra
task of an elastic job) at a time; every scenario evicts the recorded victims plus the potential
victims on one node of the latest one, then places the preemptor and the victims again
(pipeline only): a victim that fits back where it was is left alone, one placed elsewhere is
moved, one not placed stays evicted. An action-specific validator accepts or rejects the scenario.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kai_ray.core.actions.common import place_tasks
from kai_ray.core.model import PodStatus
from kai_ray.core.ordering import JobQueue
from kai_ray.core.state import EvictInfo, JobState, Session, Task

_VICTIM_STATES = (PodStatus.ALLOCATED, PodStatus.BINDING, PodStatus.BOUND, PodStatus.RUNNING)


@dataclass
class VictimUnit:
    """Part of a victim job still available to take (KAI clones the job with these tasks)."""

    job: JobState
    tasks: list[Task]

    @property
    def queue(self) -> str:
        return self.job.queue

    def _rank(self) -> int:
        at_min = True
        for ps in self.job.podsets.values():
            count = sum(1 for t in self.tasks if t in ps.tasks)
            if count < ps.min_member:
                return 0
            if count > ps.min_member:
                at_min = False
        return 1 if at_min else 2

    def order_key(self) -> tuple[int, int, float, str]:
        return (-self.job.priority, self._rank(), self.job.created, self.job.name)

    def taken_amount(self) -> tuple[float, float, float]:
        """What the queue loses when this unit is taken (its next tasks to evict)."""
        taken, _ = self.take()
        amounts = [self.job_sess_amount(t) for t in taken]
        return (sum(a[0] for a in amounts), sum(a[1] for a in amounts),
                sum(a[2] for a in amounts))

    def job_sess_amount(self, task: Task) -> tuple[float, float, float]:
        return (float(task.req.cpu_m), float(task.req.memory), task.accepted_gpu)

    def take(self) -> tuple[list[Task], VictimUnit | None]:
        """Tasks to evict next: one extra task of a podset above its minimum, else all."""
        by_set = [(ps, [t for t in self.tasks if t in ps.tasks])
                  for ps in self.job.podsets.values()]
        above = [(ps, ts) for ps, ts in by_set if len(ts) > ps.min_member]
        if above:
            _, ts = max(above, key=lambda item: (len(item[1]) / item[0].min_member, item[0].name))
            victim = max(ts, key=Task.sort_key)
            rest = [t for t in self.tasks if t is not victim]
            return [victim], VictimUnit(self.job, rest)
        return list(self.tasks), None


Validator = Callable[[list[Task], list[Task]], bool]


@dataclass
class Solution:
    victims: list[Task]  # evicted for good (Releasing)
    moved: list[Task]  # re-placed elsewhere (Pipelined copies)


def victim_units(jobs: Iterable[JobState]) -> list[VictimUnit]:
    units = []
    for job in jobs:
        tasks = [t for t in job.tasks if t.status in _VICTIM_STATES and t.moved is None]
        if tasks:
            units.append(VictimUnit(job, tasks))
    return units


class Solver:
    def __init__(self, sess: Session, action: str, candidates: Callable[[], list[JobState]],
                 validator: Validator, message: Callable[[Task, JobState], str]) -> None:
        self.sess = sess
        self.action = action
        self.candidates = candidates
        self.validator = validator
        self.message = message

    def solve(self, job: JobState) -> bool:
        """Try to make room for `job`; on success the winning scenario stays applied."""
        sess = self.sess
        tasks = job.tasks_to_allocate()
        if not tasks:
            return False
        base = sess.checkpoint()
        active_before = job.active_count()
        recorded: list[Task] = []
        solved = False
        for k in range(1, len(tasks) + 1):
            victims = self._solve_prefix(job, tasks[:k], recorded)
            if victims is None:
                break
            recorded = victims
            solved = k == len(tasks)
            if not solved:
                sess.rollback(base)
        if solved and job.gang_satisfied() and job.active_count() > active_before:
            return True
        sess.rollback(base)
        return False

    def _solve_prefix(self, job: JobState, prefix: list[Task], recorded: list[Task]
                      ) -> list[Task] | None:
        if recorded:
            result = self._try(job, prefix, recorded)
            if result is not None:
                return result
        recorded_set = {id(t) for t in recorded}
        queue = JobQueue(self.sess, victim_units(self.candidates()), reverse=True)
        potential: list[Task] = []
        while (unit := queue.pop()) is not None:
            taken, rest = unit.take()
            if any(id(t) in recorded_set for t in taken):
                remaining = [t for t in unit.tasks if id(t) not in recorded_set]
                if remaining:
                    queue.push(VictimUnit(unit.job, remaining))
                continue
            if rest is not None:
                queue.push(rest)
            potential.extend(taken)
            for node in sorted({t.node for t in taken}):
                scenario = recorded + [t for t in potential if t.node == node]
                result = self._try(job, prefix, scenario)
                if result is not None:
                    return result
        return None

    def _try(self, job: JobState, prefix: list[Task], victims: list[Task]) -> list[Task] | None:
        """Simulate one scenario. On success the state stays applied and the victims that
        matter (evicted or moved) are returned."""
        sess = self.sess
        checkpoint = sess.checkpoint()
        for task in victims:
            sess.evict(task)
            sess.evict_info[task.idx] = EvictInfo(self.action, self.message(task, job), job.name)
        victim_jobs = list({id(t.job): t.job for t in victims}.values())
        order: JobQueue[JobState] = JobQueue(sess, [job, *victim_jobs], simulation=True)
        while (next_job := order.pop()) is not None:
            if next_job is job:
                pending = [t for t in prefix if t.status == PodStatus.PENDING]
                if not place_tasks(sess, job, pending, pipeline_only=True, record=False):
                    sess.rollback(checkpoint)
                    return None
                continue
            again = next_job.tasks_to_allocate(simulation=True)
            if again:
                place_tasks(sess, next_job, again, pipeline_only=True, record=False)
        evicted = [t for t in victims if t.status == PodStatus.RELEASING and t.moved is None]
        moved = [t for t in victims if t.moved is not None]
        if not self.validator(evicted, moved):
            sess.rollback(checkpoint)
            return None
        return evicted + moved
