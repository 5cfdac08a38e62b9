//! The session's virtual decisions and their undo (kai_ray/core/statement.py; KAI's
//! Statement): allocate or pipeline a task, evict one, switch one between allocated and
//! pipelined, and roll all of it back to a checkpoint, so a gang that does not fit, or a victim
//! scenario that does not work, leaves no trace.
//!
//! Every decision moves the task's resources on its node (`ClusterState`) and its queues'
//! charge (`QueueAccounting`) together, and bumps its job's change count (what caches of a
//! job's derived values compare against). A `Statement` is a view over the session's parts
//! (`Session::statement`): the undo log and what it changes stay on the session, where
//! readers of the log (the pending order, the victim search) find them.

use crate::accounting::QueueAccounting;
use crate::cluster::ClusterState;
use crate::jobs::{JobState, Task};
use crate::model::PodStatus;

/// One decision, with what undoing it restores.
#[derive(Clone, Debug)]
pub enum Undo {
    Alloc { task: usize, status: PodStatus, node: i32, groups: Vec<u32> },
    Evict { task: usize, prev: PodStatus },
    Status { task: usize, prev: PodStatus },
    Move { task: usize, copy: usize },
    Unevict { task: usize, prev: PodStatus },
}

impl Undo {
    pub fn task(&self) -> usize {
        match *self {
            Undo::Alloc { task, .. }
            | Undo::Evict { task, .. }
            | Undo::Status { task, .. }
            | Undo::Move { task, .. }
            | Undo::Unevict { task, .. } => task,
        }
    }
}

/// The session's decisions in order (a checkpoint is its length), each with a stamp no other
/// entry of the session ever had: a reader that kept a `LogMark` can tell whether the log
/// still holds what it read, which its length alone cannot (a rollback below it and new
/// decisions can bring the log back to the same length).
#[derive(Default)]
pub struct UndoLog {
    entries: Vec<Undo>,
    stamps: Vec<u64>,
    next: u64,
}

/// The log as a reader saw it: its length and the stamp of its last entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogMark {
    len: usize,
    stamp: u64,
}

impl UndoLog {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[Undo] {
        &self.entries
    }

    fn push(&mut self, entry: Undo) {
        self.next += 1;
        self.entries.push(entry);
        self.stamps.push(self.next);
    }

    fn pop(&mut self) -> Option<Undo> {
        self.stamps.pop();
        self.entries.pop()
    }

    pub fn mark(&self) -> LogMark {
        LogMark { len: self.entries.len(), stamp: self.stamps.last().copied().unwrap_or(0) }
    }

    /// The decisions made since `mark`, or None when the log no longer holds what it held
    /// then (rolled back below it).
    pub fn since(&self, mark: LogMark) -> Option<&[Undo]> {
        let held = mark.len <= self.entries.len()
            && (mark.len == 0 || self.stamps[mark.len - 1] == mark.stamp);
        held.then(|| &self.entries[mark.len..])
    }
}

/// The previous placement of the binpack fast path (actions/common.rs): the task, its node,
/// whether it fit on idle resources and its node's sharing bonus. Kept with the undo log's
/// mark when it was made (`Session::sticky`) and valid while the log is as it was then.
#[derive(Clone, Copy, Debug)]
pub struct Sticky {
    pub task: usize,
    pub node: i32,
    /// whether it scored for fitting on idle resources (`placement::shown_idle`)
    pub on_idle: bool,
    pub bonus: bool,
}

/// Decisions on the session's cluster, queues, tasks and jobs, recorded in its undo log.
pub struct Statement<'a> {
    pub(crate) cluster: &'a mut ClusterState,
    pub(crate) queues: &'a mut QueueAccounting,
    /// a moved victim's copy is appended (and popped on rollback)
    pub(crate) tasks: &'a mut Vec<Task>,
    pub(crate) jobs: &'a mut Vec<JobState>,
    pub(crate) undo: &'a mut UndoLog,
}

impl Statement<'_> {
    pub fn checkpoint(&self) -> usize {
        self.undo.len()
    }

    fn bump(&mut self, task: usize) {
        let job = self.tasks[task].job;
        self.jobs[job].changes += 1;
    }

    /// Add (sign 1) or take back (-1) the task's charge to its queues.
    fn charge(&mut self, task: usize, sign: f64) {
        let t = &self.tasks[task];
        self.queues.charge(&self.jobs[t.job], self.cluster.queue_amount(t), sign);
    }

    /// Place a pending (or virtually evicted) task.
    pub fn allocate(&mut self, task: usize, node: i32, groups: Vec<u32>, pipelined: bool) {
        let t = &self.tasks[task];
        if t.status == PodStatus::Releasing && t.node == node && t.groups == groups {
            // a victim that goes back where it was is simply not evicted
            self.unevict(task);
            return;
        }
        if t.status == PodStatus::Releasing {
            self.move_task(task, node, groups);
            return;
        }
        let (status, prev_node, prev_groups) = (t.status, t.node, t.groups.clone());
        let t = &mut self.tasks[task];
        self.cluster.place(t, node, groups, pipelined);
        t.status = if pipelined { PodStatus::Pipelined } else { PodStatus::Allocated };
        self.charge(task, 1.0);
        self.undo.push(Undo::Alloc { task, status, node: prev_node, groups: prev_groups });
        self.bump(task);
    }

    /// A victim placed elsewhere: it keeps releasing where it is, and a pipelined copy
    /// (`Task::moved`, pointing back through `origin`) holds the new place.
    fn move_task(&mut self, task: usize, node: i32, groups: Vec<u32>) {
        let copy_idx = self.tasks.len();
        let copy = self.tasks[task].moved_copy(copy_idx);
        let job = copy.job;
        self.tasks.push(copy);
        let js = &mut self.jobs[job];
        js.tasks.push(copy_idx);
        let subgroup = &self.tasks[copy_idx].subgroup;
        if let Some(p) = js.podset(subgroup).or_else(|| js.podset("default")) {
            js.podsets[p].tasks.push(copy_idx);
        }
        self.tasks[task].moved = Some(copy_idx);
        let c = &mut self.tasks[copy_idx];
        self.cluster.place(c, node, groups, true);
        c.status = PodStatus::Pipelined;
        self.charge(copy_idx, 1.0);
        self.undo.push(Undo::Move { task, copy: copy_idx });
        self.bump(task);
    }

    /// Switch between Allocated and Pipelined (same resources, same queue charge; the node
    /// charge moves between idle and releasing, `ClusterState::pipeline_charge`).
    pub fn set_status(&mut self, task: usize, status: PodStatus) {
        let t = &mut self.tasks[task];
        let prev = t.status;
        self.undo.push(Undo::Status { task, prev });
        self.cluster.set_charge(t, prev, status);
        t.status = status;
        self.bump(task);
    }

    pub fn evict(&mut self, task: usize) {
        let prev = self.tasks[task].status;
        self.charge(task, -1.0);
        let t = &mut self.tasks[task];
        self.cluster.set_charge(t, prev, PodStatus::Releasing);
        t.status = PodStatus::Releasing;
        self.cluster.mark_releasing(t, 1);
        self.undo.push(Undo::Evict { task, prev });
        self.bump(task);
    }

    pub fn unevict(&mut self, task: usize) {
        let prev = self
            .undo
            .entries()
            .iter()
            .rev()
            .find_map(|e| match *e {
                Undo::Evict { task: t, prev } if t == task => Some(prev),
                _ => None,
            })
            .expect("unevict: the task was evicted in this session");
        let t = &mut self.tasks[task];
        self.cluster.mark_releasing(t, -1);
        self.cluster.set_charge(t, PodStatus::Releasing, prev);
        t.status = prev;
        self.charge(task, 1.0);
        self.undo.push(Undo::Unevict { task, prev });
        self.bump(task);
    }

    /// Undo every decision after `checkpoint`, last first.
    pub fn rollback(&mut self, checkpoint: usize) {
        while self.undo.len() > checkpoint {
            let entry = self.undo.pop().expect("undo entry");
            let task = entry.task();
            self.bump(task);
            match entry {
                Undo::Alloc { status, node, groups, .. } => {
                    self.charge(task, -1.0);
                    let t = &mut self.tasks[task];
                    self.cluster.remove(t);
                    t.status = status;
                    t.node = node;
                    t.groups = groups;
                }
                Undo::Evict { prev, .. } => {
                    let t = &mut self.tasks[task];
                    self.cluster.mark_releasing(t, -1);
                    self.cluster.set_charge(t, PodStatus::Releasing, prev);
                    t.status = prev;
                    self.charge(task, 1.0);
                }
                Undo::Status { prev, .. } => {
                    let t = &mut self.tasks[task];
                    self.cluster.set_charge(t, t.status, prev);
                    t.status = prev;
                }
                Undo::Move { copy, .. } => {
                    self.charge(copy, -1.0);
                    self.cluster.remove(&mut self.tasks[copy]);
                    self.tasks[task].moved = None;
                    let job = self.tasks[copy].job;
                    let js = &mut self.jobs[job];
                    if let Some(at) = js.tasks.iter().rposition(|&t| t == copy) {
                        js.tasks.remove(at);
                    }
                    for ps in js.podsets.iter_mut() {
                        if let Some(at) = ps.tasks.iter().position(|&t| t == copy) {
                            ps.tasks.remove(at);
                        }
                    }
                    self.tasks.pop();
                }
                Undo::Unevict { .. } => {
                    self.charge(task, -1.0);
                    let t = &mut self.tasks[task];
                    self.cluster.set_charge(t, t.status, PodStatus::Releasing);
                    t.status = PodStatus::Releasing;
                    self.cluster.mark_releasing(t, 1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(task: usize) -> Undo {
        Undo::Status { task, prev: PodStatus::Pending }
    }

    #[test]
    fn a_mark_is_not_held_once_the_log_was_rolled_back_below_it() {
        let mut log = UndoLog::default();
        log.push(entry(0));
        let base = log.mark();
        log.push(entry(1));
        let read = log.mark();
        assert_eq!(log.since(base).map(<[Undo]>::len), Some(1));
        log.pop();
        log.push(entry(2));
        // the same length, another decision: what `read` saw is gone
        assert_eq!(log.len(), 2);
        assert!(log.since(read).is_none());
        assert_eq!(log.since(base).map(|e| e[0].task()), Some(2));
        assert_eq!(log.since(log.mark()).map(<[Undo]>::len), Some(0));
    }
}
