"""A scope's victim order popped once per session state and read by every prefix of every job
tried against that state, with running tallies of what the victims free so that a prefix skips
those that cannot yet make room for it (see `VictimStream`)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from heapq import heapify, heappop, heappush, merge
from itertools import chain

from kai_ray.core.actions.gpu_room import FreeGpus, GpuRoom, freed_whole
from kai_ray.core.actions.victims import VictimUnit
from kai_ray.core.ordering import JobQueue
from kai_ray.core.state import MILLI, JobState, Session, Task


class _Holds:
    """After each stream entry: how many requests of `size` whole GPUs the nodes' free whole
    GPUs could hold (the sum over nodes of free // size)."""

    def __init__(self, size: int, free: FreeGpus) -> None:
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

    def __init__(self, size: int, free: FreeGpus) -> None:
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
            new = 0 if freed_whole(group, before + cost) else old + cost
            self.now += new // self.size - old // self.size
        self.values.append(self.now)


class VictimStream:
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
                 units: dict[str, VictimUnit], free: FreeGpus) -> None:
        self.sess = sess
        self.source = queue.clone()
        self.one_queue = len(self.source.live_queues()) <= 1
        self.units = units  # each job's current unit (the scope keeps it up to date)
        # the unit each job has waiting in `source`, if any (kept for `renew`)
        self.in_source = dict(units)
        self._start(free)

    def _start(self, free: FreeGpus) -> None:
        """No entry popped or counted yet."""
        self.free = free  # free GPUs before any victim goes
        self.keys: list[int] = []
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
        # what entries 0..cursor-1 free, as `GpuRoom.free_into` counts it: a prefix whose
        # quiet batch is exactly those entries adopts it instead of adding them one by one
        self._counter = GpuRoom(self.sess, free, [])
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
        self.keys.append(-unit.order_number(self.sess))
        self.jobs.append(unit.job)
        self.taken.append(taken)
        return True

    def renew(self, free: FreeGpus, touched: set[str]) -> bool:
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
        new: list[tuple[int, JobState, list[Task]]] = []
        while last is not None:
            top = source.top_key()
            if top is None or not top < last:
                break
            unit = source.pop()
            assert unit is not None
            self.in_source.pop(unit.job.name, None)
            taken, rest = unit.take()
            if rest is not None:
                source.push(rest)
                self.single_takes = False
            new.append((-unit.order_number(self.sess), unit.job, taken))
        entries = list(merge(((self.keys[i], self.jobs[i], self.taken[i]) for i in kept),
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
            t.req.gpus for t in taken if t.node >= 0 and self.sess.at.schedulable[t.node])
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
            if t.node < 0 or not sess.at.schedulable[t.node]:
                continue
            if t.req.gpus:
                gains[t.node] = gains.get(t.node, 0) + t.req.gpus
                continue
            for gid in t.groups:
                key = (t.node, gid)
                events.append((key, t.gpu_mem_cost))
                freed = device_freed[key] = device_freed.get(key, 0) + t.gpu_mem_cost
                group = sess.groups[t.node].get(gid)
                if group is not None and freed_whole(group, freed) \
                        and not freed_whole(group, freed - t.gpu_mem_cost):
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

    def read(self, recorded: list[Task], room: GpuRoom
             ) -> Iterator[tuple[list[list[Task]], bool]]:
        """What `Solver._popped` would yield for `recorded`, without popping again: the
        entries of jobs with a recorded victim are left out and those jobs' units are taken
        anew on the side (as `_popped` does), merged in by key. The first item is the batch
        of victims that cannot make room for `room`'s prefix (quiet: they are added to `room`
        here), then one entry at a time; each item lists its takes apart (a take is what
        KAI adds to a scenario in one step, and records as one victim group)."""
        recorded_set = {id(t) for t in recorded}
        side: list[tuple[int, int, VictimUnit]] = []
        side_jobs = {id(t.job): t.job for t in recorded}
        # what the stream's tallies do not count: the recorded victims and what the side
        # units may take (tallies counted high from these, per request size)
        others: list[Task] = []
        for job in side_jobs.values():
            unit = self.units.get(job.name)
            left = [t for t in unit.tasks if id(t) not in recorded_set] if unit else []
            if unit is None or not left:
                continue  # all of it recorded: it would give nothing more
            side.append((-unit.order_number(self.sess), len(side), unit))
            others.extend(left)
        heapify(side)
        quiet_until = self._quiet_until(room, recorded, others)
        seq = len(side)
        batch: list[list[Task]] = []
        i = 0
        if not side and quiet_until:
            # nothing to merge in: the quiet batch is the entries before `quiet_until` but
            # those of recorded jobs, taken as slices rather than one by one
            i = quiet_until
            self.reach = max(self.reach, i)
            start = 0
            for p in sorted(p for job in side_jobs.values()
                            for p in self.positions.get(id(job), ()) if p < i):
                batch.extend(t for t in self.taken[start:p] if t)
                start = p + 1
            batch.extend(t for t in self.taken[start:i] if t)
        while True:
            more = i < len(self.keys) or self._more()
            base_key = self.keys[i] if more else None
            quiet = i < quiet_until
            if side and (base_key is None or side[0][0] < base_key):
                unit = heappop(side)[2]
                taken, rest = unit.take_unrecorded(recorded_set)
                if rest is not None:
                    seq += 1
                    heappush(side, (-rest.order_number(self.sess), seq, rest))
            elif base_key is None:
                break
            else:
                job = self.jobs[i]
                taken = self.taken[i]
                i += 1
                self.reach = max(self.reach, i)
                if id(job) in side_jobs:
                    continue
            if not taken:
                continue
            if quiet:
                batch.append(taken)
                continue
            if batch:
                self._count_in(room, list(chain.from_iterable(batch)), quiet_until, recorded)
                yield batch, True
                batch = []
            yield [taken], False
        if batch:
            self._count_in(room, list(chain.from_iterable(batch)), quiet_until, recorded)
            yield batch, True

    def _count_in(self, room: GpuRoom, batch: list[Task], until: int,
                  recorded: list[Task]) -> None:
        """Add a quiet batch to `room` (which holds the recorded victims). When every recorded
        job is one entry of the stream, taken whole, the batch plus
        the recorded entries before `until` are exactly entries 0..until-1: `room` adopts the
        stream's count of those and takes the recorded victims after `until` again."""
        jobs = {id(t.job): t.job for t in recorded}.values()
        if (self.cursor > until or not self._recorded_whole(recorded)
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

    def _quiet_until(self, room: GpuRoom, recorded: list[Task], others: list[Task]) -> int:
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
        extra = [t for t in (*recorded, *others) if t.node >= 0 and sess.at.schedulable[t.node]]
        # whole GPUs beyond the tallies', per node: what the recorded victims free (exactly,
        # from `room`), one per device they leave partly freed (a victim in the stream may
        # finish it), and all the side units could take
        on_node = {n: v - self.free.whole.get(n, 0) for n, v in room.whole.items()}
        recorded_places = sum(on_node.values())  # whole GPUs, and (below) partly freed devices
        for (node, gid), amount in room.freed.items():
            group = sess.groups[node].get(gid)
            if group is not None and not freed_whole(group, amount):
                on_node[node] = on_node.get(node, 0) + 1
                recorded_places += 1
        for t in others:
            if t.node >= 0 and sess.at.schedulable[t.node]:
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
            # places of c the recorded victims give: per whole GPU they free, and per device
            # they leave partly freed (with victims in the stream it may hold that many,
            # whatever the tallies count for it), MILLI // c; the side units counted high
            side = [t for t in others if t.node >= 0 and sess.at.schedulable[t.node]]
            for c in sorted(set(room.fractions_needed)):
                count = sum(1 for need in room.fractions_needed if need >= c)
                per_whole = MILLI // c
                more = per_whole * recorded_places + sum(
                    per_whole * t.req.gpus if t.req.gpus
                    else len(t.groups) * (-(-t.gpu_mem_cost // c) + per_whole) for t in side)
                until = max(until, self._first_reaching(
                    self._tally("fits", c), count - more + per_whole * need_whole))
        return until
