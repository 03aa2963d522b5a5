//! `tessera-node`: the node runtime, the one place that turns a binding into a
//! running, contained workload on this machine. `tessera up` embeds it for its local
//! node; the same crate is meant to run as the Kubernetes DaemonSet.
//!
//! - [`runtime`]: start, stop (SIGTERM, grace, SIGKILL to the whole tree) and meter
//!   tasks, each in a sandbox of its own with the limits of its resources, a clean
//!   environment, the guard, and only the GPUs of its binding.
//! - [`spec`]: the pure parts: resources to limits (Kubernetes `limits` above
//!   requests), the environment.
//! - [`fence`]: GPU fencing (device nodes, device cgroup, `CUDA_VISIBLE_DEVICES` by
//!   UUID) and the device-view check before every start.
//! - [`gpushare`]: GPU-share enforcement of fractional tasks (the CUDA
//!   interposer preloaded in their sandbox, an accounting region per task).
//! - [`compute`]: the node's compute monitor: one thread slicing the compute
//!   shares of fractional tasks (NVML's utilisation, a fake in tests).
//! - [`faults`]: Xid / ECC events (NVML, a fake in tests) to a node condition and
//!   GPUs no new work goes to.
//! - [`mig`]: MIG actuation behind a backend trait, journaled and resumable.
//! - [`gpu`]: what the driver says (NVML), mapped to the model's devices.
//! - [`health`]: heartbeat and conditions.
//! - [`attest`]: the node's TPM (keys, measurements, quotes) and the verifier's
//!   pure check of a quote against approved reference values.
//! - [`weights`]: model weights released by the key service to this node (a TPM
//!   quote binds the ephemeral key they are wrapped to) and decrypted into the
//!   task's memory-backed, read-only folder; nothing decrypted reaches a disk.
//! - [`bench`]: `tessera bench node`.
//!
//! Never knows: the store, HTTP, the scheduler's algorithms; the server decides,
//! this crate carries out and reports.

pub mod attest;
pub mod bench;
pub mod compute;
pub mod faults;
pub mod fence;
pub mod gpu;
pub mod gpushare;
pub mod health;
pub mod mig;
pub mod runtime;
pub mod spec;
pub mod weights;

pub use fence::{DeviceDirs, GpuAssignment, Mismatch};
pub use runtime::{
    NodeConfig, NodeError, NodeRuntime, OnExit, Outcome, StartError, Started, TaskExit, Usage,
    WorkloadSpec,
};
pub use spec::{Defaults, TaskKey, TaskLimits, TemplateRef};
