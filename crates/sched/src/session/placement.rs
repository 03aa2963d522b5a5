//! Placement: finding a node for a task through the free-capacity index,
//! scoring candidates, and the `tessera` share policy's scorer.

use std::collections::BTreeMap;

use tessera_model::{GpuRequest, GpuScope, NetworkTier, Strength};

use crate::config::Profile;
use crate::gpu::Pick;
use crate::index::{NodeIndex, cpu_mag};
use crate::state::{NodeId, State, TaskStatus};

use super::Session;

/// What candidates are ranked by (lower is better): topology fit (outside the
/// gang's network domain, domains spanned beyond one), GPU memory fit,
/// communication load, CPU/memory fill, node id.
pub(super) type ScoreKey = ((u8, u32), u64, usize, u64, NodeId);

/// How many feasible nodes of the best bucket are scored before choosing.
const CANDIDATES: usize = 4;

/// How many feasible nodes a task with an imperfect topology fit collects
/// (over several buckets) before choosing.
const TOPO_CANDIDATES: usize = 64;

/// How many feasible nodes (in binpack order) the `tessera` share policy
/// scores for a fraction of a GPU.
const SHARE_CANDIDATES: usize = 32;

/// What the `tessera` share policy scores with, built once per session from
/// the snapshot's tasks (the observed shapes) and nodes.
pub(super) struct ShareScorer {
    /// GPU model id of each node (`u16::MAX`: none).
    node_model: Vec<u16>,
    /// Model ids by name.
    models: BTreeMap<String, u16>,
    workload: crate::gpu::Workload,
    outlook: crate::gpu::Outlook,
}

impl ShareScorer {
    pub(super) fn new(st: &State<'_>) -> ShareScorer {
        let mut names: Vec<&str> = st
            .nodes
            .iter()
            .flat_map(|n| n.gpus.slots.iter().map(|g| g.model.as_str()))
            .collect();
        names.sort_unstable();
        names.dedup();
        let models: BTreeMap<String, u16> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), i as u16))
            .collect();
        let node_model = st
            .nodes
            .iter()
            .map(|n| {
                n.gpus
                    .slots
                    .first()
                    .and_then(|g| models.get(&g.model).copied())
                    .unwrap_or(u16::MAX)
            })
            .collect();
        let mut sc = ShareScorer {
            node_model,
            models,
            workload: crate::gpu::Workload::default(),
            outlook: crate::gpu::Outlook::default(),
        };
        let shapes: Vec<crate::gpu::PodShape> = (0..st.tasks.len() as u32)
            .filter_map(|t| sc.shape(st, t))
            .collect();
        let nodes: Vec<crate::gpu::NodeState> = (0..st.nodes.len())
            .map(|n| sc.node(st, n as NodeId, false))
            .collect();
        sc.workload = crate::gpu::Workload::typical(&shapes, 0.95, true);
        sc.outlook = crate::gpu::Outlook::new(&shapes, &nodes);
        sc
    }

    /// Task `t` as the placement policies see it (MIG tasks are left out).
    fn shape(&self, st: &State<'_>, t: u32) -> Option<crate::gpu::PodShape> {
        let ts = &st.tasks[t as usize];
        let (num_gpu, milli) = match &ts.gpu {
            GpuRequest::None => (0, 0),
            GpuRequest::Whole { count, .. } => (*count, 1000),
            GpuRequest::Shared { milli, .. } => (1, *milli),
            GpuRequest::Mig { .. } => return None,
        };
        let models = ts
            .src
            .gpu
            .models()
            .iter()
            .filter_map(|m| self.models.get(m))
            .filter(|&&m| m < 64)
            .fold(0u64, |a, &m| a | (1 << m));
        let cpu = i64::try_from(ts.request.cpu_milli).unwrap_or(i64::MAX);
        Some(crate::gpu::PodShape {
            cpu: if cpu == 0 { 100 } else { cpu },
            cpu_req: cpu,
            mem: i64::try_from(ts.request.memory).unwrap_or(i64::MAX),
            num_gpu,
            milli,
            models,
        })
    }

    /// Node `n` as the placement policies see it: free now (`current`), or
    /// as allocatable.
    fn node(&self, st: &State<'_>, n: NodeId, current: bool) -> crate::gpu::NodeState {
        let ns = &st.nodes[n as usize];
        let r = if current {
            &ns.free
        } else {
            &ns.src.allocatable
        };
        let mut out = crate::gpu::NodeState::new(
            i64::try_from(ns.src.allocatable.cpu_milli).unwrap_or(i64::MAX),
            i64::try_from(r.memory).unwrap_or(i64::MAX),
            ns.gpus.slots.len() as u32,
            self.node_model[n as usize],
        );
        out.cpu_left = i64::try_from(r.cpu_milli).unwrap_or(i64::MAX);
        for (k, g) in ns.gpus.slots.iter().enumerate() {
            out.gpu_left[k] = match (&g.mig, current) {
                (Some(_), _) => 0,
                (None, true) => g.free_milli,
                (None, false) => 1000,
            };
        }
        out
    }
}

impl Session<'_, '_, '_> {
    /// Whether task `t` is placed by the spread profile (by its job's kind).
    pub(super) fn spread_for(&self, t: u32) -> bool {
        let kind = self.st.jobs[self.st.tasks[t as usize].job as usize]
            .src
            .kind;
        self.cfg.profile(kind) == Profile::Spread
    }

    /// GPUs of node `n` that task `t` must not use because a reservation
    /// holds them (a bitmask; all ones: the whole node is held).
    pub(super) fn excluded_for(&self, t: u32, n: NodeId) -> u64 {
        let Some(r) = &self.reserve else { return 0 };
        let ts = &self.st.tasks[t as usize];
        if ts.job == r.job || ts.priority >= r.priority {
            return 0;
        }
        r.masks.get(&n).copied().unwrap_or(0)
    }

    /// Whether node `n` is in the network-tier domain the current gang attempt
    /// is restricted to.
    fn tier_ok(&self, n: NodeId) -> bool {
        let Some((tier, dom)) = &self.tier_filter else {
            return true;
        };
        let src = self.st.nodes[n as usize].src;
        NetworkTier {
            tier: *tier,
            strength: Strength::Hard,
        }
        .domain_of(&src.name, &src.network)
            == Some(dom.as_str())
    }

    /// Devices for task `t` on node `n` as things stand, under the current
    /// tier restriction and reservations.
    fn fits_now(&self, t: u32, n: NodeId) -> Option<Pick> {
        if !self.tier_ok(n) || self.only_nodes.as_ref().is_some_and(|o| !o.contains(&n)) {
            return None;
        }
        let ex = self.excluded_for(t, n);
        if ex == u64::MAX {
            return None;
        }
        self.st.fits_excluding(t, n, ex)
    }

    /// Finds a node for task `t` through the index: the first bucket (in binpack
    /// or spread order) that holds a feasible node; the best of up to
    /// [`CANDIDATES`] feasible nodes there. A task whose topology can be
    /// fitted better elsewhere (its GPUs span domains, or its node is outside
    /// its gang's network domain) keeps looking, up to [`TOPO_CANDIDATES`].
    pub(super) fn find_node(&self, t: u32) -> Option<(NodeId, Pick)> {
        let task = &self.st.tasks[t as usize];
        if let (Some(sc), GpuRequest::Shared { .. }) = (&self.share, &task.gpu) {
            return self.find_node_share(t, sc);
        }
        let ix = &self.st.index;
        let max_g = ix.max_gpus();
        let (g_lo, shared) = match &task.gpu {
            GpuRequest::None => (0, false),
            GpuRequest::Whole { count, .. } => (*count, false),
            GpuRequest::Shared { .. } | GpuRequest::Mig { .. } => (0, true),
        };
        if g_lo > max_g {
            return None;
        }
        let c_lo = cpu_mag(task.request.cpu_milli);
        let c_hi = self.max_cpu_mag.max(c_lo);
        let classes: &[u32] = if self.st.predicates {
            &self.st.sig_class_list[task.sig as usize]
        } else {
            &self.st.all_classes
        };
        if classes.is_empty() {
            return None;
        }
        let spread = self.spread_for(t);
        let topo_sensitive = g_lo > 1 || self.tier_pref.is_some();
        // Binpack fills the fullest node that fits; spread the emptiest. A
        // shared-GPU task looks at every GPU bucket (partly used GPUs sit in the
        // low ones), binpack first.
        let gpu_desc = spread && !shared;
        let mut found: Vec<(NodeId, Pick)> = Vec::new();
        for gi in 0..=(max_g - g_lo) {
            let g = if gpu_desc { max_g - gi } else { g_lo + gi };
            for step in 0..=(c_hi - c_lo) {
                let c = if spread { c_hi - step } else { c_lo + step };
                if c > NodeIndex::MAX_CPU_MAG {
                    continue;
                }
                let cap = found.len() + CANDIDATES;
                'classes: for &class in classes {
                    for &n in ix.bucket(class, g, c) {
                        if let Some(p) = self.fits_now(t, n) {
                            found.push((n, p));
                            if found.len() >= cap {
                                break 'classes;
                            }
                        }
                    }
                }
                if !found.is_empty()
                    && (!topo_sensitive
                        || found.len() >= TOPO_CANDIDATES
                        || found.iter().any(|(n, p)| {
                            let k = self.topo_key(t, *n, p);
                            k == (0, 0)
                        }))
                {
                    return self.best(t, found);
                }
            }
        }
        if found.is_empty() {
            None
        } else {
            self.best(t, found)
        }
    }

    /// The `tessera` share policy: the first [`SHARE_CANDIDATES`] feasible
    /// nodes in binpack order, scored by [`crate::gpu::tessera_score_on`] on
    /// the GPUs that can hold the share (memory, model, reservations); the
    /// best score wins, the lower node id among equals.
    fn find_node_share(&self, t: u32, sc: &ShareScorer) -> Option<(NodeId, Pick)> {
        let task = &self.st.tasks[t as usize];
        let GpuRequest::Shared {
            milli,
            memory,
            models,
        } = &task.gpu
        else {
            return None;
        };
        let ix = &self.st.index;
        let classes: &[u32] = if self.st.predicates {
            &self.st.sig_class_list[task.sig as usize]
        } else {
            &self.st.all_classes
        };
        let c_lo = cpu_mag(task.request.cpu_milli);
        let c_hi = self.max_cpu_mag.max(c_lo);
        let mut found: Vec<NodeId> = Vec::new();
        'scan: for g in 0..=ix.max_gpus() {
            for c in c_lo..=c_hi.min(NodeIndex::MAX_CPU_MAG) {
                for &class in classes {
                    for &n in ix.bucket(class, g, c) {
                        if self.fits_now(t, n).is_some() {
                            found.push(n);
                            if found.len() >= SHARE_CANDIDATES {
                                break 'scan;
                            }
                        }
                    }
                }
            }
        }
        let pod = sc.shape(&self.st, t)?;
        let mut scratch = Vec::new();
        let mut best: Option<(f64, NodeId, u32)> = None;
        for n in found {
            let ns = &self.st.nodes[n as usize];
            let view = sc.node(&self.st, n, true);
            let ex = self.excluded_for(t, n);
            let slots = &ns.gpus.slots;
            let eligible = |k: usize| {
                let g = &slots[k];
                g.mig.is_none()
                    && g.free_milli >= *milli
                    && g.free_memory >= *memory
                    && (models.is_empty() || models.contains(&g.model))
                    && !(g.index < 64 && ex & (1u64 << g.index) != 0)
            };
            let before = sc.workload.frag(&view);
            let (score, gpu) = crate::gpu::tessera_score_on(
                &sc.workload,
                &sc.outlook,
                &view,
                before,
                &pod,
                &eligible,
                &mut scratch,
            );
            let Some(k) = gpu else { continue };
            if best.as_ref().is_none_or(|b| score > b.0) {
                best = Some((score, n, slots[k as usize].index));
            }
        }
        best.map(|(_, n, g)| {
            (
                n,
                Pick {
                    gpus: vec![g],
                    mig: None,
                },
            )
        })
    }

    /// Topology fit of task `t` on node `n` with `p` (lower is better): whether
    /// the node is outside the network domain its gang prefers, and how many
    /// domains beyond one its GPUs span (0 on nodes that state no domains).
    fn topo_key(&self, t: u32, n: NodeId, p: &Pick) -> (u8, u32) {
        let ns = &self.st.nodes[n as usize];
        let tier_miss = match &self.tier_pref {
            Some((tier, dom)) => {
                let nt = NetworkTier {
                    tier: *tier,
                    strength: Strength::Soft,
                };
                u8::from(nt.domain_of(&ns.src.name, &ns.src.network) != Some(dom.as_str()))
            }
            None => 0,
        };
        let extra = if p.gpus.len() > 1 {
            let scope = self.st.tasks[t as usize]
                .src
                .topology
                .map_or(GpuScope::NvlinkDomain, |x| x.scope);
            if ns.gpus.has_scope(scope) {
                ns.gpus.domains_spanned(&p.gpus, scope) as u32 - 1
            } else {
                0
            }
        } else {
            0
        };
        (tier_miss, extra)
    }

    /// Scores candidates, in the design brief's order: topology fit, then free
    /// GPU memory fit (binpack: least GPU memory left; spread: most), then
    /// communication-load balance (for gangs: fewest tasks of other gangs on
    /// the node), then CPU and memory (binpack: the node left fullest; spread:
    /// emptiest); ties go to the lower node id.
    fn best(&self, t: u32, found: Vec<(NodeId, Pick)>) -> Option<(NodeId, Pick)> {
        found
            .into_iter()
            .min_by_key(|(n, p)| self.score_key(t, *n, p))
    }

    /// The key [`Session::best`] ranks candidates by (lower is better):
    /// topology fit, GPU memory fit, communication load, CPU/memory fill, node.
    pub(super) fn score_key(&self, t: u32, n: NodeId, p: &Pick) -> ScoreKey {
        let task = &self.st.tasks[t as usize];
        let req = &task.request;
        let spread = self.spread_for(t);
        let gang = self.st.jobs[task.job as usize].src.min_member > 1;
        let score = |n: NodeId| -> u64 {
            let ns = &self.st.nodes[n as usize];
            let a = &ns.src.allocatable;
            let used = |alloc: u64, free: u64, r: u64| -> u64 {
                (alloc
                    .saturating_sub(free.saturating_sub(r))
                    .saturating_mul(1000))
                .checked_div(alloc)
                .unwrap_or(0)
            };
            used(a.cpu_milli, ns.free.cpu_milli, req.cpu_milli)
                + used(a.memory, ns.free.memory, req.memory)
        };
        let gpu_mem_left = |n: NodeId, p: &Pick| -> u64 {
            let g = &self.st.nodes[n as usize].gpus;
            let taken: u64 = match &task.gpu {
                GpuRequest::Whole { .. } => p
                    .gpus
                    .iter()
                    .filter_map(|i| g.slots.iter().find(|s| s.index == *i))
                    .map(|s| s.free_memory)
                    .sum(),
                GpuRequest::Shared { memory, .. } => *memory,
                _ => 0,
            };
            g.free_memory().saturating_sub(taken)
        };
        let comm = |n: NodeId| -> usize {
            if !gang {
                return 0;
            }
            self.st.nodes[n as usize]
                .tasks
                .iter()
                .filter(|&&o| {
                    let oj = self.st.tasks[o as usize].job;
                    oj != task.job && self.st.jobs[oj as usize].src.min_member > 1
                })
                .count()
        };
        let (mem, util) = if spread {
            (u64::MAX - gpu_mem_left(n, p), score(n))
        } else {
            (gpu_mem_left(n, p), u64::MAX - score(n))
        };
        (self.topo_key(t, n, p), mem, comm(n), util, n)
    }

    /// Places a task; on a node where this plan evicts, the binding waits for
    /// the evictions (pipelined), whichever action places it.
    pub(super) fn place_task(&mut self, t: u32, n: NodeId, pick: Pick) {
        let status = if self.releasing[n as usize] > 0 {
            TaskStatus::Pipelined
        } else {
            TaskStatus::Bound
        };
        self.st.place(t, n, pick, status);
    }
}
