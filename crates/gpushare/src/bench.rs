//! `tessera bench gpushare`: the interposer on the CI fake driver.
//!
//! - Overhead: the same fake entry point called directly and through the
//!   interposer, alternately, in this process (the interposer is opened with
//!   `RTLD_LOCAL`, so it interposes nothing else here): allocation
//!   (`cuMemAlloc_v2` + `cuMemFree_v2` of 4 KiB, each timed) and launch
//!   (`cuLaunchKernel` of a zero-length fake kernel, compute slicing on, bucket
//!   not in debt — the fast path every launch takes). Overhead = interposed −
//!   direct, per percentile. What the fake's own calls cost is not in it; a real
//!   driver's are far slower than the fake's, so the overhead is the same there
//!   and the ratio smaller.
//! - Caps: processes of one task race past its cap; the fake driver's own peak
//!   must stay under it.
//! - Shares: two tasks with 30 % and 70 % shares, both saturating, on the
//!   simulated device (fake clock), and one alone (work conservation).

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::fake::{self, FakeBuild, FakeError, ShareScenario};
use crate::region::{ComputePolicy, DeviceConfig, Region, RegionConfig};

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub interposer: PathBuf,
    /// Timed calls per path and kind.
    pub iterations: usize,
    /// Simulated ticks of the share scenarios.
    pub ticks: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub iterations: usize,
    pub alloc_direct_p50_us: f64,
    pub alloc_interposed_p50_us: f64,
    pub alloc_overhead_p50_us: f64,
    pub alloc_overhead_p99_us: f64,
    pub free_overhead_p50_us: f64,
    pub free_overhead_p99_us: f64,
    pub launch_direct_p50_us: f64,
    pub launch_interposed_p50_us: f64,
    pub launch_overhead_p50_us: f64,
    pub launch_overhead_p99_us: f64,
    pub caps_held: bool,
    pub cap_bytes: u64,
    pub cap_attempted_bytes: u64,
    pub cap_peak_bytes: u64,
    pub cap_refused_allocations: u64,
    pub share_target_pct: Vec<f64>,
    pub share_achieved_pct: Vec<f64>,
    pub share_error_max_pct: f64,
    pub share_utilization_pct: f64,
    pub alone_share_pct: f64,
    pub share_ticks: u64,
    pub share_wall_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Fake(#[from] FakeError),
    #[error("{0}")]
    Other(String),
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Paired {
    direct: Vec<f64>,
    interposed: Vec<f64>,
}

impl Paired {
    fn new(n: usize) -> Self {
        Paired {
            direct: Vec::with_capacity(n),
            interposed: Vec::with_capacity(n),
        }
    }
    fn finish(mut self) -> (f64, f64, f64, f64) {
        self.direct.sort_by(f64::total_cmp);
        self.interposed.sort_by(f64::total_cmp);
        let (d50, i50) = (pct(&self.direct, 0.5), pct(&self.interposed, 0.5));
        let (d99, i99) = (pct(&self.direct, 0.99), pct(&self.interposed, 0.99));
        (d50, i50, (i50 - d50).max(0.0), (i99 - d99).max(0.0))
    }
}

type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> i32;
type FreeFn = unsafe extern "C" fn(u64) -> i32;
type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> i32;

fn get<T: Copy>(h: &fake::Library, name: &str) -> Result<T, FakeError> {
    let p = h.symbol(name)?;
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `T` is the C signature of `name` in the fake driver and the
    // interposer (checked above to be pointer-sized).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn time_us(f: impl FnOnce() -> i32) -> Result<f64, BenchError> {
    let t = Instant::now();
    let rc = f();
    let dt = t.elapsed().as_secs_f64() * 1e6;
    if rc != 0 {
        return Err(BenchError::Other(format!(
            "a measured call failed: CUresult {rc}"
        )));
    }
    Ok(dt)
}

/// Overhead per call, in this process. The environment variable the interposer
/// reads is set here: call this before starting other threads.
fn overhead(
    build: &FakeBuild,
    interposer: &Path,
    work: &Path,
    n: usize,
) -> Result<[f64; 10], BenchError> {
    let rp = work.join("overhead.region");
    let _ = std::fs::remove_file(&rp);
    let region = Region::create(
        &rp,
        &RegionConfig {
            task: "bench".into(),
            devices: vec![DeviceConfig {
                memory_limit: 1 << 40,
                compute_milli: 500,
            }],
            memory_wait: Duration::ZERO,
            policy: ComputePolicy::WorkConserving,
        },
    )
    .map_err(FakeError::from)?;
    // SAFETY: the benchmark runs this before any other thread of the process
    // reads the environment (the CLI is single-threaded here).
    unsafe { std::env::set_var("TESSERA_GPUSHARE_REGION", &rp) };
    let fk = fake::Library::open(&build.lib)?;
    let drv = fake::FakeDriver::load(build)?;
    // A monitor that just ticked, with a bucket far from debt: the launch fast path.
    region.tick(
        drv.clock_ns(),
        drv.clock_ns() + 1_000_000_000,
        1_000_000_000,
    );
    let ip = fake::Library::open(interposer)?;
    let init: unsafe extern "C" fn(u32) -> i32 = get(&ip, "cuInit")?;
    // SAFETY: cuInit(0) through the interposer (and the fake behind it).
    let rc = unsafe { init(0) };
    if rc != 0 {
        return Err(BenchError::Other(format!(
            "cuInit through the interposer failed: CUresult {rc} (see tessera-cuda's message above)"
        )));
    }
    let (da, ia): (AllocFn, AllocFn) = (get(&fk, "cuMemAlloc_v2")?, get(&ip, "cuMemAlloc_v2")?);
    let (df, iff): (FreeFn, FreeFn) = (get(&fk, "cuMemFree_v2")?, get(&ip, "cuMemFree_v2")?);
    let (dl, il): (LaunchFn, LaunchFn) = (get(&fk, "cuLaunchKernel")?, get(&ip, "cuLaunchKernel")?);
    let load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32 =
        get(&fk, "cuModuleLoadData")?;
    let getf: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const std::ffi::c_char) -> i32 =
        get(&fk, "cuModuleGetFunction")?;
    let mut module = std::ptr::null_mut();
    let mut func = std::ptr::null_mut();
    // SAFETY: fake module and function lookups with valid out-pointers.
    unsafe {
        load(&mut module, std::ptr::null());
        getf(&mut func, module, c"spin_0".as_ptr());
    }
    let mut alloc = Paired::new(n);
    let mut free = Paired::new(n);
    let mut launch = Paired::new(n);
    let null = std::ptr::null_mut();
    let warm = n / 10 + 10;
    for i in 0..n + warm {
        let keep = i >= warm;
        for (a, f, direct) in [(da, df, true), (ia, iff, false)] {
            let mut p = 0u64;
            // SAFETY: fake/interposed calls with valid out-pointers; the pointer is
            // freed by the same path that allocated it.
            let ta = time_us(|| unsafe { a(&mut p, 4096) })?;
            // SAFETY: as above.
            let tf = time_us(|| unsafe { f(p) })?;
            // SAFETY: a fake kernel of zero length, no parameters.
            let tl = time_us(|| unsafe {
                (if direct { dl } else { il })(
                    func,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    null,
                    null.cast(),
                    null.cast(),
                )
            })?;
            if keep {
                let (va, vf, vl) = if direct {
                    (&mut alloc.direct, &mut free.direct, &mut launch.direct)
                } else {
                    (
                        &mut alloc.interposed,
                        &mut free.interposed,
                        &mut launch.interposed,
                    )
                };
                va.push(ta);
                vf.push(tf);
                vl.push(tl);
            }
        }
    }
    let used = region.usage().devices[0].memory_used_bytes;
    if used != 0 {
        return Err(BenchError::Other(format!(
            "the interposer's accounting did not return to zero after balanced allocations ({used} bytes)"
        )));
    }
    let (ad, ai, ao50, ao99) = alloc.finish();
    let (_, _, fo50, fo99) = free.finish();
    let (ld, li, lo50, lo99) = launch.finish();
    let _ = std::fs::remove_file(&rp);
    Ok([ad, ai, ao50, ao99, fo50, fo99, ld, li, lo50, lo99])
}

pub fn run(cfg: &BenchConfig) -> Result<BenchReport, BenchError> {
    let work =
        tempfile::tempdir().map_err(|e| BenchError::Other(format!("temporary folder: {e}")))?;
    let build = fake::build(&work.path().join("fake"), &[])?;
    let [ad, ai, ao50, ao99, fo50, fo99, ld, li, lo50, lo99] = overhead(
        &build,
        &cfg.interposer,
        work.path(),
        cfg.iterations.max(100),
    )?;

    let limit = 64 << 20;
    let cap = fake::run_cap_scenario(&build, &cfg.interposer, work.path(), 4, 8, 4 << 20, limit)?;

    let shares = fake::run_share_scenario(
        &build,
        &cfg.interposer,
        &work.path().join("share"),
        &ShareScenario {
            ticks: cfg.ticks,
            warmup_ticks: (cfg.ticks / 10).min(200),
            ..ShareScenario::default()
        },
    )?;
    let alone = fake::run_share_scenario(
        &build,
        &cfg.interposer,
        &work.path().join("alone"),
        &ShareScenario {
            weights: vec![300],
            ticks: (cfg.ticks / 3).max(100),
            warmup_ticks: 20,
            ..ShareScenario::default()
        },
    )?;
    let targets = [30.0, 70.0];
    let achieved: Vec<f64> = shares.shares.iter().map(|s| s * 100.0).collect();
    let err = achieved
        .iter()
        .zip(targets)
        .map(|(a, t)| (a - t).abs())
        .fold(0.0, f64::max);
    Ok(BenchReport {
        iterations: cfg.iterations.max(100),
        alloc_direct_p50_us: ad,
        alloc_interposed_p50_us: ai,
        alloc_overhead_p50_us: ao50,
        alloc_overhead_p99_us: ao99,
        free_overhead_p50_us: fo50,
        free_overhead_p99_us: fo99,
        launch_direct_p50_us: ld,
        launch_interposed_p50_us: li,
        launch_overhead_p50_us: lo50,
        launch_overhead_p99_us: lo99,
        caps_held: cap.peak <= cap.limit && cap.granted <= cap.limit,
        cap_bytes: cap.limit,
        cap_attempted_bytes: cap.attempted,
        cap_peak_bytes: cap.peak,
        cap_refused_allocations: cap.refused,
        share_target_pct: targets.to_vec(),
        share_achieved_pct: achieved,
        share_error_max_pct: err,
        share_utilization_pct: shares.utilization * 100.0,
        alone_share_pct: alone.busy_fraction[0] * 100.0,
        share_ticks: cfg.ticks,
        share_wall_ms: (shares.wall + alone.wall).as_millis() as u64,
    })
}
