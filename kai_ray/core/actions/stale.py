"""stalegangeviction: a running gang below its minimum for longer than the grace period is
evicted whole.

Below its minimum means: fewer members running than the podset's ``stale_min``, its minimum or,
when a spec change raised the minimum after the gang started, the lowest minimum it had before
(``Job.admitted_min_member``). A gang is stale when members it was placed with are gone, not when
it is asked for more than it was admitted with: the raised part waits like any pending pod."""

from __future__ import annotations

from functools import partial

from kai_ray.core.jobs import JobState
from kai_ray.core.model import ACTIVE_ALLOCATED, ACTIVE_USED, PodStatus
from kai_ray.core.state import EvictInfo, Session


def _is_stale(job: JobState) -> bool:
    active = 0
    for t in job.tasks:
        if t.status == PodStatus.SUCCEEDED:
            return False
        if t.status in ACTIVE_USED:
            active += 1
    if not active:
        return False
    if not job.uses_subgroups:  # one podset, holding every task: no second pass
        return active < job.podsets["default"].stale_min
    return any(sum(1 for t in ps.tasks if t.status in ACTIVE_USED) < ps.stale_min
               for ps in job.podsets.values())


def run(sess: Session, stale_set: dict[str, float], stale_cleared: list[str]) -> None:
    grace = sess.config.staleness_grace_period_s
    for job in sess.jobs.values():
        if not _is_stale(job):
            if job.stale_since is not None:
                stale_cleared.append(job.name)
            continue
        if job.stale_since is None:
            stale_set[job.name] = sess.now
            continue
        if grace < 0 or sess.now - job.stale_since < grace:
            continue
        minimum = sum(ps.min_member for ps in job.podsets.values())
        for task in job.tasks:
            if task.status in ACTIVE_ALLOCATED and task.moved is None:
                sess.statement.evict(task)
                message = (f"Workload doesn't meet the minimum required number of pods "
                           f"({minimum}), evicting remaining pod: {task.namespace}/{task.name}")
                sess.evict_info[task.idx] = EvictInfo("stalegangeviction", None,
                                                      partial(str, message))
