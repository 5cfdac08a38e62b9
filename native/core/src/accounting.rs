//! The queues' accounting for one session (kai_ray/core/accounting.py): the queue tree as the
//! snapshot gives it (less the queues on a parent cycle or under a missing parent) and what
//! each queue is charged. Which decisions charge or take back a task is the Statement's
//! (statement.rs); a task's amounts are its node's business (`ClusterState::queue_amount`).

use std::cmp::Ordering;
use std::ops::{Index, IndexMut};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::jobs::JobState;
use crate::model::{Amounts, Queue, Request, MILLI, MIN_NODE_GPU_MEMORY_MIB};
use crate::queuetree::excluded_queues;

#[derive(Clone, Debug)]
pub struct QueueState {
    pub name: String,
    /// as given ("" is kept, and is no parent: `parent_id` is None)
    pub parent: Option<String>,
    pub parent_id: Option<usize>,
    pub priority: i64,
    pub created: f64,
    pub deserved: Amounts,
    pub limit: Amounts,
    pub weight: Amounts,
    pub fair_share: Amounts,
    pub allocated: Amounts,
    pub allocated_np: Amounts,
    pub request: Amounts,
    pub children: Vec<usize>,
    pub preempt_min_runtime: Option<f64>,
    pub reclaim_min_runtime: Option<f64>,
}

impl QueueState {
    pub fn allocatable(&self, r: usize) -> f64 {
        if self.deserved[r] == -1.0 {
            return self.limit[r];
        }
        let mut value = py_max(self.deserved[r], self.fair_share[r]);
        if self.limit[r] != -1.0 {
            value = py_min(self.limit[r], value);
        }
        value
    }
}

/// Python's max(a, b) on floats: the first unless the second is greater.
pub fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// Python's min(a, b) on floats: the first unless the second is smaller.
pub fn py_min(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

pub fn add3(amounts: &mut Amounts, cpu: f64, memory: f64, gpu: f64) {
    // a zero is not added (x + 0.0 is x; the sums are never -0.0), as the Python does
    if cpu != 0.0 {
        amounts[0] += cpu;
    }
    if memory != 0.0 {
        amounts[1] += memory;
    }
    if gpu != 0.0 {
        amounts[2] += gpu;
    }
}

/// KAI's LessEqual over resources, where -1 is infinite.
pub fn leq(a: &[f64], b: &[f64]) -> bool {
    for i in 0..a.len() {
        let (x, y) = (a[i], b[i]);
        if x == -1.0 {
            if y != -1.0 {
                return false;
            }
            continue;
        }
        if y == -1.0 {
            continue;
        }
        if x > y + 1e-9 {
            return false;
        }
    }
    true
}

/// What a pending task asks of its queue (not placed yet: a gpu-memory request counts against
/// KAI's smallest node GPU memory).
pub fn pending_queue_amount(req: &Request) -> Amounts {
    let gpu = if req.gpus != 0 {
        req.gpus as f64
    } else if req.gpu_fraction_milli != 0 {
        req.gpu_fraction_milli as f64 / MILLI as f64 * req.fraction_devices as f64
    } else if req.gpu_memory_mib != 0 {
        (req.fraction_devices * req.gpu_memory_mib) as f64 / MIN_NODE_GPU_MEMORY_MIB as f64
    } else {
        0.0
    };
    [req.cpu_m as f64, req.memory as f64, gpu]
}

/// The session's queues by index (`sess.queues[q]`), with the tree's paths and what each
/// queue is charged.
pub struct QueueAccounting {
    queues: Vec<QueueState>,
    pub queue_index: FxHashMap<String, usize>,
    /// the queues left out for a parent cycle (on one or under one) -> their jobs' message
    pub excluded_queues: FxHashMap<String, String>,
    /// per queue, leaf first, root last
    pub paths: Vec<Vec<usize>>,
    roots: Vec<usize>,
}

impl Index<usize> for QueueAccounting {
    type Output = QueueState;

    fn index(&self, q: usize) -> &QueueState {
        &self.queues[q]
    }
}

impl IndexMut<usize> for QueueAccounting {
    fn index_mut(&mut self, q: usize) -> &mut QueueState {
        &mut self.queues[q]
    }
}

impl QueueAccounting {
    pub fn new(snap_queues: Vec<Queue>) -> QueueAccounting {
        // as the Python dict has them: a later queue of a name replaces the earlier one, at its
        // place; then the queues on a parent cycle, then orphans (parent missing), are removed
        // with all their descendants
        let mut order: Vec<Queue> = Vec::new();
        let mut at: FxHashMap<String, usize> = FxHashMap::default();
        for q in snap_queues {
            if let Some(&i) = at.get(&q.name) {
                order[i] = q;
            } else {
                at.insert(q.name.clone(), order.len());
                order.push(q);
            }
        }
        let links: Vec<(&str, &str)> =
            order.iter().map(|q| (q.name.as_str(), q.parent.as_deref().unwrap_or(""))).collect();
        let excluded = excluded_queues(&links);
        order.retain(|q| !excluded.contains_key(&q.name));
        loop {
            let names: FxHashSet<String> = order.iter().map(|q| q.name.clone()).collect();
            let before = order.len();
            order.retain(|q| match &q.parent {
                Some(p) if !p.is_empty() => names.contains(p),
                _ => true,
            });
            if order.len() == before {
                break;
            }
        }
        let mut queues: Vec<QueueState> = Vec::with_capacity(order.len());
        let mut queue_index = FxHashMap::default();
        for q in order {
            let mem_q =
                if q.memory.quota != -1.0 { py_max(-1.0, q.memory.quota * 1e6) } else { -1.0 };
            let mem_l =
                if q.memory.limit != -1.0 { py_max(-1.0, q.memory.limit * 1e6) } else { -1.0 };
            queue_index.insert(q.name.clone(), queues.len());
            queues.push(QueueState {
                name: q.name,
                parent: q.parent,
                parent_id: None,
                priority: q.priority,
                created: q.created,
                deserved: [q.cpu.quota, mem_q, q.gpu.quota],
                limit: [q.cpu.limit, mem_l, q.gpu.limit],
                weight: [q.cpu.weight, q.memory.weight, q.gpu.weight],
                fair_share: [0.0; 3],
                allocated: [0.0; 3],
                allocated_np: [0.0; 3],
                request: [0.0; 3],
                children: Vec::new(),
                preempt_min_runtime: q.preempt_min_runtime_s,
                reclaim_min_runtime: q.reclaim_min_runtime_s,
            });
        }
        for i in 0..queues.len() {
            // an empty parent is none: the queue is a root (reported with its "" though)
            if let Some(parent) = queues[i].parent.clone().filter(|p| !p.is_empty()) {
                let p = queue_index[&parent];
                queues[i].parent_id = Some(p);
                queues[p].children.push(i);
            }
        }
        for i in 0..queues.len() {
            let mut children = std::mem::take(&mut queues[i].children);
            children.sort_by(|&a, &b| {
                let (qa, qb) = (&queues[a], &queues[b]);
                qa.created
                    .partial_cmp(&qb.created)
                    .unwrap_or(Ordering::Equal)
                    .then_with(|| qa.name.cmp(&qb.name))
            });
            queues[i].children = children;
        }
        let n = queues.len();
        let paths = (0..n)
            .map(|i| {
                let mut walk = vec![i];
                let mut q = queues[i].parent_id;
                // ends: the queues on parent cycles were removed above
                while let Some(p) = q {
                    walk.push(p);
                    q = queues[p].parent_id;
                }
                walk
            })
            .collect();
        let mut roots: Vec<usize> = (0..n).filter(|&i| queues[i].parent_id.is_none()).collect();
        roots.sort_by(|&a, &b| queues[a].name.cmp(&queues[b].name));
        QueueAccounting { queues, queue_index, excluded_queues: excluded, paths, roots }
    }

    pub fn len(&self) -> usize {
        self.queues.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, QueueState> {
        self.queues.iter()
    }

    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, QueueState> {
        self.queues.iter_mut()
    }

    /// The roots of the tree, by name.
    pub fn roots(&self) -> &[usize] {
        &self.roots
    }

    pub fn is_leaf(&self, queue: Option<usize>) -> bool {
        queue.is_some_and(|q| self.queues[q].children.is_empty())
    }

    /// Leaf first, root last; empty for a queue that does not exist.
    pub fn path(&self, queue: Option<usize>) -> &[usize] {
        match queue {
            Some(q) => &self.paths[q],
            None => &[],
        }
    }

    /// Add (sign 1) or take back (-1) an allocated task's amounts along its job's path; a
    /// non-preemptible job's are counted apart too (KAI's non-preemptible quota rule).
    pub fn charge(&mut self, job: &JobState, amounts: Amounts, sign: f64) {
        let Some(q) = job.queue_id else { return };
        let [mut cpu, mut memory, mut gpu] = amounts;
        if sign < 0.0 {
            cpu = -cpu;
            memory = -memory;
            gpu = -gpu;
        }
        let np_job = !job.preemptible;
        for &p in &self.paths[q] {
            let qs = &mut self.queues[p];
            add3(&mut qs.allocated, cpu, memory, gpu);
            if np_job {
                add3(&mut qs.allocated_np, cpu, memory, gpu);
            }
        }
    }

    /// A snapshot's task in its queues' numbers: its request, and its allocation when it
    /// holds resources (`allocated`).
    pub fn load(&mut self, job: &JobState, amounts: Amounts, allocated: bool) {
        let Some(q) = job.queue_id else { return };
        let [cpu, memory, gpu] = amounts;
        let np_job = !job.preemptible;
        for &p in &self.paths[q] {
            let qs = &mut self.queues[p];
            if allocated {
                add3(&mut qs.allocated, cpu, memory, gpu);
            }
            add3(&mut qs.request, cpu, memory, gpu);
            if allocated && np_job {
                add3(&mut qs.allocated_np, cpu, memory, gpu);
            }
        }
    }
}
