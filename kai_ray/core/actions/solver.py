"""The victim solver shared by reclaim, preempt and consolidation (kai-spec §6.4).

For a pending job it grows prefixes of its tasks-to-allocate. Each prefix starts from the victims
recorded for the previous one and adds potential victims in victim order, one job (or one extra
task of an elastic job) at a time; every scenario evicts the recorded victims plus the potential
victims on one node of the latest one, then places the preemptor and the victims again
(pipeline only): a victim that fits back where it was is left alone, one placed elsewhere is
moved, one not placed stays evicted. An action-specific validator accepts or rejects the scenario.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import numpy as np

from kai_ray.core.actions.common import place_tasks
from kai_ray.core.model import PodStatus
from kai_ray.core.ordering import JobQueue
from kai_ray.core.state import MILLI, EvictInfo, JobState, Session, Task

_VICTIM_STATES = (PodStatus.ALLOCATED, PodStatus.BINDING, PodStatus.BOUND, PodStatus.RUNNING)


class VictimUnit:
    """Part of a victim job still available to take (KAI clones the job with these tasks)."""

    __slots__ = ("by_set", "job", "key", "tasks")

    def __init__(self, job: JobState, tasks: list[Task]) -> None:
        self.job = job
        self.tasks = tasks
        self.by_set: dict[str, list[Task]] = {name: [] for name in job.podsets}
        for t in tasks:
            self.by_set.get(t.subgroup, self.by_set.get("default", [])).append(t)
        self.key = (-job.priority, self._rank(), job.created, job.name)

    @property
    def queue(self) -> str:
        return self.job.queue

    def _rank(self) -> int:
        at_min = True
        for name, ps in self.job.podsets.items():
            count = len(self.by_set[name])
            if count < ps.min_member:
                return 0
            if count > ps.min_member:
                at_min = False
        return 1 if at_min else 2

    def order_key(self) -> tuple[int, int, float, str]:
        return self.key

    def taken_amount(self) -> tuple[float, float, float]:
        """What the queue loses when this unit is taken (its next tasks to evict)."""
        taken, _ = self.take()
        return (float(sum(t.req.cpu_m for t in taken)), float(sum(t.req.memory for t in taken)),
                sum(t.accepted_gpu for t in taken))

    def take(self) -> tuple[list[Task], VictimUnit | None]:
        """Tasks to evict next: one extra task of a podset above its minimum, else all."""
        above = [(name, ts) for name, ts in self.by_set.items()
                 if len(ts) > self.job.podsets[name].min_member]
        if above:
            _, ts = max(above, key=lambda item: (
                len(item[1]) / self.job.podsets[item[0]].min_member, item[0]))
            victim = max(ts, key=Task.sort_key)
            rest = [t for t in self.tasks if t is not victim]
            return [victim], VictimUnit(self.job, rest)
        return list(self.tasks), None


# (evicted, moved) -> None when the scenario is accepted, else the name of a queue that can give
# nothing more ("" when the rejection says nothing about any queue)
Validator = Callable[[list[Task], list[Task]], str | None]


@dataclass
class Solution:
    victims: list[Task]  # evicted for good (Releasing)
    moved: list[Task]  # re-placed elsewhere (Pipelined copies)


def victim_units(jobs: Iterable[JobState]) -> list[VictimUnit]:
    """Victim candidates: pods that were already placed when the cycle began. A pod allocated
    earlier in this same cycle is not bound yet; evicting it could split its gang's first bind."""
    units = []
    for job in jobs:
        tasks = [t for t in job.tasks if t.status in _VICTIM_STATES and t.moved is None
                 and t.orig_status in _VICTIM_STATES]
        if tasks:
            units.append(VictimUnit(job, tasks))
    return units


class _FreeGpus:
    """Free whole GPUs per node and free room per shared device, sparse (a busy cluster has
    few nodes with room). Computed once per job attempt: every prefix starts from this state.
    The device map is only built when a fractional request needs it."""

    def __init__(self, sess: Session) -> None:
        self.sess = sess
        free = np.where(sess.schedulable, sess.free_gpu(), 0)
        self.whole = {int(n): int(free[n]) for n in np.flatnonzero(free > 0)}
        self._devices: dict[tuple[int, str], int] | None = None
        self._victims: list[Task] = []

    @property
    def devices(self) -> dict[tuple[int, str], int]:
        if self._devices is None:
            sess = self.sess
            live = np.flatnonzero(sess.schedulable & sess.dev_on.any(axis=1))
            self._devices = {(int(n), g.gid): MILLI - g.used + g.releasing
                             for n in live for g in sess.groups[int(n)].values()
                             if g.releasing < g.used}
            if self._victims:
                room = _GpuRoom(sess, self, [])
                freed: dict[tuple[int, str], int] = {}
                whole: dict[int, int] = {}
                for t in self._victims:
                    room.free_into(t, whole, self._devices, freed)
        return self._devices

    def with_victims(self, sess: Session, victims: list[Task]) -> _FreeGpus:
        """The same after all `victims` are gone."""
        out = _FreeGpus.__new__(_FreeGpus)
        out.sess = sess
        out.whole = dict(self.whole)
        out._devices = None
        out._victims = victims
        room = _GpuRoom(sess, out, [])
        freed: dict[tuple[int, str], int] = {}
        scratch: dict[tuple[int, str], int] = {}
        for t in victims:
            room.free_into(t, out.whole, scratch, freed)
        return out


class _GpuRoom:
    """KAI's accumulated idle-GPU filter, made device-aware: can the prefix's GPU requests be
    matched greedily to what is free plus what the victims would free? Whole-GPU requests need
    whole devices (a shared device frees up only when all its sharers go); fractional requests
    need one device with enough room each. If not, no simulation can work."""

    def __init__(self, sess: Session, base: _FreeGpus, prefix: list[Task]) -> None:
        self.sess = sess
        self.base = base
        self.whole_needed = sorted((t.req.gpus for t in prefix if t.req.gpus), reverse=True)
        # the cheapest a request can be anywhere (gpu-memory costs least on the biggest GPUs)
        widest = int(np.argmax(sess.gpu_mem)) if len(sess.nodes) else 0
        self.fractions_needed = sorted(
            (sess.device_cost(t.req, widest) for t in prefix
             for _ in range(t.req.fraction_devices) if t.req.is_shared), reverse=True)
        self.trivial = not self.whole_needed and not self.fractions_needed
        self.whole = dict(base.whole)
        self.devices = dict(base.devices) if self.fractions_needed else {}
        self.freed: dict[tuple[int, str], int] = {}

    def add_victim(self, task: Task) -> None:
        if not self.trivial:
            self.free_into(task, self.whole, self.devices, self.freed)

    def enough(self) -> bool:
        return self.trivial or self._match(self.whole, self.devices)

    def enough_with(self, victims: list[Task]) -> bool:
        """The same test when only `victims` go (one scenario)."""
        if self.trivial:
            return True
        whole = dict(self.base.whole)
        devices = dict(self.base.devices) if self.fractions_needed else {}
        freed: dict[tuple[int, str], int] = {}
        for t in victims:
            self.free_into(t, whole, devices, freed)
        return self._match(whole, devices)

    def free_into(self, t: Task, whole: dict[int, int], devices: dict[tuple[int, str], int],
              freed: dict[tuple[int, str], int]) -> None:
        sess = self.sess
        if t.node < 0 or not sess.schedulable[t.node]:
            return
        if t.req.gpus:
            whole[t.node] = whole.get(t.node, 0) + t.req.gpus
            return
        for gid in t.groups:
            key = (t.node, gid)
            freed[key] = freed.get(key, 0) + t.gpu_mem_cost
            group = sess.groups[t.node].get(gid)
            if group is None:
                continue
            if freed[key] + group.releasing >= group.used:
                whole[t.node] = whole.get(t.node, 0) + 1
                devices.pop(key, None)
            elif self.fractions_needed:
                devices[key] = MILLI - group.used + group.releasing + freed[key]

    def _match(self, whole: dict[int, int], devices: dict[tuple[int, str], int]) -> bool:
        heap = [-v for v in whole.values() if v > 0]
        heapq.heapify(heap)
        for need in self.whole_needed:
            most = -heapq.heappop(heap) if heap else 0
            if most < need:
                return False
            heapq.heappush(heap, -(most - need))
        if not self.fractions_needed:
            return True
        rooms = [-v for v in devices.values() if v > 0] + [-MILLI] * (-sum(heap))
        heapq.heapify(rooms)
        for cost in self.fractions_needed:
            most = -heapq.heappop(rooms) if rooms else 0
            if most < cost:
                return False
            heapq.heappush(rooms, -(most - cost))
        return True


def _gpu_amount(task: Task) -> float:
    req = task.req
    if req.gpus:
        return float(req.gpus)
    if req.gpu_fraction_milli:
        return req.gpu_fraction_milli / 1000 * req.fraction_devices
    return 0.0


class FailedJobs:
    """KAI's scheduling signatures: within one action, skip a job that looks like one that
    already failed (same constraints) unless it is strictly easier to place."""

    def __init__(self) -> None:
        self.failed: dict[tuple[object, ...], list[tuple[float, int, int]]] = {}

    @staticmethod
    def _key(job: JobState, scope: str) -> tuple[object, ...]:
        kinds = tuple(sorted({(t.req.gpus > 0, t.req.gpu_fraction_milli > 0,
                               t.req.gpu_memory_mib > 0, t.node_selector)
                              for t in job.pending_tasks()}, key=repr))
        return (scope, job.priority, job.preemptible, kinds)

    @staticmethod
    def _footprint(job: JobState) -> list[tuple[float, int, int]]:
        return sorted(((_gpu_amount(t), t.req.cpu_m, t.req.memory) for t in job.pending_tasks()),
                      reverse=True)

    def should_skip(self, job: JobState, scope: str) -> bool:
        known = self.failed.get(self._key(job, scope))
        if known is None:
            return False
        mine = self._footprint(job)
        if len(mine) < len(known):
            return False
        for a, b in zip(mine, known, strict=False):
            if a != b:
                return not all(x <= y for x, y in zip(a, b, strict=True))
        return True

    def record(self, job: JobState, scope: str) -> None:
        key = self._key(job, scope)
        mine = self._footprint(job)
        known = self.failed.get(key)
        if known is None or (len(mine) <= len(known)
                             and all(all(x <= y for x, y in zip(a, b, strict=True))
                                     for a, b in zip(mine, known, strict=False))):
            self.failed[key] = mine


class VictimCache:
    """Victim candidates and free GPUs for one action run. A job that fails rolls the session
    back; one that succeeds changes only the jobs its decisions touched (found in the undo log),
    so only their victim units are rebuilt. Keyed by the candidates' scope (which victims a job
    may take); candidate membership is fixed within an action."""

    def __init__(self) -> None:
        self.version = -1
        self.free: _FreeGpus | None = None
        self.scopes: dict[object, dict[str, VictimUnit | None]] = {}
        self.entries: dict[object, tuple[list[VictimUnit], _FreeGpus,
                                         JobQueue[VictimUnit]]] = {}

    def get(self, sess: Session, scope: object, candidates: Callable[[], list[JobState]]
            ) -> tuple[list[VictimUnit], _FreeGpus, _FreeGpus, JobQueue[VictimUnit]]:
        if self.version != len(sess.undo) or self.free is None:
            touched = None  # None: rebuild everything
            if 0 <= self.version <= len(sess.undo):
                touched = {id(entry[1].job) for entry in sess.undo[self.version:]
                           if isinstance(entry[1], Task)}
            self.version = len(sess.undo)
            self.free = _FreeGpus(sess)
            self.entries = {}
            for units in self.scopes.values():
                for name in list(units):
                    job = sess.jobs[name]
                    if touched is None or id(job) in touched:
                        units[name] = _unit_of(job)
        if scope is None:
            units_list = victim_units(candidates())
            all_freed = self.free.with_victims(sess, [t for u in units_list for t in u.tasks])
            return units_list, self.free, all_freed, JobQueue(sess, units_list, reverse=True)
        entry = self.entries.get(scope)
        if entry is None:
            by_job = self.scopes.get(scope)
            if by_job is None:
                by_job = {job.name: _unit_of(job) for job in candidates()}
                self.scopes[scope] = by_job
            units_list = [u for u in by_job.values() if u is not None]
            all_freed = self.free.with_victims(sess, [t for u in units_list for t in u.tasks])
            entry = (units_list, all_freed, JobQueue(sess, units_list, reverse=True))
            self.entries[scope] = entry
        return entry[0], self.free, entry[1], entry[2]


def _unit_of(job: JobState) -> VictimUnit | None:
    units = victim_units([job])
    return units[0] if units else None


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
        # queues a validator said can give nothing more: their other jobs are not tried as
        # victims for this job (more victims from them would be rejected the same way)
        self.exhausted: set[str] = set()
        self.message = message
        self._units: list[VictimUnit] = []
        self._free = self._all_freed = _FreeGpus(sess)
        self._victim_queue: JobQueue[VictimUnit] = JobQueue(sess, (), reverse=True)

    def solve(self, job: JobState) -> bool:
        """Try to make room for `job`; on success the winning scenario stays applied."""
        sess = self.sess
        self.exhausted = set()
        tasks = job.tasks_to_allocate()
        if not tasks:
            return False
        base = sess.checkpoint()
        active_before = job.active_count()
        # the state is rolled back to `base` before every prefix, so the candidates and the free
        # GPUs are the same for all of them
        (self._units, self._free, self._all_freed,
         self._victim_queue) = self.cache.get(sess, self.scope, self.candidates)
        recorded: list[Task] = []
        solved = False
        for k in range(1, len(tasks) + 1):
            victims = self._solve_prefix(job, tasks[:k], recorded)
            if victims is None:
                break
            recorded = victims
            solved = k == len(tasks)
            if not solved:
                sess.rollback(base)
        if solved and job.gang_satisfied() and job.active_count() > active_before:
            return True
        sess.rollback(base)
        return False

    def _solve_prefix(self, job: JobState, prefix: list[Task], recorded: list[Task]
                      ) -> list[Task] | None:
        room = _GpuRoom(self.sess, self._free, prefix)
        for t in recorded:
            room.add_victim(t)
        if recorded and room.enough():
            result = self._try(job, prefix, recorded)
            if result is not None:
                return result
        recorded_set = {id(t) for t in recorded}
        if not _GpuRoom(self.sess, self._all_freed, prefix).enough():
            return None  # not even every candidate victim together would make room
        queue = self._victim_queue.clone()
        potential: list[Task] = []
        while (unit := queue.pop()) is not None:
            if self.exhausted and any(q.name in self.exhausted
                                      for q in self.sess.queue_path(unit.queue)):
                continue
            taken, rest = unit.take()
            if any(id(t) in recorded_set for t in taken):
                remaining = [t for t in unit.tasks if id(t) not in recorded_set]
                if remaining:
                    queue.push(VictimUnit(unit.job, remaining))
                continue
            if rest is not None:
                queue.push(rest)
            potential.extend(taken)
            for t in taken:
                room.add_victim(t)
            if not room.enough():
                continue  # even every victim so far would not free enough GPUs: skip simulating
            for node in sorted({t.node for t in taken}):
                scenario = recorded + [t for t in potential if t.node == node]
                if not room.enough_with(scenario):
                    continue
                result = self._try(job, prefix, scenario)
                if result is not None:
                    return result
        return None

    def _try(self, job: JobState, prefix: list[Task], victims: list[Task]) -> list[Task] | None:
        """Simulate one scenario. On success the state stays applied and the victims that
        matter (evicted or moved) are returned."""
        sess = self.sess
        checkpoint = sess.checkpoint()
        for task in victims:
            sess.evict(task)
            sess.evict_info[task.idx] = EvictInfo(self.action, job.name,
                                                  partial(self.message, task, job))
        victim_jobs = list({id(t.job): t.job for t in victims}.values())
        order: JobQueue[JobState] = JobQueue(sess, [job, *victim_jobs], simulation=True)
        while (next_job := order.pop()) is not None:
            if next_job is job:
                pending = [t for t in prefix if t.status == PodStatus.PENDING]
                if not place_tasks(sess, job, pending, pipeline_only=True, record=False):
                    sess.rollback(checkpoint)
                    return None
                continue
            again = next_job.tasks_to_allocate(simulation=True)
            if again:
                place_tasks(sess, next_job, again, pipeline_only=True, record=False)
        evicted = [t for t in victims if t.status == PodStatus.RELEASING and t.moved is None]
        moved = [t for t in victims if t.moved is not None]
        rejected = self.validator(evicted, moved)
        if rejected is not None:
            sess.rollback(checkpoint)
            if rejected:
                self.exhausted.add(rejected)
            return None
        return evicted + moved
