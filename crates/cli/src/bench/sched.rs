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
    /// The preemption workload instead: every node full of running
    /// lower-priority tasks (single tasks of 1, 2 or 4 GPUs, and 2-way gangs
    /// of 4-GPU tasks across two nodes), and `--tasks` (default: one per 5
    /// nodes) priority-10 tasks of 1, 2, 4 or 8 GPUs that only preemption can
    /// place. Reports the victim searches: how many, and their latency.
    #[arg(long)]
    pub preempt: bool,
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
    evictions: usize,
    /// Victim searches (preempt and reclaim, one per task or gang).
    searches: usize,
    search_p50_us: f64,
    search_p99_us: f64,
    search_max_us: f64,
}

struct Timer {
    last: Instant,
    samples: Vec<u64>,
    search_start: Option<Instant>,
    searches: Vec<u64>,
}

impl Observer for Timer {
    fn decision(&mut self) {
        let now = Instant::now();
        self.samples
            .push(now.duration_since(self.last).as_nanos() as u64);
        self.last = now;
    }
    fn search_begin(&mut self) {
        self.search_start = Some(Instant::now());
    }
    fn search_end(&mut self, _victims: usize) {
        if let Some(t) = self.search_start.take() {
            self.searches.push(t.elapsed().as_nanos() as u64);
        }
        // A search is not a placement decision: the next interval starts here.
        self.last = Instant::now();
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

/// The preemption workload (see `--preempt`): the synthetic cluster, every
/// node full of running lower-priority work, and `pending` priority-10 tasks.
pub fn synthetic_preempt(nodes: usize, pending: usize, seed: u64) -> Snapshot {
    let mut snap = synthetic(nodes, 0, seed);
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let queues = ["research", "training", "inference", "batch"];
    let mut g = 0usize;
    let mut left = vec![8u32; nodes];
    // 2-way gangs of 4-GPU tasks on pairs of nodes, on a tenth of the nodes.
    let mut i = 0;
    while i + 1 < nodes / 10 * 2 {
        let mut group = PodGroup::new(format!("gang-{g:06}"), queues[rng.modulo(4) as usize], 2);
        group.priority = rng.modulo(2) as i32;
        group.creation = g as u64;
        for (k, n) in [i, i + 1].into_iter().enumerate() {
            let mut t =
                Task::new(format!("w-{k}"), Resources::new(16_000, 128 << 30)).with_gpu(whole(4));
            t.node = Some(format!("node-{n:05}"));
            left[n] -= 4;
            group.tasks.push(t);
        }
        snap.groups.push(group);
        g += 1;
        i += 2;
    }
    for (n, free) in left.iter_mut().enumerate() {
        while *free > 0 {
            let want = [1u32, 1, 2, 4][rng.modulo(4) as usize].min(*free);
            let mut group = PodGroup::new(format!("run-{g:06}"), queues[rng.modulo(4) as usize], 1);
            group.priority = rng.modulo(3) as i32;
            group.creation = g as u64;
            let mut t = Task::new("t", Resources::new(8_000 * u64::from(want), 64 << 30))
                .with_gpu(whole(want));
            t.node = Some(format!("node-{n:05}"));
            group.tasks.push(t);
            snap.groups.push(group);
            *free -= want;
            g += 1;
        }
    }
    for k in 0..pending {
        let mut group = PodGroup::new(format!("urgent-{k:06}"), queues[rng.modulo(4) as usize], 1);
        group.priority = 10;
        group.creation = (g + k) as u64;
        let want = [1u32, 2, 4, 8][rng.modulo(4) as usize];
        group.tasks.push(
            Task::new("t", Resources::new(4_000 * u64::from(want), 32 << 30)).with_gpu(whole(want)),
        );
        snap.groups.push(group);
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

struct Run {
    wall: f64,
    placed: usize,
    evictions: usize,
    samples: Vec<u64>,
    searches: Vec<u64>,
}

fn measure(
    nodes: usize,
    tasks: usize,
    seed: u64,
    repeat: usize,
    config: &Config,
    preempt: bool,
) -> Row {
    let snap = if preempt {
        synthetic_preempt(nodes, tasks, seed)
    } else {
        synthetic(nodes, tasks, seed)
    };
    let mut runs: Vec<Run> = Vec::new();
    for _ in 0..repeat.max(1) {
        let start = Instant::now();
        let mut timer = Timer {
            last: start,
            samples: Vec::with_capacity(tasks),
            search_start: None,
            searches: Vec::new(),
        };
        let plan = tessera_sched::schedule_observed(&snap, config, &mut timer);
        let wall = start.elapsed().as_secs_f64() * 1000.0;
        runs.push(Run {
            wall,
            placed: plan.bindings.len(),
            evictions: plan.evictions.len(),
            samples: timer.samples,
            searches: timer.searches,
        });
    }
    runs.sort_by(|a, b| a.wall.total_cmp(&b.wall));
    let Run {
        wall: wall_ms,
        placed,
        evictions,
        mut samples,
        mut searches,
    } = runs.swap_remove(runs.len() / 2);
    searches.sort_unstable();
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
        evictions,
        searches: searches.len(),
        search_p50_us: percentile(&searches, 0.50),
        search_p99_us: percentile(&searches, 0.99),
        search_max_us: searches.last().map_or(0.0, |&m| m as f64 / 1000.0),
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
        let default = if a.preempt {
            (a.nodes / 5).max(1)
        } else {
            a.nodes * 8
        };
        vec![(a.nodes, a.tasks.unwrap_or(default))]
    };
    let mut rows = Vec::new();
    for (n, t) in sizes {
        eprintln!(
            "scheduling {t} tasks on {n} nodes ({} sessions)…",
            a.repeat.max(1)
        );
        let t = if a.preempt && a.sweep {
            (n / 5).max(1)
        } else {
            t
        };
        rows.push(measure(n, t, a.seed, a.repeat, &config, a.preempt));
    }
    if a.json {
        return if a.sweep {
            print_json(&rows)
        } else {
            print_json(&rows[0])
        };
    }
    if a.preempt {
        let mut out = String::from(
            "nodes   pending placed  evicted wall_ms  searches search_p50_us search_p99_us search_max_us\n",
        );
        for r in &rows {
            out.push_str(&format!(
                "{:<7} {:<7} {:<7} {:<7} {:<8.1} {:<8} {:<13.1} {:<13.1} {:.1}\n",
                r.nodes,
                r.tasks,
                r.placed,
                r.evictions,
                r.wall_ms,
                r.searches,
                r.search_p50_us,
                r.search_p99_us,
                r.search_max_us
            ));
        }
        out.push_str(&format!(
            "victim search bound: {} steps per node, {} per decision; gangs searched jointly up to {} eligible victims\n",
            tessera_sched::NODE_STEPS,
            tessera_sched::DECISION_STEPS,
            tessera_sched::JOINT_MAX
        ));
        return print_text(&out);
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
