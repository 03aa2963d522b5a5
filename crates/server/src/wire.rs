//! Request and stored body types of the API. Requests reject unknown fields.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_model::{GpuRequest, GroupKind, Resources, Toleration};

use crate::auth::Role;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    pub name: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NewApiKey {
    /// Who the key acts as (a user or service account name).
    pub subject: String,
    /// Binds `subject` to this role in the caller's tenant as well.
    #[serde(default)]
    pub role: Option<Role>,
    /// Seconds from now until the key stops working.
    #[serde(default)]
    pub expires_in_seconds: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoleBindingSpec {
    pub role: Role,
}

/// A queue as submitted; stored as a `tessera_model::Queue`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSpec {
    pub name: String,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default = "one")]
    pub weight: u32,
    #[serde(default)]
    pub guarantee: Resources,
    #[serde(default)]
    pub capability: Option<Resources>,
    #[serde(default = "yes")]
    pub reclaimable: bool,
    /// For updates: the version read; a stale one is a 409.
    #[serde(default)]
    pub resource_version: Option<u64>,
}

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}

/// A job (a pod group, a gang of tasks) as submitted.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    pub queue: String,
    /// How many tasks must run together; default: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_member: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_resources: Option<Resources>,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub kind: GroupKind,
    #[serde(default = "yes")]
    pub preemptable: bool,
    /// All tasks within one network-tier domain (Volcano's `networkTopology`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_topology: Option<tessera_model::NetworkTier>,
    pub tasks: Vec<TaskSpec>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub name: String,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub gpu: GpuRequest,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The command the executor runs for this task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// On simulated nodes (`tessera up --cluster`): how long the task runs, in
    /// simulated seconds; without it the task runs until the job is cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// All GPUs in one NVLink domain / PCIe root / NUMA node, hard or soft.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<tessera_model::GpuTopology>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Waiting for the scheduler (see `pending_reason`).
    #[default]
    Pending,
    /// At least `min_member` tasks are bound.
    Running,
    /// Every task ran and exited with status 0.
    Succeeded,
    /// A task exited with a non-zero status, could not start, or was lost.
    Failed,
    /// Cancelled by a user; its tasks are released.
    Cancelled,
}

impl Phase {
    /// Whether the job is over: the scheduler no longer considers it.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Cancelled)
    }
}

/// Where a bound task's process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
pub struct TaskStatus {
    pub node: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// Set by the executor once it started the task's process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
pub struct JobStatus {
    pub phase: Phase,
    /// Bound tasks: task name -> node and GPUs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tasks: BTreeMap<String, TaskStatus>,
    /// Why (part of) the job still waits, as the scheduler said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<String>,
    /// Whether the job passed admission (queue quota, gang minimum).
    #[serde(default)]
    pub admitted: bool,
}

/// A stored job.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct JobBody {
    pub spec: JobSpec,
    pub status: JobStatus,
    /// Milliseconds since the Unix epoch.
    pub created_at: u64,
}

/// A stored event: something the system did to an object.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct EventBody {
    pub at: u64,
    pub object: String,
    pub reason: String,
    pub message: String,
}

/// A stored audit record: who changed what.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct AuditBody {
    pub at: u64,
    pub subject: String,
    pub key_id: String,
    pub action: String,
    pub object: String,
}

/// A role binding as stored.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct RoleBinding {
    pub subject: String,
    pub role: Role,
}

/// A tenant as stored (cluster-scoped).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct TenantBody {
    pub created_at: u64,
    /// The system tenant administers the cluster (tenants, nodes).
    #[serde(default)]
    pub system: bool,
}
