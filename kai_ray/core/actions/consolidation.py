"""consolidation: move preemptible jobs (no net eviction) to open room for a pending
preemptible job."""

from __future__ import annotations

from itertools import islice

from kai_ray.core.actions.allocate import schedulable_jobs
from kai_ray.core.actions.solver import FailedJobs, Solver, gpu_sums
from kai_ray.core.jobs import JobState, Task
from kai_ray.core.ordering import JobQueue, job_request
from kai_ray.core.state import Session


def _message(task: Task, preemptor: JobState) -> str:
    return (f"Pod {task.namespace}/{task.name} was preempted and rescheduled due to bin packing "
            "(resource consolidation) procedure")


def run(sess: Session) -> None:
    limit = sess.config.max_consolidation_preemptees
    if limit == 0 or sess.config.placement.gpu == "spread" or sess.config.placement.cpu == "spread":
        return
    failed = FailedJobs()
    queue = JobQueue(sess, [j for j in schedulable_jobs(sess) if j.preemptible])
    while (job := queue.pop()) is not None:
        if failed.should_skip(job, "cluster"):
            continue
        if not job.tasks_to_allocate():
            continue
        if job_request(sess, job)[2] > _free_gpus(sess) + 1e-9:
            # a failed attempt like any other: a look-alike is skipped (consolidation.go)
            failed.record(job, "cluster")
            continue

        def candidates(job: JobState = job) -> list[JobState]:
            pool = (v for v in sess.jobs.values()
                    if v is not job and v.preemptible and v.active_count() > 0)
            # the first limit + 1 in job order: no need to look at the others
            return list(pool) if limit < 0 else list(islice(pool, limit + 1))

        solver = Solver(sess, "consolidation", candidates,
                        lambda evicted, moved: not evicted, _message)
        if not solver.solve(job):
            failed.record(job, "cluster")
        # a job that got room is not tried again this action (KAI: only allocate pushes a job
        # with tasks left back into its queue)


def _free_gpus(sess: Session) -> float:
    """KAI's allocatable GPUs (IsEnoughGPUsAllocatableForJob): every schedulable node's idle
    and releasing GPU sums."""
    idle, releasing = gpu_sums(sess)
    return float((idle + releasing)[sess.cluster.schedulable].sum()) / 100
