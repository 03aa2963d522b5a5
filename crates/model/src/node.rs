//! Nodes, their taints, and the GPU devices on them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::resources::Resources;

/// Prefix of the node labels that say which runtime classes (isolation levels, like
/// Kubernetes RuntimeClass) a node runs: `runtime-class.tessera.io/NAME: "true"`. A
/// workload of class `NAME` carries the matching node selector, so the scheduler's
/// selector predicate keeps it off nodes without the class. (`tessera-sandbox`'s
/// `class` module owns the class table; the server checks the two prefixes agree.)
pub const RUNTIME_CLASS_LABEL_PREFIX: &str = "runtime-class.tessera.io/";

/// The node label a node carries, `"true"`, while its last TPM quote verified against
/// the values an operator approved (node attestation, `tessera-node`'s `attest`). A
/// workload that requires attestation carries it as a node selector.
pub const ATTESTED_LABEL: &str = "attested.tessera.io";

/// The node label of runtime class `name`.
pub fn runtime_class_label(name: &str) -> String {
    format!("{RUNTIME_CLASS_LABEL_PREFIX}{name}")
}

/// A machine the scheduler may place tasks on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// What the node offers to tasks in total (free capacity is derived from the
    /// tasks running on it). `gpu_milli` and `gpu_memory` must equal the sum over
    /// `gpus`, when `gpus` is given.
    pub allocatable: Resources,
    /// The GPU devices, in index order. Empty when the node has no GPUs or when only
    /// a count is known (then `allocatable.gpu_milli` still counts them).
    #[serde(default)]
    pub gpus: Vec<GpuDevice>,
    /// Cordoned: no new tasks are placed here.
    #[serde(default)]
    pub unschedulable: bool,
    /// The node's domains in the network tiers above it, bottom up (e.g.
    /// `[rack-3, spine-1]`): Volcano's HyperNode tiers. Tier 1 is the first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<String>,
}

impl Node {
    pub fn new(name: impl Into<String>, allocatable: Resources) -> Self {
        Node {
            name: name.into(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            allocatable,
            gpus: Vec::new(),
            unschedulable: false,
            network: Vec::new(),
        }
    }

    /// The GPU model of the node (of its first GPU), if it has GPUs.
    pub fn gpu_model(&self) -> Option<&str> {
        self.gpus.first().map(|g| g.model.as_str())
    }
}

/// One GPU on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuDevice {
    /// Index on the node (as `CUDA_VISIBLE_DEVICES` counts).
    pub index: u32,
    /// Product name, e.g. `H100-80GB`, `A100-40GB`, `T4`.
    pub model: String,
    /// Bytes of device memory.
    pub memory: u64,
    /// NVLink domain on the node (GPUs with the same value are connected by
    /// NVLink/NVSwitch); the `nvidia.com/gpu.clique` idea.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<u32>,
    /// PCIe root complex (`resource.kubernetes.io/pcieRoot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// NUMA node the GPU is attached to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// The GPU's MIG partitioning, when MIG is enabled on it (see [`crate::mig`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<crate::mig::MigLayout>,
    /// Set by the node runtime after a fault that needs the GPU looked at (an Xid
    /// or ECC error not confined to one task's context): the reason. No new work is
    /// placed on it; what runs there stays until it ends. Cleared by an operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<String>,
}

impl GpuDevice {
    pub fn new(index: u32, model: impl Into<String>, memory: u64) -> Self {
        GpuDevice {
            index,
            model: model.into(),
            memory,
            nvlink_domain: None,
            pcie_root: None,
            numa: None,
            mig: None,
            unhealthy: None,
        }
    }
}

/// What a taint does to tasks that do not tolerate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

/// A node taint, as in Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: String,
    pub effect: TaintEffect,
}

/// How a toleration matches a taint's value.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub enum TolerationOperator {
    #[default]
    Equal,
    Exists,
}

/// A task's toleration of taints, as in Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toleration {
    /// Empty key with `Exists` tolerates every taint.
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub operator: TolerationOperator,
    #[serde(default)]
    pub value: String,
    /// `None` tolerates every effect.
    #[serde(default)]
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    pub fn tolerates(&self, t: &Taint) -> bool {
        if let Some(e) = self.effect
            && e != t.effect
        {
            return false;
        }
        match self.operator {
            TolerationOperator::Exists => self.key.is_empty() || self.key == t.key,
            TolerationOperator::Equal => self.key == t.key && self.value == t.value,
        }
    }
}

/// The first taint with a hard effect that none of `tolerations` tolerates.
pub fn untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints.iter().find(|t| {
        t.effect != TaintEffect::PreferNoSchedule && !tolerations.iter().any(|tol| tol.tolerates(t))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(k: &str, v: &str, e: TaintEffect) -> Taint {
        Taint {
            key: k.into(),
            value: v.into(),
            effect: e,
        }
    }

    #[test]
    fn tolerations() {
        let t = taint("gpu", "h100", TaintEffect::NoSchedule);
        let eq = Toleration {
            key: "gpu".into(),
            operator: TolerationOperator::Equal,
            value: "h100".into(),
            effect: None,
        };
        assert!(eq.tolerates(&t));
        let wrong = Toleration {
            value: "a100".into(),
            ..eq.clone()
        };
        assert!(!wrong.tolerates(&t));
        let exists_all = Toleration {
            key: String::new(),
            operator: TolerationOperator::Exists,
            value: String::new(),
            effect: None,
        };
        assert!(exists_all.tolerates(&t));
        let other_effect = Toleration {
            effect: Some(TaintEffect::NoExecute),
            ..eq
        };
        assert!(!other_effect.tolerates(&t));
        let soft = [taint("x", "", TaintEffect::PreferNoSchedule)];
        assert!(untolerated(&soft, &[]).is_none());
    }
}
