//! `tessera bench agent`: the agent scheduler's throughput and enqueue-to-bind
//! latency, for each worker count in `--workers`.
//!
//! The cluster: `--nodes` nodes of 64 cores, 256 GiB and 110 pod slots, all in the
//! agent shard. The workload: `--tasks` sandbox tasks from `--tenants` tenants, two
//! priorities, 0.25-1 core and 256 MiB-2 GiB each, generated from `--seed`.
//!
//! Two runs per worker count, each on a fresh cluster:
//!
//! * **throughput**: every task is queued first, then the workers drain the queue;
//!   `tasks_per_sec` is placed tasks over the wall time of the drain.
//! * **latency**: tasks arrive at `--rate` per second (in small bursts every 100
//!   µs) while the workers run; `latency_p50_us` / `latency_p99_us` are the
//!   enqueue-to-bind times. (Latency on a pre-filled queue would only measure the
//!   queue's length.)
//!
//! `--repeat` rounds, each running every worker count once in turn; the median run
//! of each kind is reported (throughput by wall time, latency by p99).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tessera_sched::agent::{
    AgentConfig, AgentScheduler, AgentTask, Bound, Clock, Demand, NodePhase, NodeTable, Owner,
    TenantId, WorkerStats,
};

use crate::output::{EXIT_BAD_INPUT, fail, print_json, print_text};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Nodes in the synthetic cluster (64 cores, 256 GiB, 110 pods each).
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Agent tasks per run.
    #[arg(long, default_value_t = 200_000)]
    pub tasks: usize,
    /// Worker counts to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub workers: Vec<usize>,
    /// Arrival rate (tasks per second) of the latency run.
    #[arg(long, default_value_t = 100_000)]
    pub rate: u64,
    /// Candidates per task (K).
    #[arg(long, default_value_t = 3)]
    pub candidates: usize,
    /// Tenants the tasks come from.
    #[arg(long, default_value_t = 8)]
    pub tenants: u32,
    /// Rounds (each runs every worker count once, interleaved); medians are reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Tasks in each latency run (the first ones of the workload).
    #[arg(long, default_value_t = 100_000)]
    pub latency_tasks: usize,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print a JSON array (one object per worker count) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    workers: usize,
    nodes: usize,
    tasks: usize,
    placed: u64,
    wall_ms: f64,
    tasks_per_sec: f64,
    /// CPU time of the throughput run, all threads (10 ms resolution).
    cpu_ms: f64,
    /// Placed tasks per CPU second: flat across worker counts means the workers
    /// do not slow each other down, whatever else the machine is doing.
    tasks_per_cpu_sec: f64,
    conflicts: u64,
    requeued: u64,
    latency_rate: u64,
    latency_placed: u64,
    latency_p50_us: f64,
    latency_p99_us: f64,
    latency_max_us: f64,
    latency_conflicts: u64,
    /// The machine's 1-minute load average around the runs (other work competing
    /// for the cores makes the figures worse, the tail most of all).
    loadavg_1m: f64,
}

struct Mono(Instant);
impl Clock for Mono {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn workload(a: &Args) -> Vec<AgentTask> {
    let mut r = Rng(a.seed);
    (0..a.tasks as u64)
        .map(|id| {
            let cpu = 250 * (1 + r.next() % 4);
            let mem = (256u64 << 20) * (1 + r.next() % 8);
            let mut t = AgentTask::new(
                id,
                TenantId((r.next() % u64::from(a.tenants.max(1))) as u32),
                Demand::new(cpu, mem),
            );
            t.priority = (r.next() % 2) as i32;
            t
        })
        .collect()
}

fn table(nodes: usize) -> NodeTable {
    let node = Demand {
        cpu_milli: 64_000,
        memory: 256 << 30,
        gpu_milli: 0,
        pods: 110,
    };
    NodeTable::new(
        vec![node; nodes],
        &vec![NodePhase::InUse(Owner::Agent); nodes],
    )
}

fn config(a: &Args) -> AgentConfig {
    let mut c = AgentConfig::new();
    c.select.k = a.candidates.max(1);
    c
}

fn stats(res: &[(tessera_sched::agent::Worker, Vec<Bound>)]) -> WorkerStats {
    let mut s = WorkerStats::default();
    for (w, _) in res {
        s.add(&w.stats);
    }
    s
}

/// CPU time this process has used (all threads), from `/proc/self/stat`, in ms
/// (10 ms resolution); 0 where it cannot be read.
fn cpu_ms() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (tick(11) + tick(12)) * 10.0
}

/// All tasks queued, then drained: (placed, wall, cpu ms, stats).
fn throughput(a: &Args, tasks: &[AgentTask], workers: usize) -> (u64, Duration, f64, WorkerStats) {
    let t = table(a.nodes);
    let sched = AgentScheduler::new(&t, config(a), (0..a.nodes as u32).collect(), vec![]);
    sched.submit(tasks);
    let clock = Mono(Instant::now());
    let cpu0 = cpu_ms();
    let start = Instant::now();
    let res = sched.run_threads(workers, &clock, &|| true, tasks.len());
    let wall = start.elapsed();
    let cpu = cpu_ms() - cpu0;
    let s = stats(&res);
    (s.placed, wall, cpu, s)
}

/// Tasks arriving at `rate`: latencies in ns, and stats.
fn latency(a: &Args, tasks: &[AgentTask], workers: usize) -> (Vec<u64>, WorkerStats) {
    let t = table(a.nodes);
    let sched = AgentScheduler::new(&t, config(a), (0..a.nodes as u32).collect(), vec![]);
    let clock = Mono(Instant::now());
    let fed = AtomicBool::new(false);
    let res = std::thread::scope(|s| {
        let h = s.spawn(|| {
            sched.run_threads(
                workers,
                &clock,
                &|| fed.load(Ordering::Acquire),
                tasks.len(),
            )
        });
        let tick_ns = 100_000u64;
        let per_tick = (a.rate.max(1) as f64 * tick_ns as f64 / 1e9).max(1.0);
        let mut sent = 0usize;
        let mut chunk = Vec::new();
        let mut k = 0u64;
        while sent < tasks.len() {
            k += 1;
            let due = ((k as f64 * per_tick) as usize).min(tasks.len());
            let at = k * tick_ns;
            loop {
                let now = clock.now_ns();
                if now >= at {
                    break;
                }
                if at - now > 60_000 {
                    std::thread::sleep(Duration::from_nanos(at - now - 50_000));
                } else {
                    std::hint::spin_loop();
                }
            }
            let now = clock.now_ns();
            chunk.clear();
            chunk.extend(tasks[sent..due].iter().map(|t| {
                let mut t = *t;
                t.enqueued_ns = now;
                t
            }));
            sched.submit(&chunk);
            sent = due;
        }
        fed.store(true, Ordering::Release);
        h.join().unwrap_or_default()
    });
    let s = stats(&res);
    let mut lat: Vec<u64> = res
        .iter()
        .flat_map(|(_, b)| {
            b.iter()
                .map(|b| b.bound_ns.saturating_sub(b.task.enqueued_ns))
        })
        .collect();
    lat.sort_unstable();
    (lat, s)
}

/// The 1-minute load average, or 0 where `/proc/loadavg` cannot be read.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0)
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    super::percentile(sorted, p).map_or(0.0, |v| v as f64 / 1000.0)
}

pub fn run(a: Args) -> i32 {
    if a.nodes == 0 || a.tasks == 0 {
        return fail(EXIT_BAD_INPUT, "--nodes and --tasks must be at least 1");
    }
    if a.workers.is_empty() || a.workers.iter().any(|w| *w == 0 || *w > 256) {
        return fail(
            EXIT_BAD_INPUT,
            format!(
                "--workers {:?}: each count must be 1..=256, e.g. --workers 1,2",
                a.workers
            ),
        );
    }
    if a.tasks as u64 > a.nodes as u64 * 110 {
        return fail(
            EXIT_BAD_INPUT,
            format!(
                "--tasks {} exceeds the cluster's {} pod slots; raise --nodes",
                a.tasks,
                a.nodes * 110
            ),
        );
    }
    let tasks = workload(&a);
    let lat_tasks = &tasks[..a.latency_tasks.clamp(1, tasks.len())];
    // Interleave the worker counts (A B A B ...) so that whatever else the machine
    // does at the time hits all of them alike; report medians.
    let reps = a.repeat.max(1);
    let mut thr: Vec<Vec<(u64, Duration, f64, WorkerStats)>> = vec![Vec::new(); a.workers.len()];
    let mut lat: Vec<Vec<(Vec<u64>, WorkerStats)>> = vec![Vec::new(); a.workers.len()];
    let load_before = loadavg();
    for r in 0..reps {
        for (i, &w) in a.workers.iter().enumerate() {
            eprintln!(
                "bench agent: round {}/{reps}, {w} worker(s): {} tasks on {} nodes",
                r + 1,
                a.tasks,
                a.nodes
            );
            thr[i].push(throughput(&a, &tasks, w));
            lat[i].push(latency(&a, lat_tasks, w));
        }
    }
    let load_after = loadavg();
    let mut rows = Vec::new();
    for (i, &w) in a.workers.iter().enumerate() {
        let runs = &mut thr[i];
        runs.sort_by_key(|r| r.1);
        let (placed, wall, cpu, st) = runs[runs.len() / 2];
        let lruns = &mut lat[i];
        lruns.sort_by(|x, y| pct(&x.0, 0.99).total_cmp(&pct(&y.0, 0.99)));
        let (lat, lst) = &lruns[lruns.len() / 2];
        rows.push(Row {
            workers: w,
            nodes: a.nodes,
            tasks: a.tasks,
            placed,
            wall_ms: wall.as_secs_f64() * 1e3,
            tasks_per_sec: placed as f64 / wall.as_secs_f64().max(1e-9),
            cpu_ms: cpu,
            tasks_per_cpu_sec: if cpu > 0.0 {
                placed as f64 / (cpu / 1e3)
            } else {
                0.0
            },
            conflicts: st.conflicts,
            requeued: st.requeued,
            latency_rate: a.rate,
            latency_placed: lst.placed,
            latency_p50_us: pct(lat, 0.50),
            latency_p99_us: pct(lat, 0.99),
            latency_max_us: pct(lat, 1.0),
            latency_conflicts: lst.conflicts,
            loadavg_1m: load_before.max(load_after),
        });
    }
    if a.json {
        return print_json(&rows);
    }
    let mut s = String::new();
    s.push_str(&format!(
        "{:>7} {:>6} {:>8} {:>8} {:>9} {:>12} {:>12} {:>9} {:>8} | {:>9} {:>8} {:>8} {:>9}\n",
        "workers",
        "nodes",
        "tasks",
        "placed",
        "wall_ms",
        "tasks/s",
        "tasks/cpu-s",
        "conflicts",
        "requeued",
        "rate/s",
        "p50_us",
        "p99_us",
        "max_us"
    ));
    for r in &rows {
        s.push_str(&format!(
            "{:>7} {:>6} {:>8} {:>8} {:>9.1} {:>12.0} {:>12.0} {:>9} {:>8} | {:>9} {:>8.1} {:>8.1} {:>9.1}\n",
            r.workers, r.nodes, r.tasks, r.placed, r.wall_ms, r.tasks_per_sec, r.tasks_per_cpu_sec, r.conflicts,
            r.requeued, r.latency_rate, r.latency_p50_us, r.latency_p99_us, r.latency_max_us
        ));
    }
    if let Some(r) = rows.first() {
        s.push_str(&format!(
            "load average (1 min) around the runs: {:.2}\n",
            r.loadavg_1m
        ));
    }
    if let (Some(one), Some(two)) = (
        rows.iter().find(|r| r.workers == 1),
        rows.iter().find(|r| r.workers == 2),
    ) {
        s.push_str(&format!(
            "2 workers / 1 worker: throughput {}, throughput per CPU second {}\n",
            ratio(two.tasks_per_sec, one.tasks_per_sec),
            ratio(two.tasks_per_cpu_sec, one.tasks_per_cpu_sec)
        ));
    }
    print_text(&s)
}

/// `a / b` as `1.23x`, or why there is no ratio: a run too short for the clock (CPU
/// time is counted in the kernel's ticks) measures 0 and would print 2e15x.
fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite() {
        format!("{:.2}x", a / b)
    } else {
        "n/a (a run too short to measure: give more --tasks)".into()
    }
}

#[cfg(test)]
mod ratio_tests {
    #[test]
    fn a_run_too_short_has_no_ratio() {
        assert_eq!(super::ratio(3.0, 2.0), "1.50x");
        assert!(super::ratio(5.0, 0.0).starts_with("n/a"));
        assert!(super::ratio(0.0, 5.0).starts_with("n/a"));
    }
}
