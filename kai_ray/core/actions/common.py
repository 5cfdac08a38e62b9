"""What every action shares: placing a job's tasks as one gang, and recording why not."""

from __future__ import annotations

from kai_ray.core import placement
from kai_ray.core.capacity import check_job, job_level_request
from kai_ray.core.jobs import JobState, Task
from kai_ray.core.model import PodStatus
from kai_ray.core.state import JobError, Session


def job_label(namespace: str, name: str) -> str:
    """A job as messages name it: `namespace/name`, or its name alone when that is already a
    job key (`namespace/name`, as kai-ray run's watch cache names jobs)."""
    return name if "/" in name else f"{namespace}/{name}"


def record_error(sess: Session, job: JobState, reason: str, message: str,
                 fit: dict[str, int] | None = None) -> None:
    sess.job_errors[job.name] = JobError(reason, message, fit)


def fit_message(reasons: dict[str, int]) -> str:
    parts = [f"{count} node(s) {reason}" for reason, count in sorted(reasons.items())]
    if not parts:
        return "no nodes are available"
    return "no nodes with enough resources were found: " + ", ".join(parts) + "."


def gang_message(job: JobState, placed: int, needed: int, task: Task, reasons: dict[str, int]
                 ) -> str:
    detail = fit_message(reasons)
    if len(job.tasks) == 1:
        return f"Resources were not found for pod {task.namespace}/{task.name} due to: {detail}"
    return (f"Resources were found for {placed} pods while {needed} are required for gang "
            f"scheduling. Additional pods cannot be scheduled due to: {detail}")


def place_tasks(sess: Session, job: JobState, tasks: list[Task], pipeline_only: bool,
                record: bool = True) -> bool:
    """Place `tasks` all or nothing (KAI AllocateJob): queue capacity first, then nodes.
    On failure nothing is left behind."""
    error = check_job(sess, job, job_level_request(sess, tasks))
    if error is not None:
        if record:
            record_error(sess, job, error.reason, error.message)
        return False
    checkpoint = sess.statement.checkpoint()
    placed: list[Task] = []
    for task in tasks:
        choice, reasons = placement.choose(sess, task, explain=record)
        if choice is None:
            sess.statement.rollback(checkpoint)
            if record:
                record_error(sess, job, "Unschedulable",
                             gang_message(job, len(placed), len(tasks), task, reasons), reasons)
            return False
        pipelined = pipeline_only or not choice.on_idle
        sess.statement.allocate(task, choice.node, choice.groups, pipelined=pipelined)
        placed.append(task.moved or task)
    if not pipeline_only:
        _pipeline_whole_gang_if_needed(sess, job, placed)
    return True


def _pipeline_whole_gang_if_needed(sess: Session, job: JobState, placed: list[Task]) -> None:
    """If a podset has a pod waiting for releasing resources (pipelined by this attempt or by an
    earlier one of the same job) while it is still below its minimum counting only really
    allocated pods, the whole attempt waits (is pipelined): an extra pod must not start while
    its gang still waits (KAI ShouldPipelineJob)."""
    for ps in job.podsets.values():
        if not any(t.status == PodStatus.PIPELINED for t in ps.tasks):
            continue
        bound = sum(1 for t in ps.tasks if t.status in (PodStatus.ALLOCATED, PodStatus.BINDING,
                                                         PodStatus.BOUND, PodStatus.RUNNING))
        if bound < ps.min_member:
            for t in placed:
                if t.status == PodStatus.ALLOCATED:
                    sess.statement.set_status(t, PodStatus.PIPELINED)
            return
