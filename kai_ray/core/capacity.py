"""Queue capacity rules that block allocation: limits (OverLimit) and, for non-preemptible jobs,
quota at every level (NonPreemptibleOverQuota). Messages are KAI's."""

from __future__ import annotations

from dataclasses import dataclass

from kai_ray.core.jobs import JobState, Task
from kai_ray.core.model import Amounts
from kai_ray.core.state import Session

OVER_LIMIT = "OverLimit"
NON_PREEMPTIBLE_OVER_QUOTA = "NonPreemptibleOverQuota"
QUEUE_DOES_NOT_EXIST = "QueueDoesNotExist"

_NAMES = ("CPU cores", "GB memory", "GPUs")
_SCALE = (1000.0, 1e9, 1.0)  # queue units -> displayed units


@dataclass(frozen=True, slots=True)
class CapacityError:
    reason: str
    message: str
    queue: str


def _fmt(value: float, r: int) -> str:
    shown = value / _SCALE[r]
    return f"{shown:g}" if r != 2 else f"{round(shown, 2):g}"


def job_level_request(sess: Session, tasks: list[Task]) -> Amounts:
    """Sum of the tasks' requests as the capacity policy sees them: gpu-memory tasks count 0 GPU
    at job level (KAI's capacity_policy quirk)."""
    cpu = mem = gpu = 0.0
    for t in tasks:
        cpu += t.req.cpu_m
        mem += t.req.memory
        if t.req.gpus:
            gpu += t.req.gpus
        elif t.req.gpu_fraction_milli:
            gpu += t.req.gpu_fraction_milli / 1000 * t.req.fraction_devices
    return (cpu, mem, gpu)


def check_job(sess: Session, job: JobState, request: Amounts
              ) -> CapacityError | None:
    for q in sess.queues.path(job.queue):
        for r in (2, 0, 1):
            if q.limit[r] == -1 or request[r] <= 0:
                continue
            if q.limit[r] < q.allocated[r] + request[r] - 1e-9:
                unit = _NAMES[r]
                return CapacityError(
                    OVER_LIMIT,
                    f"{q.name} quota has reached the allowable limit of {unit}. "
                    f"Limit is {_fmt(q.limit[r], r)} {unit}, currently "
                    f"{_fmt(q.allocated[r], r)} {unit} allocated and workload requested "
                    f"{_fmt(request[r], r)} {unit}", q.name)
    if not job.preemptible:
        return check_non_preemptible(sess, job, request)
    return None


def check_non_preemptible(sess: Session, job: JobState, request: Amounts
                          ) -> CapacityError | None:
    for q in sess.queues.path(job.queue):
        for r in (2, 0, 1):
            if q.deserved[r] == -1 or request[r] <= 0:
                continue
            if q.allocated_np[r] + request[r] > q.deserved[r] + 1e-9:
                unit = _NAMES[r]
                return CapacityError(
                    NON_PREEMPTIBLE_OVER_QUOTA,
                    f"Non-preemptible workload is over quota. Workload requested "
                    f"{_fmt(request[r], r)} {unit}, but {q.name} quota is "
                    f"{_fmt(q.deserved[r], r)} {unit}, while {_fmt(q.allocated_np[r], r)} {unit} "
                    f"are already allocated for non-preemptible pods. Use a preemptible workload "
                    f"to go over quota.", q.name)
    return None
