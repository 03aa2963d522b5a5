//! `tessera-sched`: the batch scheduler. Pure and deterministic: a snapshot of the
//! cluster in, a plan out. No I/O, no async, no clock, no randomness.
//!
//! A session runs the configured *actions* in order (`enqueue`, `allocate`,
//! `backfill`, `preempt`, `reclaim`); the actions consult *plugins* (`priority`,
//! `gang`, `drf`, `proportion`, `predicates`, `binpack`, `spread`) for ordering,
//! admission and scoring. Placement looks for nodes through an index of free
//! capacity rather than scanning every node for every task.
//!
//! `sched` knows nothing of tokio, SQL, HTTP or Kubernetes.

pub mod agent;
pub mod config;
pub mod gpu;
mod index;
pub mod proportion;
mod session;
mod state;
mod victims;

pub use config::{Action, Config, ConfigError, PluginName, Profile, SharePolicy};
pub use session::{Explanation, NoObserver, NodeVerdict, Observer, explain};
/// The bounds of the victim search (see the `victims` module).
pub use victims::{DECISION_STEPS, JOINT_MAX, NODE_STEPS};

use tessera_model::{Plan, Snapshot};

/// Runs one scheduling session over `snapshot` with `config` and returns the plan.
/// The same snapshot and configuration always give the same plan, whatever the
/// order of nodes, queues, groups or tasks in the snapshot.
pub fn schedule(snapshot: &Snapshot, config: &Config) -> Plan {
    session::run(snapshot, config, &mut NoObserver)
}

/// [`schedule`], calling `observer` after every placement decision (for
/// benchmarks that time decisions; the scheduler itself reads no clock).
pub fn schedule_observed(
    snapshot: &Snapshot,
    config: &Config,
    observer: &mut dyn Observer,
) -> Plan {
    session::run(snapshot, config, observer)
}
