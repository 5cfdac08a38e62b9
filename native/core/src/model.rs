//! The snapshot the core schedules (kai_ray/core/model.py): plain input types in integer units.
//! CPU in millicores, memory in bytes, whole GPUs as device counts, fractions in milli of a
//! device, GPU memory in MiB. `now` and every time are seconds on the caller's clock.

use crate::constraints::{Taint, Term, Toleration};

/// A shared GPU device's usage is counted in milli of the device.
pub const MILLI: i64 = 1000;
/// Per-resource amounts: (cpu milli, memory bytes, GPUs).
pub type Amounts = [f64; 3];
pub const MIN_NODE_GPU_MEMORY_MIB: i64 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodStatus {
    Pending,
    Gated,
    Allocated,
    Pipelined,
    Binding,
    Bound,
    Running,
    Releasing,
    Succeeded,
    Failed,
}

impl PodStatus {
    pub const ALL: [PodStatus; 10] = [
        PodStatus::Pending,
        PodStatus::Gated,
        PodStatus::Allocated,
        PodStatus::Pipelined,
        PodStatus::Binding,
        PodStatus::Bound,
        PodStatus::Running,
        PodStatus::Releasing,
        PodStatus::Succeeded,
        PodStatus::Failed,
    ];

    /// The value of the Python enum member (`PodStatus.X.value`).
    pub fn value(self) -> &'static str {
        match self {
            PodStatus::Pending => "Pending",
            PodStatus::Gated => "Gated",
            PodStatus::Allocated => "Allocated",
            PodStatus::Pipelined => "Pipelined",
            PodStatus::Binding => "Binding",
            PodStatus::Bound => "Bound",
            PodStatus::Running => "Running",
            PodStatus::Releasing => "Releasing",
            PodStatus::Succeeded => "Succeeded",
            PodStatus::Failed => "Failed",
        }
    }

    pub fn from_value(value: &str) -> Option<PodStatus> {
        PodStatus::ALL.iter().copied().find(|s| s.value() == value)
    }

    /// ACTIVE_ALLOCATED
    pub fn active_allocated(self) -> bool {
        matches!(
            self,
            PodStatus::Allocated
                | PodStatus::Pipelined
                | PodStatus::Binding
                | PodStatus::Bound
                | PodStatus::Running
        )
    }

    /// ACTIVE_USED: active, releasing included
    pub fn active_used(self) -> bool {
        self.active_allocated() || self == PodStatus::Releasing
    }

    /// QUEUE_ALLOCATED: counted in a queue's allocation at snapshot time
    pub fn queue_allocated(self) -> bool {
        matches!(
            self,
            PodStatus::Allocated | PodStatus::Binding | PodStatus::Bound | PodStatus::Running
        )
    }

    /// ALIVE (KAI's aliveStatuses: a releasing pod is not alive)
    pub fn alive(self) -> bool {
        self.active_allocated() || self == PodStatus::Pending || self == PodStatus::Gated
    }
}

/// What one pod asks for. At most one of gpus / gpu_fraction_milli / gpu_memory_mib is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Request {
    pub cpu_m: i64,
    pub memory: i64,
    pub gpus: i64,
    pub gpu_fraction_milli: i64,
    pub gpu_memory_mib: i64,
    pub fraction_devices: i64,
}

impl Request {
    pub fn is_shared(&self) -> bool {
        self.gpu_fraction_milli > 0 || self.gpu_memory_mib > 0
    }

    pub fn wants_gpu(&self) -> bool {
        self.gpus > 0 || self.is_shared()
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub cpu_m: i64,
    pub memory: i64,
    pub gpus: i64,
    pub gpu_memory_mib: i64,
    pub gpu_memory_synced: bool,
    pub max_pods: i64,
    pub labels: Vec<(String, String)>,
    pub ready: bool,
    pub unschedulable: bool,
    pub foreign_cpu_m: i64,
    pub foreign_memory: i64,
    pub foreign_gpus: i64,
    pub foreign_pods: i64,
    pub taints: Vec<Taint>,
}

/// One resource of a queue, in queue units (GPUs, millicores, bytes). -1 = unlimited.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResourceQuota {
    pub quota: f64,
    pub limit: f64,
    pub weight: f64,
}

#[derive(Clone, Debug)]
pub struct Queue {
    pub name: String,
    pub parent: Option<String>,
    pub priority: i64,
    pub gpu: ResourceQuota,
    pub cpu: ResourceQuota,
    pub memory: ResourceQuota,
    pub created: f64,
    pub preempt_min_runtime_s: Option<f64>,
    pub reclaim_min_runtime_s: Option<f64>,
}

/// What limits a pod's nodes besides resources: equal values, the same nodes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Constraints {
    pub node_selector: Vec<(String, String)>,
    pub tolerations: Vec<Toleration>,
    pub node_affinity: Option<Vec<Term>>,
}

#[derive(Clone, Debug)]
pub struct Pod {
    pub name: String,
    pub request: Request,
    pub status: PodStatus,
    pub node: Option<String>,
    pub gpu_groups: Vec<String>,
    pub namespace: String,
    pub task_priority: Option<i64>,
    pub created: f64,
    pub is_ray_head: bool,
    pub subgroup: Option<String>,
    /// index into `Snapshot::constraints` (0 is always the empty one)
    pub constraints: usize,
    pub replica: Option<String>,
}

#[derive(Clone, Debug)]
pub struct SubGroup {
    pub name: String,
    /// 0: every pod of the subgroup is elastic (an autoscaled Ray group with minReplicas 0)
    pub min_member: i64,
    pub replica_size: i64,
    /// see `Job::admitted_min_member`
    pub admitted_min_member: Option<i64>,
}

/// A PodGroup and its pods.
#[derive(Clone, Debug)]
pub struct Job {
    pub name: String,
    pub queue: String,
    pub priority: i64,
    pub pods: Vec<Pod>,
    pub min_member: i64,
    pub namespace: String,
    pub created: f64,
    /// `Job.is_preemptible` (the explicit setting, else priority < 100)
    pub preemptible: bool,
    pub subgroups: Vec<SubGroup>,
    pub stale_since: Option<f64>,
    pub last_start: Option<f64>,
    /// the lowest minimum this run of the gang had before a spec change raised `min_member`
    /// (None: not raised since it started); stale-gang eviction counts against it
    pub admitted_min_member: Option<i64>,
}

/// `SchedulerConfig.gpu_packing`: KAI's binpack and gpupack scores, or a packing policy of
/// kai_ray/core/packing.py for GPU pods (packing.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPacking {
    Kai,
    BestFit,
    Packing,
    Fgd,
    Lookahead,
}

impl GpuPacking {
    /// The policy of a `gpu_packing` value (packing.POLICIES), None for an unknown one.
    pub fn from_name(name: &str) -> Option<GpuPacking> {
        match name {
            "kai" => Some(GpuPacking::Kai),
            "best_fit" => Some(GpuPacking::BestFit),
            "packing" => Some(GpuPacking::Packing),
            "fgd" => Some(GpuPacking::Fgd),
            "lookahead" => Some(GpuPacking::Lookahead),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub gpu_spread: bool,
    pub cpu_spread: bool,
    /// "gpupack" | "gpuspread" | None (gpupack with gpu binpack, gpuspread with spread)
    pub gpu_device_order: Option<String>,
    pub gpu_packing: GpuPacking,
    pub actions: Vec<String>,
    pub staleness_grace_period_s: f64,
    pub max_consolidation_preemptees: i64,
    pub k_value: f64,
    pub allow_consolidating_reclaim: bool,
    pub reclaimer_saturation_multiplier: f64,
    pub default_preempt_min_runtime_s: f64,
    pub default_reclaim_min_runtime_s: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            gpu_spread: false,
            cpu_spread: false,
            gpu_device_order: None,
            gpu_packing: GpuPacking::Kai,
            actions: ["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            staleness_grace_period_s: 60.0,
            max_consolidation_preemptees: 16,
            k_value: 1.0,
            allow_consolidating_reclaim: true,
            reclaimer_saturation_multiplier: 1.0,
            default_preempt_min_runtime_s: 0.0,
            default_reclaim_min_runtime_s: 0.0,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub nodes: Vec<Node>,
    pub queues: Vec<Queue>,
    pub jobs: Vec<Job>,
    /// every distinct `Constraints` of the pods; 0 is the empty one
    pub constraints: Vec<Constraints>,
}
