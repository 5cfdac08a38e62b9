//! preempt: inside one queue, a job evicts strictly lower-priority preemptible jobs
//! (kai_ray/core/actions/preempt.py).

use rustc_hash::FxHashMap;

use crate::actions::allocate::schedulable_jobs;
use crate::actions::runtime::{protected, Kind};
use crate::actions::solver::{FailedJobs, Rules, Solver, VictimCache};
use crate::capacity::{check_non_preemptible, job_level_request};
use crate::ordering::{Items, JobQueue};
use crate::state::{EvictMessage, Session};

struct Preempt<'a> {
    job: usize,
    /// every job of the preemptor's queue (victims come from it only)
    in_queue: &'a [usize],
}

impl Rules for Preempt<'_> {
    fn action(&self) -> &'static str {
        "preempt"
    }

    fn message(&self) -> EvictMessage {
        EvictMessage::Preempt
    }

    fn candidates(&self, sess: &mut Session) -> Vec<usize> {
        self.in_queue.iter().copied().filter(|&v| self.is_candidate(sess, v)).collect()
    }

    fn is_candidate(&self, sess: &Session, v: usize) -> bool {
        let (preemptor, victim) = (&sess.jobs[self.job], &sess.jobs[v]);
        v != self.job
            && victim.queue_key == preemptor.queue_key
            && victim.preemptible
            && victim.priority < preemptor.priority
            && !protected(sess, v, Kind::Preempt)
    }

    fn validate(&self, _sess: &Session, _evicted: &[usize], _moved: &[usize]) -> bool {
        true
    }
}

pub fn run(sess: &mut Session) {
    let mut failed = FailedJobs::default();
    let mut cache = VictimCache::default();
    let jobs = schedulable_jobs(sess);
    let mut queue = JobQueue::new(sess, Items::Jobs, &jobs, false, false);
    let mut in_queue: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
    for (v, js) in sess.jobs.iter().enumerate() {
        in_queue.entry(js.queue_key).or_default().push(v);
    }
    let empty = Vec::new();
    while let Some(job) = queue.pop(sess) {
        let scope = sess.jobs[job].queue_key;
        if failed.should_skip(sess, job, scope) {
            continue;
        }
        let tasks = sess.tasks_to_allocate(job, false);
        if tasks.is_empty() {
            continue;
        }
        if !sess.jobs[job].preemptible
            && check_non_preemptible(sess, job, job_level_request(sess, &tasks)).is_some()
        {
            // a failed attempt like any other: a look-alike is skipped (preempt.go)
            failed.record(sess, job, scope);
            continue;
        }
        let rules = Preempt { job, in_queue: in_queue.get(&scope).unwrap_or(&empty) };
        let mut solver = Solver::new(&rules, Some((scope, sess.jobs[job].priority)));
        // a job that got room is not tried again this action (KAI: only allocate pushes a job
        // with tasks left back into its queue)
        if !solver.solve(sess, &mut cache, job) {
            failed.record(sess, job, scope);
        }
    }
}
