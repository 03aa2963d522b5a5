//! `tessera bench sandbox`: cold create, warm claim, first exec, sustained creations,
//! idle memory. Needs root (user-namespace id ranges and cgroups).
//!
//! For the fastest starts build the small init next to `tessera`:
//! `cargo build --release -p tessera -p tessera-sandbox`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tessera_sandbox::{ExecRequest, PoolConfig, Runtime, SandboxSpec, WarmPool};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandboxes per measurement.
    #[arg(long, default_value_t = 200)]
    pub count: usize,
    /// Threads creating and destroying in the sustained-rate measurement.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    /// `namespace` (the default: the measurements above) or `microvm`: both tiers
    /// side by side through the tier trait (boot, boot to first command, exec, snapshot,
    /// restore, idle memory) and a bare QEMU boot of the same kernel, `--vm-count`
    /// sandboxes each.
    #[arg(long, value_name = "TIER", default_value = "namespace")]
    pub tier: tessera_sandbox::TierKind,
    /// With --tier microvm: the kernel template (`tessera template build --kernel`).
    #[arg(long, value_name = "DIR", env = "TESSERA_VM_KERNEL_TEMPLATE")]
    pub vm_kernel: Option<std::path::PathBuf>,
    /// With --tier microvm: sandboxes (and bare boots) per tier.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub vm_count: usize,
}

#[derive(Debug, Serialize)]
struct Report {
    count: usize,
    concurrency: usize,
    cores: usize,
    cgroups: Option<&'static str>,
    init_program: String,
    cold_create_p50_ms: f64,
    cold_create_p99_ms: f64,
    /// Minimum: the least disturbed sample, useful on a busy machine.
    cold_create_min_ms: f64,
    destroy_p50_ms: f64,
    warm_claim_p50_us: f64,
    warm_claim_p99_us: f64,
    first_exec_p50_ms: f64,
    first_exec_p99_ms: f64,
    exec_true_p50_ms: f64,
    exec_true_min_ms: f64,
    creations_per_min: f64,
    creations_per_min_per_core: f64,
    idle_sandbox_rss_kib: f64,
    pool_misses: u64,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    super::percentile(v, p).unwrap_or(f64::NAN)
}

pub fn run(a: Args) -> i32 {
    if a.count == 0 || a.concurrency == 0 {
        return fail(
            EXIT_BAD_INPUT,
            "--count and --concurrency must be at least 1",
        );
    }
    if a.tier == tessera_sandbox::TierKind::Microvm {
        let Some(k) = &a.vm_kernel else {
            return fail(
                EXIT_BAD_INPUT,
                "--tier microvm needs a kernel template: give --vm-kernel DIR (or set TESSERA_VM_KERNEL_TEMPLATE)",
            );
        };
        if a.vm_count == 0 {
            return fail(EXIT_BAD_INPUT, "--vm-count must be at least 1");
        }
        return match super::tiers::bench(k, a.vm_count) {
            Ok(r) if a.json => print_json(&r),
            Ok(r) => {
                super::tiers::print_table(&r);
                0
            }
            Err(e) => fail(EXIT_FAILURE, e),
        };
    }
    match bench(&a) {
        Ok(r) => {
            if a.json {
                print_json(&r)
            } else {
                print_table(&r);
                0
            }
        }
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

fn bench(a: &Args) -> Result<Report, String> {
    let rt = crate::cmd::sandbox::sandbox_runtime(false)?;
    let init = crate::cmd::sandbox::init_program()
        .map(|p| {
            format!("{} {}", p.path.display(), p.args.join(" "))
                .trim()
                .to_string()
        })
        .unwrap_or_default();
    let spec = SandboxSpec::default();
    let n = a.count;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let true_req = ExecRequest::argv(["true"]).timeout(Duration::from_secs(10));

    // Warm-up (page cache, lazy kernel state).
    for _ in 0..5 {
        rt.spawn(&spec)
            .map_err(|e| e.to_string())?
            .destroy()
            .map_err(|e| e.to_string())?;
    }

    // Cold create: spec to ready, one at a time.
    eprintln!("cold create x{n}");
    let mut cold = Vec::with_capacity(n);
    let mut destroy = Vec::with_capacity(n);
    let mut exec_true = Vec::new();
    let mut rss = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        let sb = rt.spawn(&spec).map_err(|e| e.to_string())?;
        cold.push(t.elapsed().as_secs_f64() * 1e3);
        if i < 20 {
            rss.push(sb.init_rss_kib().unwrap_or(0) as f64);
            for _ in 0..5 {
                let t = Instant::now();
                let out = sb.exec(&true_req).map_err(|e| e.to_string())?;
                exec_true.push(t.elapsed().as_secs_f64() * 1e3);
                if !out.status.success() {
                    return Err(format!("`true` failed in a sandbox: {:?}", out.status));
                }
            }
        }
        let t = Instant::now();
        sb.destroy().map_err(|e| e.to_string())?;
        destroy.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // Warm claim and first exec from a filled pool. Claims are spaced so that the pool
    // keeps up; what is measured is the hand-over itself.
    eprintln!("warm claim x{n}");
    let batch = 16.min(n);
    let mut pool = WarmPool::new(
        rt.clone(),
        spec.clone(),
        PoolConfig {
            min: batch,
            max: batch * 2,
            horizon: Duration::from_millis(200),
            workers: cores.max(1),
        },
    );
    let mut claim = Vec::with_capacity(n);
    let mut first = Vec::with_capacity(n);
    // Measured with refills paused, so that background creation does not compete for
    // the CPU with what is measured (on 2 cores it would); claimed sandboxes are held
    // until the batch ends, then released for background destruction.
    let mut done = 0;
    while done < n {
        pool.set_paused(false);
        if pool.fill(batch, Duration::from_secs(30)) < batch {
            return Err(format!("pool did not fill: {:?}", pool.last_error()));
        }
        pool.set_paused(true);
        let mut held = Vec::with_capacity(batch);
        for _ in 0..batch.min(n - done) {
            let t = Instant::now();
            let sb = pool.try_claim().ok_or("pool ran dry")?;
            claim.push(t.elapsed().as_secs_f64() * 1e6);
            held.push(sb);
            done += 1;
        }
        held.into_iter().for_each(|sb| pool.release(sb));
    }
    let mut done = 0;
    while done < n {
        pool.set_paused(false);
        if pool.fill(batch, Duration::from_secs(30)) < batch {
            return Err(format!("pool did not fill: {:?}", pool.last_error()));
        }
        // Let the workers finish destroying the previous batch first.
        while pool.stats().creating > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        pool.set_paused(true);
        let mut held = Vec::with_capacity(batch);
        for _ in 0..batch.min(n - done) {
            let t = Instant::now();
            let sb = pool.try_claim().ok_or("pool ran dry")?;
            let out = sb.exec(&true_req).map_err(|e| e.to_string())?;
            first.push(t.elapsed().as_secs_f64() * 1e3);
            if !out.status.success() {
                return Err(format!("`true` failed: {:?}", out.status));
            }
            held.push(sb);
            done += 1;
        }
        held.into_iter().for_each(|sb| pool.release(sb));
    }
    pool.set_paused(false);
    let misses = pool.stats().misses;
    pool.shutdown();

    // Sustained creation including destroy, with `concurrency` threads.
    let total = n.max(a.concurrency) * 2;
    eprintln!(
        "sustained create+destroy x{total} on {} threads",
        a.concurrency
    );
    let next = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let handles: Vec<_> = (0..a.concurrency)
        .map(|_| {
            let rt: Arc<Runtime> = rt.clone();
            let spec = spec.clone();
            let next = next.clone();
            std::thread::spawn(move || -> Result<(), String> {
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let sb = rt.spawn(&spec).map_err(|e| e.to_string())?;
                    sb.destroy().map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "bench thread panicked")??;
    }
    let secs = t.elapsed().as_secs_f64();
    let per_min = total as f64 / secs * 60.0;

    Ok(Report {
        count: n,
        concurrency: a.concurrency,
        cores,
        cgroups: rt.cgroups().map(|c| c.version()),
        init_program: init,
        cold_create_p50_ms: pct(&mut cold, 0.5),
        cold_create_p99_ms: pct(&mut cold, 0.99),
        cold_create_min_ms: pct(&mut cold, 0.0),
        destroy_p50_ms: pct(&mut destroy, 0.5),
        warm_claim_p50_us: pct(&mut claim, 0.5),
        warm_claim_p99_us: pct(&mut claim, 0.99),
        first_exec_p50_ms: pct(&mut first, 0.5),
        first_exec_p99_ms: pct(&mut first, 0.99),
        exec_true_p50_ms: pct(&mut exec_true, 0.5),
        exec_true_min_ms: pct(&mut exec_true, 0.0),
        creations_per_min: per_min,
        creations_per_min_per_core: per_min / cores as f64,
        idle_sandbox_rss_kib: pct(&mut rss, 0.5),
        pool_misses: misses,
    })
}

fn print_table(r: &Report) {
    println!(
        "sandbox benchmark: {} sandboxes, {} threads, {} cores, cgroups {}",
        r.count,
        r.concurrency,
        r.cores,
        r.cgroups.unwrap_or("none")
    );
    println!("init program: {}", r.init_program);
    println!("{:<30} {:>12}", "metric", "value");
    for (k, v) in [
        ("cold_create_p50_ms", r.cold_create_p50_ms),
        ("cold_create_p99_ms", r.cold_create_p99_ms),
        ("cold_create_min_ms", r.cold_create_min_ms),
        ("destroy_p50_ms", r.destroy_p50_ms),
        ("warm_claim_p50_us", r.warm_claim_p50_us),
        ("warm_claim_p99_us", r.warm_claim_p99_us),
        ("first_exec_p50_ms", r.first_exec_p50_ms),
        ("first_exec_p99_ms", r.first_exec_p99_ms),
        ("exec_true_p50_ms", r.exec_true_p50_ms),
        ("exec_true_min_ms", r.exec_true_min_ms),
        ("creations_per_min", r.creations_per_min),
        ("creations_per_min_per_core", r.creations_per_min_per_core),
        ("idle_sandbox_rss_kib", r.idle_sandbox_rss_kib),
    ] {
        println!("{k:<30} {v:>12.3}");
    }
    println!("{:<30} {:>12}", "pool_misses", r.pool_misses);
}
