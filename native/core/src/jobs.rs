//! Jobs and their tasks (kai_ray/core/jobs.py): one task per pod, grouped by job and podset.
//! Plain records by index into the session's `tasks` and `jobs`; what a task's job or node
//! state answers is asked of the `Session` (state.rs), which holds both lists.

use std::cmp::Ordering;

use crate::model::{Amounts, PodStatus, Request};

/// A job's scheduling signature: its pods' priority and, per podset, the constraints of each
/// pod not active-allocated (see actions/solver.rs).
pub type Signature = (i64, Vec<Vec<usize>>);

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

impl Task {
    /// A victim's pipelined copy at index `idx` (statement.rs `move_task`): the same pod, not
    /// yet placed, pointing back to the original.
    pub fn moved_copy(&self, idx: usize) -> Task {
        Task {
            idx,
            job: self.job,
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            req: self.req,
            status: PodStatus::Pending,
            node: -1,
            groups: Vec::new(),
            orig_status: PodStatus::Pending,
            orig_groups: Vec::new(),
            task_priority: self.task_priority,
            created: self.created,
            is_head: self.is_head,
            subgroup: self.subgroup.clone(),
            constraints: self.constraints,
            shape: self.shape,
            replica: self.replica.clone(),
            gpu_mem_cost: 0,
            accepted_gpu: 0.0,
            moved: None,
            origin: Some(self.idx),
        }
    }
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
    pub fn new(name: String, min_member: i64, replica_size: i64, admitted: Option<i64>) -> Self {
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
