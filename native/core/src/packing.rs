//! The packing policies other than KAI's (kai_ray/core/packing.py and packing_policy.py): with
//! `gpu_packing` set to best_fit, packing, fgd or lookahead, a GPU task's node and device come
//! from the policy; tasks it does not model keep KAI's rules (placement.rs).
//!
//! Same decisions as the Python, float for float. numpy sums a float axis pairwise when the axis
//! is contiguous (`np_sum`) and left to right when it is strided; each sum here follows the one
//! the Python computes (the `_Base` weights are the strided kind). The one operation not
//! mirrored bit for bit is numpy's `exp`, which on AVX-512 machines is numpy's own and may
//! differ from libm's in the last bit: FGD's integer score moves with it only where
//! `100 * sigmoid` falls within an ulp of an integer.
//!
//! Speed: the Python scores every node for every task. Here a node's score is kept per task
//! shape until the node changes (`ClusterState::node_ver`), and only the nodes of the session's GPU
//! room index are looked at: no other node can take the task on idle resources, and only
//! those count.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::model::{Constraints, GpuPacking, Request, MILLI};
use crate::state::Session;

pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
const MIB: i64 = 1024 * 1024;
const MAX_SPEC_CPU: f64 = 128_000.0;
const MAX_SPEC_GPU: f64 = 8_000.0;
const LOOKAHEAD_STEP: f64 = 1000.0;
const THRESHOLD: f64 = 0.95;
const LEFTOVER: usize = MILLI as usize + 1;

/// numpy's float64 `add.reduce` along a contiguous axis: pairwise summation added to the
/// identity 0.0.
pub fn np_sum(a: &[f64]) -> f64 {
    0.0 + pairwise(a)
}

/// numpy's `pairwise_sum`: runs under 8 left to right, up to 128 in 8 interleaved sums, longer
/// ones halved at a multiple of 8.
fn pairwise(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        let mut res = -0.0;
        for &v in a {
            res += v;
        }
        res
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - n % 8 {
            for (j, acc) in r.iter_mut().enumerate() {
                *acc += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise(&a[..n2]) + pairwise(&a[n2..])
    }
}

/// packing.PodRequest as packing_policy.request makes it (memory in MiB).
#[derive(Clone, Copy, Debug)]
struct PodRequest {
    cpu: i64,
    mem: i64,
    num: i64,
    milli: i64,
}

impl PodRequest {
    fn shared(&self) -> bool {
        self.num == 1 && self.milli < MILLI
    }
}

/// packing_policy.request: None for what the policies do not model (gpu-memory, multi-device
/// fractions, no GPU).
fn request(req: &Request) -> Option<PodRequest> {
    if req.gpu_memory_mib != 0 || req.fraction_devices != 1 || !req.wants_gpu() {
        return None;
    }
    let mem = req.memory.div_euclid(MIB);
    if req.gpus != 0 {
        return Some(PodRequest { cpu: req.cpu_m, mem, num: req.gpus, milli: MILLI });
    }
    Some(PodRequest { cpu: req.cpu_m, mem, num: 1, milli: req.gpu_fraction_milli })
}

/// Whether packing.PodRequest takes a request the policies model (the Python raises otherwise).
pub fn request_valid(req: &Request) -> bool {
    match request(req) {
        None => true,
        Some(p) => p.cpu >= 0 && p.mem >= 0 && p.milli > 0 && p.milli <= MILLI,
    }
}

/// The typical shapes (packing.ShapeSet) and what the policies derive from them: the distinct
/// GPU shapes (cpu, num, milli) over their model constraints (packing._Base) with per-model
/// popularity, and the look-ahead's device leftover table.
pub struct Shapes {
    /// model columns of `allowed` (M)
    models: usize,
    // the GPU shapes of the set, in its order
    allowed: Vec<Vec<bool>>,
    weight: Vec<f64>,
    base_of: Vec<usize>,
    // the distinct shapes (B)
    cpu: Vec<i64>,
    num: Vec<i64>,
    milli: Vec<i64>,
    /// (M + 1) x B: the popularity each model's nodes give each distinct shape (row M: none)
    base_weight: Vec<Vec<f64>>,
    /// (M + 1) x 1001 `device_leftover`, made on first use (lookahead)
    leftover: Vec<Vec<f64>>,
}

/// A typical shape's key: (cpu, milli, num, kind).
type ShapeKey = (i64, i64, i64, usize);

/// packing.typical_shapes: the most popular (cpu, milli, num, kind) keys covering THRESHOLD of
/// the pods, weighted by popularity; `kind` tells apart the distinct rows of `allowed`.
fn typical_shapes(rows: &[(i64, i64, i64, usize)], allowed: &[Vec<bool>]) -> Shapes {
    let p = rows.len();
    // kinds: the distinct allowed rows in sorted order (np.unique over rows)
    let distinct: BTreeSet<&Vec<bool>> = allowed.iter().collect();
    let kind_of: FxHashMap<&Vec<bool>, usize> =
        distinct.iter().enumerate().map(|(i, row)| (*row, i)).collect();
    // (cpu, milli, num, kind) -> (count, first pod)
    let mut keys: BTreeMap<ShapeKey, (i64, usize)> = BTreeMap::new();
    for (i, &(cpu, num, milli, row)) in rows.iter().enumerate() {
        let key = (cpu, milli, num, kind_of[&allowed[row]]);
        keys.entry(key).or_insert((0, i)).0 += 1;
    }
    let mut order: Vec<(ShapeKey, (i64, usize))> = keys.into_iter().collect();
    // most popular first, then the larger key (keys are distinct: the order is total)
    order.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(b.0.cmp(&a.0)));
    let want = THRESHOLD * p as f64;
    let mut cum = 0i64;
    let mut take = order.len() + 1;
    for (i, (_, (count, _))) in order.iter().enumerate() {
        cum += count;
        if cum as f64 >= want {
            take = i + 1;
            break;
        }
    }
    order.truncate(take.min(order.len()));
    let counts: Vec<f64> = order.iter().map(|(_, (c, _))| *c as f64).collect();
    let total = np_sum(&counts);
    let models = allowed.first().map_or(1, |r| r.len());
    let mut set_allowed = Vec::new();
    let mut set_weight = Vec::new();
    let mut set_key = Vec::new();
    for (i, ((cpu, milli, num, _), (_, first))) in order.iter().enumerate() {
        if *milli <= 0 {
            continue; // CPU-only shapes have no base (the live session has none)
        }
        set_allowed.push(allowed[rows[*first].3].clone());
        set_weight.push(counts[i] / total);
        set_key.push((*cpu, *num, *milli));
    }
    // the distinct GPU shapes, sorted (np.unique over (cpu, num, milli))
    let bases: BTreeSet<(i64, i64, i64)> = set_key.iter().copied().collect();
    let index: FxHashMap<(i64, i64, i64), usize> =
        bases.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let base_of: Vec<usize> = set_key.iter().map(|k| index[k]).collect();
    let b = bases.len();
    // row m: the summed popularity of the shapes of each base that model m admits; numpy sums
    // these over a strided axis (the transposed `allowed`), left to right
    let mut base_weight = vec![vec![0.0; b]; models + 1];
    for (m, row) in base_weight.iter_mut().take(models).enumerate() {
        for (k, &base) in base_of.iter().enumerate() {
            let admitted = if set_allowed[k][m] { 1.0 } else { 0.0 };
            row[base] += admitted * set_weight[k];
        }
    }
    Shapes {
        models,
        allowed: set_allowed,
        weight: set_weight,
        base_of,
        cpu: bases.iter().map(|k| k.0).collect(),
        num: bases.iter().map(|k| k.1).collect(),
        milli: bases.iter().map(|k| k.2).collect(),
        base_weight,
        leftover: Vec::new(),
    }
}

impl Shapes {
    /// packing.device_leftover: per model, L(f) for f in 0..=1000.
    fn make_leftover(&mut self) {
        if !self.leftover.is_empty() {
            return;
        }
        let one: Vec<usize> =
            (0..self.cpu.len()).filter(|&j| self.num[j] == 1 && self.milli[j] > 0).collect();
        let mut out = Vec::with_capacity(self.base_weight.len());
        for row in &self.base_weight {
            let kept: Vec<usize> = one.iter().copied().filter(|&j| row[j] > 0.0).collect();
            let m: Vec<i64> = kept.iter().map(|&j| self.milli[j]).collect();
            let w: Vec<f64> = kept.iter().map(|&j| row[j]).collect();
            out.push(leftover_dp(&m, &w));
        }
        self.leftover = out;
    }

    /// packing.arrival_weight: (M + 1) x B weights as arrivals on each model's nodes see the
    /// shapes, given each model's GPU supply.
    fn arrival_weight(&self, supply: &[f64]) -> Vec<Vec<f64>> {
        let m = self.models;
        let b = self.cpu.len();
        let mut out = vec![vec![0.0; b]; m + 1];
        for (k, allowed) in self.allowed.iter().enumerate() {
            let ok: Vec<bool> = (0..m).map(|i| allowed[i] && supply[i] > 0.0).collect();
            // a sum of whole device counts: exact in any order
            let mut reach = 0.0;
            for i in 0..m {
                if ok[i] {
                    reach += supply[i];
                }
            }
            let reach = reach.max(1e-9);
            for (i, row) in out.iter_mut().take(m).enumerate() {
                let share = if ok[i] { supply[i] / reach } else { 0.0 };
                // np.add.at: each shape in turn
                row[self.base_of[k]] += share * self.weight[k];
            }
        }
        for (row, popular) in out.iter_mut().zip(&self.base_weight) {
            let got = np_sum(row);
            let want = np_sum(popular);
            if got > 0.0 {
                let scale = want / got;
                for v in row.iter_mut() {
                    *v *= scale;
                }
            } else {
                row.iter_mut().for_each(|v| *v = 0.0);
            }
        }
        out
    }
}

/// packing._leftover_dp: L(f) = f when no shape of milli `m` fits, else the weighted mean of
/// L(f - m_k) over the fitting shapes.
fn leftover_dp(m: &[i64], w: &[f64]) -> Vec<f64> {
    let mut out: Vec<f64> = (0..LEFTOVER).map(|f| f as f64).collect();
    let Some(&lo) = m.iter().min() else { return out };
    let mut terms = Vec::with_capacity(m.len());
    let mut weights = Vec::with_capacity(m.len());
    for f in lo.max(0) as usize..LEFTOVER {
        terms.clear();
        weights.clear();
        for (k, &mk) in m.iter().enumerate() {
            if mk as usize <= f {
                terms.push(w[k] * out[f - mk as usize]);
                weights.push(w[k]);
            }
        }
        out[f] = np_sum(&terms) / np_sum(&weights);
    }
    out
}

/// packing._fgd_int_score: int(100 * sigmoid(-delta / 1000)).
fn fgd_int(delta: f64) -> f64 {
    let sig = 1.0 / (1.0 + (delta / MILLI as f64).exp());
    (sig * 100.0).floor()
}

/// One node as the policies see it (a row of packing.NodeState).
struct View {
    cpu: i64,
    mem: i64,
    row: Vec<i64>,
    model: i64,
    /// row of the per-model tables: the model, or M without one
    mrow: usize,
}

/// FGD's per-shape statistics of a node: devices with the shape's milli free, the free milli
/// on the smaller devices, and the idle total.
struct FragStats {
    cnt: Vec<i64>,
    sless: Vec<f64>,
    total: f64,
}

/// Look-ahead statistics of a node: fully free devices, idle milli, Σ L(free).
struct FillStats {
    full: i64,
    idle: f64,
    left: f64,
}

/// The scoring of one task shape: the policy, the request and the shape tables.
struct Scorer<'a> {
    policy: GpuPacking,
    req: PodRequest,
    shapes: Option<&'a Shapes>,
    arrivals: Option<&'a [Vec<f64>]>,
}

impl Scorer<'_> {
    fn shapes(&self) -> &Shapes {
        self.shapes.expect("the shape policies run with their shapes")
    }

    fn frag_stats(&self, row: &[i64]) -> FragStats {
        let s = self.shapes();
        let mut cnt = Vec::with_capacity(s.milli.len());
        let mut sless = Vec::with_capacity(s.milli.len());
        for &m in &s.milli {
            let mut c = 0;
            let mut below = 0;
            for &f in row {
                if f >= m {
                    c += 1;
                } else {
                    below += f.max(0);
                }
            }
            cnt.push(c);
            sless.push(below as f64);
        }
        FragStats { cnt, sless, total: row.iter().map(|&f| f.max(0)).sum::<i64>() as f64 }
    }

    /// packing._frag: the expected fragmented milli against the shapes weighted `w`.
    fn frag(&self, cpu: i64, cnt: &[i64], sless: &[f64], total: f64, w: &[f64]) -> f64 {
        let s = self.shapes();
        let terms: Vec<f64> = (0..s.cpu.len())
            .map(|j| {
                let host = cpu >= s.cpu[j] && cnt[j] >= s.num[j];
                let saved = if host { total - sless[j] } else { 0.0 };
                saved * w[j]
            })
            .collect();
        total - np_sum(&terms)
    }

    /// packing._pair_delta: fragmentation growth when the shared request lands on a device
    /// with `f` free.
    fn frag_pair(&self, v: &View, st: &FragStats, before: f64, f: i64, w: &[f64]) -> f64 {
        let s = self.shapes();
        let f2 = f - self.req.milli;
        let mut cnt = st.cnt.clone();
        let mut sless = st.sless.clone();
        for j in 0..s.milli.len() {
            let m = s.milli[j];
            cnt[j] = cnt[j] - (f >= m) as i64 + (f2 >= m) as i64;
            let out = if f >= 0 && f < m { f } else { 0 };
            let inn = if f2 >= 0 && f2 < m { f2 } else { 0 };
            sless[j] = (sless[j] - out as f64) + inn as f64;
        }
        let after =
            self.frag(v.cpu - self.req.cpu, &cnt, &sless, st.total - self.req.milli as f64, w);
        after - before
    }

    /// packing.frag_delta for one node: the growth (best device for a shared request).
    fn frag_delta(&self, v: &View, w: &[f64]) -> f64 {
        let st = self.frag_stats(&v.row);
        let before = self.frag(v.cpu, &st.cnt, &st.sless, st.total, w);
        if self.req.shared() {
            let mut best = f64::INFINITY;
            for f in distinct_fitting(&v.row, self.req.milli) {
                best = best.min(self.frag_pair(v, &st, before, f, w));
            }
            return best;
        }
        let n = self.req.num;
        let cnt: Vec<i64> = st.cnt.iter().map(|&c| c - n).collect();
        let after =
            self.frag(v.cpu - self.req.cpu, &cnt, &st.sless, st.total - (MILLI * n) as f64, w);
        after - before
    }

    fn fill_stats(&self, v: &View) -> FillStats {
        let table = &self.shapes().leftover[v.mrow];
        let mut full = 0;
        let mut idle = 0i64;
        let left: Vec<f64> = v
            .row
            .iter()
            .map(|&f| {
                let pos = f.max(0);
                full += (f >= MILLI) as i64;
                idle += pos;
                table[pos as usize]
            })
            .collect();
        FillStats { full, idle: idle as f64, left: np_sum(&left) }
    }

    /// packing._fill_waste: the expected idle milli that a stream of each shape could not use.
    fn fill_waste(&self, cpu: i64, full: i64, idle: f64, left: f64, w: &[f64]) -> f64 {
        let s = self.shapes();
        let terms: Vec<f64> = (0..s.cpu.len())
            .map(|j| {
                let mut cnt = cpu.div_euclid(s.cpu[j].max(1)).max(0);
                let multi = s.num[j] > 1;
                if multi {
                    cnt = cnt.min(full.div_euclid(s.num[j].max(1)));
                }
                let gpu_ok = if multi { idle } else { idle - left };
                let usable = py_minimum((cnt * (s.milli[j] * s.num[j])) as f64, gpu_ok);
                usable * w[j]
            })
            .collect();
        idle - np_sum(&terms)
    }

    /// packing._fill_pair_delta for one device with `free` free.
    fn fill_pair(&self, v: &View, st: &FillStats, before: f64, free: i64, w: &[f64]) -> f64 {
        let table = &self.shapes().leftover[v.mrow];
        let f = free.max(0);
        let f2 = (f - self.req.milli).max(0);
        let left = (st.left - table[f as usize]) + table[f2 as usize];
        let after = self.fill_waste(
            v.cpu - self.req.cpu,
            st.full - (f >= MILLI) as i64,
            st.idle - self.req.milli as f64,
            left,
            w,
        );
        after - before
    }

    /// packing.fill_delta for one node: the look-ahead waste growth (best device if shared).
    fn fill_delta(&self, v: &View) -> f64 {
        let s = self.shapes();
        let w = &s.base_weight[v.mrow];
        let st = self.fill_stats(v);
        let before = self.fill_waste(v.cpu, st.full, st.idle, st.left, w);
        if self.req.shared() {
            let mut best = f64::INFINITY;
            for f in distinct_fitting(&v.row, self.req.milli) {
                best = best.min(self.fill_pair(v, &st, before, f, w));
            }
            return best;
        }
        let n = self.req.num;
        let table = &s.leftover[v.mrow];
        let gone = n as f64 * (table[MILLI as usize] - table[0]);
        let after = self.fill_waste(
            v.cpu - self.req.cpu,
            st.full - n,
            st.idle - (MILLI * n) as f64,
            st.left - gone,
            w,
        );
        after - before
    }

    /// packing.score for one node: higher is better, -inf where the pod does not fit.
    fn score(&self, v: &View) -> f64 {
        let p = &self.req;
        let fitting = v.row.iter().filter(|&&f| f >= p.milli).count() as i64;
        if v.cpu < p.cpu || v.mem < p.mem || v.model < 0 || fitting < p.num {
            return f64::NEG_INFINITY;
        }
        match self.policy {
            GpuPacking::BestFit => {
                let gpu_left: i64 = v.row.iter().map(|&f| f.max(0)).sum();
                let raw = 0.5 * ((v.cpu - p.cpu) as f64) / MAX_SPEC_CPU
                    + 0.5 * ((gpu_left - p.num * p.milli) as f64) / MAX_SPEC_GPU;
                ((1.0 - raw) * 100.0).trunc()
            }
            GpuPacking::Packing => {
                let ndev = v.row.iter().filter(|&&f| f >= 0).count() as i64;
                let full = v.row.iter().filter(|&&f| f == MILLI).count() as i64;
                if full == ndev {
                    return (100 / 3 - full).max(full) as f64;
                }
                if !p.shared() {
                    return (50 - p.num).max(33) as f64;
                }
                let tight = v.row.iter().copied().filter(|&f| f >= p.milli).min().unwrap_or(0);
                if tight >= MILLI {
                    49.0 // max(50 - 1, 33): a whole free device is the tightest fit
                } else {
                    (100 - (tight * 100 / MILLI) / 10).max(50) as f64
                }
            }
            GpuPacking::Fgd => fgd_int(self.frag_delta(v, &self.shapes().base_weight[v.mrow])),
            GpuPacking::Lookahead => {
                let arrivals = self.arrivals.expect("lookahead runs with its arrival weights");
                let fgd = fgd_int(self.frag_delta(v, &arrivals[v.mrow]));
                let ahead = self.fill_delta(v);
                fgd * 1e6 + (-ahead / LOOKAHEAD_STEP).floor()
            }
            GpuPacking::Kai => f64::NEG_INFINITY, // KAI's own scores (placement.rs)
        }
    }

    /// packing.choose_devices for a shared request: the device index on the node.
    fn device(&self, v: &View) -> usize {
        let p = &self.req;
        match self.policy {
            GpuPacking::Fgd | GpuPacking::Lookahead => {
                let s = self.shapes();
                let w = &s.base_weight[v.mrow];
                let st = self.frag_stats(&v.row);
                let before = self.frag(v.cpu, &st.cnt, &st.sless, st.total, w);
                let fill = (self.policy == GpuPacking::Lookahead).then(|| {
                    let fs = self.fill_stats(v);
                    let before = self.fill_waste(v.cpu, fs.full, fs.idle, fs.left, w);
                    (fs, before)
                });
                let mut best: Option<(f64, usize)> = None;
                for (j, &f) in v.row.iter().enumerate() {
                    let key = if f < p.milli {
                        if fill.is_some() {
                            f64::NEG_INFINITY
                        } else {
                            -1.0
                        }
                    } else {
                        let fgd = fgd_int(self.frag_pair(v, &st, before, f, w));
                        match &fill {
                            None => fgd,
                            Some((fs, fill_before)) => {
                                let ahead = self.fill_pair(v, fs, *fill_before, f, w);
                                fgd * 1e6 - ahead - 1e-6 * f as f64
                            }
                        }
                    };
                    if best.is_none_or(|(b, _)| key > b) {
                        best = Some((key, j));
                    }
                }
                best.map_or(0, |(_, j)| j)
            }
            _ => {
                // the tightest fit, the first of equals
                let mut best: Option<(i64, usize)> = None;
                for (j, &f) in v.row.iter().enumerate() {
                    let key = if f >= p.milli { f } else { i64::MAX };
                    if best.is_none_or(|(b, _)| key < b) {
                        best = Some((key, j));
                    }
                }
                best.map_or(0, |(_, j)| j)
            }
        }
    }
}

/// np.minimum of two floats (neither is NaN here): the smaller.
fn py_minimum(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

/// The distinct free values of the devices that fit `milli` (packing._distinct_pairs).
fn distinct_fitting(row: &[i64], milli: i64) -> impl Iterator<Item = i64> + '_ {
    row.iter()
        .enumerate()
        .filter(move |&(j, &f)| f >= milli && !row[..j].contains(&f))
        .map(|(_, &f)| f)
}

/// What the policies derive once per session, and the scores kept per task shape.
#[derive(Default)]
pub struct Memo {
    /// each node's GPU model id (-1 without GPUs), by product label in node order
    model: Vec<i64>,
    /// the typical shapes, made on first use (None inside: no GPU pods)
    shapes: Option<Option<Shapes>>,
    /// lookahead: each node's device slots and each model's sum of them as of the first
    /// `supply_seen` entries of `ClusterState::slots_log`, and the arrival weights for that supply
    slots: Vec<i64>,
    supply: Vec<i64>,
    supply_seen: usize,
    arrivals: Option<Vec<Vec<f64>>>,
    /// per task shape, per node: (the node's version, its score; -inf where the task does not
    /// fit on idle resources or the policy gives -inf)
    scores: FxHashMap<i32, Vec<(u64, f64)>>,
}

impl Memo {
    fn models(&mut self, sess: &Session) -> (Vec<i64>, FxHashMap<String, usize>) {
        let mut names: FxHashMap<String, usize> = FxHashMap::default();
        let mut out = vec![-1i64; sess.cluster.nodes.len()];
        for (i, node) in sess.cluster.nodes.iter().enumerate() {
            if sess.cluster.cap_gpu[i] > 0 {
                let label = node.labels.get(PRODUCT_LABEL).cloned().unwrap_or_default();
                let next = names.len();
                out[i] = *names.entry(label).or_insert(next) as i64;
            }
        }
        (out, names)
    }

    /// packing_policy.typical: the typical shapes of the session's GPU pods (every task there
    /// is now), each pinned to the GPU models it may use.
    fn typical(&mut self, sess: &Session) -> Option<Shapes> {
        let (model_of, names) = self.models(sess);
        self.model = model_of;
        let mut rows: Vec<(i64, i64, i64, usize)> = Vec::new();
        let mut pins: Vec<Option<Vec<usize>>> = Vec::new();
        for t in &sess.tasks {
            let req = &t.req;
            if req.gpus == 0 && req.gpu_fraction_milli == 0 {
                continue;
            }
            let products = pinned_products(&sess.constraints[t.constraints]);
            if let Some(products) = &products {
                if !products.iter().any(|p| names.contains_key(p)) {
                    continue;
                }
            }
            let pinned = products.map(|ps| {
                let ids: BTreeSet<usize> =
                    ps.iter().filter_map(|p| names.get(p).copied()).collect();
                ids.into_iter().collect()
            });
            let num = if req.gpus != 0 { req.gpus } else { 1 };
            let milli = if req.gpus != 0 { MILLI } else { req.gpu_fraction_milli };
            rows.push((req.cpu_m, num, milli, 0));
            pins.push(pinned);
        }
        if rows.is_empty() {
            return None;
        }
        let models = (self.model.iter().copied().max().unwrap_or(-1) + 1).max(1) as usize;
        let mut allowed: Vec<Vec<bool>> = Vec::with_capacity(rows.len());
        for (i, pinned) in pins.iter().enumerate() {
            let row = match pinned {
                None => vec![true; models],
                Some(ids) => (0..models).map(|m| ids.contains(&m)).collect(),
            };
            allowed.push(row);
            rows[i].3 = i;
        }
        Some(typical_shapes(&rows, &allowed))
    }

    /// packing.model_supply (device slots per model over every node) as of now: counted once,
    /// then moved by the nodes whose slots changed since. Whole counts: the float sums the
    /// Python makes of them are exact.
    fn sync_slots(&mut self, sess: &Session, models: usize) -> bool {
        if self.supply.len() != models {
            self.slots = sess.cluster.dev_slots.clone();
            self.supply = vec![0; models];
            for (n, &model) in self.model.iter().enumerate() {
                if model >= 0 && (model as usize) < models {
                    self.supply[model as usize] += self.slots[n];
                }
            }
            self.supply_seen = sess.cluster.slots_log.len();
            return true;
        }
        let mut changed = false;
        for &n in &sess.cluster.slots_log[self.supply_seen..] {
            let n = n as usize;
            let (old, new) = (self.slots[n], sess.cluster.dev_slots[n]);
            let model = self.model[n];
            if old != new && model >= 0 && (model as usize) < models {
                self.supply[model as usize] += new - old;
                changed = true;
            }
            self.slots[n] = new;
        }
        self.supply_seen = sess.cluster.slots_log.len();
        changed
    }

    fn view(&self, sess: &Session, n: usize, models: usize) -> View {
        let model = self.model.get(n).copied().unwrap_or(-1);
        View {
            cpu: sess.cluster.cap_cpu[n] - sess.cluster.used_cpu[n],
            mem: (sess.cluster.cap_mem[n] - sess.cluster.used_mem[n]).div_euclid(MIB),
            row: (0..sess.cluster.dev_width).map(|j| sess.cluster.slot_free(n, j)).collect(),
            model,
            mrow: if model >= 0 && (model as usize) < models { model as usize } else { models },
        }
    }
}

/// packing_policy._pinned_products: the GPU models `c` pins a pod to (a node selector on the
/// product label, or a required node affinity every term of which has an In on it), None when
/// not pinned.
fn pinned_products(c: &Constraints) -> Option<BTreeSet<String>> {
    let selected = c.node_selector.iter().rev().find(|(k, _)| k == PRODUCT_LABEL);
    let mut allowed: Option<BTreeSet<String>> =
        selected.map(|(_, v)| std::iter::once(v.clone()).collect());
    if let Some(terms) = c.node_affinity.as_ref().filter(|t| !t.is_empty()) {
        let per_term: Vec<Option<&Vec<String>>> = terms
            .iter()
            .map(|term| {
                term.iter()
                    .find(|r| !r.field && r.key == PRODUCT_LABEL && r.operator == "In")
                    .map(|r| &r.values)
            })
            .collect();
        if per_term.iter().all(Option::is_some) {
            let union: BTreeSet<String> =
                per_term.into_iter().flatten().flatten().cloned().collect();
            allowed = Some(match allowed {
                None => union,
                Some(a) => a.intersection(&union).cloned().collect(),
            });
        }
    }
    allowed
}

/// The nodes the GPU room index lists for `req`: every node where it could fit on idle
/// resources is among them (whole GPUs: that many free; a fraction: a live device with that
/// much room, or a free whole GPU).
fn candidates(sess: &Session, req: &Request, out: &mut Vec<i32>) {
    if req.gpus != 0 {
        for nodes in sess.cluster.by_free.range(req.gpus..).map(|(_, v)| v) {
            out.extend_from_slice(nodes);
        }
        return;
    }
    for nodes in sess.cluster.by_room.range(req.gpu_fraction_milli..).map(|(_, v)| v) {
        out.extend(nodes.iter().copied());
    }
    for nodes in sess.cluster.by_free.range(1..).map(|(_, v)| v) {
        out.extend_from_slice(nodes);
    }
}

/// (fits, fits on idle) of a task on a node: the placement's predicates, handed in.
pub type Fits = fn(&mut Session, usize, i32) -> (bool, bool);

/// What a policy picks: the node, the shared devices the task joins and those of them it opens
/// (placed on idle resources).
pub struct Picked {
    pub node: i32,
    pub groups: Vec<u32>,
    pub new_groups: Vec<u32>,
}

/// packing_policy.choose: the node and shared device the configured policy picks among the
/// nodes the task fits on idle resources (by `fits`), None for KAI's rules (a task the policies
/// do not model, or no such node the policy scores).
pub fn choose(sess: &mut Session, task: usize, fits: Fits) -> Option<Picked> {
    let req = sess.tasks[task].req;
    let preq = request(&req)?;
    let mut memo = sess.scratch.take::<Memo>().unwrap_or_default();
    let picked = pick(sess, &mut memo, task, &req, preq, fits);
    sess.scratch.put(memo);
    picked
}

fn pick(
    sess: &mut Session,
    memo: &mut Memo,
    task: usize,
    req: &Request,
    preq: PodRequest,
    fits_node: Fits,
) -> Option<Picked> {
    let policy = sess.config.gpu_packing;
    let by_shapes = matches!(policy, GpuPacking::Fgd | GpuPacking::Lookahead);
    let shape = sess.shape_of(task);
    let count = sess.cluster.nodes.len();
    let mut nodes = Vec::new();
    candidates(sess, req, &mut nodes);
    if let Some(within) = &sess.node_filter {
        nodes.retain(|&n| within.binary_search(&(n as usize)).is_ok());
    }
    if memo.shapes.is_some() && policy == GpuPacking::Lookahead {
        sync_supply(sess, memo);
    }
    let mut table = memo.scores.remove(&shape).unwrap_or_default();
    table.resize(count, (u64::MAX, f64::NEG_INFINITY));
    let mut best: Option<(f64, i32)> = None;
    for node in nodes {
        let n = node as usize;
        let ver = sess.cluster.node_ver[n];
        let value = if table[n].0 == ver {
            table[n].1
        } else {
            let (fits, idle) = fits_node(sess, task, node);
            let value = if !(fits && idle) {
                f64::NEG_INFINITY
            } else {
                if memo.shapes.is_none() {
                    // the first time any task fits on idle resources, as the Python's memo
                    memo.shapes = Some(memo.typical(sess));
                    if policy == GpuPacking::Lookahead {
                        sync_supply(sess, memo);
                    }
                }
                if by_shapes && memo.shapes.as_ref().is_some_and(Option::is_none) {
                    f64::NEG_INFINITY // unreachable: this task's own shape is among them
                } else {
                    scorer(memo, policy, preq).score(&memo.view(sess, n, models(memo)))
                }
            };
            table[n] = (ver, value);
            value
        };
        if value == f64::NEG_INFINITY {
            continue;
        }
        if best.is_none_or(|(b, at)| value > b || (value == b && node < at)) {
            best = Some((value, node));
        }
    }
    memo.scores.insert(shape, table);
    let (_, node) = best?;
    let n = node as usize;
    if !preq.shared() {
        return Some(Picked { node, groups: Vec::new(), new_groups: Vec::new() });
    }
    let device = scorer(memo, policy, preq).device(&memo.view(sess, n, models(memo)));
    if device < sess.cluster.groups[n].len() {
        let gid = sess.cluster.groups[n][device].gid;
        return Some(Picked { node, groups: vec![gid], new_groups: Vec::new() });
    }
    let gid = sess.cluster.new_group_id(node, &[]);
    Some(Picked { node, groups: vec![gid], new_groups: vec![gid] })
}

fn models(memo: &Memo) -> usize {
    match &memo.shapes {
        Some(Some(s)) => s.models,
        _ => 1,
    }
}

fn scorer(memo: &Memo, policy: GpuPacking, req: PodRequest) -> Scorer<'_> {
    Scorer {
        policy,
        req,
        shapes: memo.shapes.as_ref().and_then(Option::as_ref),
        arrivals: memo.arrivals.as_deref(),
    }
}

/// Lookahead's arrival weights follow the model supply: remade when the device slots changed
/// it, and the scores dropped when the weights changed (with one model they never do).
fn sync_supply(sess: &Session, memo: &mut Memo) {
    let Some(Some(shapes)) = &mut memo.shapes else { return };
    shapes.make_leftover();
    let models = shapes.models;
    if !memo.sync_slots(sess, models) && memo.arrivals.is_some() {
        return;
    }
    let Some(Some(shapes)) = &memo.shapes else { return };
    let supply: Vec<f64> = memo.supply.iter().map(|&s| s as f64).collect();
    let weights = shapes.arrival_weight(&supply);
    let same = memo.arrivals.as_ref().is_some_and(|old| {
        old.iter().flatten().zip(weights.iter().flatten()).all(|(a, b)| a.to_bits() == b.to_bits())
    });
    if !same {
        if memo.arrivals.is_some() {
            memo.scores.clear();
        }
        memo.arrivals = Some(weights);
    }
}

#[cfg(test)]
mod tests {
    use super::{np_sum, pairwise};

    #[test]
    fn sums_pair_up_as_numpy_does() {
        // 0.1 + 0.2 + 0.3 ... differ by order: blocks of 8 are summed in 8 lanes, then paired
        let a: Vec<f64> = (1..=20).map(|i| i as f64 / 10.0).collect();
        let mut r = [0.0; 8];
        r.copy_from_slice(&a[..8]);
        for i in 8..16 {
            r[i - 8] += a[i];
        }
        let mut want = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for v in &a[16..] {
            want += v;
        }
        assert_eq!(pairwise(&a).to_bits(), want.to_bits());
        assert_eq!(np_sum(&[]), 0.0);
        let long: Vec<f64> = (0..300).map(|i| 1.0 / (i as f64 + 1.0)).collect();
        assert_eq!(pairwise(&long), pairwise(&long[..144]) + pairwise(&long[144..]));
    }
}
