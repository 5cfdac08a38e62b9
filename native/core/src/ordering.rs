//! Which job goes next (kai_ray/core/ordering.py): KAI's queue order over the queue tree, and
//! job order inside a leaf queue. `JobQueue` pops jobs the way KAI's JobsOrderByQueues does;
//! a reverse queue of victim units gives the victim order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::accounting::{leq, pending_queue_amount, QueueState};
use crate::model::Amounts;
use crate::state::Session;
use crate::statement::LogMark;

const ZERO_SHARE_MULT: f64 = 1000.0;
const ZERO: Amounts = [0.0, 0.0, 0.0];

/// The candidate request of a job: its tasks-to-allocate (pending gpu-memory via 100 MiB).
pub fn job_request(sess: &mut Session, job: usize, simulation: bool) -> Amounts {
    let s = simulation as usize;
    let changes = sess.jobs[job].changes;
    if let Some((at, amounts)) = sess.jobs[job].requested[s] {
        if at == changes {
            return amounts;
        }
    }
    let (mut cpu, mut mem, mut gpu) = (0.0, 0.0, 0.0);
    for task in sess.tasks_to_allocate(job, simulation) {
        let amount = pending_queue_amount(&sess.tasks[task].req);
        cpu += amount[0];
        mem += amount[1];
        gpu += amount[2];
    }
    let out = [cpu, mem, gpu];
    sess.jobs[job].requested[s] = Some((changes, out));
    out
}

fn share(sess: &Session, q: &QueueState, r: usize, allocated: f64) -> f64 {
    let mut allocatable = q.allocatable(r);
    if allocatable == -1.0 {
        allocatable = sess.cluster.total[r];
    }
    if allocatable == 0.0 {
        allocated * ZERO_SHARE_MULT
    } else {
        allocated / allocatable
    }
}

fn dominant_share(sess: &Session, q: &QueueState, extra: Amounts) -> f64 {
    let mut result = 0.0;
    for (r, e) in extra.iter().enumerate() {
        let value = share(sess, q, r, q.allocated[r] + e);
        if value > result {
            result = value;
        }
    }
    result
}

fn over(q: &QueueState) -> bool {
    let (fair, allocated) = (&q.fair_share, &q.allocated);
    fair[0] < allocated[0] && fair[1] < allocated[1] && fair[2] < allocated[2]
}

fn zero_quota_wanted(q: &QueueState, with_request: &Amounts) -> bool {
    (q.allocatable(0) == 0.0 && with_request[0] > 0.0)
        || (q.allocatable(1) == 0.0 && with_request[1] > 0.0)
        || (q.allocatable(2) == 0.0 && with_request[2] > 0.0)
}

/// Negative when `lq` goes first (KAI's queue_order.go). `*taken` (victim order only) lower
/// the queue's dominant share: what KAI counts as the queue's victims so far.
pub fn compare_queues(
    sess: &Session,
    lq: &QueueState,
    rq: &QueueState,
    lreq: Amounts,
    rreq: Amounts,
    ltaken: Amounts,
    rtaken: Amounts,
) -> i32 {
    let (l_over, r_over) = (over(lq), over(rq));
    if l_over != r_over {
        return if l_over { 1 } else { -1 };
    }
    let (la, ra) = (&lq.allocated, &rq.allocated);
    let l_with = [la[0] + lreq[0], la[1] + lreq[1], la[2] + lreq[2]];
    let r_with = [ra[0] + rreq[0], ra[1] + rreq[1], ra[2] + rreq[2]];
    let l_starved = leq(&l_with, &lq.deserved);
    let r_starved = leq(&r_with, &rq.deserved);
    if l_starved != r_starved {
        return if l_starved { -1 } else { 1 };
    }
    if lq.priority != rq.priority {
        return if lq.priority > rq.priority { -1 } else { 1 };
    }
    let (l_zero, r_zero) = (zero_quota_wanted(lq, &l_with), zero_quota_wanted(rq, &r_with));
    if l_zero != r_zero {
        return if l_zero { 1 } else { -1 };
    }
    let ls =
        dominant_share(sess, lq, [lreq[0] - ltaken[0], lreq[1] - ltaken[1], lreq[2] - ltaken[2]]);
    let rs =
        dominant_share(sess, rq, [rreq[0] - rtaken[0], rreq[1] - rtaken[1], rreq[2] - rtaken[2]]);
    if ls != rs {
        return if ls < rs { -1 } else { 1 };
    }
    let (ls, rs) = (dominant_share(sess, lq, ZERO), dominant_share(sess, rq, ZERO));
    if ls != rs {
        return if ls < rs { -1 } else { 1 };
    }
    let lcap = [lq.allocatable(0), lq.allocatable(1), lq.allocatable(2)];
    let rcap = [rq.allocatable(0), rq.allocatable(1), rq.allocatable(2)];
    if leq(&lcap, &rcap) && !leq(&rcap, &lcap) {
        return -1;
    }
    if leq(&rcap, &lcap) && !leq(&lcap, &rcap) {
        return 1;
    }
    if lq.created != rq.created {
        return if lq.created < rq.created { -1 } else { 1 };
    }
    match lq.name.cmp(&rq.name) {
        std::cmp::Ordering::Less => -1,
        std::cmp::Ordering::Greater => 1,
        std::cmp::Ordering::Equal => 0,
    }
}

/// What a JobQueue holds: jobs (in job order) or victim units (`sess.units`, victim order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Items {
    Jobs,
    Units,
}

/// (order number, sequence, item): the sequence breaks ties in the order items came
type Entry = (i64, u64, usize);
type Heap = BinaryHeap<Reverse<Entry>>;

/// Jobs waiting in a queue tree, popped in KAI order (or its reverse for victims).
#[derive(Clone)]
pub struct JobQueue {
    pub items: Items,
    pub reverse: bool,
    pub simulation: bool,
    /// a job compared by another request than its own (a victim scenario's preemptor)
    pub request_of: Option<(usize, Amounts)>,
    /// per leaf queue, the victim amounts of the items popped from it (victim order only)
    popped: FxHashMap<usize, Amounts>,
    /// popped victim items not yet in `popped` (only needed when two queues are compared)
    untaken: Vec<usize>,
    /// one heap per queue key, in the order the queues first got an item
    heaps: Vec<(usize, Heap)>,
    /// discarded items still in a heap: dropped when they reach its top
    pub dead: FxHashSet<usize>,
    seq: u64,
}

impl JobQueue {
    pub fn new(
        sess: &mut Session,
        items: Items,
        list: &[usize],
        reverse: bool,
        simulation: bool,
    ) -> JobQueue {
        let mut queue = JobQueue {
            items,
            reverse,
            simulation,
            request_of: None,
            popped: FxHashMap::default(),
            untaken: Vec::new(),
            heaps: Vec::new(),
            dead: FxHashSet::default(),
            seq: 0,
        };
        let sign = if reverse { -1 } else { 1 };
        let mut entries: Vec<(usize, (i64, u64, usize))> = Vec::with_capacity(list.len());
        for &item in list {
            queue.seq += 1;
            let number = queue.number(sess, item);
            entries.push((queue.queue_key(sess, item), (sign * number, queue.seq, item)));
        }
        queue.fill(entries);
        queue
    }

    /// A queue from entries made by a caller that has the order numbers at hand: per queue key
    /// (order number negated for `reverse`, sequence 1, 2, ..., item).
    pub fn prebuilt(
        items: Items,
        reverse: bool,
        entries: Vec<(usize, (i64, u64, usize))>,
    ) -> JobQueue {
        let mut queue = JobQueue {
            items,
            reverse,
            simulation: false,
            request_of: None,
            popped: FxHashMap::default(),
            untaken: Vec::new(),
            heaps: Vec::new(),
            dead: FxHashSet::default(),
            seq: entries.len() as u64,
        };
        queue.fill(entries);
        queue
    }

    fn fill(&mut self, entries: Vec<(usize, (i64, u64, usize))>) {
        let mut lists: Vec<(usize, Vec<Reverse<Entry>>)> = Vec::new();
        for (key, entry) in entries {
            match lists.iter().position(|(k, _)| *k == key) {
                Some(at) => lists[at].1.push(Reverse(entry)),
                None => lists.push((key, vec![Reverse(entry)])),
            }
        }
        for (key, list) in lists {
            self.heaps.push((key, BinaryHeap::from(list)));
        }
    }

    fn heap_mut(&mut self, key: usize) -> &mut Heap {
        let at = match self.heaps.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                self.heaps.push((key, BinaryHeap::new()));
                self.heaps.len() - 1
            }
        };
        &mut self.heaps[at].1
    }

    fn number(&self, sess: &mut Session, item: usize) -> i64 {
        match self.items {
            Items::Jobs => sess.job_order_number(item),
            Items::Units => sess.unit_order_number(item),
        }
    }

    fn job_of(&self, sess: &Session, item: usize) -> usize {
        match self.items {
            Items::Jobs => item,
            Items::Units => sess.units[item].job,
        }
    }

    fn queue_key(&self, sess: &Session, item: usize) -> usize {
        sess.jobs[self.job_of(sess, item)].queue_key
    }

    /// Take `items` out without a pass over the heaps (they go when they reach the top; the
    /// heaps are compacted once they are half dead).
    pub fn discard(&mut self, items: &[usize]) {
        self.dead.extend(items.iter().copied());
        let size: usize = self.heaps.iter().map(|(_, h)| h.len()).sum();
        if 2 * self.dead.len() > size {
            let dead = std::mem::take(&mut self.dead);
            for (_, heap) in self.heaps.iter_mut() {
                heap.retain(|Reverse(e)| !dead.contains(&e.2));
            }
        }
    }

    fn drop_dead_tops(&mut self) {
        for (_, heap) in self.heaps.iter_mut() {
            while let Some(Reverse(top)) = heap.peek() {
                if !self.dead.contains(&top.2) {
                    break;
                }
                let item = top.2;
                heap.pop();
                self.dead.remove(&item);
            }
        }
    }

    /// The key of the item a one-queue `pop` returns next (None when empty).
    pub fn top_key(&mut self) -> Option<i64> {
        self.drop_dead_tops();
        self.heaps.iter().find_map(|(_, h)| h.peek().map(|Reverse(e)| e.0))
    }

    /// How many queues still hold an item.
    pub fn live_queue_count(&mut self) -> usize {
        self.drop_dead_tops();
        self.heaps.iter().filter(|(_, h)| !h.is_empty()).count()
    }

    pub fn push(&mut self, sess: &mut Session, item: usize) {
        let number = self.number(sess, item);
        let entry = if self.reverse { -number } else { number };
        self.seq += 1;
        let seq = self.seq;
        let key = self.queue_key(sess, item);
        self.heap_mut(key).push(Reverse((entry, seq, item)));
    }

    fn request(&self, sess: &mut Session, item: usize) -> Amounts {
        // victims are compared on what their queue holds, not on what they still want
        if self.reverse {
            return ZERO;
        }
        let job = self.job_of(sess, item);
        match self.request_of {
            Some((of, asked)) if of == job => asked,
            _ => job_request(sess, job, self.simulation),
        }
    }

    /// Whether a walk from the roots would pop from `key`'s heap: a leaf of the tree (a walk
    /// reads only leaves' heaps; a job left in a queue that has children is never popped).
    fn reachable(sess: &Session, key: usize) -> bool {
        key < sess.queues.len() && sess.queues[key].children.is_empty() && {
            let path = &sess.queues.paths[key];
            !path.is_empty() && sess.queues[path[path.len() - 1]].parent_id.is_none()
        }
    }

    fn top_of(&self, key: usize) -> Option<usize> {
        self.heaps.iter().find(|(k, _)| *k == key).and_then(|(_, h)| h.peek().map(|Reverse(e)| e.2))
    }

    /// The item that would pop next from `queue`'s subtree (a walk reaches each queue once).
    fn best_in(&self, sess: &mut Session, queue: usize) -> Option<usize> {
        if sess.queues[queue].children.is_empty() {
            self.top_of(queue)
        } else {
            self.pick(sess, Some(queue))
        }
    }

    /// The item that would pop next from among the children of `parent` (None: the roots).
    fn pick(&self, sess: &mut Session, parent: Option<usize>) -> Option<usize> {
        // by position: the names stay in the session, which the comparisons borrow mutably
        let name_at = |sess: &Session, i: usize| match parent {
            Some(p) => sess.queues[p].children.get(i).copied(),
            None => sess.queues.roots().get(i).copied(),
        };
        let mut best: Option<(usize, usize)> = None; // (queue, item)
        let mut i = 0;
        while let Some(name) = name_at(sess, i) {
            i += 1;
            let Some(cand) = self.best_in(sess, name) else { continue };
            let Some((best_name, best_item)) = best else {
                best = Some((name, cand));
                continue;
            };
            let lreq = self.request(sess, cand);
            let rreq = self.request(sess, best_item);
            let cmp = compare_queues(
                sess,
                &sess.queues[name],
                &sess.queues[best_name],
                lreq,
                rreq,
                self.victims(sess, cand),
                self.victims(sess, best_item),
            );
            if if self.reverse { cmp > 0 } else { cmp < 0 } {
                best = Some((name, cand));
            }
        }
        best.map(|(_, item)| item)
    }

    pub fn pop(&mut self, sess: &mut Session) -> Option<usize> {
        if self.heaps.len() == 1 {
            // one queue at all (a preemptor's victims): no tree walk, no comparisons
            let key = self.heaps[0].0;
            if !Self::reachable(sess, key) {
                return None;
            }
            while let Some(Reverse((_, _, item))) = self.heaps[0].1.pop() {
                if !self.dead.is_empty() && self.dead.remove(&item) {
                    continue;
                }
                if self.reverse {
                    self.untaken.push(item);
                }
                return Some(item);
            }
            return None;
        }
        if !self.dead.is_empty() {
            self.drop_dead_tops();
        }
        let mut live = (0..self.heaps.len()).filter(|&i| !self.heaps[i].1.is_empty());
        let first = live.next()?;
        if live.next().is_none() {
            // one queue holds everything (if the tree reaches it at all)
            let at = first;
            if !Self::reachable(sess, self.heaps[at].0) {
                return None;
            }
            let Reverse((_, _, item)) = self.heaps[at].1.pop()?;
            if self.reverse {
                self.untaken.push(item);
            }
            return Some(item);
        }
        self.account_taken(sess);
        let picked = self.pick(sess, None)?;
        let key = self.queue_key(sess, picked);
        let Reverse((_, _, item)) = self.heap_mut(key).pop()?;
        if self.reverse {
            self.untaken.push(item);
        }
        Some(item)
    }

    fn victim_amount(&self, sess: &Session, item: usize) -> Amounts {
        match self.items {
            Items::Units => sess.victim_amount(item),
            Items::Jobs => ZERO,
        }
    }

    /// What a subtree's share is lowered by in the victim order, `cand` being the item it
    /// would give next: KAI (job_order_by_queue.go, VictimQueue) subtracts the jobs already
    /// popped from `cand`'s leaf queue and `cand` itself, at every level of the tree (a parent
    /// queue only by its best leaf's), each by its whole `Allocated`, even where a pop took
    /// only part of a job and what is left of it comes again.
    fn victims(&self, sess: &Session, cand: usize) -> Amounts {
        if !self.reverse {
            return ZERO;
        }
        let amount = self.victim_amount(sess, cand);
        let leaf = self.queue_key(sess, cand);
        match self.popped.get(&leaf) {
            Some(p) => [p[0] + amount[0], p[1] + amount[1], p[2] + amount[2]],
            None => amount,
        }
    }

    fn account_taken(&mut self, sess: &Session) {
        for item in std::mem::take(&mut self.untaken) {
            let amount = self.victim_amount(sess, item);
            let leaf = self.queue_key(sess, item);
            let old = self.popped.get(&leaf).copied().unwrap_or(ZERO);
            self.popped.insert(leaf, [old[0] + amount[0], old[1] + amount[1], old[2] + amount[2]]);
        }
    }
}

/// The jobs with a pending task, per leaf queue in job order, kept in step with the session
/// through its undo log: only the jobs of the entries since the last `sync` are looked at
/// again (a job's order and pending state change only with its tasks).
#[derive(Clone, Default)]
pub struct PendingOrder {
    version: LogMark,
    /// per leaf queue: (order number, job), ascending
    by_queue: FxHashMap<usize, Vec<(i64, usize)>>,
    /// job -> (queue, order number)
    entry: FxHashMap<usize, (usize, i64)>,
}

impl PendingOrder {
    /// Bring the session's up to date with its current state (made on first use).
    pub fn sync(sess: &mut Session) {
        let now = sess.undo.mark();
        let mut known = match sess.scratch.take::<PendingOrder>() {
            Some(known) if sess.undo.since(known.version).is_some() => known,
            _ => {
                let mut fresh = Box::new(PendingOrder { version: now, ..PendingOrder::default() });
                for job in sess.pending_jobs.clone() {
                    let Some(queue) = fresh.queue_of(sess, job) else { continue };
                    let number = sess.job_order_number(job);
                    fresh.by_queue.entry(queue).or_default().push((number, job));
                    fresh.entry.insert(job, (queue, number));
                }
                for list in fresh.by_queue.values_mut() {
                    list.sort_unstable();
                }
                fresh
            }
        };
        if known.version != now {
            let mut touched: Vec<usize> = Vec::new();
            let mut seen: FxHashSet<usize> = FxHashSet::default();
            for entry in sess.undo.since(known.version).expect("held") {
                let job = sess.tasks[entry.task()].job;
                if seen.insert(job) {
                    touched.push(job);
                }
            }
            for job in touched {
                known.remove(job);
                known.add(sess, job);
            }
            known.version = now;
        }
        sess.scratch.put(known);
    }

    /// The job's leaf queue when it has a pending task (a job in a parent queue or one missing
    /// from the tree is never popped).
    fn queue_of(&self, sess: &Session, job: usize) -> Option<usize> {
        let queue = sess.jobs[job].queue_id;
        queue.filter(|_| sess.has_pending(job) && sess.queues.is_leaf(queue))
    }

    fn add(&mut self, sess: &mut Session, job: usize) {
        let Some(queue) = self.queue_of(sess, job) else { return };
        let number = sess.job_order_number(job);
        let list = self.by_queue.entry(queue).or_default();
        let at = list.partition_point(|&e| e < (number, job));
        list.insert(at, (number, job));
        self.entry.insert(job, (queue, number));
    }

    fn remove(&mut self, job: usize) {
        if let Some((queue, number)) = self.entry.remove(&job) {
            let list = self.by_queue.get_mut(&queue).expect("queue");
            if let Ok(at) = list.binary_search(&(number, job)) {
                list.remove(at);
            }
        }
    }
}

/// The order in which a victim scenario places its preemptor and victims again (`wanted`,
/// distinct, as they are once the victims are evicted; the preemptor first): ordering.py
/// `scenario_queue`. KAI pops them from a queue over every job with a pending task
/// (GetJobsToAllocate) and skips the others, but while one of them is the first of its queue it
/// is what that queue is compared by. The session's `PendingOrder` (in its scratch) holds
/// those others as they were before the scenario (synced by the caller when the wanted jobs are
/// in more than one queue, the only case that reads it). The preemptor is compared by what its `prefix` asks: KAI puts
/// in its place the partial job of the prefix (job_solver.go getPartialJobRepresentative).
pub fn scenario_queue(sess: &mut Session, wanted: &[usize], prefix: &[usize]) -> JobQueue {
    let mut entries: Vec<(usize, (i64, u64, usize))> = Vec::with_capacity(wanted.len());
    // per queue key: its last wanted job's number, in the order first seen
    let mut last: Vec<(usize, i64)> = Vec::new();
    for (i, &job) in wanted.iter().enumerate() {
        // the preemptor (first) stands as its partial job: only the prefix's pending pods, each
        // podset's minimum that many, so below its minimum (the elastic order's first rank)
        // however many of the whole job's pods run (job_solver.go getPartialJobRepresentative)
        let number = if i == 0 {
            let (priority, created) = (sess.jobs[job].priority, sess.jobs[job].created);
            sess.order_number(-priority, 0, created, job)
        } else {
            sess.job_order_number(job)
        };
        let key = sess.jobs[job].queue_key;
        entries.push((key, (number, 0, job)));
        match last.iter_mut().find(|(k, _)| *k == key) {
            Some(known) => known.1 = known.1.max(number),
            None => last.push((key, number)),
        }
    }
    if last.len() > 1 {
        if let Some(pending) = sess.scratch.get::<PendingOrder>() {
            let wanted: FxHashSet<usize> = wanted.iter().copied().collect();
            let reachable = |key: usize| JobQueue::reachable(sess, key);
            // a subtree without a wanted job matters only through its parent's best job, and
            // that only where the parent competes with a sibling that has one ("contested")
            const ROOTS: usize = usize::MAX;
            let mut relevant: FxHashSet<usize> = FxHashSet::default();
            let mut relevant_children: FxHashMap<usize, usize> = FxHashMap::default();
            for &(key, _) in &last {
                if !reachable(key) {
                    continue;
                }
                for &q in &sess.queues.paths[key] {
                    if !relevant.insert(q) {
                        break;
                    }
                    *relevant_children
                        .entry(sess.queues[q].parent_id.unwrap_or(ROOTS))
                        .or_default() += 1;
                }
            }
            for (&queue, jobs) in &pending.by_queue {
                if !reachable(queue) {
                    continue;
                }
                // contested: the leaf's subtree, and its parent's (`above`) by the end of the walk
                let (mut contested, mut above) = (false, false);
                for &q in sess.queues.paths[queue].iter().rev() {
                    above = contested;
                    contested = contested
                        || (relevant.contains(&q)
                            && relevant_children[&sess.queues[q].parent_id.unwrap_or(ROOTS)] >= 2);
                }
                let count = if above {
                    jobs.len()
                } else if contested {
                    let end = last.iter().find(|(k, _)| *k == queue).map_or(i64::MIN, |l| l.1);
                    jobs.partition_point(|&(number, _)| number < end)
                } else {
                    continue;
                };
                for &(number, job) in &jobs[..count] {
                    if !wanted.contains(&job) {
                        entries.push((queue, (number, 0, job)));
                    }
                }
            }
        }
    }
    for (seq, entry) in entries.iter_mut().enumerate() {
        entry.1 .1 = seq as u64 + 1;
    }
    let mut queue = JobQueue::prebuilt(Items::Jobs, false, entries);
    queue.simulation = true;
    let mut asked = ZERO;
    for &task in prefix {
        let amount = pending_queue_amount(&sess.tasks[task].req);
        asked = [asked[0] + amount[0], asked[1] + amount[1], asked[2] + amount[2]];
    }
    queue.request_of = Some((wanted[0], asked));
    queue
}
