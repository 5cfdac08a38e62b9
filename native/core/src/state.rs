//! The mutable session (kai_ray/core/state.py): nodes, tasks, jobs, queue accounting and an
//! undo log. Every virtual decision (allocate, pipeline, evict) goes through `Session` and is
//! recorded, so a gang that does not fit is rolled back to a checkpoint without a trace.
//!
//! Where the Python keeps numpy arrays for passes over every node, this keeps plain vectors:
//! the shared-device rows are the node's groups themselves.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::model::{
    Constraints, GpuPacking, PodStatus, Request, SchedulerConfig, Snapshot, MIN_NODE_GPU_MEMORY_MIB,
};
use crate::queuetree::excluded_queues;
use crate::scratch::Scratch;

pub const GPU: usize = 2;
pub const MILLI: i64 = 1000;

/// A job's scheduling signature: its pods' priority and, per podset, the constraints of each
/// pod not active-allocated (see actions/solver.rs).
pub type Signature = (i64, Vec<Vec<usize>>);
pub type Amounts = [f64; 3];

/// One pod inside the session.
#[derive(Clone, Debug)]
pub struct Task {
    pub idx: usize,
    pub job: usize,
    pub name: String,
    pub namespace: String,
    pub req: Request,
    pub status: PodStatus,
    pub node: i32,
    pub groups: Vec<u32>,
    pub orig_status: PodStatus,
    /// the pod's devices in the snapshot (its outcome reports whether they changed)
    pub orig_groups: Vec<u32>,
    pub task_priority: Option<i64>,
    pub created: f64,
    pub is_head: bool,
    pub subgroup: String,
    pub constraints: usize,
    pub shape: i32,
    pub replica: Option<String>,
    pub gpu_mem_cost: i64,
    pub accepted_gpu: f64,
    /// a victim re-placed on another node: the releasing original keeps its footprint and a
    /// copy holds the new placement; the copy points back through `origin`
    pub moved: Option<usize>,
    pub origin: Option<usize>,
}

/// KAI's task order: ray head first, task-priority (higher first), older, name.
pub fn cmp_task(a: &Task, b: &Task) -> Ordering {
    let ka = (if a.is_head { 0 } else { 1 }, if a.task_priority.is_some() { 0 } else { 1 });
    let kb = (if b.is_head { 0 } else { 1 }, if b.task_priority.is_some() { 0 } else { 1 });
    ka.cmp(&kb)
        .then_with(|| (-a.task_priority.unwrap_or(0)).cmp(&-b.task_priority.unwrap_or(0)))
        .then_with(|| a.created.partial_cmp(&b.created).unwrap_or(Ordering::Equal))
        .then_with(|| a.name.cmp(&b.name))
}

#[derive(Clone, Debug)]
pub struct PodSet {
    pub name: String,
    pub min_member: i64,
    pub replica_size: i64,
    /// fewer members than this running: stale (see `Job::admitted_min_member`)
    pub stale_min: i64,
    pub tasks: Vec<usize>,
}

impl PodSet {
    fn new(name: String, min_member: i64, replica_size: i64, admitted: Option<i64>) -> Self {
        let stale_min = admitted.map_or(min_member, |a| min_member.min(a.max(0)));
        PodSet { name, min_member, replica_size, stale_min, tasks: Vec::new() }
    }
}

#[derive(Clone, Debug)]
pub struct JobState {
    pub name: String,
    pub namespace: String,
    pub queue: String,
    /// the queue's index, None when it does not exist (QueueDoesNotExist)
    pub queue_id: Option<usize>,
    /// the queue's index, or one past the queues per missing queue name (JobQueue's heaps)
    pub queue_key: usize,
    pub priority: i64,
    pub preemptible: bool,
    pub created: f64,
    pub stale_since: Option<f64>,
    pub last_start: Option<f64>,
    pub tasks: Vec<usize>,
    /// bumped on every change to one of the job's tasks (and its undo): derived values are
    /// cached until the job changes
    pub changes: u64,
    pub to_allocate: [Option<(u64, Vec<usize>)>; 2],
    pub requested: [Option<(u64, Amounts)>; 2],
    /// KAI's scheduling-constraints signature, fixed on first use (actions/solver.rs)
    pub signature: Option<Signature>,
    pub uses_subgroups: bool,
    /// in the PodGroup's order (the Python dict's)
    pub podsets: Vec<PodSet>,
}

impl JobState {
    pub fn podset(&self, name: &str) -> Option<usize> {
        self.podsets.iter().position(|ps| ps.name == name)
    }
}

#[derive(Clone, Debug)]
pub struct QueueState {
    pub name: String,
    /// as given ("" is kept, and is no parent: `parent_id` is None)
    pub parent: Option<String>,
    pub parent_id: Option<usize>,
    pub priority: i64,
    pub created: f64,
    pub deserved: Amounts,
    pub limit: Amounts,
    pub weight: Amounts,
    pub fair_share: Amounts,
    pub allocated: Amounts,
    pub allocated_np: Amounts,
    pub request: Amounts,
    pub children: Vec<usize>,
    pub preempt_min_runtime: Option<f64>,
    pub reclaim_min_runtime: Option<f64>,
}

impl QueueState {
    pub fn allocatable(&self, r: usize) -> f64 {
        if self.deserved[r] == -1.0 {
            return self.limit[r];
        }
        let mut value = py_max(self.deserved[r], self.fair_share[r]);
        if self.limit[r] != -1.0 {
            value = py_min(self.limit[r], value);
        }
        value
    }
}

/// Python's max(a, b) on floats: the first unless the second is greater.
pub fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// Python's min(a, b) on floats: the first unless the second is smaller.
pub fn py_min(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

/// Why a job's last attempt failed (becomes the PodGroup/pod condition).
#[derive(Clone, Debug)]
pub struct JobError {
    pub reason: String,
    pub message: String,
    pub fit: Option<Vec<(String, i64)>>,
}

/// How an eviction's message is worded, built only for the evictions that are kept.
#[derive(Clone, Debug)]
pub enum EvictMessage {
    Preempt,
    Reclaim,
    Consolidation,
    Text(String),
}

#[derive(Clone, Debug)]
pub struct EvictInfo {
    pub action: &'static str,
    pub preemptor: Option<usize>,
    pub message: EvictMessage,
}

/// A shared GPU device (KAI GPU group): usage in milli of the device (`used`: all active
/// sharers, releasing ones included).
#[derive(Clone, Debug)]
pub struct Group {
    pub gid: u32,
    /// the active sharers but pipelined ones (KAI's AllocatedSharedGPUsMemory)
    pub used: i64,
    /// the releasing sharers less the pipelined ones (KAI's ReleasingSharedGPUsMemory: may be
    /// negative); `MILLI - used + releasing` is the room, every sharer counted once
    pub releasing: i64,
    /// what the pipelined sharers take (`used + pipelined`: KAI's UsedSharedGPUsMemory)
    pub pipelined: i64,
    /// an unpipelined sharer opened the device, so KAI took it from the idle GPUs
    /// (gpu_sharing_node_info.go:120-127) and gives it back only once no sharer at all is
    /// left (:212-217): pipelined sharers alone then keep it out of idle; one a pipelined
    /// sharer opened is taken from releasing (:113-119)
    pub from_idle: bool,
    pub tasks: Vec<usize>,
}

#[derive(Clone, Debug)]
pub enum Undo {
    Alloc { task: usize, status: PodStatus, node: i32, groups: Vec<u32> },
    Evict { task: usize, prev: PodStatus },
    Status { task: usize, prev: PodStatus },
    Move { task: usize, copy: usize },
    Unevict { task: usize, prev: PodStatus },
}

impl Undo {
    pub fn task(&self) -> usize {
        match *self {
            Undo::Alloc { task, .. }
            | Undo::Evict { task, .. }
            | Undo::Status { task, .. }
            | Undo::Move { task, .. }
            | Undo::Unevict { task, .. } => task,
        }
    }
}

/// The previous placement of the binpack fast path (common.rs): the task, its node, whether
/// it fit on idle resources and its node's sharing bonus.
#[derive(Clone, Copy, Debug)]
pub struct Sticky {
    pub task: usize,
    pub node: i32,
    /// whether it scored for fitting on idle resources (`placement::shown_idle`)
    pub on_idle: bool,
    pub bonus: bool,
}

/// Nodes a constraint keeps a task on (None: all), and per untolerated taint the nodes it does
/// not keep the task off, with Kubernetes' wording.
#[derive(Clone, Debug)]
pub struct NodeMasks {
    pub selector: Option<Vec<bool>>,
    pub tolerated: Option<Vec<bool>>,
    pub per_taint: Vec<(Vec<bool>, String)>,
}

/// Nodes, in name order.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub name: String,
    pub labels: FxHashMap<String, String>,
    pub taints: Vec<crate::constraints::Taint>,
}

/// What of a victim job is still there to take (actions/victims.rs builds them): in the
/// session's arena (`Session::units`), never changed once built.
#[derive(Clone, Debug)]
pub struct VictimUnit {
    pub job: usize,
    pub tasks: Vec<usize>,
    /// the tasks per podset of the job (its podsets' order); a pod of no podset is in none
    pub by_set: Vec<Vec<usize>>,
    pub rank: i64,
    /// `order_number`, once asked (-1 before)
    pub number: i64,
}

/// Ranks of the parts of a job order key: by negated priority, the sorted creation times, how
/// many distinct creation times and jobs there are.
type OrderRanks = (FxHashMap<i64, i64>, Vec<f64>, i64, i64);

pub struct Session {
    pub config: SchedulerConfig,
    pub now: f64,
    pub nodes: Vec<NodeInfo>,
    pub node_index: FxHashMap<String, i32>,
    pub constraints: Vec<Constraints>,
    pub masks: Vec<Option<NodeMasks>>,
    pub any_taints: bool,
    pub schedulable: Vec<bool>,
    pub cap_cpu: Vec<i64>,
    pub cap_mem: Vec<i64>,
    pub cap_gpu: Vec<i64>,
    pub max_pods: Vec<i64>,
    pub gpu_mem: Vec<i64>,
    pub gpu_mem_synced: Vec<bool>,
    // usage as KAI's NodeInfo splits it (addTaskResources): "used" is what idle lacks (all
    // active pods, releasing ones included, but pipelined ones); "rel" is KAI's Releasing:
    // the releasing pods less the pipelined ones (may be negative)
    pub used_cpu: Vec<i64>,
    pub rel_cpu: Vec<i64>,
    pub used_mem: Vec<i64>,
    pub rel_mem: Vec<i64>,
    pub used_pods: Vec<i64>,
    pub whole_used: Vec<i64>,
    pub whole_rel: Vec<i64>,
    pub used_gpu: Vec<i64>,
    pub rel_gpu: Vec<i64>,
    pub groups: Vec<Vec<Group>>,
    pub gids: Vec<String>,
    pub gid_index: FxHashMap<String, u32>,
    // the GPU room index (see `index_gpu_room`)
    pub indexed: bool,
    pub gpu_free_at: Vec<i64>,
    pub dev_room_at: Vec<i64>,
    pub idle_at: Vec<i64>,
    pub counted: Vec<bool>,
    pub free_counts: BTreeMap<i64, i64>,
    pub idle_counts: BTreeMap<i64, i64>,
    pub by_free: BTreeMap<i64, Vec<i32>>,
    pub by_room: BTreeMap<i64, FxHashSet<i32>>,
    pub undo: Vec<Undo>,
    pub job_errors: FxHashMap<usize, JobError>,
    pub sticky: Option<(Sticky, usize)>,
    /// the only nodes placement may use while set, in node order (a victim scenario's):
    /// set with `set_node_filter`
    pub node_filter: Option<Vec<usize>>,
    pub evict_info: FxHashMap<usize, EvictInfo>,
    pub jobs: Vec<JobState>,
    pub job_index: FxHashMap<String, usize>,
    pub tasks: Vec<Task>,
    shapes: FxHashMap<(Request, usize), i32>,
    pub queues: Vec<QueueState>,
    pub queue_index: FxHashMap<String, usize>,
    /// the queues left out for a parent cycle (on one or under one) -> their jobs' message
    pub excluded_queues: FxHashMap<String, String>,
    /// leaf first, root last
    pub paths: Vec<Vec<usize>>,
    roots: Vec<usize>,
    pub pending_jobs: Vec<usize>,
    pub known_groups: FxHashSet<u32>,
    pub total: Amounts,
    widest: Option<i32>,
    name_rank: Option<FxHashMap<usize, i64>>,
    order_ranks: Option<OrderRanks>,
    /// by job, its victim unit as of its last change (actions/victims.rs), kept for the session
    pub victim_units: Vec<Option<(u64, Option<usize>)>>,
    pub units: Vec<VictimUnit>,
    /// bumped on every change to a node's usage (and its undo): the packing policies keep a
    /// node's score until it changes
    pub node_ver: Vec<u64>,
    /// device slots per node as the packing policies see them (`Session::slot_free`), kept by
    /// `refresh_gpu` under `lookahead` (its arrival weights follow each model's slots), and
    /// the nodes whose count changed, in turn
    pub dev_width: usize,
    pub dev_slots: Vec<i64>,
    pub slots_log: Vec<u32>,
    /// every node whose GPU counts were recounted (`refresh_gpu`), in turn, undo included:
    /// a reader that remembers how far it read looks again only at the nodes after that
    pub gpu_log: Vec<u32>,
    /// what other modules derive once per session, under their own types: the jobs with a
    /// pending task per leaf queue in job order (ordering.rs `PendingOrder`), the packing
    /// policies' typical shapes and scores (packing.rs `Memo`)
    pub scratch: Scratch,
}

fn add3(amounts: &mut Amounts, cpu: f64, memory: f64, gpu: f64) {
    // a zero is not added (x + 0.0 is x; the sums are never -0.0), as the Python does
    if cpu != 0.0 {
        amounts[0] += cpu;
    }
    if memory != 0.0 {
        amounts[1] += memory;
    }
    if gpu != 0.0 {
        amounts[2] += gpu;
    }
}

fn recount(counts: &mut BTreeMap<i64, i64>, old: i64, new: i64) {
    let left = counts.get(&old).copied().unwrap_or(0) - 1;
    if left == 0 {
        counts.remove(&old);
    } else {
        counts.insert(old, left);
    }
    *counts.entry(new).or_insert(0) += 1;
}

/// KAI's LessEqual over resources, where -1 is infinite.
pub fn leq(a: &[f64], b: &[f64]) -> bool {
    for i in 0..a.len() {
        let (x, y) = (a[i], b[i]);
        if x == -1.0 {
            if y != -1.0 {
                return false;
            }
            continue;
        }
        if y == -1.0 {
            continue;
        }
        if x > y + 1e-9 {
            return false;
        }
    }
    true
}

impl Session {
    /// A victim unit's place in the job order (its job's priority, rank and creation), kept
    /// on the unit once asked.
    pub fn unit_order_number(&mut self, unit: usize) -> i64 {
        if self.units[unit].number < 0 {
            let u = &self.units[unit];
            let (job, rank) = (u.job, u.rank);
            let (priority, created) = (self.jobs[job].priority, self.jobs[job].created);
            let number = self.order_number(-priority, rank, created, job);
            self.units[unit].number = number;
        }
        self.units[unit].number
    }

    /// What the victim order counts as gone from the queue with this unit: all its tasks a
    /// queue's allocation counts, not just those the next take evicts (KAI subtracts the
    /// popped or peeked job clone's `Allocated`: a pipelined pod counts nothing).
    pub fn victim_amount(&self, unit: usize) -> Amounts {
        let (mut cpu, mut mem) = (0i64, 0i64);
        let mut gpu = 0.0;
        for &t in &self.units[unit].tasks {
            let task = &self.tasks[t];
            if task.status.queue_allocated() {
                cpu += task.req.cpu_m;
                mem += task.req.memory;
                gpu += task.accepted_gpu;
            }
        }
        [cpu as f64, mem as f64, gpu]
    }

    /// Free milli-GPU of device slot `j` of node `n` as the packing policies see the session
    /// (packing_policy.node_state): the shared devices first, in their order, then the idle
    /// whole devices, then the busy ones (0); -1 past the node's devices.
    pub fn slot_free(&self, n: usize, j: usize) -> i64 {
        let groups = &self.groups[n];
        if j < groups.len() {
            return MILLI - groups[j].used;
        }
        let idle_whole = (self.cap_gpu[n] - self.used_gpu[n]).max(0);
        let j = j as i64;
        if j < groups.len() as i64 + idle_whole {
            MILLI
        } else if j < self.cap_gpu[n] {
            0
        } else {
            -1
        }
    }

    /// The node's device slots (`slot_free >= 0`): what the policies' model supply counts.
    pub fn slot_count(&self, n: usize) -> i64 {
        (0..self.dev_width).filter(|&j| self.slot_free(n, j) >= 0).count() as i64
    }

    pub fn new(snapshot: Snapshot, config: SchedulerConfig, now: f64) -> Session {
        let Snapshot { nodes: mut snap_nodes, queues: snap_queues, jobs: snap_jobs, constraints } =
            snapshot;
        snap_nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let count = snap_nodes.len();
        let mut node_index = FxHashMap::default();
        for (i, n) in snap_nodes.iter().enumerate() {
            node_index.insert(n.name.clone(), i as i32);
        }
        let schedulable: Vec<bool> =
            snap_nodes.iter().map(|n| n.ready && !n.unschedulable).collect();
        let cap_cpu = snap_nodes.iter().map(|n| n.cpu_m - n.foreign_cpu_m).collect();
        let cap_mem = snap_nodes.iter().map(|n| n.memory - n.foreign_memory).collect();
        let cap_gpu: Vec<i64> = snap_nodes.iter().map(|n| n.gpus - n.foreign_gpus).collect();
        let max_pods = snap_nodes.iter().map(|n| n.max_pods - n.foreign_pods).collect();
        let gpu_mem = snap_nodes.iter().map(|n| n.gpu_memory_mib.max(1)).collect();
        let gpu_mem_synced = snap_nodes.iter().map(|n| n.gpu_memory_synced).collect();
        let any_taints = snap_nodes.iter().any(|n| !n.taints.is_empty());
        let nodes: Vec<NodeInfo> = snap_nodes
            .into_iter()
            .map(|n| NodeInfo {
                name: n.name,
                labels: n.labels.into_iter().collect(),
                taints: n.taints,
            })
            .collect();
        let masks = vec![None; constraints.len()];
        let mut sess = Session {
            config,
            now,
            nodes,
            node_index,
            constraints,
            masks,
            any_taints,
            schedulable,
            cap_cpu,
            cap_mem,
            cap_gpu,
            max_pods,
            gpu_mem,
            gpu_mem_synced,
            used_cpu: vec![0; count],
            rel_cpu: vec![0; count],
            used_mem: vec![0; count],
            rel_mem: vec![0; count],
            used_pods: vec![0; count],
            whole_used: vec![0; count],
            whole_rel: vec![0; count],
            used_gpu: vec![0; count],
            rel_gpu: vec![0; count],
            groups: vec![Vec::new(); count],
            gids: Vec::new(),
            gid_index: FxHashMap::default(),
            indexed: false,
            gpu_free_at: vec![-1; count],
            dev_room_at: vec![-1; count],
            idle_at: vec![0; count],
            counted: vec![false; count],
            free_counts: BTreeMap::new(),
            idle_counts: BTreeMap::new(),
            by_free: BTreeMap::new(),
            by_room: BTreeMap::new(),
            undo: Vec::new(),
            job_errors: FxHashMap::default(),
            sticky: None,
            node_filter: None,
            evict_info: FxHashMap::default(),
            jobs: Vec::with_capacity(snap_jobs.len()),
            job_index: FxHashMap::with_capacity_and_hasher(snap_jobs.len(), Default::default()),
            // with room for the moved copies the cycle adds (growing would copy every task)
            tasks: Vec::with_capacity({
                let pods: usize = snap_jobs.iter().map(|j| j.pods.len()).sum();
                pods + pods / 8 + 64
            }),
            shapes: FxHashMap::default(),
            queues: Vec::new(),
            queue_index: FxHashMap::default(),
            excluded_queues: FxHashMap::default(),
            paths: Vec::new(),
            roots: Vec::new(),
            pending_jobs: Vec::new(),
            known_groups: FxHashSet::default(),
            total: [0.0; 3],
            widest: None,
            name_rank: None,
            order_ranks: None,
            victim_units: Vec::new(),
            units: Vec::new(),
            node_ver: vec![0; count],
            dev_width: 1,
            dev_slots: vec![0; count],
            slots_log: Vec::new(),
            gpu_log: Vec::new(),
            scratch: Scratch::default(),
        };
        sess.dev_width = sess.cap_gpu.iter().copied().max().unwrap_or(1).max(1) as usize;
        for n in 0..count {
            sess.dev_slots[n] = sess.slot_count(n);
        }
        sess.build_queues(snap_queues);
        // one pass over the pods builds the tasks and loads what they use
        let mut load = Load::default();
        let mut missing: FxHashMap<String, usize> = FxHashMap::default();
        for job in snap_jobs {
            let jid = sess.jobs.len();
            let uses_subgroups = !job.subgroups.is_empty();
            let podsets = if uses_subgroups {
                // as the Python dict: a later subgroup of a name replaces the earlier one there
                let mut podsets: Vec<PodSet> = Vec::new();
                for sg in &job.subgroups {
                    // a subgroup's minimum may be 0 (all elastic); the job's own is at least 1
                    let podset = PodSet::new(
                        sg.name.clone(),
                        sg.min_member.max(0),
                        sg.replica_size.max(1),
                        sg.admitted_min_member,
                    );
                    match podsets.iter().position(|ps| ps.name == sg.name) {
                        Some(at) => podsets[at] = podset,
                        None => podsets.push(podset),
                    }
                }
                podsets
            } else {
                vec![PodSet::new(
                    "default".to_string(),
                    job.min_member.max(1),
                    1,
                    job.admitted_min_member,
                )]
            };
            let queue_id = sess.queue_index.get(&job.queue).copied();
            let queue_key = match queue_id {
                Some(q) => q,
                None => {
                    let next = sess.queues.len() + missing.len();
                    *missing.entry(job.queue.clone()).or_insert(next)
                }
            };
            sess.job_index.insert(job.name.clone(), jid);
            sess.jobs.push(JobState {
                name: job.name,
                namespace: job.namespace,
                queue: job.queue,
                queue_id,
                queue_key,
                priority: job.priority,
                preemptible: job.preemptible,
                created: job.created,
                stale_since: job.stale_since,
                last_start: job.last_start,
                tasks: Vec::new(),
                changes: 0,
                to_allocate: [None, None],
                requested: [None, None],
                signature: None,
                uses_subgroups,
                podsets,
            });
            for pod in job.pods {
                let node = match &pod.node {
                    Some(name) if !name.is_empty() => {
                        sess.node_index.get(name).copied().unwrap_or(-1)
                    }
                    _ => -1,
                };
                let groups: Vec<u32> = pod.gpu_groups.iter().map(|g| sess.intern_gid(g)).collect();
                let idx = sess.tasks.len();
                let subgroup = match pod.subgroup {
                    Some(s) if !s.is_empty() => s,
                    _ => "default".to_string(),
                };
                sess.tasks.push(Task {
                    idx,
                    job: jid,
                    name: pod.name,
                    namespace: pod.namespace,
                    req: pod.request,
                    status: pod.status,
                    node,
                    groups: groups.clone(),
                    orig_status: pod.status,
                    orig_groups: groups,
                    task_priority: pod.task_priority,
                    created: pod.created,
                    is_head: pod.is_ray_head,
                    subgroup,
                    constraints: pod.constraints,
                    shape: -1,
                    replica: pod.replica,
                    gpu_mem_cost: 0,
                    accepted_gpu: 0.0,
                    moved: None,
                    origin: None,
                });
                sess.jobs[jid].tasks.push(idx);
                sess.load_task(idx, &mut load);
                let js = &mut sess.jobs[jid];
                let at = match js.podset(&sess.tasks[idx].subgroup) {
                    Some(p) => Some(p),
                    // KAI drops a pod whose subgroup is not a leaf of its PodGroup
                    None if js.uses_subgroups => None,
                    None => js.podset("default"),
                };
                if let Some(p) = at {
                    js.podsets[p].tasks.push(idx);
                }
            }
        }
        // no task becomes pending during a cycle (only a rollback restores one), so the jobs
        // with a pending task at any time are among these
        sess.pending_jobs = (0..sess.jobs.len()).filter(|j| load.pending.contains(j)).collect();
        sess.known_groups = std::mem::take(&mut load.groups);
        sess.victim_units = vec![None; sess.jobs.len()];
        sess.finish_load(load);
        sess
    }

    pub fn intern_gid(&mut self, gid: &str) -> u32 {
        if let Some(&id) = self.gid_index.get(gid) {
            return id;
        }
        let id = self.gids.len() as u32;
        self.gids.push(gid.to_string());
        self.gid_index.insert(gid.to_string(), id);
        id
    }

    fn build_queues(&mut self, snap_queues: Vec<crate::model::Queue>) {
        // as the Python dict has them: a later queue of a name replaces the earlier one, at its
        // place; then the queues on a parent cycle, then orphans (parent missing), are removed
        // with all their descendants
        let mut order: Vec<crate::model::Queue> = Vec::new();
        let mut at: FxHashMap<String, usize> = FxHashMap::default();
        for q in snap_queues {
            if let Some(&i) = at.get(&q.name) {
                order[i] = q;
            } else {
                at.insert(q.name.clone(), order.len());
                order.push(q);
            }
        }
        let links: Vec<(&str, &str)> =
            order.iter().map(|q| (q.name.as_str(), q.parent.as_deref().unwrap_or(""))).collect();
        self.excluded_queues = excluded_queues(&links);
        order.retain(|q| !self.excluded_queues.contains_key(&q.name));
        loop {
            let names: FxHashSet<String> = order.iter().map(|q| q.name.clone()).collect();
            let before = order.len();
            order.retain(|q| match &q.parent {
                Some(p) if !p.is_empty() => names.contains(p),
                _ => true,
            });
            if order.len() == before {
                break;
            }
        }
        for q in order {
            let mem_q =
                if q.memory.quota != -1.0 { py_max(-1.0, q.memory.quota * 1e6) } else { -1.0 };
            let mem_l =
                if q.memory.limit != -1.0 { py_max(-1.0, q.memory.limit * 1e6) } else { -1.0 };
            self.queue_index.insert(q.name.clone(), self.queues.len());
            self.queues.push(QueueState {
                name: q.name,
                parent: q.parent,
                parent_id: None,
                priority: q.priority,
                created: q.created,
                deserved: [q.cpu.quota, mem_q, q.gpu.quota],
                limit: [q.cpu.limit, mem_l, q.gpu.limit],
                weight: [q.cpu.weight, q.memory.weight, q.gpu.weight],
                fair_share: [0.0; 3],
                allocated: [0.0; 3],
                allocated_np: [0.0; 3],
                request: [0.0; 3],
                children: Vec::new(),
                preempt_min_runtime: q.preempt_min_runtime_s,
                reclaim_min_runtime: q.reclaim_min_runtime_s,
            });
        }
        for i in 0..self.queues.len() {
            // an empty parent is none: the queue is a root (reported with its "" though)
            if let Some(parent) = self.queues[i].parent.clone().filter(|p| !p.is_empty()) {
                let p = self.queue_index[&parent];
                self.queues[i].parent_id = Some(p);
                self.queues[p].children.push(i);
            }
        }
        for i in 0..self.queues.len() {
            let mut children = std::mem::take(&mut self.queues[i].children);
            children.sort_by(|&a, &b| {
                let (qa, qb) = (&self.queues[a], &self.queues[b]);
                qa.created
                    .partial_cmp(&qb.created)
                    .unwrap_or(Ordering::Equal)
                    .then_with(|| qa.name.cmp(&qb.name))
            });
            self.queues[i].children = children;
        }
        let n = self.queues.len();
        self.paths = (0..n)
            .map(|i| {
                let mut walk = vec![i];
                let mut q = self.queues[i].parent_id;
                // ends: the queues on parent cycles were removed above
                while let Some(p) = q {
                    walk.push(p);
                    q = self.queues[p].parent_id;
                }
                walk
            })
            .collect();
        let mut roots: Vec<usize> =
            (0..n).filter(|&i| self.queues[i].parent_id.is_none()).collect();
        roots.sort_by(|&a, &b| self.queues[a].name.cmp(&self.queues[b].name));
        self.roots = roots;
    }

    // ------------------------------------------------------------------ setup helpers
    /// A number per request and constraints: equal numbers, the same request on the same nodes.
    pub fn shape_of(&mut self, task: usize) -> i32 {
        let t = &self.tasks[task];
        if t.shape < 0 {
            let key = (t.req, t.constraints);
            let next = self.shapes.len() as i32;
            let shape = *self.shapes.entry(key).or_insert(next);
            self.tasks[task].shape = shape;
        }
        self.tasks[task].shape
    }

    pub fn is_leaf(&self, queue: Option<usize>) -> bool {
        queue.is_some_and(|q| self.queues[q].children.is_empty())
    }

    /// The node whose GPUs have the most memory (the first of them), 0 when none.
    pub fn widest_gpu_node(&mut self) -> i32 {
        if self.widest.is_none() {
            let mut best = 0usize;
            for i in 0..self.gpu_mem.len() {
                if self.gpu_mem[i] > self.gpu_mem[best] {
                    best = i;
                }
            }
            self.widest = Some(best as i32);
        }
        self.widest.unwrap_or(0)
    }

    fn name_rank(&mut self, job: usize) -> i64 {
        if self.name_rank.is_none() {
            let mut order: Vec<usize> = (0..self.jobs.len()).collect();
            order.sort_by(|&a, &b| self.jobs[a].name.cmp(&self.jobs[b].name));
            // duplicate names: the dict holds the last job of a name, which all share
            let mut ranks = FxHashMap::default();
            let mut rank = -1i64;
            let mut last: Option<&str> = None;
            for &j in &order {
                if last != Some(self.jobs[j].name.as_str()) {
                    rank += 1;
                    last = Some(self.jobs[j].name.as_str());
                }
                ranks.insert(j, rank);
            }
            self.name_rank = Some(ranks);
        }
        self.name_rank.as_ref().map_or(0, |r| r[&job])
    }

    /// A job order key (-priority, elastic rank 0..2, created, job) as one number in the same
    /// order: each part by its rank among the session's jobs.
    pub fn order_number(&mut self, neg_priority: i64, rank: i64, created: f64, job: usize) -> i64 {
        if self.order_ranks.is_none() {
            let mut prios: Vec<i64> = self.jobs.iter().map(|j| -j.priority).collect();
            prios.sort();
            prios.dedup();
            let by_priority: FxHashMap<i64, i64> =
                prios.iter().enumerate().map(|(i, &p)| (p, i as i64)).collect();
            let mut created: Vec<f64> = self.jobs.iter().map(|j| j.created).collect();
            created.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
            created.dedup_by(|a, b| a == b);
            let n_created = created.len() as i64;
            let n_jobs = self.job_index.len() as i64;
            self.order_ranks = Some((by_priority, created, n_created, n_jobs));
        }
        let name_rank = self.name_rank(job);
        let (by_priority, by_created, n_created, n_jobs) =
            self.order_ranks.as_ref().expect("order ranks");
        let c = by_created
            .binary_search_by(|v| v.partial_cmp(&created).unwrap_or(Ordering::Equal))
            .unwrap_or(0) as i64;
        ((by_priority[&neg_priority] * 3 + rank) * n_created + c) * n_jobs + name_rank
    }

    pub fn root_queues(&self) -> &[usize] {
        &self.roots
    }

    /// Leaf first, root last; empty for a queue that does not exist.
    pub fn queue_path(&self, queue: Option<usize>) -> &[usize] {
        match queue {
            Some(q) => &self.paths[q],
            None => &[],
        }
    }

    fn load_task(&mut self, idx: usize, load: &mut Load) {
        let (node, req, status, job) = {
            let t = &self.tasks[idx];
            (t.node, t.req, t.status, t.job)
        };
        for &g in &self.tasks[idx].groups {
            load.groups.insert(g);
        }
        if status == PodStatus::Pending {
            load.pending.insert(job);
        }
        if node >= 0 && status.active_used() {
            let n = node as usize;
            self.used_cpu[n] += req.cpu_m;
            self.used_mem[n] += req.memory;
            self.used_pods[n] += 1;
            if req.wants_gpu() {
                let groups = self.tasks[idx].groups.clone();
                self.hold_gpus(idx, node, groups, status == PodStatus::Pipelined);
                match load.gpu_nodes.get_mut(&node) {
                    Some(shared) => *shared = *shared || req.gpus == 0,
                    None => {
                        load.gpu_nodes.insert(node, req.gpus == 0);
                        load.gpu_order.push(node);
                    }
                }
            }
            if status == PodStatus::Releasing {
                load.releasing.push(idx);
            } else if status == PodStatus::Pipelined {
                load.pipelined.push(idx);
            }
        }
        let Some(q) = self.jobs[job].queue_id else { return };
        let np_job = !self.jobs[job].preemptible;
        if status.queue_allocated() {
            let [cpu, memory, gpu] = self.task_queue_amount(idx);
            for &p in &self.paths[q] {
                let qs = &mut self.queues[p];
                add3(&mut qs.allocated, cpu, memory, gpu);
                add3(&mut qs.request, cpu, memory, gpu);
                if np_job {
                    add3(&mut qs.allocated_np, cpu, memory, gpu);
                }
            }
        } else if status == PodStatus::Pending {
            let [cpu, memory, gpu] = pending_queue_amount(&req);
            for &p in &self.paths[q] {
                add3(&mut self.queues[p].request, cpu, memory, gpu);
            }
        }
    }

    fn finish_load(&mut self, load: Load) {
        for &node in &load.gpu_order {
            let devices = load.gpu_nodes[&node];
            self.refresh_gpu(node, devices);
        }
        for &t in &load.releasing {
            self.mark_releasing(t, 1);
        }
        for &t in &load.pipelined {
            self.pipeline_charge(t, 1, true);
        }
        self.index_gpu_room();
        let mut total = [0i64; 3];
        for n in 0..self.nodes.len() {
            if self.schedulable[n] {
                total[0] += self.cap_cpu[n];
                total[1] += self.cap_mem[n];
                total[2] += self.cap_gpu[n];
            }
        }
        self.total = [total[0] as f64, total[1] as f64, total[2] as f64];
    }

    // ------------------------------------------------------------------ amounts
    /// Milli of one device a shared request takes on this node.
    pub fn device_cost(&self, req: &Request, node: i32) -> i64 {
        if req.gpu_fraction_milli != 0 {
            return req.gpu_fraction_milli;
        }
        ((req.gpu_memory_mib * MILLI) as f64 / self.gpu_mem[node as usize] as f64).ceil() as i64
    }

    /// GPU portion recorded for a shared pod on this node (gpu-memory rounds up to 1/100).
    pub fn portion(&self, req: &Request, node: i32) -> f64 {
        if req.gpu_fraction_milli != 0 {
            return req.gpu_fraction_milli as f64 / MILLI as f64;
        }
        (req.gpu_memory_mib as f64 / self.gpu_mem[node as usize] as f64 * 100.0).ceil() / 100.0
    }

    pub fn task_queue_amount(&self, task: usize) -> Amounts {
        let t = &self.tasks[task];
        let req = &t.req;
        let gpu = if req.gpus != 0 {
            req.gpus as f64
        } else if req.is_shared() && t.node >= 0 {
            self.portion(req, t.node) * req.fraction_devices as f64
        } else {
            0.0
        };
        [req.cpu_m as f64, req.memory as f64, gpu]
    }

    // ------------------------------------------------------------------ node bookkeeping
    /// Per node, kept up to date by `refresh_gpu`: whole GPUs free (idle or releasing; -1 on a
    /// node that is not schedulable), the most room a live shared device has (-1: none), and
    /// how many schedulable GPU nodes have each free amount (binpack normalises over them).
    fn index_gpu_room(&mut self) {
        let count = self.nodes.len();
        for n in 0..count {
            if !self.schedulable[n] {
                self.gpu_free_at[n] = -1;
                self.dev_room_at[n] = -1;
                continue;
            }
            self.gpu_free_at[n] = self.cap_gpu[n] - self.used_gpu[n] + self.rel_gpu[n];
            self.dev_room_at[n] = device_room(&self.groups[n]);
        }
        for n in 0..count {
            let gpu_node = self.schedulable[n] && self.cap_gpu[n] > 0;
            self.counted[n] = gpu_node;
            let idle = self.cap_gpu[n] - self.used_gpu[n];
            self.idle_at[n] = idle;
            if !gpu_node {
                continue;
            }
            let value = self.gpu_free_at[n];
            *self.free_counts.entry(value).or_insert(0) += 1;
            if value > 0 {
                self.by_free.entry(value).or_default().push(n as i32);
            }
            *self.idle_counts.entry(idle).or_insert(0) += 1;
        }
        for n in 0..count {
            let most = self.dev_room_at[n];
            if most > 0 {
                self.by_room.entry(most).or_default().insert(n as i32);
            }
        }
        self.indexed = true;
    }

    fn reindex_gpu_room(&mut self, node: i32, devices: bool) {
        let n = node as usize;
        if !self.schedulable[n] {
            return;
        }
        let idle = self.cap_gpu[n] - self.used_gpu[n];
        let free = idle + self.rel_gpu[n];
        let old = self.gpu_free_at[n];
        if free != old {
            if self.counted[n] {
                recount(&mut self.free_counts, old, free);
                if old > 0 {
                    if let Some(bucket) = self.by_free.get_mut(&old) {
                        if let Ok(at) = bucket.binary_search(&node) {
                            bucket.remove(at);
                        }
                        if bucket.is_empty() {
                            self.by_free.remove(&old);
                        }
                    }
                }
                if free > 0 {
                    let joined = self.by_free.entry(free).or_default();
                    if let Err(at) = joined.binary_search(&node) {
                        joined.insert(at, node);
                    }
                }
            }
            self.gpu_free_at[n] = free;
        }
        if idle != self.idle_at[n] {
            if self.counted[n] {
                recount(&mut self.idle_counts, self.idle_at[n], idle);
            }
            self.idle_at[n] = idle;
        }
        if !devices {
            return;
        }
        let room = device_room(&self.groups[n]);
        let old_room = self.dev_room_at[n];
        if room != old_room {
            if old_room > 0 {
                if let Some(nodes) = self.by_room.get_mut(&old_room) {
                    nodes.remove(&node);
                    if nodes.is_empty() {
                        self.by_room.remove(&old_room);
                    }
                }
            }
            if room > 0 {
                self.by_room.entry(room).or_default().insert(node);
            }
            self.dev_room_at[n] = room;
        }
    }

    /// Recount the node's GPUs (`devices` false: its shared devices did not change).
    fn refresh_gpu(&mut self, node: i32, devices: bool) {
        let n = node as usize;
        // a device some unpipelined sharer holds is not idle; one all of whose sharers are
        // releasing is releasing; one only pipelined sharers hold is taken from releasing (KAI:
        // a sharer pipelined onto an empty or all-releasing device takes a releasing GPU),
        // unless an unpipelined sharer opened it (a job allocate pipelines whole once one of
        // its pods is: Group::from_idle)
        let (mut used, mut rel) = (self.whole_used[n], self.whole_rel[n]);
        for g in &self.groups[n] {
            if g.used > 0 || g.from_idle {
                used += 1;
                if g.used == g.releasing {
                    rel += 1;
                }
            } else {
                rel -= 1;
            }
        }
        self.used_gpu[n] = used;
        self.rel_gpu[n] = rel;
        self.node_ver[n] += 1;
        self.gpu_log.push(n as u32);
        if self.config.gpu_packing == GpuPacking::Lookahead {
            let slots = self.slot_count(n);
            if slots != self.dev_slots[n] {
                self.dev_slots[n] = slots;
                self.slots_log.push(n as u32);
            }
        }
        if self.indexed {
            self.reindex_gpu_room(node, devices);
        }
    }

    fn place_resources(&mut self, task: usize, node: i32, groups: Vec<u32>, pipelined: bool) {
        let req = self.tasks[task].req;
        self.add_usage(node, req.cpu_m, req.memory, 1);
        self.hold_gpus(task, node, groups, pipelined);
        if pipelined {
            self.pipeline_charge(task, 1, false);
        }
        if req.wants_gpu() {
            self.refresh_gpu(node, req.gpus == 0);
        }
    }

    /// The task on `node`: its whole GPUs or its share of devices `groups`, and what it is
    /// charged (the node's GPU counts are left to `refresh_gpu`).
    fn hold_gpus(&mut self, task: usize, node: i32, groups: Vec<u32>, pipelined: bool) {
        let req = self.tasks[task].req;
        let n = node as usize;
        self.node_ver[n] += 1;
        if req.gpus != 0 {
            self.whole_used[n] += req.gpus;
        } else if req.is_shared() {
            let cost = self.device_cost(&req, node);
            self.tasks[task].gpu_mem_cost = cost;
            for &gid in &groups {
                let devices = &mut self.groups[n];
                let at = match devices.iter().position(|g| g.gid == gid) {
                    Some(at) => at,
                    None => {
                        devices.push(Group {
                            gid,
                            used: 0,
                            releasing: 0,
                            pipelined: 0,
                            from_idle: !pipelined,
                            tasks: Vec::new(),
                        });
                        devices.len() - 1
                    }
                };
                let g = &mut devices[at];
                g.used += cost;
                if !g.tasks.contains(&task) {
                    g.tasks.push(task);
                }
            }
        }
        self.tasks[task].node = node;
        self.tasks[task].groups = groups;
        self.tasks[task].accepted_gpu = self.task_queue_amount(task)[GPU];
    }

    fn remove_resources(&mut self, task: usize) {
        if self.tasks[task].status == PodStatus::Pipelined {
            self.pipeline_charge(task, -1, false);
        }
        let (node, req) = (self.tasks[task].node, self.tasks[task].req);
        let n = node as usize;
        if node >= 0 {
            self.node_ver[n] += 1;
        }
        self.add_usage(node, -req.cpu_m, -req.memory, -1);
        if req.gpus != 0 {
            self.whole_used[n] -= req.gpus;
        } else if req.is_shared() {
            let cost = self.tasks[task].gpu_mem_cost;
            let gids = self.tasks[task].groups.clone();
            for gid in gids {
                let devices = &mut self.groups[n];
                if let Some(at) = devices.iter().position(|g| g.gid == gid) {
                    let g = &mut devices[at];
                    g.used -= cost;
                    g.tasks.retain(|&t| t != task);
                    if g.tasks.is_empty() {
                        devices.remove(at);
                    }
                }
            }
        }
        if req.wants_gpu() {
            self.refresh_gpu(node, req.gpus == 0);
        }
        self.tasks[task].node = -1;
        self.tasks[task].groups = Vec::new();
    }

    fn add_usage(&mut self, node: i32, cpu: i64, memory: i64, pods: i64) {
        if node < 0 {
            return;
        }
        let n = node as usize;
        self.node_ver[n] += 1;
        self.used_cpu[n] += cpu;
        self.used_mem[n] += memory;
        self.used_pods[n] += pods;
    }

    fn mark_releasing(&mut self, task: usize, sign: i64) {
        let (node, req) = (self.tasks[task].node, self.tasks[task].req);
        if node < 0 {
            return; // a pod on a node the snapshot does not have: nothing of ours to release
        }
        let n = node as usize;
        self.node_ver[n] += 1;
        self.rel_cpu[n] += sign * req.cpu_m;
        self.rel_mem[n] += sign * req.memory;
        if req.gpus != 0 {
            self.whole_rel[n] += sign * req.gpus;
        } else if req.is_shared() {
            let cost = self.tasks[task].gpu_mem_cost;
            for i in 0..self.tasks[task].groups.len() {
                let gid = self.tasks[task].groups[i];
                if let Some(g) = self.groups[n].iter_mut().find(|g| g.gid == gid) {
                    g.releasing += sign * cost;
                }
            }
        }
        if req.wants_gpu() {
            self.refresh_gpu(node, req.gpus == 0);
        }
    }

    /// A placed task becomes pipelined (sign 1) or stops being so (-1). KAI charges a Pipelined
    /// pod to the node's releasing resources and leaves its idle ones alone
    /// (NodeInfo.addTaskResources): its amounts leave `used` and `rel` both, so the room with
    /// releasing stays.
    fn pipeline_charge(&mut self, task: usize, sign: i64, refresh: bool) {
        let (node, req) = (self.tasks[task].node, self.tasks[task].req);
        if node < 0 {
            return;
        }
        let n = node as usize;
        self.node_ver[n] += 1;
        self.used_cpu[n] -= sign * req.cpu_m;
        self.used_mem[n] -= sign * req.memory;
        self.rel_cpu[n] -= sign * req.cpu_m;
        self.rel_mem[n] -= sign * req.memory;
        if req.gpus != 0 {
            self.whole_used[n] -= sign * req.gpus;
            self.whole_rel[n] -= sign * req.gpus;
        } else if req.is_shared() {
            let cost = sign * self.tasks[task].gpu_mem_cost;
            for i in 0..self.tasks[task].groups.len() {
                let gid = self.tasks[task].groups[i];
                if let Some(g) = self.groups[n].iter_mut().find(|g| g.gid == gid) {
                    g.used -= cost;
                    g.releasing -= cost;
                    g.pipelined += cost;
                    if g.tasks.len() == 1 {
                        // KAI moves a pod between Allocated and Pipelined by removing and
                        // adding it: its device alone, it empties and the pod opens it again
                        g.from_idle = sign < 0;
                    }
                }
            }
        }
        if refresh && req.wants_gpu() {
            self.refresh_gpu(node, req.gpus == 0);
        }
    }

    /// The node charge of a placed task whose status goes from `old` to `new`.
    fn set_charge(&mut self, task: usize, old: PodStatus, new: PodStatus) {
        if old == PodStatus::Pipelined && new != PodStatus::Pipelined {
            self.pipeline_charge(task, -1, true);
        } else if new == PodStatus::Pipelined && old != PodStatus::Pipelined {
            self.pipeline_charge(task, 1, true);
        }
    }

    fn queue_add(&mut self, task: usize, sign: f64) {
        let job = self.tasks[task].job;
        let Some(q) = self.jobs[job].queue_id else { return };
        let [mut cpu, mut memory, mut gpu] = self.task_queue_amount(task);
        if sign < 0.0 {
            cpu = -cpu;
            memory = -memory;
            gpu = -gpu;
        }
        let np_job = !self.jobs[job].preemptible;
        for i in 0..self.paths[q].len() {
            let p = self.paths[q][i];
            let qs = &mut self.queues[p];
            add3(&mut qs.allocated, cpu, memory, gpu);
            if np_job {
                add3(&mut qs.allocated_np, cpu, memory, gpu);
            }
        }
    }

    /// A shared-device id that no pod in the snapshot and no device on the node uses: the first
    /// free number on the node, so it depends on the state alone. `besides`: ids already
    /// picked for the same pod.
    pub fn new_group_id(&mut self, node: i32, besides: &[u32]) -> u32 {
        let mut k = 0;
        loop {
            k += 1;
            let gid = format!("{}-gpu-{}", self.nodes[node as usize].name, k);
            let known = self.gid_index.get(&gid).copied();
            if let Some(id) = known {
                if self.known_groups.contains(&id)
                    || self.groups[node as usize].iter().any(|g| g.gid == id)
                    || besides.contains(&id)
                {
                    continue;
                }
                return id;
            }
            return self.intern_gid(&gid);
        }
    }

    // ------------------------------------------------------------------ virtual decisions
    pub fn checkpoint(&self) -> usize {
        self.undo.len()
    }

    fn bump(&mut self, task: usize) {
        let job = self.tasks[task].job;
        self.jobs[job].changes += 1;
    }

    /// Place a pending (or virtually evicted) task.
    pub fn allocate(&mut self, task: usize, node: i32, groups: Vec<u32>, pipelined: bool) {
        let t = &self.tasks[task];
        if t.status == PodStatus::Releasing && t.node == node && t.groups == groups {
            // a victim that goes back where it was is simply not evicted
            self.unevict(task);
            return;
        }
        if t.status == PodStatus::Releasing {
            self.move_task(task, node, groups);
            return;
        }
        let (status, prev_node, prev_groups) = (t.status, t.node, t.groups.clone());
        self.place_resources(task, node, groups, pipelined);
        self.tasks[task].status =
            if pipelined { PodStatus::Pipelined } else { PodStatus::Allocated };
        self.queue_add(task, 1.0);
        self.undo.push(Undo::Alloc { task, status, node: prev_node, groups: prev_groups });
        self.bump(task);
    }

    fn move_task(&mut self, task: usize, node: i32, groups: Vec<u32>) {
        let t = &self.tasks[task];
        let copy_idx = self.tasks.len();
        let copy = Task {
            idx: copy_idx,
            job: t.job,
            name: t.name.clone(),
            namespace: t.namespace.clone(),
            req: t.req,
            status: PodStatus::Pending,
            node: -1,
            groups: Vec::new(),
            orig_status: PodStatus::Pending,
            orig_groups: Vec::new(),
            task_priority: t.task_priority,
            created: t.created,
            is_head: t.is_head,
            subgroup: t.subgroup.clone(),
            constraints: t.constraints,
            shape: t.shape,
            replica: t.replica.clone(),
            gpu_mem_cost: 0,
            accepted_gpu: 0.0,
            moved: None,
            origin: Some(task),
        };
        let job = t.job;
        let subgroup = t.subgroup.clone();
        self.tasks.push(copy);
        self.jobs[job].tasks.push(copy_idx);
        let js = &mut self.jobs[job];
        if let Some(p) = js.podset(&subgroup).or_else(|| js.podset("default")) {
            js.podsets[p].tasks.push(copy_idx);
        }
        self.tasks[task].moved = Some(copy_idx);
        self.place_resources(copy_idx, node, groups, true);
        self.tasks[copy_idx].status = PodStatus::Pipelined;
        self.queue_add(copy_idx, 1.0);
        self.undo.push(Undo::Move { task, copy: copy_idx });
        self.bump(task);
    }

    /// Switch between Allocated and Pipelined (same resources, same queue charge; the node
    /// charge moves between idle and releasing, `pipeline_charge`).
    pub fn set_status(&mut self, task: usize, status: PodStatus) {
        let prev = self.tasks[task].status;
        self.undo.push(Undo::Status { task, prev });
        self.set_charge(task, prev, status);
        self.tasks[task].status = status;
        self.bump(task);
    }

    pub fn evict(&mut self, task: usize) {
        let prev = self.tasks[task].status;
        self.queue_add(task, -1.0);
        self.set_charge(task, prev, PodStatus::Releasing);
        self.tasks[task].status = PodStatus::Releasing;
        self.mark_releasing(task, 1);
        self.undo.push(Undo::Evict { task, prev });
        self.bump(task);
    }

    pub fn unevict(&mut self, task: usize) {
        let prev = self
            .undo
            .iter()
            .rev()
            .find_map(|e| match *e {
                Undo::Evict { task: t, prev } if t == task => Some(prev),
                _ => None,
            })
            .expect("unevict: the task was evicted in this session");
        self.mark_releasing(task, -1);
        self.set_charge(task, PodStatus::Releasing, prev);
        self.tasks[task].status = prev;
        self.queue_add(task, 1.0);
        self.undo.push(Undo::Unevict { task, prev });
        self.bump(task);
    }

    /// Restrict placement to `nodes` (None: every node). The binpack carry-over is dropped:
    /// a choice among other nodes (binpack normalises over them) is no guide for this one,
    /// even where the undo log has the same length.
    pub fn set_node_filter(&mut self, nodes: Option<Vec<usize>>) {
        self.sticky = None;
        self.node_filter = nodes;
    }

    pub fn rollback(&mut self, checkpoint: usize) {
        if let Some((_, at)) = self.sticky {
            if at > checkpoint {
                // what came after that placement is undone
                self.sticky = None;
            }
        }
        while self.undo.len() > checkpoint {
            let entry = self.undo.pop().expect("undo entry");
            let task = entry.task();
            self.bump(task);
            match entry {
                Undo::Alloc { status, node, groups, .. } => {
                    self.queue_add(task, -1.0);
                    self.remove_resources(task);
                    let t = &mut self.tasks[task];
                    t.status = status;
                    t.node = node;
                    t.groups = groups;
                }
                Undo::Evict { prev, .. } => {
                    self.mark_releasing(task, -1);
                    self.set_charge(task, PodStatus::Releasing, prev);
                    self.tasks[task].status = prev;
                    self.queue_add(task, 1.0);
                }
                Undo::Status { prev, .. } => {
                    self.set_charge(task, self.tasks[task].status, prev);
                    self.tasks[task].status = prev;
                }
                Undo::Move { copy, .. } => {
                    self.queue_add(copy, -1.0);
                    self.remove_resources(copy);
                    self.tasks[task].moved = None;
                    let job = self.tasks[copy].job;
                    let js = &mut self.jobs[job];
                    if let Some(at) = js.tasks.iter().rposition(|&t| t == copy) {
                        js.tasks.remove(at);
                    }
                    for ps in js.podsets.iter_mut() {
                        if let Some(at) = ps.tasks.iter().position(|&t| t == copy) {
                            ps.tasks.remove(at);
                        }
                    }
                    self.tasks.pop();
                }
                Undo::Unevict { .. } => {
                    self.queue_add(task, -1.0);
                    self.set_charge(task, self.tasks[task].status, PodStatus::Releasing);
                    self.tasks[task].status = PodStatus::Releasing;
                    self.mark_releasing(task, 1);
                }
            }
        }
    }

    // ------------------------------------------------------------------ queries
    pub fn free_gpu_at(&self, n: usize) -> i64 {
        self.cap_gpu[n] - self.used_gpu[n] + self.rel_gpu[n]
    }

    pub fn free_cpu_at(&self, n: usize) -> i64 {
        self.cap_cpu[n] - self.used_cpu[n] + self.rel_cpu[n]
    }

    pub fn group(&self, node: i32, gid: u32) -> Option<&Group> {
        self.groups[node as usize].iter().find(|g| g.gid == gid)
    }

    // ------------------------------------------------------------------ jobs
    pub fn pending_tasks(&self, job: usize) -> Vec<usize> {
        self.jobs[job]
            .tasks
            .iter()
            .copied()
            .filter(|&t| self.tasks[t].status == PodStatus::Pending)
            .collect()
    }

    pub fn has_pending(&self, job: usize) -> bool {
        self.jobs[job].tasks.iter().any(|&t| self.tasks[t].status == PodStatus::Pending)
    }

    pub fn active_count(&self, job: usize) -> usize {
        self.jobs[job].tasks.iter().filter(|&&t| self.tasks[t].status.active_allocated()).count()
    }

    pub fn podset_active(&self, ps: &PodSet) -> i64 {
        ps.tasks.iter().filter(|&&t| self.tasks[t].status.active_allocated()).count() as i64
    }

    /// 0 below min in some podset, 1 exactly at min, 2 above min (KAI's elastic job order).
    pub fn elastic_rank(&self, job: usize) -> i64 {
        let mut at_min = true;
        for ps in &self.jobs[job].podsets {
            let active = self.podset_active(ps);
            if active < ps.min_member {
                return 0;
            }
            if active > ps.min_member {
                at_min = false;
            }
        }
        if at_min {
            1
        } else {
            2
        }
    }

    /// `JobState.order_number`: the job's order key as one number (not kept: the rank changes).
    pub fn job_order_number(&mut self, job: usize) -> i64 {
        let rank = self.elastic_rank(job);
        let (priority, created) = (self.jobs[job].priority, self.jobs[job].created);
        self.order_number(-priority, rank, created, job)
    }

    pub fn is_ready(&self, job: usize) -> bool {
        self.jobs[job].podsets.iter().all(|ps| {
            let alive = ps
                .tasks
                .iter()
                .filter(|&&t| {
                    let s = self.tasks[t].status;
                    s.alive() && s != PodStatus::Gated
                })
                .count() as i64;
            alive >= ps.min_member
        })
    }

    pub fn gang_satisfied(&self, job: usize) -> bool {
        self.jobs[job].podsets.iter().all(|ps| self.podset_active(ps) >= ps.min_member)
    }

    /// KAI's tasks-to-allocate: the missing minimum of every podset below its minimum, or, once
    /// every podset is satisfied, one more pending task from the least-satisfied podset. In a
    /// simulation, tasks evicted in this session may be placed again.
    pub fn tasks_to_allocate(&mut self, job: usize, simulation: bool) -> Vec<usize> {
        let s = simulation as usize;
        let changes = self.jobs[job].changes;
        if let Some((at, tasks)) = &self.jobs[job].to_allocate[s] {
            if *at == changes {
                return tasks.clone();
            }
        }
        let tasks = self.compute_tasks_to_allocate(job, simulation);
        self.jobs[job].to_allocate[s] = Some((changes, tasks.clone()));
        tasks
    }

    fn allocatable(&self, t: usize, simulation: bool) -> bool {
        let t = &self.tasks[t];
        if t.status == PodStatus::Pending {
            return true;
        }
        simulation
            && t.status == PodStatus::Releasing
            && t.moved.is_none()
            && t.orig_status != PodStatus::Releasing
    }

    fn sorted_allocatable(&self, ps: &PodSet, simulation: bool) -> Vec<usize> {
        let mut out: Vec<usize> =
            ps.tasks.iter().copied().filter(|&t| self.allocatable(t, simulation)).collect();
        out.sort_by(|&a, &b| cmp_task(&self.tasks[a], &self.tasks[b]));
        out
    }

    fn ordered_podsets(&self, job: usize) -> Vec<usize> {
        let js = &self.jobs[job];
        let mut order: Vec<usize> = (0..js.podsets.len()).collect();
        order.sort_by(|&a, &b| js.podsets[a].name.cmp(&js.podsets[b].name));
        order
    }

    fn compute_tasks_to_allocate(&self, job: usize, simulation: bool) -> Vec<usize> {
        let js = &self.jobs[job];
        let ordered = self.ordered_podsets(job);
        let below: Vec<usize> = ordered
            .iter()
            .copied()
            .filter(|&p| self.podset_active(&js.podsets[p]) < js.podsets[p].min_member)
            .collect();
        if !below.is_empty() {
            let mut out = Vec::new();
            for p in below {
                let ps = &js.podsets[p];
                let pending = self.by_replica(&self.sorted_allocatable(ps, simulation));
                let want = (ps.min_member - self.podset_active(ps)).max(0) as usize;
                out.extend(pending.into_iter().take(want));
            }
            return out;
        }
        let mut candidates: Vec<usize> = ordered
            .into_iter()
            .filter(|&p| js.podsets[p].tasks.iter().any(|&t| self.allocatable(t, simulation)))
            .collect();
        candidates.sort_by(|&a, &b| {
            let (pa, pb) = (&js.podsets[a], &js.podsets[b]);
            // a minimum of 0 (an all-elastic podset) counts as 1
            let ra = self.podset_active(pa) as f64 / pa.min_member.max(1) as f64;
            let rb = self.podset_active(pb) as f64 / pb.min_member.max(1) as f64;
            ra.partial_cmp(&rb).unwrap_or(Ordering::Equal).then_with(|| pa.name.cmp(&pb.name))
        });
        for p in candidates {
            let ps = &js.podsets[p];
            let unit = self.next_elastic_unit(ps, &self.sorted_allocatable(ps, simulation));
            if !unit.is_empty() {
                return unit;
            }
        }
        Vec::new()
    }

    /// The next pod above the podset's minimum, or all pending pods of the next complete
    /// replica (one whose pods do not all exist yet waits).
    fn next_elastic_unit(&self, ps: &PodSet, pending: &[usize]) -> Vec<usize> {
        for &t in pending {
            let Some(replica) = &self.tasks[t].replica else { return vec![t] };
            let size = ps
                .tasks
                .iter()
                .filter(|&&u| {
                    let u = &self.tasks[u];
                    u.replica.as_ref() == Some(replica) && u.status.alive() && u.origin.is_none()
                })
                .count() as i64;
            if size >= ps.replica_size {
                return pending
                    .iter()
                    .copied()
                    .filter(|&u| self.tasks[u].replica.as_ref() == Some(replica))
                    .collect();
            }
        }
        Vec::new()
    }

    /// `tasks` (in task order) with the pods of one replica kept together, at the place of the
    /// replica's first pod.
    pub fn by_replica(&self, tasks: &[usize]) -> Vec<usize> {
        let mut out = Vec::with_capacity(tasks.len());
        let mut seen: Vec<&String> = Vec::new();
        for &t in tasks {
            match &self.tasks[t].replica {
                None => out.push(t),
                Some(r) if !seen.contains(&r) => {
                    seen.push(r);
                    out.extend(
                        tasks
                            .iter()
                            .copied()
                            .filter(|&u| self.tasks[u].replica.as_ref() == Some(r)),
                    );
                }
                Some(_) => {}
            }
        }
        out
    }
}

pub fn pending_queue_amount(req: &Request) -> Amounts {
    let gpu = if req.gpus != 0 {
        req.gpus as f64
    } else if req.gpu_fraction_milli != 0 {
        req.gpu_fraction_milli as f64 / MILLI as f64 * req.fraction_devices as f64
    } else if req.gpu_memory_mib != 0 {
        (req.fraction_devices * req.gpu_memory_mib) as f64 / MIN_NODE_GPU_MEMORY_MIB as f64
    } else {
        0.0
    };
    [req.cpu_m as f64, req.memory as f64, gpu]
}

/// The most room on a live device (not entirely releasing; -1: none).
fn device_room(groups: &[Group]) -> i64 {
    let mut room = -1i64;
    for g in groups {
        let free = MILLI - g.used + g.releasing;
        if g.releasing < g.used && free > room {
            room = free;
        }
    }
    room
}

#[derive(Default)]
struct Load {
    gpu_nodes: FxHashMap<i32, bool>,
    gpu_order: Vec<i32>,
    releasing: Vec<usize>,
    pipelined: Vec<usize>,
    pending: FxHashSet<usize>,
    groups: FxHashSet<u32>,
}
