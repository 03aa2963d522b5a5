//! Topology vocabulary: where GPUs of one task, and tasks of one gang, must sit.
//!
//! On a node, GPUs are grouped by NVLink domain (the `nvidia.com/gpu.clique`
//! idea), PCIe root complex (`resource.kubernetes.io/pcieRoot`) and NUMA node;
//! see [`crate::GpuDevice`]. Above nodes, the network has tiers (rack, spine, …,
//! Volcano's HyperNode tiers); a node's tier labels, from the bottom up, are a
//! list of strings (e.g. `[rack-3, spine-1]`).
//!
//! A task states its GPU constraint in [`crate::Task::topology`], a gang its
//! network tier in [`crate::PodGroup::network_topology`], and a node its tier
//! domains in [`crate::Node::network`].

use serde::{Deserialize, Serialize};

/// Hard constraints must hold for a placement; soft ones are preferences.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Strength {
    #[default]
    Hard,
    Soft,
}

/// The on-node domain all GPUs of a task must share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuScope {
    /// One NVLink domain (GPUs connected by NVLink/NVSwitch).
    NvlinkDomain,
    /// One PCIe root complex.
    PcieRoot,
    /// One NUMA node.
    Numa,
}

/// A task's constraint on how its GPUs are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuTopology {
    pub scope: GpuScope,
    #[serde(default)]
    pub strength: Strength,
}

/// A gang's constraint: all its tasks within one domain of network tier `tier`
/// (0 = one node, 1 = the node's first tier label, e.g. a rack;
/// 2 = the second, e.g. a spine; …). Volcano's `highestTierAllowed: t` means
/// "within one domain of a tier ≤ t"; the Kubernetes layer makes the two agree
/// by giving each node at tier `t` its domain of the highest tier ≤ `t` that
/// has one (see `tessera-k8s`'s `network.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkTier {
    pub tier: u8,
    #[serde(default)]
    pub strength: Strength,
}

impl NetworkTier {
    /// The domain of a node at this tier: its name for tier 0, its tier label
    /// otherwise; `None` when the node has no label at that tier.
    pub fn domain_of<'a>(&self, node_name: &'a str, network: &'a [String]) -> Option<&'a str> {
        if self.tier == 0 {
            Some(node_name)
        } else {
            network.get(self.tier as usize - 1).map(String::as_str)
        }
    }
}

/// A request for one MIG instance of a profile (e.g. `3g.40gb`), optionally on
/// some GPU models only.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigRequest {
    pub profile: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
}
