"""reclaim: a queue below its fair share takes resources back from queues above theirs
(as KAI)."""

from __future__ import annotations

import math

from kai_ray.core.accounting import QueueState, leq
from kai_ray.core.actions.allocate import schedulable_jobs
from kai_ray.core.actions.common import job_label
from kai_ray.core.actions.runtime import protected
from kai_ray.core.actions.solver import FailedJobs, Solver
from kai_ray.core.jobs import JobState, Task
from kai_ray.core.ordering import JobQueue, job_request
from kai_ray.core.state import Session

# per-resource amounts being added up (cpu, memory, GPUs): lists, changed in place
Resources = list[float]


def _fmt_res(v: Resources) -> str:
    return f"CPU: {v[0] / 1000:g} (cores), memory: {v[1] / 1e9:g} (GB), Gpus: {v[2]:g}"


def can_reclaim(sess: Session, job: JobState, request: tuple[float, float, float]) -> bool:
    q = sess.queues[job.queue]
    with_job = [q.allocated[r] + request[r] for r in range(3)]
    if not leq(with_job, q.fair_share):
        return False
    if job.preemptible:
        return True
    np_with = [q.allocated_np[r] + request[r] for r in range(3)]
    return leq(np_with, q.deserved)


class _Copy:
    """Queue numbers frozen when the job's attempt starts (KAI clones its queue attributes)."""

    def __init__(self, sess: Session) -> None:
        self.allocated = {n: list(q.allocated) for n, q in sess.queues.items()}
        self.allocated_np = {n: list(q.allocated_np) for n, q in sess.queues.items()}


def _path_root_first(sess: Session, queue: str) -> list[QueueState]:
    return list(reversed(sess.queues.path(queue)))


def _leveled(sess: Session, reclaimer: str, victim: str) -> tuple[QueueState, QueueState]:
    a, b = _path_root_first(sess, reclaimer), _path_root_first(sess, victim)
    ra, rb = a[0], b[0]
    for i in range(min(len(a), len(b))):
        ra, rb = a[i], b[i]
        if ra.name != rb.name:
            break
    return ra, rb


def _involved(amount: Resources) -> set[int]:
    return {r for r in range(3) if amount[r] > 0}


def _ratio(allocated: float, fair: float) -> float:
    if fair == 0:
        return math.inf if allocated > 0 else 0.0
    if fair == -1:
        return 0.0
    return allocated / fair


def reclaimable(sess: Session, copy: _Copy, job: JobState, request: Resources,
                evicted: list[Task]) -> bool:
    """KAI's reclaim validation on the queue numbers frozen at the attempt's start: whether the
    victims may be taken (no victim-side queue would go below its share, and the reclaimer's
    side stays within what it may reach)."""
    chunks_by_queue: dict[str, list[Resources]] = {}
    for victim_job in {id(t.job): t.job for t in evicted}.values():
        tasks = [t for t in evicted if t.job is victim_job]
        core: Resources = [0.0, 0.0, 0.0]
        has_core = False
        chunks = chunks_by_queue.setdefault(victim_job.queue, [])
        for ps in victim_job.podsets.values():
            in_set = [t for t in tasks if t in ps.tasks]
            for i, t in enumerate(in_set):
                amount = list(sess.cluster.queue_amount(t))
                if i < ps.min_member:
                    core = [core[r] + amount[r] for r in range(3)]
                    has_core = True
                else:
                    chunks.append(amount)
        if has_core:
            chunks.append(core)
    remaining: dict[str, Resources] = {}
    involved: dict[str, set[int]] = {}
    for victim_queue, chunks in chunks_by_queue.items():
        rq, vq = _leveled(sess, job.queue, victim_queue)
        involved[victim_queue] = set().union(*(_involved(c) for c in chunks))
        rem = remaining.setdefault(vq.name, list(copy.allocated[vq.name]))
        for chunk in chunks:
            if not _fits_strategy(copy, request, rq, vq, rem):
                return False
            for q in sess.queues.path(victim_queue):
                left = remaining.setdefault(q.name, list(copy.allocated[q.name]))
                for r in range(3):
                    left[r] -= chunk[r]
                involved.setdefault(q.name, set()).update(involved[victim_queue])
    reclaimer_involved = _involved(request)
    mult = sess.config.reclaimer_saturation_multiplier
    for q in sess.queues.path(job.queue):
        base = remaining.get(q.name, copy.allocated[q.name])
        with_request = [base[r] + request[r] for r in range(3)]
        for sib_name, sib_left in remaining.items():
            sib = sess.queues[sib_name]
            if sib.parent != q.parent or sib.name == q.name:
                continue
            for r in involved.get(sib_name, set()) | reclaimer_involved:
                if q.fair_share[r] == -1 and sib.fair_share[r] == -1:
                    continue
                mine_ratio = _ratio(with_request[r], q.fair_share[r])
                sib_ratio = _ratio(sib_left[r], sib.fair_share[r])
                if mine_ratio > 1 and sib.fair_share[r] > 0 and mine_ratio * mult >= sib_ratio:
                    return False
        if not job.preemptible:
            np_with = [copy.allocated_np[q.name][r] + request[r] for r in range(3)]
            if not leq(np_with, q.deserved):
                return False
    return True


def _fits_strategy(copy: _Copy, request: Resources, rq: QueueState, vq: QueueState,
                   remaining: Resources) -> bool:
    allocatable = [vq.allocatable(r) for r in range(3)]
    if not leq(remaining, allocatable):
        return True  # MaintainFairShare: the victim side is still above its share
    reclaimer_with = [copy.allocated[rq.name][r] + request[r] for r in range(3)]
    return leq(reclaimer_with, rq.deserved) and not leq(remaining, vq.deserved)


def _message(sess: Session, task: Task, reclaimer: JobState) -> str:
    vq, rq = sess.queues[task.job.queue], sess.queues[reclaimer.queue]
    if vq.parent != rq.parent:
        vq = sess.queues.get(vq.parent or "", vq)
        rq = sess.queues.get(rq.parent or "", rq)
    lines = [f"Pod {task.namespace}/{task.name} was preempted by workload "
             f"{job_label(reclaimer.namespace, reclaimer.name)}."]
    for q in (vq, rq):
        lines.append(f"{q.name} uses <{_fmt_res(q.allocated)}> with a quota of "
                     f"<{_fmt_res(q.deserved)}>, fair-share of <{_fmt_res(q.fair_share)}> and "
                     f"queue priority of {q.priority}.")
    return "\n".join(lines)


def run(sess: Session) -> None:
    failed = FailedJobs()
    queue = JobQueue(sess, schedulable_jobs(sess))
    while (job := queue.pop()) is not None:
        if failed.should_skip(job, job.queue):
            continue
        if not job.tasks_to_allocate():
            continue
        request = job_request(sess, job)
        if not can_reclaim(sess, job, request):
            continue
        copy = _Copy(sess)
        req = list(request)

        def candidates(job: JobState = job) -> list[JobState]:
            own, queues = job.queue, sess.queues  # locals: a pass over every job
            return [v for v in sess.jobs.values()
                    if v.preemptible and v.queue != own and v.queue in queues
                    and not protected(sess, v, "reclaim", reclaimer_queue=own)]

        def validate(evicted: list[Task], moved: list[Task], job: JobState = job,
                     copy: _Copy = copy, req: Resources = req) -> bool:
            counted = evicted if sess.config.allow_consolidating_reclaim else evicted + moved
            return reclaimable(sess, copy, job, req, counted)

        solver = Solver(sess, "reclaim", candidates, validate,
                        lambda task, preemptor: _message(sess, task, preemptor))
        if not solver.solve(job):
            failed.record(job, job.queue)
        # a job that got room is not tried again this action (KAI: only allocate pushes a job
        # with tasks left back into its queue)
