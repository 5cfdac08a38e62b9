"""The victim solver shared by reclaim, preempt and consolidation (kai-spec §6.4).

For a pending job it grows prefixes of its tasks-to-allocate. Each prefix starts from the victims
recorded for the previous one and adds potential victims in victim order, one job (or one extra
task of an elastic job) at a time; every scenario evicts the recorded victims plus the potential
victims on one node of the latest one, then places the preemptor and the victims again
(pipeline only): a victim that fits back where it was is left alone, one placed elsewhere is
moved, one not placed stays evicted. An action-specific validator accepts or rejects the scenario.

The same decisions, faster: the victim order is popped once per session state and shared by
every prefix (`_VictimStream`), a prefix skips the victims that cannot yet make room for it
without testing them one by one, and `_GpuRoom` keeps the idle-GPU filter incremental.
tests/core/test_fast_paths.py checks each shortcut against the plain path.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np

from kai_ray.core.actions.common import place_tasks
from kai_ray.core.model import PodStatus
from kai_ray.core.ordering import JobQueue, victim_key
from kai_ray.core.state import MILLI, EvictInfo, JobState, Session, Task

_K = TypeVar("_K")
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
        """Tasks to evict next: one extra task of a podset above its minimum (with the other
        hosts of its replica: a replica is never split), else all."""
        if len(self.tasks) == 1:
            return list(self.tasks), None  # no podset is above its minimum (at least 1)
        above = [(name, ts) for name, ts in self.by_set.items()
                 if len(ts) > self.job.podsets[name].min_member]
        if above:
            _, ts = max(above, key=lambda item: (
                len(item[1]) / self.job.podsets[item[0]].min_member, item[0]))
            victim = max(ts, key=Task.sort_key)
            taken = [victim] if victim.replica is None else [
                t for t in ts if t.replica == victim.replica]
            rest = [t for t in self.tasks if all(t is not v for v in taken)]
            return taken, (VictimUnit(self.job, rest) if rest else None)
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
        self._device_totals: tuple[int, int] | None = None
        self._top: list[tuple[int, tuple[int, str]]] | None = None
        self._top_count = 0
        self._top_whole: list[tuple[int, int]] | None = None
        self._whole_totals: tuple[int, int] | None = None
        self._freed: _Freed | None = None

    @property
    def devices(self) -> dict[tuple[int, str], int]:
        """Room per shared device that has some (and is not entirely releasing)."""
        if self._devices is None:
            sess = self.sess
            room = MILLI - sess.dev_used + sess.dev_rel
            live = (sess.schedulable[:, None] & sess.dev_on & (sess.dev_rel < sess.dev_used)
                    & (room > 0))
            self._devices = {}
            gids: dict[int, list[str]] = {}
            for n, slot in zip(*np.nonzero(live), strict=True):
                node = int(n)
                if node not in gids:
                    gids[node] = list(sess.groups[node])  # slot order = the groups' order
                self._devices[(node, gids[node][int(slot)])] = int(room[n, slot])
            if self._freed is not None:
                for key, amount in self._freed.device.items():
                    group = sess.groups[key[0]].get(key[1])
                    if group is None:
                        continue
                    if amount + group.releasing >= group.used:
                        self._devices.pop(key, None)
                    else:
                        self._devices[key] = MILLI - group.used + group.releasing + amount
        return self._devices

    def top_rooms(self, count: int) -> list[tuple[int, tuple[int, str]]]:
        """The `count` roomiest shared devices (room, key), roomiest first."""
        if count <= 0:
            return []
        if self._top is None or (len(self._top) < count and self._top_count < count):
            limit = max(count, 2 * self._top_count, 32)
            self._top = heapq.nlargest(limit, ((v, k) for k, v in self.devices.items() if v > 0))
            self._top_count = limit
        return self._top[:count]

    def top_whole(self, count: int) -> list[tuple[int, int]]:
        """The `count` nodes with the most free whole GPUs (gpus, node), most first."""
        if count <= 0:
            return []
        if self._top_whole is None or (len(self._top_whole) < count
                                       and len(self._top_whole) < len(self.whole)):
            limit = max(count, 2 * len(self._top_whole or ()), 32)
            self._top_whole = heapq.nlargest(limit, ((v, n) for n, v in self.whole.items()
                                                     if v > 0))
        return self._top_whole[:count]

    def whole_totals(self) -> tuple[int, int]:
        """Free whole GPUs: in total and on the roomiest node."""
        if self._whole_totals is None:
            self._whole_totals = (sum(self.whole.values()), max(self.whole.values(), default=0))
        return self._whole_totals

    def device_totals(self) -> tuple[int, int]:
        """Room on partly used shared devices: in total and on the roomiest device."""
        if self._device_totals is None:
            rooms = [v for v in self.devices.values() if v > 0]
            self._device_totals = (sum(rooms), max(rooms, default=0))
        return self._device_totals

    def with_freed(self, freed: _Freed) -> _FreeGpus:
        """The same after every victim counted in `freed` is gone."""
        out = _FreeGpus.__new__(_FreeGpus)
        out.sess = self.sess
        out.whole = dict(self.whole)
        out._devices = None
        out._device_totals = None
        out._top = None
        out._top_count = 0
        out._top_whole = None
        out._whole_totals = None
        out._freed = freed
        for node, gpus in freed.whole.items():
            if gpus:
                out.whole[node] = out.whole.get(node, 0) + gpus
        for key, amount in freed.device.items():
            group = self.sess.groups[key[0]].get(key[1])
            if group is not None and amount + group.releasing >= group.used:
                out.whole[key[0]] = out.whole.get(key[0], 0) + 1
        return out

    def with_victims(self, sess: Session, victims: list[Task]) -> _FreeGpus:
        freed = _Freed(sess)
        for t in victims:
            freed.add(t, +1)
        return self.with_freed(freed)


class _Freed:
    """What a set of victims would free: whole GPUs per node and room per shared device,
    kept as sums so victims can be added and removed one by one."""

    __slots__ = ("device", "sess", "whole")

    def __init__(self, sess: Session) -> None:
        self.sess = sess
        self.whole: dict[int, int] = {}
        self.device: dict[tuple[int, str], int] = {}

    def add(self, t: Task, sign: int) -> None:
        if t.node < 0 or not self.sess.schedulable[t.node]:
            return
        if t.req.gpus:
            self.whole[t.node] = self.whole.get(t.node, 0) + sign * t.req.gpus
            return
        for gid in t.groups:
            key = (t.node, gid)
            self.device[key] = self.device.get(key, 0) + sign * t.gpu_mem_cost


class _GpuRoom:
    """KAI's accumulated idle-GPU filter, made device-aware: can the prefix's GPU requests be
    matched greedily to what is free plus what the victims would free? Whole-GPU requests need
    whole devices (a shared device frees up only when all its sharers go); fractional requests
    need one device with enough room each. If not, no simulation can work."""

    def __init__(self, sess: Session, base: _FreeGpus, prefix: list[Task]) -> None:
        self.sess = sess
        self.base = base
        self.whole_needed, self.fractions_needed = self.needs(sess, prefix)
        self.trivial = not self.whole_needed and not self.fractions_needed
        # free whole GPUs of the nodes and rooms of the devices the victims so far changed
        # (room 0: freed whole); the others are as in `base`, which is not copied: it can
        # hold every node
        self.whole: dict[int, int] = {}
        self.devices: dict[tuple[int, str], int] = {}
        self.freed: dict[tuple[int, str], int] = {}
        # running sums and maxima of `whole` and the device rooms (maxima may overestimate):
        # the necessary conditions they give reject most prefixes without the greedy match
        self.total_whole, self.max_whole = base.whole_totals()
        self.total_room, self.max_room = base.device_totals() if self.fractions_needed else (0, 0)
        # the k nodes with the most free whole GPUs and the k roomiest devices: a greedy match
        # of k requests never uses others. Victims only add room, so both stay exact by
        # insertion, except when a device frees up entirely (its room goes to 0, it becomes a
        # whole GPU): then the device top is rebuilt (None)
        self.top_whole = {n: v for v, n in base.top_whole(len(self.whole_needed))}
        self.top_rooms: dict[tuple[int, str], int] | None = (
            {key: v for v, key in base.top_rooms(len(self.fractions_needed))})

    @staticmethod
    def needs(sess: Session, prefix: list[Task]) -> tuple[list[int], list[int]]:
        """The prefix's whole-GPU requests and its fractions in milli of a device, largest
        first (a fraction at its cheapest: gpu-memory costs least on the biggest GPUs)."""
        whole = sorted((t.req.gpus for t in prefix if t.req.gpus), reverse=True)
        widest = sess.widest_gpu_node()
        fractions = sorted((sess.device_cost(t.req, widest) for t in prefix
                            for _ in range(t.req.fraction_devices) if t.req.is_shared),
                           reverse=True)
        return whole, fractions

    def _room(self, devices: dict[tuple[int, str], int], key: tuple[int, str]) -> int:
        room = devices.get(key)
        return self.base.devices.get(key, 0) if room is None else room

    def add_victim(self, task: Task) -> None:
        if self.trivial or task.node < 0:
            return
        node = task.node
        before = self.whole.get(node, self.base.whole.get(node, 0))
        keys = [(node, gid) for gid in task.groups] if self.fractions_needed else []
        rooms_before = [self._room(self.devices, key) for key in keys]
        self.free_into(task, self.whole, self.devices, self.freed)
        after = self.whole.get(node, self.base.whole.get(node, 0))
        self.total_whole += after - before
        self.max_whole = max(self.max_whole, after)
        if after > before:
            _raise_in_top(self.top_whole, node, after, len(self.whole_needed))
        for key, room_before in zip(keys, rooms_before, strict=True):
            room = self._room(self.devices, key)
            self.total_room += room - room_before
            self.max_room = max(self.max_room, room)
            if self.top_rooms is None:
                continue
            if room > room_before:
                _raise_in_top(self.top_rooms, key, room, len(self.fractions_needed))
            elif room < room_before and key in self.top_rooms:
                self.top_rooms = None

    def add_victims(self, tasks: list[Task]) -> None:
        """`add_victim` for each of `tasks`; with whole requests only, the totals and the top
        are updated once per node (values only grow, so the final one is what counts)."""
        if self.fractions_needed:
            for t in tasks:
                self.add_victim(t)
            return
        if self.trivial:
            return
        base = self.base.whole
        before: dict[int, int] = {}
        for t in tasks:
            if t.node not in before:
                before[t.node] = self.whole.get(t.node, base.get(t.node, 0))
            self.free_into(t, self.whole, self.devices, self.freed)
        k = len(self.whole_needed)
        for node, old in before.items():
            new = self.whole.get(node, base.get(node, 0))
            if new > old:
                self.total_whole += new - old
                self.max_whole = max(self.max_whole, new)
                _raise_in_top(self.top_whole, node, new, k)

    def adopt(self, whole: dict[int, int], freed: dict[tuple[int, str], int]) -> None:
        """Make the victims counted in `whole` and `freed` (overlays over `base`, as
        `free_into` leaves them) the victims so far, in place of those added before."""
        base = self.base
        self.whole = dict(whole)
        self.freed = dict(freed)
        self.total_whole = base.whole_totals()[0] + sum(
            v - base.whole.get(n, 0) for n, v in whole.items())
        self.max_whole = max(base.whole_totals()[1], max(whole.values(), default=0))
        k = len(self.whole_needed)
        merged = list(whole.items()) + [(n, v) for v, n in base.top_whole(k + len(whole))
                                        if n not in whole]
        self.top_whole = dict(heapq.nlargest(k, merged, key=lambda item: item[1]))
        if not self.fractions_needed:
            return
        self.devices = {}
        for key, amount in freed.items():
            group = self.sess.groups[key[0]].get(key[1])
            if group is not None:
                self.devices[key] = (0 if amount + group.releasing >= group.used
                                     else MILLI - group.used + group.releasing + amount)
        self.total_room = base.device_totals()[0] + sum(
            v - base.devices.get(key, 0) for key, v in self.devices.items())
        self.max_room = max(base.device_totals()[1], max(self.devices.values(), default=0))
        self.top_rooms = None

    def enough(self) -> bool:
        if self.trivial:
            return True
        if self.whole_needed and (self.total_whole < sum(self.whole_needed)
                                  or self.max_whole < self.whole_needed[0]):
            return False
        if self.fractions_needed:
            spare = self.total_whole - sum(self.whole_needed)
            if (self.total_room + MILLI * spare < sum(self.fractions_needed)
                    or max(self.max_room, MILLI if spare > 0 else 0) < self.fractions_needed[0]):
                return False
        if self.top_rooms is None:
            self.top_rooms = dict(self._merged_rooms(self.devices))
        return self._greedy(list(self.top_whole.values()), list(self.top_rooms.values()),
                            self.total_whole)

    def enough_with(self, victims: list[Task]) -> bool:
        """The same test when only `victims` go (one scenario)."""
        if self.trivial:
            return True
        whole: dict[int, int] = {}
        devices: dict[tuple[int, str], int] = {}
        freed: dict[tuple[int, str], int] = {}
        for t in victims:
            self.free_into(t, whole, devices, freed)
        return self._match(whole, devices)

    def free_into(self, t: Task, whole: dict[int, int], devices: dict[tuple[int, str], int],
                  freed: dict[tuple[int, str], int]) -> None:
        """Count victim `t` as gone: its whole GPUs, or its share of each of its devices (a
        device all of whose sharers go becomes a whole GPU: its room is set to 0)."""
        sess = self.sess
        if t.node < 0 or not sess.schedulable[t.node]:
            return
        base = self.base.whole
        if t.req.gpus:
            whole[t.node] = whole.get(t.node, base.get(t.node, 0)) + t.req.gpus
            return
        for gid in t.groups:
            key = (t.node, gid)
            freed[key] = freed.get(key, 0) + t.gpu_mem_cost
            group = sess.groups[t.node].get(gid)
            if group is None:
                continue
            if freed[key] + group.releasing >= group.used:
                whole[t.node] = whole.get(t.node, base.get(t.node, 0)) + 1
                devices[key] = 0
            elif self.fractions_needed:
                devices[key] = MILLI - group.used + group.releasing + freed[key]

    def _match(self, whole: dict[int, int], devices: dict[tuple[int, str], int]) -> bool:
        """The greedy match for one scenario's overlay (`whole`, `devices`) over `base`."""
        tops = [v for v in whole.values() if v > 0]
        for gpus, node in self.base.top_whole(len(self.whole_needed) + len(whole)):
            if node not in whole:
                tops.append(gpus)
        base_whole = self.base.whole
        total = (self.base.whole_totals()[0]
                 + sum(v - base_whole.get(n, 0) for n, v in whole.items()))
        rooms = [v for _, v in self._merged_rooms(devices)] if self.fractions_needed else []
        return self._greedy(tops, rooms, total)

    def _merged_rooms(self, devices: dict[tuple[int, str], int]
                      ) -> list[tuple[tuple[int, str], int]]:
        """The k roomiest devices, with the overlay `devices` over `base`."""
        k = len(self.fractions_needed)
        merged = [(key, v) for key, v in devices.items() if v > 0]
        for room, key in self.base.top_rooms(k + len(devices)):
            if key not in devices:
                merged.append((key, room))
        merged.sort(key=lambda item: -item[1])
        return merged[:k]

    def _greedy(self, tops: list[int], rooms: list[int], total_whole: int) -> bool:
        """Largest request into the roomiest place: whole requests into nodes' free whole GPUs
        (`tops` holds at least the k largest), then fractions into device rooms and the whole
        GPUs left over. Only the k roomiest places can take part in matching k requests."""
        heap = [-v for v in tops if v > 0]
        heapq.heapify(heap)
        for need in self.whole_needed:
            most = -heapq.heappop(heap) if heap else 0
            if most < need:
                return False
            heapq.heappush(heap, -(most - need))
        if not self.fractions_needed:
            return True
        k = len(self.fractions_needed)
        spare = total_whole - sum(self.whole_needed)
        places = [-v for v in rooms if v > 0] + [-MILLI] * min(k, spare)
        heapq.heapify(places)
        for cost in self.fractions_needed:
            most = -heapq.heappop(places) if places else 0
            if most < cost:
                return False
            heapq.heappush(places, -(most - cost))
        return True


def _raise_in_top(top: dict[_K, int], key: _K, value: int, k: int) -> None:
    """`key`'s value grew to `value`: keep `top` the k largest values (ties are equivalent)."""
    if key in top or len(top) < k:
        top[key] = value
        return
    if not top:
        return
    low = min(top, key=top.__getitem__)
    if value > top[low]:
        del top[low]
        top[key] = value


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


def _unit_of(job: JobState) -> VictimUnit | None:
    units = victim_units([job])
    return units[0] if units else None


class _ScopeVictims:
    """One scope's victim units, their victim-order queue and what they would free together,
    updated job by job (candidate membership is fixed within an action)."""

    def __init__(self, sess: Session, jobs: list[JobState]) -> None:
        self.units: dict[str, VictimUnit] = {}
        self.freed = _Freed(sess)
        for job in jobs:
            self._add(job)
        self.queue: JobQueue[VictimUnit] = JobQueue(sess, self.units.values(), reverse=True)

    def _add(self, job: JobState) -> VictimUnit | None:
        unit = _unit_of(job)
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


class _Holds:
    """After each stream entry: how many requests of `size` whole GPUs the nodes' free whole
    GPUs could hold (the sum over nodes of free // size)."""

    def __init__(self, size: int, free: _FreeGpus) -> None:
        self.size = size
        self.base = free.whole
        self.node_free: dict[int, int] = {}
        self.now = sum(v // size for v in self.base.values())
        self.values: list[int] = []

    def step(self, sess: Session, gains: dict[int, int],
             events: list[tuple[tuple[int, str], int]]) -> None:
        for node, gain in gains.items():
            old = self.node_free.get(node, self.base.get(node, 0))
            self.node_free[node] = old + gain
            self.now += (old + gain) // self.size - old // self.size
        self.values.append(self.now)


class _Fits:
    """After each stream entry: how many fractions of `size` milli the places could hold (the
    sum over live shared devices of room // size, plus MILLI // size per free whole GPU)."""

    def __init__(self, size: int, free: _FreeGpus) -> None:
        self.size = size
        self.per_whole = MILLI // size
        self.device_freed: dict[tuple[int, str], int] = {}
        self.now = (sum(room // size for room in free.devices.values())
                    + self.per_whole * free.whole_totals()[0])
        self.values: list[int] = []

    def step(self, sess: Session, gains: dict[int, int],
             events: list[tuple[tuple[int, str], int]]) -> None:
        self.now += self.per_whole * sum(gains.values())
        for key, cost in events:
            group = sess.groups[key[0]].get(key[1])
            if group is None:
                continue
            before = self.device_freed.get(key, 0)
            self.device_freed[key] = before + cost
            old = MILLI - group.used + group.releasing + before
            new = 0 if before + cost + group.releasing >= group.used else old + cost
            self.now += new // self.size - old // self.size
        self.values.append(self.now)


class _VictimStream:
    """A scope's victim order against one session state, popped once and read by every prefix
    of every job tried against that state (a job that fails leaves the state as it was). In one
    queue the order is that of the units' keys alone, so a prefix with recorded victims reads
    the same order with their jobs' entries replaced (see `read`); with several queues only
    prefixes whose recorded jobs were taken whole can (`covers`). After a success, a one-queue
    stream is carried over to the new state rather than popped again (`renew`).

    Per entry it also tallies, from the start, what the victims so far free (whole GPUs in
    total, requests of each size the nodes could hold, milli of GPU): a prefix reads every entry
    before the first where those tallies could meet its needs as one quiet batch, without
    testing or simulating anything."""

    def __init__(self, sess: Session, queue: JobQueue[VictimUnit],
                 units: dict[str, VictimUnit], free: _FreeGpus) -> None:
        self.sess = sess
        self.source = queue.clone()
        self.one_queue = len(self.source.live_queues()) <= 1
        self.units = units  # each job's current unit (the scope keeps it up to date)
        # the unit each job has waiting in `source`, if any (kept for `renew`)
        self.in_source = dict(units)
        self._start(free)

    def _start(self, free: _FreeGpus) -> None:
        """No entry popped or counted yet."""
        self.free = free  # free GPUs before any victim goes
        self.keys: list[tuple[int, int, float, int]] = []
        self.jobs: list[JobState] = []
        self.taken: list[list[Task]] = []
        self.positions: dict[int, list[int]] = {}  # each job's entries
        self.reach = 0  # entries read by a prefix so far
        self.done = False
        # every entry so far took its unit whole (then `renew` can carry the stream over)
        self.single_takes = True
        # counted per entry (see `_grow`): whole GPUs it frees per node (a device whose sharers
        # are all gone counts) and the milli it frees on each shared device
        self.gains: list[dict[int, int]] = []
        self.events: list[list[tuple[tuple[int, str], int]]] = []
        self.whole: list[int] = []  # whole GPUs freed by entries 0..i
        self.milli: list[int] = []  # at most this many milli of GPU freed by entries 0..i
        self.tallies: dict[tuple[str, int], _Holds | _Fits] = {}
        self._device_freed: dict[tuple[int, str], int] = {}
        # what entries 0..cursor-1 free, as `_GpuRoom.free_into` counts it: a prefix whose
        # quiet batch is exactly those entries adopts it instead of adding them one by one
        self._counter = _GpuRoom(self.sess, free, [])
        self.cursor = 0
        self.cursor_whole: dict[int, int] = {}
        self.cursor_freed: dict[tuple[int, str], int] = {}

    def _more(self) -> bool:
        """Pop one more entry."""
        if self.done:
            return False
        unit = self.source.pop()
        if unit is None:
            self.done = True
            return False
        self.in_source.pop(unit.job.name, None)
        taken, rest = unit.take()
        if rest is not None:
            self.source.push(rest)
            self.single_takes = False
        self.positions.setdefault(id(unit.job), []).append(len(self.keys))
        self.keys.append(victim_key(self.sess, unit.order_key()))
        self.jobs.append(unit.job)
        self.taken.append(taken)
        return True

    def renew(self, free: _FreeGpus, touched: set[str]) -> bool:
        """Carry the stream over to the next state, where the jobs named in `touched` have new
        units in `units` (or none): their entries go, the others keep their order, and the
        touched jobs' new units are merged in by key. The tallies start again (free GPUs
        changed). Only for one queue and single takes, where each job is one entry: entries
        not read yet and the new units go back to the source, old units waiting there are
        marked dead."""
        if not (self.one_queue and self.single_takes):
            return False
        source = self.source
        kept = [i for i, job in enumerate(self.jobs[:self.reach]) if job.name not in touched]
        waiting = [job.name for job in self.jobs[self.reach:] if job.name not in touched]
        for name in [*touched, *waiting]:
            old = self.in_source.pop(name, None)
            if old is not None:
                source.dead.add(id(old))
            unit = self.units.get(name)
            if unit is not None:
                source.push(unit)
                self.in_source[name] = unit
        last = self.keys[kept[-1]] if kept else None
        new: list[tuple[tuple[int, int, float, int], JobState, list[Task]]] = []
        while last is not None and (top := self._top_key(source)) is not None and top < last:
            unit = source.pop()
            assert unit is not None
            self.in_source.pop(unit.job.name, None)
            taken, rest = unit.take()
            if rest is not None:
                source.push(rest)
                self.single_takes = False
            new.append((victim_key(self.sess, unit.order_key()), unit.job, taken))
        entries = list(heapq.merge(((self.keys[i], self.jobs[i], self.taken[i]) for i in kept),
                                   new, key=lambda entry: entry[0]))
        single = self.single_takes
        self._start(free)
        self.single_takes = single
        for key, job, taken in entries:
            self.positions.setdefault(id(job), []).append(len(self.keys))
            self.keys.append(key)
            self.jobs.append(job)
            self.taken.append(taken)
        return True

    @staticmethod
    def _top_key(queue: JobQueue[VictimUnit]) -> tuple[int, int, float, int] | None:
        """The key of the item `queue` (one queue) pops next, or None."""
        for heap in queue.heaps.values():
            while heap and id(heap[0][2]) in queue.dead:
                queue.dead.discard(id(heapq.heappop(heap)[2]))
            if heap:
                key = heap[0][0]
                assert isinstance(key, tuple)
                return key
        return None

    def _grow(self) -> bool:
        """Count one more entry in the tallies (popping it first if need be)."""
        i = len(self.whole)
        if i == len(self.keys) and not self._more():
            return False
        taken = self.taken[i]
        gains, events = self._frees(taken, self._device_freed)
        self.gains.append(gains)
        self.events.append(events)
        self.whole.append((self.whole[-1] if self.whole else 0) + sum(gains.values()))
        self.milli.append((self.milli[-1] if self.milli else 0) + MILLI * sum(
            t.req.gpus for t in taken if t.node >= 0 and self.sess.schedulable[t.node])
            + sum(cost for _, cost in events))
        for tally in self.tallies.values():
            tally.step(self.sess, gains, events)
        return True

    def _tally(self, kind: str, size: int) -> list[int]:
        """The running values of one tally, started on first use by replaying the entries."""
        tally = self.tallies.get((kind, size))
        if tally is None:
            tally = _Holds(size, self.free) if kind == "holds" else _Fits(size, self.free)
            for gains, events in zip(self.gains, self.events, strict=True):
                tally.step(self.sess, gains, events)
            self.tallies[(kind, size)] = tally
        return tally.values

    def _frees(self, tasks: list[Task], device_freed: dict[tuple[int, str], int]
               ) -> tuple[dict[int, int], list[tuple[tuple[int, str], int]]]:
        """Whole GPUs `tasks` free per node after the ones counted in `device_freed` (which
        they join), and the milli they free on each shared device."""
        sess = self.sess
        gains: dict[int, int] = {}
        events: list[tuple[tuple[int, str], int]] = []
        for t in tasks:
            if t.node < 0 or not sess.schedulable[t.node]:
                continue
            if t.req.gpus:
                gains[t.node] = gains.get(t.node, 0) + t.req.gpus
                continue
            for gid in t.groups:
                key = (t.node, gid)
                events.append((key, t.gpu_mem_cost))
                freed = device_freed[key] = device_freed.get(key, 0) + t.gpu_mem_cost
                group = sess.groups[t.node].get(gid)
                if group is not None and freed - t.gpu_mem_cost + group.releasing < group.used \
                        <= freed + group.releasing:
                    gains[t.node] = gains.get(t.node, 0) + 1
        return gains, events

    def _first_reaching(self, sums: list[int], target: int) -> int:
        """The first entry whose running sum reaches `target` (counting as far as needed), or
        the number of entries when none does."""
        while (not sums or sums[-1] < target) and self._grow():
            pass
        return bisect_left(sums, target)

    def covers(self, recorded: list[Task]) -> bool:
        """Whether `read` gives what `Solver._popped` would for `recorded`. With several
        queues the order also depends on what each queue already gave, so only when every
        job with a recorded victim is one unit, taken whole and recorded whole: then popping
        skips it exactly where the stream has it, and the rest is the same."""
        return self.one_queue or self._recorded_whole(recorded)

    def _recorded_whole(self, recorded: list[Task]) -> bool:
        """Every job with a recorded victim is one unit, taken whole and recorded whole."""
        ids = {id(t) for t in recorded}
        for job in {id(t.job): t.job for t in recorded}.values():
            unit = self.units.get(job.name)
            if unit is not None and (unit.take()[1] is not None
                                     or any(id(t) not in ids for t in unit.tasks)):
                return False
        return True

    def read(self, recorded: list[Task], exhausted: set[str], room: _GpuRoom
             ) -> Iterator[tuple[list[Task], bool]]:
        """What `Solver._popped` would yield for `recorded`, without popping again: the
        entries of jobs with a recorded victim are left out and those jobs' units are taken
        anew on the side (as `_popped` does), merged in by key. The first item is the batch
        of victims that cannot make room for `room`'s prefix (quiet: they are added to `room`
        here), then one entry at a time."""
        recorded_set = {id(t) for t in recorded}
        side: list[tuple[tuple[int, int, float, int], int, VictimUnit]] = []
        side_jobs = {id(t.job): t.job for t in recorded}
        # what the stream's tallies do not count: the recorded victims and what the side
        # units may take (tallies counted high from these, per request size)
        others: list[Task] = []
        for job in side_jobs.values():
            unit = self.units.get(job.name)
            if unit is None:
                continue
            side.append((victim_key(self.sess, unit.order_key()), len(side), unit))
            others.extend(t for t in unit.tasks if id(t) not in recorded_set)
        heapq.heapify(side)
        quiet_until = self._quiet_until(room, recorded, others)
        seq = len(side)
        batch: list[Task] = []
        i = 0
        while True:
            more = i < len(self.keys) or self._more()
            base_key = self.keys[i] if more else None
            quiet = i < quiet_until
            if side and (base_key is None or side[0][0] < base_key):
                unit = heapq.heappop(side)[2]
                if self._exhausted(exhausted, unit.job):
                    continue
                taken, rest = unit.take()
                if any(id(t) in recorded_set for t in taken):
                    remaining = [t for t in unit.tasks if id(t) not in recorded_set]
                    if not remaining:
                        continue
                    rest = VictimUnit(unit.job, remaining)
                    taken = []
                if rest is not None:
                    seq += 1
                    heapq.heappush(side, (victim_key(self.sess, rest.order_key()), seq, rest))
            elif base_key is None:
                break
            else:
                job = self.jobs[i]
                taken = self.taken[i]
                i += 1
                self.reach = max(self.reach, i)
                if id(job) in side_jobs or self._exhausted(exhausted, job):
                    continue
            if not taken:
                continue
            if quiet:
                batch.extend(taken)
                continue
            if batch:
                self._count_in(room, batch, quiet_until, recorded, exhausted)
                yield batch, True
                batch = []
            yield taken, False
        if batch:
            self._count_in(room, batch, quiet_until, recorded, exhausted)
            yield batch, True

    def _count_in(self, room: _GpuRoom, batch: list[Task], until: int, recorded: list[Task],
                  exhausted: set[str]) -> None:
        """Add a quiet batch to `room` (which holds the recorded victims). When every recorded
        job is one entry of the stream, taken whole, and no queue is exhausted, the batch plus
        the recorded entries before `until` are exactly entries 0..until-1: `room` adopts the
        stream's count of those and takes the recorded victims after `until` again."""
        jobs = {id(t.job): t.job for t in recorded}.values()
        if (exhausted or self.cursor > until or not self._recorded_whole(recorded)
                or any(len(self.positions.get(id(job), ())) != 1 for job in jobs)):
            room.add_victims(batch)
            return
        while self.cursor < until:
            for t in self.taken[self.cursor]:
                self._counter.free_into(t, self.cursor_whole, {}, self.cursor_freed)
            self.cursor += 1
        room.adopt(self.cursor_whole, self.cursor_freed)
        for t in recorded:
            if self.positions[id(t.job)][0] >= until:
                room.add_victim(t)

    def _exhausted(self, exhausted: set[str], job: JobState) -> bool:
        return bool(exhausted) and any(q.name in exhausted
                                       for q in self.sess.queue_path(job.queue))

    def _quiet_until(self, room: _GpuRoom, recorded: list[Task], others: list[Task]) -> int:
        """Entries before this one cannot give `room`'s prefix enough GPUs, even with the
        victims the stream's tallies leave out (`recorded`, already in `room`, and the
        `others` the side units may take) counted high. Each bound is one `room.enough`
        implies: enough whole GPUs in total; for every size g of whole request, nodes that
        hold the requests of g or more (victims worth s GPUs on a node let it hold at most
        ceil(s / g) more); enough milli of GPU; for every size c of fraction, places that hold
        the fractions of c or more next to the whole requests."""
        if room.trivial:
            return 0
        sess = self.sess
        need_whole = sum(room.whole_needed)
        extra = [t for t in (*recorded, *others) if t.node >= 0 and sess.schedulable[t.node]]
        # whole GPUs beyond the tallies', per node: what the recorded victims free (exactly,
        # from `room`), one per device they leave partly freed (a victim in the stream may
        # finish it), and all the side units could take
        on_node = {n: v - self.free.whole.get(n, 0) for n, v in room.whole.items()}
        for (node, gid), amount in room.freed.items():
            group = sess.groups[node].get(gid)
            if group is not None and amount + group.releasing < group.used:
                on_node[node] = on_node.get(node, 0) + 1
        for t in others:
            if t.node >= 0 and sess.schedulable[t.node]:
                on_node[t.node] = on_node.get(t.node, 0) + (t.req.gpus or len(t.groups))
        on_node = {n: v for n, v in on_node.items() if v > 0}
        until = 0
        if need_whole:
            have = self.free.whole_totals()[0] + sum(on_node.values())
            until = self._first_reaching(self.whole, need_whole - have)
            for g in sorted(set(room.whole_needed) - {1}):
                count = sum(1 for need in room.whole_needed if need >= g)
                more = sum(-(-v // g) for v in on_node.values())
                until = max(until, self._first_reaching(self._tally("holds", g), count - more))
        if room.fractions_needed:
            need = MILLI * need_whole + sum(room.fractions_needed)
            have = MILLI * self.free.whole_totals()[0] + self.free.device_totals()[0] + sum(
                MILLI * t.req.gpus or t.gpu_mem_cost * len(t.groups) for t in extra)
            until = max(until, self._first_reaching(self.milli, need - have))
            for c in sorted(set(room.fractions_needed)):
                count = sum(1 for need in room.fractions_needed if need >= c)
                per_whole = MILLI // c
                more = sum(per_whole * t.req.gpus if t.req.gpus
                           else len(t.groups) * (-(-t.gpu_mem_cost // c) + per_whole)
                           for t in extra)
                until = max(until, self._first_reaching(
                    self._tally("fits", c), count - more + per_whole * need_whole))
        return until


class VictimCache:
    """Victim candidates and free GPUs for one action run. A job that fails rolls the session
    back; one that succeeds changes only the jobs its decisions touched (found in the undo log),
    so only their victim units are rebuilt, in the scopes that hold them. Keyed by the
    candidates' scope (which victims a job may take)."""

    def __init__(self) -> None:
        self.version = -1
        self.free: _FreeGpus | None = None
        self.scopes: dict[object, _ScopeVictims] = {}
        self.member_of: dict[str, list[_ScopeVictims]] = {}
        self.all_freed: dict[object, _FreeGpus] = {}
        self.streams: dict[object, _VictimStream] = {}
        self.touched: dict[object, set[str]] = {}  # per stream, jobs changed since it was built
        self.enough_all: dict[tuple[object, ...], bool] = {}

    def all_enough(self, sess: Session, scope: object, all_freed: _FreeGpus,
                   prefix: list[Task]) -> bool:
        """Whether every candidate victim together would free enough GPUs for `prefix`
        (`_GpuRoom.enough` over `all_freed`), remembered per scope and needs for this state."""
        whole, fractions = _GpuRoom.needs(sess, prefix)
        key = (scope, tuple(whole), tuple(fractions))
        known = self.enough_all.get(key) if scope is not None else None
        if known is None:
            known = _GpuRoom(sess, all_freed, prefix).enough()
            if scope is not None:
                self.enough_all[key] = known
        return known

    def stream(self, sess: Session, scope: object) -> _VictimStream | None:
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
            stream = self.streams[scope] = _VictimStream(sess, victims.queue, victims.units,
                                                         self.free)
        return stream

    def get(self, sess: Session, scope: object, candidates: Callable[[], list[JobState]]
            ) -> tuple[_FreeGpus, _FreeGpus, JobQueue[VictimUnit]]:
        if self.version != len(sess.undo) or self.free is None:
            touched: set[str] = set()
            if 0 <= self.version <= len(sess.undo):
                jobs = list({id(entry[1].job): entry[1].job for entry in sess.undo[self.version:]
                             if isinstance(entry[1], Task)}.values())
                touched = {job.name for job in jobs}
                by_scope: dict[int, tuple[_ScopeVictims, list[JobState]]] = {}
                for job in jobs:
                    for victims in self.member_of.get(job.name, ()):
                        by_scope.setdefault(id(victims), (victims, []))[1].append(job)
                for victims, jobs in by_scope.values():
                    victims.update(jobs)
            else:
                self.scopes, self.member_of, self.streams, self.touched = {}, {}, {}, {}
            self.version = len(sess.undo)
            self.free = _FreeGpus(sess)
            self.all_freed = {}
            self.enough_all = {}
            # streams are carried over when next used (`stream`), with every job touched since
            for key in self.streams:
                self.touched.setdefault(key, set()).update(touched)
        if scope is None:
            units = victim_units(candidates())
            all_freed = self.free.with_victims(sess, [t for u in units for t in u.tasks])
            return self.free, all_freed, JobQueue(sess, units, reverse=True)
        if scope not in self.scopes:
            jobs = candidates()
            self.scopes[scope] = _ScopeVictims(sess, jobs)
            for job in jobs:
                self.member_of.setdefault(job.name, []).append(self.scopes[scope])
        victims = self.scopes[scope]
        if scope not in self.all_freed:
            self.all_freed[scope] = self.free.with_freed(victims.freed)
        return self.free, self.all_freed[scope], victims.queue


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
        self._free, self._all_freed, self._victim_queue = self.cache.get(
            sess, self.scope, self.candidates)
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
        if not self.cache.all_enough(self.sess, self.scope, self._all_freed, prefix):
            return None  # not even every candidate victim together would make room
        stream = self.cache.stream(self.sess, self.scope)
        victims = (stream.read(recorded, self.exhausted, room)
                   if stream is not None and stream.covers(recorded) else self._popped(recorded))
        potential: dict[int, list[Task]] = {}  # by node, in the order they were taken
        for taken, quiet in victims:
            for t in taken:
                potential.setdefault(t.node, []).append(t)
            if quiet:
                continue  # already in `room` (see `_VictimStream.read`); nothing to simulate
            for t in taken:
                room.add_victim(t)
            if not room.enough():
                continue  # even every victim so far would not free enough GPUs: skip simulating
            for node in sorted({t.node for t in taken}):
                scenario = recorded + potential[node]
                if not room.enough_with(scenario):
                    continue
                result = self._try(job, prefix, scenario)
                if result is not None:
                    return result
        return None

    def _popped(self, recorded: list[Task]) -> Iterator[tuple[list[Task], bool]]:
        """The victims in victim order, popped from a copy of the scope's queue: what each
        next unit gives up (never a recorded victim again; what is left of its job goes
        back), skipping queues a validator exhausted."""
        recorded_set = {id(t) for t in recorded}
        queue = self._victim_queue.clone()
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
            yield taken, False

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
