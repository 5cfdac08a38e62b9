"""allocate: place pending jobs in queue/job order, each gang all or nothing."""

from __future__ import annotations

from kai_ray.core.actions.common import place_tasks
from kai_ray.core.jobs import JobState
from kai_ray.core.ordering import JobQueue
from kai_ray.core.state import JobError, Session


def schedulable_jobs(sess: Session) -> list[JobState]:
    """Jobs any action may consider: a leaf queue that exists, ready, something pending."""
    out = []
    for job in sess.jobs.values():
        if job.has_pending() and sess.queues.is_leaf(job.queue) and job.is_ready():
            out.append(job)
    return out


def run(sess: Session) -> None:
    # Failures for lack of room are monotone within allocate (it only fills nodes), so a job
    # whose task shapes already failed once fails again: skip the node search for it.
    failed_shapes: dict[tuple[int, ...], JobError] = {}
    queue = JobQueue(sess, schedulable_jobs(sess))
    while (job := queue.pop()) is not None:
        tasks = job.tasks_to_allocate()
        if not tasks:
            continue
        shape = tuple(sess.shape_of(t) for t in tasks)  # requests and constraints
        known = failed_shapes.get(shape)
        if known is not None:
            sess.job_errors[job.name] = known
            continue
        if not place_tasks(sess, job, tasks, pipeline_only=False):
            error = sess.job_errors[job.name]
            if error.fit is not None:  # a node-fit failure, not a queue rule
                failed_shapes[shape] = error
            continue
        if job.pending_tasks():
            queue.push(job)
