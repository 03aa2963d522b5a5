//! Custom resources: Tessera's own `PodGroup`, `Queue` and `NodeShard` (group
//! `scheduling.tessera.dev`), generated from these Rust types with their OpenAPI
//! schemas, using Volcano's field names; and the foreign resources Tessera
//! accepts as they are, so that existing jobs move over unchanged: Volcano's
//! `scheduling.volcano.sh/v1beta1` `PodGroup` and `Queue`, Volcano's network
//! topology `topology.volcano.sh/v1alpha1` `HyperNode`, and scheduler-plugins'
//! `scheduling.x-k8s.io/v1alpha1` `PodGroup`. `docs/k8s-migration.md` maps every
//! field.

// Several `printcolumn(...)` entries repeat `type_ = ...`; that is kube-derive's syntax.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Tessera's API group.
pub const GROUP: &str = "scheduling.tessera.dev";
/// Volcano's API group.
pub const VOLCANO_GROUP: &str = "scheduling.volcano.sh";
/// scheduler-plugins' (coscheduling) API group.
pub const X_K8S_GROUP: &str = "scheduling.x-k8s.io";

/// A resource list, as in a pod's `resources.requests`.
pub type ResourceList = BTreeMap<String, Quantity>;

/// Where a gang's pods must sit in the network (Volcano's `networkTopology`,
/// volcano-sh/apis `pkg/apis/scheduling/v1beta1` `NetworkTopologySpec`: `mode`
/// is `hard` or `soft`, default `hard`; `highestTierAllowed` the highest
/// HyperNode tier the job may cross; `highestTierName` the same by a
/// HyperNode's `spec.tierName`, never both).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkTopologySpec {
    /// `hard` (must hold) or `soft` (preferred); default `hard`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^(hard|soft)$"))]
    pub mode: Option<String>,
    /// All pods within one domain of a tier at most this one (0 = one node,
    /// 1 = one tier-1 HyperNode such as a rack, 2 = a tier-2 HyperNode or a
    /// rack, …); default 1, as Volcano's Job API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub highest_tier_allowed: Option<i32>,
    /// Volcano's tier by name (accepted; Tessera asks for `highestTierAllowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest_tier_name: Option<String>,
}

/// A gang: at least `minMember` pods run together or none does.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "scheduling.tessera.dev",
    version = "v1alpha1",
    kind = "PodGroup",
    namespaced,
    status = "PodGroupStatus",
    shortname = "pg",
    printcolumn(name = "Min", type_ = "integer", json_path = ".spec.minMember"),
    printcolumn(name = "Queue", type_ = "string", json_path = ".spec.queue"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Running", type_ = "integer", json_path = ".status.running")
)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// How many pods must be placed together for the group to run at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_member: Option<i32>,
    /// Resources the group needs to start; admission checks them against the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_resources: Option<ResourceList>,
    /// The queue (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// A PriorityClass name; its value orders groups and allows preemption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Volcano's per-task minimums (accepted; Tessera gangs on `minMember`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_task_member: Option<BTreeMap<String, i32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_topology: Option<NetworkTopologySpec>,
    /// Tessera: `training` (binpack), `inference` (spread), `batch` or `agent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^(training|inference|batch|agent)$"))]
    pub kind: Option<String>,
}

/// What Tessera writes back on a PodGroup (Volcano's status fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupStatus {
    /// `Pending` (not admitted), `Inqueue` (admitted, waiting for room), `Running`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Pods bound to a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<i32>,
    /// Why the group waits, as the scheduler explains it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A queue's guaranteed resources (Volcano nests them under `resource`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Guarantee {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceList>,
}

/// A queue: the unit of quota and fair share (cluster-scoped, as in Volcano).
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "scheduling.tessera.dev",
    version = "v1alpha1",
    kind = "Queue",
    status = "QueueStatus",
    shortname = "tq",
    printcolumn(name = "Weight", type_ = "integer", json_path = ".spec.weight"),
    printcolumn(name = "Parent", type_ = "string", json_path = ".spec.parent")
)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// Relative weight among siblings (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub weight: Option<i32>,
    /// Hard upper bound on what the queue may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<ResourceList>,
    /// Resources reserved for the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee: Option<Guarantee>,
    /// Volcano's `deserved` (accepted; Tessera derives deserved shares from weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deserved: Option<ResourceList>,
    /// Whether other queues may reclaim what this one holds above its share (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimable: Option<bool>,
    /// The parent queue (hierarchical queues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// What Tessera writes back on a Queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<i32>,
}

/// A node shard: the nodes one of Tessera's two schedulers owns. The shard
/// named `agent` (or with `owner: agent`) belongs to the agent scheduler; every
/// other node belongs to the batch scheduler.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "scheduling.tessera.dev",
    version = "v1alpha1",
    kind = "NodeShard",
    status = "NodeShardStatus",
    printcolumn(name = "Owner", type_ = "string", json_path = ".spec.owner")
)]
#[serde(rename_all = "camelCase")]
pub struct NodeShardSpec {
    /// `agent` or `batch` (default: `agent` when the shard is named `agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^(agent|batch)$"))]
    pub owner: Option<String>,
    /// Names of the nodes the shard should hold.
    #[serde(default)]
    pub nodes_desired: Vec<String>,
}

/// Where a shard stands (Volcano's words).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeShardStatus {
    #[serde(default)]
    pub nodes_in_use: Vec<String>,
    #[serde(default)]
    pub nodes_to_add: Vec<String>,
    #[serde(default)]
    pub nodes_to_remove: Vec<String>,
}

/// Volcano's types, accepted as they are.
pub mod volcano {
    use super::*;

    /// `scheduling.volcano.sh/v1beta1` PodGroup (same spec fields as Tessera's).
    #[derive(
        CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema,
    )]
    #[kube(
        group = "scheduling.volcano.sh",
        version = "v1beta1",
        kind = "PodGroup",
        namespaced,
        status = "PodGroupStatus"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct PodGroupSpec {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub min_member: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub min_resources: Option<ResourceList>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub queue: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub priority_class_name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub min_task_member: Option<BTreeMap<String, i32>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub network_topology: Option<NetworkTopologySpec>,
    }

    /// `scheduling.volcano.sh/v1beta1` Queue.
    #[derive(
        CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema,
    )]
    #[kube(
        group = "scheduling.volcano.sh",
        version = "v1beta1",
        kind = "Queue",
        status = "QueueStatus"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct QueueSpec {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub weight: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub capability: Option<ResourceList>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub guarantee: Option<Guarantee>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub deserved: Option<ResourceList>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub reclaimable: Option<bool>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub parent: Option<String>,
    }
}

/// scheduler-plugins' coscheduling PodGroup, accepted as it is.
pub mod x_k8s {
    use super::*;

    /// `scheduling.x-k8s.io/v1alpha1` PodGroup.
    #[derive(
        CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema,
    )]
    #[kube(
        group = "scheduling.x-k8s.io",
        version = "v1alpha1",
        kind = "PodGroup",
        namespaced,
        status = "PodGroupStatus"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct PodGroupSpec {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub min_member: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub min_resources: Option<ResourceList>,
        /// Accepted; Tessera keeps a gang waiting until it fits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub schedule_timeout_seconds: Option<i32>,
    }

    /// scheduler-plugins' status fields.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct PodGroupStatus {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub phase: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub running: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub scheduled: Option<i32>,
    }
}

/// Volcano's network topology (Volcano 1.11+), accepted as it is: volcano-sh/apis
/// `pkg/apis/topology/v1alpha1/hypernode_types.go`. A HyperNode is a network
/// performance domain of one `tier` (1 = the switch nodes hang off, such as a
/// rack; higher tiers above it), whose `members` are nodes (`type: Node`,
/// chosen by `exactMatch.name`, `regexMatch.pattern` on the node name, or
/// `labelMatch`, a label selector) or lower-tier HyperNodes (`type: HyperNode`,
/// by `exactMatch.name` only: Volcano's scheduler ignores a regex there).
pub mod topology {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    /// Volcano's API group for HyperNodes.
    pub const GROUP: &str = "topology.volcano.sh";

    /// `topology.volcano.sh/v1alpha1` HyperNode (cluster-scoped).
    #[derive(
        CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema,
    )]
    #[kube(
        group = "topology.volcano.sh",
        version = "v1alpha1",
        kind = "HyperNode",
        shortname = "hn",
        status = "HyperNodeStatus",
        printcolumn(name = "Tier", type_ = "integer", json_path = ".spec.tier"),
        printcolumn(name = "NodeCount", type_ = "integer", json_path = ".status.nodeCount")
    )]
    #[serde(rename_all = "camelCase")]
    pub struct HyperNodeSpec {
        /// The tier: 1 for the lowest (nodes hang off it), higher above.
        #[serde(default)]
        pub tier: i64,
        /// A name for the tier (Volcano 1.13+), e.g. `rack`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tier_name: Option<String>,
        #[serde(default)]
        pub members: Vec<MemberSpec>,
    }

    /// A member: nodes, or a HyperNode of a lower tier.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct MemberSpec {
        /// `Node` or `HyperNode`.
        #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
        pub type_: Option<String>,
        #[serde(default)]
        pub selector: MemberSelector,
    }

    /// Exactly one of the three.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct MemberSelector {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub exact_match: Option<ExactMatch>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub regex_match: Option<RegexMatch>,
        /// Nodes only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub label_match: Option<LabelSelector>,
    }

    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct ExactMatch {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub name: Option<String>,
    }

    /// A regular expression on node names (Go's RE2 syntax; unanchored).
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
    pub struct RegexMatch {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pattern: Option<String>,
    }

    /// Volcano's status fields (Tessera does not write them).
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct HyperNodeStatus {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub node_count: Option<i64>,
    }
}

/// The CRDs Tessera installs (its own group only; Volcano's and
/// scheduler-plugins' CRDs come from those projects).
pub fn tessera_crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![PodGroup::crd(), Queue::crd(), NodeShard::crd()]
}

/// The foreign CRDs, for tests and for clusters that want to try Tessera on
/// Volcano- or coscheduling-shaped objects without installing those projects
/// (Volcano's HyperNode included, to describe the network by hand).
pub fn foreign_crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        volcano::PodGroup::crd(),
        volcano::Queue::crd(),
        x_k8s::PodGroup::crd(),
        topology::HyperNode::crd(),
    ]
}
