//! Creating a sandbox: the clone into new namespaces, the id maps, the cgroup, and
//! init's setup.

use crate::cgroup::SandboxCgroup;
use crate::error::SpawnError;
use crate::proto::{self, Reply, Request};
use crate::spec::{Network, SandboxSpec};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::sys::wait::waitpid;
use nix::unistd::{Pid, pipe2};
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{RecvError, Runtime, Sandbox, recv_timeout_fds};

static SEQ: AtomicU64 = AtomicU64::new(0);

impl Runtime {
    /// Creates a sandbox from `spec`.
    pub fn spawn(self: &Arc<Self>, spec: &SandboxSpec) -> Result<Sandbox, SpawnError> {
        let id = format!(
            "sb-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let cg = match &self.cgroups {
            Some(m) => Some(m.create_fenced(&id, &spec.limits, spec.device_allow.as_deref())?),
            None => None,
        };
        // The guard's Landlock grants go into every sandbox, whoever built the spec.
        let mut eff = spec.clone();
        eff.extra_rules
            .extend(self.guard.landlock_rules(self.tenant.as_deref()));
        match self.spawn_in(&eff, &id, cg.as_deref()) {
            Ok((pid, ctrl, proxy)) => Ok(Sandbox {
                id,
                pid,
                proxy: Mutex::new(proxy),
                ctrl: Mutex::new(ctrl),
                cgroup: cg,
                rt: self.clone(),
                spec: spec.clone(),
                destroyed: AtomicBool::new(false),
                tenant: None,
                paused: AtomicBool::new(false),
            }),
            Err(e) => {
                if let Some(c) = cg {
                    let _ = c.destroy();
                }
                Err(e)
            }
        }
    }

    fn spawn_in(
        &self,
        spec: &SandboxSpec,
        id: &str,
        cg: Option<&dyn SandboxCgroup>,
    ) -> Result<(Pid, OwnedFd, Option<crate::proxy::Proxy>), SpawnError> {
        let sys = |syscall: &'static str| {
            move |e: Errno| SpawnError::Syscall {
                syscall,
                source: e.into(),
            }
        };
        let (sup, child_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(sys("socketpair"))?;
        let (sync_r, sync_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        // Closed in the child by its execve (close-on-exec): EOF here means the child
        // runs the init program in a memory of its own.
        let (exec_r, exec_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        let mut flags = libc::CLONE_NEWUSER
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC;
        // A pre-made network namespace, entered by this thread around the clone so
        // that the child inherits it; without one the clone makes its own.
        let premade = match &self.netns {
            Some(pool) => pool.take(),
            None => None,
        };
        let home_netns = match &premade {
            Some(_) => Some(crate::netns::home_netns().map_err(|e| SpawnError::Syscall {
                syscall: "open own network namespace",
                source: io::Error::other(e),
            })?),
            None => None,
        };
        // Every network policy gets a private namespace: pre-made, or made by clone.
        if premade.is_none() {
            flags |= libc::CLONE_NEWNET;
        }
        // Everything the child touches is prepared here: after clone it may only make
        // async-signal-safe calls (the supervisor may be multi-threaded).
        let mut argv_ptrs: Vec<*const libc::c_char> =
            self.argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        let empty = c"";
        let fds = ChildFds {
            sync_r: sync_r.as_raw_fd(),
            sync_w: sync_w.as_raw_fd(),
            ctrl: child_end.as_raw_fd(),
            devnull: self.devnull.as_raw_fd(),
            init: self.init_fd.as_raw_fd(),
            keep_stderr: self.debug,
        };
        if let Some(ns) = &premade {
            crate::netns::enter(ns).map_err(sys("setns(sandbox network namespace)"))?;
        }
        // The child shares this process's memory until it execs (CLONE_VM, as
        // posix_spawn does): no page tables to copy, and no copy-on-write faults here
        // afterwards, which on a busy supervisor cost more than the clone itself. It
        // runs on a stack of this thread's own and only reads `args`, which outlive it:
        // every path out of this function after a successful clone has either seen the
        // init answer (so it has exec'd) or killed and reaped it. Signals stay blocked
        // in the child until just before execveat, so that no handler of ours runs on
        // shared memory in its context.
        let mut args = ChildArgs {
            fds,
            empty: empty.as_ptr(),
            argv: argv_ptrs.as_ptr(),
            envp: envp.as_ptr(),
            // SAFETY: an all-zero sigset_t is a valid (empty) set; filled below.
            sigmask: unsafe { std::mem::zeroed() },
        };
        let ret = CHILD_STACK.with(|stack| {
            let mut stack = stack.borrow_mut();
            // SAFETY: the stack buffer is this thread's and is not touched by anything
            // else while the child runs on it (this thread waits for the child to exec
            // or die before the next spawn); `child_entry` only reads `args` and never
            // returns; the signal masks are restored on both sides.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut args.sigmask);
                let top = stack.as_mut_ptr().add(stack.len()) as usize & !15usize;
                let r = libc::clone(
                    child_entry,
                    top as *mut libc::c_void,
                    flags | libc::CLONE_VM | libc::SIGCHLD,
                    (&args as *const ChildArgs).cast_mut().cast(),
                );
                let e = io::Error::last_os_error();
                libc::pthread_sigmask(libc::SIG_SETMASK, &args.sigmask, std::ptr::null_mut());
                (r, e)
            }
        });
        let (ret, clone_err) = ret;
        if let Some(home) = home_netns
            && let Err(e) = crate::netns::enter_raw(home)
        {
            // This thread would go on in a sandbox's network: never acceptable.
            eprintln!("tessera-sandbox: cannot return to the supervisor's network namespace: {e}");
            std::process::abort();
        }
        drop(premade);
        if ret < 0 {
            return Err(SpawnError::Syscall {
                syscall: "clone",
                source: clone_err,
            });
        }
        let pid = Pid::from_raw(ret);
        drop(child_end);
        drop(sync_r);
        drop(exec_w);
        let abort = |e: SpawnError| {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
            e
        };
        let map = |file: &str, content: &str| -> Result<(), SpawnError> {
            let path = format!("/proc/{pid}/{file}");
            fs::write(&path, content).map_err(|source| SpawnError::IdMap { path, source })
        };
        let r = (|| {
            if self.deny_setgroups {
                map("setgroups", "deny")?;
            }
            map("uid_map", &self.uid_map)?;
            map("gid_map", &self.gid_map)
        })();
        r.map_err(&abort)?;
        nix::unistd::write(&sync_w, &[1]).map_err(|e| abort(sys("write sync pipe")(e)))?;
        drop(sync_w);
        // The child joins its cgroup only once it has exec'd. Before, it shares this
        // process's memory (CLONE_VM): a memory limit reached in that window (a tiny
        // limit, the exec itself) would make the OOM killer kill the child, and with
        // it every task sharing that memory — the supervisor.
        wait_eof(&exec_r, Duration::from_secs(30)).map_err(|e| abort(sys("wait for exec")(e)))?;
        drop(exec_r);
        if let Some(c) = cg {
            c.attach(pid.as_raw()).map_err(|e| abort(e.into()))?;
        }
        let setup = Request::Setup {
            spec: spec.clone(),
            uid: self.inner_uid,
            gid: self.inner_uid,
        };
        proto::send(sup.as_fd(), &setup, &[]).map_err(|e| abort(SpawnError::Protocol(e)))?;
        let result = match recv_timeout_fds::<Reply>(&sup, Duration::from_secs(30)) {
            Ok((Reply::Ready { .. }, mut fds)) => {
                let proxy = match (&spec.network, fds.pop()) {
                    (Network::Proxy(policy), Some(l)) => {
                        let started = match &self.egress {
                            Some(relay) => crate::proxy::Proxy::start_with(l, relay.clone()),
                            None => crate::proxy::Proxy::start(l, policy.clone()),
                        };
                        Some(started.map_err(|e| {
                            abort(SpawnError::Syscall {
                                syscall: "egress proxy",
                                source: e,
                            })
                        })?)
                    }
                    (Network::Proxy(_), None) => {
                        return Err(abort(SpawnError::Protocol(
                            "init sent no proxy socket".into(),
                        )));
                    }
                    _ => None,
                };
                Ok((pid, sup, proxy))
            }
            Ok((Reply::Failed(e), _)) => Err(abort(SpawnError::Setup(e))),
            Ok((other, _)) => Err(abort(SpawnError::Protocol(format!(
                "unexpected reply {other:?}"
            )))),
            Err(RecvError::Eof) => {
                let st = waitpid(pid, None);
                Err(SpawnError::InitDied(format!(
                    "{st:?} (id {id}; set TESSERA_SANDBOX_DEBUG=1 to see its stderr)"
                )))
            }
            Err(e) => Err(abort(SpawnError::Protocol(e.to_string()))),
        };
        // The child read `args` and `envp` (this frame) until it exec'd or died, which
        // every arm above has waited for: keep them alive to here.
        std::hint::black_box((&args, &envp));
        result
    }
}

/// Waits until every write end of the pipe `r` is closed (EOF), at most `t`.
fn wait_eof(r: &OwnedFd, t: Duration) -> Result<(), Errno> {
    let deadline = Instant::now() + t;
    let mut b = [0u8; 16];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Errno::ETIMEDOUT);
        }
        let ms = PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
            .unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(r.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e),
        }
        match nix::unistd::read(r, &mut b) {
            Ok(0) => return Ok(()),
            Ok(_) | Err(Errno::EINTR) | Err(Errno::EAGAIN) => {}
            Err(e) => return Err(e),
        }
    }
}

struct ChildFds {
    sync_r: RawFd,
    sync_w: RawFd,
    ctrl: RawFd,
    devnull: RawFd,
    init: RawFd,
    keep_stderr: bool,
}

/// What the cloned child reads (it shares the parent's memory until it execs).
struct ChildArgs {
    fds: ChildFds,
    empty: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// The parent thread's signal mask, restored just before execveat.
    sigmask: libc::sigset_t,
}

thread_local! {
    /// The stack a cloned child runs on until it execs: one per supervisor thread.
    static CHILD_STACK: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; 256 << 10].into_boxed_slice());
}

extern "C" fn child_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` the parent passed to clone; it outlives the child's
    // use of it (see `spawn_in`).
    let a = unsafe { &*(arg as *const ChildArgs) };
    child_after_clone(a)
}

/// Runs in the cloned child, on its own stack in the parent's memory. Only raw syscalls
/// and async-signal-safe calls, no allocation, no write to shared memory (errno aside,
/// and only on a failure that ends in `_exit`); never returns.
fn child_after_clone(a: &ChildArgs) -> ! {
    let f = &a.fds;
    // SAFETY: plain syscalls on descriptors of the child's own (copied) fd table; the
    // pointers were built by the parent before clone and stay valid until it execs.
    unsafe {
        libc::close(f.sync_w);
        let mut b = 0u8;
        loop {
            let r = libc::read(f.sync_r, (&mut b as *mut u8).cast(), 1);
            if r == 1 {
                break;
            }
            if r < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            libc::_exit(1);
        }
        // Become root of the new user namespace (the map is written by now). Raw
        // syscalls: glibc's wrappers would try to signal the parent's other threads.
        libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>());
        if libc::syscall(libc::SYS_setresgid, 0u32, 0u32, 0u32) != 0
            || libc::syscall(libc::SYS_setresuid, 0u32, 0u32, 0u32) != 0
        {
            libc::_exit(126);
        }
        // Move what we keep above any fd we are about to overwrite.
        let ctrl = libc::fcntl(f.ctrl, libc::F_DUPFD, 10);
        let null = libc::fcntl(f.devnull, libc::F_DUPFD, 10);
        let init = libc::fcntl(f.init, libc::F_DUPFD_CLOEXEC, 10);
        if ctrl < 0 || null < 0 || init < 0 {
            libc::_exit(1);
        }
        libc::dup2(null, 0);
        libc::dup2(null, 1);
        if !f.keep_stderr {
            libc::dup2(null, 2);
        }
        libc::dup2(ctrl, crate::init::CTRL_FD);
        // The parent's mask (the kernel's sigset is the first 8 bytes of glibc's).
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &a.sigmask as *const libc::sigset_t,
            std::ptr::null_mut::<libc::sigset_t>(),
            8usize,
        );
        libc::syscall(
            libc::SYS_execveat,
            init,
            a.empty,
            a.argv,
            a.envp,
            libc::AT_EMPTY_PATH,
        );
        libc::_exit(127)
    }
}
