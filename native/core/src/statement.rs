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

/// The previous placement of the binpack fast path (actions/common.rs): the task, its node,
/// whether it fit on idle resources and its node's sharing bonus. Kept with the undo log's
/// length when it was made (`Session::sticky`) and valid while the log has that length; here
/// because a rollback below that length must drop it (the log may grow back to the same
/// length with other decisions).
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
    pub(crate) undo: &'a mut Vec<Undo>,
    pub(crate) sticky: &'a mut Option<(Sticky, usize)>,
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
        if let Some((_, at)) = *self.sticky {
            if at > checkpoint {
                // what came after that placement is undone
                *self.sticky = None;
            }
        }
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
