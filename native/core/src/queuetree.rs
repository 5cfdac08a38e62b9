//! Parent cycles in the queue tree (kai_ray/core/queuetree.py): a queue whose parent chain comes
//! back to it never reaches a root, so the session leaves it out with every queue under it, and
//! their jobs stay pending with reason `QueueParentCycle` and the same message as the Python's.

use rustc_hash::FxHashMap;

pub const QUEUE_PARENT_CYCLE: &str = "QueueParentCycle";

const WAIT: &str = ": left out of the queue tree until a spec.parentQueue on the cycle changes";

/// Each queue the session leaves out for a parent cycle (on one, or under one) -> why, as its
/// jobs' pending message says it. `queues`: (name, parent) with unique names, "" for a root.
pub fn excluded_queues(queues: &[(&str, &str)]) -> FxHashMap<String, String> {
    let n = queues.len();
    let index: FxHashMap<&str, usize> =
        queues.iter().enumerate().map(|(i, &(name, _))| (name, i)).collect();
    // None: a root or a missing parent (an orphan, which the session removes on its own)
    let up: Vec<Option<usize>> = queues
        .iter()
        .map(|&(_, p)| if p.is_empty() { None } else { index.get(p).copied() })
        .collect();

    // each queue on a cycle -> the cycle from it on, parent after parent
    let mut cycle: Vec<Option<Vec<usize>>> = vec![None; n];
    let mut done = vec![false; n];
    let mut on_walk: Vec<Option<usize>> = vec![None; n];
    for start in 0..n {
        // up to a root, a missing parent, a queue walked before, or one of this walk: a cycle
        let mut walk = Vec::new();
        let mut at = Some(start);
        while let Some(q) = at {
            if done[q] || on_walk[q].is_some() {
                break;
            }
            on_walk[q] = Some(walk.len());
            walk.push(q);
            at = up[q];
        }
        if let Some(first) = at.and_then(|q| on_walk[q]) {
            let ring = &walk[first..];
            for i in 0..ring.len() {
                let mut from_here = ring[i..].to_vec();
                from_here.extend_from_slice(&ring[..i]);
                cycle[ring[i]] = Some(from_here);
            }
        }
        for &q in &walk {
            done[q] = true;
            on_walk[q] = None;
        }
    }

    // each queue off the cycles -> the first cycle queue its chain reaches (Some(None): none)
    let mut reaches: Vec<Option<Option<usize>>> = vec![None; n];
    for start in 0..n {
        let mut walk = Vec::new();
        let mut at = Some(start);
        while let Some(q) = at {
            if cycle[q].is_some() || reaches[q].is_some() {
                break;
            }
            walk.push(q);
            at = up[q];
        }
        let top = match at {
            Some(q) if cycle[q].is_some() => Some(q),
            Some(q) => reaches[q].flatten(),
            None => None,
        };
        for q in walk {
            reaches[q] = Some(top);
        }
    }

    let chain = |ring: &[usize]| -> String {
        let mut names: Vec<&str> = ring.iter().map(|&q| queues[q].0).collect();
        names.push(queues[ring[0]].0);
        names.join(" -> ")
    };
    let mut out = FxHashMap::default();
    for q in 0..n {
        let name = queues[q].0;
        if let Some(ring) = &cycle[q] {
            let message = format!("Queue '{name}' is on a parent cycle ({}){WAIT}", chain(ring));
            out.insert(name.to_string(), message);
        } else if let Some(Some(top)) = reaches[q] {
            if let Some(ring) = &cycle[top] {
                let message = format!(
                    "Queue '{name}' is under queue '{}', which is on a parent cycle ({}){WAIT}",
                    queues[top].0,
                    chain(ring)
                );
                out.insert(name.to_string(), message);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_and_what_hangs_under_them_are_left_out() {
        let queues = [
            ("self", "self"),
            ("a", "b"),
            ("b", "a"),
            ("c", "d"),
            ("d", "e"),
            ("e", "c"),
            ("kid", "c"),
            ("grand", "kid"),
            ("root", ""),
            ("leaf", "root"),
            ("orphan", "gone"),
        ];
        let out = excluded_queues(&queues);
        let mut names: Vec<&str> = out.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, ["a", "b", "c", "d", "e", "grand", "kid", "self"]);
        assert!(out["self"].contains("(self -> self)"));
        assert!(out["b"].contains("(b -> a -> b)"));
        assert!(out["grand"].starts_with("Queue 'grand' is under queue 'c'"));
        assert!(out["grand"].contains("(c -> d -> e -> c)"));
    }
}
