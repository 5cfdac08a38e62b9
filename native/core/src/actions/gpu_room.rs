//! What victims would free, as KAI's accumulated idle-GPU filter sees it, made device-aware
//! (the filter of kai_ray/core/actions/gpu_room.py, kept incrementally here: the Python
//! computes it plainly): free whole GPUs per node and room per shared device
//! (`FreeGpus`), what a set of victims frees (`Freed`), the filter for one prefix of a job's
//! tasks (`GpuRoom`) and the filter with every candidate victim gone (`AllFreed`).

use rustc_hash::FxHashMap;

use crate::cluster::Group;
use crate::model::MILLI;
use crate::state::Session;

/// Whether victims freeing `amount` of a shared device make it a whole GPU for KAI's idle-GPU
/// filter. A device only pipelined sharers hold KAI counts in neither of a node's sums
/// (GetSumOfIdleGPUs, GetSumOfReleasingGPUs: gpu_sharing_node_info.go:303-325), and its victims
/// add only their own fractions (idle_gpus.go:209): whole once those make a device.
pub fn freed_whole(group: &Group, amount: i64) -> bool {
    if group.used <= 0 {
        return amount >= MILLI;
    }
    amount + group.releasing >= group.used
}

pub type DevKey = (i32, u32);

/// Free whole GPUs per node and free room per shared device, sparse. Computed once per session
/// state; the device map only when a fractional request needs it.
#[derive(Clone, Debug)]
pub struct FreeGpus {
    pub whole: FxHashMap<i32, i64>,
    devices: Option<FxHashMap<DevKey, i64>>,
    device_totals: Option<(i64, i64)>,
    top: Option<Vec<(i64, DevKey)>>,
    top_count: usize,
    top_whole: Option<Vec<(i64, i32)>>,
    whole_totals: Option<(i64, i64)>,
    /// for a view with victims gone (`with_freed`): what they free on shared devices
    freed_devices: Option<FxHashMap<DevKey, i64>>,
    /// how far `ClusterState::gpu_log` was read (`renewed`)
    read: usize,
}

impl FreeGpus {
    pub fn new(sess: &Session) -> FreeGpus {
        let mut whole = FxHashMap::default();
        for n in 0..sess.cluster.nodes.len() {
            set_free(sess, &mut whole, n);
        }
        let mut out = FreeGpus::with_whole(whole);
        out.read = sess.cluster.gpu_log.len();
        out
    }

    /// The same for the session as it is now, counting again only the nodes recounted since
    /// (`ClusterState::gpu_log`) rather than every node.
    pub fn renewed(self, sess: &Session) -> FreeGpus {
        let mut whole = self.whole;
        for &n in &sess.cluster.gpu_log[self.read..] {
            set_free(sess, &mut whole, n as usize);
        }
        let mut out = FreeGpus::with_whole(whole);
        out.read = sess.cluster.gpu_log.len();
        out
    }

    fn with_whole(whole: FxHashMap<i32, i64>) -> FreeGpus {
        FreeGpus {
            whole,
            devices: None,
            device_totals: None,
            top: None,
            top_count: 0,
            top_whole: None,
            whole_totals: None,
            freed_devices: None,
            read: 0,
        }
    }

    /// Room per shared device that has some (and is not entirely releasing).
    pub fn devices(&mut self, sess: &Session) -> &FxHashMap<DevKey, i64> {
        if self.devices.is_none() {
            // at least one device per node the room index lists
            let nodes = sess.cluster.by_room.values().map(|n| n.len()).sum();
            let mut devices = FxHashMap::with_capacity_and_hasher(nodes, Default::default());
            for nodes in sess.cluster.by_room.values() {
                for &node in nodes {
                    for g in &sess.cluster.groups[node as usize] {
                        let room = MILLI - g.used + g.releasing;
                        if g.releasing < g.used && room > 0 {
                            devices.insert((node, g.gid), room);
                        }
                    }
                }
            }
            if let Some(freed) = &self.freed_devices {
                for (&key, &amount) in freed {
                    let Some(group) = sess.cluster.group(key.0, key.1) else { continue };
                    if freed_whole(group, amount) {
                        devices.remove(&key);
                    } else {
                        devices.insert(key, MILLI - group.used + group.releasing + amount);
                    }
                }
            }
            self.devices = Some(devices);
        }
        self.devices.as_ref().expect("devices")
    }

    /// The `count` roomiest shared devices (room, key), roomiest first.
    pub fn top_rooms(&mut self, sess: &Session, count: usize) -> Vec<(i64, DevKey)> {
        self.ranked_rooms(sess, count).to_vec()
    }

    /// The first `count` of `top_rooms` not in `except`, without copying those before.
    pub fn top_rooms_except(
        &mut self,
        sess: &Session,
        count: usize,
        except: &FxHashMap<DevKey, i64>,
    ) -> Vec<(i64, DevKey)> {
        let mut asked = count;
        loop {
            if let Some(out) = first_except(self.ranked_rooms(sess, asked), asked, count, except) {
                return out;
            }
            asked = (2 * asked).min(count + except.len());
        }
    }

    fn ranked_rooms(&mut self, sess: &Session, count: usize) -> &[(i64, DevKey)] {
        if count == 0 {
            return &[];
        }
        let stale = match &self.top {
            None => true,
            Some(top) => top.len() < count && self.top_count < count,
        };
        if stale {
            let limit = count.max(2 * self.top_count).max(32);
            let top = largest(limit, self.devices(sess));
            self.top = Some(top);
            self.top_count = limit;
        }
        let top = self.top.as_ref().expect("top");
        &top[..count.min(top.len())]
    }

    /// The `count` nodes with the most free whole GPUs (gpus, node), most first.
    pub fn top_whole(&mut self, count: usize) -> Vec<(i64, i32)> {
        self.ranked_whole(count).to_vec()
    }

    /// The first `count` of `top_whole` not in `except`, without copying those before.
    pub fn top_whole_except(
        &mut self,
        count: usize,
        except: &FxHashMap<i32, i64>,
    ) -> Vec<(i64, i32)> {
        let mut asked = count;
        loop {
            if let Some(out) = first_except(self.ranked_whole(asked), asked, count, except) {
                return out;
            }
            asked = (2 * asked).min(count + except.len());
        }
    }

    fn ranked_whole(&mut self, count: usize) -> &[(i64, i32)] {
        if count == 0 {
            return &[];
        }
        let stale = match &self.top_whole {
            None => true,
            Some(top) => top.len() < count && top.len() < self.whole.len(),
        };
        if stale {
            let known = self.top_whole.as_ref().map_or(0, |t| t.len());
            let limit = count.max(2 * known).max(32);
            self.top_whole = Some(largest(limit, &self.whole));
        }
        let top = self.top_whole.as_ref().expect("top whole");
        &top[..count.min(top.len())]
    }

    /// Free whole GPUs: in total and on the roomiest node.
    pub fn whole_totals(&mut self) -> (i64, i64) {
        if self.whole_totals.is_none() {
            let total = self.whole.values().sum();
            let most = self.whole.values().copied().max().unwrap_or(0);
            self.whole_totals = Some((total, most));
        }
        self.whole_totals.expect("totals")
    }

    /// Room on partly used shared devices: in total and on the roomiest device.
    pub fn device_totals(&mut self, sess: &Session) -> (i64, i64) {
        if self.device_totals.is_none() {
            let rooms: Vec<i64> = self.devices(sess).values().copied().filter(|&v| v > 0).collect();
            self.device_totals =
                Some((rooms.iter().sum(), rooms.iter().copied().max().unwrap_or(0)));
        }
        self.device_totals.expect("device totals")
    }

    /// The same after every victim counted in `freed` is gone.
    pub fn with_freed(&self, sess: &Session, freed: &Freed) -> FreeGpus {
        let mut whole = self.whole.clone();
        for (&node, &gpus) in &freed.whole {
            if gpus != 0 {
                *whole.entry(node).or_insert(0) += gpus;
            }
        }
        for (&key, &amount) in &freed.device {
            if let Some(group) = sess.cluster.group(key.0, key.1) {
                if freed_whole(group, amount) {
                    *whole.entry(key.0).or_insert(0) += 1;
                }
            }
        }
        let mut out = FreeGpus::with_whole(whole);
        out.freed_devices = Some(freed.device.clone());
        out
    }
}

/// Node `n`'s free whole GPUs in `whole` (absent: none, or not schedulable).
fn set_free(sess: &Session, whole: &mut FxHashMap<i32, i64>, n: usize) {
    let free = if sess.cluster.schedulable[n] { sess.cluster.free_gpu_at(n) } else { 0 };
    if free > 0 {
        whole.insert(n as i32, free);
    } else {
        whole.remove(&(n as i32));
    }
}

/// What a set of victims would free: whole GPUs per node and room per shared device, kept as
/// sums so victims can be added and removed one by one.
#[derive(Clone, Debug, Default)]
pub struct Freed {
    pub whole: FxHashMap<i32, i64>,
    pub device: FxHashMap<DevKey, i64>,
}

fn bump<K: std::hash::Hash + Eq>(sums: &mut FxHashMap<K, i64>, key: K, delta: i64) {
    let value = sums.get(&key).copied().unwrap_or(0) + delta;
    if value != 0 {
        sums.insert(key, value);
    } else {
        sums.remove(&key);
    }
}

impl Freed {
    pub fn add(&mut self, sess: &Session, t: usize, sign: i64) {
        let task = &sess.tasks[t];
        if task.node < 0 || !sess.cluster.schedulable[task.node as usize] {
            return;
        }
        if task.req.gpus != 0 {
            bump(&mut self.whole, task.node, sign * task.req.gpus);
            return;
        }
        for &gid in &task.groups {
            bump(&mut self.device, (task.node, gid), sign * task.gpu_mem_cost);
        }
    }
}

/// Count victim `t` as gone: its whole GPUs, or its share of each of its devices (a device all
/// of whose sharers go becomes a whole GPU: its room is set to 0). `fractions`: whether device
/// rooms are kept (`GpuRoom.fractions_needed`).
pub fn free_into(
    sess: &Session,
    base_whole: &FxHashMap<i32, i64>,
    fractions: bool,
    t: usize,
    whole: &mut FxHashMap<i32, i64>,
    devices: &mut FxHashMap<DevKey, i64>,
    freed: &mut FxHashMap<DevKey, i64>,
) {
    let task = &sess.tasks[t];
    if task.node < 0 || !sess.cluster.schedulable[task.node as usize] {
        return;
    }
    let node = task.node;
    if task.req.gpus != 0 {
        let v = whole
            .get(&node)
            .copied()
            .unwrap_or_else(|| base_whole.get(&node).copied().unwrap_or(0));
        whole.insert(node, v + task.req.gpus);
        return;
    }
    for &gid in &task.groups {
        let key = (node, gid);
        let before = freed.get(&key).copied().unwrap_or(0);
        let amount = before + task.gpu_mem_cost;
        freed.insert(key, amount);
        let Some(group) = sess.cluster.group(node, gid) else { continue };
        if freed_whole(group, before) {
            continue; // freed whole already (more pipelined sharers than it holds): no second GPU
        }
        if freed_whole(group, amount) {
            let v = whole
                .get(&node)
                .copied()
                .unwrap_or_else(|| base_whole.get(&node).copied().unwrap_or(0));
            whole.insert(node, v + 1);
            devices.insert(key, 0);
        } else if fractions {
            devices.insert(key, MILLI - group.used + group.releasing + amount);
        }
    }
}

/// KAI's accumulated idle-GPU filter, made device-aware: can the prefix's GPU requests be
/// matched greedily to what is free plus what the victims would free? Whole-GPU requests need
/// whole devices; fractional requests need one device with enough room each.
#[derive(Clone, Debug)]
pub struct GpuRoom {
    pub whole_needed: Vec<i64>,
    pub fractions_needed: Vec<i64>,
    pub trivial: bool,
    /// free whole GPUs of the nodes and rooms of the devices the victims so far changed (room
    /// 0: freed whole); the others are as in the base
    pub whole: FxHashMap<i32, i64>,
    pub devices: FxHashMap<DevKey, i64>,
    pub freed: FxHashMap<DevKey, i64>,
    total_whole: i64,
    max_whole: i64,
    total_room: i64,
    max_room: i64,
    /// the k nodes with the most free whole GPUs and the k roomiest devices (None: rebuilt
    /// when next needed)
    top_whole: Vec<(i32, i64)>,
    top_rooms: Option<Vec<(DevKey, i64)>>,
    /// `whole` and `freed` are a victim stream's running count, lent rather than copied
    /// (`VictimStream::count_in`): what the room changed in them since, to give them back
    pub lent: Option<Lent>,
}

/// A victim stream's running count lent to a room: the stream's cursor and generation then,
/// and each value the room changed since as it was before (None: absent), in turn.
#[derive(Clone, Debug)]
pub struct Lent {
    pub cursor: usize,
    pub generation: u64,
    whole: Vec<(i32, Option<i64>)>,
    freed: Vec<(DevKey, Option<i64>)>,
}

impl Lent {
    pub fn new(cursor: usize, generation: u64) -> Lent {
        Lent { cursor, generation, whole: Vec::new(), freed: Vec::new() }
    }

    /// `whole` and `freed` as they were when lent.
    pub fn undo(self, whole: &mut FxHashMap<i32, i64>, freed: &mut FxHashMap<DevKey, i64>) {
        for (node, old) in self.whole.into_iter().rev() {
            restore(whole, node, old);
        }
        for (key, old) in self.freed.into_iter().rev() {
            restore(freed, key, old);
        }
    }
}

fn restore<K: std::hash::Hash + Eq>(map: &mut FxHashMap<K, i64>, key: K, old: Option<i64>) {
    match old {
        Some(v) => {
            map.insert(key, v);
        }
        None => {
            map.remove(&key);
        }
    }
}

/// The prefix's whole-GPU requests and its fractions in milli of a device, largest first (a
/// fraction at its cheapest: gpu-memory costs least on the biggest GPUs).
pub fn needs(sess: &mut Session, prefix: &[usize]) -> (Vec<i64>, Vec<i64>) {
    let mut whole: Vec<i64> =
        prefix.iter().map(|&t| sess.tasks[t].req.gpus).filter(|&g| g != 0).collect();
    whole.sort_by(|a, b| b.cmp(a));
    let widest = sess.cluster.widest_gpu_node();
    let mut fractions = Vec::new();
    for &t in prefix {
        let req = sess.tasks[t].req;
        if req.is_shared() {
            for _ in 0..req.fraction_devices {
                fractions.push(sess.cluster.device_cost(&req, widest));
            }
        }
    }
    fractions.sort_by(|a, b| b.cmp(a));
    (whole, fractions)
}

impl GpuRoom {
    pub fn new(sess: &mut Session, base: &mut FreeGpus, prefix: &[usize]) -> GpuRoom {
        let (whole_needed, fractions_needed) = needs(sess, prefix);
        GpuRoom::with_needs(sess, base, whole_needed, fractions_needed)
    }

    pub fn with_needs(
        sess: &Session,
        base: &mut FreeGpus,
        whole_needed: Vec<i64>,
        fractions_needed: Vec<i64>,
    ) -> GpuRoom {
        let trivial = whole_needed.is_empty() && fractions_needed.is_empty();
        let (total_whole, max_whole) = base.whole_totals();
        let (total_room, max_room) =
            if !fractions_needed.is_empty() { base.device_totals(sess) } else { (0, 0) };
        let top_whole =
            base.top_whole(whole_needed.len()).into_iter().map(|(v, n)| (n, v)).collect();
        let top_rooms = Some(
            base.top_rooms(sess, fractions_needed.len()).into_iter().map(|(v, k)| (k, v)).collect(),
        );
        GpuRoom {
            whole_needed,
            fractions_needed,
            trivial,
            whole: FxHashMap::default(),
            devices: FxHashMap::default(),
            freed: FxHashMap::default(),
            total_whole,
            max_whole,
            total_room,
            max_room,
            top_whole,
            top_rooms,
            lent: None,
        }
    }

    fn room(&self, sess: &Session, base: &mut FreeGpus, key: DevKey) -> i64 {
        match self.devices.get(&key) {
            Some(&room) => room,
            None => base.devices(sess).get(&key).copied().unwrap_or(0),
        }
    }

    fn whole_at(&self, base: &FreeGpus, node: i32) -> i64 {
        match self.whole.get(&node) {
            Some(&v) => v,
            None => base.whole.get(&node).copied().unwrap_or(0),
        }
    }

    pub fn add_victim(&mut self, sess: &Session, base: &mut FreeGpus, t: usize) {
        let task = &sess.tasks[t];
        if self.trivial || task.node < 0 {
            return;
        }
        let node = task.node;
        let before = self.whole_at(base, node);
        let keys: Vec<DevKey> = if !self.fractions_needed.is_empty() {
            task.groups.iter().map(|&g| (node, g)).collect()
        } else {
            Vec::new()
        };
        let rooms_before: Vec<i64> = keys.iter().map(|&k| self.room(sess, base, k)).collect();
        let fractions = !self.fractions_needed.is_empty();
        self.note_change(sess, t);
        free_into(
            sess,
            &base.whole,
            fractions,
            t,
            &mut self.whole,
            &mut self.devices,
            &mut self.freed,
        );
        let after = self.whole_at(base, node);
        self.total_whole += after - before;
        self.max_whole = self.max_whole.max(after);
        if after > before {
            raise_in_top(&mut self.top_whole, node, after, self.whole_needed.len());
        }
        for (key, room_before) in keys.into_iter().zip(rooms_before) {
            let room = self.room(sess, base, key);
            // a device with more pipelined sharers than it holds has a room below 0: none
            self.total_room += room.max(0) - room_before.max(0);
            self.max_room = self.max_room.max(room);
            let k = self.fractions_needed.len();
            let Some(top) = &mut self.top_rooms else { continue };
            if room > room_before {
                raise_in_top(top, key, room, k);
            } else if room < room_before && top.iter().any(|(tk, _)| *tk == key) {
                self.top_rooms = None;
            }
        }
    }

    /// `add_victim` for each of `tasks`; with whole requests only, the totals and the top are
    /// updated once per node (values only grow, so the final one is what counts).
    pub fn add_victims(&mut self, sess: &Session, base: &mut FreeGpus, tasks: &[usize]) {
        if !self.fractions_needed.is_empty() {
            for &t in tasks {
                self.add_victim(sess, base, t);
            }
            return;
        }
        if self.trivial {
            return;
        }
        let mut before: Vec<(i32, i64)> = Vec::new();
        for &t in tasks {
            let node = sess.tasks[t].node;
            if !before.iter().any(|(n, _)| *n == node) {
                before.push((node, self.whole_at(base, node)));
            }
            self.note_change(sess, t);
            free_into(
                sess,
                &base.whole,
                false,
                t,
                &mut self.whole,
                &mut self.devices,
                &mut self.freed,
            );
        }
        let k = self.whole_needed.len();
        for (node, old) in before {
            let new = self.whole_at(base, node);
            if new > old {
                self.total_whole += new - old;
                self.max_whole = self.max_whole.max(new);
                raise_in_top(&mut self.top_whole, node, new, k);
            }
        }
    }

    /// What `free_into` is about to change for victim `t`, noted while the maps are lent.
    fn note_change(&mut self, sess: &Session, t: usize) {
        let Some(lent) = &mut self.lent else { return };
        let task = &sess.tasks[t];
        lent.whole.push((task.node, self.whole.get(&task.node).copied()));
        for &gid in &task.groups {
            let key = (task.node, gid);
            lent.freed.push((key, self.freed.get(&key).copied()));
        }
    }

    /// Make the victims counted in `whole` and `freed` (overlays over the base, as `free_into`
    /// leaves them) the victims so far, in place of those added before.
    pub fn adopt(
        &mut self,
        sess: &Session,
        base: &mut FreeGpus,
        whole: FxHashMap<i32, i64>,
        freed: FxHashMap<DevKey, i64>,
    ) {
        self.lent = None;
        self.whole = whole;
        self.freed = freed;
        let (whole, freed) = (&self.whole, &self.freed);
        let (base_total, base_max) = base.whole_totals();
        self.total_whole = base_total
            + whole.iter().map(|(n, v)| v - base.whole.get(n).copied().unwrap_or(0)).sum::<i64>();
        self.max_whole = base_max.max(whole.values().copied().max().unwrap_or(0));
        let k = self.whole_needed.len();
        let mut merged: Vec<(i32, i64)> = whole.iter().map(|(&n, &v)| (n, v)).collect();
        merged.extend(base.top_whole_except(k, whole).into_iter().map(|(v, n)| (n, v)));
        self.top_whole = first_by_value(merged, k);
        if self.fractions_needed.is_empty() {
            return;
        }
        self.devices = FxHashMap::with_capacity_and_hasher(freed.len(), Default::default());
        for (&key, &amount) in freed {
            if let Some(group) = sess.cluster.group(key.0, key.1) {
                let room = if freed_whole(group, amount) {
                    0
                } else {
                    MILLI - group.used + group.releasing + amount
                };
                self.devices.insert(key, room);
            }
        }
        let (dev_total, dev_max) = base.device_totals(sess);
        let mut total = dev_total;
        for (key, v) in &self.devices {
            total += (*v).max(0) - base.devices(sess).get(key).copied().unwrap_or(0);
        }
        self.total_room = total;
        self.max_room = dev_max.max(self.devices.values().copied().max().unwrap_or(0));
        self.top_rooms = None;
    }

    pub fn enough(&mut self, sess: &Session, base: &mut FreeGpus) -> bool {
        if self.trivial {
            return true;
        }
        let need_whole: i64 = self.whole_needed.iter().sum();
        if !self.whole_needed.is_empty()
            && (self.total_whole < need_whole || self.max_whole < self.whole_needed[0])
        {
            return false;
        }
        if !self.fractions_needed.is_empty() {
            let spare = self.total_whole - need_whole;
            let need: i64 = self.fractions_needed.iter().sum();
            let most = self.max_room.max(if spare > 0 { MILLI } else { 0 });
            if self.total_room + MILLI * spare < need || most < self.fractions_needed[0] {
                return false;
            }
        }
        if self.top_rooms.is_none() {
            let devices = self.devices.clone();
            self.top_rooms = Some(self.merged_rooms(sess, base, &devices));
        }
        let tops: Vec<i64> = self.top_whole.iter().map(|(_, v)| *v).collect();
        let rooms: Vec<i64> =
            self.top_rooms.as_ref().map_or(Vec::new(), |t| t.iter().map(|(_, v)| *v).collect());
        self.greedy(&tops, &rooms, self.total_whole)
    }

    /// The same test when only `victims` go (one scenario).
    pub fn enough_with(&self, sess: &Session, base: &mut FreeGpus, victims: &[usize]) -> bool {
        if self.trivial {
            return true;
        }
        let mut whole = FxHashMap::default();
        let mut devices = FxHashMap::default();
        let mut freed = FxHashMap::default();
        let fractions = !self.fractions_needed.is_empty();
        for &t in victims {
            free_into(sess, &base.whole, fractions, t, &mut whole, &mut devices, &mut freed);
        }
        self.matches(sess, base, &whole, &devices)
    }

    /// The greedy match for one scenario's overlay (`whole`, `devices`) over the base.
    fn matches(
        &self,
        sess: &Session,
        base: &mut FreeGpus,
        whole: &FxHashMap<i32, i64>,
        devices: &FxHashMap<DevKey, i64>,
    ) -> bool {
        // (only the k largest places can take one of k requests: the greedy match takes the
        // roomiest each time)
        let mut tops: Vec<i64> = whole.values().copied().filter(|&v| v > 0).collect();
        let k = self.whole_needed.len();
        tops.extend(base.top_whole_except(k, whole).into_iter().map(|(gpus, _)| gpus));
        let (base_total, _) = base.whole_totals();
        let total = base_total
            + whole.iter().map(|(n, v)| v - base.whole.get(n).copied().unwrap_or(0)).sum::<i64>();
        let rooms: Vec<i64> = if !self.fractions_needed.is_empty() {
            self.merged_rooms(sess, base, devices).into_iter().map(|(_, v)| v).collect()
        } else {
            Vec::new()
        };
        self.greedy(&tops, &rooms, total)
    }

    /// The k roomiest devices, with the overlay `devices` over the base.
    fn merged_rooms(
        &self,
        sess: &Session,
        base: &mut FreeGpus,
        devices: &FxHashMap<DevKey, i64>,
    ) -> Vec<(DevKey, i64)> {
        let k = self.fractions_needed.len();
        let mut merged: Vec<(DevKey, i64)> =
            devices.iter().filter(|(_, &v)| v > 0).map(|(&k, &v)| (k, v)).collect();
        merged.extend(base.top_rooms_except(sess, k, devices).into_iter().map(|(v, key)| (key, v)));
        first_by_value(merged, k)
    }

    /// Largest request into the roomiest place: whole requests into nodes' free whole GPUs,
    /// then fractions into device rooms and the whole GPUs left over.
    fn greedy(&self, tops: &[i64], rooms: &[i64], total_whole: i64) -> bool {
        if !largest_first(tops, &self.whole_needed) {
            return false;
        }
        if self.fractions_needed.is_empty() {
            return true;
        }
        let spare = total_whole - self.whole_needed.iter().sum::<i64>();
        let mut places = rooms.to_vec();
        let extra = (self.fractions_needed.len() as i64).min(spare).max(0) as usize;
        places.extend(std::iter::repeat_n(MILLI, extra));
        largest_first(&places, &self.fractions_needed)
    }
}

/// Free GPUs with every candidate victim of a scope gone, kept as counts of values: nodes by
/// free whole GPUs, shared devices by room. After a success only the nodes it touched are
/// counted again (`mark`, then `refresh` when the scope is next asked: most scopes are not
/// asked between two successes).
#[derive(Clone, Debug)]
pub struct AllFreed {
    whole: FxHashMap<i64, i64>,
    rooms: FxHashMap<i64, i64>,
    total_whole: i64,
    total_room: i64,
    parts: FxHashMap<i32, (i64, Vec<i64>)>,
    /// nodes changed since last counted (repeats allowed)
    stale: Vec<i32>,
}

impl AllFreed {
    pub fn new(sess: &Session, view: &mut FreeGpus) -> AllFreed {
        let mut out = AllFreed {
            whole: FxHashMap::default(),
            rooms: FxHashMap::default(),
            total_whole: 0,
            total_room: 0,
            parts: FxHashMap::default(),
            stale: Vec::new(),
        };
        let mut by_node: FxHashMap<i32, Vec<i64>> = FxHashMap::default();
        for (&(node, _), &room) in view.devices(sess) {
            by_node.entry(node).or_default().push(room);
        }
        let mut nodes: Vec<i32> = view.whole.keys().copied().collect();
        for &n in by_node.keys() {
            if !view.whole.contains_key(&n) {
                nodes.push(n);
            }
        }
        for node in nodes {
            let part = (
                view.whole.get(&node).copied().unwrap_or(0),
                by_node.remove(&node).unwrap_or_default(),
            );
            out.count(node, part, 1);
        }
        out
    }

    fn count(&mut self, node: i32, part: (i64, Vec<i64>), sign: i64) {
        let (whole, rooms) = &part;
        if *whole > 0 {
            adjust(&mut self.whole, *whole, sign);
        }
        for &value in rooms {
            if value > 0 {
                adjust(&mut self.rooms, value, sign);
            }
        }
        self.total_whole += sign * (*whole).max(0);
        self.total_room += sign * rooms.iter().filter(|&&v| v > 0).sum::<i64>();
        if sign > 0 {
            self.parts.insert(node, part);
        }
    }

    /// The session or the scope's victims changed on `nodes`: count them again at `refresh`.
    pub fn mark(&mut self, nodes: &[i32]) {
        self.stale.extend_from_slice(nodes);
    }

    /// Count the nodes marked since the last time again, as the session and `freed` (the
    /// scope's victims) are now: a node not marked again since its last change is as it was
    /// then, so counting it late gives what counting it at each change would.
    pub fn refresh(&mut self, sess: &Session, freed: &Freed) {
        if self.stale.is_empty() {
            return;
        }
        let mut nodes = std::mem::take(&mut self.stale);
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes {
            if let Some(old) = self.parts.remove(&node) {
                self.count(node, old, -1);
            }
            let part = part_of(sess, freed, node);
            self.count(node, part, 1);
        }
    }

    /// `GpuRoom(...).enough()` for a prefix with these needs (largest first), from the counts.
    pub fn enough(&self, whole_needed: &[i64], fractions_needed: &[i64]) -> bool {
        if whole_needed.is_empty() && fractions_needed.is_empty() {
            return true;
        }
        let total = self.total_whole;
        let need_whole: i64 = whole_needed.iter().sum();
        if !whole_needed.is_empty()
            && (total < need_whole
                || self.whole.keys().copied().max().unwrap_or(0) < whole_needed[0])
        {
            return false;
        }
        let spare = total - need_whole;
        if !fractions_needed.is_empty() {
            let need: i64 = fractions_needed.iter().sum();
            let most = self.rooms.keys().copied().max().unwrap_or(0).max(if spare > 0 {
                MILLI
            } else {
                0
            });
            if self.total_room + MILLI * spare < need || most < fractions_needed[0] {
                return false;
            }
        }
        if !largest_first(&top_values(&self.whole, whole_needed.len()), whole_needed) {
            return false;
        }
        if fractions_needed.is_empty() {
            return true;
        }
        let mut places = top_values(&self.rooms, fractions_needed.len());
        let extra = (fractions_needed.len() as i64).min(spare).max(0) as usize;
        places.extend(std::iter::repeat_n(MILLI, extra));
        largest_first(&places, fractions_needed)
    }
}

fn adjust(counts: &mut FxHashMap<i64, i64>, value: i64, sign: i64) {
    let v = counts.get(&value).copied().unwrap_or(0) + sign;
    if v == 0 {
        counts.remove(&value);
    } else {
        counts.insert(value, v);
    }
}

/// One node as `FreeGpus::with_freed(freed)` sees it: free whole GPUs (a device all of whose
/// victims go counts as one) and the rooms of its live shared devices.
fn part_of(sess: &Session, freed: &Freed, node: i32) -> (i64, Vec<i64>) {
    let n = node as usize;
    if !sess.cluster.schedulable[n] {
        return (0, Vec::new());
    }
    let free = sess.cluster.free_gpu_at(n);
    let mut whole = free.max(0) + freed.whole.get(&node).copied().unwrap_or(0);
    let mut rooms = Vec::new();
    for group in &sess.cluster.groups[n] {
        match freed.device.get(&(node, group.gid)) {
            Some(&amount) => {
                if freed_whole(group, amount) {
                    whole += 1;
                } else {
                    rooms.push(MILLI - group.used + group.releasing + amount);
                }
            }
            None => {
                if group.releasing < group.used && MILLI - group.used + group.releasing > 0 {
                    rooms.push(MILLI - group.used + group.releasing);
                }
            }
        }
    }
    (whole, rooms)
}

/// The `count` largest (value, key) pairs of the positive values, largest first; ties at the
/// threshold by key, largest first (what heapq.nlargest over the pairs gives).
pub fn largest<K: Copy + Ord>(count: usize, values: &FxHashMap<K, i64>) -> Vec<(i64, K)> {
    if count == 0 {
        return Vec::new();
    }
    let mut ranked: Vec<i64> = values.values().copied().filter(|&v| v > 0).collect();
    if ranked.is_empty() {
        return Vec::new();
    }
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    let threshold = ranked[count.min(ranked.len()) - 1];
    let mut top: Vec<(i64, K)> =
        values.iter().filter(|(_, &v)| v > threshold).map(|(&k, &v)| (v, k)).collect();
    top.sort_unstable_by(|a, b| b.cmp(a));
    let mut ties: Vec<K> =
        values.iter().filter(|(_, &v)| v == threshold).map(|(&k, _)| k).collect();
    ties.sort_unstable_by(|a, b| b.cmp(a));
    let room = count.saturating_sub(top.len());
    top.extend(ties.into_iter().take(room).map(|k| (threshold, k)));
    top
}

/// The k largest values of a value -> count map, largest first.
fn top_values(counts: &FxHashMap<i64, i64>, k: usize) -> Vec<i64> {
    let mut values: Vec<i64> = counts.keys().copied().collect();
    values.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = Vec::new();
    for value in values {
        if out.len() >= k {
            break;
        }
        let take = (counts[&value].max(0) as usize).min(k - out.len());
        out.extend(std::iter::repeat_n(value, take));
    }
    out
}

/// The first `count` entries of a ranking's first `asked` (`top`) whose key is not in
/// `except`; None when more must be asked for: filtering the first `count + except.len()` and
/// cutting to `count` gives the same.
fn first_except<K: Copy + std::hash::Hash + Eq>(
    top: &[(i64, K)],
    asked: usize,
    count: usize,
    except: &FxHashMap<K, i64>,
) -> Option<Vec<(i64, K)>> {
    let out: Vec<(i64, K)> =
        top.iter().filter(|(_, key)| !except.contains_key(key)).take(count).copied().collect();
    let done = out.len() == count || top.len() < asked || asked >= count + except.len();
    done.then_some(out)
}

/// The first `k` of `items` stably sorted by value, largest first (selected, not all sorted).
fn first_by_value<K: Copy>(items: Vec<(K, i64)>, k: usize) -> Vec<(K, i64)> {
    let mut ranked: Vec<(usize, K, i64)> =
        items.into_iter().enumerate().map(|(i, (key, v))| (i, key, v)).collect();
    let order = |a: &(usize, K, i64), b: &(usize, K, i64)| b.2.cmp(&a.2).then(a.0.cmp(&b.0));
    if k == 0 {
        return Vec::new();
    }
    if ranked.len() > k {
        ranked.select_nth_unstable_by(k - 1, order);
        ranked.truncate(k);
    }
    ranked.sort_unstable_by(order);
    ranked.into_iter().map(|(_, key, v)| (key, v)).collect()
}

/// Whether `needs` (largest first) each fit into the roomiest of `places` left.
pub fn largest_first(places: &[i64], needs: &[i64]) -> bool {
    let mut rooms: Vec<i64> = places.iter().copied().filter(|&v| v > 0).collect();
    for &need in needs {
        let (mut at, mut most) = (usize::MAX, 0i64);
        for (i, &r) in rooms.iter().enumerate() {
            if r > most {
                at = i;
                most = r;
            }
        }
        if most < need {
            return false;
        }
        if at == usize::MAX {
            rooms.push(most - need);
        } else {
            rooms[at] = most - need;
        }
    }
    true
}

/// `key`'s value grew to `value`: keep `top` the k largest values (ties are equivalent).
fn raise_in_top<K: Copy + PartialEq>(top: &mut Vec<(K, i64)>, key: K, value: i64, k: usize) {
    if let Some(entry) = top.iter_mut().find(|(tk, _)| *tk == key) {
        entry.1 = value;
        return;
    }
    if top.len() < k {
        top.push((key, value));
        return;
    }
    if top.is_empty() {
        return;
    }
    let mut low = 0;
    for i in 1..top.len() {
        if top[i].1 < top[low].1 {
            low = i;
        }
    }
    if value > top[low].1 {
        top.remove(low);
        top.push((key, value));
    }
}
