//! Pod groups (gangs) and their tasks.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::node::Toleration;
use crate::resources::Resources;
use crate::topology::{GpuTopology, NetworkTier};

/// What kind of workload a group is; placement profiles differ by kind
/// (training binpacks, inference spreads).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum GroupKind {
    Training,
    Inference,
    #[default]
    Batch,
    Agent,
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GroupKind::Training => "training",
            GroupKind::Inference => "inference",
            GroupKind::Batch => "batch",
            GroupKind::Agent => "agent",
        })
    }
}

/// A gang of tasks scheduled together: either at least `min_member` of them run,
/// or none is placed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodGroup {
    pub name: String,
    pub queue: String,
    /// How many tasks must be placed together for the group to run at all.
    pub min_member: u32,
    /// Resources the group needs to start; admission (`enqueue`) checks these
    /// against the queue. `None`: the sum of the first `min_member` tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_resources: Option<Resources>,
    /// Higher runs first and may preempt lower in the same queue.
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub kind: GroupKind,
    /// Creation order (a timestamp or sequence number): older first among equals.
    #[serde(default)]
    pub creation: u64,
    /// Whether tasks of this group may be evicted by preemption or reclaim.
    #[serde(default = "yes")]
    pub preemptable: bool,
    /// All tasks within one domain of a network tier (Volcano's
    /// `networkTopology`), hard or soft; `None`: anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_topology: Option<NetworkTier>,
    pub tasks: Vec<Task>,
}

fn yes() -> bool {
    true
}

impl PodGroup {
    pub fn new(name: impl Into<String>, queue: impl Into<String>, min_member: u32) -> Self {
        PodGroup {
            name: name.into(),
            queue: queue.into(),
            min_member,
            min_resources: None,
            priority: 0,
            kind: GroupKind::Batch,
            creation: 0,
            preemptable: true,
            network_topology: None,
            tasks: Vec::new(),
        }
    }

    /// Tasks already running (bound to a node).
    pub fn running(&self) -> usize {
        self.tasks.iter().filter(|t| t.node.is_some()).count()
    }
}

/// What a task asks of GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum GpuRequest {
    #[default]
    None,
    /// `count` whole GPUs, optionally restricted to some models.
    Whole {
        count: u32,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        models: Vec<String>,
    },
    /// A fraction of one GPU: compute share in milli-GPU (1..999) and device memory.
    Shared {
        milli: u32,
        #[serde(default)]
        memory: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        models: Vec<String>,
    },
    /// One MIG instance of a profile (e.g. `3g.40gb`) on a MIG-enabled GPU.
    Mig {
        profile: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        models: Vec<String>,
    },
}

impl GpuRequest {
    /// Milli-GPU counted against quotas.
    pub fn milli(&self) -> u64 {
        match self {
            GpuRequest::None => 0,
            GpuRequest::Whole { count, .. } => u64::from(*count) * 1000,
            GpuRequest::Shared { milli, .. } => u64::from(*milli),
            GpuRequest::Mig { profile, models } => crate::mig::profile_milli(profile, models),
        }
    }

    /// Whole GPUs this request needs entirely free (0 for shared or none).
    pub fn whole(&self) -> u32 {
        match self {
            GpuRequest::Whole { count, .. } => *count,
            _ => 0,
        }
    }

    /// How many devices the request is given: the count of whole GPUs, one for
    /// a fraction, none for no GPU.
    pub fn devices(&self) -> u32 {
        match self {
            GpuRequest::None => 0,
            GpuRequest::Whole { count, .. } => *count,
            GpuRequest::Shared { .. } | GpuRequest::Mig { .. } => 1,
        }
    }

    /// Allowed GPU models; empty means any.
    pub fn models(&self) -> &[String] {
        match self {
            GpuRequest::None => &[],
            GpuRequest::Whole { models, .. }
            | GpuRequest::Shared { models, .. }
            | GpuRequest::Mig { models, .. } => models,
        }
    }
}

/// One task (pod) of a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    pub name: String,
    /// CPU, memory, pods and extended resources. GPU fields are derived from `gpu`
    /// by [`Task::request`] and must be left at zero here.
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub gpu: GpuRequest,
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// Task priority; `None` takes the group's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The node the task runs on, when it is already bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// GPU indices on `node` the task holds, when it is running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_indices: Vec<u32>,
    /// How its GPUs must be connected: all in one NVLink domain, PCIe root or
    /// NUMA node, hard or soft. `None`: one NVLink domain where the node has
    /// domains, as a preference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<GpuTopology>,
    /// For a running MIG task: the first memory slice of the instance it holds
    /// on `gpu_indices[0]`. Without it, the task claims an in-use instance of
    /// its profile on its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_start: Option<u8>,
    /// Device shapes the task also accepts, in order of preference after
    /// `gpu` (Kubernetes DRA's `firstAvailable`): other MIG profiles, other
    /// models, other whole-GPU counts. The scheduler takes the first that
    /// fits, says which in the plan, and charges quota for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_alternatives: Vec<GpuRequest>,
    /// For a running task with alternatives: which one it holds (0: `gpu`,
    /// `k`: `gpu_alternatives[k - 1]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_choice: Option<u32>,
}

impl Task {
    pub fn new(name: impl Into<String>, resources: Resources) -> Self {
        Task {
            name: name.into(),
            resources,
            gpu: GpuRequest::None,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            priority: None,
            node: None,
            gpu_indices: Vec::new(),
            topology: None,
            mig_start: None,
            gpu_alternatives: Vec::new(),
            gpu_choice: None,
        }
    }

    /// The device shapes the task accepts, in order of preference: `gpu`,
    /// then `gpu_alternatives`.
    pub fn gpu_options(&self) -> impl Iterator<Item = &GpuRequest> {
        std::iter::once(&self.gpu).chain(self.gpu_alternatives.iter())
    }

    /// Shape `k` of [`Task::gpu_options`] (`gpu` when out of range).
    pub fn gpu_option(&self, k: u32) -> &GpuRequest {
        match k {
            0 => &self.gpu,
            k => self
                .gpu_alternatives
                .get(k as usize - 1)
                .unwrap_or(&self.gpu),
        }
    }

    pub fn with_gpu(mut self, gpu: GpuRequest) -> Self {
        self.gpu = gpu;
        self
    }

    /// The full request, GPU included, with one pod slot.
    pub fn request(&self) -> Resources {
        self.request_with(&self.gpu)
    }

    /// [`Task::request`] with the device shape `gpu` (one of the options).
    pub fn request_with(&self, gpu: &GpuRequest) -> Resources {
        let mut r = self.resources.clone();
        r.gpu_milli = gpu.milli();
        if let GpuRequest::Shared { memory, .. } = gpu {
            r.gpu_memory = *memory;
        }
        r.pods = 1;
        r
    }
}

/// Names a task in plans and reasons: `group/task`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId {
    pub group: String,
    pub task: String,
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.group, self.task)
    }
}
