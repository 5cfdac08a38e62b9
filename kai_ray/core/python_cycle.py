"""The Python core's cycle: `run_cycle(snapshot, config, now, clock) -> CycleResult`, pure.

Open a session (fair share once), run the configured actions in order on the same virtual
state, then turn the final state into decisions and explanations. `kai_ray.core.schedule`
chooses between this and the Rust core, and imports this module only when it runs it: a
scheduler on the Rust core does not load the Python core (nor numpy) at start-up.
"""

from __future__ import annotations

from collections.abc import Callable

from kai_ray.core import fairshare
from kai_ray.core.actions import allocate, consolidation, preempt, reclaim, stale
from kai_ray.core.capacity import QUEUE_DOES_NOT_EXIST
from kai_ray.core.jobs import Task
from kai_ray.core.model import ACTIVE_USED, ALIVE, Amounts, PodStatus, SchedulerConfig, Snapshot
from kai_ray.core.queuetree import QUEUE_PARENT_CYCLE
from kai_ray.core.result import (
    Bind,
    CycleResult,
    Evict,
    JobStatus,
    NodeFitSummary,
    Pipeline,
    PodOutcome,
    QueueShare,
)
from kai_ray.core.state import Session

Clock = Callable[[], float]


def compute_fair_share(sess: Session) -> None:
    for r in range(3):
        inputs = {
            name: fairshare.ShareInput(
                name=name, deserved=q.deserved[r], limit=q.limit[r], weight=q.weight[r],
                request=q.request[r], priority=q.priority, created=q.created)
            for name, q in sess.queues.items()
        }
        for name, q in sess.queues.items():
            inputs[name].children = [inputs[c] for c in q.children]
        roots = [inputs[n] for n, q in sess.queues.items() if not q.parent]
        fairshare.divide(sess.cluster.total[r], roots, sess.config.k_value)
        for name, q in sess.queues.items():
            q.fair_share[r] = inputs[name].fair_share


def run_cycle(snapshot: Snapshot, config: SchedulerConfig, now: float,
              clock: Clock | None) -> CycleResult:
    """One cycle of the Python core: open a session (fair share once), run the configured
    actions in order on the same virtual state, then turn the final state into decisions and
    explanations. `clock` only times the actions."""
    sess = Session(snapshot, config, now)
    compute_fair_share(sess)
    result = CycleResult()
    existing_groups = {gid for groups in sess.cluster.groups for gid in groups}
    for action in config.actions:
        start = clock() if clock else 0.0
        run_action(sess, action, result)
        if clock:
            result.action_seconds[action] = clock() - start
    _collect(sess, result, existing_groups)
    return result


def run_action(sess: Session, action: str, result: CycleResult) -> None:
    if action == "allocate":
        allocate.run(sess)
    elif action == "consolidation":
        consolidation.run(sess)
    elif action == "reclaim":
        reclaim.run(sess)
    elif action == "preempt":
        preempt.run(sess)
    elif action == "stalegangeviction":
        stale.run(sess, result.stale_set, result.stale_cleared)
    else:
        raise ValueError(f"unknown action {action!r}")


# each status as reported (an Enum's `.value` is a descriptor call, once per pod otherwise);
# allocated pods are reported as binding
_REPORTED = {status: status.value for status in PodStatus}
_REPORTED[PodStatus.ALLOCATED] = PodStatus.BINDING.value
_PENDING = PodStatus.PENDING.value


def _live(task: Task) -> Task:
    """Where the pod is now: its last copy if it was moved (a copy may be moved again)."""
    while task.moved is not None:
        task = task.moved
    return task


def _taken_back(task: Task) -> bool:
    """A pod pending when the cycle began, placed in it and evicted again (a victim of a later
    action) and not placed anew: it stays pending, neither pipelined nor evicted (KAI's eviction
    of a pod it has not bound). One a victim scenario moved is pipelined where it went (KAI's
    last call for it pipelines it there)."""
    return (task.orig_status == PodStatus.PENDING and task.status == PodStatus.RELEASING
            and task.moved is None)


def _alive(task: Task) -> bool:
    """Whether the pod counts as there for its job's readiness, once (a moved pod where it went;
    a pod taken back is pending again)."""
    if task.origin is not None:
        return False
    if _taken_back(task):
        return True
    status = _live(task).status
    return status in ALIVE and status != PodStatus.GATED


def _outcome(sess: Session, task: Task) -> PodOutcome:
    if _taken_back(task):
        return PodOutcome(_PENDING, None, ())
    live = _live(task)
    node = sess.cluster.nodes[live.node].name if live.node >= 0 else None
    return PodOutcome(_REPORTED[live.status], node, live.groups)


def _collect(sess: Session, result: CycleResult, existing_groups: set[str]) -> None:
    for task in sess.tasks:
        if task.origin is not None:
            continue
        job = task.job
        result.pods[task.name] = _outcome(sess, task)
        if _taken_back(task):
            continue
        live = _live(task)
        if task.orig_status == PodStatus.PENDING and live.status == PodStatus.ALLOCATED:
            portion = sess.cluster.portion(task.req, live.node) if task.req.is_shared else 0.0
            result.binds.append(Bind(
                job=job.name, namespace=job.namespace, pod=task.name,
                node=sess.cluster.nodes[live.node].name, gpu_groups=live.groups,
                new_gpu_groups=tuple(g for g in live.groups if g not in existing_groups),
                gpu_portion=portion, gpu_memory_mib=task.req.gpu_memory_mib))
        elif live.status == PodStatus.PIPELINED:
            result.pipelined.append(Pipeline(job.name, job.namespace, task.name,
                                             sess.cluster.nodes[live.node].name, "pipeline"))
        if task.orig_status in ACTIVE_USED and task.orig_status != PodStatus.RELEASING and (
                task.status == PodStatus.RELEASING):
            info = sess.evict_info.get(task.idx)
            node = sess.cluster.nodes[task.node].name if task.node >= 0 else None
            result.evictions.append(Evict(
                job.name, job.namespace, task.name, node, info.action if info else "unknown",
                info.message if info else "", info.preemptor if info else None))
    _job_statuses(sess, result)
    for name, q in sess.queues.items():
        result.queues[name] = QueueShare(
            name=name, parent=q.parent, deserved=_t(q.deserved), limit=_t(q.limit),
            fair_share=_t(q.fair_share), allocated=_t(q.allocated),
            allocated_non_preemptible=_t(q.allocated_np), requested=_t(q.request))


def _t(v: list[float]) -> Amounts:
    return (v[0], v[1], v[2])


def _job_statuses(sess: Session, result: CycleResult) -> None:
    for job in sess.jobs.values():
        pending = [t.name for t in job.tasks if t.origin is None and (
            t.status == PodStatus.PENDING or _taken_back(t))]
        if not pending:
            continue
        fit = None
        if job.queue in sess.queues.excluded:
            reason, message = QUEUE_PARENT_CYCLE, sess.queues.excluded[job.queue]
        elif job.queue not in sess.queues:
            reason, message = QUEUE_DOES_NOT_EXIST, f"Queue '{job.queue}' does not exist"
        elif not sess.queues.is_leaf(job.queue):
            reason = "QueueNotLeaf"
            message = f"Queue '{job.queue}' has child queues; only leaf queues run workloads"
        elif not all(sum(1 for t in ps.tasks if _alive(t)) >= ps.min_member
                     for ps in job.podsets.values()):
            # a releasing pod is neither: it is going away (KAI's aliveStatuses)
            alive = sum(1 for t in job.tasks if _alive(t))
            gated = sum(1 for t in job.tasks if t.status == PodStatus.GATED)
            minimum = sum(ps.min_member for ps in job.podsets.values())
            reason = "NotReady"
            message = (f"Job is not ready for scheduling. Waiting for {minimum} pods, currently "
                       f"{alive} exist, {gated} are gated")
        elif job.name in sess.job_errors:
            err = sess.job_errors[job.name]
            reason, message = err.reason, err.message
            if err.fit:
                fit = NodeFitSummary(tuple(sorted(err.fit.items())))
        else:
            reason, message = "Unschedulable", "Unable to schedule podgroup"
        result.job_status[job.name] = JobStatus(job.name, job.namespace, reason, message,
                                                tuple(pending), fit)
