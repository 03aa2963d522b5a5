//! The agent scheduler: parallel workers with optimistic concurrency, and the node
//! shards it shares with the batch scheduler.
//!
//! Agent sandboxes arrive by the tens of thousands per second and live for
//! hundreds of milliseconds; a batch session per second is too slow for them.
//! This module places them one by one, with several workers in parallel.
//!
//! Two layers, kept apart on purpose:
//!
//! * **Pure decisions**, deterministic, no clock (time is a value passed in):
//!   [`queue`] (active queue fair between tenants and ordered by priority,
//!   back-off queue, unschedulable pool), [`select`] (up to K candidate nodes from
//!   a window of the shard), [`shard`] (the hand-over state machine
//!   `InUse -> ToRemove -> ToAdd -> InUse`) and [`controller`] (the policy chain
//!   that sizes the shards).
//! * **Concurrent machinery**, `std` only (atomics, a mutex, threads; no I/O, no
//!   async, no clock): [`table`] (one shared node table of sequence-locked slots,
//!   read without copying, committed by compare-version-then-write) and [`engine`]
//!   (workers and the binder protocol). Built with `--cfg loom`, its atomics are
//!   loom's, and `tests/agent_loom.rs` model-checks the binder.
//!
//! See `docs/agent-scheduler.md` for the design and the measurements.

pub mod controller;
pub mod engine;
pub mod queue;
pub mod select;
pub mod shard;
mod sync;
pub mod table;
pub mod task;

pub use controller::{ControllerState, Decision, Policy, ShardLoad, decide, default_policies};
pub use engine::{AgentConfig, AgentScheduler, Bound, Clock, FixedClock, Worker, WorkerStats};
pub use queue::{AgentQueue, BackedOff, QueueConfig, QueueLens};
pub use select::{Candidate, Cursor, Score, SelectConfig};
pub use shard::{Access, HandOverError, NodePhase, Owner, ShardCounts, ShardMode, ShardTable};
pub use table::{CommitError, NodeRead, NodeSource, NodeTable};
pub use task::{AgentTask, Demand, TenantId};
