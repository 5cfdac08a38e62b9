//! `schedule(snapshot, config, now) -> CycleOutput`: one KAI cycle, pure
//! (kai_ray/core/schedule.py). Open a session (fair share once), run the configured actions in
//! order on the same virtual state, then turn the final state into decisions and explanations.
//! Tasks, jobs, nodes and queues are named by their indices: the caller holds the names.

use rustc_hash::FxHashSet;

use crate::actions::{allocate, consolidation, preempt, reclaim, stale};
use crate::capacity::QUEUE_DOES_NOT_EXIST;
use crate::fairshare::{divide, ShareInput};
use crate::jobs::Task;
use crate::model::{Amounts, PodStatus, SchedulerConfig, Snapshot};
use crate::pyfmt::fmt_g;
use crate::queuetree::QUEUE_PARENT_CYCLE;
use crate::state::{EvictMessage, Session};

pub struct PodOutcome {
    pub status: PodStatus,
    pub node: i32,
    /// None: the pod's devices in the snapshot, unchanged
    pub groups: Option<Vec<u32>>,
}

pub struct Bind {
    pub task: usize,
    pub node: i32,
    pub groups: Vec<u32>,
    pub new_groups: Vec<u32>,
    pub portion: f64,
    pub gpu_memory_mib: i64,
}

pub struct Evict {
    pub task: usize,
    pub node: i32,
    pub action: &'static str,
    pub message: String,
    pub preemptor: Option<usize>,
}

pub struct JobStatus {
    pub job: usize,
    pub reason: String,
    pub message: String,
    pub pending: Vec<usize>,
    pub fit: Option<Vec<(String, i64)>>,
}

pub struct QueueShare {
    pub queue: usize,
    pub deserved: Amounts,
    pub limit: Amounts,
    pub fair_share: Amounts,
    pub allocated: Amounts,
    pub allocated_np: Amounts,
    pub requested: Amounts,
}

/// What one cycle decided, by index: tasks in snapshot order (job by job, pod by pod), jobs in
/// snapshot order, queues as the session keeps them (`queue_names`, `queue_parents`).
pub struct CycleOutput {
    /// every snapshot pod's final state, in snapshot order
    pub pods: Vec<PodOutcome>,
    pub binds: Vec<Bind>,
    /// (task, node)
    pub pipelined: Vec<(usize, i32)>,
    pub evictions: Vec<Evict>,
    pub job_status: Vec<JobStatus>,
    pub stale_set: Vec<(usize, f64)>,
    pub stale_cleared: Vec<usize>,
    pub queues: Vec<QueueShare>,
    pub queue_names: Vec<String>,
    pub queue_parents: Vec<Option<String>>,
    pub action_seconds: Vec<(String, f64)>,
    /// shared-device ids by number (`groups` above)
    pub gids: Vec<String>,
    /// node names in session order (`node` above)
    pub node_names: Vec<String>,
}

pub fn compute_fair_share(sess: &mut Session) {
    for r in 0..3 {
        let mut inputs: Vec<ShareInput> = sess
            .queues
            .iter()
            .map(|q| ShareInput {
                name: q.name.clone(),
                deserved: q.deserved[r],
                limit: q.limit[r],
                weight: q.weight[r],
                request: q.request[r],
                priority: q.priority,
                created: q.created,
                usage: 0.0,
                fair_share: 0.0,
                children: q.children.clone(),
            })
            .collect();
        let roots: Vec<usize> =
            (0..sess.queues.len()).filter(|&i| sess.queues[i].parent_id.is_none()).collect();
        divide(sess.cluster.total[r], &roots, &mut inputs, sess.config.k_value);
        for (q, input) in sess.queues.iter_mut().zip(inputs) {
            q.fair_share[r] = input.fair_share;
        }
    }
}

/// Run one cycle. `clock` (injected by the caller) only times the actions.
pub fn schedule(
    snapshot: Snapshot,
    config: SchedulerConfig,
    now: f64,
    clock: &mut dyn FnMut() -> Option<f64>,
) -> Result<CycleOutput, String> {
    for action in &config.actions {
        if !matches!(
            action.as_str(),
            "allocate" | "consolidation" | "reclaim" | "preempt" | "stalegangeviction"
        ) {
            return Err(format!("unknown action {action:?}"));
        }
    }
    let mut sess = Session::new(snapshot, config, now);
    compute_fair_share(&mut sess);
    let existing_groups: FxHashSet<u32> =
        sess.cluster.groups.iter().flatten().map(|g| g.gid).collect();
    let mut stale_set = Vec::new();
    let mut stale_cleared = Vec::new();
    let mut action_seconds = Vec::new();
    for action in sess.config.actions.clone() {
        let start = clock();
        match action.as_str() {
            "allocate" => allocate::run(&mut sess),
            "consolidation" => consolidation::run(&mut sess),
            "reclaim" => reclaim::run(&mut sess),
            "preempt" => preempt::run(&mut sess),
            _ => stale::run(&mut sess, &mut stale_set, &mut stale_cleared),
        }
        if let (Some(start), Some(end)) = (start, clock()) {
            match action_seconds.iter_mut().find(|(a, _): &&mut (String, f64)| *a == action) {
                Some(entry) => entry.1 = end - start,
                None => action_seconds.push((action, end - start)),
            }
        }
    }
    Ok(collect(sess, existing_groups, stale_set, stale_cleared, action_seconds))
}

fn reported(status: PodStatus) -> PodStatus {
    // allocated pods are reported as binding
    if status == PodStatus::Allocated {
        PodStatus::Binding
    } else {
        status
    }
}

/// Where the pod is now: its last copy if it was moved (a copy may be moved again).
fn live_of(sess: &Session, mut idx: usize) -> usize {
    while let Some(copy) = sess.tasks[idx].moved {
        idx = copy;
    }
    idx
}

/// A pod pending when the cycle began, placed in it and evicted again (a victim of a later
/// action) and not placed anew: it stays pending, neither pipelined nor evicted (KAI's eviction
/// of a pod it has not bound). One a victim scenario moved is pipelined where it went (KAI's
/// last call for it pipelines it there).
fn taken_back(task: &Task) -> bool {
    task.orig_status == PodStatus::Pending
        && task.status == PodStatus::Releasing
        && task.moved.is_none()
}

/// Whether the pod counts as there for its job's readiness, once (a moved pod where it went; a
/// pod taken back is pending again).
fn alive_once(sess: &Session, idx: usize) -> bool {
    let task = &sess.tasks[idx];
    if task.origin.is_some() {
        return false;
    }
    if taken_back(task) {
        return true;
    }
    let status = sess.tasks[live_of(sess, idx)].status;
    status.alive() && status != PodStatus::Gated
}

fn collect(
    mut sess: Session,
    existing_groups: FxHashSet<u32>,
    stale_set: Vec<(usize, f64)>,
    stale_cleared: Vec<usize>,
    action_seconds: Vec<(String, f64)>,
) -> CycleOutput {
    let mut pods = Vec::new();
    let mut binds = Vec::new();
    let mut pipelined = Vec::new();
    let mut evictions = Vec::new();
    for idx in 0..sess.tasks.len() {
        let task = &sess.tasks[idx];
        if task.origin.is_some() {
            continue;
        }
        if taken_back(task) {
            pods.push(PodOutcome {
                status: PodStatus::Pending,
                node: -1,
                groups: Some(Vec::new()),
            });
            continue;
        }
        let live = &sess.tasks[live_of(&sess, idx)];
        pods.push(PodOutcome {
            status: reported(live.status),
            node: live.node,
            groups: (live.groups != task.orig_groups).then(|| live.groups.clone()),
        });
        if task.orig_status == PodStatus::Pending && live.status == PodStatus::Allocated {
            let portion =
                if task.req.is_shared() { sess.cluster.portion(&task.req, live.node) } else { 0.0 };
            binds.push(Bind {
                task: idx,
                node: live.node,
                groups: live.groups.clone(),
                new_groups: live
                    .groups
                    .iter()
                    .copied()
                    .filter(|g| !existing_groups.contains(g))
                    .collect(),
                portion,
                gpu_memory_mib: task.req.gpu_memory_mib,
            });
        } else if live.status == PodStatus::Pipelined {
            pipelined.push((idx, live.node));
        }
        if task.orig_status.active_used()
            && task.orig_status != PodStatus::Releasing
            && task.status == PodStatus::Releasing
        {
            let (action, message, preemptor) = match sess.evict_info.get(&idx) {
                Some(info) => (
                    info.action,
                    evict_message(&sess, idx, info.preemptor, &info.message),
                    info.preemptor,
                ),
                None => ("unknown", String::new(), None),
            };
            evictions.push(Evict { task: idx, node: task.node, action, message, preemptor });
        }
    }
    let job_status = job_statuses(&mut sess);
    let queues = sess
        .queues
        .iter()
        .enumerate()
        .map(|(i, q)| QueueShare {
            queue: i,
            deserved: q.deserved,
            limit: q.limit,
            fair_share: q.fair_share,
            allocated: q.allocated,
            allocated_np: q.allocated_np,
            requested: q.request,
        })
        .collect();
    CycleOutput {
        pods,
        binds,
        pipelined,
        evictions,
        job_status,
        stale_set,
        stale_cleared,
        queues,
        queue_names: sess.queues.iter().map(|q| q.name.clone()).collect(),
        queue_parents: sess.queues.iter().map(|q| q.parent.clone()).collect(),
        action_seconds,
        gids: std::mem::take(&mut sess.cluster.gids),
        node_names: sess.cluster.nodes.iter().map(|n| n.name.clone()).collect(),
    }
}

fn fmt_res(v: &Amounts) -> String {
    format!(
        "CPU: {} (cores), memory: {} (GB), Gpus: {}",
        fmt_g(v[0] / 1000.0),
        fmt_g(v[1] / 1e9),
        fmt_g(v[2])
    )
}

fn evict_message(
    sess: &Session,
    task: usize,
    preemptor: Option<usize>,
    message: &EvictMessage,
) -> String {
    let t = &sess.tasks[task];
    match message {
        EvictMessage::Text(text) => text.clone(),
        EvictMessage::Consolidation => format!(
            "Pod {}/{} was preempted and rescheduled due to bin packing (resource consolidation) procedure",
            t.namespace, t.name
        ),
        EvictMessage::Preempt => {
            let p = &sess.jobs[preemptor.expect("a preemptor")];
            format!(
                "Pod {}/{} was preempted by higher priority workload {}",
                t.namespace,
                t.name,
                job_label(&p.namespace, &p.name)
            )
        }
        EvictMessage::Reclaim => {
            let p = &sess.jobs[preemptor.expect("a reclaimer")];
            let mut vq = sess.jobs[t.job].queue_id.expect("a victim queue");
            let mut rq = p.queue_id.expect("a reclaimer queue");
            if sess.queues[vq].parent != sess.queues[rq].parent {
                vq = sess.queues[vq].parent_id.unwrap_or(vq);
                rq = sess.queues[rq].parent_id.unwrap_or(rq);
            }
            let mut lines = vec![format!(
                "Pod {}/{} was preempted by workload {}.",
                t.namespace,
                t.name,
                job_label(&p.namespace, &p.name)
            )];
            for q in [vq, rq] {
                let q = &sess.queues[q];
                lines.push(format!(
                    "{} uses <{}> with a quota of <{}>, fair-share of <{}> and queue priority of {}.",
                    q.name,
                    fmt_res(&q.allocated),
                    fmt_res(&q.deserved),
                    fmt_res(&q.fair_share),
                    q.priority
                ));
            }
            lines.join("\n")
        }
    }
}

fn job_statuses(sess: &mut Session) -> Vec<JobStatus> {
    let mut out = Vec::new();
    for i in 0..sess.pending_jobs.len() {
        let job = sess.pending_jobs[i];
        let js = &sess.jobs[job];
        let pending: Vec<usize> = js
            .tasks
            .iter()
            .copied()
            .filter(|&t| {
                let task = &sess.tasks[t];
                task.origin.is_none() && (task.status == PodStatus::Pending || taken_back(task))
            })
            .collect();
        if pending.is_empty() {
            continue;
        }
        let mut fit = None;
        let (reason, message) = if let Some(why) = sess.queues.excluded_queues.get(&js.queue) {
            (QUEUE_PARENT_CYCLE.to_string(), why.clone())
        } else if js.queue_id.is_none() {
            (QUEUE_DOES_NOT_EXIST.to_string(), format!("Queue '{}' does not exist", js.queue))
        } else if !sess.queues.is_leaf(js.queue_id) {
            (
                "QueueNotLeaf".to_string(),
                format!("Queue '{}' has child queues; only leaf queues run workloads", js.queue),
            )
        } else if !js.podsets.iter().all(|ps| {
            ps.tasks.iter().filter(|&&t| alive_once(sess, t)).count() as i64 >= ps.min_member
        }) {
            // a releasing pod is neither: it is going away (KAI's aliveStatuses)
            let status = |t: &usize| sess.tasks[*t].status;
            let alive = js.tasks.iter().filter(|&&t| alive_once(sess, t)).count();
            let gated = js.tasks.iter().filter(|t| status(t) == PodStatus::Gated).count();
            let minimum: i64 = js.podsets.iter().map(|ps| ps.min_member).sum();
            (
                "NotReady".to_string(),
                format!(
                    "Job is not ready for scheduling. Waiting for {minimum} pods, currently {alive} exist, {gated} are gated"
                ),
            )
        } else if let Some(err) = sess.job_errors.get(&job) {
            if let Some(reasons) = &err.fit {
                if !reasons.is_empty() {
                    let mut sorted = reasons.clone();
                    sorted.sort();
                    fit = Some(sorted);
                }
            }
            (err.reason.clone(), err.message.clone())
        } else {
            ("Unschedulable".to_string(), "Unable to schedule podgroup".to_string())
        };
        out.push(JobStatus { job, reason, message, pending, fit });
    }
    out
}

/// A job as messages name it: `namespace/name`, or its name alone when that is already a job
/// key (`namespace/name`, as kai-ray run's watch cache names jobs).
fn job_label(namespace: &str, name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("{namespace}/{name}")
    }
}
