//! The cluster's nodes for one session (kai_ray/core/cluster.py; KAI's NodeInfo): capacity,
//! what the pods use, split as KAI splits it into idle and releasing, whole GPUs and shared GPU
//! devices (KAI's GPU groups). Per-node vectors by node index, nodes in name order; where the
//! Python keeps numpy arrays of the shared devices, the rows here are the node's groups.
//!
//! The operations here move one task's resources on or off its node; which ones a decision
//! calls, and undoing them, is the Statement's (statement.rs). Besides KAI's numbers this keeps
//! indexes only the Rust core has (the GPU room index, the recount log, the device slots), so
//! the passes over every node can look at the nodes that matter or that changed.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::constraints::Taint;
use crate::jobs::Task;
use crate::model::{Amounts, Node, PodStatus, Request, MILLI};

/// The GPU entry of `Amounts`.
pub const GPU: usize = 2;

/// A shared GPU device (KAI GPU group): usage in milli of the device (`used`: all active
/// sharers, releasing ones included).
#[derive(Clone, Debug)]
pub struct Group {
    pub gid: u32,
    /// the active sharers but pipelined ones (KAI's AllocatedSharedGPUsMemory)
    pub used: i64,
    /// the releasing sharers less the pipelined ones (KAI's ReleasingSharedGPUsMemory: may be
    /// negative); `MILLI - used + releasing` is the room, every sharer counted once
    pub releasing: i64,
    /// what the pipelined sharers take (`used + pipelined`: KAI's UsedSharedGPUsMemory)
    pub pipelined: i64,
    /// an unpipelined sharer opened the device, so KAI took it from the idle GPUs
    /// (gpu_sharing_node_info.go:120-127) and gives it back only once no sharer at all is
    /// left (:212-217): pipelined sharers alone then keep it out of idle; one a pipelined
    /// sharer opened is taken from releasing (:113-119)
    pub from_idle: bool,
    pub tasks: Vec<usize>,
}

/// Nodes a constraint keeps a task on (None: all), and per untolerated taint the nodes it does
/// not keep the task off, with Kubernetes' wording.
#[derive(Clone, Debug)]
pub struct NodeMasks {
    pub selector: Option<Vec<bool>>,
    pub tolerated: Option<Vec<bool>>,
    pub per_taint: Vec<(Vec<bool>, String)>,
}

/// Nodes, in name order.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub name: String,
    pub labels: FxHashMap<String, String>,
    pub taints: Vec<Taint>,
}

/// Nodes, their usage and their shared devices.
pub struct ClusterState {
    pub nodes: Vec<NodeInfo>,
    pub node_index: FxHashMap<String, i32>,
    pub any_taints: bool,
    pub schedulable: Vec<bool>,
    pub cap_cpu: Vec<i64>,
    pub cap_mem: Vec<i64>,
    pub cap_gpu: Vec<i64>,
    pub max_pods: Vec<i64>,
    pub gpu_mem: Vec<i64>,
    pub gpu_mem_synced: Vec<bool>,
    // usage as KAI's NodeInfo splits it (addTaskResources): "used" is what idle lacks (all
    // active pods, releasing ones included, but pipelined ones); "rel" is KAI's Releasing:
    // the releasing pods less the pipelined ones (may be negative)
    pub used_cpu: Vec<i64>,
    pub rel_cpu: Vec<i64>,
    pub used_mem: Vec<i64>,
    pub rel_mem: Vec<i64>,
    pub used_pods: Vec<i64>,
    /// whole-GPU pods' devices, and the releasing part, split as above
    pub whole_used: Vec<i64>,
    pub whole_rel: Vec<i64>,
    /// whole GPUs plus one per live shared device (`refresh_gpu`), split as above
    pub used_gpu: Vec<i64>,
    pub rel_gpu: Vec<i64>,
    pub groups: Vec<Vec<Group>>,
    /// device ids, interned (`intern_gid`): a group's `gid` indexes `gids`
    pub gids: Vec<String>,
    pub gid_index: FxHashMap<String, u32>,
    /// the device ids the snapshot's pods name (a new device's id avoids them: `new_group_id`)
    pub known_groups: FxHashSet<u32>,
    /// capacity of the schedulable nodes
    pub total: Amounts,
    widest: Option<i32>,
    /// whether the packing policy is `lookahead` (`refresh_gpu` then keeps `dev_slots`)
    lookahead: bool,
    // the GPU room index (see `index_gpu_room`): placement looks up the nodes with room for a
    // GPU task here instead of passing over every node
    pub indexed: bool,
    pub gpu_free_at: Vec<i64>,
    pub dev_room_at: Vec<i64>,
    pub idle_at: Vec<i64>,
    pub counted: Vec<bool>,
    pub free_counts: BTreeMap<i64, i64>,
    pub idle_counts: BTreeMap<i64, i64>,
    pub by_free: BTreeMap<i64, Vec<i32>>,
    pub by_room: BTreeMap<i64, FxHashSet<i32>>,
    /// bumped on every change to a node's usage (and its undo): the packing policies keep a
    /// node's score until it changes
    pub node_ver: Vec<u64>,
    /// device slots per node as the packing policies see them (`slot_free`), kept by
    /// `refresh_gpu` under `lookahead` (its arrival weights follow each model's slots), and
    /// the nodes whose count changed, in turn
    pub dev_width: usize,
    pub dev_slots: Vec<i64>,
    pub slots_log: Vec<u32>,
    /// every node whose GPU counts were recounted (`refresh_gpu`), in turn, undo included:
    /// a reader that remembers how far it read (the victim search's idle-GPU filter) looks
    /// again only at the nodes after that
    pub gpu_log: Vec<u32>,
}

impl ClusterState {
    /// The snapshot's nodes, in name order, with nothing on them yet (the session loads the
    /// pods, then calls `index_gpu_room`).
    pub fn new(mut snap_nodes: Vec<Node>, lookahead: bool) -> ClusterState {
        snap_nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let count = snap_nodes.len();
        let mut node_index = FxHashMap::default();
        for (i, n) in snap_nodes.iter().enumerate() {
            node_index.insert(n.name.clone(), i as i32);
        }
        let schedulable: Vec<bool> =
            snap_nodes.iter().map(|n| n.ready && !n.unschedulable).collect();
        let cap_cpu: Vec<i64> = snap_nodes.iter().map(|n| n.cpu_m - n.foreign_cpu_m).collect();
        let cap_mem: Vec<i64> = snap_nodes.iter().map(|n| n.memory - n.foreign_memory).collect();
        let cap_gpu: Vec<i64> = snap_nodes.iter().map(|n| n.gpus - n.foreign_gpus).collect();
        let max_pods = snap_nodes.iter().map(|n| n.max_pods - n.foreign_pods).collect();
        let gpu_mem = snap_nodes.iter().map(|n| n.gpu_memory_mib.max(1)).collect();
        let gpu_mem_synced = snap_nodes.iter().map(|n| n.gpu_memory_synced).collect();
        let any_taints = snap_nodes.iter().any(|n| !n.taints.is_empty());
        let nodes: Vec<NodeInfo> = snap_nodes
            .into_iter()
            .map(|n| NodeInfo {
                name: n.name,
                labels: n.labels.into_iter().collect(),
                taints: n.taints,
            })
            .collect();
        let mut total = [0i64; 3];
        for n in 0..count {
            if schedulable[n] {
                total[0] += cap_cpu[n];
                total[1] += cap_mem[n];
                total[2] += cap_gpu[n];
            }
        }
        let dev_width = cap_gpu.iter().copied().max().unwrap_or(1).max(1) as usize;
        let mut cluster = ClusterState {
            nodes,
            node_index,
            any_taints,
            schedulable,
            cap_cpu,
            cap_mem,
            cap_gpu,
            max_pods,
            gpu_mem,
            gpu_mem_synced,
            used_cpu: vec![0; count],
            rel_cpu: vec![0; count],
            used_mem: vec![0; count],
            rel_mem: vec![0; count],
            used_pods: vec![0; count],
            whole_used: vec![0; count],
            whole_rel: vec![0; count],
            used_gpu: vec![0; count],
            rel_gpu: vec![0; count],
            groups: vec![Vec::new(); count],
            gids: Vec::new(),
            gid_index: FxHashMap::default(),
            known_groups: FxHashSet::default(),
            total: [total[0] as f64, total[1] as f64, total[2] as f64],
            widest: None,
            lookahead,
            indexed: false,
            gpu_free_at: vec![-1; count],
            dev_room_at: vec![-1; count],
            idle_at: vec![0; count],
            counted: vec![false; count],
            free_counts: BTreeMap::new(),
            idle_counts: BTreeMap::new(),
            by_free: BTreeMap::new(),
            by_room: BTreeMap::new(),
            node_ver: vec![0; count],
            dev_width,
            dev_slots: vec![0; count],
            slots_log: Vec::new(),
            gpu_log: Vec::new(),
        };
        for n in 0..count {
            cluster.dev_slots[n] = cluster.slot_count(n);
        }
        cluster
    }

    pub fn intern_gid(&mut self, gid: &str) -> u32 {
        if let Some(&id) = self.gid_index.get(gid) {
            return id;
        }
        let id = self.gids.len() as u32;
        self.gids.push(gid.to_string());
        self.gid_index.insert(gid.to_string(), id);
        id
    }

    /// A shared-device id that no pod in the snapshot and no device on the node uses: the first
    /// free number on the node, so it depends on the state alone. `besides`: ids already
    /// picked for the same pod.
    pub fn new_group_id(&mut self, node: i32, besides: &[u32]) -> u32 {
        let mut k = 0;
        loop {
            k += 1;
            let gid = format!("{}-gpu-{}", self.nodes[node as usize].name, k);
            let known = self.gid_index.get(&gid).copied();
            if let Some(id) = known {
                if self.known_groups.contains(&id)
                    || self.groups[node as usize].iter().any(|g| g.gid == id)
                    || besides.contains(&id)
                {
                    continue;
                }
                return id;
            }
            return self.intern_gid(&gid);
        }
    }

    // ------------------------------------------------------------------ amounts
    /// Milli of one device a shared request takes on this node.
    pub fn device_cost(&self, req: &Request, node: i32) -> i64 {
        if req.gpu_fraction_milli != 0 {
            return req.gpu_fraction_milli;
        }
        ((req.gpu_memory_mib * MILLI) as f64 / self.gpu_mem[node as usize] as f64).ceil() as i64
    }

    /// GPU portion recorded for a shared pod on this node (gpu-memory rounds up to 1/100).
    pub fn portion(&self, req: &Request, node: i32) -> f64 {
        if req.gpu_fraction_milli != 0 {
            return req.gpu_fraction_milli as f64 / MILLI as f64;
        }
        (req.gpu_memory_mib as f64 / self.gpu_mem[node as usize] as f64 * 100.0).ceil() / 100.0
    }

    /// What a placed task is charged to its queue (a gpu-memory pod's share of a GPU depends
    /// on its node's device memory).
    pub fn queue_amount(&self, task: &Task) -> Amounts {
        let req = &task.req;
        let gpu = if req.gpus != 0 {
            req.gpus as f64
        } else if req.is_shared() && task.node >= 0 {
            self.portion(req, task.node) * req.fraction_devices as f64
        } else {
            0.0
        };
        [req.cpu_m as f64, req.memory as f64, gpu]
    }

    /// The node whose GPUs have the most memory (the first of them), 0 when none.
    pub fn widest_gpu_node(&mut self) -> i32 {
        if self.widest.is_none() {
            let mut best = 0usize;
            for i in 0..self.gpu_mem.len() {
                if self.gpu_mem[i] > self.gpu_mem[best] {
                    best = i;
                }
            }
            self.widest = Some(best as i32);
        }
        self.widest.unwrap_or(0)
    }

    // ------------------------------------------------------------------ queries
    pub fn free_gpu_at(&self, n: usize) -> i64 {
        self.cap_gpu[n] - self.used_gpu[n] + self.rel_gpu[n]
    }

    pub fn free_cpu_at(&self, n: usize) -> i64 {
        self.cap_cpu[n] - self.used_cpu[n] + self.rel_cpu[n]
    }

    pub fn group(&self, node: i32, gid: u32) -> Option<&Group> {
        self.groups[node as usize].iter().find(|g| g.gid == gid)
    }

    /// Free milli-GPU of device slot `j` of node `n` as the packing policies see the session
    /// (packing_policy.node_state): the shared devices first, in their order, then the idle
    /// whole devices, then the busy ones (0); -1 past the node's devices.
    pub fn slot_free(&self, n: usize, j: usize) -> i64 {
        let groups = &self.groups[n];
        if j < groups.len() {
            return MILLI - groups[j].used;
        }
        let idle_whole = (self.cap_gpu[n] - self.used_gpu[n]).max(0);
        let j = j as i64;
        if j < groups.len() as i64 + idle_whole {
            MILLI
        } else if j < self.cap_gpu[n] {
            0
        } else {
            -1
        }
    }

    /// The node's device slots (`slot_free >= 0`): what the policies' model supply counts.
    pub fn slot_count(&self, n: usize) -> i64 {
        (0..self.dev_width).filter(|&j| self.slot_free(n, j) >= 0).count() as i64
    }

    // ------------------------------------------------------------------ the GPU room index
    /// Per node, kept up to date by `refresh_gpu` once built: whole GPUs free (idle or
    /// releasing; -1 on a node that is not schedulable), the most room a live shared device
    /// has (-1: none), and how many schedulable GPU nodes have each free amount (binpack
    /// normalises over them). Built once the snapshot's pods are on their nodes.
    pub fn index_gpu_room(&mut self) {
        let count = self.nodes.len();
        for n in 0..count {
            if !self.schedulable[n] {
                self.gpu_free_at[n] = -1;
                self.dev_room_at[n] = -1;
                continue;
            }
            self.gpu_free_at[n] = self.cap_gpu[n] - self.used_gpu[n] + self.rel_gpu[n];
            self.dev_room_at[n] = device_room(&self.groups[n]);
        }
        for n in 0..count {
            let gpu_node = self.schedulable[n] && self.cap_gpu[n] > 0;
            self.counted[n] = gpu_node;
            let idle = self.cap_gpu[n] - self.used_gpu[n];
            self.idle_at[n] = idle;
            if !gpu_node {
                continue;
            }
            let value = self.gpu_free_at[n];
            *self.free_counts.entry(value).or_insert(0) += 1;
            if value > 0 {
                self.by_free.entry(value).or_default().push(n as i32);
            }
            *self.idle_counts.entry(idle).or_insert(0) += 1;
        }
        for n in 0..count {
            let most = self.dev_room_at[n];
            if most > 0 {
                self.by_room.entry(most).or_default().insert(n as i32);
            }
        }
        self.indexed = true;
    }

    fn reindex_gpu_room(&mut self, node: i32, devices: bool) {
        let n = node as usize;
        if !self.schedulable[n] {
            return;
        }
        let idle = self.cap_gpu[n] - self.used_gpu[n];
        let free = idle + self.rel_gpu[n];
        let old = self.gpu_free_at[n];
        if free != old {
            if self.counted[n] {
                recount(&mut self.free_counts, old, free);
                if old > 0 {
                    if let Some(bucket) = self.by_free.get_mut(&old) {
                        if let Ok(at) = bucket.binary_search(&node) {
                            bucket.remove(at);
                        }
                        if bucket.is_empty() {
                            self.by_free.remove(&old);
                        }
                    }
                }
                if free > 0 {
                    let joined = self.by_free.entry(free).or_default();
                    if let Err(at) = joined.binary_search(&node) {
                        joined.insert(at, node);
                    }
                }
            }
            self.gpu_free_at[n] = free;
        }
        if idle != self.idle_at[n] {
            if self.counted[n] {
                recount(&mut self.idle_counts, self.idle_at[n], idle);
            }
            self.idle_at[n] = idle;
        }
        if !devices {
            return;
        }
        let room = device_room(&self.groups[n]);
        let old_room = self.dev_room_at[n];
        if room != old_room {
            if old_room > 0 {
                if let Some(nodes) = self.by_room.get_mut(&old_room) {
                    nodes.remove(&node);
                    if nodes.is_empty() {
                        self.by_room.remove(&old_room);
                    }
                }
            }
            if room > 0 {
                self.by_room.entry(room).or_default().insert(node);
            }
            self.dev_room_at[n] = room;
        }
    }

    // ------------------------------------------------------------------ node bookkeeping
    /// Recount the node's GPUs (`devices` false: its shared devices did not change).
    pub fn refresh_gpu(&mut self, node: i32, devices: bool) {
        let n = node as usize;
        // a device some unpipelined sharer holds is not idle; one all of whose sharers are
        // releasing is releasing; one only pipelined sharers hold is taken from releasing (KAI:
        // a sharer pipelined onto an empty or all-releasing device takes a releasing GPU),
        // unless an unpipelined sharer opened it (a job allocate pipelines whole once one of
        // its pods is: Group::from_idle)
        let (mut used, mut rel) = (self.whole_used[n], self.whole_rel[n]);
        for g in &self.groups[n] {
            if g.used > 0 || g.from_idle {
                used += 1;
                if g.used == g.releasing {
                    rel += 1;
                }
            } else {
                rel -= 1;
            }
        }
        self.used_gpu[n] = used;
        self.rel_gpu[n] = rel;
        self.node_ver[n] += 1;
        self.gpu_log.push(n as u32);
        if self.lookahead {
            let slots = self.slot_count(n);
            if slots != self.dev_slots[n] {
                self.dev_slots[n] = slots;
                self.slots_log.push(n as u32);
            }
        }
        if self.indexed {
            self.reindex_gpu_room(node, devices);
        }
    }

    pub fn add_usage(&mut self, node: i32, cpu: i64, memory: i64, pods: i64) {
        if node < 0 {
            return;
        }
        let n = node as usize;
        self.node_ver[n] += 1;
        self.used_cpu[n] += cpu;
        self.used_mem[n] += memory;
        self.used_pods[n] += pods;
    }

    /// Put the task on `node` (on devices `groups` when shared), pipelined or not.
    pub fn place(&mut self, task: &mut Task, node: i32, groups: Vec<u32>, pipelined: bool) {
        let req = task.req;
        self.add_usage(node, req.cpu_m, req.memory, 1);
        self.hold_gpus(task, node, groups, pipelined);
        if pipelined {
            self.pipeline_charge(task, 1, false);
        }
        if req.wants_gpu() {
            self.refresh_gpu(node, req.gpus == 0);
        }
    }

    /// The task on `node`: its whole GPUs or its share of devices `groups`, and what it is
    /// charged (the node's GPU counts are left to `refresh_gpu`).
    pub fn hold_gpus(&mut self, task: &mut Task, node: i32, groups: Vec<u32>, pipelined: bool) {
        let req = task.req;
        let n = node as usize;
        self.node_ver[n] += 1;
        if req.gpus != 0 {
            self.whole_used[n] += req.gpus;
        } else if req.is_shared() {
            let cost = self.device_cost(&req, node);
            task.gpu_mem_cost = cost;
            for &gid in &groups {
                let devices = &mut self.groups[n];
                let at = match devices.iter().position(|g| g.gid == gid) {
                    Some(at) => at,
                    None => {
                        devices.push(Group {
                            gid,
                            used: 0,
                            releasing: 0,
                            pipelined: 0,
                            from_idle: !pipelined,
                            tasks: Vec::new(),
                        });
                        devices.len() - 1
                    }
                };
                let g = &mut devices[at];
                g.used += cost;
                if !g.tasks.contains(&task.idx) {
                    g.tasks.push(task.idx);
                }
            }
        }
        task.node = node;
        task.groups = groups;
        task.accepted_gpu = self.queue_amount(task)[GPU];
    }

    /// Take the task off its node (its devices go with their last sharer).
    pub fn remove(&mut self, task: &mut Task) {
        if task.status == PodStatus::Pipelined {
            self.pipeline_charge(task, -1, false);
        }
        let (node, req) = (task.node, task.req);
        let n = node as usize;
        if node >= 0 {
            self.node_ver[n] += 1;
        }
        self.add_usage(node, -req.cpu_m, -req.memory, -1);
        if req.gpus != 0 {
            self.whole_used[n] -= req.gpus;
        } else if req.is_shared() {
            let cost = task.gpu_mem_cost;
            for &gid in &task.groups {
                let devices = &mut self.groups[n];
                if let Some(at) = devices.iter().position(|g| g.gid == gid) {
                    let g = &mut devices[at];
                    g.used -= cost;
                    g.tasks.retain(|&t| t != task.idx);
                    if g.tasks.is_empty() {
                        devices.remove(at);
                    }
                }
            }
        }
        if req.wants_gpu() {
            self.refresh_gpu(node, req.gpus == 0);
        }
        task.node = -1;
        task.groups = Vec::new();
    }

    /// A placed task starts (sign 1) or stops (-1) releasing.
    pub fn mark_releasing(&mut self, task: &Task, sign: i64) {
        let (node, req) = (task.node, task.req);
        if node < 0 {
            return; // a pod on a node the snapshot does not have: nothing of ours to release
        }
        let n = node as usize;
        self.node_ver[n] += 1;
        self.rel_cpu[n] += sign * req.cpu_m;
        self.rel_mem[n] += sign * req.memory;
        if req.gpus != 0 {
            self.whole_rel[n] += sign * req.gpus;
        } else if req.is_shared() {
            let cost = task.gpu_mem_cost;
            for &gid in &task.groups {
                if let Some(g) = self.groups[n].iter_mut().find(|g| g.gid == gid) {
                    g.releasing += sign * cost;
                }
            }
        }
        if req.wants_gpu() {
            self.refresh_gpu(node, req.gpus == 0);
        }
    }

    /// A placed task becomes pipelined (sign 1) or stops being so (-1). KAI charges a Pipelined
    /// pod to the node's releasing resources and leaves its idle ones alone
    /// (NodeInfo.addTaskResources): its amounts leave `used` and `rel` both, so the room with
    /// releasing stays.
    pub fn pipeline_charge(&mut self, task: &Task, sign: i64, refresh: bool) {
        let (node, req) = (task.node, task.req);
        if node < 0 {
            return;
        }
        let n = node as usize;
        self.node_ver[n] += 1;
        self.used_cpu[n] -= sign * req.cpu_m;
        self.used_mem[n] -= sign * req.memory;
        self.rel_cpu[n] -= sign * req.cpu_m;
        self.rel_mem[n] -= sign * req.memory;
        if req.gpus != 0 {
            self.whole_used[n] -= sign * req.gpus;
            self.whole_rel[n] -= sign * req.gpus;
        } else if req.is_shared() {
            let cost = sign * task.gpu_mem_cost;
            for &gid in &task.groups {
                if let Some(g) = self.groups[n].iter_mut().find(|g| g.gid == gid) {
                    g.used -= cost;
                    g.releasing -= cost;
                    g.pipelined += cost;
                    if g.tasks.len() == 1 {
                        // KAI moves a pod between Allocated and Pipelined by removing and
                        // adding it: its device alone, it empties and the pod opens it again
                        g.from_idle = sign < 0;
                    }
                }
            }
        }
        if refresh && req.wants_gpu() {
            self.refresh_gpu(node, req.gpus == 0);
        }
    }

    /// The node charge of a placed task whose status goes from `old` to `new`.
    pub fn set_charge(&mut self, task: &Task, old: PodStatus, new: PodStatus) {
        if old == PodStatus::Pipelined && new != PodStatus::Pipelined {
            self.pipeline_charge(task, -1, true);
        } else if new == PodStatus::Pipelined && old != PodStatus::Pipelined {
            self.pipeline_charge(task, 1, true);
        }
    }
}

fn recount(counts: &mut BTreeMap<i64, i64>, old: i64, new: i64) {
    let left = counts.get(&old).copied().unwrap_or(0) - 1;
    if left == 0 {
        counts.remove(&old);
    } else {
        counts.insert(old, left);
    }
    *counts.entry(new).or_insert(0) += 1;
}

/// The most room on a live device (not entirely releasing; -1: none).
fn device_room(groups: &[Group]) -> i64 {
    let mut room = -1i64;
    for g in groups {
        let free = MILLI - g.used + g.releasing;
        if g.releasing < g.used && free > room {
            room = free;
        }
    }
    room
}
