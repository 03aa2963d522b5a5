//! tessera-sandbox: isolated Linux sandboxes.
//!
//! A sandbox is a process tree in its own user, pid, mount, uts, ipc, cgroup and network
//! namespaces, under a cgroup with memory, CPU and pids limits, whose every command runs
//! as an unprivileged user with no capabilities, under Landlock and a seccomp filter.
//! See `THREAT_MODEL.md` (sandbox section) for what each layer stops and what it does not.
//!
//! ```no_run
//! use tessera_sandbox::{SandboxBuilder, SandboxSpec, ExecRequest};
//! let sb = SandboxBuilder::new(SandboxSpec::default()).spawn()?;
//! let out = sb.exec(&ExecRequest::shell("echo hi"))?;
//! assert_eq!(out.stdout, b"hi\n");
//! sb.destroy()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! This is the one crate of the workspace allowed `unsafe` (raw `clone`, `execveat`,
//! `ioctl`, `capset`); each block says why it is sound.
#![allow(unsafe_code)]

pub mod cgroup;
pub mod class;
pub mod error;
mod execcheck;
pub mod guard;
pub mod identity;
pub mod init;
pub mod netns;
pub mod pool;
mod proto;
pub mod proxy;
pub mod registry;
pub mod sandbox;
pub mod seccomp;
pub mod snapshot;
pub mod spec;
pub mod tarball;
pub mod template;
pub mod tier;
pub mod trust;
pub mod vm;

pub use cgroup::{CgroupManager, SandboxCgroup};
pub use class::{ClassError, RuntimeClasses};
pub use error::{CgroupError, ExecError, FileError, LifecycleError, SpawnError, StepError};
pub use guard::{
    AllowAll, CheckDecision, CommandCheck, FileAccess, PolicyGuard, RedactionEvent,
    RedactionObserver, StreamRedactor, landlock_grants, redact_json,
};
pub use netns::NetnsStats;
pub use pool::{PoolConfig, PoolStats, WarmPool};
pub use registry::{RegistryError, TemplateRecord, TemplateRegistry};
pub use sandbox::{
    InitProgram, Runtime, RuntimeConfig, Sandbox, SandboxBuilder, Stream, pids_in_namespace,
};
pub use snapshot::{Snapshot, SnapshotMeta};
pub use spec::{
    Bind, Command, DeviceRule, DirEntry, EgressPolicy, ExecOutput, ExecRequest, ExitStatus,
    FileKind, Limits, Network, PROXY_ADDR, PathAccess, Rlimits, SandboxSpec, Template,
};
pub use tarball::{TarError, TarLimits, TarSummary};
pub use tier::{
    AnySandbox, Isolated, NamespaceTier, OnTimeout, PauseOptions, Phase, Stats, Tier, TierInfo,
    TierKind,
};

/// Milliseconds since the Unix epoch: the clock helper of the crates that may read
/// the clock (`tessera-agent` and `tessera-server` re-export it; the pure crates take
/// time as an input, and `tessera-gateway`, which sits beside this crate rather
/// than above it, keeps its own private copy).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
