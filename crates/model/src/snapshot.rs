//! The state the scheduler reads: nodes, queues, and groups with their tasks.

use serde::{Deserialize, Serialize};

use crate::group::PodGroup;
use crate::node::Node;
use crate::queue::Queue;

/// A consistent view of the cluster at one moment. The scheduler derives free
/// capacity from `nodes` minus the tasks in `groups` that have a `node`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    #[serde(default)]
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub queues: Vec<Queue>,
    #[serde(default)]
    pub groups: Vec<PodGroup>,
}
