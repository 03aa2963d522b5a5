//! Node and GPU placement policies for GPU-sharing workloads.
//!
//! The six baselines follow the FGD paper and its simulator
//! (`hkust-adsl/kubernetes-scheduler-simulator`): `random`, `dotprod` (Tetris),
//! `clustering`, `packing`, `bestfit` and `fgd`, including their integer score
//! scale (0..100), so that ties happen where they happen there. Ties go to the
//! node of lowest rank in a tie-break order the caller sets (the simulator's
//! scheduler picks the smallest node name, and names carry a random per-run
//! prefix). `fgd-mem` is ours: FGD with host memory in the target workload (each
//! typical shape also asks for the least memory its pods ask for), so that GPUs
//! stranded behind exhausted memory count as fragmented. Measured on the Alibaba
//! trace it leaves fewer GPUs unallocated than `fgd` on the default trace and on
//! the `cpu*`, `gpushare*`, `gpuspec*` and `multigpu*` variants tried.
//!
//! Everything is pure: the caller owns the cluster state and passes randomness in
//! through [`RandomSource`].

use std::fmt;
use std::str::FromStr;

use super::frag::{Workload, model_allowed};
use super::outlook::{LOOKAHEAD_WEIGHT, Outlook, STRANDING_WEIGHT};

/// Randomness, passed in by the caller (the scheduler itself owns no generator).
pub trait RandomSource {
    /// A uniform integer in `0..n`; `n > 0`.
    fn below(&mut self, n: u32) -> u32;
}

/// Largest node the baseline scores normalise by (the simulator's `MaxSpecCpu`).
pub const MAX_SPEC_CPU: f64 = 128_000.0;
/// Largest GPU capacity of a node in milli-GPU (`MaxSpecGpu`).
pub const MAX_SPEC_GPU: f64 = 8_000.0;
const MAX_SCORE: i64 = 100;

/// A placement policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Policy {
    Random,
    DotProd,
    Clustering,
    Packing,
    BestFit,
    Fgd,
    /// Ours: FGD whose target workload also knows memory (a node that cannot
    /// give a typical pod its memory cannot run it). Uses whatever workload the
    /// [`GpuCluster`] was built with; callers give it one with memory.
    FgdMem,
    /// Ours: FGD (with memory) that also looks down the chain of fills a
    /// share's gap will get, counts GPUs stranded for lack of CPU, and charges
    /// taking a contended GPU model (see [`super::outlook`]). Uses the
    /// [`Outlook`] set with [`GpuCluster::set_outlook`].
    Tessera,
}

impl Policy {
    pub const ALL: [Policy; 8] = [
        Policy::Random,
        Policy::DotProd,
        Policy::Clustering,
        Policy::Packing,
        Policy::BestFit,
        Policy::Fgd,
        Policy::FgdMem,
        Policy::Tessera,
    ];

    /// The comparison grid (`tessera sim --policy all`): the FGD paper's six
    /// and ours.
    pub const GRID: [Policy; 7] = [
        Policy::Random,
        Policy::DotProd,
        Policy::Clustering,
        Policy::Packing,
        Policy::BestFit,
        Policy::Fgd,
        Policy::Tessera,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::DotProd => "dotprod",
            Policy::Clustering => "clustering",
            Policy::Packing => "packing",
            Policy::BestFit => "bestfit",
            Policy::Fgd => "fgd",
            Policy::FgdMem => "fgd-mem",
            Policy::Tessera => "tessera",
        }
    }

    /// Whether the policy needs the target workload (fragmentation).
    pub fn uses_workload(self) -> bool {
        matches!(self, Policy::Fgd | Policy::FgdMem | Policy::Tessera)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .iter()
            .copied()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
                format!("unknown policy `{s}`; known: {}", names.join(", "))
            })
    }
}

/// What one task asks for, in the units the policies score.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodShape {
    /// Milli-CPU as scored (kube-scheduler's non-zero request: 0 counts as 100).
    pub cpu: i64,
    /// Milli-CPU as reserved.
    pub cpu_req: i64,
    /// Main memory as reserved (any unit, the same as [`NodeState::mem_left`]).
    pub mem: i64,
    /// Number of GPUs; 0 for a CPU-only task.
    pub num_gpu: u32,
    /// Milli-GPU per GPU: 1..999 shares one GPU, 1000 takes whole GPUs.
    pub milli: u32,
    /// Allowed GPU models as a bit mask of model ids; 0 = any.
    pub models: u64,
}

impl PodShape {
    /// A fraction of one GPU.
    pub fn is_share(&self) -> bool {
        self.num_gpu == 1 && self.milli < 1000
    }

    pub fn wants_gpu(&self) -> bool {
        self.num_gpu > 0 && self.milli > 0
    }

    /// Milli-GPU the task takes in total.
    pub fn total_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.milli)
    }

    /// The GPU-affinity tag the clustering policy groups by: 0 = sharing,
    /// `k` = `k` whole GPUs; `None` for CPU-only tasks.
    fn affinity(&self) -> Option<usize> {
        if !self.wants_gpu() {
            None
        } else if self.is_share() {
            Some(0)
        } else {
            Some((self.num_gpu as usize).min(AFFINITY_SLOTS - 1))
        }
    }
}

const AFFINITY_SLOTS: usize = 17;

/// One node as the placement policies see it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    pub cpu_cap: i64,
    pub cpu_left: i64,
    pub mem_left: i64,
    /// GPU model id (see [`PodShape::models`]); `u16::MAX` without GPUs.
    pub model: u16,
    /// Milli-GPU free on each GPU, by index.
    pub gpu_left: Vec<u32>,
    /// Tasks on the node by GPU-affinity tag (clustering policy).
    affinity: [u32; AFFINITY_SLOTS],
}

impl NodeState {
    pub fn new(cpu: i64, mem: i64, gpus: u32, model: u16) -> Self {
        NodeState {
            cpu_cap: cpu,
            cpu_left: cpu,
            mem_left: mem,
            model,
            gpu_left: vec![1000; gpus as usize],
            affinity: [0; AFFINITY_SLOTS],
        }
    }

    pub fn gpu_left_total(&self) -> u64 {
        self.gpu_left.iter().map(|&g| u64::from(g)).sum()
    }

    pub fn fully_free(&self) -> u32 {
        self.gpu_left.iter().filter(|&&g| g == 1000).count() as u32
    }

    /// The node-level checks: CPU, memory, GPU model and GPU capacity.
    pub fn fits(&self, pod: &PodShape) -> bool {
        if pod.cpu_req > self.cpu_left || pod.mem > self.mem_left {
            return false;
        }
        if !pod.wants_gpu() {
            return true;
        }
        if self.gpu_left.is_empty() || !model_allowed(pod.models, self.model) {
            return false;
        }
        if pod.is_share() {
            self.gpu_left.iter().any(|&g| g >= pod.milli)
        } else {
            self.fully_free() >= pod.num_gpu
        }
    }

    /// Takes `pod` onto GPUs `gpus`. Returns false and changes nothing when they
    /// cannot hold it (the caller's bookkeeping is wrong).
    pub fn assign(&mut self, pod: &PodShape, gpus: &[u32]) -> bool {
        if pod.cpu_req > self.cpu_left || pod.mem > self.mem_left {
            return false;
        }
        if pod.wants_gpu() {
            if gpus.len() != pod.num_gpu as usize {
                return false;
            }
            for (k, &i) in gpus.iter().enumerate() {
                if gpus[..k].contains(&i) {
                    return false;
                }
                match self.gpu_left.get(i as usize) {
                    Some(&l) if l >= pod.milli => {}
                    _ => return false,
                }
            }
            for &i in gpus {
                self.gpu_left[i as usize] -= pod.milli;
            }
        } else if !gpus.is_empty() {
            return false;
        }
        self.cpu_left -= pod.cpu_req;
        self.mem_left -= pod.mem;
        if let Some(a) = pod.affinity() {
            self.affinity[a] += 1;
        }
        true
    }

    /// Gives back what `assign` took.
    pub fn release(&mut self, pod: &PodShape, gpus: &[u32]) {
        self.cpu_left = (self.cpu_left + pod.cpu_req).min(self.cpu_cap);
        self.mem_left += pod.mem;
        if pod.wants_gpu() {
            for &i in gpus {
                if let Some(l) = self.gpu_left.get_mut(i as usize) {
                    *l = (*l + pod.milli).min(1000);
                }
            }
        }
        if let Some(a) = pod.affinity() {
            self.affinity[a] = self.affinity[a].saturating_sub(1);
        }
    }

    fn affinity_kinds(&self) -> usize {
        self.affinity.iter().filter(|&&c| c > 0).count()
    }

    /// The first `n` fully free GPUs, by index.
    fn first_free(&self, n: u32) -> Vec<u32> {
        self.gpu_left
            .iter()
            .enumerate()
            .filter(|(_, g)| **g == 1000)
            .take(n as usize)
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Best fit for a sharing task: the fitting GPU with the least left, the
    /// lowest index among equals.
    fn best_fit_gpu(&self, milli: u32) -> Option<u32> {
        let mut best: Option<(u32, u32)> = None;
        for (i, &l) in self.gpu_left.iter().enumerate() {
            if l >= milli && best.is_none_or(|(_, bl)| l < bl) {
                best = Some((i as u32, l));
            }
        }
        best.map(|b| b.0)
    }
}

/// Where a task goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: usize,
    pub gpus: Vec<u32>,
}

/// A cluster of [`NodeState`]s with the bookkeeping the policies need: the
/// fragmentation of each node against the target workload, kept current.
#[derive(Debug, Clone)]
pub struct GpuCluster {
    nodes: Vec<NodeState>,
    workload: Workload,
    frag: Vec<f64>,
    /// Tie-break order: among equal scores the node with the lowest rank wins.
    rank: Vec<u32>,
    used_milli: u64,
    total_milli: u64,
    scratch: Vec<u32>,
    outlook: Outlook,
}

impl GpuCluster {
    pub fn new(nodes: Vec<NodeState>, workload: Workload) -> Self {
        let frag = nodes.iter().map(|n| workload.frag(n)).collect();
        let total_milli = nodes.iter().map(|n| n.gpu_left.len() as u64 * 1000).sum();
        let used_milli = nodes
            .iter()
            .map(|n| n.gpu_left.len() as u64 * 1000 - n.gpu_left_total())
            .sum();
        let rank = (0..nodes.len() as u32).collect();
        GpuCluster {
            nodes,
            workload,
            frag,
            rank,
            used_milli,
            total_milli,
            scratch: Vec::new(),
            outlook: Outlook::default(),
        }
    }

    /// Sets what the `tessera` policy knows of the workload (see
    /// [`Outlook::new`]); without it, `tessera` scores as `fgd-mem`.
    pub fn set_outlook(&mut self, outlook: Outlook) {
        self.outlook = outlook;
    }

    /// Sets the tie-break order: `rank[i]` is node `i`'s rank, lowest wins among
    /// equal scores. The FGD simulator names nodes with a random permutation
    /// prefix and its scheduler picks the smallest name among the best, so a
    /// per-run permutation reproduces it. Ignored unless it has one entry per node.
    pub fn set_tie_order(&mut self, rank: Vec<u32>) {
        if rank.len() == self.nodes.len() {
            self.rank = rank;
        }
    }

    pub fn nodes(&self) -> &[NodeState] {
        &self.nodes
    }

    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// Milli-GPU allocated.
    pub fn used_milli(&self) -> u64 {
        self.used_milli
    }

    /// Milli-GPU in the cluster.
    pub fn total_milli(&self) -> u64 {
        self.total_milli
    }

    /// Fragmented milli-GPU of the whole cluster (sum over nodes).
    pub fn frag_total(&self) -> f64 {
        self.frag.iter().sum()
    }

    /// Chooses a node and GPUs for `pod` under `policy`, or `None` when no node
    /// can hold it. Changes nothing.
    pub fn choose(
        &mut self,
        policy: Policy,
        pod: &PodShape,
        rng: &mut dyn RandomSource,
    ) -> Option<Placement> {
        if policy == Policy::Random {
            // The simulator's random policy: a uniformly random feasible node.
            let feasible = self.nodes.iter().filter(|n| n.fits(pod)).count();
            if feasible == 0 {
                return None;
            }
            let k = rng.below(feasible as u32) as usize;
            let node = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| n.fits(pod))
                .nth(k)
                .map(|(i, _)| i)?;
            let n = &self.nodes[node];
            let gpus = if !pod.wants_gpu() {
                Vec::new()
            } else if pod.is_share() {
                vec![random_fit_gpu(n, pod.milli, rng)?]
            } else {
                n.first_free(pod.num_gpu)
            };
            return Some(Placement { node, gpus });
        }
        let mut best: Option<(usize, f64, f64, Option<u32>)> = None;
        let mut scratch = std::mem::take(&mut self.scratch);
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.fits(pod) {
                continue;
            }
            let (score, tie_break, hint) = match policy {
                Policy::Random => (0.0, 0.0, None),
                Policy::DotProd => (dot_prod_score(node, pod) as f64, 0.0, None),
                Policy::Clustering => (clustering_score(node, pod) as f64, 0.0, None),
                Policy::Packing => (packing_score(node, pod) as f64, 0.0, None),
                Policy::BestFit => (best_fit_score(node, pod) as f64, 0.0, None),
                Policy::Fgd => {
                    let (d, g) =
                        fgd_delta(&self.workload, node, self.frag[i], pod, &mut scratch, true);
                    (d, 0.0, g)
                }
                Policy::FgdMem => {
                    let (d, g) =
                        fgd_delta(&self.workload, node, self.frag[i], pod, &mut scratch, true);
                    (d, 0.0, g)
                }
                Policy::Tessera => {
                    let (d, g) = tessera_score(
                        &self.workload,
                        &self.outlook,
                        node,
                        self.frag[i],
                        pod,
                        &mut scratch,
                    );
                    (d, 0.0, g)
                }
            };
            let better = match &best {
                None => true,
                Some((b, s, t, _)) => {
                    score > *s
                        || (score == *s
                            && (tie_break > *t
                                || (tie_break == *t && self.rank[i] < self.rank[*b])))
                }
            };
            if better {
                best = Some((i, score, tie_break, hint));
            }
        }
        self.scratch = scratch;
        let (node, _, _, hint) = best?;
        let n = &self.nodes[node];
        let gpus = if !pod.wants_gpu() {
            Vec::new()
        } else if pod.is_share() {
            let g = match (policy, hint) {
                (Policy::Fgd | Policy::FgdMem | Policy::Tessera, Some(g)) => Some(g),
                (Policy::Random, _) => random_fit_gpu(n, pod.milli, rng),
                _ => n.best_fit_gpu(pod.milli),
            };
            vec![g?]
        } else {
            n.first_free(pod.num_gpu)
        };
        Some(Placement { node, gpus })
    }

    /// Records a placement. Returns false (and changes nothing) if it does not fit.
    pub fn assign(&mut self, pod: &PodShape, p: &Placement) -> bool {
        let Some(node) = self.nodes.get_mut(p.node) else {
            return false;
        };
        if !node.assign(pod, &p.gpus) {
            return false;
        }
        self.used_milli += pod.total_milli();
        self.frag[p.node] = self.workload.frag(&self.nodes[p.node]);
        true
    }

    /// Undoes [`GpuCluster::assign`].
    pub fn release(&mut self, pod: &PodShape, p: &Placement) {
        if let Some(node) = self.nodes.get_mut(p.node) {
            node.release(pod, &p.gpus);
            self.used_milli = self.used_milli.saturating_sub(pod.total_milli());
            self.frag[p.node] = self.workload.frag(&self.nodes[p.node]);
        }
    }

    /// Chooses and assigns in one step.
    pub fn schedule(
        &mut self,
        policy: Policy,
        pod: &PodShape,
        rng: &mut dyn RandomSource,
    ) -> Option<Placement> {
        let p = self.choose(policy, pod, rng)?;
        self.assign(pod, &p).then_some(p)
    }
}

fn random_fit_gpu(n: &NodeState, milli: u32, rng: &mut dyn RandomSource) -> Option<u32> {
    let mut count = 0;
    let mut pick = None;
    for (i, &l) in n.gpu_left.iter().enumerate() {
        if l >= milli {
            count += 1;
            if rng.below(count) == 0 {
                pick = Some(i as u32);
            }
        }
    }
    pick
}

/// Tetris: the smaller the dot product of free and requested (normalised by the
/// largest node), the better.
fn dot_prod_score(n: &NodeState, pod: &PodShape) -> i64 {
    if n.cpu_left < pod.cpu {
        return 0;
    }
    let node = [
        n.cpu_left as f64 / MAX_SPEC_CPU,
        n.gpu_left_total() as f64 / MAX_SPEC_GPU,
    ];
    let req = [
        pod.cpu as f64 / MAX_SPEC_CPU,
        pod.total_milli() as f64 / MAX_SPEC_GPU,
    ];
    let dot = (node[0] * req[0] + node[1] * req[1]) / 2.0;
    (MAX_SCORE as f64 * (1.0 - dot)) as i64
}

/// Prefer nodes whose tasks have the same GPU shape, then fuller nodes.
fn clustering_score(n: &NodeState, pod: &PodShape) -> i64 {
    let Some(a) = pod.affinity() else {
        return 0;
    };
    let fill =
        MAX_SCORE / 4 * (MAX_SPEC_GPU as i64 - n.gpu_left_total() as i64) / MAX_SPEC_GPU as i64;
    let kinds = n.affinity_kinds();
    let base = if n.affinity[a] > 0 {
        if kinds == 1 { 3 } else { 2 }
    } else if kinds == 0 {
        1
    } else {
        0
    };
    fill + MAX_SCORE * base / 4
}

/// Prefer shared GPUs, then free GPUs on used nodes, then free nodes.
fn packing_score(n: &NodeState, pod: &PodShape) -> i64 {
    if !pod.wants_gpu() {
        return 0;
    }
    let free = n.fully_free() as i64;
    if free == n.gpu_left.len() as i64 {
        return (MAX_SCORE / 3 - free).max(free);
    }
    let mut order: Vec<usize> = (0..n.gpu_left.len()).collect();
    order.sort_by_key(|&i| n.gpu_left[i]);
    let mut need = pod.num_gpu;
    let mut free_used = 0i64;
    let mut ratio = 0i64;
    for i in order {
        if need == 0 {
            break;
        }
        let l = n.gpu_left[i];
        if pod.milli <= l {
            need -= 1;
            if l == 1000 {
                free_used += 1;
            }
            ratio += i64::from(l) * 100 / 1000;
        }
    }
    if need != 0 {
        return 0;
    }
    if free_used > 0 {
        return (MAX_SCORE / 2 - free_used).max(MAX_SCORE / 3);
    }
    (MAX_SCORE - ratio / 10).max(MAX_SCORE / 2)
}

/// Weighted leftover of CPU and GPU after placement, in `[0, 1]`; lower is better.
fn best_fit_left(n: &NodeState, pod: &PodShape) -> f64 {
    let cpu = (n.cpu_left - pod.cpu) as f64 / MAX_SPEC_CPU;
    let gpu = (n.gpu_left_total() as f64 - pod.total_milli() as f64) / MAX_SPEC_GPU;
    0.5 * cpu + 0.5 * gpu
}

fn best_fit_score(n: &NodeState, pod: &PodShape) -> i64 {
    if n.cpu_left < pod.cpu {
        return 0;
    }
    ((1.0 - best_fit_left(n, pod)) * MAX_SCORE as f64) as i64
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// FGD's score of a node: how much placing `pod` there lowers the node's
/// expected fragmentation. With `quantised`, the simulator's integer score
/// `⌊sigmoid(Δ/1000)·100⌋`; otherwise Δ itself. For a sharing task, also the GPU
/// that scores best (the lowest index among equals).
fn fgd_delta(
    w: &Workload,
    n: &NodeState,
    before: f64,
    pod: &PodShape,
    scratch: &mut Vec<u32>,
    quantised: bool,
) -> (f64, Option<u32>) {
    let cpu_after = n.cpu_left - pod.cpu;
    let mem_after = n.mem_left - pod.mem;
    let score = |after: f64| {
        let d = before - after;
        if quantised {
            (sigmoid(d / 1000.0) * MAX_SCORE as f64) as i64 as f64
        } else {
            d
        }
    };
    scratch.clear();
    scratch.extend_from_slice(&n.gpu_left);
    if pod.is_share() {
        let mut best: Option<(f64, u32)> = None;
        for i in 0..scratch.len() {
            let l = scratch[i];
            if l < pod.milli {
                continue;
            }
            // GPUs with the same free share give the same fragmentation.
            if scratch[..i].contains(&l) {
                continue;
            }
            scratch[i] = l - pod.milli;
            let s = score(w.frag_of(cpu_after, mem_after, n.model, scratch));
            scratch[i] = l;
            if best.is_none_or(|(bs, _)| s > bs) {
                best = Some((s, i as u32));
            }
        }
        match best {
            Some((s, g)) => (s, Some(g)),
            None => (f64::NEG_INFINITY, None),
        }
    } else {
        if pod.wants_gpu() {
            let mut need = pod.num_gpu;
            for l in scratch.iter_mut() {
                if need == 0 {
                    break;
                }
                if *l >= pod.milli {
                    *l -= pod.milli;
                    need -= 1;
                }
            }
        }
        (
            score(w.frag_of(cpu_after, mem_after, n.model, scratch)),
            None,
        )
    }
}

/// The `tessera` policy's score of a node (higher is better) and, for a
/// sharing task, the GPU: FGD's quantised score of the change in expected
/// fragmentation, that change also counting the GPUs the node strands for lack
/// of CPU and the model pressure of taking them; a share then also pays
/// the change in the expected eventual waste of the GPU it goes to.
fn tessera_score(
    w: &Workload,
    o: &Outlook,
    n: &NodeState,
    before: f64,
    pod: &PodShape,
    scratch: &mut Vec<u32>,
) -> (f64, Option<u32>) {
    tessera_score_on(w, o, n, before, pod, &|_| true, scratch)
}

/// [`tessera_score`] for a caller that knows more about the GPUs than
/// [`NodeState`] says (GPU memory, reservations): a share goes only on a GPU
/// (by position in `gpu_left`) that `eligible` accepts. `before` is
/// `w.frag(n)`. Returns `(f64::NEG_INFINITY, None)` when no GPU is eligible.
pub fn tessera_score_on(
    w: &Workload,
    o: &Outlook,
    n: &NodeState,
    before: f64,
    pod: &PodShape,
    eligible: &dyn Fn(usize) -> bool,
    scratch: &mut Vec<u32>,
) -> (f64, Option<u32>) {
    let cpu_after = n.cpu_left - pod.cpu;
    let mem_after = n.mem_left - pod.mem;
    let stranded_before = o.stranded(n.cpu_left, &n.gpu_left);
    let pressure = o.pressure_cost(pod, n.model);
    let score = |after: f64, gpus: &[u32]| {
        let d = before
            - after
            - STRANDING_WEIGHT * (o.stranded(cpu_after, gpus) - stranded_before)
            - pressure;
        (sigmoid(d / 1000.0) * MAX_SCORE as f64) as i64 as f64
    };
    scratch.clear();
    scratch.extend_from_slice(&n.gpu_left);
    if pod.is_share() {
        let mut best: Option<(f64, u32)> = None;
        for i in 0..scratch.len() {
            let l = scratch[i];
            if l < pod.milli || !eligible(i) {
                continue;
            }
            // GPUs with the same free share give the same score.
            if (0..i).any(|k| scratch[k] == l && eligible(k)) {
                continue;
            }
            scratch[i] = l - pod.milli;
            let s = score(w.frag_of(cpu_after, mem_after, n.model, scratch), scratch)
                - LOOKAHEAD_WEIGHT * (o.waste(l - pod.milli) - o.waste(l));
            scratch[i] = l;
            if best.is_none_or(|(bs, _)| s > bs) {
                best = Some((s, i as u32));
            }
        }
        match best {
            Some((s, g)) => (s, Some(g)),
            None => (f64::NEG_INFINITY, None),
        }
    } else {
        if pod.wants_gpu() {
            let mut need = pod.num_gpu;
            for l in scratch.iter_mut() {
                if need == 0 {
                    break;
                }
                if *l >= pod.milli {
                    *l -= pod.milli;
                    need -= 1;
                }
            }
        }
        let f = w.frag_of(cpu_after, mem_after, n.model, scratch);
        (score(f, scratch), None)
    }
}
