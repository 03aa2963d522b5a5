//! What a sandbox is made of: template, network, limits. Plain data, sent to the
//! sandbox's init as JSON.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Everything needed to create one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Read-only base of the root filesystem.
    pub template: Template,
    /// Network namespace policy.
    pub network: Network,
    /// cgroup limits.
    pub limits: Limits,
    /// Host name inside the UTS namespace.
    pub hostname: String,
    /// Environment every command starts with (a command's own env is added on top).
    pub env: Vec<(String, String)>,
    /// Extra Landlock rules (for instance from the guard's file policy). Allow-only:
    /// Landlock cannot take away what a broader rule grants.
    pub extra_rules: Vec<PathAccess>,
    /// Resource limits (setrlimit) applied to every command.
    pub rlimits: Rlimits,
    /// Host files or folders bound into the sandbox (device nodes for the GPUs a task
    /// was given, a file the node runtime shares with it). Set by trusted callers only
    /// (the node runtime), never from a tenant's request: each is a hole in the wall.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binds: Vec<Bind>,
    /// Paths inside the sandbox covered by an empty read-only tmpfs (runc's
    /// `maskedPaths`): a folder of the host that a template would otherwise show
    /// (the control plane's data folder under a bound `/usr`, say) stays out of reach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked_paths: Vec<String>,
    /// The device cgroup: `Some` denies every device but `/dev/null`, `zero`, `full`,
    /// `random`, `urandom`, `tty` and these (cgroup v1's `devices` controller; on v2,
    /// where that needs an eBPF program, only the mount namespace fences devices).
    /// `None`: no device cgroup (the sandbox's `/dev` still holds only the nodes above
    /// and the bound ones, and a user namespace cannot `mknod`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_allow: Option<Vec<DeviceRule>>,
    /// Sealed folders (absolute paths inside): memory-backed (ramfs: never swapped,
    /// never on a disk), private to this sandbox's mount namespace, closed to its
    /// commands (mode 0700, root's) until the trusted caller has filled them through
    /// [`crate::Sandbox::fill_sealed`] and [`crate::Sandbox::seal`]; read-only (and
    /// `noexec`) from then on. Where the node runtime puts released model weights.
    /// Trusted callers only, like `binds`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sealed: Vec<String>,
}

/// One host path bound into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// The host path (a file, a device node or a folder).
    pub host: PathBuf,
    /// Where it appears inside (absolute; under `/dev` for device nodes).
    pub path: String,
    /// Writable inside (device nodes need it to be opened for writing); read-only
    /// otherwise.
    #[serde(default)]
    pub writable: bool,
}

/// A character device the device cgroup lets a sandbox open (read, write, mknod are
/// all allowed for it: `c MAJOR:MINOR rwm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceRule {
    pub major: u32,
    pub minor: u32,
}

impl DeviceRule {
    /// The devices every sandbox's `/dev` has.
    pub const BASE: [DeviceRule; 6] = [
        DeviceRule { major: 1, minor: 3 },
        DeviceRule { major: 1, minor: 5 },
        DeviceRule { major: 1, minor: 7 },
        DeviceRule { major: 1, minor: 8 },
        DeviceRule { major: 1, minor: 9 },
        DeviceRule { major: 5, minor: 0 },
    ];

    /// The line written to `devices.allow`.
    pub fn allow_line(&self) -> String {
        format!("c {}:{} rwm", self.major, self.minor)
    }
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            template: Template::Host,
            network: Network::None,
            limits: Limits::default(),
            hostname: "sandbox".to_string(),
            env: Vec::new(),
            extra_rules: Vec::new(),
            rlimits: Rlimits::default(),
            binds: Vec::new(),
            masked_paths: Vec::new(),
            device_allow: None,
            sealed: Vec::new(),
        }
    }
}

/// The read-only base of a sandbox's root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Template {
    /// The host's `/usr` plus its `/bin`, `/sbin`, `/lib*` links (bound read-only), and a
    /// generated minimal `/etc`. Needs no download; `bash`, `python3`, coreutils work.
    Host,
    /// A directory holding a root filesystem (for instance made by `debootstrap` or
    /// unpacked from an OCI image): each top-level entry is bound read-only, except
    /// `tmp`, `home`, `workspace`, `proc`, `dev`, `sys` and `run`, which the sandbox owns.
    Dir(PathBuf),
}

/// Network policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Network {
    /// A private network namespace with only loopback up: no route anywhere.
    None,
    /// Loopback only, plus an HTTP proxy at `127.0.0.1:3128` inside the sandbox, served by
    /// the supervisor from outside: `CONNECT` to the allowed domains only.
    Proxy(EgressPolicy),
}

/// Which destinations the egress proxy lets a sandbox reach.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EgressPolicy {
    /// Domains; each also allows its subdomains (`example.com` allows `api.example.com`).
    pub allow_domains: Vec<String>,
    /// Also allow destinations that resolve to loopback, private, link-local or other
    /// non-public addresses (off by default: an allowed name must not lead to the host's
    /// own services or a metadata endpoint).
    pub allow_private: bool,
}

/// The proxy's address inside a sandbox.
pub const PROXY_ADDR: &str = "127.0.0.1:3128";

/// cgroup limits. `None` means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory limit in bytes (swap included where the kernel accounts it).
    pub memory_bytes: Option<u64>,
    /// CPU limit in thousandths of a CPU (1000 = one full core).
    pub cpu_millis: Option<u32>,
    /// Maximum number of processes and threads.
    pub pids: Option<u32>,
    /// Size of each writable tmpfs (`/tmp`, `/home/user`, `/workspace`), in bytes.
    pub disk_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: Some(512 << 20),
            cpu_millis: Some(1000),
            pids: Some(256),
            disk_bytes: 256 << 20,
        }
    }
}

/// setrlimit values for commands (soft = hard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    pub nofile: u64,
    pub core: u64,
    pub stack: u64,
    /// Largest file a command may write, in bytes.
    pub fsize: Option<u64>,
}

impl Default for Rlimits {
    fn default() -> Self {
        Rlimits {
            nofile: 1024,
            core: 0,
            stack: 8 << 20,
            fsize: None,
        }
    }
}

/// One allow rule for Landlock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathAccess {
    /// Path inside the sandbox.
    pub path: String,
    pub read: bool,
    pub write: bool,
    pub execute: bool,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// argv[0] is looked up in `PATH` when it has no `/`.
    Argv(Vec<String>),
    /// Run by `/bin/sh -c`.
    Shell(String),
}

impl Command {
    /// The argv that will be executed.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Command::Argv(a) => a.clone(),
            Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
        }
    }

    /// A single-line rendering, for the guard and for logs.
    pub fn display(&self) -> String {
        match self {
            Command::Shell(s) => s.clone(),
            Command::Argv(a) => a
                .iter()
                .map(|s| {
                    if !s.is_empty()
                        && s.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
                    {
                        s.clone()
                    } else {
                        format!("'{}'", s.replace('\'', "'\\''"))
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// One command to run in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    pub command: Command,
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox; `/workspace` when `None`.
    pub cwd: Option<String>,
    pub stdin: Option<Vec<u8>>,
    /// Kill the whole process tree after this long.
    pub timeout: Option<Duration>,
    /// Output beyond this many bytes per stream is dropped (and reported as truncated).
    pub max_output: usize,
}

impl ExecRequest {
    pub fn argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> Self {
        Self::new(Command::Argv(argv.into_iter().map(Into::into).collect()))
    }
    pub fn shell(cmd: impl Into<String>) -> Self {
        Self::new(Command::Shell(cmd.into()))
    }
    pub fn new(command: Command) -> Self {
        ExecRequest {
            command,
            env: Vec::new(),
            cwd: None,
            stdin: None,
            timeout: None,
            max_output: 16 << 20,
        }
    }
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    Exited(i32),
    Signaled(i32),
}

impl ExitStatus {
    pub fn success(&self) -> bool {
        matches!(self, ExitStatus::Exited(0))
    }
    /// Shell-style code: the exit code, or 128 + signal.
    pub fn code(&self) -> i32 {
        match *self {
            ExitStatus::Exited(c) => c,
            ExitStatus::Signaled(s) => 128 + s,
        }
    }
}

/// The result of [`crate::Sandbox::exec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The timeout fired and the tree was killed.
    pub timed_out: bool,
    /// The kernel's OOM killer killed a process of this sandbox during the command.
    pub oom_killed: bool,
    /// The guard let the command through with an alert (its reasons).
    pub alerts: Vec<String>,
    /// Output was redacted by the guard's scanner.
    pub redacted: bool,
}

/// One entry of [`crate::Sandbox::list`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}
