//! Agent tasks and the compact resource vector the agent scheduler works with.

use serde::{Deserialize, Serialize};
use tessera_model::Resources;

/// What an agent task asks of a node, or what a node has free. `Copy` and four
/// integers, so that reading and writing it on the hot path costs no allocation
/// (the model's [`Resources`] carries a map of extended resources).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Demand {
    /// Milli-CPU.
    pub cpu_milli: u64,
    /// Bytes of memory.
    pub memory: u64,
    /// Milli-GPU.
    pub gpu_milli: u64,
    /// Pod slots.
    pub pods: u64,
}

impl Demand {
    pub const ZERO: Demand = Demand {
        cpu_milli: 0,
        memory: 0,
        gpu_milli: 0,
        pods: 0,
    };

    pub fn new(cpu_milli: u64, memory: u64) -> Self {
        Demand {
            cpu_milli,
            memory,
            gpu_milli: 0,
            pods: 1,
        }
    }

    /// True when every dimension of `self` is at most the same one of `free`.
    #[inline]
    pub fn fits_in(&self, free: &Demand) -> bool {
        self.cpu_milli <= free.cpu_milli
            && self.memory <= free.memory
            && self.gpu_milli <= free.gpu_milli
            && self.pods <= free.pods
    }

    /// `self - other`, or `None` if a dimension would go below zero.
    #[inline]
    pub fn checked_sub(&self, other: &Demand) -> Option<Demand> {
        Some(Demand {
            cpu_milli: self.cpu_milli.checked_sub(other.cpu_milli)?,
            memory: self.memory.checked_sub(other.memory)?,
            gpu_milli: self.gpu_milli.checked_sub(other.gpu_milli)?,
            pods: self.pods.checked_sub(other.pods)?,
        })
    }

    /// `self + other`, saturating.
    #[inline]
    pub fn saturating_add(&self, other: &Demand) -> Demand {
        Demand {
            cpu_milli: self.cpu_milli.saturating_add(other.cpu_milli),
            memory: self.memory.saturating_add(other.memory),
            gpu_milli: self.gpu_milli.saturating_add(other.gpu_milli),
            pods: self.pods.saturating_add(other.pods),
        }
    }

    /// `self - other`, stopping at zero.
    #[inline]
    pub fn saturating_sub(&self, other: &Demand) -> Demand {
        Demand {
            cpu_milli: self.cpu_milli.saturating_sub(other.cpu_milli),
            memory: self.memory.saturating_sub(other.memory),
            gpu_milli: self.gpu_milli.saturating_sub(other.gpu_milli),
            pods: self.pods.saturating_sub(other.pods),
        }
    }

    /// The largest fraction `self / total` over CPU, memory and GPU (dimensions
    /// where `total` is zero are skipped).
    pub fn share_of(&self, total: &Demand) -> f64 {
        let f = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        f(self.cpu_milli, total.cpu_milli)
            .max(f(self.memory, total.memory))
            .max(f(self.gpu_milli, total.gpu_milli))
    }
}

impl From<&Resources> for Demand {
    /// Keeps CPU, memory, GPU and pods; extended resources and GPU memory are not
    /// tracked by the agent scheduler (agent sandboxes do not ask for them).
    fn from(r: &Resources) -> Self {
        Demand {
            cpu_milli: r.cpu_milli,
            memory: r.memory,
            gpu_milli: r.gpu_milli,
            pods: r.pods,
        }
    }
}

/// A tenant, by number (the caller keeps the names).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct TenantId(pub u32);

/// One agent sandbox task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentTask {
    /// Unique id, chosen by the caller.
    pub id: u64,
    pub tenant: TenantId,
    /// Higher is scheduled first.
    pub priority: i32,
    pub demand: Demand,
    /// How long the sandbox lives once bound, in nanoseconds (used by simulations;
    /// the scheduler itself does not read it).
    pub lifetime_ns: u64,
    /// When the task entered the queue, in the caller's clock (nanoseconds).
    pub enqueued_ns: u64,
    /// Scheduling attempts that found no room so far (drives back-off).
    pub attempts: u32,
}

impl AgentTask {
    pub fn new(id: u64, tenant: TenantId, demand: Demand) -> Self {
        AgentTask {
            id,
            tenant,
            priority: 0,
            demand,
            lifetime_ns: 0,
            enqueued_ns: 0,
            attempts: 0,
        }
    }
}
