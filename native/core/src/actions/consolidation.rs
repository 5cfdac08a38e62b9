//! consolidation: move preemptible jobs (no net eviction) to open room for a pending
//! preemptible job (kai_ray/core/actions/consolidation.py).

use crate::actions::allocate::schedulable_jobs;
use crate::actions::solver::{gpu_sums_at, FailedJobs, Rules, Solver, VictimCache};
use crate::ordering::{job_request, Items, JobQueue};
use crate::state::{EvictMessage, Session};
use crate::statement::LogMark;

/// FailedJobs' scope for the whole cluster
const CLUSTER: usize = usize::MAX;

struct Consolidation {
    job: usize,
    limit: i64,
}

impl Rules for Consolidation {
    fn action(&self) -> &'static str {
        "consolidation"
    }

    fn message(&self) -> EvictMessage {
        EvictMessage::Consolidation
    }

    fn candidates(&self, sess: &mut Session) -> Vec<usize> {
        // the first limit + 1 in job order: no need to look at the others
        let mut out = Vec::new();
        for v in 0..sess.jobs.len() {
            if self.limit >= 0 && out.len() as i64 > self.limit {
                break;
            }
            if v != self.job && sess.jobs[v].preemptible && sess.active_count(v) > 0 {
                out.push(v);
            }
        }
        out
    }

    fn is_candidate(&self, _sess: &Session, _v: usize) -> bool {
        unreachable!("consolidation keeps no victim scope: its candidates are made per job")
    }

    fn validate(&self, _sess: &Session, evicted: &[usize], _moved: &[usize]) -> bool {
        evicted.is_empty()
    }
}

/// Free whole GPUs plus the free part of shared devices, on schedulable nodes.
/// KAI's allocatable GPUs (IsEnoughGPUsAllocatableForJob): every schedulable node's idle and
/// releasing GPU sums.
fn free_gpus(sess: &Session) -> f64 {
    let mut total = 0i64;
    for n in 0..sess.cluster.nodes.len() {
        if sess.cluster.schedulable[n] {
            let (idle, releasing) = gpu_sums_at(sess, n);
            total += idle + releasing;
        }
    }
    total as f64 / 100.0
}

pub fn run(sess: &mut Session) {
    let limit = sess.config.max_consolidation_preemptees;
    if limit == 0 || sess.config.gpu_spread || sess.config.cpu_spread {
        return;
    }
    let mut failed = FailedJobs::default();
    let jobs: Vec<usize> =
        schedulable_jobs(sess).into_iter().filter(|&j| sess.jobs[j].preemptible).collect();
    let mut queue = JobQueue::new(sess, Items::Jobs, &jobs, false, false);
    // free GPUs, counted again only when a success changed the state
    let mut free_at: Option<(LogMark, f64)> = None;
    while let Some(job) = queue.pop(sess) {
        if failed.should_skip(sess, job, CLUSTER) {
            continue;
        }
        if sess.tasks_to_allocate(job, false).is_empty() {
            continue;
        }
        let need = job_request(sess, job, false)[2];
        let free = match free_at {
            Some((at, free)) if at == sess.undo.mark() => free,
            _ => {
                let free = free_gpus(sess);
                free_at = Some((sess.undo.mark(), free));
                free
            }
        };
        if need > free + 1e-9 {
            // a failed attempt like any other: a look-alike is skipped (consolidation.go)
            failed.record(sess, job, CLUSTER);
            continue;
        }
        let rules = Consolidation { job, limit };
        let mut cache = VictimCache::default();
        let mut solver = Solver::new(&rules, None);
        // a job that got room is not tried again this action (KAI: only allocate pushes a job
        // with tasks left back into its queue)
        if !solver.solve(sess, &mut cache, job) {
            failed.record(sess, job, CLUSTER);
        }
    }
}
