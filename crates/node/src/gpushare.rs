//! GPU-share enforcement for fractional tasks: the [`GpuShareHook`]s.
//!
//! - [`Interposer`] (the default of `tessera up`): before a fractional task starts
//!   it creates the task's accounting region (`tessera-gpushare`), and the sandbox
//!   gets the interposer `libtessera_cuda.so` bound read-only at
//!   `/run/tessera/gpushare/libtessera_cuda.so`, an `/etc/ld.so.preload` naming it
//!   (bound read-only, so every dynamically linked process of the task — children,
//!   shells, re-execs, a process that cleared `LD_PRELOAD` — loads it), and the
//!   region bound writable at `/run/tessera/gpushare/region`. After the task's tree
//!   is gone (exit, crash, stop, eviction) the region is removed and its last
//!   usage returned for metering. Regions left by an earlier run of this node
//!   (a crash of `tessera up`) are removed when the hook is made.
//!   While the hook is on, the node's compute monitor ([`crate::compute`]) runs:
//!   each fractional task's region is attached to it when prepared and detached
//!   when released, so its compute share is sliced (NVML's utilisation in
//!   production; where NVML cannot be opened the monitor does not run, the hook
//!   says so, and the interposer reports the share as not enforced).
//! - [`Refuse`]: the interposer was asked for and is not there: every fractional
//!   task is refused with the reason (the missing file and the fix), never run
//!   unenforced.
//! - [`EnvOnly`](crate::fence::EnvOnly): only where the operator turned
//!   enforcement off (`tessera up --gpu-share-enforcement off`): the task sees its
//!   share in two variables and nothing holds it to them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tessera_gpushare::region::{ComputePolicy, DeviceConfig};
use tessera_gpushare::setup::{self, NodeLayout, ShareSpec, TaskShare};
use tessera_gpushare::share::ControllerConfig;
use tessera_gpushare::usage::TaskUsage;
use tessera_sandbox::Bind;

use crate::compute::{ComputeMonitor, MonitorConfig, Monotonic, NvmlUtilisation};
use crate::fence::{GpuShareHook, Share, ShareSetup};
use crate::spec::TaskKey;

pub use tessera_gpushare::setup::{INTERPOSER_FILE, find_interposer};

/// How the interposer hook is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterposerConfig {
    /// `libtessera_cuda.so` on this host.
    pub interposer: PathBuf,
    /// Host folder for the tasks' regions and preload lists (created; owned by
    /// this node runtime: what is there when the hook is made is removed).
    pub state_dir: PathBuf,
    /// How long an allocation over the cap waits for memory (zero: fails at once
    /// with `CUDA_ERROR_OUT_OF_MEMORY`).
    pub memory_wait: Duration,
    pub policy: ComputePolicy,
}

impl InterposerConfig {
    pub fn new(interposer: impl Into<PathBuf>, state_dir: impl Into<PathBuf>) -> Self {
        InterposerConfig {
            interposer: interposer.into(),
            state_dir: state_dir.into(),
            memory_wait: Duration::ZERO,
            policy: ComputePolicy::WorkConserving,
        }
    }
}

struct Held {
    share: TaskShare,
    preload: PathBuf,
    /// Whether the compute monitor slices it (a share under the whole device).
    sliced: bool,
}

/// Enforcement through the CUDA interposer (see the module's text).
pub struct Interposer {
    cfg: InterposerConfig,
    owner: Option<(u32, u32)>,
    seq: AtomicU64,
    held: Mutex<HashMap<TaskKey, Held>>,
    /// The compute monitor, or why it does not run.
    compute: Result<ComputeMonitor, String>,
}

impl std::fmt::Debug for Interposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interposer")
            .field("cfg", &self.cfg)
            .field("held", &self.held().len())
            .field("compute", &self.compute)
            .finish()
    }
}

/// The compute monitor `tessera up` runs with the hook: CLOCK_MONOTONIC and
/// NVML's per-process utilisation, or why it cannot run (no NVML).
pub fn nvml_monitor() -> Result<MonitorConfig, String> {
    let utilisation = NvmlUtilisation::open()
        .map_err(|e| format!("NVML cannot be opened ({e}), so device time cannot be measured"))?;
    Ok(MonitorConfig {
        clock: Box::new(Monotonic),
        utilisation: Box::new(utilisation),
        // NVML refreshes per-process samples slower than the controller's default
        // 10 ms; 50 ms is what the H200 procedure uses.
        controller: ControllerConfig {
            tick_ns: 50_000_000,
            ..ControllerConfig::default()
        },
    })
}

/// The interposer hook could not be made.
#[derive(Debug, thiserror::Error)]
#[error("GPU-share enforcement: {0}")]
pub struct HookError(pub String);

impl Interposer {
    /// Checks the interposer file, makes the state folder and removes what an
    /// earlier run left there; the compute monitor runs on NVML
    /// ([`nvml_monitor`]) where it can be opened.
    pub fn new(cfg: InterposerConfig) -> Result<Interposer, HookError> {
        Self::with_monitor(cfg, nvml_monitor())
    }

    /// As [`Interposer::new`], with the compute monitor given (`Err`: none runs,
    /// for this reason; compute shares are then not enforced and the hook says so).
    pub fn with_monitor(
        cfg: InterposerConfig,
        monitor: Result<MonitorConfig, String>,
    ) -> Result<Interposer, HookError> {
        check_library(&cfg.interposer)?;
        std::fs::create_dir_all(&cfg.state_dir)
            .map_err(|e| HookError(format!("{}: create folder: {e}", cfg.state_dir.display())))?;
        if let Ok(rd) = std::fs::read_dir(&cfg.state_dir) {
            for e in rd.flatten() {
                let p = e.path();
                if matches!(
                    p.extension().and_then(|x| x.to_str()),
                    Some("region" | "preload")
                ) {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        // The task's processes run as the sandbox's user: the region must be theirs
        // to map read-write. Without root, sandbox root is this process's own uid.
        let owner = nix::unistd::geteuid().is_root().then(|| {
            let id = tessera_sandbox::sandbox::HOST_ID_BASE + tessera_sandbox::sandbox::SANDBOX_UID;
            (id, id)
        });
        let compute = monitor.and_then(|m| {
            ComputeMonitor::start(m).map_err(|e| format!("the compute monitor thread: {e}"))
        });
        Ok(Interposer {
            cfg,
            owner,
            seq: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
            compute,
        })
    }

    /// The compute monitor, or why none runs.
    pub fn compute_monitor(&self) -> Result<&ComputeMonitor, &str> {
        self.compute.as_ref().map_err(|e| e.as_str())
    }

    pub fn config(&self) -> &InterposerConfig {
        &self.cfg
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<TaskKey, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tasks holding a region now.
    pub fn active(&self) -> Vec<TaskKey> {
        let mut v: Vec<TaskKey> = self.held().keys().cloned().collect();
        v.sort();
        v
    }

    /// The host path of a running task's region.
    pub fn region_path(&self, key: &TaskKey) -> Option<PathBuf> {
        self.held()
            .get(key)
            .map(|h| h.share.host_path().to_path_buf())
    }
}

impl Drop for Interposer {
    fn drop(&mut self) {
        // Empty by then (every task released its region): a private folder goes.
        let _ = std::fs::remove_dir(&self.cfg.state_dir);
    }
}

/// A state folder of this process's own for a node named `name` (nothing else
/// uses it, so making a hook there removes nobody's regions): under
/// `/run/tessera/gpushare` as root, else the temporary folder.
pub fn private_state_dir(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let base = if nix::unistd::geteuid().is_root() && Path::new("/run").is_dir() {
        PathBuf::from("/run/tessera/gpushare")
    } else {
        std::env::temp_dir().join("tessera-gpushare")
    };
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    base.join(format!(
        "{clean}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A region id from a task key: `<seq>-<tenant.job.task.attempt>`, other bytes
/// than `A-Za-z0-9._-` made `_`, at most 64 bytes.
pub fn region_id(key: &TaskKey, seq: u64) -> String {
    let raw = format!(
        "{seq}-{}.{}.{}.{}",
        key.tenant, key.job, key.task, key.attempt
    );
    let mut s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    s.truncate(64);
    s
}

fn check_library(p: &Path) -> Result<(), HookError> {
    use std::io::Read;
    let mut head = [0u8; 4];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut head))
        .map_err(|e| {
            HookError(format!(
                "the CUDA interposer {} cannot be read ({e}): build it with \
                 `cargo build --release -p tessera-gpushare-cuda` and pass \
                 `--cuda-interposer PATH`, or turn enforcement off with \
                 `--gpu-share-enforcement off`",
                p.display()
            ))
        })?;
    if head != *b"\x7fELF" {
        return Err(HookError(format!(
            "the CUDA interposer {} is not an ELF shared library",
            p.display()
        )));
    }
    Ok(())
}

impl GpuShareHook for Interposer {
    fn prepare(&self, key: &TaskKey, share: &Share) -> Result<ShareSetup, String> {
        if self.held().contains_key(key) {
            return Err(format!("task {key} already holds a GPU-share region"));
        }
        let id = region_id(key, self.seq.fetch_add(1, Ordering::Relaxed));
        let mut layout = NodeLayout::new(&self.cfg.state_dir, &self.cfg.interposer);
        layout.region_owner = self.owner;
        let memory = if share.memory > 0 {
            share.memory
        } else {
            // No memory in the request: the cap is the device (the compute share
            // is still sliced).
            share.device_memory
        };
        let spec = ShareSpec {
            task: id.clone(),
            devices: vec![DeviceConfig {
                memory_limit: memory,
                compute_milli: share.milli.clamp(1, 1000),
            }],
            memory_wait: self.cfg.memory_wait,
            policy: self.cfg.policy,
        };
        let ts = setup::prepare(&spec, &layout)
            .map_err(|e| format!("GPU share of GPU {} could not be set up: {e}", share.gpu))?;
        let plan = ts.plan().clone();
        let sliced = spec.devices[0].compute_milli < 1000;
        if sliced && let Ok(m) = &self.compute {
            m.attach(share.gpu, &id, ts.region().clone());
        }
        // The plan's files are written on the host and bound read-only over their
        // place in the sandbox (its /etc is generated, not writable).
        let preload = self.cfg.state_dir.join(format!("{id}.preload"));
        let mut binds: Vec<Bind> = Vec::new();
        for f in &plan.files {
            if let Err(e) = std::fs::write(&preload, &f.contents) {
                if let Ok(m) = &self.compute {
                    m.detach(&id);
                }
                let _ = ts.release();
                return Err(format!("{}: write: {e}", preload.display()));
            }
            binds.push(Bind {
                host: preload.clone(),
                path: f.path.display().to_string(),
                writable: false,
            });
        }
        binds.extend(plan.binds.iter().map(|b| Bind {
            host: b.host.clone(),
            path: b.sandbox.display().to_string(),
            writable: b.writable,
        }));
        self.held().insert(
            key.clone(),
            Held {
                share: ts,
                preload,
                sliced,
            },
        );
        Ok(ShareSetup {
            env: plan.env.clone(),
            binds,
        })
    }

    fn release(&self, key: &TaskKey) -> Option<TaskUsage> {
        let h = self.held().remove(key)?;
        if h.sliced
            && let Ok(m) = &self.compute
        {
            m.detach(h.share.task());
        }
        let _ = std::fs::remove_file(&h.preload);
        match h.share.release() {
            Ok(u) => Some(u),
            Err(e) => {
                eprintln!("tessera-node: task {key}: {e}");
                None
            }
        }
    }

    fn running(&self, key: &TaskKey, pidns: Option<u64>) {
        if let Some(h) = self.held().get(key)
            && h.sliced
            && let Ok(m) = &self.compute
        {
            m.running(h.share.task(), pidns);
        }
    }

    fn usage(&self, key: &TaskKey) -> Option<TaskUsage> {
        self.held().get(key).map(|h| h.share.usage())
    }

    fn describe(&self) -> String {
        let compute = match &self.compute {
            Ok(_) => "compute shares sliced by the node's compute monitor".to_string(),
            Err(why) => format!("compute shares NOT enforced: {why}"),
        };
        format!(
            "enforced by the CUDA interposer {} (memory caps; {compute})",
            self.cfg.interposer.display()
        )
    }
}

/// Enforcement was asked for and cannot be given: fractional tasks are refused.
#[derive(Debug, Clone)]
pub struct Refuse {
    pub why: String,
}

impl GpuShareHook for Refuse {
    fn prepare(&self, _: &TaskKey, share: &Share) -> Result<ShareSetup, String> {
        Err(format!(
            "a share of GPU {} ({}m) cannot be enforced on this node, so the task is not started: {}",
            share.gpu, share.milli, self.why
        ))
    }
    fn release(&self, _: &TaskKey) -> Option<TaskUsage> {
        None
    }
    fn describe(&self) -> String {
        format!("fractional GPU tasks refused: {}", self.why)
    }
}

/// What `tessera up` asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Enforcement {
    /// The interposer: this file, else [`find_interposer`]'s search.
    #[default]
    Interposer,
    InterposerAt(PathBuf),
    /// Off: the share is in the environment only (an operator's choice, said at
    /// start).
    Off,
}

/// `mode`, or — when it asks for the interposer found by the usual search, none is
/// installed, and this binary carries a copy (`embedded`, release builds) — that copy
/// written into `dir` (kept when it is already there with the same bytes).
pub fn with_embedded(mode: Enforcement, embedded: &[u8], dir: &Path) -> Enforcement {
    if !matches!(mode, Enforcement::Interposer) || embedded.is_empty() || find_interposer().is_ok()
    {
        return mode;
    }
    let path = dir.join("libtessera_cuda.so");
    if std::fs::read(&path).is_ok_and(|b| b == embedded) {
        return Enforcement::InterposerAt(path);
    }
    let tmp = dir.join(".libtessera_cuda.so.new");
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, embedded))
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
        })
        .and_then(|()| std::fs::rename(&tmp, &path));
    match written {
        Ok(()) => Enforcement::InterposerAt(path),
        Err(e) => {
            eprintln!(
                "tessera: cannot write the CUDA interposer to {}: {e}; fractional GPU tasks will be refused",
                path.display()
            );
            mode
        }
    }
}

/// The hook for `mode`: the interposer when it is there, [`Refuse`] naming the
/// missing file and the fix when it is not, [`EnvOnly`](crate::fence::EnvOnly)
/// when off.
pub fn hook(mode: &Enforcement, state_dir: &Path) -> std::sync::Arc<dyn GpuShareHook> {
    let path = match mode {
        Enforcement::Off => return std::sync::Arc::new(crate::fence::EnvOnly),
        Enforcement::InterposerAt(p) => Ok(p.clone()),
        Enforcement::Interposer => find_interposer().map_err(|e| {
            format!(
                "{e}; then pass `--cuda-interposer PATH` if it is elsewhere, or turn enforcement off with `--gpu-share-enforcement off`"
            )
        }),
    };
    match path.and_then(|p| {
        Interposer::new(InterposerConfig::new(p, state_dir)).map_err(|e| e.to_string())
    }) {
        Ok(i) => std::sync::Arc::new(i),
        Err(why) => std::sync::Arc::new(Refuse { why }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_ids_are_valid_and_distinct() {
        let k = TaskKey::new("acme corp", "job/1", "worker-0", 3);
        let a = region_id(&k, 0);
        assert_eq!(a, "0-acme_corp.job_1.worker-0.3");
        assert_ne!(a, region_id(&k, 1));
        let long = TaskKey::new("t".repeat(100), "j", "x", 0);
        assert_eq!(region_id(&long, 7).len(), 64);
    }

    #[test]
    fn the_carried_interposer_is_written_once_when_none_is_installed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("gpushare");
        // Off and an operator's file are kept as they are; nothing carried, nothing done.
        assert!(matches!(
            with_embedded(Enforcement::Off, b"\x7fELF", &dir),
            Enforcement::Off
        ));
        assert!(matches!(
            with_embedded(Enforcement::Interposer, b"", &dir),
            Enforcement::Interposer
        ));
        if find_interposer().is_ok() {
            return; // one is installed where the search looks (cargo's deps/): it wins
        }
        let lib = dir.join("libtessera_cuda.so");
        match with_embedded(Enforcement::Interposer, b"\x7fELF carried", &dir) {
            Enforcement::InterposerAt(p) => assert_eq!(p, lib),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read(&lib).unwrap(), b"\x7fELF carried");
        let before = std::fs::metadata(&lib).unwrap().modified().unwrap();
        // Again with the same bytes: kept, not rewritten.
        with_embedded(Enforcement::Interposer, b"\x7fELF carried", &dir);
        assert_eq!(std::fs::metadata(&lib).unwrap().modified().unwrap(), before);
    }

    #[test]
    fn a_missing_interposer_refuses_with_the_fix() {
        let d = tempfile::tempdir().unwrap();
        let h = hook(
            &Enforcement::InterposerAt(d.path().join("libtessera_cuda.so")),
            &d.path().join("state"),
        );
        let share = Share {
            gpu: 0,
            uuid: "GPU-0".into(),
            milli: 300,
            memory: 1 << 30,
            device_memory: 80 << 30,
        };
        let e = h
            .prepare(&TaskKey::new("a", "b", "c", 0), &share)
            .unwrap_err();
        assert!(
            e.contains("libtessera_cuda.so")
                && e.contains("cargo build --release -p tessera-gpushare-cuda")
                && e.contains("not started"),
            "{e}"
        );
        assert!(h.describe().contains("refused"));
    }

    #[test]
    fn regions_are_made_and_released() {
        let d = tempfile::tempdir().unwrap();
        // Any ELF file stands in for the interposer here.
        let exe = std::env::current_exe().unwrap();
        let state = d.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("9-old.region"), b"left by a crash").unwrap();
        let i = Interposer::new(InterposerConfig::new(exe, &state)).unwrap();
        assert!(
            !state.join("9-old.region").exists(),
            "stale regions removed"
        );
        let key = TaskKey::new("acme", "j", "t", 0);
        let share = Share {
            gpu: 0,
            uuid: "GPU-0".into(),
            milli: 400,
            memory: 0,
            device_memory: 80 << 30,
        };
        let s = i.prepare(&key, &share).unwrap();
        let paths: Vec<&str> = s.binds.iter().map(|b| b.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/etc/ld.so.preload",
                "/run/tessera/gpushare/libtessera_cuda.so",
                "/run/tessera/gpushare/region"
            ]
        );
        assert_eq!(
            std::fs::read_to_string(&s.binds[0].host).unwrap(),
            "/run/tessera/gpushare/libtessera_cuda.so\n"
        );
        assert!(!s.binds[0].writable && !s.binds[1].writable && s.binds[2].writable);
        let u = i.usage(&key).unwrap();
        assert_eq!(
            u.devices[0].memory_limit_bytes,
            80 << 30,
            "no memory asked: the device"
        );
        assert!(i.prepare(&key, &share).is_err(), "one region per task");
        let region = i.region_path(&key).unwrap();
        assert!(region.exists());
        assert!(i.release(&key).is_some());
        assert!(!region.exists() && !s.binds[0].host.exists());
        assert!(i.release(&key).is_none());
        assert!(i.active().is_empty());
    }
}
