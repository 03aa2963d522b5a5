//! The runtime: the init program, its configuration, and `Runtime::new`.

use crate::cgroup::{self, CgroupManager};
use crate::error::SpawnError;
use crate::guard::{CommandCheck, PolicyGuard};
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::{HOST_ID_BASE, HOST_ID_COUNT, Runtime, SANDBOX_UID};

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
    ///
    /// [`Network::Proxy`]: crate::spec::Network::Proxy
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
    ///
    /// [`SandboxSpec::device_allow`]: crate::spec::SandboxSpec::device_allow
    pub fn fences_devices(&self) -> bool {
        self.cgroups.as_ref().is_some_and(|c| c.fences_devices())
    }

    /// The pool of pre-made network namespaces (`None` when not root, or turned off
    /// with `TESSERA_SANDBOX_NETNS_POOL=0`).
    pub fn netns_pool(&self) -> Option<&crate::netns::NetnsPool> {
        self.netns.as_ref()
    }
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
