//! Queues: the unit of quota and fair share.

use serde::{Deserialize, Serialize};

use crate::resources::Resources;

/// A queue, in Volcano's words. Queues form a tree through `parent`; a queue
/// without a parent hangs from the implicit root, which owns the whole cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Queue {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Relative weight among siblings when the parent's share is divided.
    #[serde(default = "one")]
    pub weight: u32,
    /// Resources reserved for this queue: its deserved share never falls below this.
    #[serde(default)]
    pub guarantee: Resources,
    /// Hard upper bound on what the queue may hold. `None`: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<Resources>,
    /// Whether other queues may reclaim what this queue holds above its deserved share.
    #[serde(default = "yes")]
    pub reclaimable: bool,
}

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}

impl Queue {
    pub fn new(name: impl Into<String>) -> Self {
        Queue {
            name: name.into(),
            parent: None,
            weight: 1,
            guarantee: Resources::default(),
            capability: None,
            reclaimable: true,
        }
    }
}
