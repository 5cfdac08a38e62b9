//! Choosing a node (and GPU devices) for one task (kai_ray/core/placement.py): predicates and
//! scores as KAI's plugins have them. A GPU task first looks up the nodes with GPU room in the
//! session's index: a few are checked one by one, many are walked in binpack order; the pass
//! over every node decides otherwise. Only the pass is in the Python specification; the index
//! and the walks are this core's speed paths (docs/native-core.md).

use crate::cluster::{Group, NodeMasks};
use crate::constraints::{affinity_matches, untolerated, Taint};
use crate::model::{GpuPacking, MILLI};
use crate::packing;
use crate::state::Session;

pub const R_GPU: &str = "didn't have enough resources: GPUs";
pub const R_GPU_MEM: &str = "didn't have enough resources: GPU memory";
pub const R_CPU: &str = "didn't have enough resources: CPU cores";
pub const R_MEM: &str = "didn't have enough resources: memory";
pub const R_PODS: &str = "pod number exceeded";
pub const R_UNSCHED: &str = "were unschedulable";
pub const R_SELECTOR: &str = "didn't match Pod's node affinity/selector";

/// At most this many candidate nodes are checked one by one rather than all of them.
const FEW: usize = 48;

/// Where a task goes.
#[derive(Clone, Debug)]
pub struct Choice {
    pub node: i32,
    pub groups: Vec<u32>,
    pub new_groups: Vec<u32>,
    pub on_idle: bool,
}

/// Failed-predicate histogram: (reason, node count), in the order first seen.
pub type Reasons = Vec<(String, i64)>;

fn add_reason(reasons: &mut Reasons, reason: &str, count: i64) {
    match reasons.iter_mut().find(|(r, _)| r == reason) {
        Some(entry) => entry.1 += count,
        None => reasons.push((reason.to_string(), count)),
    }
}

/// The constraint's node masks, made on first use.
pub fn masks(sess: &mut Session, constraints: usize) -> &NodeMasks {
    if sess.masks[constraints].is_none() {
        let c = &sess.constraints[constraints];
        let selector = if c.node_selector.is_empty() && c.node_affinity.is_none() {
            None
        } else {
            Some(
                sess.cluster
                    .nodes
                    .iter()
                    .map(|n| {
                        c.node_selector.iter().all(|(k, v)| n.labels.get(k) == Some(v))
                            && c.node_affinity
                                .as_ref()
                                .is_none_or(|terms| affinity_matches(terms, &n.name, &n.labels))
                    })
                    .collect(),
            )
        };
        let (tolerated, per_taint) = if !sess.cluster.any_taints {
            (None, Vec::new())
        } else {
            let first: Vec<Option<&Taint>> =
                sess.cluster.nodes.iter().map(|n| untolerated(&n.taints, &c.tolerations)).collect();
            let blocked = first.iter().any(|t| t.is_some());
            let mut distinct: Vec<&Taint> = Vec::new();
            for t in first.iter().flatten() {
                if !distinct.contains(t) {
                    distinct.push(t);
                }
            }
            let per_taint = distinct
                .iter()
                .map(|taint| {
                    (
                        first.iter().map(|t| *t != Some(*taint)).collect(),
                        format!("had untolerated taint {{{}: {}}}", taint.key, taint.value),
                    )
                })
                .collect();
            let tolerated =
                if blocked { Some(first.iter().map(|t| t.is_none()).collect()) } else { None };
            (tolerated, per_taint)
        };
        sess.masks[constraints] = Some(NodeMasks { selector, tolerated, per_taint });
    }
    sess.masks[constraints].as_ref().expect("masks")
}

fn device_order_spread(sess: &Session) -> bool {
    match &sess.config.gpu_device_order {
        Some(order) if !order.is_empty() => order == "gpuspread",
        _ => sess.config.gpu_spread,
    }
}

/// Existing groups the task fits on (idle or releasing) and the node's idle / releasing whole
/// devices that could become new shared devices.
fn shared_candidates(sess: &Session, task: usize, node: i32) -> (Vec<usize>, i64, i64) {
    let cost = sess.cluster.device_cost(&sess.tasks[task].req, node);
    let n = node as usize;
    let fitting = sess.cluster.groups[n]
        .iter()
        .enumerate()
        .filter(|(_, g)| MILLI - g.used + g.releasing - cost >= 0 && g.releasing < g.used)
        .map(|(i, _)| i)
        .collect();
    (fitting, sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n], sess.cluster.rel_gpu[n])
}

/// (fits with releasing, fits on idle, failed-predicate histogram) over all nodes; the
/// histogram (first failing predicate per node) only with `explain`.
#[allow(clippy::needless_range_loop)] // node arrays side by side, by node index
pub fn feasible(sess: &mut Session, task: usize, explain: bool) -> (Vec<bool>, Vec<bool>, Reasons) {
    let req = sess.tasks[task].req;
    let constraints = sess.tasks[task].constraints;
    let count = sess.cluster.nodes.len();
    let m = masks(sess, constraints).clone();
    let sess = &*sess;
    let mut ok = sess.cluster.schedulable.clone();
    let mut idle_ok = vec![true; count];
    let mut reasons: Reasons = Vec::new();
    if explain {
        add_reason(&mut reasons, R_UNSCHED, ok.iter().filter(|&&o| !o).count() as i64);
    }
    let apply =
        |ok: &mut Vec<bool>, reasons: &mut Reasons, reason: &str, pass: &dyn Fn(usize) -> bool| {
            let mut failed = 0;
            for n in 0..count {
                if ok[n] && !pass(n) {
                    failed += 1;
                    ok[n] = false;
                }
            }
            if explain && failed > 0 {
                add_reason(reasons, reason, failed);
            }
        };
    for (mask, reason) in &m.per_taint {
        apply(&mut ok, &mut reasons, reason, &|n| mask[n]);
    }
    if let Some(sel) = &m.selector {
        apply(&mut ok, &mut reasons, R_SELECTOR, &|n| sel[n]);
    }
    if req.cpu_m != 0 {
        apply(&mut ok, &mut reasons, R_CPU, &|n| {
            sess.cluster.cap_cpu[n] - sess.cluster.used_cpu[n] + sess.cluster.rel_cpu[n]
                >= req.cpu_m
        });
        for n in 0..count {
            idle_ok[n] =
                idle_ok[n] && sess.cluster.cap_cpu[n] - sess.cluster.used_cpu[n] >= req.cpu_m;
        }
    }
    if req.memory != 0 {
        apply(&mut ok, &mut reasons, R_MEM, &|n| {
            sess.cluster.cap_mem[n] - sess.cluster.used_mem[n] + sess.cluster.rel_mem[n]
                >= req.memory
        });
        for n in 0..count {
            idle_ok[n] =
                idle_ok[n] && sess.cluster.cap_mem[n] - sess.cluster.used_mem[n] >= req.memory;
        }
    }
    if req.gpus != 0 {
        apply(&mut ok, &mut reasons, R_GPU, &|n| {
            sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n] + sess.cluster.rel_gpu[n] >= req.gpus
        });
        for n in 0..count {
            idle_ok[n] =
                idle_ok[n] && sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n] >= req.gpus;
        }
    }
    let slots = pod_slots(&req);
    apply(&mut ok, &mut reasons, R_PODS, &|n| {
        sess.cluster.used_pods[n] + slots <= sess.cluster.max_pods[n]
    });
    if req.is_shared() {
        if req.gpu_memory_mib != 0 {
            apply(&mut ok, &mut reasons, R_GPU_MEM, &|n| {
                sess.cluster.gpu_mem_synced[n] && sess.cluster.gpu_mem[n] >= req.gpu_memory_mib
            });
        }
        let groups_fit = |n: usize| -> (i64, i64) {
            let cost = cost_at(sess, &req, n);
            let (mut fit, mut idle) = (0, 0);
            for g in &sess.cluster.groups[n] {
                if g.releasing < g.used && MILLI - g.used + g.releasing - cost >= 0 {
                    fit += 1;
                    // of the devices it fits on, those with idle room (KAI's
                    // EnoughIdleResourcesOnGpu): with pipelined sharers, more than the room
                    if idle_room(g, cost) {
                        idle += 1;
                    }
                }
            }
            (fit, idle)
        };
        let wholes = |n: usize| -> (i64, i64) {
            (sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n], sess.cluster.rel_gpu[n])
        };
        apply(&mut ok, &mut reasons, R_GPU, &|n| {
            let (fit, _) = groups_fit(n);
            let (idle_whole, rel_whole) = wholes(n);
            fit + idle_whole + rel_whole >= req.fraction_devices
        });
        for n in 0..count {
            let (_, idle) = groups_fit(n);
            let (idle_whole, _) = wholes(n);
            idle_ok[n] = idle_ok[n] && idle + idle_whole >= req.fraction_devices;
        }
    }
    let fits_idle: Vec<bool> = (0..count).map(|n| ok[n] && idle_ok[n]).collect();
    reasons.retain(|(_, c)| *c != 0);
    (ok, fits_idle, reasons)
}

/// `feasible` on one node, predicate for predicate: (fits with releasing, fits on idle).
/// (`fits_node`, the fast paths' test, also wants idle CPU and memory for a request of none.)
fn feasible_at(sess: &mut Session, task: usize, n: usize) -> (bool, bool) {
    if !sess.cluster.schedulable[n] {
        return (false, false);
    }
    let constraints = sess.tasks[task].constraints;
    if constraints != 0 || sess.cluster.any_taints {
        let m = masks(sess, constraints);
        if m.per_taint.iter().any(|(mask, _)| !mask[n]) {
            return (false, false);
        }
        if m.selector.as_ref().is_some_and(|sel| !sel[n]) {
            return (false, false);
        }
    }
    let req = sess.tasks[task].req;
    let mut idle = true;
    if req.cpu_m != 0 {
        if sess.cluster.cap_cpu[n] - sess.cluster.used_cpu[n] + sess.cluster.rel_cpu[n] < req.cpu_m
        {
            return (false, false);
        }
        idle = idle && sess.cluster.cap_cpu[n] - sess.cluster.used_cpu[n] >= req.cpu_m;
    }
    if req.memory != 0 {
        if sess.cluster.cap_mem[n] - sess.cluster.used_mem[n] + sess.cluster.rel_mem[n] < req.memory
        {
            return (false, false);
        }
        idle = idle && sess.cluster.cap_mem[n] - sess.cluster.used_mem[n] >= req.memory;
    }
    if req.gpus != 0 {
        if sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n] + sess.cluster.rel_gpu[n] < req.gpus {
            return (false, false);
        }
        idle = idle && sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n] >= req.gpus;
    }
    if sess.cluster.used_pods[n] + pod_slots(&req) > sess.cluster.max_pods[n] {
        return (false, false);
    }
    if req.is_shared() {
        if req.gpu_memory_mib != 0
            && !(sess.cluster.gpu_mem_synced[n] && sess.cluster.gpu_mem[n] >= req.gpu_memory_mib)
        {
            return (false, false);
        }
        let cost = cost_at(sess, &req, n);
        let (mut fit, mut idle_groups) = (0, 0);
        for g in &sess.cluster.groups[n] {
            if g.releasing < g.used && MILLI - g.used + g.releasing - cost >= 0 {
                fit += 1;
                if idle_room(g, cost) {
                    idle_groups += 1;
                }
            }
        }
        let (idle_whole, rel_whole) =
            (sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n], sess.cluster.rel_gpu[n]);
        if fit + idle_whole + rel_whole < req.fraction_devices {
            return (false, false);
        }
        idle = idle && idle_groups + idle_whole >= req.fraction_devices;
    }
    (true, idle)
}

/// The nodes a GPU task may fit on (releasing resources counted), from the room index, in
/// node order: with that many free whole GPUs; for a shared request, with a live device with
/// room for it (any room for gpu-memory, whose cost depends on the node) or a free whole GPU.
fn room_candidates(sess: &Session, req: &crate::model::Request) -> Vec<i32> {
    let mut out: Vec<i32> = Vec::new();
    if req.gpus != 0 {
        for nodes in sess.cluster.by_free.range(req.gpus..).map(|(_, v)| v) {
            out.extend_from_slice(nodes);
        }
    } else {
        let least = if req.gpu_fraction_milli != 0 { req.gpu_fraction_milli } else { 1 };
        for nodes in sess.cluster.by_room.range(least..).map(|(_, v)| v) {
            out.extend(nodes.iter().copied());
        }
        for nodes in sess.cluster.by_free.range(1..).map(|(_, v)| v) {
            out.extend_from_slice(nodes);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The pass over every node (`feasible`, then `scores` and the first best) for a GPU task,
/// over `nodes` (in node order) that hold every node it fits on.
fn kai_among(
    sess: &mut Session,
    task: usize,
    nodes: &[i32],
    explain: bool,
) -> (Option<Choice>, Reasons) {
    let mut fitting: Vec<(i32, bool)> = Vec::new();
    for &node in nodes {
        let (fits, idle) = feasible_at(sess, task, node as usize);
        if fits {
            fitting.push((node, idle));
        }
    }
    place_best(
        sess,
        task,
        &fitting,
        explain,
        |s, n| s.cluster.free_gpu_at(n) as f64,
        |s, t, node| {
            let req = s.tasks[t].req;
            partly_fits(s, &req, node as usize)
        },
    )
}

/// The best of `fitting` (node, fits on idle), in node order, by the GPU score: bin-pack (or
/// spread) on `free_of`, +100 on idle, +1000 where `bonus_of` holds for a fractional task;
/// ties to the first. None, with the reasons when `explain`, where nothing fits.
fn place_best(
    sess: &mut Session,
    task: usize,
    fitting: &[(i32, bool)],
    explain: bool,
    free_of: impl Fn(&Session, usize) -> f64,
    bonus_of: impl Fn(&Session, usize, i32) -> bool,
) -> (Option<Choice>, Reasons) {
    if fitting.is_empty() {
        let reasons = if explain { feasible(sess, task, true).2 } else { Vec::new() };
        return (None, reasons);
    }
    if fitting.len() == 1 {
        let (node, idle) = fitting[0];
        return (Some(place_on(sess, task, node, idle)), Vec::new());
    }
    let spread = sess.config.gpu_spread;
    let (mut lo, mut hi) = (0i64, 0i64);
    if !spread && !sess.cluster.free_counts.is_empty() {
        lo = *sess.cluster.free_counts.keys().next().expect("min");
        hi = *sess.cluster.free_counts.keys().next_back().expect("max");
    }
    let bonus = !spread && sess.tasks[task].req.gpus == 0;
    let mut best: Option<(f64, i32, bool)> = None;
    for &(node, idle) in fitting {
        let n = node as usize;
        let (free, total) = (free_of(sess, n), sess.cluster.cap_gpu[n] as f64);
        let base = if total <= 0.0 {
            0.0
        } else if spread {
            free / total
        } else if hi == lo {
            9.0
        } else {
            9.0 * (1.0 - (free - lo as f64) / (hi as f64 - lo as f64))
        };
        let mut score = base + if shown_idle(sess, task, node, idle) { 100.0 } else { 0.0 };
        if bonus {
            score += 1000.0 * if bonus_of(sess, task, node) { 1.0 } else { 0.0 };
        }
        if best.is_none_or(|(s, _, _)| score > s) {
            best = Some((score, node, idle));
        }
    }
    let (_, node, idle) = best.expect("a fitting node");
    (Some(place_on(sess, task, node, idle)), Vec::new())
}

/// Pod slots a task needs on a node: a GPU-sharing pod also keeps one for a potential
/// reservation pod, whether or not it joins a device that has one (KAI's NodePodNumber).
fn pod_slots(req: &crate::model::Request) -> i64 {
    if req.is_shared() {
        2
    } else {
        1
    }
}

/// (fits, fits on idle) on one node, without touching the others.
pub fn fits_node(sess: &mut Session, task: usize, node: i32) -> (bool, bool) {
    let n = node as usize;
    if !sess.cluster.schedulable[n]
        || sess.cluster.used_pods[n] + pod_slots(&sess.tasks[task].req) > sess.cluster.max_pods[n]
    {
        return (false, false);
    }
    let constraints = sess.tasks[task].constraints;
    if constraints != 0 || sess.cluster.any_taints {
        let m = masks(sess, constraints);
        if m.selector.as_ref().is_some_and(|sel| !sel[n]) {
            return (false, false);
        }
        if m.tolerated.as_ref().is_some_and(|tol| !tol[n]) {
            return (false, false);
        }
    }
    let req = sess.tasks[task].req;
    let idle_cpu = sess.cluster.cap_cpu[n] - sess.cluster.used_cpu[n];
    let idle_mem = sess.cluster.cap_mem[n] - sess.cluster.used_mem[n];
    if idle_cpu + sess.cluster.rel_cpu[n] < req.cpu_m
        || idle_mem + sess.cluster.rel_mem[n] < req.memory
    {
        return (false, false);
    }
    let idle = idle_cpu >= req.cpu_m && idle_mem >= req.memory;
    let idle_gpu = sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n];
    if req.gpus != 0 {
        if idle_gpu + sess.cluster.rel_gpu[n] < req.gpus {
            return (false, false);
        }
        return (true, idle && idle_gpu >= req.gpus);
    }
    if req.is_shared() {
        if req.gpu_memory_mib != 0
            && !(sess.cluster.gpu_mem_synced[n] && sess.cluster.gpu_mem[n] >= req.gpu_memory_mib)
        {
            return (false, false);
        }
        let (fitting, idle_whole, rel_whole) = shared_candidates(sess, task, node);
        if fitting.len() as i64 + idle_whole + rel_whole < req.fraction_devices {
            return (false, false);
        }
        let cost = sess.cluster.device_cost(&req, node);
        let idle_groups =
            fitting.iter().filter(|&&i| idle_room(&sess.cluster.groups[n][i], cost)).count() as i64;
        return (true, idle && idle_groups + idle_whole >= req.fraction_devices);
    }
    (true, idle)
}

/// KAI's nodeavailability score (+100, IsTaskAllocatable) for a shared-GPU task: its CPU and
/// memory fit on idle resources and, per device it asks, there is an idle whole GPU or a shared
/// device it fits on with the releasing room counted (fractionTaskGpusAllocatableDeviceCount).
/// Placing it on idle resources counts only a device's idle room
/// (kai_ray/core/placement.py `_available`, over every node at once).
fn available_on(sess: &Session, task: usize, node: i32) -> bool {
    let n = node as usize;
    let req = &sess.tasks[task].req;
    if sess.cluster.cap_cpu[n] - sess.cluster.used_cpu[n] < req.cpu_m
        || sess.cluster.cap_mem[n] - sess.cluster.used_mem[n] < req.memory
    {
        return false;
    }
    let (fitting, idle_whole, _) = shared_candidates(sess, task, node);
    fitting.len() as i64 + idle_whole >= req.fraction_devices
}

/// Whether `node` scores +100 for fitting on idle resources, `idle` the placement's own test
/// there: the same but for a shared-GPU task (`available_on`).
pub fn shown_idle(sess: &Session, task: usize, node: i32, idle: bool) -> bool {
    if sess.tasks[task].req.is_shared() {
        available_on(sess, task, node)
    } else {
        idle
    }
}

pub fn sharing_bonus_on(sess: &Session, task: usize, node: i32) -> bool {
    let req = &sess.tasks[task].req;
    if sess.config.gpu_spread || req.gpus != 0 {
        return false;
    }
    let cost = if req.is_shared() { sess.cluster.device_cost(req, node) } else { 0 };
    sess.cluster.groups[node as usize].iter().any(|g| joinable(g, cost))
}

/// Whether the binpack fast path applies (common.rs).
pub fn sticky_allowed(sess: &Session, task: usize) -> bool {
    if sess.tasks[task].req.wants_gpu() && sess.config.gpu_packing != GpuPacking::Kai {
        return false; // a packing policy scores more than free amounts
    }
    let spread = if sess.tasks[task].req.wants_gpu() {
        sess.config.gpu_spread
    } else {
        sess.config.cpu_spread
    };
    !spread
}

/// KAI's node order scores of `nodes`, in their order; binpack normalises free amounts over
/// the nodes `within` (None: every schedulable node).
fn scores(
    sess: &Session,
    task: usize,
    nodes: &[usize],
    fits: &[bool],
    fits_idle: &[bool],
    within: Option<&[usize]>,
) -> Vec<f64> {
    let req = sess.tasks[task].req;
    let gpu = req.wants_gpu();
    let free_total = |n: usize| -> (f64, f64) {
        if gpu {
            (sess.cluster.free_gpu_at(n) as f64, sess.cluster.cap_gpu[n] as f64)
        } else {
            (sess.cluster.free_cpu_at(n) as f64, sess.cluster.cap_cpu[n] as f64)
        }
    };
    let spread = if gpu { sess.config.gpu_spread } else { sess.config.cpu_spread };
    let mut range: Option<(f64, f64)> = None;
    if !spread {
        let mut widen = |n: usize| {
            let (free, total) = free_total(n);
            if sess.cluster.schedulable[n] && total > 0.0 {
                range = Some(range.map_or((free, free), |(lo, hi)| (lo.min(free), hi.max(free))));
            }
        };
        match within {
            Some(within) => within.iter().for_each(|&n| widen(n)),
            None => (0..sess.cluster.nodes.len()).for_each(widen),
        }
    }
    let bonus = !sess.config.gpu_spread && req.gpus == 0;
    let shared = req.is_shared();
    nodes
        .iter()
        .map(|&n| {
            let (free, total) = free_total(n);
            let base = if spread {
                if total > 0.0 {
                    free / total
                } else {
                    0.0
                }
            } else {
                match range {
                    Some(_) if total <= 0.0 => 0.0,
                    Some((lo, hi)) if hi == lo => 9.0,
                    Some((lo, hi)) => 9.0 * (1.0 - (free - lo) / (hi - lo)),
                    None => 0.0,
                }
            };
            // KAI's availability score (`available_on`)
            let idle =
                if shared { fits[n] && available_on(sess, task, n as i32) } else { fits_idle[n] };
            let mut score = base + if idle { 100.0 } else { 0.0 };
            if !gpu {
                score += if sess.cluster.cap_gpu[n] == 0 { 10.0 } else { 0.0 };
            }
            if bonus {
                let on = fits[n] && partly_fits(sess, &req, n);
                score += 1000.0 * if on { 1.0 } else { 0.0 };
            }
            score
        })
        .collect()
}

/// The first of `nodes` with the highest score (`score[i]` is `nodes[i]`'s).
fn best_scored(nodes: &[usize], score: &[f64]) -> usize {
    let mut best = 0;
    for i in 1..nodes.len() {
        if score[i] > score[best] {
            best = i;
        }
    }
    nodes[best]
}

/// Milli of a device the task takes on node `n`, in integers as the Python's vector of them
/// has it (gpu-memory depends on the node).
fn cost_at(sess: &Session, req: &crate::model::Request, n: usize) -> i64 {
    if req.gpu_fraction_milli != 0 {
        req.gpu_fraction_milli
    } else if req.gpu_memory_mib != 0 {
        -(-req.gpu_memory_mib * MILLI).div_euclid(sess.cluster.gpu_mem[n])
    } else {
        0
    }
}

/// A shared device of the node can take the task (gpusharingorder; `joinable`).
fn partly_fits(sess: &Session, req: &crate::model::Request, n: usize) -> bool {
    let cost = cost_at(sess, req, n);
    sess.cluster.groups[n].iter().any(|g| joinable(g, cost))
}

/// KAI's `IsTaskFitOnGpuGroup`: a shared device some sharer still holds (not all of it
/// releasing) with room for `cost`, releasing room counted; a full one qualifies for a request
/// of 0 (a CPU-only pod).
fn joinable(g: &Group, cost: i64) -> bool {
    g.releasing < g.used && MILLI - g.used + g.releasing - cost >= 0
}

/// Shared devices for a fractional task on `node`: (groups, new groups, all on idle).
pub fn choose_devices(sess: &mut Session, task: usize, node: i32) -> (Vec<u32>, Vec<u32>, bool) {
    let req = sess.tasks[task].req;
    let cost = sess.cluster.device_cost(&req, node);
    let (fitting, idle_whole, rel_whole) = shared_candidates(sess, task, node);
    let pack = !device_order_spread(sess);
    let n = node as usize;
    let mut sorted = fitting;
    sorted.sort_by(|&a, &b| {
        sess.cluster.gids[sess.cluster.groups[n][a].gid as usize]
            .cmp(&sess.cluster.gids[sess.cluster.groups[n][b].gid as usize])
    });
    // (score, order, group id or a new device, on idle)
    let mut cands: Vec<(f64, usize, Option<u32>, bool)> = Vec::new();
    for (order, &i) in sorted.iter().enumerate() {
        let g = &sess.cluster.groups[n][i];
        // every sharer (KAI's GetUsedGpuPortion)
        let used = (g.used + g.pipelined) as f64 / MILLI as f64;
        let score = if pack { used } else { 1.0 - used };
        cands.push((score, order, Some(g.gid), idle_room(g, cost)));
    }
    let base = cands.len();
    for i in 0..(idle_whole + rel_whole).max(0) {
        cands.push((if pack { 0.0 } else { 1.0 }, base + i as usize, None, i < idle_whole));
    }
    cands.sort_by(|a, b| {
        (-a.0).partial_cmp(&-b.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1))
    });
    let mut groups = Vec::new();
    let mut new = Vec::new();
    let mut on_idle = true;
    for &(_, _, gid, idle) in cands.iter().take(req.fraction_devices.max(0) as usize) {
        on_idle = on_idle && idle;
        let gid = match gid {
            Some(g) => g,
            None => {
                let g = sess.cluster.new_group_id(node, &new);
                new.push(g);
                g
            }
        };
        groups.push(gid);
    }
    (groups, new, on_idle)
}

/// The configured packing policy's pick as a placement on idle resources.
fn policy_choice(sess: &mut Session, task: usize) -> Option<Choice> {
    packing::choose(sess, task, fits_node).map(|p| Choice {
        node: p.node,
        groups: p.groups,
        new_groups: p.new_groups,
        on_idle: true,
    })
}

/// Best node for `task`, or None with the failed-predicate histogram (empty unless
/// `explain`). A virtually evicted victim is placed like any task.
pub fn choose(sess: &mut Session, task: usize, explain: bool) -> (Option<Choice>, Reasons) {
    if let Some(within) = sess.node_filter.clone() {
        return choose_filtered(sess, task, &within, explain);
    }
    let req = sess.tasks[task].req;
    if sess.config.gpu_packing != GpuPacking::Kai && req.wants_gpu() {
        // The Python takes no shortcut here: the pass over every node, then the policy among
        // the nodes the task fits on idle resources, else KAI's scores over that pass. Both
        // are found among the nodes the GPU room index lists (no other node fits).
        if let Some(choice) = policy_choice(sess, task) {
            return (Some(choice), Vec::new());
        }
        let nodes = room_candidates(sess, &req);
        return kai_among(sess, task, &nodes, explain);
    }
    if req.gpus != 0 {
        let (few, order) = whole_candidates(sess, req.gpus);
        if few {
            let mut nodes = order;
            nodes.sort();
            return choose_among(sess, task, &nodes, explain);
        }
        if let Some(packed) = binpack_whole(sess, task, &order) {
            return (Some(packed), Vec::new());
        }
    } else if req.gpu_fraction_milli != 0 {
        if let Some(nodes) = few_fraction_candidates(sess, req.gpu_fraction_milli) {
            return choose_among(sess, task, &nodes, explain);
        }
    }
    let cand = gpu_candidates(sess, task);
    if let Some(cand) = &cand {
        if cand.len() <= FEW {
            return choose_among(sess, task, cand, explain);
        }
        if let Some(packed) = binpack_fraction(sess, task, cand) {
            return (Some(packed), Vec::new());
        }
    }
    let (fits, fits_idle, _) = feasible(sess, task, false);
    let fitting: Vec<usize> = (0..fits.len()).filter(|&n| fits[n]).collect();
    if fitting.is_empty() {
        let reasons = if explain { feasible(sess, task, true).2 } else { Vec::new() };
        return (None, reasons);
    }
    let node = if fitting.len() == 1 {
        fitting[0]
    } else {
        let score = scores(sess, task, &fitting, &fits, &fits_idle, None);
        best_scored(&fitting, &score)
    };
    (Some(place_on(sess, task, node as i32, fits_idle[node])), Vec::new())
}

/// `choose` over `within` alone (in node order): the pass over every node's predicates and
/// scores, node by node, with binpack normalised over `within` (a victim scenario's nodes:
/// KAI's AllocateJob is handed that node list). The Python's `choose` masks its pass over every
/// node to them instead.
fn choose_filtered(
    sess: &mut Session,
    task: usize,
    within: &[usize],
    explain: bool,
) -> (Option<Choice>, Reasons) {
    let req = sess.tasks[task].req;
    if sess.config.gpu_packing != GpuPacking::Kai && req.wants_gpu() {
        // only the scenario's nodes are tested: a pass over every node per victim scenario
        // made `lookahead`'s preempt 30x slower at 5,000 nodes
        let count = sess.cluster.nodes.len();
        let (mut fits, mut fits_idle) = (vec![false; count], vec![false; count]);
        let mut fitting = Vec::with_capacity(within.len());
        for &n in within {
            let (fit, idle) = feasible_at(sess, task, n);
            if fit {
                (fits[n], fits_idle[n]) = (true, idle);
                fitting.push(n);
            }
        }
        if fitting.is_empty() {
            let reasons = if explain { feasible(sess, task, true).2 } else { Vec::new() };
            return (None, reasons);
        }
        if let Some(choice) = policy_choice(sess, task) {
            return (Some(choice), Vec::new());
        }
        let score = scores(sess, task, &fitting, &fits, &fits_idle, Some(within));
        let best = best_scored(&fitting, &score);
        return (Some(place_on(sess, task, best as i32, fits_idle[best])), Vec::new());
    }
    let mut fitting: Vec<(usize, bool)> = Vec::with_capacity(within.len());
    for &n in within {
        let (fits, idle) = feasible_at(sess, task, n);
        if fits {
            fitting.push((n, idle));
        }
    }
    if fitting.is_empty() {
        let reasons = if explain { feasible(sess, task, true).2 } else { Vec::new() };
        return (None, reasons);
    }
    if fitting.len() == 1 {
        let (n, idle) = fitting[0];
        return (Some(place_on(sess, task, n as i32, idle)), Vec::new());
    }
    let gpu = req.wants_gpu();
    let spread = if gpu { sess.config.gpu_spread } else { sess.config.cpu_spread };
    let free_total = |s: &Session, n: usize| {
        if gpu {
            (s.cluster.free_gpu_at(n), s.cluster.cap_gpu[n])
        } else {
            (s.cluster.free_cpu_at(n), s.cluster.cap_cpu[n])
        }
    };
    let mut range: Option<(i64, i64)> = None;
    for &n in within {
        let (free, total) = free_total(sess, n);
        if sess.cluster.schedulable[n] && total > 0 {
            range = Some(range.map_or((free, free), |(lo, hi)| (lo.min(free), hi.max(free))));
        }
    }
    let bonus = !sess.config.gpu_spread && req.gpus == 0;
    let mut best: Option<(f64, usize, bool)> = None;
    for &(n, idle) in &fitting {
        let (free, total) = free_total(sess, n);
        let (free, total) = (free as f64, total as f64);
        let base = match range {
            _ if total <= 0.0 => 0.0,
            _ if spread => free / total,
            None => 0.0,
            Some((lo, hi)) if lo == hi => 9.0,
            Some((lo, hi)) => 9.0 * (1.0 - (free - lo as f64) / (hi as f64 - lo as f64)),
        };
        let mut score = base + if shown_idle(sess, task, n as i32, idle) { 100.0 } else { 0.0 };
        if !gpu {
            score += if sess.cluster.cap_gpu[n] == 0 { 10.0 } else { 0.0 };
        }
        if bonus {
            score += 1000.0 * if sharing_bonus_on(sess, task, n as i32) { 1.0 } else { 0.0 };
        }
        if best.is_none_or(|(s, _, _)| score > s) {
            best = Some((score, n, idle));
        }
    }
    let (_, n, idle) = best.expect("a fitting node");
    (Some(place_on(sess, task, n as i32, idle)), Vec::new())
}

/// The nodes with `gpus` free whole GPUs or more, in binpack walk order (by free GPUs, then
/// node). (few, nodes): when there are more than FEW, only the first FEW + 1.
fn whole_candidates(sess: &Session, gpus: i64) -> (bool, Vec<i32>) {
    let total: usize = sess.cluster.by_free.range(gpus..).map(|(_, nodes)| nodes.len()).sum();
    if total <= FEW {
        return (
            true,
            sess.cluster
                .by_free
                .range(gpus..)
                .flat_map(|(_, nodes)| nodes.iter().copied())
                .collect(),
        );
    }
    let mut order = Vec::new();
    for (_, nodes) in sess.cluster.by_free.range(gpus..) {
        let room = FEW + 1 - order.len();
        order.extend(nodes.iter().take(room).copied());
        if order.len() > FEW {
            break;
        }
    }
    (false, order)
}

/// The nodes with a shared device with `cost` room or a free whole GPU, in node order, when
/// there are at most FEW of them.
fn few_fraction_candidates(sess: &Session, cost: i64) -> Option<Vec<i32>> {
    let rooms: usize = sess.cluster.by_room.range(cost..).map(|(_, n)| n.len()).sum();
    let wholes: usize = sess.cluster.by_free.values().map(|n| n.len()).sum();
    if rooms + wholes > FEW {
        return None;
    }
    let mut found: Vec<i32> = Vec::with_capacity(rooms + wholes);
    for (_, nodes) in sess.cluster.by_room.range(cost..) {
        found.extend(nodes.iter().copied());
    }
    for nodes in sess.cluster.by_free.values() {
        found.extend(nodes.iter().copied());
    }
    found.sort_unstable();
    found.dedup();
    Some(found)
}

/// The nodes with GPU room for a fractional task (gpu-fraction only), from the room index.
fn gpu_candidates(sess: &Session, task: usize) -> Option<Vec<i32>> {
    let req = &sess.tasks[task].req;
    if req.gpus != 0 || req.gpu_fraction_milli == 0 {
        return None;
    }
    Some(
        (0..sess.cluster.nodes.len())
            .filter(|&n| {
                sess.cluster.dev_room_at[n] >= req.gpu_fraction_milli
                    || sess.cluster.gpu_free_at[n] >= 1
            })
            .map(|n| n as i32)
            .collect(),
    )
}

enum IdleAfter<'a> {
    /// whole GPUs: nodes with that many idle GPUs in all, against those among the first k
    Whole { idle_fits: i64, order: &'a [i32] },
    /// a walk over a sorted array of nodes: could any from position k on fit on idle?
    Array { order: &'a [i32] },
}

fn idle_after(sess: &Session, task: usize, how: &IdleAfter<'_>, k: usize) -> bool {
    match how {
        IdleAfter::Whole { idle_fits, order } => {
            let gpus = sess.tasks[task].req.gpus;
            *idle_fits
                > order[..k.min(order.len())]
                    .iter()
                    .filter(|&&n| sess.cluster.idle_at[n as usize] >= gpus)
                    .count() as i64
        }
        IdleAfter::Array { order } => may_fit_on_idle(sess, task, &order[k.min(order.len())..]),
    }
}

fn binpack_whole(sess: &mut Session, task: usize, order: &[i32]) -> Option<Choice> {
    if sess.config.gpu_spread || sess.cluster.free_counts.is_empty() {
        return None;
    }
    let gpus = sess.tasks[task].req.gpus;
    let idle_fits: i64 = sess.cluster.idle_counts.range(gpus..).map(|(_, c)| *c).sum();
    walk(sess, task, order, &IdleAfter::Whole { idle_fits, order }, true).0
}

/// The binpack winner among nodes in `order` (by free GPUs, then node): the first node that
/// fits on idle resources; when none can, the first that fits at all. (choice, settled).
fn walk(
    sess: &mut Session,
    task: usize,
    order: &[i32],
    how: &IdleAfter<'_>,
    more: bool,
) -> (Option<Choice>, bool) {
    let mut first_fit: Option<(i32, bool)> = None;
    for (j, &node) in order.iter().take(FEW).enumerate() {
        let (fits, idle) = fits_node(sess, task, node);
        if fits && shown_idle(sess, task, node, idle) {
            return (Some(place_on(sess, task, node, idle)), true);
        }
        if fits && first_fit.is_none() {
            first_fit = Some((node, idle));
            if !idle_after(sess, task, how, j + 1) {
                return (Some(place_on(sess, task, node, idle)), true);
            }
        }
    }
    if let Some((node, idle)) = first_fit {
        if !idle_after(sess, task, how, FEW) {
            return (Some(place_on(sess, task, node, idle)), true);
        }
    }
    (None, first_fit.is_none() && !more)
}

fn walk_array(sess: &mut Session, task: usize, nodes: &[i32]) -> (Option<Choice>, bool) {
    // walk order: by free GPUs, then node; each key packed in one integer (free GPUs, offset
    // to keep their order, above the node) for a sort without lookups
    let free = &sess.cluster.gpu_free_at;
    let mut keys: Vec<u64> =
        nodes.iter().map(|&n| (((free[n as usize] + (1 << 31)) as u64) << 32) | n as u64).collect();
    keys.sort_unstable();
    let order: Vec<i32> = keys.iter().map(|&k| (k & 0xffff_ffff) as i32).collect();
    let more = order.len() > FEW;
    let head: Vec<i32> = order.iter().take(FEW + 1).copied().collect();
    walk(sess, task, &head, &IdleAfter::Array { order: &order }, more)
}

/// Whether the task's GPUs could fit on idle resources on any of `nodes`.
fn may_fit_on_idle(sess: &Session, task: usize, nodes: &[i32]) -> bool {
    let req = &sess.tasks[task].req;
    nodes.iter().any(|&node| {
        let n = node as usize;
        let idle_whole = sess.cluster.cap_gpu[n] - sess.cluster.used_gpu[n];
        if req.gpus != 0 {
            return idle_whole >= req.gpus;
        }
        // (for a fraction, KAI's availability score: devices it fits on, releasing room
        // counted)
        let fit_groups = sess.cluster.groups[n]
            .iter()
            .filter(|g| {
                g.releasing < g.used && MILLI - g.used + g.releasing - req.gpu_fraction_milli >= 0
            })
            .count() as i64;
        idle_whole + fit_groups >= req.fraction_devices
    })
}

fn binpack_fraction(sess: &mut Session, task: usize, cand: &[i32]) -> Option<Choice> {
    let cost = sess.tasks[task].req.gpu_fraction_milli;
    if cost == 0 || sess.config.gpu_spread || sess.cluster.free_counts.is_empty() {
        return None;
    }
    let sharing: Vec<i32> = (0..sess.cluster.nodes.len())
        .filter(|&n| sess.cluster.dev_room_at[n] >= cost)
        .map(|n| n as i32)
        .collect();
    if !sharing.is_empty() {
        let (picked, settled) = walk_array(sess, task, &sharing);
        if picked.is_some() || !settled {
            return picked;
        }
    }
    walk_array(sess, task, cand).0
}

/// `choose` over a few candidate nodes, one by one: the same predicates and scores as the
/// pass over every node, in the same float arithmetic, ties to the first.
fn choose_among(
    sess: &mut Session,
    task: usize,
    nodes: &[i32],
    explain: bool,
) -> (Option<Choice>, Reasons) {
    let mut fitting: Vec<(i32, bool)> = Vec::new();
    for &node in nodes {
        let (fits, idle) = fits_node(sess, task, node);
        if fits {
            fitting.push((node, idle));
        }
    }
    place_best(
        sess,
        task,
        &fitting,
        explain,
        |s, n| s.cluster.gpu_free_at[n] as f64,
        sharing_bonus_on,
    )
}

pub fn place_on(sess: &mut Session, task: usize, node: i32, on_idle: bool) -> Choice {
    if sess.tasks[task].req.is_shared() {
        let (groups, new_groups, devices_idle) = choose_devices(sess, task, node);
        return Choice { node, groups, new_groups, on_idle: devices_idle && on_idle };
    }
    Choice { node, groups: Vec::new(), new_groups: Vec::new(), on_idle }
}

/// Whether a shared device has idle room for `cost` (KAI's EnoughIdleResourcesOnGpu: a device
/// only pipelined sharers hold has none). Asked of devices with room for it (`MILLI - used +
/// releasing`): with pipelined sharers the idle room may be the larger (they are charged to
/// releasing), and KAI asks it only of the devices that fit.
fn idle_room(g: &Group, cost: i64) -> bool {
    g.used > 0 && MILLI - g.used - cost >= 0
}
