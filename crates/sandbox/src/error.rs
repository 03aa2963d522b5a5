//! One error enum per operation; each names the syscall, path or value that failed.

use std::io;
use thiserror::Error;

/// A step inside the sandbox failed; sent back by the init or a job.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, Error)]
#[error("{step} {target}: {message} (errno {errno})")]
pub struct StepError {
    /// The syscall or step (`mount`, `pivot_root`, `execve`, ...).
    pub step: String,
    /// The path or value it acted on.
    pub target: String,
    pub errno: i32,
    pub message: String,
}

impl StepError {
    pub fn new(step: &str, target: &str, err: impl Into<ErrnoLike>) -> Self {
        let e = err.into();
        StepError {
            step: step.into(),
            target: target.into(),
            errno: e.errno,
            message: e.message,
        }
    }
}

/// Anything with an errno and a message.
pub struct ErrnoLike {
    pub errno: i32,
    pub message: String,
}

impl From<nix::Error> for ErrnoLike {
    fn from(e: nix::Error) -> Self {
        ErrnoLike {
            errno: e as i32,
            message: e.desc().to_string(),
        }
    }
}

impl From<io::Error> for ErrnoLike {
    fn from(e: io::Error) -> Self {
        ErrnoLike {
            errno: e.raw_os_error().unwrap_or(0),
            message: e.to_string(),
        }
    }
}

impl From<String> for ErrnoLike {
    fn from(message: String) -> Self {
        ErrnoLike { errno: 0, message }
    }
}

impl From<&str> for ErrnoLike {
    fn from(message: &str) -> Self {
        ErrnoLike {
            errno: 0,
            message: message.into(),
        }
    }
}

/// Creating a sandbox failed.
#[derive(Debug, Error)]
pub enum SpawnError {
    #[error("init program {path}: {source}")]
    InitProgram { path: String, source: io::Error },
    #[error("{syscall} failed while spawning the sandbox: {source}")]
    Syscall {
        syscall: &'static str,
        source: io::Error,
    },
    #[error("writing {path}: {source}")]
    IdMap { path: String, source: io::Error },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("sandbox setup failed: {0}")]
    Setup(StepError),
    #[error("sandbox init exited during setup (status {0})")]
    InitDied(String),
    #[error("talking to sandbox init: {0}")]
    Protocol(String),
    #[error("seccomp policy: {0}")]
    Seccomp(String),
    /// The micro-VM tier could not start a VM (QEMU, its images, the guest's agent).
    #[error("micro-VM: {0}")]
    Vm(String),
}

/// A cgroup operation failed.
#[derive(Debug, Error)]
pub enum CgroupError {
    #[error("no usable cgroup hierarchy with the {0} controller")]
    NoController(&'static str),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: io::Error,
    },
    #[error("cgroup {path} still has processes after kill")]
    Busy { path: String },
}

/// Running a command failed (a command that runs and fails is not an error: see
/// [`crate::ExecOutput::status`]).
#[derive(Debug, Error)]
pub enum ExecError {
    #[error("blocked by guard: {0}")]
    Blocked(String),
    #[error("empty command")]
    EmptyCommand,
    #[error("command could not start: {0}")]
    Start(StepError),
    #[error("{syscall}: {source}")]
    Syscall {
        syscall: &'static str,
        source: io::Error,
    },
    #[error("talking to sandbox init: {0}")]
    Protocol(String),
    #[error("sandbox {0} is destroyed")]
    Destroyed(String),
    /// The sandbox is paused (or was paused under the command, which ended with it):
    /// resume it, then run the command again.
    #[error("sandbox {0} is paused; resume it first")]
    Paused(String),
}

/// A file operation failed.
#[derive(Debug, Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Op { path: String, source: StepError },
    #[error("path {0:?} must be absolute and must not contain NUL")]
    BadPath(String),
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A tar archive was refused (hostile or too large) or could not be made.
    #[error("{path}: {source}")]
    Archive {
        path: String,
        source: crate::tarball::TarError,
    },
}

/// Pausing, resuming, snapshotting or restoring a sandbox failed. The sandbox (or the
/// snapshot) is left as it was: a failed pause leaves it running, a failed resume leaves
/// the snapshot in place.
#[derive(Debug, Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("snapshot {path}: {message}")]
    Snapshot { path: String, message: String },
    #[error("sandbox {id}: {op} is not possible now: {why}")]
    State {
        id: String,
        op: &'static str,
        why: String,
    },
    #[error("sandbox {id}: {op}: {message}")]
    Vmm {
        id: String,
        op: &'static str,
        message: String,
    },
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl LifecycleError {
    pub(crate) fn snapshot(path: &std::path::Path, message: impl std::fmt::Display) -> Self {
        LifecycleError::Snapshot {
            path: path.display().to_string(),
            message: message.to_string(),
        }
    }
}
