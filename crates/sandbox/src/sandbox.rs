//! The supervisor side: create a sandbox (`SandboxBuilder::new(spec).spawn()`), run
//! commands and file operations in it, pause, resume and destroy it.

use crate::cgroup::{self, CgroupManager, SandboxCgroup};
use crate::error::{ExecError, FileError, SpawnError, StepError};
use crate::guard::{CheckDecision, CommandCheck, FileAccess, PolicyGuard};
use crate::proto::{self, Job, JobKind, JobStatus, Reply, Request};
use crate::spec::{DirEntry, ExecOutput, ExecRequest, ExitStatus, Network, SandboxSpec};
use crate::tarball::{TarLimits, TarSummary};
use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::sys::stat::Mode;
use nix::sys::wait::waitpid;
use nix::unistd::{Pid, pipe2};
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The program that becomes each sandbox's init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProgram {
    pub path: PathBuf,
    /// Arguments after argv[0] (for instance `["sandbox", "__init"]` for `tessera`).
    pub args: Vec<String>,
}

impl InitProgram {
    /// An init program held in memory: `bytes` (an executable, for instance the
    /// `tessera-sandbox-init` a binary carries inside it) are copied into a sealed
    /// memfd that lives as long as this process, and the program is run from there.
    /// Nothing is written to disk, and nothing can change the program once sealed.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> io::Result<InitProgram> {
        use nix::fcntl::{FcntlArg, SealFlag, fcntl};
        use nix::sys::memfd::{MFdFlags, memfd_create};
        if name.contains('\0') {
            return Err(io::Error::other("name contains NUL"));
        }
        let fd = memfd_create(name, MFdFlags::MFD_ALLOW_SEALING)?;
        let mut f = fs::File::from(fd);
        io::Write::write_all(&mut f, bytes)?;
        let fd = OwnedFd::from(f);
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_WRITE
                    | SealFlag::F_SEAL_GROW
                    | SealFlag::F_SEAL_SHRINK
                    | SealFlag::F_SEAL_SEAL,
            ),
        )?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        // Kept open for the life of the process: the path names this descriptor, and
        // the reaper and every sandbox start from it.
        std::mem::forget(fd);
        Ok(InitProgram { path, args: vec![] })
    }

    /// `$TESSERA_SANDBOX_INIT`, else `tessera-sandbox-init` next to the running program
    /// or one directory up (where cargo puts binaries for tests in `deps/`).
    pub fn locate() -> Option<InitProgram> {
        if let Some(p) = std::env::var_os("TESSERA_SANDBOX_INIT") {
            return Some(InitProgram {
                path: p.into(),
                args: vec![],
            });
        }
        let exe = std::env::current_exe().ok()?;
        let dir = exe.parent()?;
        for d in [Some(dir), dir.parent()].into_iter().flatten() {
            let p = d.join("tessera-sandbox-init");
            if p.is_file() {
                return Some(InitProgram {
                    path: p,
                    args: vec![],
                });
            }
        }
        None
    }
}

/// How a [`Runtime`] is set up.
#[derive(Clone)]
pub struct RuntimeConfig {
    /// `None`: [`InitProgram::locate`].
    pub init: Option<InitProgram>,
    /// Use cgroups (detected v1 or v2). Without them limits are not enforced.
    pub cgroups: bool,
    /// Checks every command, file operation and `execve`, and redacts output. There is
    /// no "none": the default is [`PolicyGuard`] over the shipped policy, and a runtime
    /// that must run anything unchecked says so with [`crate::AllowAll`].
    pub guard: Arc<dyn CommandCheck>,
    /// Tenant passed to the guard.
    pub tenant: Option<String>,
    /// Use this cgroup backend instead of the detected one (with `cgroups`), for
    /// instance a [`crate::cgroup::CgroupV2::at`] hierarchy mounted elsewhere. Its
    /// sandboxes are not reaped if this process dies (the reaper detects its own).
    pub cgroup_backend: Option<Arc<dyn CgroupManager>>,
    /// Where a sandbox with [`Network::Proxy`]'s proxy connections go: `None`, to this
    /// process's proxy ([`crate::proxy::Proxy::start`], which connects out); `Some`,
    /// to a relay (a micro-VM's guest, which has no network, sends them to the host).
    pub egress: Option<crate::proxy::EgressRelay>,
}

impl std::fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeConfig")
            .field("init", &self.init)
            .field("cgroups", &self.cgroups)
            .field("guard_checks_exec", &self.guard.checks_exec())
            .field("tenant", &self.tenant)
            .field(
                "cgroup_backend",
                &self.cgroup_backend.as_ref().map(|c| c.version()),
            )
            .field("egress_relay", &self.egress.is_some())
            .finish()
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            init: None,
            cgroups: false,
            guard: Arc::new(PolicyGuard::default()),
            tenant: None,
            cgroup_backend: None,
            egress: None,
        }
    }
}

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

/// Starts the reaper: the init program in reaper mode, in its own process group (a
/// terminal's Ctrl-C must not take it down with the supervisor), watching this process.
fn start_reaper(init: &InitProgram, debug: bool) -> Option<std::process::Child> {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    std::process::Command::new(&init.path)
        .args(&init.args)
        .env(crate::init::REAPER_ENV, std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if debug {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .process_group(0)
        .spawn()
        .ok()
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

static SEQ: AtomicU64 = AtomicU64::new(0);

impl Runtime {
    pub fn new(config: RuntimeConfig) -> Result<Arc<Runtime>, SpawnError> {
        let init =
            config
                .init
                .or_else(InitProgram::locate)
                .ok_or_else(|| SpawnError::InitProgram {
                    path: "tessera-sandbox-init".into(),
                    source: io::Error::new(
                        io::ErrorKind::NotFound,
                        "not found next to this program; set TESSERA_SANDBOX_INIT",
                    ),
                })?;
        let init_fd =
            open(&init.path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()).map_err(|e| {
                SpawnError::InitProgram {
                    path: init.path.display().to_string(),
                    source: e.into(),
                }
            })?;
        let mut argv = vec![CString::new("tessera-sandbox-init").expect("no NUL")];
        for a in &init.args {
            argv.push(
                CString::new(a.as_str()).map_err(|_| SpawnError::InitProgram {
                    path: init.path.display().to_string(),
                    source: io::Error::new(io::ErrorKind::InvalidInput, "argument contains NUL"),
                })?,
            );
        }
        let devnull =
            open("/dev/null", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty()).map_err(|e| {
                SpawnError::Syscall {
                    syscall: "open /dev/null",
                    source: e.into(),
                }
            })?;
        let euid = nix::unistd::geteuid().as_raw();
        let egid = nix::unistd::getegid().as_raw();
        let root = euid == 0;
        let (uid_map, gid_map, inner_uid) = if root {
            (
                format!("0 {HOST_ID_BASE} {HOST_ID_COUNT}\n"),
                format!("0 {HOST_ID_BASE} {HOST_ID_COUNT}\n"),
                SANDBOX_UID,
            )
        } else {
            (format!("0 {euid} 1\n"), format!("0 {egid} 1\n"), 0)
        };
        let cgroups: Option<Arc<dyn CgroupManager>> = match (config.cgroups, config.cgroup_backend)
        {
            (true, Some(b)) => Some(b),
            (true, None) if root => cgroup::detect().map(Arc::from),
            _ => None,
        };
        if let Some(c) = &cgroups {
            // Crash recovery: cgroups of supervisors that died without destroying.
            c.remove_stale();
        }
        let debug = std::env::var_os("TESSERA_SANDBOX_DEBUG").is_some();
        // Without cgroups nothing can be frozen, and a running sandbox's init exits
        // when its control socket closes with this process: no reaper needed.
        let reaper = if cgroups.is_some() {
            start_reaper(&init, debug)
        } else {
            None
        };
        Ok(Arc::new(Runtime {
            init_fd,
            init_path: init.path,
            argv,
            devnull,
            cgroups,
            guard: config.guard,
            tenant: config.tenant,
            inner_uid,
            uid_map,
            gid_map,
            deny_setgroups: !root,
            debug,
            netns: if root { start_netns_pool() } else { None },
            reaper,
            egress: config.egress,
        }))
    }

    /// A process-wide runtime with defaults (cgroups on), made on first use.
    pub fn global() -> Result<Arc<Runtime>, SpawnError> {
        static G: OnceLock<Arc<Runtime>> = OnceLock::new();
        if let Some(r) = G.get() {
            return Ok(r.clone());
        }
        let r = Runtime::new(RuntimeConfig {
            cgroups: true,
            ..Default::default()
        })?;
        Ok(G.get_or_init(|| r).clone())
    }

    /// The cgroup backend in use (`None`: limits are not enforced).
    pub fn cgroups(&self) -> Option<&dyn CgroupManager> {
        self.cgroups.as_deref()
    }

    /// Whether sandboxes made with [`SandboxSpec::device_allow`] get a device cgroup
    /// (cgroup v1 with the devices controller); without one only the sandbox's
    /// private `/dev` fences devices.
    pub fn fences_devices(&self) -> bool {
        self.cgroups.as_ref().is_some_and(|c| c.fences_devices())
    }

    /// The pool of pre-made network namespaces (`None` when not root, or turned off
    /// with `TESSERA_SANDBOX_NETNS_POOL=0`).
    pub fn netns_pool(&self) -> Option<&crate::netns::NetnsPool> {
        self.netns.as_ref()
    }

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

/// Starts the network namespace pool, sized by `TESSERA_SANDBOX_NETNS_POOL` (default
/// [`crate::netns::DEFAULT_READY`]; `0` turns it off).
fn start_netns_pool() -> Option<crate::netns::NetnsPool> {
    let n = match std::env::var("TESSERA_SANDBOX_NETNS_POOL") {
        Ok(v) => v.trim().parse().unwrap_or(crate::netns::DEFAULT_READY),
        Err(_) => crate::netns::DEFAULT_READY,
    };
    if n == 0 {
        return None;
    }
    crate::netns::NetnsPool::start(n).ok()
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

fn set_nonblocking(fd: &OwnedFd) {
    let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
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

    /// Writes `file` (exactly `bytes` bytes, from what `produce` writes) into the
    /// sealed folder `dir` (one of the spec's [`SandboxSpec::sealed`], not sealed yet).
    /// The bytes go over a pipe straight into the sandbox's memory-backed folder:
    /// nothing is staged on a disk, and a stream that ends early (a failed `produce`)
    /// leaves no file behind. Not a tenant's operation: no guard, no redaction.
    pub fn fill_sealed(
        &self,
        dir: &str,
        file: &str,
        bytes: u64,
        produce: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
    ) -> Result<(), FileError> {
        if !self.spec.sealed.iter().any(|p| p == dir) {
            return Err(FileError::Op {
                path: dir.into(),
                source: StepError::new("fill", dir, "not a sealed folder of this sandbox"),
            });
        }
        self.check_alive()?;
        let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| ExecError::Syscall {
            syscall: "pipe2",
            source: e.into(),
        })?;
        // A 1 MiB pipe: one decrypted chunk per write (the default 64 KiB costs a
        // context switch every 64 KiB). Best effort: the default works too.
        let _ = nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
        let ctrl = self.ctrl.lock().unwrap_or_else(|p| p.into_inner());
        let req = Request::Fill {
            path: dir.into(),
            file: file.into(),
            bytes,
        };
        proto::send(ctrl.as_fd(), &req, &[r.as_raw_fd()]).map_err(ExecError::Protocol)?;
        drop(r);
        let mut pipe = fs::File::from(w);
        let produced = produce(&mut pipe);
        // EOF for init: it answers once it has all (or knows it is short).
        drop(pipe);
        let reply = recv_timeout::<Reply>(&ctrl, Duration::from_secs(60))
            .map_err(|e| ExecError::Protocol(e.to_string()))?;
        let at = format!("{dir}/{file}");
        match (reply, produced) {
            (Reply::Done, Ok(())) => Ok(()),
            (Reply::Done, Err(e)) => Err(FileError::Op {
                path: at.clone(),
                source: StepError::new("fill", &at, e.to_string()),
            }),
            (Reply::Failed(source), Err(e)) if e.kind() != io::ErrorKind::BrokenPipe => {
                Err(FileError::Op {
                    path: at.clone(),
                    source: StepError::new("fill", &at, format!("{e} ({source})")),
                })
            }
            (Reply::Failed(source), _) => Err(FileError::Op { path: at, source }),
            (r, _) => Err(ExecError::Protocol(format!("unexpected reply {r:?}")).into()),
        }
    }

    /// Opens the sealed folder `dir` to the sandbox's commands, read-only from now on.
    pub fn seal(&self, dir: &str) -> Result<(), FileError> {
        self.check_alive()?;
        match self.request(&Request::Seal { path: dir.into() }, &[])? {
            Reply::Done => Ok(()),
            Reply::Failed(source) => Err(FileError::Op {
                path: dir.into(),
                source,
            }),
            r => Err(ExecError::Protocol(format!("unexpected reply {r:?}")).into()),
        }
    }

    /// Round trip to init (liveness).
    pub fn ping(&self) -> Result<(), ExecError> {
        self.check_alive()?;
        match self.request(&Request::Ping, &[])? {
            Reply::Pong => Ok(()),
            r => Err(ExecError::Protocol(format!("unexpected reply {r:?}"))),
        }
    }

    fn base_env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = [
            (
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ),
            ("HOME", "/home/user"),
            ("USER", "user"),
            ("LANG", "C.UTF-8"),
            ("TERM", "dumb"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Network::Proxy(_) = &self.spec.network {
            let url = format!("http://{}", crate::spec::PROXY_ADDR);
            for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.push((k.to_string(), url.clone()));
            }
            env.push(("NO_PROXY".into(), "localhost,127.0.0.1".into()));
        }
        env.extend(self.spec.env.iter().cloned());
        env
    }

    /// Runs a command and waits for it (and everything it started) to finish. The guard
    /// checks it first; a blocked command is an `Err`, a failing one an `Ok` with its
    /// status. On timeout the whole tree is killed.
    pub fn exec(&self, req: &ExecRequest) -> Result<ExecOutput, ExecError> {
        self.exec_inner(req, None)
    }

    /// Like [`Sandbox::exec`], and calls `on_output` with stdout and stderr as they
    /// arrive, redacted by the guard's stream redactor: a secret split across chunks is
    /// held back until it is whole, so the stream says what the final output says, and
    /// `redacted` is true when either redacted anything.
    pub fn exec_streaming(
        &self,
        req: &ExecRequest,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecOutput, ExecError> {
        let guard = &self.rt.guard;
        let tenant = self.tenant();
        let (out_at, err_at) = (
            format!("sandbox {} stdout", self.id),
            format!("sandbox {} stderr", self.id),
        );
        // One redactor per stream, holding back a secret split across chunks until it
        // is whole: what the caller sees is what the final output says.
        let mut rs = [
            guard.stream_redactor(tenant, &out_at),
            guard.stream_redactor(tenant, &err_at),
        ];
        let idx = |st: Stream| usize::from(st == Stream::Stderr);
        let mut f = |st: Stream, data: &[u8]| {
            let r = rs[idx(st)].push(data);
            if !r.is_empty() {
                on_output(st, &r);
            }
        };
        let res = self.exec_inner(req, Some(&mut f));
        for st in [Stream::Stdout, Stream::Stderr] {
            let r = rs[idx(st)].finish();
            if !r.is_empty() {
                on_output(st, &r);
            }
        }
        let streamed_redacted = rs.iter().any(|r| r.redacted());
        res.map(|mut out| {
            out.redacted |= streamed_redacted;
            out
        })
    }

    fn exec_inner(
        &self,
        req: &ExecRequest,
        on_chunk: Option<&mut OutputSink<'_>>,
    ) -> Result<ExecOutput, ExecError> {
        self.check_alive()?;
        let argv = req.command.argv();
        if argv.is_empty() || argv[0].is_empty() {
            return Err(ExecError::EmptyCommand);
        }
        let mut alerts = Vec::new();
        match self.rt.guard.check(self.tenant(), &req.command) {
            CheckDecision::Allow => {}
            CheckDecision::Alert(a) => alerts = a,
            CheckDecision::Block(r) => return Err(ExecError::Blocked(r.join("; "))),
        }
        let mut env = self.base_env();
        env.extend(req.env.iter().cloned());
        let job = Job {
            kind: JobKind::Exec { argv },
            env,
            cwd: req.cwd.clone().unwrap_or_else(|| "/workspace".into()),
            check_exec: self.rt.guard.checks_exec(),
        };
        let r = match self.run_job(
            job,
            req.stdin.as_deref(),
            req.timeout,
            req.max_output,
            on_chunk,
        ) {
            Ok(r) => r,
            // Destroyed under the command (killed, timed out, deleted): say so, not
            // whatever the broken pipe looked like.
            Err(_) if self.destroyed.load(Ordering::Acquire) => {
                return Err(ExecError::Destroyed(self.id.clone()));
            }
            Err(e) => return Err(e),
        };
        let mut out = ExecOutput {
            status: r.status,
            stdout: r.stdout,
            stderr: r.stderr,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            timed_out: r.timed_out,
            oom_killed: r.oom_killed,
            alerts: {
                let mut a = alerts;
                a.extend(r.exec_alerts);
                a
            },
            redacted: false,
        };
        let g = &self.rt.guard;
        let at = |s: &str| format!("sandbox {} {s}", self.id);
        if let Some(s) = g.redact(self.tenant(), &at("stdout"), &out.stdout) {
            out.stdout = s;
            out.redacted = true;
        }
        if let Some(s) = g.redact(self.tenant(), &at("stderr"), &out.stderr) {
            out.stderr = s;
            out.redacted = true;
        }
        Ok(out)
    }

    fn run_job(
        &self,
        job: Job,
        stdin: Option<&[u8]>,
        timeout: Option<Duration>,
        max_output: usize,
        mut on_chunk: Option<&mut OutputSink<'_>>,
    ) -> Result<JobResult, ExecError> {
        let sys = |syscall: &'static str| {
            move |e: Errno| ExecError::Syscall {
                syscall,
                source: e.into(),
            }
        };
        let (in_r, in_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        let (st_r, st_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        let oom_before = self.cgroup.as_ref().map(|c| c.oom_kills()).unwrap_or(0);
        let check_exec = job.check_exec;
        let (exec_sup, exec_run) = if check_exec {
            let (a, b) = socketpair(
                AddressFamily::Unix,
                SockType::SeqPacket,
                None,
                SockFlag::SOCK_CLOEXEC,
            )
            .map_err(sys("socketpair"))?;
            (Some(a), Some(b))
        } else {
            (None, None)
        };
        let mut job_fds = vec![
            in_r.as_raw_fd(),
            out_w.as_raw_fd(),
            err_w.as_raw_fd(),
            st_w.as_raw_fd(),
        ];
        if let Some(x) = &exec_run {
            job_fds.push(x.as_raw_fd());
        }
        let reply = self.request(&Request::Job(job), &job_fds)?;
        drop((in_r, out_w, err_w, st_w, exec_run));
        let mut exec_sup = exec_sup;
        let mut exec_alerts = Vec::new();
        let runner = match reply {
            Reply::Started { pid } => pid,
            Reply::Failed(e) => return Err(ExecError::Start(e)),
            r => return Err(ExecError::Protocol(format!("unexpected reply {r:?}"))),
        };
        let mut stdin_w = match stdin {
            Some(d) if !d.is_empty() => {
                set_nonblocking(&in_w);
                Some((in_w, d, 0usize))
            }
            _ => {
                drop(in_w);
                None
            }
        };
        let mut bufs: [Vec<u8>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        let mut trunc = [false; 3];
        let mut open = [Some(out_r), Some(err_r), Some(st_r)];
        let start = Instant::now();
        let mut deadline = timeout.map(|t| start + t);
        let mut timed_out = false;
        let mut chunk = vec![0u8; 64 * 1024];
        while open.iter().any(Option::is_some) {
            let now = Instant::now();
            if let Some(d) = deadline
                && now >= d
            {
                if timed_out {
                    return Err(ExecError::Protocol(format!(
                        "job {runner} in sandbox {} did not die after kill",
                        self.id
                    )));
                }
                timed_out = true;
                let _ = self.request(&Request::Kill { pid: runner }, &[])?;
                stdin_w = None;
                deadline = Some(Instant::now() + Duration::from_secs(10));
                continue;
            }
            let wait_ms = deadline
                .map(|d| d.saturating_duration_since(now).as_millis().min(10_000) as i32 + 1)
                .unwrap_or(-1);
            let mut pfds: Vec<PollFd> = Vec::with_capacity(4);
            let mut which: Vec<usize> = Vec::with_capacity(4);
            for (i, o) in open.iter().enumerate() {
                if let Some(fd) = o {
                    pfds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    which.push(i);
                }
            }
            if let Some((fd, _, _)) = &stdin_w {
                pfds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
                which.push(3);
            }
            if let Some(x) = &exec_sup {
                pfds.push(PollFd::new(x.as_fd(), PollFlags::POLLIN));
                which.push(4);
            }
            let timeout = PollTimeout::try_from(wait_ms).unwrap_or(PollTimeout::NONE);
            match poll(&mut pfds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(sys("poll")(e)),
            }
            let ready: Vec<(usize, bool)> = pfds
                .iter()
                .zip(&which)
                .map(|(p, &i)| (i, p.revents().is_some_and(|r| !r.is_empty())))
                .collect();
            drop(pfds);
            for (i, is_ready) in ready {
                if !is_ready {
                    continue;
                }
                if i == 4 {
                    if let Some(x) = &exec_sup
                        && !self.answer_exec_check(x, &mut exec_alerts)
                    {
                        exec_sup = None;
                    }
                    continue;
                }
                if i == 3 {
                    let mut done = false;
                    if let Some((fd, data, off)) = &mut stdin_w {
                        match nix::unistd::write(&*fd, &data[*off..]) {
                            Ok(n) => {
                                *off += n;
                                done = *off >= data.len();
                            }
                            Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                            Err(_) => done = true,
                        }
                    }
                    if done {
                        stdin_w = None;
                    }
                    continue;
                }
                let Some(fd) = &open[i] else { continue };
                match nix::unistd::read(fd, &mut chunk) {
                    Ok(0) => open[i] = None,
                    Ok(n) => {
                        let cap = if i == 2 { 1 << 20 } else { max_output };
                        let room = cap.saturating_sub(bufs[i].len());
                        if n > room {
                            trunc[i] = true;
                        }
                        bufs[i].extend_from_slice(&chunk[..n.min(room)]);
                        if i < 2
                            && let Some(f) = on_chunk.as_mut()
                        {
                            let stream = if i == 0 {
                                Stream::Stdout
                            } else {
                                Stream::Stderr
                            };
                            f(stream, &chunk[..n]);
                        }
                    }
                    Err(Errno::EINTR) | Err(Errno::EAGAIN) => {}
                    Err(_) => open[i] = None,
                }
            }
        }
        let [stdout, stderr, status] = bufs;
        let status: JobStatus = serde_json::from_slice(&status)
            .map_err(|e| ExecError::Protocol(format!("job status: {e}")))?;
        let status = match status {
            JobStatus::Exited(c) => ExitStatus::Exited(c),
            JobStatus::Signaled(s) => ExitStatus::Signaled(s),
            JobStatus::Failed(e) => return Err(ExecError::Start(e)),
        };
        let oom_killed = self.cgroup.as_ref().map(|c| c.oom_kills()).unwrap_or(0) > oom_before;
        Ok(JobResult {
            status,
            stdout,
            stderr,
            stdout_truncated: trunc[0],
            stderr_truncated: trunc[1],
            timed_out,
            oom_killed,
            exec_alerts,
        })
    }

    /// Answers one exec check from a job's runner with the guard's verdict, judging
    /// the file as the program it is (a copy of or a link to a program of the template
    /// is judged as that program; see `identity.rs`). Returns false when the runner's
    /// socket is closed.
    fn answer_exec_check(&self, sock: &OwnedFd, alerts: &mut Vec<String>) -> bool {
        use crate::identity::{self, Identity};
        let Ok(Some((mut check, _))) = proto::recv::<proto::ExecCheck>(sock.as_fd()) else {
            return false;
        };
        let table = identity::table_for(&identity::template_root(&self.spec.template));
        let mut ident = match &check.file {
            Some(f) => table.identify(f, None),
            None => Identity::Unknown,
        };
        if ident == Identity::NeedHash {
            // Same size as a program of the template: its content decides.
            let ask = proto::ExecVerdict {
                allow: false,
                want_hash: true,
            };
            if proto::send(sock.as_fd(), &ask, &[]).is_err() {
                return false;
            }
            match recv_timeout::<proto::ExecCheck>(sock, Duration::from_secs(30)) {
                Ok(c) => check = c,
                Err(_) => return false,
            }
            let hash = check.sha256.as_deref().and_then(identity::unhex);
            ident = match (&check.file, hash) {
                (Some(f), Some(h)) => table.identify(f, Some(&h)),
                _ => Identity::Unknown,
            };
        }
        let mut argv = check.argv.clone();
        if argv.is_empty() {
            argv.push(check.path.clone());
        }
        let called = argv[0].rsplit('/').next().unwrap_or("").to_string();
        // Judged as the program it is, when that is not the name it was called by.
        let program = match ident {
            Identity::Known { program, names } if !names.contains(&called) => Some(program),
            _ => None,
        };
        if check.first && program.is_none() {
            // The job's command itself, checked before it was sent.
            let v = proto::ExecVerdict {
                allow: true,
                want_hash: false,
            };
            return proto::send(sock.as_fd(), &v, &[]).is_ok();
        }
        let shown = match &program {
            Some(p) => format!(
                "{}` (the file is `{p}`)",
                crate::Command::Argv(argv.clone()).display()
            ),
            None => format!("{}`", crate::Command::Argv(argv.clone()).display()),
        };
        let mut note = |msg: String| {
            // A PATH search tries the same argv in several directories: report it once.
            if !alerts.contains(&msg) {
                alerts.push(msg);
            }
        };
        let allow = match self
            .rt
            .guard
            .check_exec(self.tenant(), &argv, program.as_deref())
        {
            CheckDecision::Allow => true,
            CheckDecision::Alert(r) => {
                note(format!("execve `{shown}: {}", r.join("; ")));
                true
            }
            CheckDecision::Block(r) => {
                note(format!("execve `{shown} blocked: {}", r.join("; ")));
                false
            }
        };
        let v = proto::ExecVerdict {
            allow,
            want_hash: false,
        };
        proto::send(sock.as_fd(), &v, &[]).is_ok()
    }

    fn file_job(
        &self,
        kind: JobKind,
        path: &str,
        input: Option<&[u8]>,
    ) -> Result<Vec<u8>, FileError> {
        if !path.starts_with('/') || path.contains('\0') {
            return Err(FileError::BadPath(path.to_string()));
        }
        self.check_alive()?;
        let op = match &kind {
            JobKind::ReadFile { .. }
            | JobKind::List { .. }
            | JobKind::Exec { .. }
            | JobKind::Pack { .. } => FileAccess::Read,
            JobKind::WriteFile { .. }
            | JobKind::Mkdir { .. }
            | JobKind::Unpack { .. }
            | JobKind::Restore { .. } => FileAccess::Write,
            JobKind::Remove { .. } => FileAccess::Delete,
        };
        if let CheckDecision::Block(r) = self.rt.guard.check_file(self.tenant(), op, path) {
            return Err(FileError::Exec(ExecError::Blocked(r.join("; "))));
        }
        self.platform_job(kind, path, input)
    }

    /// A file job of the platform's own (a snapshot's pack or restore), not a tenant's
    /// request: the guard's file policy is not asked (the job still runs under the
    /// sandbox's confinement, as its user), and nothing it returns is redacted (it goes
    /// back into a sandbox, never out to a caller). `path` must be absolute.
    pub(crate) fn platform_job(
        &self,
        kind: JobKind,
        path: &str,
        input: Option<&[u8]>,
    ) -> Result<Vec<u8>, FileError> {
        if !path.starts_with('/') || path.contains('\0') {
            return Err(FileError::BadPath(path.to_string()));
        }
        self.check_alive()?;
        let job = Job {
            kind,
            env: Vec::new(),
            cwd: "/".into(),
            check_exec: false,
        };
        match self.run_job(
            job,
            Some(input.unwrap_or(b"")),
            Some(Duration::from_secs(60)),
            1 << 30,
            None,
        ) {
            Ok(r) if r.status.success() => Ok(r.stdout),
            Ok(r) => Err(FileError::Op {
                path: path.into(),
                source: StepError::new("file", path, format!("helper ended with {:?}", r.status)),
            }),
            Err(ExecError::Start(e)) => Err(FileError::Op {
                path: path.into(),
                source: e,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads a whole file, redacted by the guard like any output leaving the sandbox.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>, FileError> {
        let data = self.file_job(JobKind::ReadFile { path: path.into() }, path, None)?;
        let at = format!("sandbox {} file {path}", self.id);
        Ok(self
            .rt
            .guard
            .redact(self.tenant(), &at, &data)
            .unwrap_or(data))
    }
    /// Writes a file (mode 0644), creating parent directories.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<(), FileError> {
        self.file_job(
            JobKind::WriteFile {
                path: path.into(),
                mode: 0o644,
            },
            path,
            Some(data),
        )
        .map(drop)
    }
    /// Lists a directory, sorted by name.
    pub fn list(&self, path: &str) -> Result<Vec<DirEntry>, FileError> {
        let out = self.file_job(JobKind::List { path: path.into() }, path, None)?;
        serde_json::from_slice(&out).map_err(|e| FileError::Op {
            path: path.into(),
            source: StepError::new("list", path, e.to_string()),
        })
    }
    /// Removes a file, or a directory (with its contents when `recursive`).
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), FileError> {
        self.file_job(
            JobKind::Remove {
                path: path.into(),
                recursive,
            },
            path,
            None,
        )
        .map(drop)
    }
    /// Creates a directory and its parents.
    pub fn mkdir(&self, path: &str) -> Result<(), FileError> {
        self.file_job(JobKind::Mkdir { path: path.into() }, path, None)
            .map(drop)
    }

    /// Unpacks a tar archive into `dir` inside the sandbox (made if missing), with
    /// [`TarLimits::default`]. See [`Sandbox::upload_tar_with`].
    pub fn upload_tar(&self, dir: &str, archive: &[u8]) -> Result<TarSummary, FileError> {
        self.upload_tar_with(dir, archive, &TarLimits::default())
    }

    /// Unpacks a tar archive into `dir` inside the sandbox (made if missing). The archive
    /// is hostile input: it is checked here first ([`crate::tarball::check`]: no absolute
    /// paths, no `..`, no links out of `dir`, no device nodes, within `limits`), the guard
    /// checks a write of `dir` and of every entry, and then the sandbox's own job unpacks
    /// it (with the `tar` crate, checking again) under the same confinement as any
    /// command. Nothing is unpacked unless the whole archive passes.
    pub fn upload_tar_with(
        &self,
        dir: &str,
        archive: &[u8],
        limits: &TarLimits,
    ) -> Result<TarSummary, FileError> {
        if !dir.starts_with('/') || dir.contains('\0') {
            return Err(FileError::BadPath(dir.to_string()));
        }
        let sum = crate::tarball::check(archive, limits).map_err(|source| FileError::Archive {
            path: dir.to_string(),
            source,
        })?;
        for p in &sum.paths {
            let full = Path::new(dir).join(p);
            let full = full.to_string_lossy();
            if let CheckDecision::Block(r) =
                self.rt
                    .guard
                    .check_file(self.tenant(), FileAccess::Write, &full)
            {
                return Err(FileError::Exec(ExecError::Blocked(r.join("; "))));
            }
        }
        self.file_job(
            JobKind::Unpack {
                path: dir.into(),
                limits: *limits,
            },
            dir,
            Some(archive),
        )?;
        Ok(sum)
    }

    /// Packs `dir` inside the sandbox (its contents; or a single file under its own
    /// name) into a tar archive, with [`TarLimits::default`].
    pub fn download_tar(&self, dir: &str) -> Result<Vec<u8>, FileError> {
        self.download_tar_with(dir, &TarLimits::default())
    }

    /// Packs `dir` inside the sandbox into a tar archive of at most
    /// `limits.max_archive_bytes`. The sandbox's own job makes it, so the archive is as
    /// hostile as anything else from inside: unpack it with [`crate::tarball::unpack`],
    /// which refuses links that leave the destination.
    pub fn download_tar_with(&self, dir: &str, limits: &TarLimits) -> Result<Vec<u8>, FileError> {
        let archive = self.file_job(
            JobKind::Pack {
                path: dir.into(),
                limits: *limits,
            },
            dir,
            None,
        )?;
        // Every file in it is output leaving the sandbox: redacted like any other.
        let tenant = self.tenant();
        let guard = &self.rt.guard;
        let redacted = crate::tarball::redact_files(&archive, |p, data| {
            let at = format!(
                "sandbox {} file {}",
                self.id,
                Path::new(dir).join(p).display()
            );
            guard.redact(tenant, &at, data)
        })
        .map_err(|source| FileError::Archive {
            path: dir.to_string(),
            source,
        })?;
        Ok(redacted.unwrap_or(archive))
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
