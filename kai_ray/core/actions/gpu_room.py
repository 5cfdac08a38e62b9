"""What victims would free, as KAI's accumulated idle-GPU filter sees it, made device-aware:
free whole GPUs per node and room per shared device (`FreeGpus`), what a set of victims frees
(`Freed`), and the filter itself for one prefix of a job's tasks (`GpuRoom`)."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from kai_ray.core.state import MILLI, Group, Session, Task

_K = TypeVar("_K")


def freed_whole(group: Group, amount: int) -> bool:
    """Whether victims freeing `amount` of a shared device make it a whole GPU for KAI's
    idle-GPU filter. A device only pipelined sharers hold KAI counts in neither of a node's sums
    (GetSumOfIdleGPUs, GetSumOfReleasingGPUs: gpu_sharing_node_info.go:303-325), and its victims
    add only their own fractions (idle_gpus.go:209): whole once those make a device."""
    if group.used <= 0:
        return amount >= MILLI
    return amount + group.releasing >= group.used


class FreeGpus:
    """Free whole GPUs per node and free room per shared device, sparse (a busy cluster has
    few nodes with room). Computed once per job attempt: every prefix starts from this state.
    The device map is only built when a fractional request needs it."""

    def __init__(self, sess: Session, whole: dict[int, int] | None = None) -> None:
        self.sess = sess
        if whole is None:
            free = np.where(sess.schedulable, sess.free_gpu(), 0)
            nodes = np.flatnonzero(free > 0)
            # tolist: plain ints in C, not a numpy scalar per node
            whole = dict(zip(nodes.tolist(), free[nodes].tolist(), strict=True))
        self.whole = whole  # free whole GPUs per node that has some
        self._devices: dict[tuple[int, str], int] | None = None
        self._device_totals: tuple[int, int] | None = None
        self._top: list[tuple[int, tuple[int, str]]] | None = None
        self._top_count = 0
        self._top_whole: list[tuple[int, int]] | None = None
        self._whole_totals: tuple[int, int] | None = None
        self._freed: Freed | None = None

    @property
    def devices(self) -> dict[tuple[int, str], int]:
        """Room per shared device that has some (and is not entirely releasing)."""
        if self._devices is None:
            sess = self.sess
            self._devices = {}
            # the nodes with such a device are those the session keeps by room (schedulable,
            # with a live device that has room): no pass over every node's devices
            for node in sorted(n for nodes in sess.by_room.values() for n in nodes):
                for gid, g in sess.groups[node].items():
                    room = MILLI - g.used + g.releasing
                    if g.releasing < g.used and room > 0:
                        self._devices[(node, gid)] = room
            if self._freed is not None:
                for key, amount in self._freed.device.items():
                    group = sess.groups[key[0]].get(key[1])
                    if group is None:
                        continue
                    if freed_whole(group, amount):
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
            self._top = _largest(limit, self.devices)
            self._top_count = limit
        return self._top[:count]

    def top_whole(self, count: int) -> list[tuple[int, int]]:
        """The `count` nodes with the most free whole GPUs (gpus, node), most first."""
        if count <= 0:
            return []
        if self._top_whole is None or (len(self._top_whole) < count
                                       and len(self._top_whole) < len(self.whole)):
            limit = max(count, 2 * len(self._top_whole or ()), 32)
            self._top_whole = _largest(limit, self.whole)
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

    def with_freed(self, freed: Freed) -> FreeGpus:
        """The same after every victim counted in `freed` is gone."""
        out = FreeGpus(self.sess, dict(self.whole))
        out._freed = freed
        for node, gpus in freed.whole.items():
            if gpus:
                out.whole[node] = out.whole.get(node, 0) + gpus
        for key, amount in freed.device.items():
            group = self.sess.groups[key[0]].get(key[1])
            if group is not None and freed_whole(group, amount):
                out.whole[key[0]] = out.whole.get(key[0], 0) + 1
        return out


class Freed:
    """What a set of victims would free: whole GPUs per node and room per shared device,
    kept as sums so victims can be added and removed one by one."""

    __slots__ = ("device", "sess", "whole")

    def __init__(self, sess: Session) -> None:
        self.sess = sess
        self.whole: dict[int, int] = {}
        self.device: dict[tuple[int, str], int] = {}

    def add(self, t: Task, sign: int) -> None:
        if t.node < 0 or not self.sess.at.schedulable[t.node]:
            return
        if t.req.gpus:
            _bump(self.whole, t.node, sign * t.req.gpus)
            return
        for gid in t.groups:
            _bump(self.device, (t.node, gid), sign * t.gpu_mem_cost)


def _bump(sums: dict[_K, int], key: _K, delta: int) -> None:
    """Add `delta` to a sum, dropping it at 0 (a victim added and taken out leaves no trace)."""
    value = sums.get(key, 0) + delta
    if value:
        sums[key] = value
    else:
        sums.pop(key, None)


class GpuRoom:
    """KAI's accumulated idle-GPU filter, made device-aware: can the prefix's GPU requests be
    matched greedily to what is free plus what the victims would free? Whole-GPU requests need
    whole devices (a shared device frees up only when all its sharers go); fractional requests
    need one device with enough room each. If not, no simulation can work."""

    def __init__(self, sess: Session, base: FreeGpus, prefix: list[Task]) -> None:
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
        # what heapq.nlargest(k, merged, key=...) gives (a stable sort), without its Python loop
        self.top_whole = dict(sorted(merged, key=lambda item: item[1], reverse=True)[:k])
        if not self.fractions_needed:
            return
        self.devices = {}
        for key, amount in freed.items():
            group = self.sess.groups[key[0]].get(key[1])
            if group is not None:
                self.devices[key] = (0 if freed_whole(group, amount)
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
        if t.node < 0 or not sess.at.schedulable[t.node]:
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
            if freed_whole(group, freed[key]):
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
        if not _largest_first(tops, self.whole_needed):
            return False
        if not self.fractions_needed:
            return True
        spare = total_whole - sum(self.whole_needed)
        return _largest_first(rooms + [MILLI] * min(len(self.fractions_needed), spare),
                              self.fractions_needed)


class AllFreed:
    """Free GPUs with every candidate victim of a scope gone (what `FreeGpus.with_freed` gives
    for the scope's `Freed`), kept as counts of values: nodes by free whole GPUs, shared
    devices by room. That is all the idle-GPU filter needs when no victim is added (`enough`),
    and after a success only the nodes it touched are counted again (`refresh`), where a new
    view would go over every node with a victim."""

    def __init__(self, sess: Session, freed: Freed, view: FreeGpus) -> None:
        self.sess = sess
        self.freed = freed
        self.whole: dict[int, int] = {}  # free whole GPUs -> nodes (values > 0 only)
        self.rooms: dict[int, int] = {}  # room in milli -> shared devices (values > 0 only)
        self.total_whole = 0
        self.total_room = 0
        # each node's part (free whole GPUs, device rooms), to take it out again
        self.parts: dict[int, tuple[int, list[int]]] = {}
        by_node: dict[int, list[int]] = {}
        for (node, _), room in view.devices.items():
            by_node.setdefault(node, []).append(room)
        for node in set(view.whole) | set(by_node):
            self._count(node, (view.whole.get(node, 0), by_node.get(node, [])), +1)

    def _count(self, node: int, part: tuple[int, list[int]], sign: int) -> None:
        if sign > 0:
            self.parts[node] = part
        whole, rooms = part
        for counts, values in ((self.whole, (whole,)), (self.rooms, rooms)):
            for value in values:
                if value > 0:
                    counts[value] = counts.get(value, 0) + sign
                    if not counts[value]:
                        del counts[value]
        self.total_whole += sign * max(whole, 0)
        self.total_room += sign * sum(v for v in rooms if v > 0)

    def refresh(self, nodes: set[int]) -> None:
        """Count `nodes` again (the session or the scope's victims changed there)."""
        for node in nodes:
            old = self.parts.pop(node, None)
            if old is not None:
                self._count(node, old, -1)
            self._count(node, self._part(node), +1)

    def _part(self, node: int) -> tuple[int, list[int]]:
        """One node as `FreeGpus.with_freed(freed)` sees it: free whole GPUs (a device all of
        whose victims go counts as one) and the rooms of its live shared devices."""
        sess = self.sess
        at = sess.at
        if not at.schedulable[node]:
            return 0, []
        free = at.cap_gpu[node] - at.used_gpu[node] + at.rel_gpu[node]
        whole = max(free, 0) + self.freed.whole.get(node, 0)
        rooms = []
        for gid, group in sess.groups[node].items():
            amount = self.freed.device.get((node, gid))
            if amount is not None:
                if freed_whole(group, amount):
                    whole += 1
                else:
                    rooms.append(MILLI - group.used + group.releasing + amount)
            elif group.releasing < group.used and MILLI - group.used + group.releasing > 0:
                rooms.append(MILLI - group.used + group.releasing)
        return whole, rooms

    def enough(self, whole_needed: list[int], fractions_needed: list[int]) -> bool:
        """`GpuRoom(sess, view, prefix).enough()` for the prefix with these needs (largest
        first), from the counts."""
        if not whole_needed and not fractions_needed:
            return True
        total = self.total_whole
        if whole_needed and (total < sum(whole_needed)
                             or max(self.whole, default=0) < whole_needed[0]):
            return False
        spare = total - sum(whole_needed)
        if fractions_needed and (
                self.total_room + MILLI * spare < sum(fractions_needed)
                or max(max(self.rooms, default=0), MILLI if spare > 0 else 0)
                < fractions_needed[0]):
            return False
        if not _largest_first(_top(self.whole, len(whole_needed)), whole_needed):
            return False
        if not fractions_needed:
            return True
        rooms = _top(self.rooms, len(fractions_needed))
        return _largest_first(rooms + [MILLI] * min(len(fractions_needed), spare),
                              fractions_needed)


def _largest(count: int, values: dict[_K, int]) -> list[tuple[int, _K]]:
    """The `count` largest (value, key) pairs of the positive values, largest first: what
    heapq.nlargest over all the pairs gives, but with a pair built only for the values at or
    above the count-th largest (a sort of plain ints finds it; heapq's loop runs as Python)."""
    if count <= 0:
        return []
    ranked = sorted([v for v in values.values() if v > 0], reverse=True)
    if not ranked:
        return []
    threshold = ranked[min(count, len(ranked)) - 1]
    top = [(v, key) for key, v in values.items() if v > threshold]
    top.sort(reverse=True)
    # the pairs at the threshold follow, by key (on a busy cluster most nodes tie: a sort of
    # plain keys, not of pairs)
    ties = [key for key, v in values.items() if v == threshold]
    ties.sort(reverse=True)
    top.extend([(threshold, key) for key in ties[:count - len(top)]])
    return top


def _top(counts: dict[int, int], k: int) -> list[int]:
    """The k largest values of a value -> count map, largest first."""
    out: list[int] = []
    for value in sorted(counts, reverse=True):
        if len(out) >= k:
            break
        out.extend([value] * min(counts[value], k - len(out)))
    return out


def _largest_first(places: list[int], needs: list[int]) -> bool:
    """Whether `needs` (largest first) each fit into the roomiest of `places` left."""
    # a scan for the roomiest per need: a few dozen places at most, and no call per step (a
    # heap's pop and push are calls into the heapq module)
    rooms = [v for v in places if v > 0]
    for need in needs:
        at, most = -1, 0
        for i in range(len(rooms)):
            if rooms[i] > most:
                at, most = i, rooms[i]
        if most < need:
            return False
        if at < 0:
            rooms.append(most - need)
        else:
            rooms[at] = most - need
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
