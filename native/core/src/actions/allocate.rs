//! allocate: place pending jobs in queue/job order, each gang all or nothing
//! (kai_ray/core/actions/allocate.py).

use rustc_hash::FxHashMap;

use crate::actions::common::place_tasks;
use crate::ordering::{Items, JobQueue};
use crate::state::{JobError, Session};

/// Jobs any action may consider: a leaf queue that exists, ready, something pending.
pub fn schedulable_jobs(sess: &Session) -> Vec<usize> {
    sess.pending_jobs
        .iter()
        .copied()
        .filter(|&job| {
            sess.has_pending(job)
                && sess.queues.is_leaf(sess.jobs[job].queue_id)
                && sess.is_ready(job)
        })
        .collect()
}

pub fn run(sess: &mut Session) {
    // Failures for lack of room are monotone within allocate (it only fills nodes), so a job
    // whose task shapes already failed once fails again: skip the node search for it.
    let mut failed_shapes: FxHashMap<Vec<i32>, JobError> = FxHashMap::default();
    let jobs = schedulable_jobs(sess);
    let mut queue = JobQueue::new(sess, Items::Jobs, &jobs, false, false);
    while let Some(job) = queue.pop(sess) {
        let tasks = sess.tasks_to_allocate(job, false);
        if tasks.is_empty() {
            continue;
        }
        let shape: Vec<i32> = tasks.iter().map(|&t| sess.shape_of(t)).collect();
        if let Some(known) = failed_shapes.get(&shape) {
            sess.job_errors.insert(job, known.clone());
            continue;
        }
        if !place_tasks(sess, job, &tasks, false, true) {
            let error = &sess.job_errors[&job];
            if error.fit.is_some() {
                // a node-fit failure, not a queue rule
                failed_shapes.insert(shape, error.clone());
            }
            continue;
        }
        if sess.has_pending(job) {
            queue.push(sess, job);
        }
    }
}
