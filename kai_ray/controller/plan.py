"""What one cycle's decisions mean for the cluster, worked out before anything is written.

`plan_cycle` is a pure function of the core's result, the snapshot it decided on and the cached
objects: which RayJobs are suspended instead of having their gang evicted, which suspended ones
are resumed (their stand-in pods fit), which jobs start now (their last-start time is stamped
with their binds), and the result the loop applies: the core's own, less the stand-in binds
(nothing to bind: KubeRay recreates the pods), with the gangs that wait on pods backing off
after a failed bind saying so. The core's result is never edited: the plan holds a new one.
The loop (scheduler_loop.py) then applies the plan, each kind of write as its own step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kai_ray.core.model import ACTIVE_ALLOCATED, Snapshot
from kai_ray.core.result import CycleResult, Evict
from kai_ray.k8s.suspend import DEMAND_ANNOTATION, wants_suspend

Obj = dict[str, Any]


@dataclass(frozen=True)
class Suspension:
    """A RayJob whose whole running gang the core evicts: suspended instead (KubeRay stops its
    pods); should that write fail, its pods are evicted as the core decided."""

    podgroup: Obj
    pods: tuple[Obj, ...]  # the gang's pods, for the events
    message: str
    evictions: tuple[Evict, ...]

    @property
    def pod_keys(self) -> frozenset[str]:
        return frozenset(f"{e.namespace}/{e.pod}" for e in self.evictions)


@dataclass(frozen=True)
class BackOff:
    """Pods that wait after a failed bind: key -> (not before (monotonic), give-ups so far)
    and the binder's last give-up message for each."""

    until: Mapping[str, tuple[float, int]]
    why: Mapping[str, str]


@dataclass(frozen=True)
class CyclePlan:
    result: CycleResult  # what is applied (a new object: the core's result is left as it was)
    suspensions: tuple[Suspension, ...]
    resumptions: tuple[Obj, ...]  # PodGroups of suspended RayJobs whose stand-ins fit
    starting: frozenset[str]  # jobs that start now


# a pod whose bind failed for good waits this long before it is scheduled again, doubling
# with each give-up (kube-scheduler's unschedulable-pod back-off has the same shape)
BACKOFF_SECONDS = (10.0, 300.0)


def backoff_seconds(give_ups: int) -> float:
    """The back-off after a pod's `give_ups`-th given-up bind: doubling, capped."""
    return float(min(BACKOFF_SECONDS[1], BACKOFF_SECONDS[0] * 2 ** max(0, give_ups - 1)))


def plan_cycle(result: CycleResult, snapshot: Snapshot, podgroups: Mapping[str, Obj],
               pods: Mapping[str, Obj], backoff: BackOff, now: float) -> CyclePlan:
    """The cycle's effects (module doc); `now`: the monotonic clock of `backoff`."""
    stand_ins = [b for b in result.binds if f"{b.namespace}/{b.pod}" not in pods
                 and DEMAND_ANNOTATION in ((podgroups.get(b.job) or {}).get("metadata")
                                           or {}).get("annotations", {})]
    binds = [b for b in result.binds if b not in stand_ins]
    bound_jobs = {b.job for b in binds}
    applied = dataclasses.replace(
        result, binds=binds, job_status=_with_backoff(result, snapshot, backoff, now),
        action_seconds=dict(result.action_seconds))
    return CyclePlan(
        result=applied,
        suspensions=_suspensions(result, snapshot, podgroups, pods),
        resumptions=tuple(podgroups[j] for j in sorted({b.job for b in stand_ins})),
        starting=frozenset(j.name for j in snapshot.jobs if j.name in bound_jobs
                           and not any(p.status in ACTIVE_ALLOCATED for p in j.pods)))


def _suspensions(result: CycleResult, snapshot: Snapshot, podgroups: Mapping[str, Obj],
                 pods: Mapping[str, Obj]) -> tuple[Suspension, ...]:
    """Whole gangs of RayJobs that KubeRay can suspend (kai_ray.k8s.suspend); a job losing only
    some of its pods (elastic workers) has those evicted."""
    by_job: dict[str, list[Evict]] = {}
    for ev in result.evictions:
        by_job.setdefault(ev.job, []).append(ev)
    out = []
    for job in snapshot.jobs:
        evs = by_job.get(job.name)
        pg = podgroups.get(job.name)
        if not evs or pg is None or not wants_suspend(pg):
            continue
        active = {p.name for p in job.pods if p.status in ACTIVE_ALLOCATED}
        if not active <= {ev.pod for ev in evs}:
            continue
        gang = tuple(pods[k] for k in (f"{job.namespace}/{ev.pod}" for ev in evs) if k in pods)
        out.append(Suspension(pg, gang, evs[0].message, tuple(evs)))
    return tuple(out)


def _with_backoff(result: CycleResult, snapshot: Snapshot, backoff: BackOff,
                  now: float) -> dict[str, Any]:
    """A gang waiting on pods that back off after a failed bind says so (the core sees those
    pods as gated, and would say the gang waits for gated pods)."""
    status = dict(result.job_status)
    for job in snapshot.jobs:
        current = status.get(job.name)
        waiting = [(p.name, backoff.until[k]) for p in job.pods
                   if (k := f"{p.namespace}/{p.name}") in backoff.until
                   and now < backoff.until[k][0]]
        if current is None or not waiting:
            continue
        name, (_, count) = max(waiting, key=lambda w: w[1][0])
        why = backoff.why.get(f"{job.namespace}/{name}", "its bind failed")
        # no countdown in it: an unchanged message is not written again each cycle
        status[job.name] = dataclasses.replace(
            current, reason="BindBackOff",
            message=f"{len(waiting)} pod(s) of this gang back off for "
                    f"{backoff_seconds(count):.0f}s after a failed bind ({name}: {why})")
    return status
