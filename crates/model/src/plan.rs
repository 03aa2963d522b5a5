//! What the scheduler decides: bindings, evictions, and why the rest waits.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::group::TaskId;

/// The outcome of one scheduling session. Applying it is the caller's job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub bindings: Vec<Binding>,
    pub evictions: Vec<Eviction>,
    pub pending: Vec<Pending>,
}

/// Place `task` on `node`, holding the GPUs `gpus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub task: TaskId,
    pub node: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// The binding needs resources that evictions in the same plan free: bind only
    /// once those victims are gone (Volcano's "pipelined").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_evictions: bool,
}

/// Evict `task` from `node`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eviction {
    pub task: TaskId,
    pub node: String,
    pub reason: String,
}

/// A group that stays (partly) unplaced, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub group: String,
    /// Whether the group passed admission (`enqueue`) and only lacks room.
    pub admitted: bool,
    pub reason: String,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.evictions {
            writeln!(f, "evict   {} on {}: {}", e.task, e.node, e.reason)?;
        }
        for b in &self.bindings {
            write!(f, "bind    {} -> {}", b.task, b.node)?;
            if !b.gpus.is_empty() {
                let g: Vec<String> = b.gpus.iter().map(u32::to_string).collect();
                write!(f, " gpus [{}]", g.join(","))?;
            }
            if b.after_evictions {
                f.write_str(" (after evictions)")?;
            }
            writeln!(f)?;
        }
        for p in &self.pending {
            let state = if p.admitted { "pending" } else { "queued " };
            writeln!(f, "{state} {}: {}", p.group, p.reason)?;
        }
        if self.bindings.is_empty() && self.evictions.is_empty() && self.pending.is_empty() {
            writeln!(f, "nothing to do")?;
        }
        Ok(())
    }
}
