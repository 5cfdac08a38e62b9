"""preempt: inside one queue, a job evicts strictly lower-priority preemptible jobs
(as KAI)."""

from __future__ import annotations

from kai_ray.core.actions.allocate import schedulable_jobs
from kai_ray.core.actions.common import job_label
from kai_ray.core.actions.runtime import protected
from kai_ray.core.actions.solver import FailedJobs, Solver
from kai_ray.core.capacity import check_non_preemptible, job_level_request
from kai_ray.core.jobs import JobState, Task
from kai_ray.core.ordering import JobQueue
from kai_ray.core.state import Session


def _message(task: Task, preemptor: JobState) -> str:
    return (f"Pod {task.namespace}/{task.name} was preempted by higher priority workload "
            f"{job_label(preemptor.namespace, preemptor.name)}")


def run(sess: Session) -> None:
    failed = FailedJobs()
    queue = JobQueue(sess, schedulable_jobs(sess))
    in_queue: dict[str, list[JobState]] = {}  # victims come from the preemptor's queue only
    for v in sess.jobs.values():
        in_queue.setdefault(v.queue, []).append(v)
    while (job := queue.pop()) is not None:
        if failed.should_skip(job, job.queue):
            continue
        tasks = job.tasks_to_allocate()
        if not tasks:
            continue
        if not job.preemptible and check_non_preemptible(
                sess, job, job_level_request(sess, tasks)) is not None:
            # a failed attempt like any other: a look-alike is skipped (preempt.go)
            failed.record(job, job.queue)
            continue

        def candidates(job: JobState = job) -> list[JobState]:
            return [v for v in in_queue.get(job.queue, ())
                    if v is not job and v.preemptible
                    and v.priority < job.priority and not protected(sess, v, "preempt")]

        solver = Solver(sess, "preempt", candidates, lambda evicted, moved: True, _message)
        if not solver.solve(job):
            failed.record(job, job.queue)
        # a job that got room is not tried again this action (KAI: only allocate pushes a job
        # with tasks left back into its queue)
