"""The victim solver shared by reclaim, preempt and consolidation.

For a pending job it grows prefixes of its tasks-to-allocate. Each prefix starts from the victims
recorded for the previous one and adds potential victims in victim order, one job (or one extra
task of an elastic job) at a time. Every scenario evicts the recorded victims plus the potential
victims of the jobs with one on a node of the latest one (all of them, wherever they sit), then
places the preemptor and the victims again (pipeline only), in the order KAI pops them from
among every job with a pending task (ordering.scenario_queue): a victim that fits back where it
was is left alone, one placed elsewhere is moved, one not placed stays evicted. Placement is
kept to the scenario's nodes: the job's feasible nodes (`feasible_nodes`) and those of the
previous prefix's victims and of the scenario's potential victims. An action-specific
validator accepts or rejects the scenario.

What a prefix records for the next is every take (the victims added in one step) that holds a
pod its scenario evicted or moved, the whole take: a pod of it put back where it was is evicted
again by the next prefix's scenarios. KAI records victim jobs so: the clones made per
BaseScenario.AddPotentialVictimsTasks call (by_pod_solver.go getVictimJobsFromVictimTasks).

This is the specification: every job's search pops its candidates' victim order afresh, and
every scenario passes KAI's idle-GPU filter (gpu_room.py) before it is simulated. The Rust core
takes the same decisions faster (the victim order popped once per session state and shared by
every prefix, victims that cannot yet make room skipped in batches, candidates kept per scope
across jobs); tests/core/test_native_core.py compares the two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from kai_ray.core.actions.common import place_tasks
from kai_ray.core.actions.gpu_room import GpuRoom, Rooms, Whole, free_gpus
from kai_ray.core.actions.victims import VictimUnit, victim_units
from kai_ray.core.jobs import JobState, Task
from kai_ray.core.model import ACTIVE_ALLOCATED, PodStatus
from kai_ray.core.ordering import JobQueue, pending_leaf_jobs, scenario_queue
from kai_ray.core.state import EvictInfo, Session

# (evicted, moved) -> whether the action accepts the scenario. A rejection takes no queue's jobs
# out of the search: KAI goes on adding victims, and a later scenario may keep or move the
# rejected ones rather than evict them (fuzzer seed 43)
Validator = Callable[[list[Task], list[Task]], bool]


@dataclass
class Solution:
    victims: list[Task]  # evicted for good (Releasing)
    moved: list[Task]  # re-placed elsewhere (Pipelined copies)


# a pending pod's request as KAI's ResourceRequirements compares it (resource_requirment.go
# LessEqual): GPU device count, portion of each device (1 for whole GPUs, 0 for CPU-only and
# gpu-memory requests), CPU, memory
_Request = tuple[int, float, int, int]
_MIN_PORTION_DIFF = 0.01  # KAI's minGPUs: portions closer than this compare equal


def _request(task: Task) -> _Request:
    req = task.req
    if req.gpus:
        return (req.gpus, 1.0, req.cpu_m, req.memory)
    if req.gpu_fraction_milli:
        return (req.fraction_devices, req.gpu_fraction_milli / 1000, req.cpu_m, req.memory)
    if req.gpu_memory_mib:
        return (req.fraction_devices, 0.0, req.cpu_m, req.memory)
    return (0, 0.0, req.cpu_m, req.memory)


def _le(a: _Request, b: _Request) -> bool:
    return (a[0] <= b[0] and (a[1] < b[1] or abs(a[1] - b[1]) < _MIN_PORTION_DIFF)
            and a[2] <= b[2] and a[3] <= b[3])


def _signature(job: JobState) -> tuple[object, ...]:
    """KAI's scheduling-constraints signature of a job (PodGroupInfo / PodSet
    GetSchedulingConstraintsSignature): per podset, the constraints of each of its pods that is
    not active-allocated, one entry per pod, and the pods' priority; nothing of what the pods
    request. KAI caches it on first use, so it stays what it was then for the whole cycle."""
    if job.signature is None:
        sets = []
        for ps in job.podsets.values():
            pods = [t for t in ps.tasks if t.origin is None]
            # a moved pod is where it went (KAI: one pod, pipelined)
            rest = [t.constraints for t in pods if _live_status(t) not in ACTIVE_ALLOCATED]
            sets.append(tuple(sorted(rest)) if rest else ())
        job.signature = (job.priority, tuple(sorted(sets)))
    return job.signature


def _live_status(task: Task) -> PodStatus:
    while task.moved is not None:
        task = task.moved
    return task.status


def gpu_sums(sess: Session) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per node, KAI's idle and releasing GPU sums (GetSumOfIdleGPUs, GetSumOfReleasingGPUs)
    in 1/100 of a device. Idle: whole idle GPUs plus, per shared device some unpipelined
    sharer holds, what is left of it (rounded down); releasing: whole releasing GPUs plus, per
    shared device partly releasing, the releasing part (rounded up). A device only pipelined
    sharers hold counts in neither."""
    cluster = sess.cluster
    held = cluster.dev_on & (cluster.dev_used > 0)
    left = np.where(held, 100 - (cluster.dev_used + 9) // 10, 0).sum(axis=1)
    idle: npt.NDArray[np.int64] = 100 * (cluster.cap_gpu - cluster.used_gpu) + left
    releasing: npt.NDArray[np.int64] = 100 * cluster.rel_gpu
    for node in np.flatnonzero((cluster.dev_on & (cluster.dev_rel > 0)).any(axis=1)).tolist():
        for g in cluster.groups[node].values():
            if g.releasing > 0 and g.releasing != g.used + g.pipelined:
                releasing[node] += (g.releasing + 9) // 10
    return idle, releasing


def feasible_nodes(sess: Session, job: JobState) -> npt.NDArray[np.bool_] | None:
    """KAI's FeasibleNodesForJob (feasible_nodes.go), the nodes a victim scenario may place
    on before its victims' nodes are added: for a job all of whose pods ask for a GPU, those
    whose idle or whose releasing GPU sum (`gpu_sums`) is above 0; else None (every node)."""
    if not all(t.req.wants_gpu for t in job.tasks):
        return None
    idle, releasing = gpu_sums(sess)
    nodes: npt.NDArray[np.bool_] = (idle > 0) | (releasing > 0)
    return nodes


class FailedJobs:
    """KAI's scheduling signatures (minimal_job_comparison.go): within one action, a job is
    skipped when a job of the same signature failed and it is not easier to place than that
    one (its pending pods, sorted, are nowhere strictly smaller, or it has more of them)."""

    def __init__(self) -> None:
        self.failed: dict[tuple[object, ...], list[_Request]] = {}

    @staticmethod
    def _footprint(job: JobState) -> list[_Request]:
        return sorted(_request(t) for t in job.pending_tasks())

    def should_skip(self, job: JobState, scope: str) -> bool:
        known = self.failed.get((scope, _signature(job)))
        if known is None:
            return False
        mine = self._footprint(job)
        if not mine or not known:
            return True
        if len(known) > len(mine):
            return False
        for i, a in enumerate(mine):
            if i >= len(known):
                return True
            if _le(a, known[i]) and not _le(known[i], a):
                return False  # strictly smaller here: easier
        return True

    def record(self, job: JobState, scope: str) -> None:
        key = (scope, _signature(job))
        mine = self._footprint(job)
        known = self.failed.get(key)
        if known is None or (mine and len(mine) <= len(known)
                             and all(_le(a, b) for a, b in zip(mine, known, strict=False))):
            self.failed[key] = mine


def _groups_hit(victims: list[Task], groups: list[list[Task]]) -> list[list[Task]]:
    """The groups holding one of `victims` (the pods a scenario evicted or moved)."""
    hit = {id(t) for t in victims}
    return [g for g in groups if any(id(t) in hit for t in g)]


class Solver:
    def __init__(self, sess: Session, action: str, candidates: Callable[[], list[JobState]],
                 validator: Validator, message: Callable[[Task, JobState], str]) -> None:
        self.sess = sess
        self.action = action
        self.candidates = candidates
        self.validator = validator
        self.message = message
        # set per job by `solve`: the GPUs free and the victim order before any prefix
        self._free: tuple[Whole, Rooms]
        self._victim_queue: JobQueue[VictimUnit]
        self._feasible: npt.NDArray[np.bool_] | None = None

    def solve(self, job: JobState) -> bool:
        """Try to make room for `job`; on success the winning scenario stays applied."""
        sess = self.sess
        tasks = job.tasks_to_allocate()
        if not tasks:
            return False
        base = sess.statement.checkpoint()
        active_before = job.active_count()
        # the state is rolled back to `base` before every prefix, so the candidates and the free
        # GPUs are the same for all of them
        self._free = free_gpus(sess)
        units = victim_units(self.candidates())
        if self._hopeless(tasks, units):
            return False
        self._victim_queue = JobQueue(sess, units, reverse=True)
        self._feasible = feasible_nodes(sess, job)
        recorded: list[list[Task]] = []
        actual: list[Task] = []  # what the last prefix's scenario evicted or moved
        solved = False
        for k in range(1, len(tasks) + 1):
            found = self._solve_prefix(job, tasks[:k], recorded, actual)
            if found is None:
                break
            recorded, actual = found
            solved = k == len(tasks)
            if not solved:
                sess.statement.rollback(base)
        if solved and job.gang_satisfied() and job.active_count() > active_before:
            return True
        sess.statement.rollback(base)
        return False

    def _hopeless(self, tasks: list[Task], units: list[VictimUnit]) -> bool:
        """Whether not even every candidate victim together passes the idle-GPU filter for all
        of `tasks`: then no scenario of the last prefix can, so the job is not searched. Part of
        the specification, not only a shortcut: the earlier prefixes' scenarios are not
        simulated either, and each simulation rolled back leaves its float rounding in the
        queues' sums (as the Rust core, which skips them too)."""
        room = GpuRoom(self.sess, self._free, tasks)
        for unit in units:
            for t in unit.tasks:
                room.add_victim(t)
        return not room.enough()

    def _solve_prefix(self, job: JobState, prefix: list[Task], groups: list[list[Task]],
                      actual: list[Task]) -> tuple[list[list[Task]], list[Task]] | None:
        """The victim groups the next prefix starts from and the pods the winning scenario
        evicted or moved, or None when no scenario makes room for `prefix`; `groups` and
        `actual` are the previous prefix's."""
        recorded = [t for g in groups for t in g]
        room = GpuRoom(self.sess, self._free, prefix)
        for t in recorded:
            room.add_victim(t)
        # the scenario of the recorded victims alone (the same on every node), once tried
        recorded_only = bool(recorded) and room.enough()
        if recorded_only:
            result = self._try(job, prefix, recorded, self._nodes(actual))
            if result is not None:
                return _groups_hit(result, groups), result
        # potential victims in the order they were taken, and per node the jobs with one there:
        # a scenario on a node takes every potential victim of those jobs, wherever it sits
        # (KAI's ByNodeScenario.VictimsTasksFromNodes)
        potential: list[Task] = []
        taken_in: dict[int, list[Task]] = {}  # each potential victim's take
        jobs_on: dict[int, set[int]] = {}
        for taken in self._popped(recorded):
            for t in taken:
                jobs_on.setdefault(t.node, set()).add(id(t.job))
                taken_in[id(t)] = taken
                room.add_victim(t)
            potential.extend(taken)
            if not room.enough():
                continue  # even every victim so far would not free enough GPUs: skip simulating
            # a scenario per node of the taken victim's job, any of its pods where it is now
            # (KAI's getNodesOfJob, by_pod_solver.go:86,204: a moved pod is on the node it was
            # moved to, not the one it leaves; fuzzer seed 779): on one with no potential
            # victim (or for a pending pod, no node) only the recorded victims go, and that may
            # be enough now that earlier jobs of the action left GPUs releasing
            for node in sorted({p.node for p in taken[0].job.tasks if p.moved is None}):
                on_node = jobs_on.get(node, set())
                added = [t for t in potential if id(t.job) in on_node]
                if not added:
                    if recorded_only:
                        continue  # already tried: it fails the same way
                    recorded_only = True
                scenario = recorded + added
                if not room.enough_with(scenario):
                    continue
                result = self._try(job, prefix, scenario, self._nodes(actual, added))
                if result is not None:
                    return _groups_hit(result, groups + list(
                        {id(g): g for g in (taken_in[id(t)] for t in added)}.values())), result
        return None

    def _place_again(self, job: JobState, prefix: list[Task], victim_jobs: list[JobState],
                     order: JobQueue[JobState]) -> bool:
        """Place the preemptor's `prefix` and the victims again in `order`; False when the
        preemptor does not fit. The other jobs with a pending task are skipped (they only
        shape the order); once every wanted job is placed again nothing else can change."""
        sess = self.sess
        wanted = {id(j) for j in victim_jobs}
        wanted.add(id(job))
        while wanted and (next_job := order.pop()) is not None:
            if id(next_job) not in wanted:
                continue
            wanted.discard(id(next_job))
            if next_job is job:
                pending = [t for t in prefix if t.status == PodStatus.PENDING]
                if not place_tasks(sess, job, pending, pipeline_only=True, record=False):
                    return False
                continue
            again = next_job.tasks_to_allocate(simulation=True)
            if again:
                place_tasks(sess, next_job, again, pipeline_only=True, record=False)
        return True

    def _popped(self, recorded: list[Task]) -> Iterator[list[Task]]:
        """The victims in victim order, popped from a copy of the scope's queue: what each
        next unit gives up (never a recorded victim again; what is left of its job goes
        back)."""
        recorded_set = {id(t) for t in recorded}
        queue = self._victim_queue.clone()
        while (unit := queue.pop()) is not None:
            taken, rest = unit.take_unrecorded(recorded_set)
            if rest is not None:
                queue.push(rest)
            if taken:
                yield taken

    def _nodes(self, *victims: list[Task]) -> list[int] | None:
        """A scenario's nodes in node order (KAI's byPodSolver feasibleNodes): the job's
        feasible nodes, those of the previous prefix's victims and those of the scenario's
        potential victims; None: every node."""
        if self._feasible is None:
            return None
        nodes = self._feasible.copy()
        for group in victims:
            for t in group:
                if t.node >= 0:
                    nodes[t.node] = True
        found: list[int] = np.flatnonzero(nodes).tolist()
        return found

    def _try(self, job: JobState, prefix: list[Task], victims: list[Task],
             nodes: list[int] | None) -> list[Task] | None:
        """Simulate one scenario, placing only on `nodes` (None: any). On success the state
        stays applied and the victims that matter (evicted or moved) are returned."""
        sess = self.sess
        checkpoint = sess.statement.checkpoint()
        victim_jobs = list({id(t.job): t.job for t in victims if t.job is not job}.values())
        # the other pending jobs matter only where the wanted ones are in more than one queue;
        # they are taken as they are now, before the scenario changes the wanted ones
        others = (pending_leaf_jobs(sess) if any(j.queue != job.queue for j in victim_jobs)
                  else None)
        for task in victims:
            sess.statement.evict(task)
            sess.evict_info[task.idx] = EvictInfo(self.action, job.name,
                                                  partial(self.message, task, job))
        order = scenario_queue(sess, [job, *victim_jobs], others, prefix)
        sess.node_filter = nodes
        try:
            placed = self._place_again(job, prefix, victim_jobs, order)
        finally:
            sess.node_filter = None
        if not placed:
            sess.statement.rollback(checkpoint)
            return None
        evicted = [t for t in victims if t.status == PodStatus.RELEASING and t.moved is None]
        moved = [t for t in victims if t.moved is not None]
        if not self.validator(evicted, moved):
            sess.statement.rollback(checkpoint)
            return None
        return evicted + moved
