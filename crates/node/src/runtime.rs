//! The node runtime: start, stop and watch contained workloads on this machine.
//!
//! Each task runs in a sandbox of its own (`tessera-sandbox`: user, pid, mount, uts,
//! ipc, net and cgroup namespaces, an unprivileged uid inside, seccomp, Landlock, the
//! runtime guard on every `execve`, output redacted): a cgroup with the task's CPU
//! quota, memory and pids limits; a clean environment; the GPUs of its binding only.
//! The whole process tree lives in that sandbox, so stopping the sandbox stops the
//! tree: [`NodeRuntime::stop`] sends SIGTERM to the workload, waits the grace period,
//! then kills the sandbox (SIGKILL to every process of its pid namespace). Usage is
//! read from the cgroup before it is removed, also for a task that was killed.
//!
//! One OS thread per running task waits for it (the sandbox's calls block); a stop
//! with a grace period has a thread of its own for the wait.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tessera_model::{GpuDevice, Resources};
use tessera_sandbox::{
    CommandCheck, ExecError, ExecRequest, InitProgram, Isolated, Network, Runtime, RuntimeConfig,
    Sandbox, SandboxCgroup, SandboxSpec, Template, TierKind, pids_in_namespace,
};

use crate::fence::{self, DeviceDirs, GpuAssignment, GpuShareHook, Mismatch, SeenDevice, Share};
use crate::gpu::{GpuSource, RawGpu};
use crate::spec::{self, Defaults, LimitError, TaskKey, TaskLimits, TemplateRef};

/// How the node runtime is set up.
#[derive(Clone)]
pub struct NodeConfig {
    /// This node's name (in `TESSERA_NODE`).
    pub name: String,
    /// The sandboxes' init program; `None`: `tessera-sandbox-init` next to this program.
    pub init: Option<InitProgram>,
    /// The runtime guard: every command and `execve` of every task passes it, and its
    /// output is redacted (each sandbox checks as its task's tenant).
    pub guard: Arc<dyn CommandCheck>,
    /// Use cgroups (root). Without them, limits are not enforced and the node says so
    /// in a condition.
    pub cgroups: bool,
    /// Host folders no task may see even where its template would show them (the
    /// control plane's data folder).
    pub masked_paths: Vec<PathBuf>,
    /// Where device nodes and MIG capability files are.
    pub devices: DeviceDirs,
    /// The driver's view of the GPUs.
    pub gpus: Arc<dyn GpuSource>,
    /// GPU-share enforcement for fractional tasks.
    pub gpushare: Arc<dyn GpuShareHook>,
    /// Host folders of the GPU driver's user-space (`libcuda.so.1`, …) bound
    /// read-only, at the same path and executable, into every GPU task; empty:
    /// what the task's template shows (the host's `/usr` for the host template).
    pub gpu_libs: Vec<PathBuf>,
    /// Limits of tasks that ask for nothing.
    pub defaults: Defaults,
    /// GPU fault events (Xid / ECC); `None`: none are watched.
    pub faults: Option<Arc<dyn crate::faults::FaultSource>>,
    /// The micro-VM tier, for tasks whose runtime class maps to it; `None`: this node
    /// runs only the namespace tier (and advertises only its classes).
    pub microvm: Option<Arc<tessera_sandbox::vm::MicroVmTier>>,
    /// The key service and this node's TPM, for tasks that name model weights;
    /// `None`: such tasks are refused (weights go only to attested nodes).
    pub weights: Option<crate::weights::WeightsAccess>,
}

impl std::fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConfig")
            .field("name", &self.name)
            .field("init", &self.init)
            .field("cgroups", &self.cgroups)
            .field("masked_paths", &self.masked_paths)
            .field("devices", &self.devices)
            .field("gpus", &self.gpus.name())
            .field("gpushare", &self.gpushare.describe())
            .field("microvm", &self.microvm.is_some())
            .finish()
    }
}

impl NodeConfig {
    /// A node named `name` with the shipped guard, cgroups on, the host's devices,
    /// NVML, and GPU shares enforced by the CUDA interposer where it is found
    /// ([`crate::gpushare::find_interposer`]; fractional tasks are refused, with the
    /// fix, where it is not).
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        NodeConfig {
            gpushare: crate::gpushare::hook(
                &crate::gpushare::Enforcement::Interposer,
                &crate::gpushare::private_state_dir(&name),
            ),
            name,
            init: None,
            guard: Arc::new(tessera_sandbox::PolicyGuard::default()),
            cgroups: true,
            masked_paths: Vec::new(),
            devices: DeviceDirs::default(),
            gpus: Arc::new(crate::gpu::NvmlSource),
            gpu_libs: Vec::new(),
            defaults: Defaults::default(),
            faults: None,
            microvm: None,
            weights: None,
        }
    }
}

/// One task to run, as its binding says.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    pub key: TaskKey,
    /// argv; `argv[0]` is looked up in `PATH` inside the sandbox.
    pub command: Vec<String>,
    /// The task's own variables (checked by [`spec::check_env`]).
    pub env: Vec<(String, String)>,
    /// Inside the sandbox; `/workspace` when `None`.
    pub working_dir: Option<String>,
    pub template: TemplateRef,
    pub requests: Resources,
    pub limits: TaskLimits,
    pub gpus: GpuAssignment,
    /// The node's GPUs as the scheduler saw them (the node record it placed against).
    pub record: Vec<GpuDevice>,
    /// Output goes here (appended; redacted by the guard).
    pub log: PathBuf,
    /// The isolation tier its runtime class maps to. A `microvm` task runs in a
    /// micro-VM of [`NodeConfig::microvm`], and has no GPUs (vfio pass-through is not
    /// built: see docs/sandbox.md).
    pub tier: TierKind,
    /// Model weights released into the sandbox (each a sealed folder, see
    /// [`crate::weights`]) after the device-view check and before the command.
    pub weights: Vec<crate::weights::WeightsMount>,
}

/// What a task used, read from its cgroup before the sandbox is removed.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub wall_seconds: f64,
    /// `None` where the cgroup does not account CPU (no cgroups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory: Option<u64>,
    /// Allocated GPUs (or fractions) × wall time.
    pub gpu_seconds: f64,
    /// A fractional task's GPU memory: its cap, the most it held, and the
    /// allocations refused over the cap (from its region; `None` for other tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_peak: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_oom_events: Option<u64>,
    /// A fractional task's compute share (milli-GPU) and the device time it used
    /// as the compute monitor measured it (0 where no monitor ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_compute_milli: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_busy_seconds: Option<f64>,
}

impl Usage {
    /// Adds what a fractional task's region recorded.
    pub fn with_share(mut self, u: Option<&tessera_gpushare::usage::TaskUsage>) -> Usage {
        if let Some(d) = u.and_then(|u| u.devices.first()) {
            self.gpu_memory_limit = Some(d.memory_limit_bytes);
            self.gpu_memory_peak = Some(d.memory_peak_bytes);
            self.gpu_oom_events = Some(d.oom_events);
            self.gpu_compute_milli = Some(d.compute_milli);
            self.gpu_busy_seconds = Some(d.compute_busy_ns as f64 / 1e9);
        }
        self
    }
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Its main process exited with this status.
    Exited(i32),
    /// Its main process died of this signal.
    Signaled(i32),
    /// The kernel's OOM killer killed a process at the memory limit; the main
    /// process ended with this shell-style code.
    OomKilled(i32),
    /// [`NodeRuntime::stop`] ended it: `forced` when the grace period ran out and the
    /// tree was killed.
    Stopped { reason: String, forced: bool },
    /// It could not run (the guard refused the command, it is not found, …).
    Failed(String),
}

impl Outcome {
    /// Did it succeed?
    pub fn success(&self) -> bool {
        matches!(self, Outcome::Exited(0))
    }
    /// Shell-style exit code where there is one.
    pub fn code(&self) -> Option<i32> {
        match self {
            Outcome::Exited(c) | Outcome::OomKilled(c) => Some(*c),
            Outcome::Signaled(s) => Some(128 + s),
            _ => None,
        }
    }
    /// One line for the task's status.
    pub fn message(&self) -> String {
        match self {
            Outcome::Exited(c) => format!("exited with status {c}"),
            Outcome::Signaled(s) => format!("killed by signal {s}"),
            Outcome::OomKilled(_) => {
                "OOMKilled: the kernel killed it at its memory limit".to_string()
            }
            Outcome::Stopped { reason, forced } => {
                if *forced {
                    format!("{reason} (killed after the grace period)")
                } else {
                    reason.clone()
                }
            }
            Outcome::Failed(m) => m.clone(),
        }
    }
}

/// A task's end.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskExit {
    pub key: TaskKey,
    pub outcome: Outcome,
    pub usage: Usage,
    /// Processes of the task's pid namespace still alive after the sandbox was
    /// removed: always empty (a check, reported rather than assumed).
    pub leftovers: Vec<i32>,
    /// A fractional task's GPU share as its region last recorded it: memory used
    /// and peak against the cap, refusals, compute share used (`None` for other
    /// tasks and where enforcement is off).
    pub gpushare: Option<tessera_gpushare::usage::TaskUsage>,
}

/// What a start made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub sandbox: String,
    /// The inode of the task's pid namespace.
    pub pid_namespace: Option<u64>,
    /// Where the cgroup accounts the tree (`None` without cgroups).
    pub cgroup_procs: Option<Vec<i32>>,
    pub view: Vec<SeenDevice>,
}

/// Why a task did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("task {0} already runs on this node")]
    AlreadyRunning(TaskKey),
    #[error("{0}")]
    Limits(#[from] LimitError),
    #[error("env: {0}")]
    Env(String),
    #[error("template {path}: {message}")]
    Template { path: String, message: String },
    #[error("{0}")]
    Gpu(String),
    #[error("{0}")]
    Mismatch(#[from] Mismatch),
    #[error("log {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
    #[error("sandbox: {0}")]
    Sandbox(String),
    #[error("command: the task has no command")]
    NoCommand,
    #[error("tier: {0}")]
    Tier(String),
    /// The task's weights were not released or not delivered (the reason, from the
    /// key service or the delivery).
    #[error("{0}")]
    Weights(String),
}

/// Receives a task's end.
pub type OnExit = Box<dyn FnOnce(TaskExit) + Send + 'static>;

struct StopReq {
    reason: String,
    forced: bool,
}

/// The guest kernel's initial hard limit of open files (`INR_OPEN_MAX`), which a
/// micro-VM task's limit may not pass.
const GUEST_NOFILE: u64 = 4096;

/// A task's sandbox, of its tier.
enum Held {
    Namespace(Arc<Sandbox>),
    Microvm(Box<tessera_sandbox::vm::VmSandbox>),
}

impl Held {
    fn isolated(&self) -> &dyn Isolated {
        match self {
            Held::Namespace(s) => &**s,
            Held::Microvm(v) => &**v,
        }
    }
    fn cgroup(&self) -> Option<&dyn SandboxCgroup> {
        match self {
            Held::Namespace(s) => s.cgroup(),
            Held::Microvm(v) => v.cgroup(),
        }
    }
    /// The task's own pid namespace on the host (none for a micro-VM: its processes
    /// are in the guest, and the QEMU process is in the cgroup).
    fn pid_namespace(&self) -> Option<u64> {
        match self {
            Held::Namespace(s) => s.pid_namespace(),
            Held::Microvm(_) => None,
        }
    }
    /// The host processes of the workload: a namespace task's own, a micro-VM task's
    /// QEMU (its processes are in the guest).
    fn workload_pids(&self) -> Vec<i32> {
        match self {
            Held::Namespace(s) => s.workload_pids(),
            Held::Microvm(v) => vec![v.host_pid()],
        }
    }
    /// SIGTERM to the workload; how many processes got it (a micro-VM's guest
    /// agent does the sending there, and the count is 1 when the message went).
    fn terminate(&self) -> usize {
        use tessera_sandbox::Isolated;
        match self {
            Held::Namespace(s) => s.signal_workload(nix::sys::signal::Signal::SIGTERM),
            Held::Microvm(v) => Isolated::signal_workload(&**v, nix::sys::signal::Signal::SIGTERM),
        }
    }
}

struct Running {
    key: TaskKey,
    sb: Held,
    stop: Mutex<Option<StopReq>>,
    /// Set once, by whoever reads the cgroup and removes the sandbox first.
    usage: Mutex<Option<Usage>>,
    done: (Mutex<bool>, Condvar),
    started: Instant,
    fraction: f64,
    pidns: Option<u64>,
}

impl Running {
    /// Reads the cgroup, then removes the sandbox (SIGKILL to its whole pid
    /// namespace). Idempotent: the second caller gets the first reading.
    fn finish(&self) -> Usage {
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = *u {
            return u;
        }
        let wall = self.started.elapsed().as_secs_f64();
        let cg = self.sb.cgroup();
        let usage = Usage {
            wall_seconds: wall,
            cpu_seconds: cg.and_then(|c| c.cpu_usage_ns()).map(|ns| ns as f64 / 1e9),
            peak_memory: cg.and_then(|c| c.memory_peak()),
            gpu_seconds: self.fraction * wall,
            ..Usage::default()
        };
        *u = Some(usage);
        let _ = self.sb.isolated().destroy();
        usage
    }

    fn wait_done(&self, t: Duration) -> bool {
        let (m, cv) = &self.done;
        let g = m.lock().unwrap_or_else(|p| p.into_inner());
        let (g, _) = cv
            .wait_timeout_while(g, t, |d| !*d)
            .unwrap_or_else(|p| p.into_inner());
        *g
    }
}

/// A task's sandbox spec, its environment and the devices it will see.
type Prepared = (SandboxSpec, Vec<(String, String)>, Vec<SeenDevice>);

/// The node runtime. Cheap to share (`Arc`).
pub struct NodeRuntime {
    cfg: NodeConfig,
    rt: Arc<Runtime>,
    tasks: Mutex<HashMap<TaskKey, Arc<Running>>>,
    /// The driver's last view (refreshed by [`NodeRuntime::refresh_devices`]).
    live: Mutex<Result<Vec<RawGpu>, String>>,
    /// The last refusal for a device-view mismatch, until a check matches again.
    mismatch: Mutex<Option<Mismatch>>,
    faults: crate::faults::FaultBook,
    nofile: u64,
}

impl std::fmt::Debug for NodeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRuntime")
            .field("cfg", &self.cfg)
            .field("rt", &self.rt)
            .finish()
    }
}

/// The node runtime could not start.
#[derive(Debug, thiserror::Error)]
#[error("the node runtime cannot make sandboxes: {0}")]
pub struct NodeError(pub String);

impl NodeRuntime {
    pub fn new(cfg: NodeConfig) -> Result<Arc<NodeRuntime>, NodeError> {
        let rt = Runtime::new(RuntimeConfig {
            init: cfg.init.clone(),
            cgroups: cfg.cgroups,
            guard: cfg.guard.clone(),
            tenant: None,
            cgroup_backend: None,
            egress: None,
        })
        .map_err(|e| NodeError(e.to_string()))?;
        let live = cfg.gpus.gpus();
        // Up to 65536 open files per task, within what this process may give.
        let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(_, hard)| hard.min(65536))
            .unwrap_or(1024);
        Ok(Arc::new(NodeRuntime {
            cfg,
            rt,
            tasks: Mutex::new(HashMap::new()),
            live: Mutex::new(live),
            mismatch: Mutex::new(None),
            faults: Default::default(),
            nofile,
        }))
    }

    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    /// The sandbox runtime underneath.
    pub fn sandbox_runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    /// Whether limits are enforced (cgroups in use).
    pub fn enforces_limits(&self) -> bool {
        self.rt.cgroups().is_some()
    }

    /// Reads the driver's view again (for the heartbeat).
    pub fn refresh_devices(&self) -> Result<Vec<RawGpu>, String> {
        let v = self.cfg.gpus.gpus();
        *self.live.lock().unwrap_or_else(|p| p.into_inner()) = v.clone();
        v
    }

    /// The driver's last view.
    pub fn devices(&self) -> Result<Vec<RawGpu>, String> {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reads the fault events since the last call and takes them in: GPU faults
    /// mark the GPU unhealthy. Returns each event with its verdict.
    pub fn poll_faults(&self) -> Vec<(crate::faults::GpuFault, crate::faults::Verdict)> {
        let Some(src) = &self.cfg.faults else {
            return Vec::new();
        };
        match src.poll() {
            Ok(v) => v
                .into_iter()
                .map(|f| {
                    let verdict = self.faults.record(&f);
                    (f, verdict)
                })
                .collect(),
            Err(e) => {
                eprintln!("tessera-node: GPU fault events ({}): {e}", src.name());
                Vec::new()
            }
        }
    }

    /// GPUs marked unhealthy by a fault, with the reason.
    pub fn unhealthy_gpus(&self) -> std::collections::BTreeMap<u32, String> {
        self.faults.unhealthy()
    }

    /// The node's fault book (counts by verdict, GPUs marked).
    pub fn fault_book(&self) -> &crate::faults::FaultBook {
        &self.faults
    }

    /// The last device-view mismatch that refused a start, if no check has matched
    /// since.
    pub fn mismatch(&self) -> Option<Mismatch> {
        self.mismatch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Checks every GPU of the node record against the driver's view; clears the
    /// mismatch mark when they agree, sets it otherwise.
    pub fn check_devices(&self, record: &[GpuDevice]) -> Result<(), Mismatch> {
        let live = self.devices().unwrap_or_default();
        let all = GpuAssignment::Whole {
            gpus: record.iter().map(|g| g.index).collect(),
        };
        let r = if record.is_empty() {
            Ok(())
        } else {
            fence::plan(&all, record, &live, &self.cfg.devices).map(drop)
        };
        *self.mismatch.lock().unwrap_or_else(|p| p.into_inner()) = r.clone().err();
        r
    }

    /// A running fractional task's GPU-share usage, from its region.
    pub fn gpu_share_usage(&self, key: &TaskKey) -> Option<tessera_gpushare::usage::TaskUsage> {
        self.cfg.gpushare.usage(key)
    }

    /// Tasks running now.
    pub fn running(&self) -> Vec<TaskKey> {
        let mut v: Vec<TaskKey> = self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        v.sort();
        v
    }

    pub fn is_running(&self, key: &TaskKey) -> bool {
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(key)
    }

    /// The host pids of a running task's workload (for tests and diagnostics).
    pub fn workload_pids(&self, key: &TaskKey) -> Vec<i32> {
        self.get(key)
            .map(|r| r.sb.workload_pids())
            .unwrap_or_default()
    }

    fn get(&self, key: &TaskKey) -> Option<Arc<Running>> {
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// The sandbox spec and the environment of a task (no side effects but reading
    /// the device view): what [`NodeRuntime::start`] would run.
    fn prepare(&self, w: &WorkloadSpec) -> Result<Prepared, StartError> {
        if w.command.is_empty() || w.command[0].is_empty() {
            return Err(StartError::NoCommand);
        }
        spec::check_env(&w.env).map_err(StartError::Env)?;
        let limits = spec::sandbox_limits(&w.requests, &w.limits, &self.cfg.defaults)?;
        let template = match &w.template {
            TemplateRef::Host => Template::Host,
            TemplateRef::Dir(p) => {
                if !p.is_dir() {
                    return Err(StartError::Template {
                        path: p.display().to_string(),
                        message: "is not a folder on this node".into(),
                    });
                }
                Template::Dir(p.clone())
            }
        };
        let unhealthy = self.faults.unhealthy();
        if let Some((i, why)) = w
            .gpus
            .gpus()
            .iter()
            .find_map(|i| unhealthy.get(i).map(|w| (i, w)))
        {
            return Err(StartError::Gpu(format!(
                "GPU {i} is unhealthy ({why}): no new work starts on it"
            )));
        }
        let fence = if w.gpus == GpuAssignment::None {
            fence::plan(&w.gpus, &w.record, &[], &self.cfg.devices)?
        } else {
            // What the sandbox will see, read now (not the heartbeat's last view):
            // nothing loads on a GPU the driver no longer shows as allocated.
            let live = self.refresh_devices().unwrap_or_default();
            match fence::plan(&w.gpus, &w.record, &live, &self.cfg.devices) {
                Ok(f) => f,
                Err(m) => {
                    *self.mismatch.lock().unwrap_or_else(|p| p.into_inner()) = Some(m.clone());
                    return Err(m.into());
                }
            }
        };
        let mut gpu_env = fence.env.clone();
        let mut binds = fence.binds.clone();
        if let GpuAssignment::Shared { gpu, milli, memory } = &w.gpus {
            let share = Share {
                gpu: *gpu,
                uuid: fence
                    .view
                    .first()
                    .map(|v| v.uuid.clone())
                    .unwrap_or_default(),
                milli: *milli,
                memory: *memory,
                device_memory: w
                    .record
                    .iter()
                    .find(|g| g.index == *gpu)
                    .map(|g| g.memory)
                    .unwrap_or(0),
            };
            let s = self
                .cfg
                .gpushare
                .prepare(&w.key, &share)
                .map_err(StartError::Gpu)?;
            // The hook's variables replace the fence's of the same name.
            gpu_env.retain(|(k, _)| !s.env.iter().any(|(n, _)| n == k));
            gpu_env.extend(s.env);
            binds.extend(s.binds);
        }
        let mut extra_rules = Vec::new();
        if w.gpus != GpuAssignment::None {
            for d in &self.cfg.gpu_libs {
                let path = d.display().to_string();
                binds.push(tessera_sandbox::Bind {
                    host: d.clone(),
                    path: path.clone(),
                    writable: false,
                });
                extra_rules.push(tessera_sandbox::PathAccess {
                    path,
                    read: true,
                    write: false,
                    execute: true,
                });
            }
        }
        let env = spec::task_env(&w.key, &self.cfg.name, &gpu_env, &w.env);
        let sbspec = SandboxSpec {
            template,
            network: Network::None,
            limits,
            hostname: spec::hostname(&w.key),
            env: Vec::new(),
            extra_rules,
            rlimits: tessera_sandbox::Rlimits {
                nofile: self.nofile,
                ..Default::default()
            },
            binds,
            masked_paths: self
                .cfg
                .masked_paths
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            device_allow: Some(fence.rules.clone()),
            sealed: crate::weights::folders(
                &self.cfg.name,
                self.cfg.weights.is_some(),
                w.tier,
                &w.weights,
            )
            .map_err(StartError::Weights)?,
        };
        Ok((sbspec, env, fence.view))
    }

    /// Starts a task: checks the device view, makes its sandbox, and runs its command
    /// there, output appended to its log. Returns once the sandbox exists; `on_exit`
    /// is called (on the task's own thread) when the task has ended and its sandbox is
    /// gone. Blocking (milliseconds).
    pub fn start(
        self: &Arc<Self>,
        w: WorkloadSpec,
        on_exit: OnExit,
    ) -> Result<Started, StartError> {
        if self.is_running(&w.key) {
            return Err(StartError::AlreadyRunning(w.key));
        }
        let (sbspec, env, view) = self.prepare(&w)?;
        let shared = matches!(w.gpus, GpuAssignment::Shared { .. });
        // Whatever fails from here on gives the task's GPU share back.
        let key = w.key.clone();
        let undo = |e: StartError| {
            if shared {
                self.cfg.gpushare.release(&key);
            }
            e
        };
        self.launch(w, sbspec, env, view, on_exit).map_err(undo)
    }

    fn launch(
        self: &Arc<Self>,
        w: WorkloadSpec,
        sbspec: SandboxSpec,
        env: Vec<(String, String)>,
        view: Vec<SeenDevice>,
        on_exit: OnExit,
    ) -> Result<Started, StartError> {
        let log_err = |source| StartError::Log {
            path: w.log.display().to_string(),
            source,
        };
        if let Some(dir) = w.log.parent() {
            std::fs::create_dir_all(dir).map_err(log_err)?;
        }
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&w.log)
            .map_err(log_err)?;
        if w.key.attempt > 0 {
            let _ = writeln!(
                log,
                "[tessera] attempt {} of {}",
                w.key.attempt + 1,
                w.key.task
            );
        }
        let sb = match w.tier {
            TierKind::Namespace => {
                let mut sb = self
                    .rt
                    .spawn(&sbspec)
                    .map_err(|e| StartError::Sandbox(e.to_string()))?;
                sb.set_tenant(Some(w.key.tenant.clone()));
                // Weights, after the device-view check (in `prepare`) and before the
                // command: a failure drops (destroys) the sandbox and what it held.
                // (`prepare` refused weights on a node without access.)
                if let (false, Some(access)) = (w.weights.is_empty(), &self.cfg.weights) {
                    crate::weights::deliver(
                        &sb,
                        access,
                        &self.cfg.name,
                        &w.key,
                        &w.weights,
                        &view,
                        sbspec.limits.memory_bytes,
                    )
                    .map_err(StartError::Weights)?;
                }
                Held::Namespace(Arc::new(sb))
            }
            TierKind::Microvm => {
                let Some(tier) = &self.cfg.microvm else {
                    return Err(StartError::Tier(format!(
                        "node {} has no micro-VM tier (start it with --vm-kernel DIR)",
                        self.cfg.name
                    )));
                };
                if w.gpus != GpuAssignment::None {
                    return Err(StartError::Tier(
                        "a micro-VM task cannot have GPUs: vfio pass-through is not built".into(),
                    ));
                }
                // The guest's agent runs under the guest kernel's initial hard limit of
                // open files (4096), not this host process's.
                let mut sbspec = sbspec;
                sbspec.rlimits.nofile = sbspec.rlimits.nofile.min(GUEST_NOFILE);
                let mut vm = tier
                    .spawn_vm(&sbspec)
                    .map_err(|e| StartError::Sandbox(e.to_string()))?;
                Isolated::set_tenant(&mut vm, Some(w.key.tenant.clone()));
                Held::Microvm(Box::new(vm))
            }
        };
        let pidns = sb.pid_namespace();
        let started = Started {
            sandbox: sb.isolated().id().to_string(),
            pid_namespace: pidns,
            cgroup_procs: sb.cgroup().map(|c| c.procs()),
            view,
        };
        let running = Arc::new(Running {
            key: w.key.clone(),
            sb,
            stop: Mutex::new(None),
            usage: Mutex::new(None),
            done: (Mutex::new(false), Condvar::new()),
            started: Instant::now(),
            fraction: w.gpus.fraction(&w.record),
            pidns,
        });
        {
            let mut t = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
            if t.contains_key(&w.key) {
                return Err(StartError::AlreadyRunning(w.key));
            }
            t.insert(w.key.clone(), running.clone());
        }
        if matches!(w.gpus, GpuAssignment::Shared { .. }) {
            // The compute monitor tells the task's device time by its pid namespace.
            self.cfg.gpushare.running(&w.key, running.pidns);
        }
        let me = self.clone();
        let mut req = ExecRequest::argv(w.command.clone());
        req.env = env;
        req.cwd = w.working_dir.clone();
        // Output goes to the log as it comes; nothing is kept in memory.
        req.max_output = 0;
        let shared = matches!(w.gpus, GpuAssignment::Shared { .. });
        let spawned = std::thread::Builder::new()
            .name(format!("task {}", w.key.task))
            .stack_size(256 << 10)
            .spawn(move || {
                let stopped_early = running
                    .stop
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_some();
                let r = match &req.cwd {
                    // Stopped before it began: nothing to run.
                    _ if stopped_early => Ok(()),
                    Some(d) if needs_mkdir(d) => running
                        .sb
                        .isolated()
                        .mkdir(d)
                        .map_err(|e| ExecError::Protocol(format!("working_dir {d}: {e}"))),
                    _ => Ok(()),
                }
                .and_then(|()| {
                    if stopped_early {
                        return Err(ExecError::Protocol("stopped before it started".into()));
                    }
                    running.sb.isolated().exec_streaming(&req, &mut |_, data| {
                        let _ = log.write_all(data);
                    })
                });
                let usage = running.finish();
                let leftovers = running.pidns.map(pids_in_namespace).unwrap_or_default();
                let stop = running
                    .stop
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                let outcome = match (stop, r) {
                    (Some(s), _) => Outcome::Stopped {
                        reason: s.reason,
                        forced: s.forced,
                    },
                    (None, Ok(out)) if out.oom_killed => Outcome::OomKilled(out.status.code()),
                    (None, Ok(out)) => match out.status {
                        tessera_sandbox::ExitStatus::Exited(c) => Outcome::Exited(c),
                        tessera_sandbox::ExitStatus::Signaled(s) => Outcome::Signaled(s),
                    },
                    (None, Err(ExecError::Blocked(r))) => {
                        Outcome::Failed(format!("blocked by the runtime guard: {r}"))
                    }
                    (None, Err(ExecError::Start(e))) => {
                        Outcome::Failed(format!("could not start: {e}"))
                    }
                    (None, Err(e)) => Outcome::Failed(e.to_string()),
                };
                if !matches!(outcome, Outcome::Stopped { .. } | Outcome::Exited(_)) {
                    let _ = writeln!(log, "[tessera] {}", outcome.message());
                }
                me.tasks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&running.key);
                // The tree is gone (the sandbox was removed above): its share goes back.
                let gpushare = if shared {
                    me.cfg.gpushare.release(&running.key)
                } else {
                    None
                };
                {
                    let (m, cv) = &running.done;
                    *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    cv.notify_all();
                }
                on_exit(TaskExit {
                    key: running.key.clone(),
                    outcome,
                    usage: usage.with_share(gpushare.as_ref()),
                    leftovers,
                    gpushare,
                });
            });
        if let Err(e) = spawned {
            if let Some(r) = self.get(&w.key) {
                let _ = r.sb.isolated().destroy();
            }
            self.tasks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&w.key);
            return Err(StartError::Sandbox(format!("cannot start a thread: {e}")));
        }
        Ok(started)
    }

    /// Stops a task: SIGTERM to its workload, then, if it has not ended after `grace`,
    /// SIGKILL to its whole tree (the sandbox is removed). A zero grace kills at once.
    /// Returns false when the task is not running. Does not wait: the task's
    /// `on_exit` reports the end (with [`Outcome::Stopped`] and `reason`). A second
    /// stop while one is under way can only shorten the wait.
    pub fn stop(&self, key: &TaskKey, grace: Duration, reason: impl Into<String>) -> bool {
        let Some(r) = self.get(key) else {
            return false;
        };
        {
            let mut s = r.stop.lock().unwrap_or_else(|p| p.into_inner());
            if s.is_none() {
                *s = Some(StopReq {
                    reason: reason.into(),
                    forced: false,
                });
            }
        }
        let kill = |r: &Running| {
            if let Some(s) = r.stop.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                s.forced = true;
            }
            r.finish();
        };
        if grace.is_zero() {
            kill(&r);
            return true;
        }
        let term = |r: &Running| r.sb.terminate() > 0;
        let mut sent = term(&r);
        let spawned = std::thread::Builder::new()
            .name("task grace".into())
            .stack_size(64 << 10)
            .spawn({
                let r = r.clone();
                move || {
                    let deadline = Instant::now() + grace;
                    // A stop that came while the command was still starting found no
                    // process to signal: send again until one gets it.
                    while !sent && Instant::now() < deadline {
                        if r.wait_done(Duration::from_millis(20)) {
                            return;
                        }
                        sent = term(&r);
                    }
                    if !r.wait_done(deadline.saturating_duration_since(Instant::now())) {
                        kill(&r);
                    }
                }
            });
        if spawned.is_err() {
            kill(&r);
        }
        true
    }

    /// Waits until `key` is no longer running (its sandbox removed and `on_exit`
    /// about to be called), at most `t`. Returns whether it ended.
    pub fn wait(&self, key: &TaskKey, t: Duration) -> bool {
        match self.get(key) {
            Some(r) => r.wait_done(t),
            None => true,
        }
    }

    /// Kills every task at once (shutdown).
    pub fn stop_all(&self, reason: &str) {
        for k in self.running() {
            self.stop(&k, Duration::ZERO, reason);
        }
    }
}

/// Working folders under the writable places are made before the task starts.
fn needs_mkdir(d: &str) -> bool {
    ["/workspace/", "/tmp/", "/home/user/"]
        .iter()
        .any(|p| d.starts_with(p))
}
