//! Min-runtime protection of victims (kai_ray/core/actions/runtime.py).

use crate::state::Session;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Preempt,
    Reclaim,
}

fn resolve(sess: &Session, job: usize, kind: Kind) -> f64 {
    for &q in sess.queues.path(sess.jobs[job].queue_id) {
        let value = match kind {
            Kind::Preempt => sess.queues[q].preempt_min_runtime,
            Kind::Reclaim => sess.queues[q].reclaim_min_runtime,
        };
        if let Some(value) = value {
            return value;
        }
    }
    match kind {
        Kind::Preempt => sess.config.default_preempt_min_runtime_s,
        Kind::Reclaim => sess.config.default_reclaim_min_runtime_s,
    }
}

/// True when a non-elastic victim started too recently to be evicted.
pub fn protected(sess: &Session, job: usize, kind: Kind) -> bool {
    let Some(last_start) = sess.jobs[job].last_start else { return false };
    let minimum = resolve(sess, job, kind);
    if minimum <= 0.0 || sess.now >= last_start + minimum {
        return false;
    }
    // an elastic job may still lose its extra pods; only its gang minimum is protected
    sess.elastic_rank(job) != 2
}
