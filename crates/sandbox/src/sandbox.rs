//! The supervisor side: create a sandbox (`SandboxBuilder::new(spec).spawn()`), run
//! commands and file operations in it, pause, resume and destroy it.

use crate::cgroup::{CgroupManager, SandboxCgroup};
use crate::error::{ExecError, SpawnError};
use crate::guard::CommandCheck;
use crate::proto::{self, Reply, Request};
use crate::spec::{ExitStatus, SandboxSpec};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;
use std::ffi::CString;
use std::fs;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod exec;
mod files;
mod runtime;
mod spawn;

pub use runtime::{InitProgram, RuntimeConfig};

/// Shared, per-process state for creating sandboxes: the opened init program, the
/// cgroup backend, the id mapping, the guard.
pub struct Runtime {
    init_fd: OwnedFd,
    init_path: PathBuf,
    argv: Vec<CString>,
    devnull: OwnedFd,
    cgroups: Option<Arc<dyn CgroupManager>>,
    guard: Arc<dyn CommandCheck>,
    tenant: Option<String>,
    /// uid/gid the sandbox's commands run as (inside), and the id maps.
    inner_uid: u32,
    uid_map: String,
    gid_map: String,
    deny_setgroups: bool,
    debug: bool,
    /// Network namespaces made ahead of time (root only).
    netns: Option<crate::netns::NetnsPool>,
    /// Kills and removes this process's sandboxes if it dies without destroying them.
    reaper: Option<std::process::Child>,
    egress: Option<crate::proxy::EgressRelay>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(mut r) = self.reaper.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("init", &self.init_path)
            .field("cgroups", &self.cgroups.as_ref().map(|c| c.version()))
            .field("uid_map", &self.uid_map)
            .finish()
    }
}

/// First host uid (and gid) of the range sandboxes map to when the supervisor is root:
/// root inside is this unprivileged id outside.
pub const HOST_ID_BASE: u32 = 100_000;
/// Size of the mapped range.
pub const HOST_ID_COUNT: u32 = 65_536;
/// The user commands run as, inside.
pub const SANDBOX_UID: u32 = 1000;

#[derive(Debug)]
enum RecvError {
    Eof,
    Timeout,
    Other(String),
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvError::Eof => write!(f, "init closed the connection"),
            RecvError::Timeout => write!(f, "init did not answer in time"),
            RecvError::Other(s) => write!(f, "{s}"),
        }
    }
}

fn recv_timeout<T: for<'de> serde::Deserialize<'de>>(
    sock: &OwnedFd,
    t: Duration,
) -> Result<T, RecvError> {
    recv_timeout_fds(sock, t).map(|(m, _)| m)
}

fn recv_timeout_fds<T: for<'de> serde::Deserialize<'de>>(
    sock: &OwnedFd,
    t: Duration,
) -> Result<(T, Vec<OwnedFd>), RecvError> {
    let deadline = Instant::now() + t;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RecvError::Timeout);
        }
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        let ms = PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
            .unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, ms) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => break,
            Err(e) => return Err(RecvError::Other(format!("poll: {e}"))),
        }
    }
    match proto::recv::<T>(sock.as_fd()) {
        Ok(Some((m, fds))) => Ok((m, fds)),
        Ok(None) => Err(RecvError::Eof),
        Err(e) => Err(RecvError::Other(e)),
    }
}

/// Receives output chunks as they arrive.
type OutputSink<'a> = dyn FnMut(Stream, &[u8]) + 'a;

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Creates sandboxes: `SandboxBuilder::new(spec).spawn()`.
#[derive(Debug, Clone)]
pub struct SandboxBuilder {
    spec: SandboxSpec,
    runtime: Option<Arc<Runtime>>,
}

impl SandboxBuilder {
    pub fn new(spec: SandboxSpec) -> Self {
        SandboxBuilder {
            spec,
            runtime: None,
        }
    }
    /// Use this runtime instead of [`Runtime::global`].
    pub fn runtime(mut self, rt: Arc<Runtime>) -> Self {
        self.runtime = Some(rt);
        self
    }
    pub fn spawn(&self) -> Result<Sandbox, SpawnError> {
        let rt = match &self.runtime {
            Some(r) => r.clone(),
            None => Runtime::global()?,
        };
        rt.spawn(&self.spec)
    }
}

/// A running sandbox. Dropping it destroys it.
pub struct Sandbox {
    id: String,
    pid: Pid,
    proxy: Mutex<Option<crate::proxy::Proxy>>,
    ctrl: Mutex<OwnedFd>,
    cgroup: Option<Box<dyn SandboxCgroup>>,
    rt: Arc<Runtime>,
    spec: SandboxSpec,
    destroyed: AtomicBool,
    paused: AtomicBool,
    /// Tenant for the guard, instead of the runtime's.
    tenant: Option<String>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .finish()
    }
}

struct JobResult {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    timed_out: bool,
    oom_killed: bool,
    /// Alerts and blocks from checks of `execve`s inside the sandbox.
    exec_alerts: Vec<String>,
}

impl Sandbox {
    /// Checks this sandbox's commands and file operations as `tenant`'s (instead of
    /// the runtime's tenant): for a server that claims sandboxes from one warm pool for
    /// many tenants.
    pub fn set_tenant(&mut self, tenant: Option<String>) {
        self.tenant = tenant;
    }

    /// The tenant the guard checks this sandbox's commands for.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref().or(self.rt.tenant.as_deref())
    }

    /// Is the sandbox paused?
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Has the sandbox been destroyed?
    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    /// The sandbox's id (also its cgroup's name).
    pub fn id(&self) -> &str {
        &self.id
    }
    /// Host pid of the sandbox's init.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }
    pub fn spec(&self) -> &SandboxSpec {
        &self.spec
    }
    /// The sandbox's cgroup, if cgroups are in use.
    pub fn cgroup(&self) -> Option<&dyn SandboxCgroup> {
        self.cgroup.as_deref()
    }

    /// Host pids of the sandbox's workload: every process but its init and the
    /// runners init forks per command (which stay to reap and report). With cgroups the
    /// candidates are the cgroup's processes, else every process of the host.
    pub fn workload_pids(&self) -> Vec<i32> {
        let init = self.pid.as_raw();
        let candidates: Vec<i32> = match &self.cgroup {
            Some(cg) => cg.procs(),
            None => fs::read_dir("/proc")
                .map(|rd| {
                    rd.flatten()
                        .filter_map(|e| e.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default(),
        };
        let mut parent = std::collections::HashMap::new();
        for p in candidates {
            if let Some(pp) = ppid_of(p) {
                parent.insert(p, pp);
            }
        }
        // Depth below init: 1 is a runner, 2 and more the workload.
        let depth = |mut p: i32| -> Option<usize> {
            let mut d = 0;
            while d < 4096 {
                if p == init {
                    return Some(d);
                }
                p = match parent.get(&p) {
                    Some(&pp) => pp,
                    None => ppid_of(p)?,
                };
                d += 1;
            }
            None
        };
        let mut out: Vec<i32> = parent
            .keys()
            .copied()
            .filter(|&p| depth(p).is_some_and(|d| d >= 2))
            .collect();
        out.sort_unstable();
        out
    }

    /// Sends `signal` to every process of the sandbox's workload (see
    /// [`Sandbox::workload_pids`]); init and the runners stay, so that a command ends
    /// with its status as usual. Returns how many processes were signalled. This is the
    /// first half of a graceful stop (SIGTERM, a grace period, then
    /// [`Sandbox::destroy`]).
    pub fn signal_workload(&self, signal: Signal) -> usize {
        if self.destroyed.load(Ordering::Acquire) {
            return 0;
        }
        let mut n = 0;
        // Twice: a process forked while the first pass ran gets it too.
        let mut done = std::collections::BTreeSet::new();
        for _ in 0..2 {
            for p in self.workload_pids() {
                if done.insert(p) && kill(Pid::from_raw(p), signal).is_ok() {
                    n += 1;
                }
            }
        }
        n
    }

    /// The inode of the sandbox's pid namespace (for checks that none of its
    /// processes is left once it is destroyed: see `/proc/<pid>/ns/pid`).
    pub fn pid_namespace(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(format!("/proc/{}/ns/pid", self.pid))
            .ok()
            .map(|m| m.ino())
    }

    /// Resident memory of the idle sandbox's init, in KiB.
    pub fn init_rss_kib(&self) -> Option<u64> {
        let s = fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }

    fn check_alive(&self) -> Result<(), ExecError> {
        if self.destroyed.load(Ordering::Acquire) {
            return Err(ExecError::Destroyed(self.id.clone()));
        }
        if self.paused.load(Ordering::Acquire) {
            return Err(ExecError::Paused(self.id.clone()));
        }
        Ok(())
    }

    fn request(&self, req: &Request, fds: &[RawFd]) -> Result<Reply, ExecError> {
        let ctrl = self.ctrl.lock().unwrap_or_else(|p| p.into_inner());
        proto::send(ctrl.as_fd(), req, fds).map_err(ExecError::Protocol)?;
        recv_timeout::<Reply>(&ctrl, Duration::from_secs(30))
            .map_err(|e| ExecError::Protocol(e.to_string()))
    }

    /// Round trip to init (liveness).
    pub fn ping(&self) -> Result<(), ExecError> {
        self.check_alive()?;
        match self.request(&Request::Ping, &[])? {
            Reply::Pong => Ok(()),
            r => Err(ExecError::Protocol(format!("unexpected reply {r:?}"))),
        }
    }

    /// Freezes every process of the sandbox (cgroup freezer).
    pub fn pause(&self) -> Result<(), crate::CgroupError> {
        let cg = self
            .cgroup
            .as_ref()
            .ok_or(crate::CgroupError::NoController("freezer"))?;
        cg.set_frozen(true)?;
        self.paused.store(true, Ordering::Release);
        Ok(())
    }
    /// Thaws a paused sandbox.
    pub fn resume(&self) -> Result<(), crate::CgroupError> {
        let cg = self
            .cgroup
            .as_ref()
            .ok_or(crate::CgroupError::NoController("freezer"))?;
        cg.set_frozen(false)?;
        self.paused.store(false, Ordering::Release);
        Ok(())
    }

    /// Kills every process of the sandbox and removes its cgroup. Its mounts and
    /// namespaces go with its last process. Idempotent.
    pub fn destroy(&self) -> Result<(), crate::CgroupError> {
        if self.destroyed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if self.paused.load(Ordering::Acquire)
            && let Some(cg) = &self.cgroup
        {
            // Frozen tasks cannot die until thawed.
            let _ = cg.set_frozen(false);
        }
        // Killing a pid namespace's init kills every process in it; waitpid returns
        // only once they are all gone.
        let _ = kill(self.pid, Signal::SIGKILL);
        while let Err(Errno::EINTR) = waitpid(self.pid, None) {}
        if let Some(p) = self.proxy.lock().unwrap_or_else(|p| p.into_inner()).take() {
            p.stop();
        }
        if let Some(cg) = &self.cgroup {
            cg.destroy()?;
        }
        Ok(())
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

/// The parent pid of `pid`, from `/proc/<pid>/stat`.
fn ppid_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut it = rest.split_whitespace();
    let state = it.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    it.next()?.parse().ok()
}

/// Host pids of every live process whose pid namespace has inode `ns` (see
/// [`Sandbox::pid_namespace`]): after a sandbox is destroyed, none.
pub fn pids_in_namespace(ns: u64) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if fs::metadata(format!("/proc/{pid}/ns/pid")).is_ok_and(|m| m.ino() == ns)
                && ppid_of(pid).is_some()
            {
                out.push(pid);
            }
        }
    }
    out
}

/// Is `path` the host path of a sandbox's init program? (For diagnostics.)
pub fn init_program_path(rt: &Runtime) -> &Path {
    &rt.init_path
}
