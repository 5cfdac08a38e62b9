//! Hierarchical fair share, resource by resource, as KAI's proportion plugin divides it
//! (kai_ray/core/fairshare.py): deserved quota first, then the surplus by over-quota weight in
//! priority buckets, in rounds that floor each portion; fractional leftovers last.

use std::cmp::Ordering;

const UNLIMITED: f64 = -1.0;

/// One queue's numbers for one resource.
#[derive(Clone, Debug)]
pub struct ShareInput {
    pub name: String,
    pub deserved: f64,
    pub limit: f64,
    pub weight: f64,
    pub request: f64,
    pub priority: i64,
    pub created: f64,
    pub usage: f64,
    pub fair_share: f64,
    pub children: Vec<usize>,
}

impl ShareInput {
    fn requestable(&self) -> f64 {
        if self.limit == UNLIMITED || self.request < self.limit {
            self.request
        } else {
            self.limit
        }
    }

    fn satisfied(&self) -> bool {
        if self.request <= self.fair_share {
            return true;
        }
        self.limit != UNLIMITED && self.limit <= self.fair_share
    }

    fn remaining_request(&self) -> f64 {
        let left = self.requestable() - self.fair_share;
        if left > 0.0 {
            left
        } else {
            0.0
        }
    }
}

/// Set fair_share on `queues` (siblings sharing `total`, indices into `all`) and recurse.
/// Returns the unassigned.
pub fn divide(total: f64, queues: &[usize], all: &mut [ShareInput], k_value: f64) -> f64 {
    let mut remaining = give_deserved(total, queues, all);
    remaining =
        if remaining > 0.0 { divide_over_quota(remaining, queues, all, k_value) } else { 0.0 };
    for &q in queues {
        if !all[q].children.is_empty() {
            let children = all[q].children.clone();
            divide(all[q].fair_share, &children, all, k_value);
        }
    }
    remaining
}

fn give_deserved(total: f64, queues: &[usize], all: &mut [ShareInput]) -> f64 {
    let mut remaining = total;
    for &q in queues {
        let deserved = if all[q].deserved == UNLIMITED { total } else { all[q].deserved };
        let requestable = all[q].requestable();
        let amount = if requestable < deserved { requestable } else { deserved };
        all[q].fair_share += amount;
        remaining -= amount;
    }
    remaining
}

fn divide_over_quota(total: f64, queues: &[usize], all: &mut [ShareInput], k_value: f64) -> f64 {
    let mut priorities: Vec<i64> = queues.iter().map(|&q| all[q].priority).collect();
    priorities.sort_by(|a, b| b.cmp(a));
    priorities.dedup();
    // per priority: (leftover, queue) in the order the Python dict holds them
    let mut leftovers: Vec<(i64, Vec<(usize, f64)>)> = Vec::new();
    let mut remaining = total;
    for &prio in &priorities {
        let bucket: Vec<usize> =
            queues.iter().copied().filter(|&q| all[q].priority == prio).collect();
        let (left, bucket_leftovers) = divide_rounds(remaining, &bucket, all, k_value);
        remaining = left;
        let entry = match leftovers.iter().position(|(p, _)| *p == prio) {
            Some(at) => at,
            None => {
                leftovers.push((prio, Vec::new()));
                leftovers.len() - 1
            }
        };
        for (q, amount) in bucket_leftovers {
            let list = &mut leftovers[entry].1;
            match list.iter().position(|(name, _)| *name == q) {
                Some(at) => list[at].1 = amount,
                None => list.push((q, amount)),
            }
        }
    }
    for &prio in &priorities {
        if remaining <= 0.0 {
            break;
        }
        let mut ordered: Vec<(usize, f64)> =
            leftovers.iter().find(|(p, _)| *p == prio).map(|(_, l)| l.clone()).unwrap_or_default();
        ordered.sort_by(|a, b| {
            (-a.1)
                .partial_cmp(&-b.1)
                .unwrap_or(Ordering::Equal)
                .then_with(|| {
                    all[a.0].created.partial_cmp(&all[b.0].created).unwrap_or(Ordering::Equal)
                })
                .then_with(|| all[a.0].name.cmp(&all[b.0].name))
        });
        for (q, _) in ordered {
            if remaining == 0.0 {
                break;
            }
            let chunk = if remaining < 1.0 { remaining } else { 1.0 };
            all[q].fair_share += chunk;
            remaining -= chunk;
        }
    }
    remaining
}

fn divide_rounds(
    total: f64,
    queues: &[usize],
    all: &mut [ShareInput],
    k_value: f64,
) -> (f64, Vec<(usize, f64)>) {
    let mut total = total;
    // (queue, leftover) in dict order: a key popped and set again goes to the end
    let mut leftovers: Vec<(usize, f64)> = Vec::new();
    loop {
        let weights = share_weights(queues, all, k_value);
        let mut weight_sum = 0.0;
        for &(_, w) in &weights {
            weight_sum += w;
        }
        if weight_sum == 0.0 {
            break;
        }
        let amount_this_round = total;
        let mut another_round = false;
        // Go iterates a map here; sorting by name keeps us deterministic
        let mut by_name: Vec<usize> = queues.to_vec();
        by_name.sort_by(|&a, &b| all[a].name.cmp(&all[b].name));
        for q in by_name {
            if total == 0.0 {
                break;
            }
            if all[q].satisfied() || all[q].weight == 0.0 {
                continue;
            }
            let need = all[q].remaining_request();
            let weight = weights.iter().find(|(w, _)| *w == q).map_or(0.0, |(_, w)| *w);
            let portion = amount_this_round * weight / weight_sum;
            let mut give = 0.0;
            if need <= portion {
                give = need;
                leftovers.retain(|(l, _)| *l != q);
            } else {
                let floored = portion.floor();
                if floored > 0.0 {
                    give = floored;
                }
                if portion - give > 0.0 {
                    match leftovers.iter().position(|(l, _)| *l == q) {
                        Some(at) => leftovers[at].1 = portion - give,
                        None => leftovers.push((q, portion - give)),
                    }
                }
            }
            if give == 0.0 {
                continue;
            }
            all[q].fair_share += give;
            total -= give;
            another_round = another_round || need < portion;
        }
        if !another_round || total == 0.0 {
            break;
        }
    }
    (total, leftovers)
}

fn share_weights(queues: &[usize], all: &[ShareInput], k_value: f64) -> Vec<(usize, f64)> {
    let mut total_weight = 0.0;
    for &q in queues {
        if all[q].remaining_request() > 0.0 {
            total_weight += all[q].weight;
        }
    }
    if total_weight == 0.0 {
        return Vec::new();
    }
    let mut weights = Vec::new();
    for &q in queues {
        if all[q].satisfied() {
            continue;
        }
        let normalized = all[q].weight / total_weight;
        let w = normalized + k_value * (normalized - all[q].usage);
        weights.push((q, if w > 0.0 { w } else { 0.0 }));
    }
    weights
}
