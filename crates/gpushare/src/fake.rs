//! The CI fake driver: a `libcuda.so.1` (and `libnvidia-ml.so.1`) built from
//! `fake/fake_cuda.c` with the system C compiler, a CUDA probe program
//! (`fake/probe.c`), and the scenarios that the tests and `tessera bench
//! gpushare` run on them: several tasks' processes under the interposer on one
//! simulated device, with this process as the node's compute monitor.
//!
//! The fake device is a discrete-event simulation across processes: its clock
//! moves only when every process using it waits, so shares measured on it do
//! not depend on how loaded the machine is.

use std::collections::BTreeMap;
use std::ffi::{CString, c_void};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::monitor::DeviceMonitor;
use crate::nvml::{NvmlSampler, busy_by_task};
use crate::region::{ComputePolicy, DeviceConfig, Region, RegionConfig};
use crate::share::ControllerConfig;

pub const FAKE_CUDA_C: &str = include_str!("../fake/fake_cuda.c");
pub const PROBE_C: &str = include_str!("../fake/probe.c");

#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    #[error(
        "no C compiler: `{0}` did not run (install gcc, or set CC); the fake CUDA driver is built from C"
    )]
    NoCompiler(String),
    #[error("building {what} failed:\n{stderr}")]
    Build { what: String, stderr: String },
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("{0}")]
    Dl(String),
    #[error("scenario: {0}")]
    Scenario(String),
    #[error(transparent)]
    Region(#[from] crate::region::RegionError),
    #[error(transparent)]
    Usage(#[from] crate::nvml::UsageError),
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> FakeError + 'a {
    move |source| FakeError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// The C compiler: `$CC`, else `cc`, if it runs.
pub fn compiler() -> Result<String, FakeError> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    match Command::new(&cc).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(cc),
        _ => Err(FakeError::NoCompiler(cc)),
    }
}

/// A built fake driver and probe.
#[derive(Debug, Clone)]
pub struct FakeBuild {
    pub dir: PathBuf,
    /// `dir/libcuda.so.1` (also linked as `libnvidia-ml.so.1`).
    pub lib: PathBuf,
    pub probe: PathBuf,
}

/// Builds the fake into `dir` (created), with extra `-D` defines (e.g.
/// `FAKECUDA_OMIT_CTX_GET_DEVICE`).
pub fn build(dir: &Path, defines: &[&str]) -> Result<FakeBuild, FakeError> {
    let cc = compiler()?;
    std::fs::create_dir_all(dir).map_err(io(dir, "create folder"))?;
    let src = dir.join("fake_cuda.c");
    let probe_src = dir.join("probe.c");
    std::fs::write(&src, FAKE_CUDA_C).map_err(io(&src, "write"))?;
    std::fs::write(&probe_src, PROBE_C).map_err(io(&probe_src, "write"))?;
    let lib = dir.join("libcuda.so.1");
    let mut c = Command::new(&cc);
    c.args([
        "-shared",
        "-fPIC",
        "-O2",
        "-fvisibility=hidden",
        // Calls between its own entry points stay inside the fake, as in a real
        // driver (not through the interposer).
        "-Wl,-Bsymbolic",
        "-Wl,-soname,libcuda.so.1",
    ])
    .args(defines.iter().map(|d| format!("-D{d}")))
    .arg("-o")
    .arg(&lib)
    .arg(&src)
    .arg("-lpthread");
    run_cc(c, "the fake libcuda.so.1")?;
    for alias in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        let a = dir.join(alias);
        let _ = std::fs::remove_file(&a);
        std::os::unix::fs::symlink("libcuda.so.1", &a).map_err(io(&a, "symlink"))?;
    }
    let probe = dir.join("probe");
    let mut c = Command::new(&cc);
    c.args(["-O1", "-o"])
        .arg(&probe)
        .arg(&probe_src)
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg("-ldl");
    run_cc(c, "the CUDA probe")?;
    Ok(FakeBuild {
        dir: dir.to_path_buf(),
        lib,
        probe,
    })
}

fn run_cc(mut c: Command, what: &str) -> Result<(), FakeError> {
    let o = c.output().map_err(|e| FakeError::Build {
        what: what.into(),
        stderr: e.to_string(),
    })?;
    if !o.status.success() {
        return Err(FakeError::Build {
            what: what.into(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        });
    }
    Ok(())
}

impl FakeBuild {
    /// A probe process running `steps`: with the interposer preloaded when given,
    /// the region and the fake device's state file when given, nothing else of
    /// this process's CUDA-related environment.
    pub fn probe(
        &self,
        interposer: Option<&Path>,
        region: Option<&Path>,
        state: Option<&Path>,
        steps: &[&str],
    ) -> Command {
        let mut c = Command::new(&self.probe);
        c.args(steps)
            .env("LD_LIBRARY_PATH", &self.dir)
            .env_remove("LD_PRELOAD")
            .env_remove("TESSERA_GPUSHARE_REGION")
            .env_remove("FAKECUDA_STATE")
            .stdin(Stdio::null());
        if let Some(i) = interposer {
            c.env("LD_PRELOAD", i);
        }
        if let Some(r) = region {
            c.env("TESSERA_GPUSHARE_REGION", r);
        }
        if let Some(s) = state {
            c.env("FAKECUDA_STATE", s);
        }
        c
    }
}

unsafe extern "C" {
    fn dlopen(file: *const std::ffi::c_char, mode: i32) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const std::ffi::c_char) -> *mut c_void;
    fn dlerror() -> *mut std::ffi::c_char;
}

/// A shared library opened in this process (`RTLD_NOW | RTLD_LOCAL`); never
/// closed (the scenarios and the benchmark keep calling into it).
#[derive(Debug, Clone, Copy)]
pub struct Library(*mut c_void);

impl Library {
    pub fn open(path: &Path) -> Result<Library, FakeError> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| FakeError::Dl(format!("{}: path has a NUL byte", path.display())))?;
        // SAFETY: a NUL-terminated path; the library's constructors are the
        // fake's or the interposer's, neither of which has any.
        let h = unsafe { dlopen(c.as_ptr(), 2) };
        if h.is_null() {
            // SAFETY: dlerror returns a NUL-terminated string or null.
            let e = unsafe {
                let e = dlerror();
                if e.is_null() {
                    String::from("unknown error")
                } else {
                    std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
                }
            };
            return Err(FakeError::Dl(format!("dlopen {}: {e}", path.display())));
        }
        Ok(Library(h))
    }

    /// The address of symbol `name`.
    pub fn symbol(&self, name: &str) -> Result<*mut c_void, FakeError> {
        let c = CString::new(name).map_err(|_| FakeError::Dl(format!("bad name {name:?}")))?;
        // SAFETY: a handle from dlopen (never closed) and a NUL-terminated name.
        let p = unsafe { dlsym(self.0, c.as_ptr()) };
        if p.is_null() {
            return Err(FakeError::Dl(format!("no symbol {name}")));
        }
        Ok(p)
    }
}

/// The fake driver loaded in this process: the harness side of the simulation.
#[derive(Debug, Clone, Copy)]
pub struct FakeDriver {
    attach: unsafe extern "C" fn(*const std::ffi::c_char) -> i32,
    participate: unsafe extern "C" fn(),
    leave: unsafe extern "C" fn(),
    clock: unsafe extern "C" fn() -> u64,
    sleep_until: unsafe extern "C" fn(u64),
    participants: unsafe extern "C" fn() -> u32,
    busy: unsafe extern "C" fn(i32) -> u64,
    busy_in_pidns: unsafe extern "C" fn(u64) -> u64,
    mem_peak: unsafe extern "C" fn() -> u64,
}

macro_rules! load {
    ($h:expr, $name:literal as $ty:ty) => {{
        let p = $h.symbol($name)?;
        // SAFETY: the fake driver defines this symbol with this signature.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

impl FakeDriver {
    pub fn load(build: &FakeBuild) -> Result<Self, FakeError> {
        let h = Library::open(&build.lib)?;
        Ok(FakeDriver {
            attach: load!(
                h,
                "fakecudaAttach" as unsafe extern "C" fn(*const std::ffi::c_char) -> i32
            ),
            participate: load!(h, "fakecudaParticipate" as unsafe extern "C" fn()),
            leave: load!(h, "fakecudaLeave" as unsafe extern "C" fn()),
            clock: load!(h, "fakecudaClockNs" as unsafe extern "C" fn() -> u64),
            sleep_until: load!(h, "fakecudaSleepUntilNs" as unsafe extern "C" fn(u64)),
            participants: load!(h, "fakecudaParticipants" as unsafe extern "C" fn() -> u32),
            busy: load!(h, "fakecudaBusyNs" as unsafe extern "C" fn(i32) -> u64),
            busy_in_pidns: load!(h, "fakecudaBusyInPidNs" as unsafe extern "C" fn(u64) -> u64),
            mem_peak: load!(h, "fakecudaMemPeak" as unsafe extern "C" fn() -> u64),
        })
    }
    /// Points this process at the device of state file `path`.
    pub fn attach(&self, path: &Path) -> Result<(), FakeError> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| FakeError::Dl("state path has a NUL byte".into()))?;
        // SAFETY: NUL-terminated path.
        if unsafe { (self.attach)(c.as_ptr()) } != 0 {
            return Err(FakeError::Dl(format!(
                "cannot attach to {}",
                path.display()
            )));
        }
        Ok(())
    }
    /// Registers this process in the simulation (it now holds the clock until it
    /// waits).
    pub fn participate(&self) {
        // SAFETY: no arguments.
        unsafe { (self.participate)() }
    }
    pub fn leave(&self) {
        // SAFETY: no arguments.
        unsafe { (self.leave)() }
    }
    pub fn clock_ns(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.clock)() }
    }
    pub fn sleep_until(&self, t: u64) {
        // SAFETY: plain integer.
        unsafe { (self.sleep_until)(t) }
    }
    pub fn participants(&self) -> u32 {
        // SAFETY: no arguments.
        unsafe { (self.participants)() }
    }
    /// Device time process `pid` has used (exact; 0 once it has left).
    pub fn busy_ns(&self, pid: u32) -> u64 {
        // SAFETY: plain integer.
        unsafe { (self.busy)(pid as i32) }
    }
    /// Device time the processes of pid namespace `ns` (the inode of
    /// `/proc/<pid>/ns/pid`: a sandbox) that are still there have used.
    pub fn busy_in_pidns(&self, ns: u64) -> u64 {
        // SAFETY: plain integer.
        unsafe { (self.busy_in_pidns)(ns) }
    }
    pub fn mem_peak(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { (self.mem_peak)() }
    }
}

/// The harness is one participant per process: scenarios run one at a time.
static SCENARIO: Mutex<()> = Mutex::new(());

/// Holds this process's fake driver for the caller (the scenarios take it too):
/// [`FakeDriver::attach`] points the whole process at one fake device.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    SCENARIO.lock().unwrap_or_else(|p| p.into_inner())
}

/// Several tasks on one simulated GPU, each a probe process launching kernels
/// back to back under the interposer; this process is the node's monitor.
#[derive(Debug, Clone)]
pub struct ShareScenario {
    /// Milli-GPU per task.
    pub weights: Vec<u32>,
    pub policy: ComputePolicy,
    /// Launch kind each probe uses (`kernel`, `ex`, `coop`, `graph`, `legacy`),
    /// and through which lookup (`d`, `h`, `p`, `p2`, `pt`).
    pub kind: String,
    pub mode: String,
    pub kernel_ns: u64,
    pub tick_ns: u64,
    pub ticks: u64,
    /// Ticks left out of the measured shares at the start.
    pub warmup_ticks: u64,
    /// SIGKILL task `.0`'s process at tick `.1`, release its share, and measure
    /// the others from then on.
    pub kill: Option<(usize, u64)>,
}

impl Default for ShareScenario {
    fn default() -> Self {
        ShareScenario {
            weights: vec![300, 700],
            policy: ComputePolicy::WorkConserving,
            kind: "kernel".into(),
            mode: "d".into(),
            kernel_ns: 200_000,
            tick_ns: 2_000_000,
            ticks: 1500,
            warmup_ticks: 100,
            kill: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ShareOutcome {
    /// Per task: fraction of the measured device time it used (measured window).
    pub shares: Vec<f64>,
    /// Per task: fraction of the measured window's elapsed time it used.
    pub busy_fraction: Vec<f64>,
    /// Fraction of the measured window the device was busy.
    pub utilization: f64,
    /// After a kill: per task, fraction of elapsed time used from the kill on
    /// (the killed task's entry is 0).
    pub after_kill: Option<Vec<f64>>,
    /// Exact device time per task from the fake's own accounting (ns; the
    /// killed task's as of its death is unknown: 0).
    pub exact_busy_ns: Vec<u64>,
    pub elapsed_ns: u64,
    /// Launches that waited, per task (from the regions).
    pub throttle_events: Vec<u64>,
    pub wall: Duration,
}

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs a [`ShareScenario`] in `work` (a scratch folder).
pub fn run_share_scenario(
    build: &FakeBuild,
    interposer: &Path,
    work: &Path,
    s: &ShareScenario,
) -> Result<ShareOutcome, FakeError> {
    let _one = exclusive();
    let started = Instant::now();
    std::fs::create_dir_all(work).map_err(io(work, "create folder"))?;
    let state = work.join("device.state");
    let _ = std::fs::remove_file(&state);
    let fake = FakeDriver::load(build)?;
    fake.attach(&state)?;
    fake.participate();
    let mut sampler = NvmlSampler::open_library(&build.lib)?;
    let mut monitor = DeviceMonitor::new(ControllerConfig {
        tick_ns: s.tick_ns,
        ..ControllerConfig::default()
    });
    let n = s.weights.len();
    let mut regions = Vec::new();
    let mut procs = Procs(Vec::new());
    let mut pid_task: BTreeMap<u32, String> = BTreeMap::new();
    let ns = s.kernel_ns.to_string();
    for (i, &w) in s.weights.iter().enumerate() {
        let task = format!("t{i}");
        let rp = work.join(format!("{task}.region"));
        let _ = std::fs::remove_file(&rp);
        let region = Region::create(
            &rp,
            &RegionConfig {
                task: task.clone(),
                devices: vec![DeviceConfig {
                    memory_limit: 1 << 30,
                    compute_milli: w,
                }],
                memory_wait: Duration::ZERO,
                policy: s.policy,
            },
        )?;
        monitor.attach(&task, region.clone(), 0);
        let child = build
            .probe(
                Some(interposer),
                Some(&rp),
                Some(&state),
                &["mode", &s.mode, "init", "forever", &s.kind, &ns],
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io(&build.probe, "spawn"))?;
        pid_task.insert(child.id(), task);
        procs.0.push(child);
        regions.push(region);
    }
    // Wait (holding the clock) until every probe has joined the simulation.
    let deadline = Instant::now() + Duration::from_secs(20);
    while fake.participants() < n as u32 + 1 {
        if Instant::now() > deadline {
            fake.leave();
            return Err(FakeError::Scenario(format!(
                "only {} of {n} probes reached cuInit in 20 s",
                fake.participants().saturating_sub(1)
            )));
        }
        for c in &mut procs.0 {
            if let Ok(Some(st)) = c.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = c.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                fake.leave();
                return Err(FakeError::Scenario(format!(
                    "a probe exited early ({st}): {err}"
                )));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut per_tick: Vec<BTreeMap<String, u64>> = Vec::new();
    let mut killed: Option<usize> = None;
    let watchdog = Instant::now() + Duration::from_secs(120);
    let t0 = fake.clock_ns();
    for k in 1..=s.ticks {
        fake.sleep_until(t0 + k * s.tick_ns);
        let now = fake.clock_ns();
        let by_pid = sampler.busy_by_pid(0)?;
        let busy = busy_by_task(&by_pid, |p| pid_task.get(&p).cloned());
        monitor.tick(now, &busy);
        per_tick.push(busy);
        if let Some((victim, at)) = s.kill {
            if k == at && killed.is_none() {
                let c = &mut procs.0[victim];
                let _ = c.kill();
                let _ = c.wait();
                monitor.detach(&format!("t{victim}"));
                killed = Some(victim);
            }
        }
        if Instant::now() > watchdog {
            fake.leave();
            return Err(FakeError::Scenario(format!(
                "the simulation did not finish {} ticks in 120 s (at tick {k})",
                s.ticks
            )));
        }
    }
    let exact: Vec<u64> = procs.0.iter().map(|c| fake.busy_ns(c.id())).collect();
    fake.leave();
    let throttle_events = regions
        .iter()
        .map(|r| r.usage().devices[0].throttle_events)
        .collect();
    drop(procs);
    for r in &regions {
        let _ = std::fs::remove_file(r.path());
    }
    let _ = std::fs::remove_file(&state);

    let window = |from: u64, to: u64| -> Vec<u64> {
        (0..n)
            .map(|i| {
                per_tick[from as usize..to as usize]
                    .iter()
                    .map(|t| t.get(&format!("t{i}")).copied().unwrap_or(0))
                    .sum()
            })
            .collect()
    };
    let end = s.kill.map(|(_, at)| at).unwrap_or(s.ticks).min(s.ticks);
    let from = s.warmup_ticks.min(end);
    let used = window(from, end);
    let total: u64 = used.iter().sum();
    let elapsed = (end - from) * s.tick_ns;
    let after_kill = s.kill.map(|(_, at)| {
        // From one controller window after the kill.
        let from = (at + 20).min(s.ticks);
        let u = window(from, s.ticks);
        let el = ((s.ticks - from) * s.tick_ns).max(1) as f64;
        u.iter().map(|&b| b as f64 / el).collect()
    });
    Ok(ShareOutcome {
        shares: used
            .iter()
            .map(|&u| u as f64 / total.max(1) as f64)
            .collect(),
        busy_fraction: used
            .iter()
            .map(|&u| u as f64 / elapsed.max(1) as f64)
            .collect(),
        utilization: total as f64 / elapsed.max(1) as f64,
        after_kill,
        exact_busy_ns: exact,
        elapsed_ns: s.ticks * s.tick_ns,
        throttle_events,
        wall: started.elapsed(),
    })
}

/// Several processes of one task race to allocate more than its cap, then hold
/// what they got; the fake driver's own peak (not the interposer's accounting)
/// is compared with the cap.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CapOutcome {
    pub limit: u64,
    pub attempted: u64,
    pub granted: u64,
    pub refused: u64,
    /// The fake device's peak memory use while they held it.
    pub peak: u64,
}

pub fn run_cap_scenario(
    build: &FakeBuild,
    interposer: &Path,
    work: &Path,
    procs: usize,
    allocs_per_proc: usize,
    alloc_bytes: u64,
    limit: u64,
) -> Result<CapOutcome, FakeError> {
    std::fs::create_dir_all(work).map_err(io(work, "create folder"))?;
    let state = work.join("cap.state");
    let rp = work.join("cap.region");
    let _ = std::fs::remove_file(&state);
    let _ = std::fs::remove_file(&rp);
    let region = Region::create(
        &rp,
        &RegionConfig {
            task: "cap".into(),
            devices: vec![DeviceConfig {
                memory_limit: limit,
                compute_milli: 1000,
            }],
            memory_wait: Duration::ZERO,
            policy: ComputePolicy::WorkConserving,
        },
    )?;
    let size = alloc_bytes.to_string();
    let mut steps: Vec<&str> = vec!["init"];
    for _ in 0..allocs_per_proc {
        steps.extend(["alloc", &size]);
    }
    steps.push("hold");
    let mut children = Procs(Vec::new());
    let mut outs = Vec::new();
    for _ in 0..procs {
        let mut c = build
            .probe(Some(interposer), Some(&rp), Some(&state), &steps)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io(&build.probe, "spawn"))?;
        outs.push(BufReader::new(c.stdout.take().expect("piped")));
        children.0.push(c);
    }
    let (mut granted, mut refused) = (0u64, 0u64);
    for out in &mut outs {
        for line in out.lines() {
            let line = line.map_err(io(&build.probe, "read"))?;
            if line == "holding" {
                break;
            }
            if line.starts_with("alloc ") {
                if line.ends_with("rc=0") {
                    granted += alloc_bytes;
                } else {
                    refused += 1;
                }
            }
        }
    }
    // Everyone holds what it got: read the device's peak from a bystander probe.
    let o = build
        .probe(None, None, Some(&state), &["peak"])
        .output()
        .map_err(io(&build.probe, "run"))?;
    let text = String::from_utf8_lossy(&o.stdout);
    let peak = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| FakeError::Scenario(format!("bad peak line {text:?}")))?;
    for c in &mut children.0 {
        if let Some(mut i) = c.stdin.take() {
            let _ = i.flush();
        }
    }
    drop(children);
    drop(region);
    let _ = std::fs::remove_file(&rp);
    let _ = std::fs::remove_file(&state);
    Ok(CapOutcome {
        limit,
        attempted: (procs * allocs_per_proc) as u64 * alloc_bytes,
        granted,
        refused,
        peak,
    })
}
