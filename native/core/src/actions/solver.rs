//! The victim solver shared by reclaim, preempt and consolidation
//! (kai_ray/core/actions/solver.py). For a pending job it grows prefixes of its
//! tasks-to-allocate; each prefix starts from the victim groups recorded for the previous one (see
//! `groups_hit`) and adds
//! potential victims in victim order; every scenario evicts the recorded victims plus the
//! potential victims of the jobs with one on a node of the latest one (all of them, wherever
//! they sit), then places the preemptor and the victims again (pipeline only), in the order KAI
//! pops them from among every job with a pending task (`ordering::scenario_queue`). An action's
//! rules accept or reject the scenario.
//!
//! The scope cache, the victim stream and the incremental idle-GPU filter are this core's speed
//! paths: the Python specification recomputes each plainly (docs/native-core.md).

use std::cmp::Ordering;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::actions::common::place_tasks;
use crate::actions::gpu_room::{free_into, needs, AllFreed, DevKey, FreeGpus, Freed, GpuRoom};
use crate::actions::victim_stream::{StreamRead, Takes, VictimStream};
use crate::actions::victims::{new_unit, take_unrecorded, unit_of, victim_units};
use crate::jobs::Signature;
use crate::model::PodStatus;
use crate::ordering::{scenario_queue, Items, JobQueue, PendingOrder};
use crate::state::{EvictInfo, EvictMessage, Session};
use crate::statement::{LogMark, Undo};

/// Which victims a job may take: preempt (queue, priority), reclaim (queue, i64::MIN); None
/// for consolidation (no cache across jobs).
pub type Scope = Option<(usize, i64)>;
type ScopeKey = (usize, i64);
/// (scope, whole-GPU needs, fractions needed) -> whether every candidate victim would do
type EnoughKey = (ScopeKey, Vec<i64>, Vec<i64>);

/// What an action decides for the solver.
pub trait Rules {
    fn action(&self) -> &'static str;
    fn message(&self) -> EvictMessage;
    /// the candidate victim jobs
    fn candidates(&self, sess: &mut Session) -> Vec<usize>;
    /// whether job `v` is one of them now (a scope's rules: the same for every job of it)
    fn is_candidate(&self, sess: &Session, v: usize) -> bool;
    /// whether the scenario is accepted. A rejection takes no queue's jobs out of the search:
    /// KAI goes on adding victims, and a later scenario may keep or move the rejected ones
    /// rather than evict them (fuzzer seed 43)
    fn validate(&self, sess: &Session, evicted: &[usize], moved: &[usize]) -> bool;
}

/// A pending pod's request as KAI's ResourceRequirements compares it (resource_requirment.go
/// LessEqual): GPU device count, portion of each device (1 for whole GPUs, 0 for CPU-only and
/// gpu-memory requests), CPU, memory.
type Request = (i64, f64, i64, i64);
type Footprint = Vec<Request>;
type SignatureKey = (usize, Signature);
/// KAI's minGPUs: portions closer than this compare equal
const MIN_PORTION_DIFF: f64 = 0.01;

fn request(sess: &Session, t: usize) -> Request {
    let req = &sess.tasks[t].req;
    if req.gpus != 0 {
        (req.gpus, 1.0, req.cpu_m, req.memory)
    } else if req.gpu_fraction_milli != 0 {
        (req.fraction_devices, req.gpu_fraction_milli as f64 / 1000.0, req.cpu_m, req.memory)
    } else if req.gpu_memory_mib != 0 {
        (req.fraction_devices, 0.0, req.cpu_m, req.memory)
    } else {
        (0, 0.0, req.cpu_m, req.memory)
    }
}

fn le(a: &Request, b: &Request) -> bool {
    a.0 <= b.0 && (a.1 < b.1 || (a.1 - b.1).abs() < MIN_PORTION_DIFF) && a.2 <= b.2 && a.3 <= b.3
}

fn live_status(sess: &Session, mut t: usize) -> PodStatus {
    while let Some(copy) = sess.tasks[t].moved {
        t = copy;
    }
    sess.tasks[t].status
}

/// KAI's scheduling-constraints signature of a job (PodGroupInfo / PodSet
/// GetSchedulingConstraintsSignature): per podset, the constraints of each of its pods that is
/// not active-allocated, one entry per pod, and the pods' priority; nothing of what the pods
/// request. KAI caches it on first use, so it stays what it was then for the whole cycle.
fn signature(sess: &mut Session, job: usize) -> Signature {
    if let Some(sig) = &sess.jobs[job].signature {
        return sig.clone();
    }
    let mut sets: Vec<Vec<usize>> = Vec::with_capacity(sess.jobs[job].podsets.len());
    for ps in &sess.jobs[job].podsets {
        // a moved pod is where it went (KAI: one pod, pipelined)
        let mut rest: Vec<usize> = ps
            .tasks
            .iter()
            .filter(|&&t| sess.tasks[t].origin.is_none())
            .filter(|&&t| !live_status(sess, t).active_allocated())
            .map(|&t| sess.tasks[t].constraints)
            .collect();
        rest.sort_unstable();
        sets.push(rest);
    }
    sets.sort();
    let sig = (sess.jobs[job].priority, sets);
    sess.jobs[job].signature = Some(sig.clone());
    sig
}

/// KAI's scheduling signatures (minimal_job_comparison.go): within one action, a job is skipped
/// when a job of the same signature failed and it is not easier to place than that one (its
/// pending pods, sorted, are nowhere strictly smaller, or it has more of them).
#[derive(Default)]
pub struct FailedJobs {
    failed: FxHashMap<SignatureKey, Footprint>,
}

impl FailedJobs {
    fn footprint(sess: &Session, job: usize) -> Footprint {
        let mut out: Footprint =
            sess.pending_tasks(job).into_iter().map(|t| request(sess, t)).collect();
        out.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
        out
    }

    pub fn should_skip(&self, sess: &mut Session, job: usize, scope: usize) -> bool {
        let key = (scope, signature(sess, job));
        let Some(known) = self.failed.get(&key) else { return false };
        let mine = Self::footprint(sess, job);
        if mine.is_empty() || known.is_empty() {
            return true;
        }
        if known.len() > mine.len() {
            return false;
        }
        for (i, a) in mine.iter().enumerate() {
            let Some(b) = known.get(i) else { return true };
            if le(a, b) && !le(b, a) {
                return false; // strictly smaller here: easier
            }
        }
        true
    }

    pub fn record(&mut self, sess: &mut Session, job: usize, scope: usize) {
        let key = (scope, signature(sess, job));
        let mine = Self::footprint(sess, job);
        let replace = match self.failed.get(&key) {
            None => true,
            Some(known) => {
                !mine.is_empty()
                    && mine.len() <= known.len()
                    && mine.iter().zip(known).all(|(a, b)| le(a, b))
            }
        };
        if replace {
            self.failed.insert(key, mine);
        }
    }
}

/// One scope's victim units, their victim-order queue and what they would free together,
/// updated job by job. A job's membership can change within an action only when the job
/// changes (its min-runtime protection depends on its running pods, an elastic job's on
/// whether it is above its minimum), so the jobs changed since are asked again (`pending`)
/// when the scope is next used, with its own rules: KAI filters the victims afresh for every
/// preemptor.
struct ScopeVictims {
    units: FxHashMap<usize, usize>,
    members: FxHashSet<usize>,
    freed: Freed,
    queue: JobQueue,
    /// jobs changed since the membership was last checked (repeats allowed: deduplicated when
    /// checked, so a scope left unused costs a push per change)
    pending: Vec<usize>,
}

impl ScopeVictims {
    fn new(sess: &mut Session, jobs: &[usize]) -> ScopeVictims {
        let mut scope = ScopeVictims {
            units: FxHashMap::default(),
            members: jobs.iter().copied().collect(),
            freed: Freed::default(),
            queue: JobQueue::prebuilt(Items::Units, true, Vec::new()),
            pending: Vec::new(),
        };
        let mut entries = Vec::new();
        for &job in jobs {
            if let Some(unit) = scope.add(sess, job) {
                let number = sess.unit_order_number(unit);
                entries.push((sess.jobs[job].queue_key, (-number, scope.units.len() as u64, unit)));
            }
        }
        scope.queue = JobQueue::prebuilt(Items::Units, true, entries);
        scope
    }

    /// The job's unit as of its last change (kept for the session, shared by every scope).
    fn add(&mut self, sess: &mut Session, job: usize) -> Option<usize> {
        let changes = sess.jobs[job].changes;
        let unit = match sess.victim_units[job] {
            Some((at, unit)) if at == changes => unit,
            _ => {
                let unit = unit_of(sess, job);
                sess.victim_units[job] = Some((changes, unit));
                unit
            }
        };
        if let Some(unit) = unit {
            self.units.insert(job, unit);
            for i in 0..sess.units[unit].tasks.len() {
                let t = sess.units[unit].tasks[i];
                self.freed.add(sess, t, 1);
            }
        }
        unit
    }

    /// The units of `jobs` (changed since, or joining or leaving the scope): the old ones out,
    /// a new one for each job that is a member now.
    fn update(&mut self, sess: &mut Session, jobs: &[usize]) {
        let mut gone = Vec::new();
        let mut seen: FxHashSet<usize> = FxHashSet::default();
        let jobs: Vec<usize> = jobs.iter().copied().filter(|&job| seen.insert(job)).collect();
        for &job in &jobs {
            if let Some(old) = self.units.remove(&job) {
                gone.push(old);
                for i in 0..sess.units[old].tasks.len() {
                    let t = sess.units[old].tasks[i];
                    self.freed.add(sess, t, -1);
                }
            }
        }
        self.queue.discard(&gone);
        for &job in &jobs {
            if self.members.contains(&job) {
                if let Some(unit) = self.add(sess, job) {
                    self.queue.push(sess, unit);
                }
            }
        }
    }
}

/// Victim candidates and free GPUs for one action run. A job that fails rolls the session back;
/// one that succeeds changes only the jobs its decisions touched (found in the undo log), so
/// only their victim units are rebuilt, in the scopes that hold them.
#[derive(Default)]
pub struct VictimCache {
    version: Option<LogMark>,
    free: Option<FreeGpus>,
    scopes: FxHashMap<(usize, i64), ScopeVictims>,
    scope_order: Vec<(usize, i64)>,
    all_freed: FxHashMap<(usize, i64), AllFreed>,
    streams: FxHashMap<(usize, i64), VictimStream>,
    /// per stream, jobs changed since it was built (repeats allowed: `first_of_each` keeps
    /// the first of each when it is read, so a stream left unread costs a push per change)
    touched: FxHashMap<(usize, i64), Vec<usize>>,
    enough_all: FxHashMap<EnoughKey, bool>,
    /// scope None: this attempt's victims (rebuilt every time)
    loose_freed: Option<AllFreed>,
    loose_queue: Option<JobQueue>,
    /// the nodes with idle or releasing GPUs (`update_gpu_feasible`)
    gpu_feasible: Option<GpuFeasible>,
}

/// The nodes with idle or releasing GPUs, as of `ClusterState::gpu_log` read up to `read`.
struct GpuFeasible {
    read: usize,
    mask: Vec<bool>,
    /// the nodes of `mask`, in node order
    list: Vec<usize>,
}

impl VictimCache {
    /// KAI's FeasibleNodesForJob (feasible_nodes.go) for a job all of whose pods ask for a
    /// GPU, the nodes a victim scenario may place on before its victims' nodes are added: those
    /// whose idle or whose releasing GPU sum (`gpu_sums_at`) is above 0, as a mask and in node
    /// order; only the nodes recounted since (`ClusterState::gpu_log`) are worked out again.
    fn update_gpu_feasible(&mut self, sess: &Session) {
        let feasible = |n: usize| {
            let (idle, releasing) = gpu_sums_at(sess, n);
            idle > 0 || releasing > 0
        };
        let read = sess.cluster.gpu_log.len();
        match &mut self.gpu_feasible {
            Some(known) if known.read == read => {}
            Some(known) => {
                let mut changed = false;
                for &n in &sess.cluster.gpu_log[known.read..] {
                    let now = feasible(n as usize);
                    changed |= known.mask[n as usize] != now;
                    known.mask[n as usize] = now;
                }
                if changed {
                    known.list = (0..known.mask.len()).filter(|&n| known.mask[n]).collect();
                }
                known.read = read;
            }
            None => {
                let mask: Vec<bool> = (0..sess.cluster.nodes.len()).map(feasible).collect();
                let list = (0..mask.len()).filter(|&n| mask[n]).collect();
                self.gpu_feasible = Some(GpuFeasible { read, mask, list });
            }
        }
    }

    fn all_enough(&mut self, sess: &mut Session, scope: Scope, prefix: &[usize]) -> bool {
        let (whole, fractions) = needs(sess, prefix);
        let Some(key) = scope else {
            return self.loose_freed.as_ref().expect("all freed").enough(&whole, &fractions);
        };
        let cache_key = (key, whole, fractions);
        if let Some(&known) = self.enough_all.get(&cache_key) {
            return known;
        }
        let all_freed = self.all_freed.get_mut(&key).expect("all freed");
        all_freed.refresh(sess, &self.scopes[&key].freed);
        let known = all_freed.enough(&cache_key.1, &cache_key.2);
        self.enough_all.insert(cache_key, known);
        known
    }

    /// The scope's victim stream for the current state (`get` was called for this state).
    fn stream_ready(&mut self, sess: &mut Session, scope: Scope) -> bool {
        let Some(key) = scope else { return false };
        if !self.scopes.contains_key(&key) || self.free.is_none() {
            return false;
        }
        let touched = self.touched.remove(&key).map(first_of_each);
        let mut keep = self.streams.contains_key(&key);
        if keep {
            if let Some(touched) = touched {
                let units = &self.scopes[&key].units;
                let stream = self.streams.get_mut(&key).expect("stream");
                keep = stream.renew(sess, units, &touched);
            }
        }
        if !keep {
            let victims = &self.scopes[&key];
            self.streams.insert(key, VictimStream::new(&victims.queue, &victims.units));
        }
        true
    }

    fn get(&mut self, sess: &mut Session, scope: Scope, rules: &dyn Rules) {
        let now = sess.undo.mark();
        if self.version != Some(now) || self.free.is_none() {
            let mut touched: Vec<usize> = Vec::new();
            // the free GPUs are counted again only where they changed when the state grew
            let mut grew = false;
            match self.version.and_then(|version| sess.undo.since(version)) {
                Some(entries) => {
                    grew = true;
                    let mut jobs: Vec<usize> = Vec::new();
                    let mut seen: FxHashSet<usize> = FxHashSet::default();
                    for entry in entries {
                        let job = sess.tasks[entry.task()].job;
                        if seen.insert(job) {
                            jobs.push(job);
                        }
                    }
                    let nodes = changed_nodes(sess, entries, &jobs);
                    touched = jobs.clone();
                    for key in self.scope_order.clone() {
                        let scope = self.scopes.get_mut(&key).expect("scope");
                        let scope_jobs: Vec<usize> =
                            jobs.iter().copied().filter(|j| scope.members.contains(j)).collect();
                        if !scope_jobs.is_empty() {
                            scope.update(sess, &scope_jobs);
                        }
                        scope.pending.extend(jobs.iter().copied());
                    }
                    for all_freed in self.all_freed.values_mut() {
                        all_freed.mark(&nodes);
                    }
                }
                None => {
                    self.scopes.clear();
                    self.scope_order.clear();
                    self.streams.clear();
                    self.touched.clear();
                    self.all_freed.clear();
                }
            }
            self.version = Some(now);
            self.free = Some(match self.free.take() {
                Some(free) if grew => free.renewed(sess),
                _ => FreeGpus::new(sess),
            });
            self.enough_all.clear();
            // streams are carried over when next used, with every job touched since
            let keys: Vec<(usize, i64)> = self.streams.keys().copied().collect();
            for key in keys {
                self.touched.entry(key).or_default().extend_from_slice(&touched);
            }
        }
        let Some(key) = scope else {
            let candidates = rules.candidates(sess);
            let units = victim_units(sess, &candidates);
            let mut freed = Freed::default();
            for &u in &units {
                for i in 0..sess.units[u].tasks.len() {
                    let t = sess.units[u].tasks[i];
                    freed.add(sess, t, 1);
                }
            }
            let free = self.free.as_ref().expect("free");
            let mut view = free.with_freed(sess, &freed);
            self.loose_freed = Some(AllFreed::new(sess, &mut view));
            self.loose_queue = Some(JobQueue::new(sess, Items::Units, &units, true, false));
            return;
        };
        if let std::collections::hash_map::Entry::Vacant(slot) = self.scopes.entry(key) {
            let candidates = rules.candidates(sess);
            slot.insert(ScopeVictims::new(sess, &candidates));
            self.scope_order.push(key);
        }
        self.recheck_members(sess, key, rules);
        if !self.all_freed.contains_key(&key) {
            let free = self.free.as_ref().expect("free");
            let mut view = free.with_freed(sess, &self.scopes[&key].freed);
            self.all_freed.insert(key, AllFreed::new(sess, &mut view));
        }
    }

    /// Ask the scope's rules again about the jobs changed since its membership was last
    /// checked; a job that joins or leaves changes the scope's units, what they free (counted
    /// again on its nodes) and its victim stream (made afresh when next read).
    fn recheck_members(&mut self, sess: &mut Session, key: (usize, i64), rules: &dyn Rules) {
        let scope = self.scopes.get_mut(&key).expect("scope");
        if scope.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut scope.pending);
        pending.sort_unstable();
        pending.dedup();
        let (mut joined, mut left) = (Vec::new(), Vec::new());
        for job in pending {
            let now = rules.is_candidate(sess, job);
            if now != scope.members.contains(&job) {
                if now {
                    joined.push(job)
                } else {
                    left.push(job)
                }
            }
        }
        if joined.is_empty() && left.is_empty() {
            return;
        }
        for &job in &left {
            scope.members.remove(&job);
        }
        let changed: Vec<usize> = joined.iter().chain(&left).copied().collect();
        scope.members.extend(joined.iter().copied());
        scope.update(sess, &changed);
        let mut nodes: Vec<i32> = changed
            .iter()
            .flat_map(|&job| sess.jobs[job].tasks.iter().map(|&t| sess.tasks[t].node))
            .filter(|&n| n >= 0)
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        if let Some(all_freed) = self.all_freed.get_mut(&key) {
            all_freed.mark(&nodes);
        }
        self.streams.remove(&key);
        self.touched.remove(&key);
        self.enough_all.retain(|k, _| k.0 != key);
    }

    fn victim_queue(&self, scope: Scope) -> &JobQueue {
        match scope {
            Some(key) => &self.scopes[&key].queue,
            None => self.loose_queue.as_ref().expect("queue"),
        }
    }
}

/// Nodes where the undo-log `entries` changed something, and where the tasks of
/// `jobs` (whose victim units may have changed) sit.
fn changed_nodes(sess: &Session, entries: &[Undo], jobs: &[usize]) -> Vec<i32> {
    let mut nodes: FxHashSet<i32> = FxHashSet::default();
    for entry in entries {
        nodes.insert(sess.tasks[entry.task()].node);
        match *entry {
            Undo::Move { copy, .. } => {
                nodes.insert(sess.tasks[copy].node);
            }
            Undo::Alloc { node, .. } => {
                nodes.insert(node);
            }
            _ => {}
        }
    }
    for &job in jobs {
        for &t in &sess.jobs[job].tasks {
            nodes.insert(sess.tasks[t].node);
        }
    }
    nodes.remove(&-1);
    let mut out: Vec<i32> = nodes.into_iter().collect();
    out.sort_unstable();
    out
}

/// What a job's recorded victims free, as overlays over the free GPUs, kept from prefix to
/// prefix: the victims recorded for the next prefix are mostly those of this one plus a few.
#[derive(Default)]
struct RecordedFreed {
    tasks: Vec<usize>,
    whole: FxHashMap<i32, i64>,
    freed: FxHashMap<DevKey, i64>,
}

impl RecordedFreed {
    fn of(&mut self, sess: &Session, free: &FreeGpus, recorded: &[usize]) {
        let known = self.tasks.len();
        if recorded.len() < known || recorded.iter().zip(&self.tasks).any(|(a, b)| a != b) {
            *self = RecordedFreed::default();
        }
        let known = self.tasks.len();
        for &t in &recorded[known..] {
            let mut scratch = FxHashMap::default();
            free_into(sess, &free.whole, false, t, &mut self.whole, &mut scratch, &mut self.freed);
            self.tasks.push(t);
        }
    }
}

pub struct Solver<'a> {
    rules: &'a dyn Rules,
    scope: Scope,
    recorded: RecordedFreed,
    /// whether the job's feasible nodes are the nodes with GPU room (every pod of it asks for
    /// a GPU: `VictimCache::update_gpu_feasible`); false: every node
    gpu_only: bool,
}

impl<'a> Solver<'a> {
    pub fn new(rules: &'a dyn Rules, scope: Scope) -> Solver<'a> {
        Solver { rules, scope, recorded: RecordedFreed::default(), gpu_only: false }
    }

    /// Try to make room for `job`; on success the winning scenario stays applied.
    pub fn solve(&mut self, sess: &mut Session, cache: &mut VictimCache, job: usize) -> bool {
        let tasks = sess.tasks_to_allocate(job, false);
        if tasks.is_empty() {
            return false;
        }
        let base = sess.statement().checkpoint();
        let active_before = sess.active_count(job);
        // the state is rolled back to `base` before every prefix: the candidates and the free
        // GPUs are the same for all of them
        cache.get(sess, self.scope, self.rules);
        // hopeless: not even every candidate victim together would make room for all tasks
        if !cache.all_enough(sess, self.scope, &tasks) {
            return false;
        }
        self.gpu_only = sess.jobs[job].tasks.iter().all(|&t| sess.tasks[t].req.wants_gpu());
        if self.gpu_only {
            // as of this state, which every prefix and scenario starts from
            cache.update_gpu_feasible(sess);
        }
        let mut recorded: Vec<Vec<usize>> = Vec::new();
        let mut actual: Vec<usize> = Vec::new(); // what the last prefix's scenario evicted or moved
        self.recorded = RecordedFreed::default();
        let mut solved = false;
        for k in 1..=tasks.len() {
            let Some(found) = self.solve_prefix(sess, cache, job, &tasks[..k], &recorded, &actual)
            else {
                break;
            };
            (recorded, actual) = found;
            solved = k == tasks.len();
            if !solved {
                sess.statement().rollback(base);
            }
        }
        if solved && sess.gang_satisfied(job) && sess.active_count(job) > active_before {
            return true;
        }
        sess.statement().rollback(base);
        false
    }

    /// The victim groups the next prefix starts from (see `groups_hit`) and the pods the
    /// winning scenario evicted or moved, or None when no scenario makes room for `prefix`;
    /// `groups` and `actual` are the previous prefix's.
    #[allow(clippy::type_complexity)]
    fn solve_prefix(
        &mut self,
        sess: &mut Session,
        cache: &mut VictimCache,
        job: usize,
        prefix: &[usize],
        groups: &[Vec<usize>],
        actual: &[usize],
    ) -> Option<(Vec<Vec<usize>>, Vec<usize>)> {
        let recorded: Vec<usize> = groups.iter().flatten().copied().collect();
        let recorded = &recorded[..];
        let mut room = {
            let free = cache.free.as_mut().expect("free");
            GpuRoom::new(sess, free, prefix)
        };
        if !recorded.is_empty() && !room.trivial {
            let free = cache.free.as_mut().expect("free");
            self.recorded.of(sess, free, recorded);
            room.adopt(sess, free, self.recorded.whole.clone(), self.recorded.freed.clone());
        }
        // the scenario of the recorded victims alone (the same on every node), once tried
        let mut recorded_only =
            !recorded.is_empty() && room.enough(sess, cache.free.as_mut().expect("free"));
        if recorded_only {
            let nodes = self.nodes(sess, &*cache, actual, &[]);
            if let Some(result) = self.try_scenario(sess, job, prefix, recorded, nodes) {
                let hit = groups_hit(&result, groups.iter().map(|g| &g[..]));
                return Some((hit, result));
            }
        }
        if !cache.all_enough(sess, self.scope, prefix) {
            return None; // not even every candidate victim together would make room
        }
        let use_stream = cache.stream_ready(sess, self.scope) && {
            let key = self.scope.expect("scope");
            cache.streams[&key].covers(sess, &cache.scopes[&key].units, recorded)
        };
        let mut source = if use_stream {
            let key = self.scope.expect("scope");
            let VictimCache { streams, scopes, free, .. } = &mut *cache;
            let stream = streams.get_mut(&key).expect("stream");
            let free = free.as_mut().expect("free");
            Source::Stream(StreamRead::new(
                stream,
                sess,
                free,
                &scopes[&key].units,
                &room,
                recorded,
            ))
        } else {
            Source::Popped(
                cache.victim_queue(self.scope).clone(),
                recorded.iter().copied().collect(),
            )
        };
        // potential victims in the order they were taken (those of the quiet batch, which come
        // first, joined once an entry may be simulated): a scenario on a node takes every
        // potential victim of the jobs with one there, wherever it sits (KAI's
        // ByNodeScenario.VictimsTasksFromNodes)
        let mut quiet_batch = Takes::default();
        // the potential victims, take after take (`taken_ends` closes each)
        let mut potential: Vec<usize> = Vec::new();
        let mut taken_ends: Vec<usize> = Vec::new();
        // node and job of each potential victim: a prefix simulates a few nodes, so scanning
        // these for one is cheaper than indexing the whole quiet batch by node
        let mut potential_at: Vec<(i32, usize)> = Vec::new();
        let mut joined = false;
        let found = 'search: loop {
            let item = match &mut source {
                Source::Stream(read) => {
                    let key = self.scope.expect("scope");
                    let VictimCache { streams, scopes, free, .. } = &mut *cache;
                    let stream = streams.get_mut(&key).expect("stream");
                    let free = free.as_mut().expect("free");
                    read.next(stream, sess, free, &scopes[&key].units, &mut room)
                }
                Source::Popped(queue, recorded_set) => popped_next(sess, queue, recorded_set),
            };
            let Some((takes, quiet)) = item else { break None };
            if quiet {
                if quiet_batch.is_empty() {
                    quiet_batch = takes;
                } else {
                    for g in takes.groups() {
                        quiet_batch.push(g);
                    }
                }
                continue;
            }
            let at = |t: usize| (sess.tasks[t].node, sess.tasks[t].job);
            if !joined {
                joined = true;
                let batch = std::mem::take(&mut quiet_batch);
                potential_at.extend(batch.tasks.iter().map(|&t| at(t)));
                potential = batch.tasks;
                taken_ends = batch.ends;
            }
            {
                let free = cache.free.as_mut().expect("free");
                for g in takes.groups() {
                    for &t in g {
                        potential_at.push(at(t));
                        room.add_victim(sess, free, t);
                    }
                    potential.extend_from_slice(g);
                    taken_ends.push(potential.len());
                }
                if !room.enough(sess, free) {
                    continue; // even every victim so far would not free enough GPUs
                }
            }
            // a scenario per node of each taken victim's job, any of its pods where it is now
            // (KAI's getNodesOfJob, by_pod_solver.go:86,204: a moved pod is on the node it was
            // moved to, not the one it leaves; fuzzer seed 779): on one with no potential
            // victim (or for a pending pod, no node) only the recorded victims go, and that may
            // be enough now that earlier jobs of the action left GPUs releasing
            let mut nodes: Vec<i32> = takes
                .groups()
                .flat_map(|g| sess.jobs[sess.tasks[g[0]].job].tasks.iter())
                .filter(|&&t| sess.tasks[t].moved.is_none())
                .map(|&t| sess.tasks[t].node)
                .collect();
            nodes.sort_unstable();
            nodes.dedup();
            for node in nodes {
                let on_node = jobs_on(&potential_at, node);
                let mut scenario = recorded.to_vec();
                scenario.extend(
                    potential
                        .iter()
                        .zip(&potential_at)
                        .filter(|(_, a)| on_node.contains(&a.1))
                        .map(|(&t, _)| t),
                );
                if scenario.len() == recorded.len() {
                    if recorded_only {
                        continue; // already tried: it fails the same way
                    }
                    recorded_only = true;
                }
                if !room.enough_with(sess, cache.free.as_mut().expect("free"), &scenario) {
                    continue;
                }
                let nodes = self.nodes(sess, &*cache, actual, &scenario[recorded.len()..]);
                if let Some(result) = self.try_scenario(sess, job, prefix, &scenario, nodes) {
                    // the takes in the scenario: a take is of one job, so whole or not at all
                    let starts = std::iter::once(0).chain(taken_ends.iter().copied());
                    let added = starts
                        .zip(taken_ends.iter().copied())
                        .map(|(a, b)| &potential[a..b])
                        .filter(|g| on_node.contains(&sess.tasks[g[0]].job));
                    let hit = groups_hit(&result, groups.iter().map(|g| &g[..]).chain(added));
                    break 'search Some((hit, result));
                }
            }
        };
        if use_stream {
            let key = self.scope.expect("scope");
            cache.streams.get_mut(&key).expect("stream").take_back(&mut room);
        }
        found
    }

    /// A scenario's nodes in node order (KAI's byPodSolver feasibleNodes): the job's feasible
    /// nodes, those of the previous prefix's victims and those of the scenario's potential
    /// victims; None: every node.
    fn nodes(
        &self,
        sess: &Session,
        cache: &VictimCache,
        actual: &[usize],
        added: &[usize],
    ) -> Option<Vec<usize>> {
        if !self.gpu_only {
            return None;
        }
        let known = cache.gpu_feasible.as_ref().expect("made by `solve`");
        let (mask, feasible) = (&known.mask, &known.list);
        let mut extra: Vec<usize> = actual
            .iter()
            .chain(added)
            .map(|&t| sess.tasks[t].node)
            .filter(|&n| n >= 0 && !mask[n as usize])
            .map(|n| n as usize)
            .collect();
        if extra.is_empty() {
            return Some(feasible.to_vec());
        }
        extra.sort_unstable();
        extra.dedup();
        let mut out = Vec::with_capacity(feasible.len() + extra.len());
        let (mut i, mut j) = (0, 0);
        while i < feasible.len() || j < extra.len() {
            if j >= extra.len() || (i < feasible.len() && feasible[i] < extra[j]) {
                out.push(feasible[i]);
                i += 1;
            } else {
                out.push(extra[j]);
                j += 1;
            }
        }
        Some(out)
    }

    /// Simulate one scenario. On success the state stays applied and the victims that matter
    /// (evicted or moved) are returned.
    fn try_scenario(
        &mut self,
        sess: &mut Session,
        job: usize,
        prefix: &[usize],
        victims: &[usize],
        nodes: Option<Vec<usize>>,
    ) -> Option<Vec<usize>> {
        let checkpoint = sess.statement().checkpoint();
        let mut order_jobs = vec![job];
        for &t in victims {
            add_job(&mut order_jobs, sess.tasks[t].job);
        }
        // the other pending jobs matter only where the wanted ones are in more than one queue;
        // they are taken as they are now, before the scenario changes the wanted ones
        let key = sess.jobs[job].queue_key;
        if order_jobs.iter().any(|&j| sess.jobs[j].queue_key != key) {
            PendingOrder::sync(sess);
        }
        for &task in victims {
            sess.statement().evict(task);
            sess.evict_info.insert(
                task,
                EvictInfo {
                    action: self.rules.action(),
                    preemptor: Some(job),
                    message: self.rules.message(),
                },
            );
        }
        let mut order = scenario_queue(sess, &order_jobs, prefix);
        sess.set_node_filter(nodes);
        // the other jobs with a pending task are skipped (they only shape the order); once
        // every wanted job is placed again nothing else can change (each pops once)
        let mut left = order_jobs.len();
        while left > 0 {
            let Some(next_job) = order.pop(sess) else { break };
            if !order_jobs.contains(&next_job) {
                continue;
            }
            left -= 1;
            if next_job == job {
                let pending: Vec<usize> = prefix
                    .iter()
                    .copied()
                    .filter(|&t| sess.tasks[t].status == PodStatus::Pending)
                    .collect();
                if !place_tasks(sess, job, &pending, true, false) {
                    sess.set_node_filter(None);
                    sess.statement().rollback(checkpoint);
                    return None;
                }
                continue;
            }
            let again = sess.tasks_to_allocate(next_job, true);
            if !again.is_empty() {
                place_tasks(sess, next_job, &again, true, false);
            }
        }
        sess.set_node_filter(None);
        let evicted: Vec<usize> = victims
            .iter()
            .copied()
            .filter(|&t| {
                sess.tasks[t].status == PodStatus::Releasing && sess.tasks[t].moved.is_none()
            })
            .collect();
        let moved: Vec<usize> =
            victims.iter().copied().filter(|&t| sess.tasks[t].moved.is_some()).collect();
        if !self.rules.validate(sess, &evicted, &moved) {
            sess.statement().rollback(checkpoint);
            return None;
        }
        let mut out = evicted;
        out.extend(moved);
        Some(out)
    }
}

/// KAI's idle and releasing GPU sums of node `n` (GetSumOfIdleGPUs, GetSumOfReleasingGPUs)
/// in 1/100 of a device (kai_ray/core/actions/solver.py `gpu_sums`).
pub fn gpu_sums_at(sess: &Session, n: usize) -> (i64, i64) {
    let mut idle = 100 * (sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n]);
    let mut releasing = 100 * sess.cluster.rel_gpu[n];
    for g in &sess.cluster.groups[n] {
        if g.used > 0 {
            idle += 100 - (g.used + 9) / 10;
        }
        if g.releasing > 0 && g.releasing != g.used + g.pipelined {
            releasing += (g.releasing + 9) / 10;
        }
    }
    (idle, releasing)
}

/// `jobs` in the order first seen, each once.
fn first_of_each(jobs: Vec<usize>) -> Vec<usize> {
    let mut seen: FxHashSet<usize> = FxHashSet::default();
    jobs.into_iter().filter(|&job| seen.insert(job)).collect()
}

/// The jobs with a potential victim on `node` (a node holds the pods of a few jobs: a short
/// list is cheaper than a set).
fn jobs_on(potential_at: &[(i32, usize)], node: i32) -> Vec<usize> {
    let mut jobs = Vec::new();
    for &(n, job) in potential_at {
        if n == node {
            add_job(&mut jobs, job);
        }
    }
    jobs
}

fn add_job(jobs: &mut Vec<usize>, job: usize) {
    if !jobs.contains(&job) {
        jobs.push(job);
    }
}

/// The groups holding one of `victims` (the pods a scenario evicted or moved): what KAI records
/// for the next prefix is each such group whole (its victim jobs are the clones made per
/// `AddPotentialVictimsTasks` call: by_pod_solver.go getVictimJobsFromVictimTasks), so a pod
/// of one put back where it was is evicted again by the next prefix's scenarios.
fn groups_hit<'a>(victims: &[usize], groups: impl Iterator<Item = &'a [usize]>) -> Vec<Vec<usize>> {
    let hit: FxHashSet<usize> = victims.iter().copied().collect();
    groups.filter(|g| g.iter().any(|t| hit.contains(t))).map(|g| g.to_vec()).collect()
}

enum Source {
    Stream(StreamRead),
    /// a copy of the scope's victim queue, popped here, and the recorded victims
    Popped(JobQueue, FxHashSet<usize>),
}

/// The victims in victim order, popped from a copy of the scope's queue: what each next unit
/// gives up (never a recorded victim again; what is left of its job goes back).
fn popped_next(
    sess: &mut Session,
    queue: &mut JobQueue,
    recorded: &FxHashSet<usize>,
) -> Option<(Takes, bool)> {
    while let Some(unit) = queue.pop(sess) {
        let job = sess.units[unit].job;
        let (taken, rest) = take_unrecorded(sess, unit, recorded);
        if let Some(rest) = rest {
            let rest = new_unit(sess, job, rest);
            queue.push(sess, rest);
        }
        if !taken.is_empty() {
            return Some((Takes::one(taken), false));
        }
    }
    None
}
