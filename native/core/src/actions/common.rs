//! What every action shares (kai_ray/core/actions/common.py): placing a job's tasks as one
//! gang, and recording why not.

use crate::capacity::{check_job, job_level_request};
use crate::model::PodStatus;
use crate::placement::{self, Reasons};
use crate::state::{JobError, Session};
use crate::statement::Sticky;

pub fn record_error(
    sess: &mut Session,
    job: usize,
    reason: &str,
    message: String,
    fit: Option<Reasons>,
) {
    sess.job_errors.insert(job, JobError { reason: reason.to_string(), message, fit });
}

pub fn fit_message(reasons: &Reasons) -> String {
    let mut sorted: Vec<&(String, i64)> = reasons.iter().collect();
    sorted.sort();
    let parts: Vec<String> =
        sorted.iter().map(|(reason, count)| format!("{count} node(s) {reason}")).collect();
    if parts.is_empty() {
        return "no nodes are available".to_string();
    }
    format!("no nodes with enough resources were found: {}.", parts.join(", "))
}

fn gang_message(
    sess: &Session,
    job: usize,
    placed: usize,
    needed: usize,
    task: usize,
    reasons: &Reasons,
) -> String {
    let detail = fit_message(reasons);
    if sess.jobs[job].tasks.len() == 1 {
        let t = &sess.tasks[task];
        return format!(
            "Resources were not found for pod {}/{} due to: {detail}",
            t.namespace, t.name
        );
    }
    format!(
        "Resources were found for {placed} pods while {needed} are required for gang scheduling. \
         Additional pods cannot be scheduled due to: {detail}"
    )
}

/// Place `tasks` all or nothing (KAI AllocateJob): queue capacity first, then nodes. On failure
/// nothing is left behind.
pub fn place_tasks(
    sess: &mut Session,
    job: usize,
    tasks: &[usize],
    pipeline_only: bool,
    record: bool,
) -> bool {
    let request = job_level_request(sess, tasks);
    if let Some(error) = check_job(sess, job, request) {
        if record {
            record_error(sess, job, error.reason, error.message, None);
        }
        return false;
    }
    let checkpoint = sess.statement().checkpoint();
    let mut placed: Vec<usize> = Vec::with_capacity(tasks.len());
    // the previous placement carries over from the previous job when nothing else changed
    // since (the undo log as it was). A fast path the Python specification does not take (it
    // chooses over all nodes each time): docs/native-core.md, "Speed paths only in the Rust
    // core"
    let mut last: Option<Sticky> = match sess.sticky {
        Some((sticky, at)) if at == sess.undo.mark() => Some(sticky),
        _ => None,
    };
    for &task in tasks {
        let mut choice = None;
        if let Some(prev) = last {
            if sess.shape_of(prev.task) == sess.shape_of(task)
                && placement::sticky_allowed(sess, task)
            {
                let node = prev.node;
                let (fits, idle) = placement::fits_node(sess, task, node);
                if fits
                    && placement::shown_idle(sess, task, node, idle) == prev.on_idle
                    && placement::sharing_bonus_on(sess, task, node) >= prev.bonus
                {
                    choice = Some(placement::place_on(sess, task, node, idle));
                }
            }
        }
        let choice = match choice {
            Some(c) => c,
            None => {
                let (picked, reasons) = placement::choose(sess, task, record);
                match picked {
                    Some(c) => c,
                    None => {
                        sess.statement().rollback(checkpoint);
                        if record {
                            let message =
                                gang_message(sess, job, placed.len(), tasks.len(), task, &reasons);
                            record_error(sess, job, "Unschedulable", message, Some(reasons));
                        }
                        return false;
                    }
                }
            }
        };
        let sticky = Sticky {
            task,
            node: choice.node,
            on_idle: placement::shown_idle(sess, task, choice.node, choice.on_idle),
            bonus: placement::sharing_bonus_on(sess, task, choice.node),
        };
        last = Some(sticky);
        let pipelined = pipeline_only || !choice.on_idle;
        sess.statement().allocate(task, choice.node, choice.groups, pipelined);
        placed.push(sess.tasks[task].moved.unwrap_or(task));
        sess.sticky = Some((sticky, sess.undo.mark()));
    }
    if !pipeline_only {
        pipeline_whole_gang_if_needed(sess, job, &placed);
    }
    true
}

/// If a podset has a pod waiting for releasing resources (pipelined by this attempt or by an
/// earlier one of the same job) while it is still below its minimum counting only really
/// allocated pods, the whole attempt waits (is pipelined): an extra pod must not start while its
/// gang still waits (KAI ShouldPipelineJob).
fn pipeline_whole_gang_if_needed(sess: &mut Session, job: usize, placed: &[usize]) {
    let below = sess.jobs[job].podsets.iter().any(|ps| {
        let waiting = ps.tasks.iter().any(|&t| sess.tasks[t].status == PodStatus::Pipelined);
        let bound = ps
            .tasks
            .iter()
            .filter(|&&t| {
                matches!(
                    sess.tasks[t].status,
                    PodStatus::Allocated
                        | PodStatus::Binding
                        | PodStatus::Bound
                        | PodStatus::Running
                )
            })
            .count() as i64;
        waiting && bound < ps.min_member
    });
    if below {
        for &t in placed {
            if sess.tasks[t].status == PodStatus::Allocated {
                sess.statement().set_status(t, PodStatus::Pipelined);
            }
        }
    }
}
