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
    /// Devices held back for a queued gang, so that smaller jobs do not keep
    /// taking them (the `reservation` plugin).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<Reservation>,
    /// For bound tasks that list device alternatives: which one each got.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<Choice>,
}

/// The device shape a binding takes, of those its task accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    pub task: TaskId,
    /// 0: the task's `gpu`; `k`: its `gpu_alternatives[k - 1]`.
    pub index: u32,
    pub gpu: crate::group::GpuRequest,
}

impl fmt::Display for crate::group::GpuRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::group::GpuRequest as G;
        let models = |m: &[String]| {
            if m.is_empty() {
                String::new()
            } else {
                format!(" {}", m.join("|"))
            }
        };
        match self {
            G::None => f.write_str("no GPU"),
            G::Whole { count, models: m } => write!(
                f,
                "{count} GPU{}{}",
                if *count == 1 { "" } else { "s" },
                models(m)
            ),
            G::Shared {
                milli, models: m, ..
            } => write!(f, "{milli}m of a GPU{}", models(m)),
            G::Mig { profile, models: m } => write!(f, "MIG {profile}{}", models(m)),
        }
    }
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
    /// For a MIG request: the instance on `gpus[0]`, and how to make it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigStep>,
}

/// The MIG instance a binding uses: an idle one reused, a new one created in
/// free slices, or — a re-partition step — a new one created after destroying
/// idle instances where it goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigStep {
    pub profile: String,
    /// First memory slice.
    pub start: u8,
    /// The instance does not exist yet: create it (after `destroy`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub create: bool,
    /// Idle instances to destroy first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destroy: Vec<MigRef>,
}

/// Names a MIG instance on a GPU: profile and first memory slice.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MigRef {
    pub profile: String,
    pub start: u8,
}

impl fmt::Display for MigRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.profile, self.start)
    }
}

/// GPUs (or a whole node, `gpus` empty) held back for a queued group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub group: String,
    pub node: String,
    /// The reserved GPUs; empty: the whole node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    pub reason: String,
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
            if let Some(m) = &b.mig {
                write!(f, " mig {}@{}", m.profile, m.start)?;
                if !m.destroy.is_empty() {
                    let d: Vec<String> = m.destroy.iter().map(MigRef::to_string).collect();
                    write!(f, " (re-partition: destroy idle {}, create)", d.join(", "))?;
                } else if m.create {
                    f.write_str(" (create)")?;
                }
            }
            if b.after_evictions {
                f.write_str(" (after evictions)")?;
            }
            if let Some(c) = self.choices.iter().find(|c| c.task == b.task) {
                write!(f, " (choice {}: {})", c.index + 1, c.gpu)?;
            }
            writeln!(f)?;
        }
        for r in &self.reservations {
            write!(f, "reserve {} on {}", r.group, r.node)?;
            if !r.gpus.is_empty() {
                let g: Vec<String> = r.gpus.iter().map(u32::to_string).collect();
                write!(f, " gpus [{}]", g.join(","))?;
            }
            writeln!(f, ": {}", r.reason)?;
        }
        for p in &self.pending {
            let state = if p.admitted { "pending" } else { "queued " };
            writeln!(f, "{state} {}: {}", p.group, p.reason)?;
        }
        if self.bindings.is_empty()
            && self.evictions.is_empty()
            && self.pending.is_empty()
            && self.reservations.is_empty()
        {
            writeln!(f, "nothing to do")?;
        }
        Ok(())
    }
}
