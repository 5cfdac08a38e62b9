//! Queue capacity rules that block allocation (kai_ray/core/capacity.py): limits (OverLimit)
//! and, for non-preemptible jobs, quota at every level (NonPreemptibleOverQuota).

use crate::model::Amounts;
use crate::pyfmt::{fmt_g, round2};
use crate::state::Session;

pub const OVER_LIMIT: &str = "OverLimit";
pub const NON_PREEMPTIBLE_OVER_QUOTA: &str = "NonPreemptibleOverQuota";
pub const QUEUE_DOES_NOT_EXIST: &str = "QueueDoesNotExist";

const NAMES: [&str; 3] = ["CPU cores", "GB memory", "GPUs"];
const SCALE: [f64; 3] = [1000.0, 1e9, 1.0];

pub struct CapacityError {
    pub reason: &'static str,
    pub message: String,
}

fn fmt(value: f64, r: usize) -> String {
    let shown = value / SCALE[r];
    if r != 2 {
        fmt_g(shown)
    } else {
        fmt_g(round2(shown))
    }
}

/// Sum of the tasks' requests as the capacity policy sees them: gpu-memory tasks count 0 GPU
/// at job level (KAI's capacity_policy quirk).
pub fn job_level_request(sess: &Session, tasks: &[usize]) -> Amounts {
    let (mut cpu, mut mem, mut gpu) = (0.0, 0.0, 0.0);
    for &t in tasks {
        let req = &sess.tasks[t].req;
        cpu += req.cpu_m as f64;
        mem += req.memory as f64;
        if req.gpus != 0 {
            gpu += req.gpus as f64;
        } else if req.gpu_fraction_milli != 0 {
            gpu += req.gpu_fraction_milli as f64 / 1000.0 * req.fraction_devices as f64;
        }
    }
    [cpu, mem, gpu]
}

pub fn check_job(sess: &Session, job: usize, request: Amounts) -> Option<CapacityError> {
    for &q in sess.queues.path(sess.jobs[job].queue_id) {
        let q = &sess.queues[q];
        for r in [2, 0, 1] {
            if q.limit[r] == -1.0 || request[r] <= 0.0 {
                continue;
            }
            if q.limit[r] < q.allocated[r] + request[r] - 1e-9 {
                let unit = NAMES[r];
                return Some(CapacityError {
                    reason: OVER_LIMIT,
                    message: format!(
                        "{} quota has reached the allowable limit of {unit}. Limit is {} {unit}, \
                         currently {} {unit} allocated and workload requested {} {unit}",
                        q.name,
                        fmt(q.limit[r], r),
                        fmt(q.allocated[r], r),
                        fmt(request[r], r)
                    ),
                });
            }
        }
    }
    if !sess.jobs[job].preemptible {
        return check_non_preemptible(sess, job, request);
    }
    None
}

pub fn check_non_preemptible(
    sess: &Session,
    job: usize,
    request: Amounts,
) -> Option<CapacityError> {
    for &q in sess.queues.path(sess.jobs[job].queue_id) {
        let q = &sess.queues[q];
        for r in [2, 0, 1] {
            if q.deserved[r] == -1.0 || request[r] <= 0.0 {
                continue;
            }
            if q.allocated_np[r] + request[r] > q.deserved[r] + 1e-9 {
                let unit = NAMES[r];
                return Some(CapacityError {
                    reason: NON_PREEMPTIBLE_OVER_QUOTA,
                    message: format!(
                        "Non-preemptible workload is over quota. Workload requested {} {unit}, \
                         but {} quota is {} {unit}, while {} {unit} are already allocated for \
                         non-preemptible pods. Use a preemptible workload to go over quota.",
                        fmt(request[r], r),
                        q.name,
                        fmt(q.deserved[r], r),
                        fmt(q.allocated_np[r], r)
                    ),
                });
            }
        }
    }
    None
}
