//! Victim units (kai_ray/core/actions/victims.py): what of a victim job is still there to take,
//! and in which pieces (KAI clones the victim job with those tasks). Units live in the
//! session's arena (`Session::units`) and are never changed once built.

use std::cmp::Ordering;

use crate::jobs::cmp_task;
use crate::model::PodStatus;
use crate::state::{Session, VictimUnit};

fn victim_state(s: PodStatus) -> bool {
    matches!(s, PodStatus::Allocated | PodStatus::Binding | PodStatus::Bound | PodStatus::Running)
}

/// Build a unit of `tasks` of `job` in the arena; its id.
pub fn new_unit(sess: &mut Session, job: usize, tasks: Vec<usize>) -> usize {
    let js = &sess.jobs[job];
    let by_set: Vec<Vec<usize>> = if !js.uses_subgroups {
        vec![tasks.clone()] // the one podset (most jobs)
    } else {
        let default = js.podset("default");
        let mut sets = vec![Vec::new(); js.podsets.len()];
        for &t in &tasks {
            if let Some(p) = js.podset(&sess.tasks[t].subgroup).or(default) {
                sets[p].push(t);
            }
        }
        sets
    };
    let mut at_min = true;
    let mut rank = -1;
    for (p, ps) in js.podsets.iter().enumerate() {
        let count = by_set[p].len() as i64;
        if count < ps.min_member {
            rank = 0;
            break;
        }
        if count > ps.min_member {
            at_min = false;
        }
    }
    if rank < 0 {
        rank = if at_min { 1 } else { 2 };
    }
    let id = sess.units.len();
    sess.units.push(VictimUnit { job, tasks, by_set, rank, number: -1 });
    id
}

/// Tasks to evict next: one extra task of a podset above its minimum (with the other hosts of
/// its replica: a replica is never split), else all. The rest's tasks, if any.
pub fn take(sess: &Session, unit: usize) -> (Vec<usize>, Option<Vec<usize>>) {
    let u = &sess.units[unit];
    if u.tasks.len() == 1 {
        return (u.tasks.clone(), None); // taking its one task leaves nothing either way
    }
    let js = &sess.jobs[u.job];
    let mut best: Option<usize> = None;
    for (p, ts) in u.by_set.iter().enumerate() {
        let ps = &js.podsets[p];
        if ts.len() as i64 <= ps.min_member {
            continue;
        }
        best = match best {
            None => Some(p),
            Some(b) => {
                // a minimum of 0 (an all-elastic podset) counts as 1
                let ratio = ts.len() as f64 / ps.min_member.max(1) as f64;
                let best_ratio = u.by_set[b].len() as f64 / js.podsets[b].min_member.max(1) as f64;
                let better = match ratio.partial_cmp(&best_ratio).unwrap_or(Ordering::Equal) {
                    Ordering::Greater => true,
                    Ordering::Less => false,
                    Ordering::Equal => ps.name > js.podsets[b].name,
                };
                if better {
                    Some(p)
                } else {
                    Some(b)
                }
            }
        };
    }
    let Some(p) = best else { return (u.tasks.clone(), None) };
    let ts = &u.by_set[p];
    let mut victim = ts[0];
    for &t in &ts[1..] {
        if cmp_task(&sess.tasks[t], &sess.tasks[victim]) == Ordering::Greater {
            victim = t;
        }
    }
    let taken: Vec<usize> = match &sess.tasks[victim].replica {
        None => vec![victim],
        Some(r) => {
            ts.iter().copied().filter(|&t| sess.tasks[t].replica.as_ref() == Some(r)).collect()
        }
    };
    let rest: Vec<usize> = u.tasks.iter().copied().filter(|t| !taken.contains(t)).collect();
    (taken, if rest.is_empty() { None } else { Some(rest) })
}

/// `take` when the tasks in `recorded` are already victims: if the next take would touch one,
/// nothing is taken and what is left is the unit without them (its tasks).
pub fn take_unrecorded(
    sess: &Session,
    unit: usize,
    recorded: &rustc_hash::FxHashSet<usize>,
) -> (Vec<usize>, Option<Vec<usize>>) {
    let (taken, rest) = take(sess, unit);
    if !taken.iter().any(|t| recorded.contains(t)) {
        return (taken, rest);
    }
    let remaining: Vec<usize> =
        sess.units[unit].tasks.iter().copied().filter(|t| !recorded.contains(t)).collect();
    (Vec::new(), if remaining.is_empty() { None } else { Some(remaining) })
}

/// The victim tasks of a job: pods placed when the cycle began, and pods pipelined in this
/// cycle (KAI's active-allocated pods: a pipelined pod taken back is not bound, it stays
/// pending). A pod allocated in this cycle is not: it is bound when the cycle ends, and taking it
/// back would split its gang's first bind or evict what was just bound (KAI binds and evicts it).
pub fn unit_tasks(sess: &Session, job: usize) -> Vec<usize> {
    sess.jobs[job]
        .tasks
        .iter()
        .copied()
        .filter(|&t| {
            let task = &sess.tasks[t];
            task.status == PodStatus::Pipelined
                || (victim_state(task.status)
                    && task.moved.is_none()
                    && victim_state(task.orig_status))
        })
        .collect()
}

/// `unit_of(job)`: a new unit of the job's victim tasks, None when it has none.
pub fn unit_of(sess: &mut Session, job: usize) -> Option<usize> {
    let tasks = unit_tasks(sess, job);
    if tasks.is_empty() {
        None
    } else {
        Some(new_unit(sess, job, tasks))
    }
}

/// Victim candidates of `jobs`.
pub fn victim_units(sess: &mut Session, jobs: &[usize]) -> Vec<usize> {
    jobs.iter().filter_map(|&j| unit_of(sess, j)).collect()
}
