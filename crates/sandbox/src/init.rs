//! The sandbox's init: PID 1 of the sandbox's pid namespace, root of its user
//! namespace. It builds the root file system, then serves the supervisor's requests
//! over fd 3 until that socket closes, when it exits and the kernel kills everything
//! left in the namespace.
//!
//! Every request runs as a *job*: init forks a runner (a child subreaper, so nothing the
//! job starts can slip out of its tree), the runner forks the job process, which drops
//! into the confinement (rlimits, uid 1000, no capabilities, Landlock, no_new_privs,
//! seccomp) and then runs the command or the file operation.

use crate::error::StepError;
use crate::proto::{self, Reply, Request};
use landlock::RulesetCreated;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

mod confine;
mod exec;
mod job;
mod setup;

pub(crate) use job::kill_tree;
use job::start_job;
pub(crate) use setup::loopback_up;
use setup::{fill, seal, setup};

/// The control socket's fd number in the init.
pub const CTRL_FD: RawFd = 3;

/// Where the new root is assembled before `pivot_root`. It covers the host's `/tmp`
/// only inside this private mount namespace; the host never sees it.
const STAGE: &str = "/tmp";

/// Entries of the host's root used by the default template.
const HOST_ENTRIES: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Entries of a template directory the sandbox owns instead.
const RESERVED: &[&str] = &[
    "tmp",
    "home",
    "workspace",
    "proc",
    "dev",
    "sys",
    "run",
    "root",
];
/// Device nodes bound from the host.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Set in the environment of the init program to make it a supervisor's reaper
/// instead (its value: the supervisor's pid).
pub const REAPER_ENV: &str = "TESSERA_SANDBOX_REAPER";

/// Entry point of the init binary (and of `tessera sandbox __init`). Never returns.
pub fn main() -> ! {
    if let Ok(v) = std::env::var(REAPER_ENV) {
        reaper(&v)
    }
    // The guest kernel starts its init with the command line's `TESSERA_GUEST=1`.
    if std::process::id() == 1 && std::env::var_os(crate::vm::guest::GUEST_ENV).is_some() {
        crate::vm::guest::main()
    }
    let code = match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tessera-sandbox-init: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// The reaper: waits for the supervisor `pid` to exit, then kills whatever is left in
/// its sandboxes' cgroups (frozen sandboxes included, which cannot notice on their own
/// that their control socket closed) and removes those cgroups.
fn reaper(v: &str) -> ! {
    let Ok(pid) = v.trim().parse::<u32>() else {
        eprintln!("tessera-sandbox-init: {REAPER_ENV}={v:?} is not a pid");
        std::process::exit(2)
    };
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    if raw >= 0 {
        // SAFETY: pidfd_open just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
        loop {
            let mut p = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut p, PollTimeout::NONE) {
                Ok(n) if n > 0 => break,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
    } else {
        // Kernels without pidfd_open (before 5.3): watch for being orphaned.
        while nix::unistd::getppid().as_raw() as u32 == pid {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    if let Some(cg) = crate::cgroup::detect() {
        cg.reap_supervisor(pid);
    }
    std::process::exit(0)
}

struct State {
    uid: u32,
    gid: u32,
    seccomp: Vec<seccompiler::BpfProgram>,
    landlock: Option<RulesetCreated>,
    rlimits: crate::spec::Rlimits,
    /// Sealed folders not sealed yet (see [`SandboxSpec::sealed`]).
    ///
    /// [`SandboxSpec::sealed`]: crate::spec::SandboxSpec::sealed
    unsealed: BTreeSet<String>,
}

fn close_from(first: u32) {
    // SAFETY: close_range only closes descriptors; none of those >= `first` is owned by
    // a live Rust object at the points where this is called (start of init).
    unsafe {
        libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32);
    }
}

fn run() -> Result<(), String> {
    // SAFETY: the supervisor placed our end of the control socket at fd 3 before
    // execve; nothing else in this process owns it.
    let ctrl = unsafe { OwnedFd::from_raw_fd(CTRL_FD) };
    // Nothing of the supervisor's but fds 0-3 may reach the sandbox.
    close_from(4);
    let ctrl_fd = ctrl.as_fd();
    let Some((req, _)) = proto::recv::<Request>(ctrl_fd)? else {
        return Ok(());
    };
    let Request::Setup { spec, uid, gid } = req else {
        return Err("first request was not Setup".into());
    };
    let mut st = match setup(&spec, uid, gid) {
        Ok(st) => st,
        Err(e) => {
            let _ = proto::send(ctrl_fd, &Reply::Failed(e), &[]);
            return Ok(());
        }
    };
    // Block SIGCHLD and read it from a signalfd in the poll loop.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).map_err(|e| e.to_string())?;
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("signalfd: {e}"))?;
    // The egress proxy's listening socket lives in our network namespace; the
    // supervisor serves it from outside.
    let proxy = match &spec.network {
        crate::spec::Network::Proxy(_) => {
            match std::net::TcpListener::bind(crate::spec::PROXY_ADDR) {
                Ok(l) => Some(l),
                Err(e) => {
                    let e = StepError::new("bind", crate::spec::PROXY_ADDR, e);
                    let _ = proto::send(ctrl_fd, &Reply::Failed(e), &[]);
                    return Ok(());
                }
            }
        }
        crate::spec::Network::None => None,
    };
    let proxy_fds: Vec<RawFd> = proxy.iter().map(|l| l.as_raw_fd()).collect();
    proto::send(
        ctrl_fd,
        &Reply::Ready {
            init_pid_in_ns: nix::unistd::getpid().as_raw(),
        },
        &proxy_fds,
    )?;
    drop(proxy);
    serve(&ctrl, &sfd, &mut st)
}

fn serve(ctrl: &OwnedFd, sfd: &SignalFd, st: &mut State) -> Result<(), String> {
    let mut runners: BTreeSet<i32> = BTreeSet::new();
    loop {
        let (ctrl_ready, sig_ready) = {
            let mut fds = [
                PollFd::new(ctrl.as_fd(), PollFlags::POLLIN),
                PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(format!("poll: {e}")),
            }
            let r = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (r(&fds[0]), r(&fds[1]))
        };
        if sig_ready {
            while let Ok(Some(_)) = sfd.read_signal() {}
            reap(&mut runners);
        }
        if !ctrl_ready {
            continue;
        }
        let Some((req, fds)) = proto::recv::<Request>(ctrl.as_fd())? else {
            // The supervisor is gone: exiting kills the whole namespace.
            return Ok(());
        };
        let reply = match req {
            Request::Ping => Reply::Pong,
            Request::Setup { .. } => Reply::Failed(StepError::new("setup", "", "already set up")),
            Request::Kill { pid } => {
                if runners.contains(&pid) {
                    kill_tree(pid, false);
                }
                Reply::Done
            }
            Request::Fill { path, file, bytes } => match fill(st, &path, &file, bytes, fds) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::Failed(e),
            },
            Request::Seal { path } => match seal(st, &path) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::Failed(e),
            },
            Request::Job(job) => match start_job(ctrl, st, job, fds) {
                Ok(pid) => {
                    runners.insert(pid);
                    Reply::Started { pid }
                }
                Err(e) => Reply::Failed(e),
            },
        };
        proto::send(ctrl.as_fd(), &reply, &[])?;
    }
}

fn reap(runners: &mut BTreeSet<i32>) {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(s) => {
                if let Some(p) = s.pid() {
                    runners.remove(&p.as_raw());
                }
            }
        }
    }
}

fn se<E: Into<crate::error::ErrnoLike>>(
    step: &'static str,
    target: impl AsRef<Path>,
) -> impl FnOnce(E) -> StepError {
    move |e| StepError::new(step, &target.as_ref().display().to_string(), e)
}
