//! `tessera bench node` (the runtime half; the CLI adds jobs per second through a
//! real server): per-task start overhead of the node runtime side by side with a
//! plain `fork+exec` of the same command, and eviction latency (stop asked →
//! the task's tree gone and its end reported) with a 0 s grace, and with a grace
//! period the task uses (SIGTERM handled).
//!
//! Timings are medians and 99th percentiles of `n` runs on this machine, taken in
//! one run so A and B share the machine's load.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tessera_model::Resources;

use crate::{
    GpuAssignment, NodeConfig, NodeRuntime, TaskKey, TaskLimits, TemplateRef, WorkloadSpec,
};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Config {
    /// Runs of each kind.
    pub runs: usize,
    /// The command started (`true` by default).
    pub command: Vec<String>,
    pub node: NodeConfig,
}

/// Percentiles of one measure, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Stat {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Stat {
    fn of(mut v: Vec<f64>) -> Stat {
        v.sort_by(f64::total_cmp);
        let p = |q: f64| {
            let last = v.len().saturating_sub(1);
            v.get(((last as f64) * q).round() as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        Stat {
            p50_ms: p(0.5),
            p99_ms: p(0.99),
            max_ms: v.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// What the runtime half measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub runs: usize,
    pub command: String,
    /// `fork+exec` of the command and wait for it, no sandbox (the floor).
    pub plain_run: Stat,
    /// The node runtime: start (device view, sandbox, limits, guard) → the command
    /// ran → its end reported with usage, sandbox removed.
    pub sandboxed_run: Stat,
    /// The node runtime's `start` call alone (sandbox made, command handed over).
    pub sandboxed_start: Stat,
    /// `stop` with a 0 s grace → the tree gone and the end reported.
    pub eviction_0s: Stat,
    /// `stop` with a 30 s grace, the task ending on SIGTERM → the end reported.
    pub eviction_sigterm: Stat,
    pub cgroups: Option<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn spec(dir: &std::path::Path, i: usize, command: Vec<String>) -> WorkloadSpec {
    WorkloadSpec {
        key: TaskKey::new("bench", "bench", format!("t{i}"), 0),
        command,
        env: vec![],
        working_dir: None,
        template: TemplateRef::Host,
        requests: Resources::new(1000, 64 << 20),
        limits: TaskLimits::default(),
        gpus: GpuAssignment::None,
        record: vec![],
        log: dir.join(format!("t{i}.log")),
        tier: tessera_sandbox::TierKind::Namespace,
        weights: Vec::new(),
    }
}

/// Runs the runtime half of the benchmark.
pub fn run(cfg: Config) -> Result<Report, String> {
    if cfg.runs == 0 || cfg.command.is_empty() {
        return Err("give at least one run and a command".into());
    }
    let dir = std::env::temp_dir().join(format!("tessera-bench-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let n = NodeRuntime::new(cfg.node.clone()).map_err(|e| e.to_string())?;
    let r = measure(&n, &cfg, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn measure(n: &Arc<NodeRuntime>, cfg: &Config, dir: &std::path::Path) -> Result<Report, String> {
    let runs = cfg.runs;
    // Warm both paths once (page cache, first clone on this thread).
    let _ = std::process::Command::new(&cfg.command[0])
        .args(&cfg.command[1..])
        .status();
    let one = |i: usize, cmd: Vec<String>| -> Result<(Duration, Duration), String> {
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        n.start(
            spec(dir, i, cmd),
            Box::new(move |e| {
                let _ = tx.send((Instant::now(), e));
            }),
        )
        .map_err(|e| e.to_string())?;
        let started = t0.elapsed();
        let (at, e) = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "a task did not end".to_string())?;
        if !e.outcome.success() {
            return Err(format!(
                "the benchmark command failed: {}",
                e.outcome.message()
            ));
        }
        Ok((started, at - t0))
    };
    one(usize::MAX, cfg.command.clone())?;
    let (mut plain, mut sandboxed, mut start) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        // Interleaved, so both see the same load.
        let t0 = Instant::now();
        let st = std::process::Command::new(&cfg.command[0])
            .args(&cfg.command[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("{}: {e}", cfg.command[0]))?;
        plain.push(ms(t0.elapsed()));
        if !st.success() {
            return Err(format!("{} failed: {st}", cfg.command[0]));
        }
        let (s, r) = one(i, cfg.command.clone())?;
        start.push(ms(s));
        sandboxed.push(ms(r));
    }
    let evict = |grace: Duration, cmd: &str| -> Result<Vec<f64>, String> {
        let mut out = Vec::new();
        for i in 0..runs {
            let (tx, rx) = mpsc::channel();
            let w = spec(dir, 100_000 + i, vec!["sh".into(), "-c".into(), cmd.into()]);
            let key = w.key.clone();
            n.start(
                w,
                Box::new(move |e| {
                    let _ = tx.send((Instant::now(), e));
                }),
            )
            .map_err(|e| e.to_string())?;
            // Until the workload runs (its shell is up and waiting).
            let t = Instant::now();
            while n.workload_pids(&key).len() < 2 {
                if t.elapsed() > Duration::from_secs(10) {
                    return Err("the eviction victim did not start".into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(5));
            let t0 = Instant::now();
            n.stop(&key, grace, "bench");
            let (at, e) = rx
                .recv_timeout(Duration::from_secs(60))
                .map_err(|_| "an evicted task did not end".to_string())?;
            if !e.leftovers.is_empty() {
                return Err(format!("processes left after eviction: {:?}", e.leftovers));
            }
            out.push(ms(at - t0));
        }
        Ok(out)
    };
    let e0 = evict(Duration::ZERO, "sleep 1000 & wait")?;
    let eterm = evict(
        Duration::from_secs(30),
        "trap 'exit 0' TERM; sleep 1000 & wait",
    )?;
    Ok(Report {
        runs,
        command: cfg.command.join(" "),
        plain_run: Stat::of(plain),
        sandboxed_run: Stat::of(sandboxed),
        sandboxed_start: Stat::of(start),
        eviction_0s: Stat::of(e0),
        eviction_sigterm: Stat::of(eterm),
        cgroups: n
            .sandbox_runtime()
            .cgroups()
            .map(|c| c.version().to_string()),
    })
}
