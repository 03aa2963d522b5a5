//! Setting a fractional task up, for the node runtime: [`prepare`] creates the
//! task's accounting region and returns, as data, what to put in the sandbox
//! ([`SandboxPlan`]: files, bind mounts, environment); [`TaskShare::release`]
//! removes the region when the task ends. Nothing here knows how a sandbox is
//! built: the node runtime applies the plan.
//!
//! Turning GPU sharing off for a pool is not calling this: a task started
//! without the plan sees the whole GPU.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::region::{ComputePolicy, DeviceConfig, Region, RegionConfig, RegionError};
use crate::usage::TaskUsage;

/// The interposer's file name (the `tessera-gpushare-cuda` package's cdylib).
pub const INTERPOSER_FILE: &str = "libtessera_cuda.so";
/// Where the plan puts the interposer inside the sandbox.
pub const SANDBOX_INTERPOSER: &str = "/run/tessera/gpushare/libtessera_cuda.so";
/// Where the plan puts the region inside the sandbox (the interposer's default).
pub const SANDBOX_REGION: &str = "/run/tessera/gpushare/region";
/// The loader's preload list: read by every dynamically linked program.
pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";

/// Per device, in bytes (comma-separated, one per device the task sees). For the
/// task's own code (e.g. to size a framework's memory pool); the interposer
/// enforces the region's copy.
pub const ENV_MEMORY_LIMIT: &str = "TESSERA_GPU_MEMORY_LIMIT";
/// Per device, milli-GPU (comma-separated).
pub const ENV_COMPUTE_MILLI: &str = "TESSERA_GPU_COMPUTE_MILLI";
/// The region's path inside the sandbox.
pub const ENV_REGION: &str = "TESSERA_GPUSHARE_REGION";
/// Overrides where [`find_interposer`] looks first.
pub const ENV_INTERPOSER: &str = "TESSERA_CUDA_INTERPOSER";

/// A fractional task's share, as the scheduler bound it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareSpec {
    /// Task id: 1 to 64 of `[A-Za-z0-9._-]`.
    pub task: String,
    /// One entry per GPU the task sees, in the order the sandbox exposes them.
    pub devices: Vec<DeviceConfig>,
    /// How long an allocation over the cap waits for memory (zero: fails at once).
    pub memory_wait: Duration,
    pub policy: ComputePolicy,
}

/// Where things live on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    /// Host folder holding the regions (created if missing).
    pub state_dir: PathBuf,
    /// The interposer on the host.
    pub interposer: PathBuf,
    pub sandbox_interposer: PathBuf,
    pub sandbox_region: PathBuf,
    /// Host uid/gid the region file is given to (the sandbox's job user), so
    /// the task's processes can map it read-write.
    pub region_owner: Option<(u32, u32)>,
}

impl NodeLayout {
    pub fn new(state_dir: impl Into<PathBuf>, interposer: impl Into<PathBuf>) -> Self {
        NodeLayout {
            state_dir: state_dir.into(),
            interposer: interposer.into(),
            sandbox_interposer: SANDBOX_INTERPOSER.into(),
            sandbox_region: SANDBOX_REGION.into(),
            region_owner: None,
        }
    }
}

/// What to put into the sandbox. Apply all of it or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPlan {
    /// Files to write inside the sandbox (its `/etc` is generated).
    pub files: Vec<SandboxFile>,
    /// Host paths to bind into the sandbox (single files).
    pub binds: Vec<Bind>,
    /// Environment for the task's first process.
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxFile {
    pub path: PathBuf,
    pub contents: Vec<u8>,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub host: PathBuf,
    pub sandbox: PathBuf,
    /// The region is written by the task's processes; the library is not.
    pub writable: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(
        "task id {0:?} cannot name a GPU-share region: use 1 to 64 of A-Z a-z 0-9 . _ - (not \".\" or \"..\")"
    )]
    TaskId(String),
    #[error("{path}: {why}")]
    Interposer { path: PathBuf, why: String },
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("sandbox path {0} must be absolute")]
    SandboxPath(PathBuf),
    #[error(transparent)]
    Region(#[from] RegionError),
}

/// A task's share on this node: its region and its sandbox plan.
#[derive(Debug)]
pub struct TaskShare {
    task: String,
    region: Region,
    host_path: PathBuf,
    plan: SandboxPlan,
}

fn valid_task(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Creates the task's region under `layout.state_dir` and returns its share.
/// A region left by an earlier run of the same task id is an error (release it
/// first); nothing is created on error.
pub fn prepare(spec: &ShareSpec, layout: &NodeLayout) -> Result<TaskShare, SetupError> {
    if !valid_task(&spec.task) {
        return Err(SetupError::TaskId(spec.task.clone()));
    }
    for p in [&layout.sandbox_interposer, &layout.sandbox_region] {
        if !p.is_absolute() {
            return Err(SetupError::SandboxPath(p.clone()));
        }
    }
    check_interposer(&layout.interposer)?;
    std::fs::create_dir_all(&layout.state_dir).map_err(|source| SetupError::Io {
        path: layout.state_dir.clone(),
        op: "create folder",
        source,
    })?;
    let host_path = layout.state_dir.join(format!("{}.region", spec.task));
    let region = Region::create(
        &host_path,
        &RegionConfig {
            task: spec.task.clone(),
            devices: spec.devices.clone(),
            memory_wait: spec.memory_wait,
            policy: spec.policy,
        },
    )?;
    if let Some((uid, gid)) = layout.region_owner {
        if let Err(source) = std::os::unix::fs::chown(&host_path, Some(uid), Some(gid)) {
            let _ = std::fs::remove_file(&host_path);
            return Err(SetupError::Io {
                path: host_path,
                op: "chown",
                source,
            });
        }
    }
    let list =
        |f: fn(&DeviceConfig) -> String| spec.devices.iter().map(f).collect::<Vec<_>>().join(",");
    let plan = SandboxPlan {
        files: vec![SandboxFile {
            path: LD_SO_PRELOAD.into(),
            contents: format!("{}\n", layout.sandbox_interposer.display()).into_bytes(),
            mode: 0o644,
        }],
        binds: vec![
            Bind {
                host: layout.interposer.clone(),
                sandbox: layout.sandbox_interposer.clone(),
                writable: false,
            },
            Bind {
                host: host_path.clone(),
                sandbox: layout.sandbox_region.clone(),
                writable: true,
            },
        ],
        env: vec![
            (
                ENV_MEMORY_LIMIT.into(),
                list(|d| d.memory_limit.to_string()),
            ),
            (
                ENV_COMPUTE_MILLI.into(),
                list(|d| d.compute_milli.to_string()),
            ),
            (
                ENV_REGION.into(),
                layout.sandbox_region.display().to_string(),
            ),
        ],
    };
    Ok(TaskShare {
        task: spec.task.clone(),
        region,
        host_path,
        plan,
    })
}

impl TaskShare {
    pub fn task(&self) -> &str {
        &self.task
    }
    pub fn plan(&self) -> &SandboxPlan {
        &self.plan
    }
    /// The mapped region (attach it to the device's compute monitor).
    pub fn region(&self) -> &Region {
        &self.region
    }
    pub fn host_path(&self) -> &Path {
        &self.host_path
    }
    pub fn usage(&self) -> TaskUsage {
        self.region.usage()
    }
    /// Removes the region (the task has ended, however it ended) and returns its
    /// final usage, for the usage record. Detach it from the monitor first.
    pub fn release(self) -> Result<TaskUsage, SetupError> {
        let usage = self.region.usage();
        match std::fs::remove_file(&self.host_path) {
            Ok(()) => Ok(usage),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(usage),
            Err(source) => Err(SetupError::Io {
                path: self.host_path,
                op: "remove",
                source,
            }),
        }
    }
}

fn check_interposer(p: &Path) -> Result<(), SetupError> {
    let bad = |why: &str| SetupError::Interposer {
        path: p.to_path_buf(),
        why: why.to_string(),
    };
    if !p.is_absolute() {
        return Err(bad("the interposer path must be absolute"));
    }
    let mut head = [0u8; 4];
    use std::io::Read;
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut head))
        .map_err(|e| bad(&format!("cannot read the interposer: {e}; build it with `cargo build -p tessera-gpushare-cuda --release`")))?;
    if head != *b"\x7fELF" {
        return Err(bad("not an ELF shared library"));
    }
    Ok(())
}

/// Finds `libtessera_cuda.so`: `$TESSERA_CUDA_INTERPOSER`, then next to the
/// running executable (and its `deps/`, as cargo leaves it), then
/// `/usr/lib/tessera/`.
pub fn find_interposer() -> Result<PathBuf, SetupError> {
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os(ENV_INTERPOSER) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            for d in [dir.to_path_buf(), dir.join("deps"), dir.join("..")] {
                let p = d.join(INTERPOSER_FILE);
                if p.is_file() {
                    return Ok(p.canonicalize().unwrap_or(p));
                }
                tried.push(p);
            }
        }
    }
    let p = Path::new("/usr/lib/tessera").join(INTERPOSER_FILE);
    if p.is_file() {
        return Ok(p);
    }
    tried.push(p);
    Err(SetupError::Interposer {
        path: PathBuf::from(INTERPOSER_FILE),
        why: format!(
            "not found (looked at {}); build it with `cargo build -p tessera-gpushare-cuda --release` or set {ENV_INTERPOSER}",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(task: &str) -> ShareSpec {
        ShareSpec {
            task: task.into(),
            devices: vec![DeviceConfig {
                memory_limit: 40 << 30,
                compute_milli: 400,
            }],
            memory_wait: Duration::from_secs(5),
            policy: ComputePolicy::WorkConserving,
        }
    }

    fn layout(dir: &Path) -> NodeLayout {
        // Any ELF file stands in for the interposer here.
        let exe = std::env::current_exe().unwrap();
        NodeLayout::new(dir.join("state"), exe)
    }

    #[test]
    fn plan_has_preload_binds_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let l = layout(dir.path());
        let s = prepare(&spec("job-1.a"), &l).unwrap();
        let p = s.plan();
        assert_eq!(p.files[0].path, Path::new("/etc/ld.so.preload"));
        assert_eq!(
            p.files[0].contents,
            b"/run/tessera/gpushare/libtessera_cuda.so\n"
        );
        assert_eq!(p.binds.len(), 2);
        assert!(!p.binds[0].writable && p.binds[1].writable);
        assert_eq!(p.binds[1].sandbox, Path::new(SANDBOX_REGION));
        let env: std::collections::BTreeMap<_, _> = p.env.iter().cloned().collect();
        assert_eq!(env[ENV_MEMORY_LIMIT], (40u64 << 30).to_string());
        assert_eq!(env[ENV_COMPUTE_MILLI], "400");
        assert_eq!(env[ENV_REGION], SANDBOX_REGION);
        let u = s.usage();
        assert_eq!(u.task, "job-1.a");
        assert_eq!(u.devices[0].memory_limit_bytes, 40 << 30);
        assert_eq!(u.devices[0].compute_milli, 400);
        let host = s.host_path().to_path_buf();
        assert!(host.exists());
        s.release().unwrap();
        assert!(!host.exists(), "release removes the region");
    }

    #[test]
    fn bad_inputs_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let l = layout(dir.path());
        for bad in ["", "..", "a/b", "x y", &"a".repeat(65)] {
            let e = prepare(&spec(bad), &l).unwrap_err().to_string();
            assert!(e.contains("task id"), "{e}");
        }
        let mut l2 = l.clone();
        l2.interposer = dir.path().join("missing.so");
        let e = prepare(&spec("t"), &l2).unwrap_err().to_string();
        assert!(e.contains("missing.so") && e.contains("cargo build"), "{e}");
        let mut s = spec("t");
        s.devices[0].compute_milli = 1001;
        let e = prepare(&s, &l).unwrap_err().to_string();
        assert!(e.contains("1001"), "{e}");
        assert!(
            !l.state_dir.join("t.region").exists(),
            "nothing left behind"
        );
        let s = prepare(&spec("dup"), &l).unwrap();
        let e = prepare(&spec("dup"), &l).unwrap_err().to_string();
        assert!(e.contains("dup.region"), "{e}");
        s.release().unwrap();
    }
}
