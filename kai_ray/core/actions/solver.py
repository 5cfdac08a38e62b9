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

The same decisions, faster: the victim order is popped once per session state and shared by
every prefix (victim_stream.py), a prefix skips the victims that cannot yet make room for it
without testing them one by one, and the idle-GPU filter is incremental (gpu_room.py).
tests/core/test_fast_paths.py checks each shortcut against the plain path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from kai_ray.core.actions.common import place_tasks
from kai_ray.core.actions.gpu_room import AllFreed, Freed, FreeGpus, GpuRoom
from kai_ray.core.actions.victim_stream import VictimStream
from kai_ray.core.actions.victims import VictimUnit, unit_of, victim_units
from kai_ray.core.model import ACTIVE_ALLOCATED, PodStatus
from kai_ray.core.ordering import JobQueue, PendingOrder, scenario_queue
from kai_ray.core.scratch import Key
from kai_ray.core.state import EvictInfo, JobState, Session, Task

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
# each job's victim unit as of its last change (`JobState.changes`), kept for the session
VICTIM_UNITS: Key[dict[str, tuple[int, VictimUnit | None]]] = Key("victim units")


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
    held = sess.dev_on & (sess.dev_used > 0)
    left = np.where(held, 100 - (sess.dev_used + 9) // 10, 0).sum(axis=1)
    idle: npt.NDArray[np.int64] = 100 * (sess.cap_gpu - sess.used_gpu) + left
    releasing: npt.NDArray[np.int64] = 100 * sess.rel_gpu
    for node in np.flatnonzero((sess.dev_on & (sess.dev_rel > 0)).any(axis=1)).tolist():
        for g in sess.groups[node].values():
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


class _ScopeVictims:
    """One scope's victim units, their victim-order queue and what they would free together,
    updated job by job (candidate membership is fixed within an action)."""

    def __init__(self, sess: Session, jobs: list[JobState],
                 known: dict[str, tuple[int, VictimUnit | None]]) -> None:
        self.units: dict[str, VictimUnit] = {}
        self.members = {job.name for job in jobs}  # the candidates, unit or not
        self.freed = Freed(sess)
        # each job's unit as of its last change, shared by the scopes it is a candidate of
        # (units are never changed once built)
        self.known = known
        heaps: dict[str, list[tuple[int, int, VictimUnit]]] = {}
        for job in jobs:
            unit = self._add(job)
            if unit is not None:
                # JobQueue's entries, made here where the unit's type is known (fast calls)
                heaps.setdefault(job.queue, []).append(
                    (-unit.order_number(sess), len(self.units), unit))
        self.queue: JobQueue[VictimUnit] = JobQueue(sess, (), reverse=True, heaps=heaps)

    def _add(self, job: JobState) -> VictimUnit | None:
        known = self.known.get(job.name)
        if known is None or known[0] != job.changes:
            known = self.known[job.name] = (job.changes, unit_of(job))
        unit = known[1]
        if unit is not None:
            self.units[job.name] = unit
            for t in unit.tasks:
                self.freed.add(t, +1)
        return unit

    def update(self, jobs: list[JobState]) -> None:
        gone = []
        for name in {job.name for job in jobs}:
            old = self.units.pop(name, None)
            if old is not None:
                gone.append(old)
                for t in old.tasks:
                    self.freed.add(t, -1)
        self.queue.discard(gone)
        for job in jobs:
            unit = self._add(job)
            if unit is not None:
                self.queue.push(unit)


class VictimCache:
    """Victim candidates and free GPUs for one action run. A job that fails rolls the session
    back; one that succeeds changes only the jobs its decisions touched (found in the undo log),
    so only their victim units are rebuilt, in the scopes that hold them. Keyed by the
    candidates' scope (which victims a job may take)."""

    def __init__(self) -> None:
        self.version = -1
        self.free: FreeGpus | None = None
        self.scopes: dict[object, _ScopeVictims] = {}
        self.all_freed: dict[object, AllFreed] = {}  # kept node by node across states
        self.streams: dict[object, VictimStream] = {}
        self.touched: dict[object, set[str]] = {}  # per stream, jobs changed since it was built
        self.enough_all: dict[tuple[object, ...], bool] = {}

    def all_enough(self, sess: Session, scope: object, all_freed: AllFreed,
                   prefix: list[Task]) -> bool:
        """Whether every candidate victim together would free enough GPUs for `prefix`
        (the idle-GPU filter over `all_freed`), remembered per scope and needs for this
        state."""
        whole, fractions = GpuRoom.needs(sess, prefix)
        key = (scope, tuple(whole), tuple(fractions))
        known = self.enough_all.get(key) if scope is not None else None
        if known is None:
            known = all_freed.enough(whole, fractions)
            if scope is not None:
                self.enough_all[key] = known
        return known

    def stream(self, sess: Session, scope: object) -> VictimStream | None:
        """The scope's victim stream for the current state (`get` must have been called for
        this state)."""
        if scope is None or scope not in self.scopes or self.free is None:
            return None
        stream = self.streams.get(scope)
        touched = self.touched.pop(scope, None)
        if stream is not None and touched is not None and not stream.renew(self.free, touched):
            stream = None
        if stream is None:
            victims = self.scopes[scope]
            stream = self.streams[scope] = VictimStream(sess, victims.queue, victims.units,
                                                         self.free)
        return stream

    def get(self, sess: Session, scope: object, candidates: Callable[[], list[JobState]]
            ) -> tuple[FreeGpus, AllFreed, JobQueue[VictimUnit]]:
        if self.version != len(sess.undo) or self.free is None:
            touched: set[str] = set()
            if 0 <= self.version <= len(sess.undo):
                entries = sess.undo[self.version:]
                jobs = list({id(entry[1].job): entry[1].job for entry in entries
                             if isinstance(entry[1], Task)}.values())
                touched = {job.name for job in jobs}
                by_scope: dict[int, tuple[_ScopeVictims, list[JobState]]] = {}
                for job in jobs:
                    for victims in self.scopes.values():
                        if job.name in victims.members:
                            by_scope.setdefault(id(victims), (victims, []))[1].append(job)
                for victims, scope_jobs in by_scope.values():
                    victims.update(scope_jobs)
                nodes = _changed_nodes(entries, jobs)
                for all_freed in self.all_freed.values():
                    all_freed.refresh(nodes)
            else:
                self.scopes, self.streams, self.touched = {}, {}, {}
                self.all_freed = {}
            self.version = len(sess.undo)
            self.free = FreeGpus(sess)
            self.enough_all = {}
            # streams are carried over when next used (`stream`), with every job touched since
            for key in self.streams:
                self.touched.setdefault(key, set()).update(touched)
        if scope is None:
            units = victim_units(candidates())
            freed = Freed(sess)
            for t in (t for u in units for t in u.tasks):
                freed.add(t, +1)
            all_freed = AllFreed(sess, freed, self.free.with_freed(freed))
            return self.free, all_freed, JobQueue(sess, units, reverse=True)
        if scope not in self.scopes:
            # each job's unit as of its last change, kept for the session (`changes` only
            # grows, rollbacks included: a unit is never reused for another state of its job)
            known = sess.scratch.setdefault(VICTIM_UNITS, dict)
            self.scopes[scope] = _ScopeVictims(sess, candidates(), known)
        victims = self.scopes[scope]
        if scope not in self.all_freed:
            self.all_freed[scope] = AllFreed(sess, victims.freed,
                                             self.free.with_freed(victims.freed))
        return self.free, self.all_freed[scope], victims.queue


def _changed_nodes(entries: list[tuple[object, ...]], jobs: list[JobState]) -> set[int]:
    """Nodes where undo-log `entries` changed something, and where the tasks of `jobs` (whose
    victim units may have changed) sit."""
    nodes: set[int] = set()
    for entry in entries:
        task, prev = entry[1], entry[2]
        if isinstance(task, Task):
            nodes.add(task.node)
        if isinstance(prev, Task):  # a move: the copy's node
            nodes.add(prev.node)
        elif isinstance(prev, tuple) and len(prev) > 1 and isinstance(prev[1], int):
            nodes.add(prev[1])  # an allocation: where the task was before
    for job in jobs:
        nodes.update(t.node for t in job.tasks)
    nodes.discard(-1)
    return nodes


class _RecordedFreed:
    """What a job's recorded victims free, as overlays over the free GPUs (`GpuRoom.free_into`
    fills them), kept from prefix to prefix: the victims recorded for the next prefix are
    mostly those of this one plus a few, so each prefix's room adopts these instead of
    adding every recorded victim again."""

    def __init__(self, counter: GpuRoom) -> None:
        self.counter = counter
        self.tasks: list[Task] = []
        self.whole: dict[int, int] = {}
        self.freed: dict[tuple[int, str], int] = {}

    def of(self, recorded: list[Task]) -> tuple[dict[int, int], dict[tuple[int, str], int]]:
        known = len(self.tasks)
        if len(recorded) < known or any(a is not b for a, b in zip(recorded, self.tasks,
                                                                     strict=False)):
            self.tasks, self.whole, self.freed, known = [], {}, {}, 0
        for t in recorded[known:]:
            self.counter.free_into(t, self.whole, {}, self.freed)
            self.tasks.append(t)
        return self.whole, self.freed


def _groups_hit(victims: list[Task], groups: list[list[Task]]) -> list[list[Task]]:
    """The groups holding one of `victims` (the pods a scenario evicted or moved)."""
    hit = {id(t) for t in victims}
    return [g for g in groups if any(id(t) in hit for t in g)]


class Solver:
    def __init__(self, sess: Session, action: str, candidates: Callable[[], list[JobState]],
                 validator: Validator, message: Callable[[Task, JobState], str],
                 cache: VictimCache | None = None, scope: object = None) -> None:
        self.sess = sess
        self.cache = cache if cache is not None else VictimCache()
        self.scope = scope
        self.action = action
        self.candidates = candidates
        self.validator = validator
        self.message = message
        # set per job by `solve` (see `VictimCache.get`)
        self._recorded: _RecordedFreed
        self._free: FreeGpus
        self._all_freed: AllFreed
        self._victim_queue: JobQueue[VictimUnit]
        self._feasible: npt.NDArray[np.bool_] | None = None

    def solve(self, job: JobState) -> bool:
        """Try to make room for `job`; on success the winning scenario stays applied."""
        sess = self.sess
        tasks = job.tasks_to_allocate()
        if not tasks:
            return False
        base = sess.checkpoint()
        active_before = job.active_count()
        # the state is rolled back to `base` before every prefix, so the candidates and the free
        # GPUs are the same for all of them
        self._free, self._all_freed, self._victim_queue = self.cache.get(
            sess, self.scope, self.candidates)
        if self._hopeless(tasks):
            return False
        self._feasible = feasible_nodes(sess, job)
        recorded: list[list[Task]] = []
        actual: list[Task] = []  # what the last prefix's scenario evicted or moved
        self._recorded = _RecordedFreed(GpuRoom(sess, self._free, []))
        solved = False
        for k in range(1, len(tasks) + 1):
            found = self._solve_prefix(job, tasks[:k], recorded, actual)
            if found is None:
                break
            recorded, actual = found
            solved = k == len(tasks)
            if not solved:
                sess.rollback(base)
        if solved and job.gang_satisfied() and job.active_count() > active_before:
            return True
        sess.rollback(base)
        return False

    def _hopeless(self, tasks: list[Task]) -> bool:
        """Whether not even every candidate victim together would free enough GPUs for all of
        `tasks`. The last prefix must succeed for the job to, and it cannot then: its recorded
        victims are some of the candidates, and more victims never make the idle-GPU filter
        harder to pass. Found before any prefix is simulated, it changes no decision."""
        return not self.cache.all_enough(self.sess, self.scope, self._all_freed, tasks)

    def _solve_prefix(self, job: JobState, prefix: list[Task], groups: list[list[Task]],
                      actual: list[Task]) -> tuple[list[list[Task]], list[Task]] | None:
        """The victim groups the next prefix starts from and the pods the winning scenario
        evicted or moved, or None when no scenario makes room for `prefix`; `groups` and
        `actual` are the previous prefix's."""
        recorded = [t for g in groups for t in g]
        room = GpuRoom(self.sess, self._free, prefix)
        if recorded and not room.trivial:
            room.adopt(*self._recorded.of(recorded))
        # the scenario of the recorded victims alone (the same on every node), once tried
        recorded_only = bool(recorded) and room.enough()
        if recorded_only:
            result = self._try(job, prefix, recorded, self._nodes(actual))
            if result is not None:
                return _groups_hit(result, groups), result
        if not self.cache.all_enough(self.sess, self.scope, self._all_freed, prefix):
            return None  # not even every candidate victim together would make room
        stream = self.cache.stream(self.sess, self.scope)
        victims = (stream.read(recorded, room)
                   if stream is not None and stream.covers(recorded) else self._popped(recorded))
        # potential victims in the order they were taken, and per node the jobs with one there
        # (those of the quiet batch, which come first, sorted by node only once an entry may be
        # simulated): a scenario on a node takes every potential victim of those jobs, wherever
        # it sits (KAI's ByNodeScenario.VictimsTasksFromNodes)
        quiet_batch: list[list[Task]] = []
        potential: list[Task] = []
        taken_in: dict[int, list[Task]] = {}  # each potential victim's take
        jobs_on: dict[int, set[int]] | None = None
        for takes, quiet in victims:
            if quiet:
                quiet_batch.extend(takes)
                continue  # already in `room` (see `VictimStream.read`); nothing to simulate
            if jobs_on is None:
                jobs_on = {}
                for taken in quiet_batch:
                    for t in taken:
                        jobs_on.setdefault(t.node, set()).add(id(t.job))
                        taken_in[id(t)] = taken
                    potential.extend(taken)
            for taken in takes:
                for t in taken:
                    jobs_on.setdefault(t.node, set()).add(id(t.job))
                    taken_in[id(t)] = taken
                    room.add_victim(t)
                potential.extend(taken)
            if not room.enough():
                continue  # even every victim so far would not free enough GPUs: skip simulating
            # a scenario per node of each taken victim's job, any of its pods where it is now
            # (KAI's getNodesOfJob, by_pod_solver.go:86,204: a moved pod is on the node it was
            # moved to, not the one it leaves; fuzzer seed 779): on one with no potential
            # victim (or for a pending pod, no node) only the recorded victims go, and that may
            # be enough now that earlier jobs of the action left GPUs releasing
            for node in sorted({p.node for taken in takes for p in taken[0].job.tasks
                                if p.moved is None}):
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

    def _popped(self, recorded: list[Task]) -> Iterator[tuple[list[list[Task]], bool]]:
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
                yield [taken], False

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
        checkpoint = sess.checkpoint()
        victim_jobs = list({id(t.job): t.job for t in victims if t.job is not job}.values())
        # the other pending jobs matter only where the wanted ones are in more than one queue;
        # they are taken as they are now, before the scenario changes the wanted ones
        others = (PendingOrder.of(sess) if any(j.queue != job.queue for j in victim_jobs)
                  else None)
        for task in victims:
            sess.evict(task)
            sess.evict_info[task.idx] = EvictInfo(self.action, job.name,
                                                  partial(self.message, task, job))
        order = scenario_queue(sess, [job, *victim_jobs], others, prefix)
        sess.node_filter = nodes
        try:
            placed = self._place_again(job, prefix, victim_jobs, order)
        finally:
            sess.node_filter = None
        if not placed:
            sess.rollback(checkpoint)
            return None
        evicted = [t for t in victims if t.status == PodStatus.RELEASING and t.moved is None]
        moved = [t for t in victims if t.moved is not None]
        if not self.validator(evicted, moved):
            sess.rollback(checkpoint)
            return None
        return evicted + moved
