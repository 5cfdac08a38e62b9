//! reclaim: a queue below its fair share takes resources back from queues above theirs
//! (kai_ray/core/actions/reclaim.py).

use crate::accounting::leq;
use crate::actions::allocate::schedulable_jobs;
use crate::actions::runtime::{protected, Kind};
use crate::actions::solver::{FailedJobs, Rules, Solver, VictimCache};
use crate::model::Amounts;
use crate::ordering::{job_request, Items, JobQueue};
use crate::state::{EvictMessage, Session};

fn can_reclaim(sess: &Session, job: usize, request: Amounts) -> bool {
    let q = &sess.queues[sess.jobs[job].queue_id.expect("a leaf queue")];
    let with_job =
        [q.allocated[0] + request[0], q.allocated[1] + request[1], q.allocated[2] + request[2]];
    if !leq(&with_job, &q.fair_share) {
        return false;
    }
    if sess.jobs[job].preemptible {
        return true;
    }
    let np_with = [
        q.allocated_np[0] + request[0],
        q.allocated_np[1] + request[1],
        q.allocated_np[2] + request[2],
    ];
    leq(&np_with, &q.deserved)
}

/// Queue numbers frozen when the job's attempt starts (KAI clones its queue attributes).
struct Reclaim {
    job: usize,
    request: Amounts,
    allocated: Vec<Amounts>,
    allocated_np: Vec<Amounts>,
}

/// The reclaimer's and the victim's queues at the level where their paths part.
fn leveled(sess: &Session, reclaimer: usize, victim: usize) -> (usize, usize) {
    let a: Vec<usize> = sess.queues.paths[reclaimer].iter().rev().copied().collect();
    let b: Vec<usize> = sess.queues.paths[victim].iter().rev().copied().collect();
    let (mut ra, mut rb) = (a[0], b[0]);
    for i in 0..a.len().min(b.len()) {
        ra = a[i];
        rb = b[i];
        if ra != rb {
            break;
        }
    }
    (ra, rb)
}

fn involved(amount: &Amounts) -> u8 {
    (0..3).filter(|&r| amount[r] > 0.0).fold(0, |bits, r| bits | (1 << r))
}

fn ratio(allocated: f64, fair: f64) -> f64 {
    if fair == 0.0 {
        return if allocated > 0.0 { f64::INFINITY } else { 0.0 };
    }
    if fair == -1.0 {
        return 0.0;
    }
    allocated / fair
}

impl Reclaim {
    fn fits_strategy(&self, sess: &Session, rq: usize, vq: usize, remaining: &Amounts) -> bool {
        let v = &sess.queues[vq];
        let allocatable = [v.allocatable(0), v.allocatable(1), v.allocatable(2)];
        if !leq(remaining, &allocatable) {
            return true; // MaintainFairShare: the victim side is still above its share
        }
        let mine = &self.allocated[rq];
        let reclaimer_with =
            [mine[0] + self.request[0], mine[1] + self.request[1], mine[2] + self.request[2]];
        leq(&reclaimer_with, &sess.queues[rq].deserved) && !leq(remaining, &v.deserved)
    }

    /// KAI's reclaim validation on the queue numbers frozen at the attempt's start: whether the
    /// victims may be taken.
    fn reclaimable(&self, sess: &Session, evicted: &[usize]) -> bool {
        let job = self.job;
        let request = self.request;
        let own = sess.jobs[job].queue_id.expect("a leaf queue");
        // per victim queue, its chunks (in the order first seen)
        let mut chunks_by_queue: Vec<(usize, Vec<Amounts>)> = Vec::new();
        let mut victim_jobs: Vec<usize> = Vec::new();
        for &t in evicted {
            let j = sess.tasks[t].job;
            if !victim_jobs.contains(&j) {
                victim_jobs.push(j);
            }
        }
        for victim_job in victim_jobs {
            let tasks: Vec<usize> =
                evicted.iter().copied().filter(|&t| sess.tasks[t].job == victim_job).collect();
            let vq = sess.jobs[victim_job].queue_id.expect("victims' queues exist");
            let at = match chunks_by_queue.iter().position(|(q, _)| *q == vq) {
                Some(at) => at,
                None => {
                    chunks_by_queue.push((vq, Vec::new()));
                    chunks_by_queue.len() - 1
                }
            };
            let mut core = [0.0; 3];
            let mut has_core = false;
            for ps in &sess.jobs[victim_job].podsets {
                let in_set: Vec<usize> =
                    tasks.iter().copied().filter(|t| ps.tasks.contains(t)).collect();
                for (i, &t) in in_set.iter().enumerate() {
                    let amount = sess.cluster.queue_amount(&sess.tasks[t]);
                    if (i as i64) < ps.min_member {
                        core = [core[0] + amount[0], core[1] + amount[1], core[2] + amount[2]];
                        has_core = true;
                    } else {
                        chunks_by_queue[at].1.push(amount);
                    }
                }
            }
            if has_core {
                chunks_by_queue[at].1.push(core);
            }
        }
        let mut remaining: Vec<(usize, Amounts)> = Vec::new();
        let mut involved_in: Vec<(usize, u8)> = Vec::new();
        fn slot<T: Copy>(list: &mut Vec<(usize, T)>, key: usize, init: T) -> usize {
            match list.iter().position(|(k, _)| *k == key) {
                Some(at) => at,
                None => {
                    list.push((key, init));
                    list.len() - 1
                }
            }
        }
        for (victim_queue, chunks) in &chunks_by_queue {
            let (rq, vq) = leveled(sess, own, *victim_queue);
            let bits = chunks.iter().fold(0u8, |b, c| b | involved(c));
            let at = slot(&mut involved_in, *victim_queue, 0);
            involved_in[at].1 = bits;
            slot(&mut remaining, vq, self.allocated[vq]);
            for chunk in chunks {
                let rem =
                    remaining.iter().find(|(k, _)| *k == vq).map(|(_, v)| *v).expect("remaining");
                if !self.fits_strategy(sess, rq, vq, &rem) {
                    return false;
                }
                for &q in &sess.queues.paths[*victim_queue] {
                    let at = slot(&mut remaining, q, self.allocated[q]);
                    let left = &mut remaining[at].1;
                    for r in 0..3 {
                        left[r] -= chunk[r];
                    }
                    let at = slot(&mut involved_in, q, 0);
                    involved_in[at].1 |= bits;
                }
            }
        }
        let reclaimer_involved = involved(&request);
        let mult = sess.config.reclaimer_saturation_multiplier;
        for &q in &sess.queues.paths[own] {
            let qs = &sess.queues[q];
            let base =
                remaining.iter().find(|(k, _)| *k == q).map_or(self.allocated[q], |(_, v)| *v);
            let with_request = [base[0] + request[0], base[1] + request[1], base[2] + request[2]];
            for &(sib_id, sib_left) in &remaining {
                let sib = &sess.queues[sib_id];
                // the parents' names, as the Python compares them ("" and none differ here)
                if sib.parent != qs.parent || sib_id == q {
                    continue;
                }
                let bits = involved_in.iter().find(|(k, _)| *k == sib_id).map_or(0, |(_, b)| *b)
                    | reclaimer_involved;
                for r in 0..3 {
                    if bits & (1 << r) == 0 {
                        continue;
                    }
                    if qs.fair_share[r] == -1.0 && sib.fair_share[r] == -1.0 {
                        continue;
                    }
                    let mine_ratio = ratio(with_request[r], qs.fair_share[r]);
                    let sib_ratio = ratio(sib_left[r], sib.fair_share[r]);
                    if mine_ratio > 1.0 && sib.fair_share[r] > 0.0 && mine_ratio * mult >= sib_ratio
                    {
                        return false;
                    }
                }
            }
            if !sess.jobs[job].preemptible {
                let np = &self.allocated_np[q];
                let np_with = [np[0] + request[0], np[1] + request[1], np[2] + request[2]];
                if !leq(&np_with, &qs.deserved) {
                    return false;
                }
            }
        }
        true
    }
}

impl Rules for Reclaim {
    fn action(&self) -> &'static str {
        "reclaim"
    }

    fn message(&self) -> EvictMessage {
        EvictMessage::Reclaim
    }

    fn candidates(&self, sess: &mut Session) -> Vec<usize> {
        (0..sess.jobs.len()).filter(|&v| self.is_candidate(sess, v)).collect()
    }

    fn is_candidate(&self, sess: &Session, v: usize) -> bool {
        let js = &sess.jobs[v];
        js.preemptible
            && js.queue_key != sess.jobs[self.job].queue_key
            && js.queue_id.is_some()
            && !protected(sess, v, Kind::Reclaim)
    }

    fn validate(&self, sess: &Session, evicted: &[usize], moved: &[usize]) -> bool {
        if sess.config.allow_consolidating_reclaim {
            self.reclaimable(sess, evicted)
        } else {
            let mut counted = evicted.to_vec();
            counted.extend_from_slice(moved);
            self.reclaimable(sess, &counted)
        }
    }
}

pub fn run(sess: &mut Session) {
    let mut failed = FailedJobs::default();
    let mut cache = VictimCache::default();
    let jobs = schedulable_jobs(sess);
    let mut queue = JobQueue::new(sess, Items::Jobs, &jobs, false, false);
    while let Some(job) = queue.pop(sess) {
        let scope = sess.jobs[job].queue_key;
        if failed.should_skip(sess, job, scope) {
            continue;
        }
        if sess.tasks_to_allocate(job, false).is_empty() {
            continue;
        }
        let request = job_request(sess, job, false);
        if !can_reclaim(sess, job, request) {
            continue;
        }
        let rules = Reclaim {
            job,
            request,
            allocated: sess.queues.iter().map(|q| q.allocated).collect(),
            allocated_np: sess.queues.iter().map(|q| q.allocated_np).collect(),
        };
        let mut solver = Solver::new(&rules, Some((scope, i64::MIN)));
        // a job that got room is not tried again this action (KAI: only allocate pushes a job
        // with tasks left back into its queue)
        if !solver.solve(sess, &mut cache, job) {
            failed.record(sess, job, scope);
        }
    }
}
