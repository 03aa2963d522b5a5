//! `tessera bench sched`: batch-scheduler throughput and per-decision latency on a
//! synthetic GPU cluster.
//!
//! The cluster: `--nodes` nodes with 8 GPUs each, of three models (H100-80GB,
//! A100-80GB, L40S), 96 cores and 1 TiB each, in four zones. The workload:
//! `--tasks` tasks over four weighted queues: single-task groups (CPU-only,
//! 1, 2 or 4 whole GPUs, half a GPU, some restricted to one GPU model or zone)
//! and 8-way gangs of 1-GPU workers, about 85% of the cluster's GPUs in all.
//! Everything is generated from `--seed`, so runs compare like with like.

use std::time::Instant;

use serde::Serialize;
use tessera_model::{GpuDevice, GpuRequest, Node, PodGroup, Queue, Resources, Snapshot, Task};
use tessera_sched::{Config, Observer};
use tessera_sim::rng::SplitMix64;

use crate::output::{EXIT_BAD_INPUT, fail, print_json, print_text};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Nodes in the synthetic cluster (8 GPUs each).
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Tasks to schedule (default: 8 per node).
    #[arg(long)]
    pub tasks: Option<usize>,
    /// Run 1,000, 5,000 and 20,000 nodes (8 tasks per node) to show how cost grows.
    #[arg(long)]
    pub sweep: bool,
    /// Sessions per size; the run with the median wall time is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Scheduler configuration file (actions and plugin tiers); default:
    /// enqueue, allocate, preempt, reclaim, backfill with every plugin but spread.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print JSON (an object; an array with --sweep) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    nodes: usize,
    tasks: usize,
    placed: usize,
    wall_ms: f64,
    pods_per_sec: f64,
    decisions: usize,
    decision_p50_us: f64,
    decision_p99_us: f64,
    decision_max_us: f64,
    us_per_pod: f64,
}

struct Timer {
    last: Instant,
    samples: Vec<u64>,
}

impl Observer for Timer {
    fn decision(&mut self) {
        let now = Instant::now();
        self.samples
            .push(now.duration_since(self.last).as_nanos() as u64);
        self.last = now;
    }
}

const MODELS: [(&str, u64); 3] = [("H100-80GB", 80), ("A100-80GB", 80), ("L40S", 48)];

/// Builds the synthetic cluster and workload.
pub fn synthetic(nodes: usize, tasks: usize, seed: u64) -> Snapshot {
    let mut rng = SplitMix64::new(seed);
    let mut snap = Snapshot::default();
    for i in 0..nodes {
        let (model, mem_gb) = MODELS[[0, 0, 1, 1, 2][i % 5]];
        let mut n = Node::new(
            format!("node-{i:05}"),
            Resources::new(96_000, 1 << 40)
                .with_gpu_milli(8000)
                .with_pods(110),
        );
        n.allocatable.gpu_memory = 8 * (mem_gb << 30);
        n.labels.insert("zone".into(), format!("zone-{}", i % 4));
        n.labels
            .insert("nvidia.com/gpu.product".into(), model.to_string());
        n.gpus = (0..8)
            .map(|g| GpuDevice::new(g, model, mem_gb << 30))
            .collect();
        snap.nodes.push(n);
    }
    for (q, w) in [
        ("research", 1),
        ("training", 4),
        ("inference", 3),
        ("batch", 2),
    ] {
        let mut queue = Queue::new(q);
        queue.weight = w;
        snap.queues.push(queue);
    }
    let queues = ["research", "training", "inference", "batch"];
    let mut made = 0usize;
    let mut g = 0usize;
    while made < tasks {
        let queue = queues[rng.modulo(4) as usize];
        let roll = rng.modulo(100);
        let mut group = PodGroup::new(format!("job-{g:06}"), queue, 1);
        group.priority = rng.modulo(3) as i32;
        group.creation = g as u64;
        if roll < 10 && tasks - made >= 8 {
            // An 8-way gang of 1-GPU workers.
            group.min_member = 8;
            group.kind = tessera_model::GroupKind::Training;
            for k in 0..8 {
                group.tasks.push(
                    Task::new(format!("w-{k}"), Resources::new(8_000, 64 << 30)).with_gpu(
                        GpuRequest::Whole {
                            count: 1,
                            models: Vec::new(),
                        },
                    ),
                );
            }
            made += 8;
        } else {
            let (cpu, mem, gpu) = match roll {
                10..=39 => (4_000, 16u64 << 30, GpuRequest::None),
                40..=79 => (8_000, 64 << 30, whole(1)),
                80..=84 => (16_000, 128 << 30, whole(2)),
                85..=89 => (32_000, 256 << 30, whole(4)),
                _ => (
                    2_000,
                    8 << 30,
                    GpuRequest::Shared {
                        milli: 500,
                        memory: 20 << 30,
                        models: Vec::new(),
                    },
                ),
            };
            let mut t = Task::new("t", Resources::new(cpu, mem)).with_gpu(gpu);
            // A fifth of the tasks carry a constraint: a GPU model or a zone.
            match rng.modulo(10) {
                0 => {
                    if let GpuRequest::Whole { models, .. } = &mut t.gpu {
                        models.push(MODELS[rng.modulo(3) as usize].0.to_string());
                    }
                }
                1 => {
                    t.node_selector
                        .insert("zone".into(), format!("zone-{}", rng.modulo(4)));
                }
                _ => {}
            }
            group.tasks.push(t);
            made += 1;
        }
        snap.groups.push(group);
        g += 1;
    }
    snap
}

fn whole(count: u32) -> GpuRequest {
    GpuRequest::Whole {
        count,
        models: Vec::new(),
    }
}

/// Percentile of sorted nanosecond samples, in microseconds (0 when empty).
fn percentile(sorted: &[u64], p: f64) -> f64 {
    super::percentile(sorted, p).map_or(0.0, |v| v as f64 / 1000.0)
}

fn measure(nodes: usize, tasks: usize, seed: u64, repeat: usize, config: &Config) -> Row {
    let snap = synthetic(nodes, tasks, seed);
    let mut runs: Vec<(f64, usize, Vec<u64>)> = Vec::new();
    for _ in 0..repeat.max(1) {
        let start = Instant::now();
        let mut timer = Timer {
            last: start,
            samples: Vec::with_capacity(tasks),
        };
        let plan = tessera_sched::schedule_observed(&snap, config, &mut timer);
        let wall = start.elapsed().as_secs_f64() * 1000.0;
        runs.push((wall, plan.bindings.len(), timer.samples));
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (wall_ms, placed, mut samples) = runs.swap_remove(runs.len() / 2);
    // The first interval includes building the session state; it is counted in
    // wall time, not as a decision.
    if !samples.is_empty() {
        samples.remove(0);
    }
    samples.sort_unstable();
    Row {
        nodes,
        tasks,
        placed,
        wall_ms,
        pods_per_sec: placed as f64 / (wall_ms / 1000.0),
        decisions: samples.len() + 1,
        decision_p50_us: percentile(&samples, 0.50),
        decision_p99_us: percentile(&samples, 0.99),
        decision_max_us: samples.last().map_or(0.0, |&m| m as f64 / 1000.0),
        us_per_pod: wall_ms * 1000.0 / placed.max(1) as f64,
    }
}

pub fn run(a: Args) -> i32 {
    if a.nodes == 0 {
        return fail(EXIT_BAD_INPUT, "--nodes must be at least 1");
    }
    let config = match &a.config {
        Some(p) => match tessera_sim::scenario::load_config(p) {
            Ok(c) => c,
            Err(e) => return fail(EXIT_BAD_INPUT, e),
        },
        None => Config::default(),
    };
    let sizes: Vec<(usize, usize)> = if a.sweep {
        [1_000, 5_000, 20_000]
            .into_iter()
            .map(|n| (n, n * 8))
            .collect()
    } else {
        vec![(a.nodes, a.tasks.unwrap_or(a.nodes * 8))]
    };
    let mut rows = Vec::new();
    for (n, t) in sizes {
        eprintln!(
            "scheduling {t} tasks on {n} nodes ({} sessions)…",
            a.repeat.max(1)
        );
        rows.push(measure(n, t, a.seed, a.repeat, &config));
    }
    if a.json {
        return if a.sweep {
            print_json(&rows)
        } else {
            print_json(&rows[0])
        };
    }
    let mut out = String::from(
        "nodes   tasks   placed  wall_ms  pods/s     p50_us  p99_us  max_us  us/pod\n",
    );
    for r in &rows {
        out.push_str(&format!(
            "{:<7} {:<7} {:<7} {:<8.1} {:<10.0} {:<7.2} {:<7.2} {:<7.1} {:.2}\n",
            r.nodes,
            r.tasks,
            r.placed,
            r.wall_ms,
            r.pods_per_sec,
            r.decision_p50_us,
            r.decision_p99_us,
            r.decision_max_us,
            r.us_per_pod
        ));
    }
    print_text(&out)
}
