//! Trace replay following the FGD paper's protocol.
//!
//! Per seed: the pods, sorted by name, are shuffled; the workload is then tuned to
//! `inflate` × the cluster's GPU capacity by appending pods drawn with replacement
//! from the original list (or by dropping random pods when it is already larger);
//! each pod arrives once, in that order, and is either placed or stays unplaced
//! (no retries, no departures). After every pod the GPU allocation ratio and the
//! fragmented GPU capacity are recorded, binned by the arrived GPU request in
//! percent of capacity (rounded to the nearest integer, as the paper's merge
//! scripts do).
//!
//! This mirrors `hkust-adsl/kubernetes-scheduler-simulator` (read, not copied):
//! shuffling before tuning, the tuning stop rule (which compares the per-GPU
//! request with the remaining room), the typical-pod workload for FGD (pod shapes
//! covering 95 % of the original pods, CPU-only pods included), kube-scheduler's
//! non-zero CPU request (0 counts as 100 milli-CPU) and random tie-breaking.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tessera_sched::gpu::{
    GpuCluster, NodeState, Outlook, Placement, PodShape, Policy, TypicalPod, Workload,
};

use crate::trace::{NodeRow, PodRow};

pub use crate::rng::SplitMix64;

/// Replay settings.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Target arrived GPU request as a multiple of capacity (the paper: 1.3).
    pub inflate: f64,
    /// Share of original pods the typical-pod workload covers (the paper: 0.95).
    pub typical_coverage: f64,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            inflate: 1.3,
            typical_coverage: 0.95,
        }
    }
}

/// Why a trace cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareError(pub String);

impl std::fmt::Display for PrepareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PrepareError {}

/// A node list and a pod list turned into what the policies work on.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub nodes: Vec<NodeState>,
    /// Pods sorted by name.
    pub pods: Vec<PodShape>,
    /// The simulator's typical pods (CPU and GPU), for `fgd` and for measuring.
    pub workload: Workload,
    /// The same typical pods, each also asking for the least memory its shape's
    /// pods ask for: our `fgd-mem` policy, and `tessera`'s base.
    pub workload_mem: Workload,
    /// What `tessera` knows of the pod list beyond the typical pods.
    pub outlook: Outlook,
    pub total_milli: u64,
    pub models: BTreeMap<String, u16>,
    /// (creation, deletion) in seconds per pod (same order as `pods`), when the
    /// trace has timestamps.
    pub times: Vec<Option<(u64, u64)>>,
}

/// Builds the cluster and the workload. Models are numbered in name order; at most
/// 64 distinct models (the policies use a 64-bit mask).
pub fn prepare(
    nodes: &[NodeRow],
    pods: &[PodRow],
    cfg: &ReplayConfig,
) -> Result<Prepared, PrepareError> {
    let mut names: Vec<&str> = nodes
        .iter()
        .filter(|n| !n.model.is_empty())
        .map(|n| n.model.as_str())
        .chain(
            pods.iter()
                .flat_map(|p| p.gpu_spec.iter().map(String::as_str)),
        )
        .collect();
    names.sort_unstable();
    names.dedup();
    if names.len() > 64 {
        return Err(PrepareError(format!(
            "{} distinct GPU models; the replay handles at most 64",
            names.len()
        )));
    }
    let models: BTreeMap<String, u16> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), i as u16))
        .collect();
    let node_states: Vec<NodeState> = nodes
        .iter()
        .map(|n| {
            let model = if n.gpus == 0 {
                u16::MAX
            } else {
                models[n.model.as_str()]
            };
            NodeState::new(n.cpu_milli, n.memory_mib, n.gpus, model)
        })
        .collect();
    let total_milli: u64 = nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum();
    if total_milli == 0 {
        return Err(PrepareError("the node list has no GPUs".into()));
    }
    let mut sorted: Vec<&PodRow> = pods.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let shapes: Vec<PodShape> = sorted
        .iter()
        .map(|p| PodShape {
            cpu: if p.cpu_milli == 0 { 100 } else { p.cpu_milli },
            cpu_req: p.cpu_milli,
            mem: p.memory_mib,
            num_gpu: p.num_gpu,
            milli: p.gpu_milli,
            models: p
                .gpu_spec
                .iter()
                .fold(0u64, |m, s| m | (1u64 << models[s.as_str()])),
        })
        .collect();
    if shapes.is_empty() {
        return Err(PrepareError("the pod list is empty".into()));
    }
    let workload = typical_workload(&sorted, &shapes, cfg.typical_coverage, false);
    let workload_mem = typical_workload(&sorted, &shapes, cfg.typical_coverage, true);
    let times = sorted
        .iter()
        .map(|p| p.creation_time.zip(p.deletion_time))
        .collect();
    let outlook = Outlook::new(&shapes, &node_states);
    Ok(Prepared {
        nodes: node_states,
        pods: shapes,
        workload,
        workload_mem,
        outlook,
        total_milli,
        models,
        times,
    })
}

/// The simulator's typical pods: shapes (CPU, GPU per GPU, GPU count, model
/// constraint) by decreasing frequency until `coverage` of the pods is reached,
/// shares renormalised.
fn typical_workload(
    rows: &[&PodRow],
    shapes: &[PodShape],
    coverage: f64,
    memory: bool,
) -> Workload {
    type Key = (i64, u32, u32, String);
    // With memory: each shape asks for the least memory any pod of that shape
    // asks for, so a node short of even that cannot run the shape.
    let mut least_mem: BTreeMap<Key, i64> = BTreeMap::new();
    for (row, s) in rows.iter().zip(shapes) {
        let m = least_mem
            .entry((s.cpu, s.milli, s.num_gpu, row.gpu_spec.join("|")))
            .or_insert(s.mem);
        *m = (*m).min(s.mem);
    }
    let mut counts: BTreeMap<Key, (u64, PodShape)> = BTreeMap::new();
    for (row, s) in rows.iter().zip(shapes) {
        let key = (s.cpu, s.milli, s.num_gpu, row.gpu_spec.join("|"));
        let mem = if memory { least_mem[&key] } else { 0 };
        let shape = PodShape { mem, ..s.clone() };
        let e = counts.entry(key).or_insert((0, shape));
        e.0 += 1;
    }
    let mut list: Vec<(Key, u64, PodShape)> =
        counts.into_iter().map(|(k, (c, s))| (k, c, s)).collect();
    // Decreasing count; among equals, decreasing shape (the simulator sorts with
    // sort.Reverse on (count, cpu, milli, num, type)).
    list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    let total = shapes.len() as f64;
    let want = coverage * total;
    let mut cum = 0.0;
    let mut chosen = Vec::new();
    for (_, c, s) in list {
        if cum >= want {
            break;
        }
        cum += c as f64;
        chosen.push((s, c as f64));
    }
    Workload::new(
        chosen
            .into_iter()
            .map(|(shape, c)| TypicalPod {
                shape,
                share: c / cum,
            })
            .collect(),
    )
}

/// Highest arrived-percent bin recorded.
pub const MAX_BIN: usize = 200;

/// What one (policy, seed) run measured: per arrived-percent bin, sums over the
/// pods that arrived in it.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub policy: Policy,
    pub seed: u64,
    /// (sum of allocation %, sum of fragmentation %, count) per bin 0..=MAX_BIN.
    pub bins: Vec<(f64, f64, u32)>,
    pub pods: usize,
    pub placed: usize,
}

impl RunResult {
    fn value(&self, bin: usize, pick: impl Fn(&(f64, f64, u32)) -> f64) -> Option<f64> {
        let at = |b: usize| {
            self.bins
                .get(b)
                .filter(|v| v.2 > 0)
                .map(|v| pick(v) / f64::from(v.2))
        };
        // Like the merge scripts: the bin, else the mean over bin ± 1.
        at(bin).or_else(|| {
            let lo = bin.saturating_sub(1);
            let (s, c) = (lo..=bin + 1)
                .filter_map(|b| self.bins.get(b))
                .fold((0.0, 0u32), |(s, c), v| (s + pick(v), c + v.2));
            (c > 0).then(|| s / f64::from(c))
        })
    }

    /// Mean GPU allocation (% of capacity) at `bin` % arrived.
    pub fn alloc_at(&self, bin: usize) -> Option<f64> {
        self.value(bin, |v| v.0)
    }

    /// Mean fragmented GPU (% of capacity) at `bin` % arrived.
    pub fn frag_at(&self, bin: usize) -> Option<f64> {
        self.value(bin, |v| v.1)
    }
}

/// The arrival order for one seed: indices into `Prepared::pods`.
pub fn arrival_order(prep: &Prepared, inflate: f64, rng: &mut SplitMix64) -> Vec<usize> {
    let n = prep.pods.len();
    let mut order: Vec<usize> = (0..n).collect();
    // Go's rand.Shuffle: Fisher-Yates from the top.
    for i in (1..n).rev() {
        let j = rng.below_usize(i + 1);
        order.swap(i, j);
    }
    let target = inflate * prep.total_milli as f64;
    let mut total: u64 = prep.pods.iter().map(PodShape::total_milli).sum();
    if (total as f64) < target {
        loop {
            let idx = rng.below_usize(n);
            let p = &prep.pods[idx];
            // The simulator's stop rule compares the per-GPU request.
            if (total + u64::from(p.milli)) as f64 > target {
                break;
            }
            total += p.total_milli();
            order.push(idx);
        }
    } else {
        while total as f64 > target && !order.is_empty() {
            let k = rng.below_usize(order.len());
            let idx = order.remove(k);
            total -= prep.pods[idx].total_milli();
        }
    }
    order
}

/// The cluster a policy starts from: `fgd-mem` and `tessera` score against the
/// workload with memory, `tessera` with the outlook too.
fn cluster_for(prep: &Prepared, policy: Policy) -> GpuCluster {
    let workload = if matches!(policy, Policy::FgdMem | Policy::Tessera) {
        prep.workload_mem.clone()
    } else {
        prep.workload.clone()
    };
    let mut cluster = GpuCluster::new(prep.nodes.clone(), workload);
    if policy == Policy::Tessera {
        cluster.set_outlook(prep.outlook.clone());
    }
    cluster
}

/// A lower bound on the GPUs (% of capacity) any policy leaves unallocated at
/// 100 % arrived, for the arrivals of one seed: the larger of two relaxations.
///
/// - Shares: a share above half a GPU takes a GPU of its own, and its gap can
///   only be filled by shares no larger than the gap. What the arrived shares
///   of at most half a GPU can fill of those gaps, even split at will, is a
///   fluid assignment (largest first into the gaps at least that large, which
///   is optimal since larger shares fit in fewer gaps); the rest of the gaps
///   is lost whatever the placement (a large share left out loses more than
///   its gap).
/// - GPU models: the arrived GPU request of tasks that accept only models in a
///   set `X` beyond the capacity of `X`, over every set of models (Hall's
///   condition for the fluid assignment of requests to models).
///
/// CPU, memory and whole-node packing are ignored, so the bound is loose where
/// they bind.
pub fn floor_at_100(prep: &Prepared, seed: u64, inflate: f64) -> f64 {
    let mut rng = SplitMix64::new(seed);
    let order = arrival_order(prep, inflate, &mut rng);
    let total = prep.total_milli;
    let mut arrived = 0u64;
    let mut pods: Vec<&PodShape> = Vec::new();
    for &i in &order {
        let p = &prep.pods[i];
        if arrived + p.total_milli() > total {
            break;
        }
        arrived += p.total_milli();
        pods.push(p);
    }
    // Shares.
    let mut gaps: Vec<u64> = pods
        .iter()
        .filter(|p| p.is_share() && p.milli > 500)
        .map(|p| u64::from(1000 - p.milli))
        .collect();
    gaps.sort_unstable();
    let mut small: Vec<u64> = pods
        .iter()
        .filter(|p| p.is_share() && p.milli <= 500)
        .map(|p| u64::from(p.milli))
        .collect();
    small.sort_unstable_by(|a, b| b.cmp(a));
    // suffix[k]: the sum of the gaps from position k on (gaps ascending).
    let mut suffix = vec![0u64; gaps.len() + 1];
    for k in (0..gaps.len()).rev() {
        suffix[k] = suffix[k + 1] + gaps[k];
    }
    let mut used = 0u64;
    for s in small {
        let k = gaps.partition_point(|&g| g < s);
        let avail = suffix[k].saturating_sub(used);
        used += s.min(avail);
    }
    let shares = suffix[0].saturating_sub(used) as f64;
    // Models.
    let mut cap = [0u64; 64];
    for n in &prep.nodes {
        if (n.model as usize) < 64 {
            cap[n.model as usize] += n.gpu_left.len() as u64 * 1000;
        }
    }
    let present: Vec<usize> = (0..64).filter(|&m| cap[m] > 0).collect();
    let mut models = 0.0f64;
    if present.len() <= 16 {
        for subset in 1u32..(1 << present.len()) {
            let mask = present
                .iter()
                .enumerate()
                .filter(|(i, _)| subset & (1 << i) != 0)
                .fold(0u64, |a, (_, &m)| a | (1 << m));
            let c: u64 = present
                .iter()
                .filter(|&&m| mask & (1 << m) != 0)
                .map(|&m| cap[m])
                .sum();
            let d: u64 = pods
                .iter()
                .filter(|p| p.wants_gpu() && p.models != 0 && p.models & !mask == 0)
                .map(|p| p.total_milli())
                .sum();
            models = models.max(d.saturating_sub(c) as f64);
        }
    }
    shares.max(models) / total as f64 * 100.0
}

/// Replays one seed under one policy.
pub fn run_one(prep: &Prepared, policy: Policy, seed: u64, cfg: &ReplayConfig) -> RunResult {
    let mut rng = SplitMix64::new(seed);
    let order = arrival_order(prep, cfg.inflate, &mut rng);
    let mut cluster = cluster_for(prep, policy);
    // Fragmentation is measured against the simulator's workload for every policy.
    let mut frag: Vec<f64> = prep.nodes.iter().map(|n| prep.workload.frag(n)).collect();
    let mut frag_total: f64 = frag.iter().sum();
    // The simulator prefixes node names with a random permutation and breaks
    // score ties by the smallest name.
    let mut rank: Vec<u32> = (0..prep.nodes.len() as u32).collect();
    for i in (1..rank.len()).rev() {
        let j = rng.below_usize(i + 1);
        rank.swap(i, j);
    }
    cluster.set_tie_order(rank);
    let total = prep.total_milli as f64;
    let mut bins = vec![(0.0, 0.0, 0u32); MAX_BIN + 1];
    let mut arrived: u64 = 0;
    let mut placed = 0;
    for &idx in &order {
        let pod = &prep.pods[idx];
        arrived += pod.total_milli();
        if let Some(p) = cluster.schedule(policy, pod, &mut rng) {
            placed += 1;
            let f = prep.workload.frag(&cluster.nodes()[p.node]);
            frag_total += f - frag[p.node];
            frag[p.node] = f;
        }
        let bin = (arrived as f64 / total * 100.0).round_ties_even() as usize;
        if let Some(b) = bins.get_mut(bin) {
            b.0 += cluster.used_milli() as f64 / total * 100.0;
            b.1 += frag_total / total * 100.0;
            b.2 += 1;
        }
    }
    RunResult {
        policy,
        seed,
        bins,
        pods: order.len(),
        placed,
    }
}

/// Per-policy means over seeds.
#[derive(Debug, Clone)]
pub struct PolicySummary {
    pub policy: Policy,
    pub alloc_at_100: f64,
    pub alloc_at_130: f64,
    pub unalloc_at_100: f64,
    pub frag_at_90: f64,
    /// Mean allocation % per arrived-% bin 0..=130 (`None` where no seed has data).
    pub curve: Vec<Option<f64>>,
    pub runs: Vec<RunResult>,
}

fn mean(v: impl Iterator<Item = Option<f64>>) -> f64 {
    let (s, c) = v.flatten().fold((0.0, 0u32), |(s, c), x| (s + x, c + 1));
    if c == 0 { f64::NAN } else { s / f64::from(c) }
}

/// Summarises runs of one policy.
pub fn summarise(policy: Policy, runs: Vec<RunResult>) -> PolicySummary {
    let alloc_at_100 = mean(runs.iter().map(|r| r.alloc_at(100)));
    let alloc_at_130 = mean(runs.iter().map(|r| r.alloc_at(130)));
    let frag_at_90 = mean(runs.iter().map(|r| r.frag_at(90)));
    let curve = (0..=130)
        .map(|b| {
            let m = mean(runs.iter().map(|r| {
                r.bins
                    .get(b)
                    .filter(|v| v.2 > 0)
                    .map(|v| v.0 / f64::from(v.2))
            }));
            (!m.is_nan()).then_some(m)
        })
        .collect();
    PolicySummary {
        policy,
        alloc_at_100,
        alloc_at_130,
        unalloc_at_100: 100.0 - alloc_at_100,
        frag_at_90,
        curve,
        runs,
    }
}

/// Runs every (policy, seed) pair on `threads` threads (all cores when 0) and
/// summarises per policy, in the order given. `progress` is called after each run.
pub fn run_grid(
    prep: &Prepared,
    policies: &[Policy],
    seeds: &[u64],
    cfg: &ReplayConfig,
    threads: usize,
    progress: &(dyn Fn(&RunResult) + Sync),
) -> Vec<PolicySummary> {
    let jobs: Vec<(Policy, u64)> = policies
        .iter()
        .flat_map(|&p| seeds.iter().map(move |&s| (p, s)))
        .collect();
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    }
    .min(jobs.len().max(1));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<RunResult>>> = Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(p, seed)) = jobs.get(k) else { break };
                    let r = run_one(prep, p, seed, cfg);
                    progress(&r);
                    results.lock().expect("no panics while held")[k] = Some(r);
                }
            });
        }
    });
    let mut results = results.into_inner().expect("no panics while held");
    policies
        .iter()
        .enumerate()
        .map(|(pi, &p)| {
            let runs = (0..seeds.len())
                .filter_map(|si| results[pi * seeds.len() + si].take())
                .collect();
            summarise(p, runs)
        })
        .collect()
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG line chart: GPU request that arrived but was not allocated (% of
/// capacity) against arrived GPU request (% of capacity), one line per policy;
/// at 100 % arrived it is the policy's unallocated GPU share.
pub fn svg_plot(title: &str, sums: &[PolicySummary]) -> String {
    let (w, h) = (720.0, 480.0);
    let (l, r, t, b) = (60.0, 170.0, 40.0, 50.0);
    let (pw, ph) = (w - l - r, h - t - b);
    let lost = |p: &PolicySummary| -> Vec<(usize, f64)> {
        p.curve
            .iter()
            .enumerate()
            .filter_map(|(b, v)| v.map(|v| (b, (b as f64 - v).max(0.0))))
            .collect()
    };
    let top = sums
        .iter()
        .flat_map(|p| lost(p).into_iter().map(|x| x.1))
        .fold(5.0f64, f64::max);
    let ymax = (top / 5.0).ceil() * 5.0;
    let x = |v: f64| l + v / 130.0 * pw;
    let y = |v: f64| t + ph - v / ymax * ph;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
        l + pw / 2.0,
        xml_escape(title)
    );
    for k in 0..=13 {
        let v = f64::from(k) * 10.0;
        s += &format!(
            "<line x1=\"{0:.1}\" y1=\"{1:.1}\" x2=\"{0:.1}\" y2=\"{2:.1}\" stroke=\"#ddd\"/>\n<text x=\"{0:.1}\" y=\"{3:.1}\" text-anchor=\"middle\">{4}</text>\n",
            x(v),
            t,
            t + ph,
            t + ph + 16.0,
            v
        );
    }
    let step = ymax / 5.0;
    for k in 0..=5 {
        let v = f64::from(k) * step;
        s += &format!(
            "<line x1=\"{0:.1}\" y1=\"{1:.1}\" x2=\"{2:.1}\" y2=\"{1:.1}\" stroke=\"#ddd\"/>\n<text x=\"{3:.1}\" y=\"{4:.1}\" text-anchor=\"end\">{5}</text>\n",
            l,
            y(v),
            l + pw,
            l - 6.0,
            y(v) + 4.0,
            v
        );
    }
    s += &format!(
        "<line x1=\"{0:.1}\" y1=\"{1:.1}\" x2=\"{0:.1}\" y2=\"{2:.1}\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n",
        x(100.0),
        t,
        t + ph
    );
    s += &format!(
        "<rect x=\"{l}\" y=\"{t}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"black\"/>\n\
<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">arrived GPU request (% of capacity)</text>\n\
<text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\">arrived, not allocated (% of capacity)</text>\n",
        l + pw / 2.0,
        h - 12.0,
        t + ph / 2.0
    );
    for (i, p) in sums.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<String> = lost(p)
            .into_iter()
            .map(|(b, v)| format!("{:.1},{:.1}", x(b as f64), y(v)))
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            pts.join(" ")
        );
        let ly = t + 10.0 + 18.0 * i as f64;
        s += &format!(
            "<line x1=\"{0:.1}\" y1=\"{1:.1}\" x2=\"{2:.1}\" y2=\"{1:.1}\" stroke=\"{colour}\" stroke-width=\"2\"/>\n<text x=\"{3:.1}\" y=\"{4:.1}\">{5} ({6:.2} % at 100)</text>\n",
            l + pw + 10.0,
            ly,
            l + pw + 30.0,
            l + pw + 36.0,
            ly + 4.0,
            xml_escape(p.policy.name()),
            p.unalloc_at_100
        );
    }
    s += "</svg>\n";
    s
}

/// What a real-time replay measured for one policy.
#[derive(Debug, Clone)]
pub struct RealtimeResult {
    pub policy: Policy,
    pub pods: usize,
    /// Pods placed at some point before the trace ended.
    pub placed: usize,
    /// Pods placed on arrival, without waiting.
    pub immediate: usize,
    /// Queueing delay percentiles (seconds) of the pods that were placed.
    pub delay_p50: u64,
    pub delay_p90: u64,
    pub delay_p99: u64,
    pub delay_max: u64,
}

/// Pending departures: (time, pod, node, GPUs), earliest first.
type Departures = std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize, usize, Vec<u32>)>>;

/// How many queued pods are retried after each departure (oldest first).
pub const RETRY_WINDOW: usize = 64;

/// Replays the trace in real time: pods arrive at `creation_time` and leave at
/// `deletion_time` (their lifetime is kept; a pod that waited leaves that much
/// later). A pod that does not fit waits in a FIFO queue; after each departure
/// the oldest [`RETRY_WINDOW`] waiting pods are retried. Pods still waiting when
/// the last event has passed are never placed. Not the FGD paper's protocol.
pub fn run_realtime(
    prep: &Prepared,
    policy: Policy,
    seed: u64,
) -> Result<RealtimeResult, PrepareError> {
    use std::cmp::Reverse;
    use std::collections::VecDeque;
    let mut arrivals: Vec<(u64, usize)> = Vec::with_capacity(prep.pods.len());
    for (i, t) in prep.times.iter().enumerate() {
        match t {
            Some((c, _)) => arrivals.push((*c, i)),
            None => {
                return Err(PrepareError(
                    "the pod list has no creation_time/deletion_time (the multigpu variants lack them); real-time replay needs both".into(),
                ))
            }
        }
    }
    arrivals.sort_unstable();
    let mut cluster = cluster_for(prep, policy);
    let mut rng = SplitMix64::new(seed);
    let mut rank: Vec<u32> = (0..prep.nodes.len() as u32).collect();
    for i in (1..rank.len()).rev() {
        let j = rng.below_usize(i + 1);
        rank.swap(i, j);
    }
    cluster.set_tie_order(rank);
    // Departures: (time, pod, placement).
    let mut departures: Departures = Departures::new();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut delays: Vec<u64> = Vec::new();
    let mut immediate = 0;
    let lifetime = |i: usize| prep.times[i].map_or(0, |(c, d)| d.saturating_sub(c));
    let mut place = |i: usize,
                     now: u64,
                     cluster: &mut GpuCluster,
                     rng: &mut SplitMix64,
                     departures: &mut Departures|
     -> bool {
        match cluster.schedule(policy, &prep.pods[i], rng) {
            Some(p) => {
                let created = prep.times[i].map_or(now, |t| t.0);
                delays.push(now.saturating_sub(created));
                departures.push(Reverse((now + lifetime(i), i, p.node, p.gpus)));
                true
            }
            None => false,
        }
    };
    let mut next = 0;
    loop {
        let next_arrival = arrivals.get(next).map(|a| a.0);
        let next_departure = departures.peek().map(|d| d.0.0);
        match (next_arrival, next_departure) {
            (None, None) => break,
            // Departures first at equal times: they make room.
            (Some(a), Some(d)) if d <= a => {}
            (Some(a), _) => {
                let i = arrivals[next].1;
                next += 1;
                if place(i, a, &mut cluster, &mut rng, &mut departures) {
                    immediate += 1;
                } else {
                    queue.push_back(i);
                }
                continue;
            }
            (None, Some(_)) => {}
        }
        let Some(Reverse((now, i, node, gpus))) = departures.pop() else {
            break;
        };
        cluster.release(&prep.pods[i], &Placement { node, gpus });
        let mut tried = 0;
        let mut k = 0;
        while k < queue.len() && tried < RETRY_WINDOW {
            tried += 1;
            let q = queue[k];
            if place(q, now, &mut cluster, &mut rng, &mut departures) {
                queue.remove(k);
            } else {
                k += 1;
            }
        }
    }
    let placed = delays.len();
    delays.sort_unstable();
    let pct = |p: f64| -> u64 {
        if delays.is_empty() {
            0
        } else {
            delays[((delays.len() - 1) as f64 * p).round() as usize]
        }
    };
    Ok(RealtimeResult {
        policy,
        pods: prep.pods.len(),
        placed,
        immediate,
        delay_p50: pct(0.5),
        delay_p90: pct(0.9),
        delay_p99: pct(0.99),
        delay_max: delays.last().copied().unwrap_or(0),
    })
}
