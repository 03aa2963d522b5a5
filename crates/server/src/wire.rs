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
    #[serde(default, deserialize_with = "crate::jobfile::resources_as_written")]
    pub guarantee: Resources,
    #[serde(default, deserialize_with = "crate::jobfile::opt_resources_as_written")]
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
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::jobfile::opt_resources_as_written"
    )]
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
    /// What happens when a task fails (Kubernetes' `restartPolicy`): `Never` (the
    /// default) fails the job at once; `OnFailure` restarts the task in place, after
    /// an exponential back-off, up to `backoff_limit` restarts in all.
    #[serde(default, skip_serializing_if = "is_default")]
    pub restart_policy: RestartPolicy,
    /// Restarts allowed (all tasks together) before the job fails with
    /// `BackoffLimitExceeded` (Kubernetes' default: 6). Only with `OnFailure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<u32>,
    /// Seconds the job may run, counted from when it started running (time queued
    /// does not count); then it fails with `DeadlineExceeded` and its trees are
    /// stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
    /// Seconds after the job finished (succeeded, failed or cancelled) when it is
    /// deleted, with its logs, so that its name can be used again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
    /// Seconds between SIGTERM and SIGKILL when a task is stopped (eviction,
    /// cancel, deadline, delete, a failed sibling); default 30, 0 kills at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<u64>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Kubernetes' words for what a failed task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum RestartPolicy {
    #[default]
    Never,
    OnFailure,
}

/// Kubernetes' default `backoffLimit`.
pub const DEFAULT_BACKOFF_LIMIT: u32 = 6;
/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_SECONDS: u64 = 30;

impl JobSpec {
    /// Folds the short words a job file may use (`replicas`, `gpu_milli`, `gpu_memory`,
    /// `gpu_models`, `mig`) into the canonical form that is stored. An error is
    /// (field path, message).
    pub fn normalize(mut self) -> Result<JobSpec, (String, String)> {
        let mut tasks = Vec::with_capacity(self.tasks.len());
        for (i, mut t) in std::mem::take(&mut self.tasks).into_iter().enumerate() {
            let short = crate::jobfile::GpuShorthand {
                gpu_milli: t.gpu_milli.take(),
                gpu_memory: t.gpu_memory.take(),
                gpu_models: t.gpu_models.take(),
                mig: t.mig.take(),
            };
            if !short.is_empty() {
                t.gpu = short
                    .fold(std::mem::take(&mut t.gpu))
                    .map_err(|(f, m)| (format!("tasks[{i}].{f}"), m))?;
            }
            let asked = t.replicas.take();
            let n = asked.unwrap_or(1);
            let room = crate::jobfile::MAX_TASKS.saturating_sub(tasks.len() as u32);
            if n == 0 || n > room {
                let max = crate::jobfile::MAX_TASKS;
                return Err(match asked {
                    Some(_) => (
                        format!("tasks[{i}].replicas"),
                        format!(
                            "{n} replicas: give 1 or more, and at most {max} tasks in a \
                             job ({} before this entry)",
                            tasks.len()
                        ),
                    ),
                    None => ("tasks".into(), format!("a job has at most {max} tasks")),
                });
            }
            if n == 1 {
                tasks.push(t);
            } else {
                for k in 0..n {
                    let mut r = t.clone();
                    r.name = format!("{}-{k}", t.name);
                    tasks.push(r);
                }
            }
        }
        self.tasks = tasks;
        Ok(self)
    }

    /// The grace period between SIGTERM and SIGKILL.
    pub fn grace(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.termination_grace_period_seconds
                .unwrap_or(DEFAULT_GRACE_SECONDS),
        )
    }
    pub fn backoff_limit(&self) -> u32 {
        self.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT)
    }
    /// Tasks that must run together.
    pub fn min_member(&self) -> usize {
        self.min_member.unwrap_or(self.tasks.len() as u32) as usize
    }
}

/// One environment variable of a task (Kubernetes' `env` entry).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub name: String,
    /// As written: this many tasks alike, named `NAME-0` .. `NAME-{N-1}` (folded by
    /// [`JobSpec::normalize`]; never stored).
    #[serde(default, skip_serializing)]
    pub replicas: Option<u32>,
    #[serde(default, deserialize_with = "crate::jobfile::resources_as_written")]
    pub resources: Resources,
    /// `8` (whole GPUs), `none`, or the tagged forms; see [`crate::jobfile`].
    #[serde(default, deserialize_with = "crate::jobfile::gpu_as_written")]
    pub gpu: GpuRequest,
    /// As written: a fraction of one GPU in milli-GPU (folded into `gpu`).
    #[serde(default, skip_serializing)]
    pub gpu_milli: Option<u32>,
    /// As written: the fraction's device memory, e.g. `20Gi` (folded into `gpu`).
    #[serde(default, skip_serializing)]
    pub gpu_memory: Option<crate::jobfile::Amount>,
    /// As written: the GPU models allowed (folded into `gpu`).
    #[serde(default, skip_serializing)]
    pub gpu_models: Option<Vec<String>>,
    /// As written: one MIG instance of this profile, e.g. `3g.40gb` (folded into `gpu`).
    #[serde(default, skip_serializing)]
    pub mig: Option<String>,
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
    /// The task's environment, on top of Tessera's `TESSERA_*` variables and the GPU
    /// variables (names of those are refused). Nothing of the server's reaches it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Working folder inside the sandbox; default `/workspace` (writable, private).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The root filesystem: `host` (the default: the host's `/usr` and libraries
    /// read-only, a generated `/etc`, nothing else of the host) or the name of a
    /// template the operator registered. Never a host path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Limits above the requests (Kubernetes' `resources.limits`): the cgroup's
    /// memory limit and CPU quota; each unset one is the request.
    #[serde(default, skip_serializing_if = "is_default")]
    pub limits: tessera_node::TaskLimits,
    /// The isolation level (`standard`: namespaces; `isolated`: a micro-VM; or a class
    /// the operator added). None: the tenant's minimum class, else `standard`. The
    /// task runs only on nodes that run its class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    /// Model weights (`NAME`, or `OWNER/NAME` another tenant granted) released into
    /// the task's sandbox at `/weights/NAME/FILE` before its command starts: in
    /// memory, read-only, visible to no other sandbox. The task then runs only on
    /// attested nodes, and only where the weights' policy allows its class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<String>,
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

/// Where a bound task's process is. No state: bound, not started yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Running,
    Succeeded,
    Failed,
    /// The node is stopping its tree (cancel, deadline, delete, a failed sibling);
    /// it still holds its resources.
    Terminating,
    /// The scheduler evicted it: SIGTERM, grace, SIGKILL under way; it still holds
    /// its resources (a binding "after evictions" waits for it).
    Evicting,
    /// Evicted and its tree gone: it waits to be placed again (see `preemptor`).
    Evicted,
}

impl TaskState {
    /// A process of it may be alive (it holds its node's resources).
    pub fn live(self) -> bool {
        matches!(
            self,
            TaskState::Running | TaskState::Terminating | TaskState::Evicting
        )
    }
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
    /// A machine word for how it ended or why it stopped: `Completed`, `Error`,
    /// `OOMKilled`, `Evicted`, `DeadlineExceeded`, `Cancelled`, `Lost`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For an evicted task: who took its place (a job of the same tenant by name,
    /// else "a job of another tenant").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptor: Option<String>,
    /// The MIG step of its binding (its instance's profile and first slice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<tessera_model::MigStep>,
    /// Bound in a plan that also evicts: it starts only once no task of its node is
    /// being evicted any more.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_evictions: bool,
    /// Starts so far (the next start is attempt `attempt`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub attempt: u32,
    /// Restarts after a failure (`OnFailure`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub restarts: u32,
    /// Times evicted.
    #[serde(default, skip_serializing_if = "is_default")]
    pub evictions: u32,
    /// Milliseconds since the Unix epoch: the next (re)start not before (back-off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// What the last run used, read from its cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<tessera_node::Usage>,
    /// The GPUs it sees, by UUID (the MIG device's for a MIG task).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
pub struct JobStatus {
    pub phase: Phase,
    /// Why the job ended as it did: `BackoffLimitExceeded`, `DeadlineExceeded`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When its first task started, and when it finished (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// `DELETE /v1/jobs/{name}` was asked while trees still ran: the job is deleted
    /// once they are gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
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
