//! The session (kai_ray/core/state.py): one cycle's view of the cluster, built from the
//! snapshot and changed by the actions' virtual decisions. It holds, along KAI's own lines, the
//! nodes and their devices (`ClusterState`, cluster.rs), the queues' accounting
//! (`QueueAccounting`, accounting.rs), the jobs and their tasks (jobs.rs) and the undo log the
//! Statement records every decision in (`Session::statement`, statement.rs), so a gang that
//! does not fit is rolled back to a checkpoint without a trace; besides, what the actions
//! record on the way (why a job failed, why a pod is evicted), the victim units' arena and a
//! scratch of values derived once per session.

use std::cmp::Ordering;
use std::rc::Rc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::accounting::{pending_queue_amount, QueueAccounting};
use crate::cluster::{ClusterState, NodeMasks};
use crate::jobs::{cmp_task, JobState, PodSet, Task};
use crate::model::{
    Amounts, Constraints, GpuPacking, PodStatus, Request, SchedulerConfig, Snapshot,
};
use crate::scratch::Scratch;
use crate::statement::{LogMark, Statement, Sticky, UndoLog};

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
    pub cluster: ClusterState,
    pub queues: QueueAccounting,
    /// the pods' node constraints (`Task::constraints` indexes them), and their node masks
    /// once made (placement.rs `masks`)
    pub constraints: Vec<Constraints>,
    pub masks: Vec<Option<NodeMasks>>,
    /// every decision since the session began (statement.rs): a checkpoint is its length
    pub undo: UndoLog,
    pub job_errors: FxHashMap<usize, JobError>,
    /// the binpack fast path's last placement and the undo log's mark then (actions/common.rs)
    pub sticky: Option<(Sticky, LogMark)>,
    /// the only nodes placement may use while set, in node order (a victim scenario's):
    /// set with `set_node_filter` (shared, as every task placed in the scenario reads it)
    pub node_filter: Option<Rc<[usize]>>,
    pub evict_info: FxHashMap<usize, EvictInfo>,
    pub jobs: Vec<JobState>,
    pub job_index: FxHashMap<String, usize>,
    pub tasks: Vec<Task>,
    shapes: FxHashMap<(Request, usize), i32>,
    /// the jobs with a pending task when the session began: no task becomes pending during a
    /// cycle, so the passes over pending work look at these only
    pub pending_jobs: Vec<usize>,
    name_rank: Option<FxHashMap<usize, i64>>,
    order_ranks: Option<OrderRanks>,
    /// by job, its victim unit as of its last change (actions/victims.rs), and the units'
    /// arena: the Rust core's victim search builds a job's unit once per change of the job
    /// (`JobState::changes`, which the Statement bumps, undo included), not once per scenario
    pub victim_units: Vec<Option<(u64, Option<usize>)>>,
    pub units: Vec<VictimUnit>,
    /// what other modules derive once per session, under their own types: the jobs with a
    /// pending task per leaf queue in job order (ordering.rs `PendingOrder`), the packing
    /// policies' typical shapes and scores (packing.rs `Memo`)
    pub scratch: Scratch,
}

impl Session {
    /// The decisions on this session (KAI's Statement), recorded in its undo log.
    pub fn statement(&mut self) -> Statement<'_> {
        Statement {
            cluster: &mut self.cluster,
            queues: &mut self.queues,
            tasks: &mut self.tasks,
            jobs: &mut self.jobs,
            undo: &mut self.undo,
        }
    }

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

    /// The snapshot as a session: its nodes, its queue tree, its jobs, and every pod as a task
    /// on its node and in its queues' numbers.
    pub fn new(snapshot: Snapshot, config: SchedulerConfig, now: f64) -> Session {
        let Snapshot { nodes, queues, jobs: snap_jobs, constraints } = snapshot;
        let lookahead = config.gpu_packing == GpuPacking::Lookahead;
        let masks = vec![None; constraints.len()];
        let mut sess = Session {
            config,
            now,
            cluster: ClusterState::new(nodes, lookahead),
            queues: QueueAccounting::new(queues),
            constraints,
            masks,
            undo: UndoLog::default(),
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
            pending_jobs: Vec::new(),
            name_rank: None,
            order_ranks: None,
            victim_units: Vec::new(),
            units: Vec::new(),
            scratch: Scratch::default(),
        };
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
            let queue_id = sess.queues.queue_index.get(&job.queue).copied();
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
                        sess.cluster.node_index.get(name).copied().unwrap_or(-1)
                    }
                    _ => -1,
                };
                let groups: Vec<u32> =
                    pod.gpu_groups.iter().map(|g| sess.cluster.intern_gid(g)).collect();
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
        sess.cluster.known_groups = std::mem::take(&mut load.groups);
        sess.victim_units = vec![None; sess.jobs.len()];
        sess.finish_load(load);
        sess
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

    /// A snapshot's task on its node and in its queues' numbers. A node's GPUs are recounted
    /// once it has all its pods, and releasing and pipelined pods are charged as such once
    /// every pod holds its part (a releasing sharer's device must exist to be released):
    /// `finish_load`.
    fn load_task(&mut self, idx: usize, load: &mut Load) {
        let task = &mut self.tasks[idx];
        let (node, req, status, job) = (task.node, task.req, task.status, task.job);
        for &g in &task.groups {
            load.groups.insert(g);
        }
        if status == PodStatus::Pending {
            load.pending.insert(job);
        }
        if node >= 0 && status.active_used() {
            let n = node as usize;
            let cluster = &mut self.cluster;
            cluster.used_cpu[n] += req.cpu_m;
            cluster.used_mem[n] += req.memory;
            cluster.used_pods[n] += 1;
            if req.wants_gpu() {
                let groups = task.groups.clone();
                cluster.hold_gpus(task, node, groups, status == PodStatus::Pipelined);
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
        let task = &self.tasks[idx];
        if status.queue_allocated() {
            let amounts = self.cluster.queue_amount(task);
            self.queues.load(&self.jobs[job], amounts, true);
        } else if status == PodStatus::Pending {
            self.queues.load(&self.jobs[job], pending_queue_amount(&req), false);
        }
    }

    fn finish_load(&mut self, load: Load) {
        let cluster = &mut self.cluster;
        for &node in &load.gpu_order {
            let devices = load.gpu_nodes[&node];
            cluster.refresh_gpu(node, devices);
        }
        for &t in &load.releasing {
            cluster.mark_releasing(&self.tasks[t], 1);
        }
        for &t in &load.pipelined {
            cluster.pipeline_charge(&self.tasks[t], 1, true);
        }
        cluster.index_gpu_room();
    }

    /// Restrict placement to `nodes` (None: every node). The binpack carry-over is dropped:
    /// a choice among other nodes (binpack normalises over them) is no guide for this one,
    /// even where the undo log is as it was.
    pub fn set_node_filter(&mut self, nodes: Option<Vec<usize>>) {
        self.sticky = None;
        self.node_filter = nodes.map(Rc::from);
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

#[derive(Default)]
struct Load {
    gpu_nodes: FxHashMap<i32, bool>,
    gpu_order: Vec<i32>,
    releasing: Vec<usize>,
    pipelined: Vec<usize>,
    pending: FxHashSet<usize>,
    groups: FxHashSet<u32>,
}
