//! Tessera's vocabulary: resources, nodes and their GPUs, queues, pod groups and
//! tasks, the cluster snapshot the scheduler reads and the plan it writes.
//!
//! Data and arithmetic only: this crate does no I/O, knows no clock and no
//! randomness, and depends on nothing but `serde` and `thiserror`. Field names follow
//! Volcano and Kueue where those projects have a word for the thing
//! (`min_member`, `min_resources`, `capability`, `guarantee`, `reclaimable`), so a
//! mapping to their CRDs stays one to one.

pub mod group;
pub mod mig;
pub mod node;
pub mod plan;
pub mod quantity;
pub mod queue;
pub mod resources;
pub mod snapshot;
pub mod topology;

pub use group::{GpuRequest, GroupKind, PodGroup, Task, TaskId};
pub use node::{
    ATTESTED_LABEL, GpuDevice, Node, RUNTIME_CLASS_LABEL_PREFIX, Taint, TaintEffect, Toleration,
    TolerationOperator, runtime_class_label,
};
pub use plan::{Binding, Choice, Eviction, MigRef, MigStep, Pending, Plan, Reservation};
pub use quantity::{QuantityError, parse_bytes, parse_count, parse_cpu_milli, parse_milli};
pub use queue::Queue;
pub use resources::{Dim, Resources};
pub use snapshot::{IssueKind, Snapshot, SnapshotIssue};
pub use topology::{GpuScope, GpuTopology, MigRequest, NetworkTier, Strength};
