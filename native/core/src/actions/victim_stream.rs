//! A scope's victim order popped once per session state and read by every prefix of every job
//! tried against that state, with running tallies of what the victims free so that a prefix
//! skips those that cannot yet make room for it. A speed path of the Rust core only: the Python
//! specification pops the victim order afresh for every prefix (`Solver._popped`).
//!
//! The stream's free GPUs are always the cache's current `FreeGpus` (the stream is carried over
//! or rebuilt whenever the state changes), so they are passed in rather than held.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::actions::gpu_room::{free_into, freed_whole, DevKey, FreeGpus, GpuRoom, Lent};
use crate::actions::victims::{new_unit, take, take_unrecorded};
use crate::model::MILLI;
use crate::ordering::JobQueue;
use crate::state::Session;

enum Tally {
    /// how many requests of `size` whole GPUs the nodes' free whole GPUs could hold
    Holds { size: i64, node_free: FxHashMap<i32, i64>, now: i64, values: Vec<i64> },
    /// how many fractions of `size` milli the places could hold
    Fits {
        size: i64,
        per_whole: i64,
        device_freed: FxHashMap<DevKey, i64>,
        now: i64,
        values: Vec<i64>,
    },
}

impl Tally {
    fn new(sess: &Session, free: &mut FreeGpus, holds: bool, size: i64) -> Tally {
        if holds {
            let now = free.whole.values().map(|v| v.div_euclid(size)).sum();
            Tally::Holds { size, node_free: FxHashMap::default(), now, values: Vec::new() }
        } else {
            let per_whole = MILLI.div_euclid(size);
            let rooms: i64 = free.devices(sess).values().map(|&r| r.max(0).div_euclid(size)).sum();
            let now = rooms + per_whole * free.whole_totals().0;
            Tally::Fits {
                size,
                per_whole,
                device_freed: FxHashMap::default(),
                now,
                values: Vec::new(),
            }
        }
    }

    fn step(
        &mut self,
        sess: &Session,
        base: &FxHashMap<i32, i64>,
        gains: &[(i32, i64)],
        events: &[(DevKey, i64)],
    ) {
        match self {
            Tally::Holds { size, node_free, now, values } => {
                for &(node, gain) in gains {
                    let old = node_free
                        .get(&node)
                        .copied()
                        .unwrap_or_else(|| base.get(&node).copied().unwrap_or(0));
                    node_free.insert(node, old + gain);
                    *now += (old + gain).div_euclid(*size) - old.div_euclid(*size);
                }
                values.push(*now);
            }
            Tally::Fits { size, per_whole, device_freed, now, values } => {
                *now += *per_whole * gains.iter().map(|(_, g)| g).sum::<i64>();
                for &(key, cost) in events {
                    let Some(group) = sess.cluster.group(key.0, key.1) else { continue };
                    let before = device_freed.get(&key).copied().unwrap_or(0);
                    device_freed.insert(key, before + cost);
                    // the room counted (none below 0; none once freed whole, its GPU in `gains`)
                    let room = |freed: i64| {
                        if freed_whole(group, freed) {
                            0
                        } else {
                            (MILLI - group.used + group.releasing + freed).max(0)
                        }
                    };
                    let (old, new) = (room(before), room(before + cost));
                    *now += new.div_euclid(*size) - old.div_euclid(*size);
                }
                values.push(*now);
            }
        }
    }

    fn values(&self) -> &Vec<i64> {
        match self {
            Tally::Holds { values, .. } | Tally::Fits { values, .. } => values,
        }
    }
}

/// One entry's part of `Frees`: whole GPUs per node, milli per shared device.
type EntryFrees<'a> = (&'a [(i32, i64)], &'a [(DevKey, i64)]);

/// What each counted stream entry frees, one after another: whole GPUs per node and milli per
/// shared device, entry `i`'s from `ends[i - 1]` (0 for the first) to `ends[i]` (one buffer
/// each rather than two vectors per entry: entries are counted again at every state).
#[derive(Default)]
struct Frees {
    gains: Vec<(i32, i64)>,
    events: Vec<(DevKey, i64)>,
    ends: Vec<(usize, usize)>,
}

impl Frees {
    fn clear(&mut self) {
        self.gains.clear();
        self.events.clear();
        self.ends.clear();
    }

    /// Entry `i`'s gains and events.
    fn of(&self, i: usize) -> EntryFrees<'_> {
        let (g0, e0) = if i == 0 { (0, 0) } else { self.ends[i - 1] };
        let (g1, e1) = self.ends[i];
        (&self.gains[g0..g1], &self.events[e0..e1])
    }
}

/// Which running sum `first_reaching` looks at.
#[derive(Clone, Copy)]
enum Sums {
    Whole,
    Milli,
    Tally(usize),
}

pub struct VictimStream {
    source: JobQueue,
    one_queue: bool,
    /// the unit each job has waiting in `source`, if any (kept for `renew`)
    in_source: FxHashMap<usize, usize>,
    keys: Vec<i64>,
    jobs: Vec<usize>,
    taken: Vec<Vec<usize>>,
    /// each job's entries
    positions: Positions,
    /// entries read by a prefix so far
    reach: usize,
    done: bool,
    /// every entry so far took its unit whole (then `renew` can carry the stream over)
    single_takes: bool,
    frees: Frees,
    whole: Vec<i64>,
    milli: Vec<i64>,
    tallies: Vec<((bool, i64), Tally)>,
    device_freed: FxHashMap<DevKey, i64>,
    cursor: usize,
    cursor_whole: FxHashMap<i32, i64>,
    cursor_freed: FxHashMap<DevKey, i64>,
    /// bumped whenever the count up to `cursor` is started afresh or lent out: a lent count
    /// comes back only to the stream it left (`take_back`)
    generation: u64,
}

impl VictimStream {
    pub fn new(queue: &JobQueue, units: &FxHashMap<usize, usize>) -> VictimStream {
        let mut source = queue.clone();
        let one_queue = source.live_queue_count() <= 1;
        let mut stream = VictimStream {
            source,
            one_queue,
            in_source: units.clone(),
            keys: Vec::new(),
            jobs: Vec::new(),
            taken: Vec::new(),
            positions: Positions::default(),
            reach: 0,
            done: false,
            single_takes: true,
            frees: Frees::default(),
            whole: Vec::new(),
            milli: Vec::new(),
            tallies: Vec::new(),
            device_freed: FxHashMap::default(),
            cursor: 0,
            cursor_whole: FxHashMap::default(),
            cursor_freed: FxHashMap::default(),
            generation: 0,
        };
        stream.start();
        stream
    }

    /// No entry popped or counted yet.
    fn start(&mut self) {
        self.keys.clear();
        self.jobs.clear();
        self.taken.clear();
        self.positions.clear();
        self.reach = 0;
        self.done = false;
        self.single_takes = true;
        self.frees.clear();
        self.whole.clear();
        self.milli.clear();
        self.tallies.clear();
        self.device_freed.clear();
        self.cursor = 0;
        self.cursor_whole.clear();
        self.cursor_freed.clear();
        self.generation += 1;
    }

    /// Pop one more entry.
    fn more(&mut self, sess: &mut Session) -> bool {
        if self.done {
            return false;
        }
        let Some((key, job, taken)) = self.take_next(sess) else {
            self.done = true;
            return false;
        };
        self.positions.push(job, self.keys.len());
        self.keys.push(key);
        self.jobs.push(job);
        self.taken.push(taken);
        true
    }

    /// Pop the source's next unit and take from it (what is left of it goes back): the
    /// entry's key, job and tasks.
    fn take_next(&mut self, sess: &mut Session) -> Option<(i64, usize, Vec<usize>)> {
        let unit = self.source.pop(sess)?;
        let job = sess.units[unit].job;
        self.in_source.remove(&job);
        let (taken, rest) = take(sess, unit);
        if let Some(rest) = rest {
            let rest = new_unit(sess, job, rest);
            self.source.push(sess, rest);
            self.single_takes = false;
        }
        Some((-sess.unit_order_number(unit), job, taken))
    }

    /// Carry the stream over to the next state, where the jobs in `touched` have new units in
    /// `units` (or none): their entries go, the others keep their order, and the touched jobs'
    /// new units are merged in by key. Only for one queue and single takes.
    pub fn renew(
        &mut self,
        sess: &mut Session,
        units: &FxHashMap<usize, usize>,
        touched: &[usize],
    ) -> bool {
        if !(self.one_queue && self.single_takes) {
            return false;
        }
        // a key merge keeps one queue's order only: a touched job with a unit in another queue
        // (one that had none when the stream was made) ends that, as the order between queues
        // is the queue comparison's
        let mut queue: Option<usize> = None;
        let with_units = touched.iter().filter(|j| units.contains_key(j));
        for &job in self.jobs.iter().chain(self.in_source.keys()).chain(with_units) {
            let q = sess.jobs[job].queue_key;
            if *queue.get_or_insert(q) != q {
                return false;
            }
        }
        let touched_set: FxHashSet<usize> = touched.iter().copied().collect();
        let kept: Vec<usize> = (0..self.reach.min(self.jobs.len()))
            .filter(|&i| !touched_set.contains(&self.jobs[i]))
            .collect();
        let waiting: Vec<usize> = self.jobs[self.reach.min(self.jobs.len())..]
            .iter()
            .copied()
            .filter(|j| !touched_set.contains(j))
            .collect();
        for &name in touched.iter().chain(waiting.iter()) {
            if let Some(old) = self.in_source.remove(&name) {
                self.source.dead.insert(old);
            }
            if let Some(&unit) = units.get(&name) {
                self.source.push(sess, unit);
                self.in_source.insert(name, unit);
            }
        }
        let last = kept.last().map(|&i| self.keys[i]);
        let mut new: Vec<(i64, usize, Vec<usize>)> = Vec::new();
        if let Some(last) = last {
            loop {
                match self.source.top_key() {
                    Some(top) if top < last => {}
                    _ => break,
                }
                new.push(self.take_next(sess).expect("a unit under the top key"));
            }
        }
        // merge by key (both in key order; keys are distinct: one entry per job)
        let old: Vec<(i64, usize, Vec<usize>)> = kept
            .iter()
            .map(|&i| (self.keys[i], self.jobs[i], std::mem::take(&mut self.taken[i])))
            .collect();
        let mut entries = Vec::with_capacity(old.len() + new.len());
        let (mut a, mut b) = (old.into_iter().peekable(), new.into_iter().peekable());
        loop {
            let pick_old = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) => x.0 <= y.0,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            entries.push(if pick_old { a.next() } else { b.next() }.expect("an entry"));
        }
        let single = self.single_takes;
        self.start();
        self.single_takes = single;
        for (key, job, taken) in entries {
            self.positions.push(job, self.keys.len());
            self.keys.push(key);
            self.jobs.push(job);
            self.taken.push(taken);
        }
        true
    }

    /// Count one more entry in the tallies (popping it first if need be).
    fn grow(&mut self, sess: &mut Session, free: &mut FreeGpus) -> bool {
        let i = self.whole.len();
        if i == self.keys.len() && !self.more(sess) {
            return false;
        }
        self.count_frees(sess, i);
        let (gains, events) = self.frees.of(i);
        let gained: i64 = gains.iter().map(|(_, g)| g).sum();
        self.whole.push(self.whole.last().copied().unwrap_or(0) + gained);
        let mut milli = 0;
        for &t in &self.taken[i] {
            let task = &sess.tasks[t];
            if task.node >= 0 && sess.cluster.schedulable[task.node as usize] {
                milli += MILLI * task.req.gpus;
            }
        }
        milli += events.iter().map(|(_, c)| c).sum::<i64>();
        self.milli.push(self.milli.last().copied().unwrap_or(0) + milli);
        for (_, tally) in self.tallies.iter_mut() {
            tally.step(sess, &free.whole, gains, events);
        }
        true
    }

    fn tally(&mut self, sess: &Session, free: &mut FreeGpus, holds: bool, size: i64) -> usize {
        if let Some(at) = self.tallies.iter().position(|(k, _)| *k == (holds, size)) {
            return at;
        }
        let mut tally = Tally::new(sess, free, holds, size);
        for i in 0..self.frees.ends.len() {
            let (gains, events) = self.frees.of(i);
            tally.step(sess, &free.whole, gains, events);
        }
        self.tallies.push(((holds, size), tally));
        self.tallies.len() - 1
    }

    /// Whole GPUs entry `i`'s tasks free per node after the ones counted before (which they
    /// join), and the milli they free on each shared device: appended to `frees`.
    fn count_frees(&mut self, sess: &Session, i: usize) {
        let Frees { gains, events, ends } = &mut self.frees;
        let start = gains.len();
        let gain = |gains: &mut Vec<(i32, i64)>, node: i32, amount: i64| match gains[start..]
            .iter_mut()
            .find(|(n, _)| *n == node)
        {
            Some(entry) => entry.1 += amount,
            None => gains.push((node, amount)),
        };
        for &t in &self.taken[i] {
            let task = &sess.tasks[t];
            if task.node < 0 || !sess.cluster.schedulable[task.node as usize] {
                continue;
            }
            if task.req.gpus != 0 {
                gain(gains, task.node, task.req.gpus);
                continue;
            }
            for &gid in &task.groups {
                let key = (task.node, gid);
                events.push((key, task.gpu_mem_cost));
                let freed = self.device_freed.get(&key).copied().unwrap_or(0) + task.gpu_mem_cost;
                self.device_freed.insert(key, freed);
                if let Some(group) = sess.cluster.group(task.node, gid) {
                    if freed_whole(group, freed) && !freed_whole(group, freed - task.gpu_mem_cost) {
                        gain(gains, task.node, 1);
                    }
                }
            }
        }
        ends.push((gains.len(), events.len()));
    }

    fn sums(&self, which: Sums) -> &Vec<i64> {
        match which {
            Sums::Whole => &self.whole,
            Sums::Milli => &self.milli,
            Sums::Tally(at) => self.tallies[at].1.values(),
        }
    }

    /// The first entry whose running sum reaches `target` (counting as far as needed), or the
    /// number of entries when none does.
    fn first_reaching(
        &mut self,
        sess: &mut Session,
        free: &mut FreeGpus,
        which: Sums,
        target: i64,
    ) -> usize {
        loop {
            let sums = self.sums(which);
            if !sums.is_empty() && *sums.last().expect("a sum") >= target {
                break;
            }
            if !self.grow(sess, free) {
                break;
            }
        }
        bisect_left(self.sums(which), target)
    }

    /// Whether `read` gives what popping a copy of the scope's queue would for `recorded`.
    pub fn covers(
        &self,
        sess: &Session,
        units: &FxHashMap<usize, usize>,
        recorded: &[usize],
    ) -> bool {
        self.one_queue || recorded_whole(sess, units, recorded)
    }

    /// Add a quiet batch to `room` (which holds the recorded victims). When every recorded job
    /// is one entry of the stream, taken whole, the batch plus the recorded entries before `until` are exactly entries 0..until-1: `room` adopts the
    /// stream's count of those and takes the recorded victims after `until` again.
    #[allow(clippy::too_many_arguments)]
    fn count_in(
        &mut self,
        sess: &Session,
        free: &mut FreeGpus,
        units: &FxHashMap<usize, usize>,
        room: &mut GpuRoom,
        batch: &[usize],
        until: usize,
        recorded: &[usize],
    ) {
        let mut jobs: Vec<usize> = Vec::new();
        for &t in recorded {
            let j = sess.tasks[t].job;
            if !jobs.contains(&j) {
                jobs.push(j);
            }
        }
        if self.cursor > until
            || !recorded_whole(sess, units, recorded)
            || jobs.iter().any(|&j| self.positions.count(j) != 1)
        {
            room.add_victims(sess, free, batch);
            return;
        }
        while self.cursor < until {
            for &t in &self.taken[self.cursor] {
                let mut scratch = FxHashMap::default();
                free_into(
                    sess,
                    &free.whole,
                    false,
                    t,
                    &mut self.cursor_whole,
                    &mut scratch,
                    &mut self.cursor_freed,
                );
            }
            self.cursor += 1;
        }
        if room.lent.is_some() {
            room.adopt(sess, free, self.cursor_whole.clone(), self.cursor_freed.clone());
        } else {
            // lent rather than copied (a copy per prefix cost more than the rest of the
            // reading): the stream counts from the start until it is given back
            let (whole, freed) =
                (std::mem::take(&mut self.cursor_whole), std::mem::take(&mut self.cursor_freed));
            room.adopt(sess, free, whole, freed);
            self.generation += 1;
            room.lent = Some(Lent::new(self.cursor, self.generation));
            self.cursor = 0;
        }
        for &t in recorded {
            if self.positions.first(sess.tasks[t].job).expect("an entry") >= until {
                room.add_victim(sess, free, t);
            }
        }
    }

    /// The running count `count_in` lent to `room`, back as it was then (the room is done
    /// with it).
    pub fn take_back(&mut self, room: &mut GpuRoom) {
        let Some(lent) = room.lent.take() else { return };
        if lent.generation != self.generation {
            return; // counted afresh since
        }
        let (mut whole, mut freed) =
            (std::mem::take(&mut room.whole), std::mem::take(&mut room.freed));
        self.cursor = lent.cursor;
        lent.undo(&mut whole, &mut freed);
        self.cursor_whole = whole;
        self.cursor_freed = freed;
    }

    /// Entries before this one cannot give `room`'s prefix enough GPUs, even with the victims
    /// the tallies leave out (`recorded`, already in `room`, and the `others` the side units
    /// may take) counted high.
    fn quiet_until(
        &mut self,
        sess: &mut Session,
        free: &mut FreeGpus,
        room: &GpuRoom,
        recorded: &[usize],
        others: &[usize],
    ) -> usize {
        if room.trivial {
            return 0;
        }
        let placed = |sess: &Session, t: usize| {
            let n = sess.tasks[t].node;
            n >= 0 && sess.cluster.schedulable[n as usize]
        };
        let need_whole: i64 = room.whole_needed.iter().sum();
        let extra: Vec<usize> =
            recorded.iter().chain(others).copied().filter(|&t| placed(sess, t)).collect();
        let mut on_node: FxHashMap<i32, i64> = room
            .whole
            .iter()
            .map(|(&n, &v)| (n, v - free.whole.get(&n).copied().unwrap_or(0)))
            .collect();
        let mut recorded_places: i64 = on_node.values().sum();
        for (&(node, gid), &amount) in &room.freed {
            if let Some(group) = sess.cluster.group(node, gid) {
                if !freed_whole(group, amount) {
                    *on_node.entry(node).or_insert(0) += 1;
                    recorded_places += 1;
                }
            }
        }
        for &t in others {
            if placed(sess, t) {
                let task = &sess.tasks[t];
                let add = if task.req.gpus != 0 { task.req.gpus } else { task.groups.len() as i64 };
                *on_node.entry(task.node).or_insert(0) += add;
            }
        }
        on_node.retain(|_, v| *v > 0);
        let mut until = 0;
        if need_whole != 0 {
            let have = free.whole_totals().0 + on_node.values().sum::<i64>();
            until = self.first_reaching(sess, free, Sums::Whole, need_whole - have);
            let mut sizes: Vec<i64> =
                room.whole_needed.iter().copied().filter(|&g| g != 1).collect();
            sizes.sort_unstable();
            sizes.dedup();
            for g in sizes {
                let count = room.whole_needed.iter().filter(|&&need| need >= g).count() as i64;
                let more: i64 = on_node.values().map(|&v| -(-v).div_euclid(g)).sum();
                let at = self.tally(sess, free, true, g);
                until = until.max(self.first_reaching(sess, free, Sums::Tally(at), count - more));
            }
        }
        if !room.fractions_needed.is_empty() {
            let need = MILLI * need_whole + room.fractions_needed.iter().sum::<i64>();
            let mut have = MILLI * free.whole_totals().0 + free.device_totals(sess).0;
            for &t in &extra {
                let task = &sess.tasks[t];
                let amount = MILLI * task.req.gpus;
                have +=
                    if amount != 0 { amount } else { task.gpu_mem_cost * task.groups.len() as i64 };
            }
            until = until.max(self.first_reaching(sess, free, Sums::Milli, need - have));
            let side: Vec<usize> = others.iter().copied().filter(|&t| placed(sess, t)).collect();
            let mut sizes = room.fractions_needed.clone();
            sizes.sort_unstable();
            sizes.dedup();
            for c in sizes {
                let count = room.fractions_needed.iter().filter(|&&need| need >= c).count() as i64;
                let per_whole = MILLI.div_euclid(c);
                let mut more = per_whole * recorded_places;
                for &t in &side {
                    let task = &sess.tasks[t];
                    more += if task.req.gpus != 0 {
                        per_whole * task.req.gpus
                    } else {
                        task.groups.len() as i64 * (-(-task.gpu_mem_cost).div_euclid(c) + per_whole)
                    };
                }
                let at = self.tally(sess, free, false, c);
                until = until.max(self.first_reaching(
                    sess,
                    free,
                    Sums::Tally(at),
                    count - more + per_whole * need_whole,
                ));
            }
        }
        until
    }
}

/// The entries of each job in a stream, in order: one for most (a unit taken whole), so the
/// first is kept apart from the rest (no vector per job).
#[derive(Default)]
struct Positions {
    first: FxHashMap<usize, usize>,
    more: FxHashMap<usize, Vec<usize>>,
}

impl Positions {
    fn clear(&mut self) {
        self.first.clear();
        self.more.clear();
    }

    fn push(&mut self, job: usize, at: usize) {
        if let std::collections::hash_map::Entry::Vacant(slot) = self.first.entry(job) {
            slot.insert(at);
        } else {
            self.more.entry(job).or_default().push(at);
        }
    }

    fn first(&self, job: usize) -> Option<usize> {
        self.first.get(&job).copied()
    }

    fn count(&self, job: usize) -> usize {
        self.first.get(&job).map_or(0, |_| 1 + self.more.get(&job).map_or(0, Vec::len))
    }

    fn of(&self, job: usize) -> impl Iterator<Item = usize> + '_ {
        self.first(job).into_iter().chain(self.more.get(&job).into_iter().flatten().copied())
    }
}

/// Python's `bisect.bisect_left`, midpoint for midpoint.
fn bisect_left(values: &[i64], target: i64) -> usize {
    let (mut lo, mut hi) = (0, values.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if values[mid] < target {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Every job with a recorded victim is one unit, taken whole and recorded whole.
fn recorded_whole(sess: &Session, units: &FxHashMap<usize, usize>, recorded: &[usize]) -> bool {
    let ids: FxHashSet<usize> = recorded.iter().copied().collect();
    let mut seen: Vec<usize> = Vec::new();
    for &t in recorded {
        let job = sess.tasks[t].job;
        if seen.contains(&job) {
            continue;
        }
        seen.push(job);
        if let Some(&unit) = units.get(&job) {
            if take(sess, unit).1.is_some()
                || sess.units[unit].tasks.iter().any(|t| !ids.contains(t))
            {
                return false;
            }
        }
    }
    true
}

/// Victims as they were taken, one take after another: a take is what KAI adds to a scenario in
/// one step and records as one victim group (`ends` closes each take in `tasks`).
#[derive(Default)]
pub struct Takes {
    pub tasks: Vec<usize>,
    pub ends: Vec<usize>,
}

impl Takes {
    pub fn one(tasks: Vec<usize>) -> Takes {
        let ends = vec![tasks.len()];
        Takes { tasks, ends }
    }

    pub fn push(&mut self, taken: &[usize]) {
        self.tasks.extend_from_slice(taken);
        self.ends.push(self.tasks.len());
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Each take's tasks.
    pub fn groups(&self) -> impl Iterator<Item = &[usize]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter().copied()).map(|(a, b)| &self.tasks[a..b])
    }
}

/// One prefix's reading of the stream: what popping a copy of the scope's queue would yield
/// for `recorded`, without popping again. The first item is the batch of victims that cannot
/// make room for the prefix (quiet: added to the room here), then one entry at a time.
pub struct StreamRead {
    recorded: Vec<usize>,
    recorded_set: FxHashSet<usize>,
    side: BinaryHeap<Reverse<(i64, u64, usize)>>,
    side_jobs: FxHashSet<usize>,
    quiet_until: usize,
    seq: u64,
    batch: Takes,
    i: usize,
    finished: bool,
    pending: Option<(Takes, bool)>,
}

impl StreamRead {
    pub fn new(
        stream: &mut VictimStream,
        sess: &mut Session,
        free: &mut FreeGpus,
        units: &FxHashMap<usize, usize>,
        room: &GpuRoom,
        recorded: &[usize],
    ) -> StreamRead {
        let recorded_set: FxHashSet<usize> = recorded.iter().copied().collect();
        let mut side_order: Vec<usize> = Vec::new();
        for &t in recorded {
            let j = sess.tasks[t].job;
            if !side_order.contains(&j) {
                side_order.push(j);
            }
        }
        let mut side_list: Vec<Reverse<(i64, u64, usize)>> = Vec::new();
        let mut others: Vec<usize> = Vec::new();
        for &job in &side_order {
            let Some(&unit) = units.get(&job) else { continue };
            let left: Vec<usize> = sess.units[unit]
                .tasks
                .iter()
                .copied()
                .filter(|t| !recorded_set.contains(t))
                .collect();
            if left.is_empty() {
                continue; // all of it recorded: it would give nothing more
            }
            let number = sess.unit_order_number(unit);
            side_list.push(Reverse((-number, side_list.len() as u64, unit)));
            others.extend(left);
        }
        let seq = side_list.len() as u64;
        let side = BinaryHeap::from(side_list);
        let quiet_until = stream.quiet_until(sess, free, room, recorded, &others);
        let mut batch = Takes::default();
        let mut i = 0;
        if side.is_empty() && quiet_until > 0 {
            // nothing to merge in: the quiet batch is the entries before `quiet_until` but
            // those of recorded jobs, taken as slices rather than one by one
            i = quiet_until;
            stream.reach = stream.reach.max(i);
            let mut skip: Vec<usize> = side_order
                .iter()
                .flat_map(|&j| stream.positions.of(j))
                .filter(|&p| p < i)
                .collect();
            skip.sort_unstable();
            let mut start = 0;
            for p in skip {
                for entry in stream.taken[start..p].iter().filter(|e| !e.is_empty()) {
                    batch.push(entry);
                }
                start = p + 1;
            }
            for entry in stream.taken[start.min(i)..i].iter().filter(|e| !e.is_empty()) {
                batch.push(entry);
            }
        }
        StreamRead {
            recorded: recorded.to_vec(),
            recorded_set,
            side,
            side_jobs: side_order.into_iter().collect(),
            quiet_until,
            seq,
            batch,
            i,
            finished: false,
            pending: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn next(
        &mut self,
        stream: &mut VictimStream,
        sess: &mut Session,
        free: &mut FreeGpus,
        units: &FxHashMap<usize, usize>,
        room: &mut GpuRoom,
    ) -> Option<(Takes, bool)> {
        if let Some(item) = self.pending.take() {
            return Some(item);
        }
        if self.finished {
            return None;
        }
        loop {
            let more = self.i < stream.keys.len() || stream.more(sess);
            let base_key = if more { Some(stream.keys[self.i]) } else { None };
            let quiet = self.i < self.quiet_until;
            let side_first = match (self.side.peek(), base_key) {
                (Some(Reverse(top)), Some(key)) => top.0 < key,
                (Some(_), None) => true,
                (None, _) => false,
            };
            let taken: Vec<usize>;
            if side_first {
                let Reverse((_, _, unit)) = self.side.pop().expect("a side unit");
                let job = sess.units[unit].job;
                let (got, rest) = take_unrecorded(sess, unit, &self.recorded_set);
                if let Some(rest) = rest {
                    self.seq += 1;
                    let rest = new_unit(sess, job, rest);
                    let number = sess.unit_order_number(rest);
                    self.side.push(Reverse((-number, self.seq, rest)));
                }
                taken = got;
            } else if base_key.is_none() {
                break;
            } else {
                let job = stream.jobs[self.i];
                taken = stream.taken[self.i].clone();
                self.i += 1;
                stream.reach = stream.reach.max(self.i);
                if self.side_jobs.contains(&job) {
                    continue;
                }
            }
            if taken.is_empty() {
                continue;
            }
            if quiet {
                self.batch.push(&taken);
                continue;
            }
            if let Some(batch) = self.flush(stream, sess, free, units, room) {
                self.pending = Some((Takes::one(taken), false));
                return Some(batch);
            }
            return Some((Takes::one(taken), false));
        }
        self.finished = true;
        self.flush(stream, sess, free, units, room)
    }

    /// The quiet batch so far, counted into `room`, if there is one.
    fn flush(
        &mut self,
        stream: &mut VictimStream,
        sess: &Session,
        free: &mut FreeGpus,
        units: &FxHashMap<usize, usize>,
        room: &mut GpuRoom,
    ) -> Option<(Takes, bool)> {
        if self.batch.is_empty() {
            return None;
        }
        let batch = std::mem::take(&mut self.batch);
        stream.count_in(sess, free, units, room, &batch.tasks, self.quiet_until, &self.recorded);
        Some((batch, true))
    }
}
