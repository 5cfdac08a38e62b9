//! stalegangeviction: a running gang below its minimum for longer than the grace period is
//! evicted whole (kai_ray/core/actions/stale.py). Below its minimum: fewer members running than
//! a podset's `stale_min`, which is lower than its minimum only when a spec change raised the
//! minimum after the gang started (a raise is not a member lost).

use crate::model::PodStatus;
use crate::state::{EvictInfo, EvictMessage, Session};

fn is_stale(sess: &Session, job: usize) -> bool {
    let js = &sess.jobs[job];
    let mut active = 0;
    for &t in &js.tasks {
        let status = sess.tasks[t].status;
        if status == PodStatus::Succeeded {
            return false;
        }
        if status.active_used() {
            active += 1;
        }
    }
    if active == 0 {
        return false;
    }
    if !js.uses_subgroups {
        // one podset, holding every task
        return active < js.podsets[0].stale_min;
    }
    js.podsets.iter().any(|ps| {
        (ps.tasks.iter().filter(|&&t| sess.tasks[t].status.active_used()).count() as i64)
            < ps.stale_min
    })
}

/// (jobs to stamp stale now, jobs whose stale stamp is cleared)
pub fn run(sess: &mut Session, stale_set: &mut Vec<(usize, f64)>, stale_cleared: &mut Vec<usize>) {
    let grace = sess.config.staleness_grace_period_s;
    for job in 0..sess.jobs.len() {
        if !is_stale(sess, job) {
            if sess.jobs[job].stale_since.is_some() {
                stale_cleared.push(job);
            }
            continue;
        }
        let Some(since) = sess.jobs[job].stale_since else {
            stale_set.push((job, sess.now));
            continue;
        };
        if grace < 0.0 || sess.now - since < grace {
            continue;
        }
        let minimum: i64 = sess.jobs[job].podsets.iter().map(|ps| ps.min_member).sum();
        let tasks = sess.jobs[job].tasks.clone();
        for task in tasks {
            let t = &sess.tasks[task];
            if t.status.active_allocated() && t.moved.is_none() {
                let message = format!(
                    "Workload doesn't meet the minimum required number of pods ({minimum}), \
                     evicting remaining pod: {}/{}",
                    t.namespace, t.name
                );
                sess.statement().evict(task);
                sess.evict_info.insert(
                    task,
                    EvictInfo {
                        action: "stalegangeviction",
                        preemptor: None,
                        message: EvictMessage::Text(message),
                    },
                );
            }
        }
    }
}
