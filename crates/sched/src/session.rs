//! One scheduling session: the actions, run in the configured order over the
//! session state, and the plan they leave behind.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use tessera_model::{
    Binding, Dim, Eviction, GpuRequest, GpuScope, GroupKind, MigRef, MigStep, NetworkTier, Pending,
    Plan, Reservation, Resources, Snapshot, Strength, TaskId,
};

use crate::config::{Action, Config, PluginName, Profile, SharePolicy};
use crate::gpu::Pick;
use crate::index::{NodeIndex, cpu_mag};
use crate::proportion::water_fill_resources;
use crate::state::{JobId, NodeId, QueueId, State, TaskStatus, class_failure};
use crate::victims;

/// Hooks a caller can observe the session through (benchmarks time decisions
/// with it; the scheduler itself never reads a clock).
pub trait Observer {
    /// Called after each placement decision for one task, placed or not.
    fn decision(&mut self) {}
    /// Called when a victim search (preempt or reclaim, for one task or one
    /// gang) begins.
    fn search_begin(&mut self) {}
    /// Called when that search ends, with the number of victims it chose (0:
    /// none, or no set makes the task fit).
    fn search_end(&mut self, _victims: usize) {}
}

/// An observer that does nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;
impl Observer for NoObserver {}

/// What candidates are ranked by (lower is better): topology fit (outside the
/// gang's network domain, domains spanned beyond one), GPU memory fit,
/// communication load, CPU/memory fill, node id.
type ScoreKey = ((u8, u32), u64, usize, u64, NodeId);

/// Allocation rounds at most: each further round follows groups parked in the
/// one before (see `allocate`).
const MAX_ROUNDS: usize = 8;

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
struct ShareScorer {
    /// GPU model id of each node (`u16::MAX`: none).
    node_model: Vec<u16>,
    /// Model ids by name.
    models: BTreeMap<String, u16>,
    workload: crate::gpu::Workload,
    outlook: crate::gpu::Outlook,
}

impl ShareScorer {
    fn new(st: &State<'_>) -> ShareScorer {
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

/// An undo log for gang placement: either the whole group lands, or nothing does.
#[derive(Debug, Default)]
struct Stmt {
    ops: Vec<Op>,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Placed(u32),
    Evicted(u32),
}

/// A reservation in force: tasks of other jobs below `priority` stay off the
/// GPUs in `masks` (per node; all ones: the whole node).
#[derive(Debug)]
struct Reserve {
    job: JobId,
    priority: i32,
    masks: BTreeMap<NodeId, u64>,
}

struct Session<'s, 'c, 'o> {
    st: State<'s>,
    cfg: &'c Config,
    obs: &'o mut dyn Observer,
    gang: bool,
    proportion: bool,
    /// The current gang attempt may use only nodes in this network-tier
    /// domain: (tier, domain).
    tier_filter: Option<(u8, String)>,
    /// The current gang prefers nodes in this network-tier domain.
    tier_pref: Option<(u8, String)>,
    /// Devices held for a queued gang (the `reservation` plugin).
    reserve: Option<Reserve>,
    /// What the plan says about reservations.
    reservations: Vec<Reservation>,
    /// Committed placements, in decision order.
    placed: Vec<u32>,
    /// Committed evictions, in decision order, with reasons.
    evicted: Vec<(u32, String)>,
    /// Eviction reasons of the current statement.
    pending_evictions: Vec<(u32, String)>,
    /// Reasons for groups that were not admitted.
    enqueue_reason: BTreeMap<JobId, String>,
    max_cpu_mag: u32,
    /// Bumped on every commit: diagnoses cached under an older generation are stale.
    generation: u64,
    diag_cache: HashMap<(u32, Resources, GpuRequest), (u64, String)>,
    /// Nodes that run tasks which were running before the session and may be
    /// evicted: the only places preempt and reclaim look for victims.
    victim_nodes: Vec<NodeId>,
    /// Evictions in the plan so far, per node.
    releasing: Vec<u32>,
    /// The `tessera` share policy, when configured.
    share: Option<ShareScorer>,
    /// The current attempt may use only these nodes (a gang's joint victim
    /// search, beyond its queue's deserved share).
    only_nodes: Option<Vec<NodeId>>,
}

/// Runs a session; see [`crate::schedule`].
pub fn run(snapshot: &Snapshot, cfg: &Config, obs: &mut dyn Observer) -> Plan {
    run_session(snapshot, cfg, obs).into_plan()
}

/// Runs the configured actions; the session, for the plan or an explanation.
fn run_session<'s, 'c, 'o>(
    snapshot: &'s Snapshot,
    cfg: &'c Config,
    obs: &'o mut dyn Observer,
) -> Session<'s, 'c, 'o> {
    let st = State::new(snapshot, cfg.enabled(PluginName::Predicates));
    let max_cpu_mag = st
        .nodes
        .iter()
        .map(|n| cpu_mag(n.src.allocatable.cpu_milli))
        .max()
        .unwrap_or(0);
    let mut s = Session {
        st,
        cfg,
        obs,
        gang: cfg.enabled(PluginName::Gang),
        proportion: cfg.enabled(PluginName::Proportion),
        tier_filter: None,
        tier_pref: None,
        reserve: None,
        reservations: Vec::new(),
        placed: Vec::new(),
        evicted: Vec::new(),
        pending_evictions: Vec::new(),
        enqueue_reason: BTreeMap::new(),
        max_cpu_mag,
        generation: 0,
        diag_cache: HashMap::new(),
        victim_nodes: Vec::new(),
        releasing: Vec::new(),
        only_nodes: None,
        share: None,
    };
    if cfg.share_policy == SharePolicy::Tessera {
        s.share = Some(ShareScorer::new(&s.st));
    }
    s.releasing = vec![0; s.st.nodes.len()];
    s.victim_nodes = (0..s.st.nodes.len() as NodeId)
        .filter(|&n| {
            s.st.nodes[n as usize].tasks.iter().any(|&t| {
                let ts = &s.st.tasks[t as usize];
                ts.status == TaskStatus::Running && s.st.jobs[ts.job as usize].src.preemptable
            })
        })
        .collect();
    // Groups that already hold resources are admitted; without an enqueue
    // action, every group is.
    let enqueue = cfg.runs(Action::Enqueue);
    for j in 0..s.st.jobs.len() {
        let job = &mut s.st.jobs[j];
        job.admitted = job.queue.is_some() && (!enqueue || job.occupied > 0);
    }
    s.compute_deserved();
    for &a in &cfg.actions {
        match a {
            Action::Enqueue => {
                s.enqueue();
                s.compute_deserved();
            }
            Action::Allocate => s.allocate(),
            Action::Backfill => s.backfill(),
            Action::Preempt => s.preempt(),
            Action::Reclaim => s.reclaim(),
        }
    }
    s
}

/// Why task `task` went where it went, or did not go: the session is run as
/// [`run`] does; then, on the cluster as the session leaves it (the task
/// itself taken off its node, if it was placed), every node is judged for it:
/// the nodes it fits ranked by the scoring rules (best first, the chosen one
/// marked), then the others with the rule that drops each. `None` when the
/// snapshot has no such task.
pub fn explain(snapshot: &Snapshot, cfg: &Config, task: &TaskId) -> Option<Explanation> {
    let mut obs = NoObserver;
    let mut s = run_session(snapshot, cfg, &mut obs);
    let t = (0..s.st.tasks.len() as u32).find(|&t| s.task_id(t) == *task)?;
    let j = s.st.tasks[t as usize].job;
    let ts = &s.st.tasks[t as usize];
    let node_name = |n: Option<NodeId>| {
        n.map(|n| s.st.nodes[n as usize].src.name.clone())
            .unwrap_or_default()
    };
    let (outcome, chosen) = match ts.status {
        TaskStatus::Bound | TaskStatus::Pipelined => (
            format!(
                "bound to {}{}{}",
                node_name(ts.node),
                if ts.gpus.is_empty() {
                    String::new()
                } else {
                    let g: Vec<String> = ts.gpus.iter().map(u32::to_string).collect();
                    format!(" gpus [{}]", g.join(","))
                },
                if ts.status == TaskStatus::Pipelined {
                    " (after evictions)"
                } else {
                    ""
                }
            ),
            ts.node,
        ),
        TaskStatus::Running => (
            format!("already running on {}", node_name(ts.node)),
            ts.node,
        ),
        TaskStatus::Evicted => (
            format!(
                "evicted from {}: {}",
                node_name(ts.node),
                s.evicted
                    .iter()
                    .find(|e| e.0 == t)
                    .map(|e| e.1.clone())
                    .unwrap_or_default()
            ),
            None,
        ),
        TaskStatus::Pending => {
            let mut cache = HashMap::new();
            let why = s
                .pending_reason(j, &mut cache)
                .map(|p| p.reason)
                .unwrap_or_else(|| "pending".into());
            (format!("pending: {why}"), None)
        }
    };
    // Judge the nodes as if the task were not placed.
    let saved = match ts.status {
        TaskStatus::Bound | TaskStatus::Pipelined | TaskStatus::Running => {
            let status = ts.status;
            let n = ts.node;
            let pick = Pick {
                gpus: ts.gpus.clone(),
                mig: ts.mig.clone(),
            };
            s.st.unplace(t, TaskStatus::Pending);
            Some((status, n, pick))
        }
        _ => None,
    };
    let mut fits: Vec<(ScoreKey, NodeVerdict)> = Vec::new();
    let mut dropped: Vec<NodeVerdict> = Vec::new();
    for n in 0..s.st.nodes.len() as NodeId {
        let name = s.st.nodes[n as usize].src.name.clone();
        match s.node_rule(t, n) {
            Ok(pick) => {
                let key = s.score_key(t, n, &pick);
                let spread = s.spread_for(t);
                let gpus: Vec<String> = pick.gpus.iter().map(u32::to_string).collect();
                let rule = format!(
                    "fits{}: {} GPU domain{} beyond one{}, {} GPU memory {}, {} tasks of other gangs, CPU/memory {}",
                    if gpus.is_empty() {
                        String::new()
                    } else {
                        format!(" on gpus [{}]", gpus.join(","))
                    },
                    key.0.1,
                    if key.0.1 == 1 { "" } else { "s" },
                    if key.0.0 > 0 {
                        ", outside the gang's network domain"
                    } else {
                        ""
                    },
                    tessera_model::quantity::format_bytes(if spread {
                        u64::MAX - key.1
                    } else {
                        key.1
                    }),
                    if spread {
                        "left (spread: most)"
                    } else {
                        "left (binpack: least)"
                    },
                    key.2,
                    if spread {
                        format!("{}‰ used after", key.3 / 2)
                    } else {
                        format!("{}‰ used after", (u64::MAX - key.3) / 2)
                    }
                );
                fits.push((
                    key,
                    NodeVerdict {
                        node: name,
                        fits: true,
                        chosen: Some(n) == chosen,
                        rule,
                    },
                ));
            }
            Err(rule) => dropped.push(NodeVerdict {
                node: name,
                fits: false,
                chosen: false,
                rule,
            }),
        }
    }
    if let Some((status, Some(n), pick)) = saved {
        s.st.place(t, n, pick, status);
    }
    fits.sort_by(|a, b| b.1.chosen.cmp(&a.1.chosen).then_with(|| a.0.cmp(&b.0)));
    let mut nodes: Vec<NodeVerdict> = fits.into_iter().map(|x| x.1).collect();
    nodes.extend(dropped);
    Some(Explanation {
        task: task.clone(),
        outcome,
        nodes,
    })
}

/// What [`explain`] says about one task.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Explanation {
    pub task: TaskId,
    /// Where it went, or why it waits, as the plan says.
    pub outcome: String,
    /// Every node: those it fits, best first (the chosen one first of all),
    /// then the others with the rule that drops each.
    pub nodes: Vec<NodeVerdict>,
}

/// One node's verdict for a task.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeVerdict {
    pub node: String,
    pub fits: bool,
    pub chosen: bool,
    /// For a node it fits, the scoring figures; otherwise the rule that
    /// drops it, with the numbers.
    pub rule: String,
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}: {}", self.task, self.outcome)?;
        let w = self
            .nodes
            .iter()
            .map(|n| n.node.len())
            .max()
            .unwrap_or(4)
            .max(4);
        for n in &self.nodes {
            let mark = if n.chosen {
                "chosen "
            } else if n.fits {
                "fits   "
            } else {
                "dropped"
            };
            writeln!(f, "  {mark} {:<w$}  {}", n.node, n.rule)?;
        }
        Ok(())
    }
}

impl Session<'_, '_, '_> {
    // ----- proportion -------------------------------------------------------

    /// Demand per queue subtree: what it holds plus what admitted groups ask for.
    fn compute_demand(&mut self) {
        for q in &mut self.st.queues {
            q.demand = q.allocated.clone();
        }
        for j in 0..self.st.jobs.len() {
            let job = &self.st.jobs[j];
            let Some(q) = job.queue else { continue };
            if !job.admitted || job.parked {
                continue;
            }
            let mut want = Resources::default();
            for &t in &job.tasks {
                if self.st.tasks[t as usize].status == TaskStatus::Pending {
                    want.add_assign_saturating(&self.st.tasks[t as usize].request);
                }
            }
            let mut cur = Some(q);
            while let Some(c) = cur {
                self.st.queues[c as usize]
                    .demand
                    .add_assign_saturating(&want);
                cur = self.st.queues[c as usize].parent;
            }
        }
    }

    fn compute_deserved(&mut self) {
        self.compute_demand();
        let order = self.st.queues_top_down();
        let roots: Vec<QueueId> = order
            .iter()
            .copied()
            .filter(|&q| self.st.queues[q as usize].parent.is_none())
            .collect();
        let total = self.st.total.clone();
        self.fill_children(&total, &roots);
        for &q in &order {
            let children = self.st.queues[q as usize].children.clone();
            if !children.is_empty() {
                let d = self.st.queues[q as usize].deserved.clone();
                self.fill_children(&d, &children);
            }
        }
    }

    fn fill_children(&mut self, total: &Resources, children: &[QueueId]) {
        let weights: Vec<u64> = children
            .iter()
            .map(|&c| self.st.queues[c as usize].weight)
            .collect();
        let guarantees: Vec<Resources> = children
            .iter()
            .map(|&c| self.st.queues[c as usize].guarantee.clone())
            .collect();
        let caps: Vec<Resources> = children
            .iter()
            .map(|&c| {
                let q = &self.st.queues[c as usize];
                match &q.capability {
                    Some(cap) => q.demand.min(cap),
                    None => q.demand.clone(),
                }
            })
            .collect();
        let parts = water_fill_resources(total, &weights, &guarantees, &caps);
        for (&c, mut d) in children.iter().zip(parts) {
            // A queue's deserved share never falls below its guarantee.
            d = d.max(&self.st.queues[c as usize].guarantee);
            self.st.queues[c as usize].deserved = d;
        }
    }

    /// Checks that `req` may be added to leaf queue `q`: every queue on the path
    /// to the root stays within capability, and (with `proportion`) the leaf
    /// stays within its deserved share.
    fn queue_allows(&self, q: QueueId, req: &Resources, use_deserved: bool) -> Result<(), String> {
        let mut cur = Some(q);
        while let Some(c) = cur {
            let qs = &self.st.queues[c as usize];
            if let Some(cap) = &qs.capability {
                if let Some(d) = over(&qs.allocated, req, cap) {
                    let mut msg = format!(
                        "queue {} would exceed its capability of {d} ({} of {}: {} held, {} asked)",
                        qs.name,
                        fmt_dim(&d, qs.allocated.get(&d).saturating_add(req.get(&d))),
                        fmt_dim(&d, cap.get(&d)),
                        fmt_dim(&d, qs.allocated.get(&d)),
                        fmt_dim(&d, req.get(&d)),
                    );
                    if c != q {
                        let leaf = &self.st.queues[q as usize];
                        msg.push_str(&format!(
                            "; it is an ancestor of queue {}, which holds {}",
                            leaf.name,
                            fmt_dim(&d, leaf.allocated.get(&d))
                        ));
                    }
                    return Err(msg);
                }
            }
            cur = qs.parent;
        }
        if self.proportion && use_deserved {
            let qs = &self.st.queues[q as usize];
            // A deserved share as large as the whole cluster bounds nothing that
            // node fit does not already bound; skip it so that the reason for
            // waiting names the nodes.
            let mut limit = qs.deserved.clone();
            for (d, v) in self.st.total.dims() {
                if limit.get(&d) >= v {
                    limit.set(&d, u64::MAX);
                }
            }
            if let Some(d) = over(&qs.allocated, req, &limit) {
                let mut msg = format!(
                    "queue {} is at its deserved share of {d} ({} held, {} deserved, {} asked)",
                    qs.name,
                    fmt_dim(&d, qs.allocated.get(&d)),
                    fmt_dim(&d, qs.deserved.get(&d)),
                    fmt_dim(&d, req.get(&d)),
                );
                if let Some(p) = qs.parent {
                    let ps = &self.st.queues[p as usize];
                    msg.push_str(&format!(
                        "; parent {} deserves {}, holds {}",
                        ps.name,
                        fmt_dim(&d, ps.deserved.get(&d)),
                        fmt_dim(&d, ps.allocated.get(&d))
                    ));
                }
                return Err(msg);
            }
        }
        Ok(())
    }

    /// Queue order key: the dominant share of allocated over deserved.
    fn queue_share(&self, q: QueueId) -> u64 {
        let qs = &self.st.queues[q as usize];
        let mut share: f64 = 0.0;
        for (d, v) in qs.allocated.dims() {
            if d == Dim::Pods || v == 0 {
                continue;
            }
            let des = qs.deserved.get(&d);
            let s = if des == 0 { 1e6 } else { v as f64 / des as f64 };
            share = share.max(s);
        }
        (share * 1e9) as u64
    }

    // ----- ordering ---------------------------------------------------------

    fn job_cmp(&self, a: JobId, b: JobId, drf: &[f64]) -> Ordering {
        let (ja, jb) = (&self.st.jobs[a as usize], &self.st.jobs[b as usize]);
        for p in self.cfg.plugins() {
            let o = match p {
                PluginName::Priority => jb.src.priority.cmp(&ja.src.priority),
                // A gang running below its minimum (it lost members) goes
                // before fresh jobs, so that it is not starved.
                PluginName::Gang => {
                    let starved = |j: &crate::state::JobState<'_>| j.occupied > 0 && !j.ready();
                    starved(jb).cmp(&starved(ja))
                }
                PluginName::Drf => drf[a as usize]
                    .partial_cmp(&drf[b as usize])
                    .unwrap_or(Ordering::Equal),
                _ => Ordering::Equal,
            };
            if o != Ordering::Equal {
                return o;
            }
        }
        ja.src
            .creation
            .cmp(&jb.src.creation)
            .then_with(|| ja.order.cmp(&jb.order))
    }

    /// Admitted jobs per queue, each list in job order.
    fn jobs_by_queue(&self, want: impl Fn(&Self, JobId) -> bool) -> Vec<VecDeque<JobId>> {
        let drf: Vec<f64> = self
            .st
            .jobs
            .iter()
            .map(|j| j.allocated.dominant_share(&self.st.total))
            .collect();
        let mut per: Vec<Vec<JobId>> = vec![Vec::new(); self.st.queues.len()];
        for j in 0..self.st.jobs.len() as JobId {
            if let Some(q) = self.st.jobs[j as usize].queue {
                if want(self, j) {
                    per[q as usize].push(j);
                }
            }
        }
        per.into_iter()
            .map(|mut v| {
                v.sort_by(|&a, &b| self.job_cmp(a, b, &drf));
                v.into()
            })
            .collect()
    }

    fn has_pending(&self, j: JobId, best_effort: bool) -> bool {
        self.st.jobs[j as usize].tasks.iter().any(|&t| {
            let ts = &self.st.tasks[t as usize];
            ts.status == TaskStatus::Pending && ts.request.is_best_effort() == best_effort
        })
    }

    // ----- placement --------------------------------------------------------

    /// Whether task `t` is placed by the spread profile (by its job's kind).
    fn spread_for(&self, t: u32) -> bool {
        let kind = self.st.jobs[self.st.tasks[t as usize].job as usize]
            .src
            .kind;
        self.cfg.profile(kind) == Profile::Spread
    }

    /// GPUs of node `n` that task `t` must not use because a reservation
    /// holds them (a bitmask; all ones: the whole node is held).
    fn excluded_for(&self, t: u32, n: NodeId) -> u64 {
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
    fn find_node(&self, t: u32) -> Option<(NodeId, Pick)> {
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
    fn score_key(&self, t: u32, n: NodeId, p: &Pick) -> ScoreKey {
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
    fn place_task(&mut self, t: u32, n: NodeId, pick: Pick) {
        let status = if self.releasing[n as usize] > 0 {
            TaskStatus::Pipelined
        } else {
            TaskStatus::Bound
        };
        self.st.place(t, n, pick, status);
    }

    fn commit(&mut self, stmt: Stmt) {
        self.generation += 1;
        for op in stmt.ops {
            if let Op::Placed(t) = op {
                self.placed.push(t);
            }
        }
        self.evicted.append(&mut self.pending_evictions);
    }

    fn rollback(&mut self, stmt: Stmt) {
        for op in stmt.ops.into_iter().rev() {
            match op {
                Op::Placed(t) => {
                    self.st.unplace(t, TaskStatus::Pending);
                    self.st.set_choice(t, 0);
                }
                Op::Evicted(t) => self.unevict(t),
            }
        }
        self.pending_evictions.clear();
    }

    /// Puts an evicted task back where it ran, on the devices it had. A task that
    /// ran on no known node (an inconsistent snapshot) held nothing here: evicting
    /// it changed only its status, and so does this.
    fn unevict(&mut self, t: u32) {
        let Some(n) = self.st.tasks[t as usize].node else {
            self.st.tasks[t as usize].status = TaskStatus::Running;
            return;
        };
        self.releasing[n as usize] -= 1;
        let gpus = std::mem::take(&mut self.st.tasks[t as usize].gpus);
        let mig = self.st.tasks[t as usize].mig.take();
        self.st.place(t, n, Pick { gpus, mig }, TaskStatus::Running);
    }

    /// Before a kept attempt is committed, puts back the victims that free room
    /// for nobody: those on nodes where no task of the attempt was placed. The
    /// victim search picks a set with which the task (or the whole gang) fits,
    /// but the tasks take free room first, and free room elsewhere may turn out
    /// to be enough (a gang searched jointly is placed from scratch after each
    /// candidate set); a task whose search found victims may also fail to fit
    /// in the end, in an attempt that is kept for its other tasks. Such
    /// evictions would cost their tasks for nothing. A victim gang comes back
    /// whole unless what stays evicted leaves it at or above `min_member`, and
    /// a victim comes back only within the capability of every queue it shares
    /// with the attempt's job (whose placements may have used the room).
    fn drop_idle_evictions(&mut self, stmt: &mut Stmt) {
        let mut used: Vec<NodeId> = Vec::new();
        let mut placed_queue = None;
        let mut idle: BTreeMap<JobId, (Vec<u32>, bool)> = BTreeMap::new();
        for op in &stmt.ops {
            if let Op::Placed(t) = *op {
                let ts = &self.st.tasks[t as usize];
                used.extend(ts.node);
                placed_queue = placed_queue.or(self.st.jobs[ts.job as usize].queue);
            }
        }
        for op in &stmt.ops {
            if let Op::Evicted(v) = *op {
                let vt = &self.st.tasks[v as usize];
                let e = idle.entry(vt.job).or_insert((Vec::new(), true));
                if vt.node.is_some_and(|n| used.contains(&n)) {
                    e.1 = false;
                } else {
                    e.0.push(v);
                }
            }
        }
        let mut shared: Vec<QueueId> = Vec::new();
        let mut cur = placed_queue;
        while let Some(c) = cur {
            shared.push(c);
            cur = self.st.queues[c as usize].parent;
        }
        let mut back: Vec<u32> = Vec::new();
        for (vj, (vs, all)) in idle {
            if vs.is_empty() {
                continue;
            }
            let job = &self.st.jobs[vj as usize];
            if !all && self.gang && job.occupied + (vs.len() as u32) < job.src.min_member {
                continue;
            }
            let mut req = Resources::default();
            for &v in &vs {
                req.add_assign_saturating(&self.st.tasks[v as usize].request);
            }
            let mut cur = job.queue;
            let mut fits = true;
            while let Some(c) = cur {
                let qs = &self.st.queues[c as usize];
                if shared.contains(&c)
                    && qs
                        .capability
                        .as_ref()
                        .is_some_and(|cap| over(&qs.allocated, &req, cap).is_some())
                {
                    fits = false;
                    break;
                }
                cur = qs.parent;
            }
            if !fits {
                continue;
            }
            for &v in &vs {
                self.unevict(v);
            }
            back.extend(vs);
        }
        if back.is_empty() {
            return;
        }
        stmt.ops
            .retain(|op| !matches!(op, Op::Evicted(v) if back.contains(v)));
        self.pending_evictions.retain(|(v, _)| !back.contains(v));
    }

    /// Ends a job's attempt: keeps it if the gang is satisfied, else undoes it.
    fn settle(&mut self, j: JobId, mut stmt: Stmt) -> bool {
        let job = &self.st.jobs[j as usize];
        if !self.gang || job.ready() {
            self.drop_idle_evictions(&mut stmt);
            self.commit(stmt);
            true
        } else {
            let job = &mut self.st.jobs[j as usize];
            job.placeable = job.placeable.max(job.occupied);
            self.rollback(stmt);
            false
        }
    }

    // ----- actions ----------------------------------------------------------

    /// Admission: a group whose queue can take its minimum resources within
    /// capability, and which could fit in the cluster at all, becomes admitted.
    fn enqueue(&mut self) {
        let per = self.jobs_by_queue(|s, j| !s.st.jobs[j as usize].admitted);
        for (q, jobs) in per.into_iter().enumerate() {
            for j in jobs {
                let job = &self.st.jobs[j as usize];
                let min = job.min_request.clone();
                let min_member = job.src.min_member as usize;
                if min_member > job.tasks.len() {
                    self.enqueue_reason.insert(
                        j,
                        format!(
                            "min_member {} is more than the group's {} tasks",
                            min_member,
                            job.tasks.len()
                        ),
                    );
                    continue;
                }
                if let Some(d) = min.exceeding(&self.st.total).first() {
                    self.enqueue_reason.insert(
                        j,
                        format!(
                            "needs more {d} than the whole cluster has ({} of {})",
                            fmt_dim(d, min.get(d)),
                            fmt_dim(d, self.st.total.get(d))
                        ),
                    );
                    continue;
                }
                // Capability along the path, counting what earlier admitted
                // groups reserved.
                let mut reserved_ok = Ok(());
                let mut cur = Some(q as QueueId);
                while let Some(c) = cur {
                    let qs = &self.st.queues[c as usize];
                    if let Some(cap) = &qs.capability {
                        let held = qs.allocated.checked_add(&qs.inqueue).unwrap_or_default();
                        if let Some(d) = over(&held, &min, cap) {
                            // A parent's cap: say which child asks, and what
                            // that child holds of it.
                            let leaf = if c as usize == q {
                                String::new()
                            } else {
                                let lq = &self.st.queues[q];
                                format!(
                                    "; it is an ancestor of queue {}, which holds {}",
                                    lq.name,
                                    fmt_dim(&d, lq.allocated.get(&d))
                                )
                            };
                            reserved_ok = Err(format!(
                                "queue {} capability of {d} is {}; held and admitted would be {} ({} held, {} admitted and waiting to start, {} for this group){leaf}",
                                qs.name,
                                fmt_dim(&d, cap.get(&d)),
                                fmt_dim(&d, held.get(&d).saturating_add(min.get(&d))),
                                fmt_dim(&d, qs.allocated.get(&d)),
                                fmt_dim(&d, qs.inqueue.get(&d)),
                                fmt_dim(&d, min.get(&d)),
                            ));
                            break;
                        }
                    }
                    cur = qs.parent;
                }
                match reserved_ok {
                    Ok(()) => {
                        self.st.jobs[j as usize].admitted = true;
                        self.enqueue_reason.remove(&j);
                        let mut cur = Some(q as QueueId);
                        while let Some(c) = cur {
                            self.st.queues[c as usize]
                                .inqueue
                                .add_assign_saturating(&min);
                            cur = self.st.queues[c as usize].parent;
                        }
                    }
                    Err(r) => {
                        self.enqueue_reason.insert(j, r);
                    }
                }
            }
        }
    }

    /// The `reservation` plugin: elects the highest-priority queued training
    /// gang (admitted, nothing running, needs whole GPUs) that does not fit
    /// now, and holds for it the NVLink domains (or PCIe roots / NUMA nodes, by
    /// its tasks' topology; whole nodes where the domain cannot hold a task)
    /// with the most free GPUs, one per task as far as they hold several.
    /// Lower-priority tasks stay off the held GPUs for the session, so that
    /// they drain instead of being nibbled away. One gang per session.
    fn elect_reservation(&mut self) {
        if !self.cfg.enabled(PluginName::Reservation) || self.reserve.is_some() {
            return;
        }
        let mut cands: Vec<JobId> = (0..self.st.jobs.len() as JobId)
            .filter(|&j| {
                let job = &self.st.jobs[j as usize];
                job.admitted
                    && job.queue.is_some()
                    && job.occupied == 0
                    && job.src.kind == GroupKind::Training
                    && job
                        .tasks
                        .iter()
                        .any(|&t| self.st.tasks[t as usize].gpu.whole() > 0)
            })
            .collect();
        cands.sort_by_key(|&j| {
            let job = &self.st.jobs[j as usize];
            (Reverse(job.src.priority), job.src.creation, job.order)
        });
        for j in cands {
            let job = &self.st.jobs[j as usize];
            let Some(q) = job.queue else { continue };
            if self.queue_allows(q, &job.min_request, true).is_err() || self.dry_run(j) {
                continue;
            }
            if let Some(r) = self.reserve_for(j) {
                self.reserve = Some(r);
            }
            return;
        }
    }

    /// Whether job `j` could be placed now (tried, then undone).
    fn dry_run(&mut self, j: JobId) -> bool {
        let mut stmt = Stmt::default();
        let tasks = self.st.jobs[j as usize].tasks.clone();
        for t in tasks {
            if self.st.tasks[t as usize].status != TaskStatus::Pending {
                continue;
            }
            match self.find_node(t) {
                Some((n, pick)) => {
                    self.place_task(t, n, pick);
                    stmt.ops.push(Op::Placed(t));
                }
                None => break,
            }
        }
        let ok = self.st.jobs[j as usize].ready();
        self.rollback(stmt);
        ok
    }

    /// The domains to hold for job `j`, and the plan's words for them.
    fn reserve_for(&mut self, j: JobId) -> Option<Reserve> {
        struct Unit {
            node: NodeId,
            label: String,
            gpus: Vec<u32>,
            free: u32,
            left: u32,
        }
        let job = &self.st.jobs[j as usize];
        let need = job.src.min_member.saturating_sub(job.occupied) as usize;
        let pending: Vec<u32> = job
            .tasks
            .iter()
            .copied()
            .filter(|&t| self.st.tasks[t as usize].status == TaskStatus::Pending)
            .take(need)
            .collect();
        let mut chosen: Vec<Unit> = Vec::new();
        for t in pending {
            let ts = &self.st.tasks[t as usize];
            let g = ts.gpu.whole();
            if g == 0 {
                continue;
            }
            if let Some(u) = chosen.iter_mut().find(|u| u.left >= g) {
                u.left -= g;
                continue;
            }
            let scope = ts.src.topology.map_or(GpuScope::NvlinkDomain, |x| x.scope);
            let hard = ts
                .src
                .topology
                .is_some_and(|x| x.strength == Strength::Hard);
            let mut best: Option<(u32, NodeId, crate::gpu::DomainUnit)> = None;
            for whole_node in [false, true] {
                if whole_node && (hard || best.is_some()) {
                    break;
                }
                for n in 0..self.st.nodes.len() as NodeId {
                    let ns = &self.st.nodes[n as usize];
                    if ns.src.unschedulable || !self.st.class_ok(t, n) {
                        continue;
                    }
                    let units = if whole_node {
                        let mut u = ns.gpus.domain_units(GpuScope::NvlinkDomain, &[]);
                        let gpus: Vec<u32> = u.iter().flat_map(|x| x.gpus.clone()).collect();
                        let free = u.iter().map(|x| x.free).sum();
                        u.clear();
                        u.push(crate::gpu::DomainUnit {
                            label: "node".into(),
                            gpus,
                            free,
                        });
                        u
                    } else {
                        ns.gpus.domain_units(scope, ts.gpu.models())
                    };
                    for u in units {
                        if (u.gpus.len() as u32) < g
                            || chosen.iter().any(|c| c.node == n && c.label == u.label)
                        {
                            continue;
                        }
                        if best
                            .as_ref()
                            .is_none_or(|(f, bn, _)| (u.free, Reverse(n)) > (*f, Reverse(*bn)))
                        {
                            best = Some((u.free, n, u));
                        }
                    }
                }
            }
            let (free, node, u) = best?;
            let left = u.gpus.len() as u32 - g;
            chosen.push(Unit {
                node,
                label: u.label,
                gpus: u.gpus,
                free,
                left,
            });
        }
        if chosen.is_empty() {
            return None;
        }
        let job = &self.st.jobs[j as usize];
        let mut masks = BTreeMap::new();
        for u in &chosen {
            let node = self.st.nodes[u.node as usize].src;
            let whole = u.label == "node";
            let mask = if whole {
                u64::MAX
            } else {
                u.gpus
                    .iter()
                    .filter(|&&i| i < 64)
                    .fold(0u64, |m, &i| m | (1u64 << i))
            };
            *masks.entry(u.node).or_insert(0) |= mask;
            self.reservations.push(Reservation {
                group: job.src.name.clone(),
                node: node.name.clone(),
                gpus: if whole { Vec::new() } else { u.gpus.clone() },
                reason: format!(
                    "{} held for a queued training gang (priority {}), {} of {} GPUs free; lower-priority tasks stay off, and the gang keeps its queue's quota",
                    if whole { "whole node" } else { &u.label },
                    job.src.priority,
                    u.free,
                    u.gpus.len()
                ),
            });
        }
        Some(Reserve {
            job: j,
            priority: job.src.priority,
            masks,
        })
    }

    /// Places admitted groups, queue by queue in fair-share order, gang by gang.
    /// Quota is charged for what is placed: a group admitted but placeable on
    /// no node this session is parked (it gives back its admission reservation
    /// and its demand, and waits with its reason), and the groups its quota
    /// held back get another turn; until nothing more is parked.
    fn allocate(&mut self) {
        self.elect_reservation();
        let mut round = 0;
        let mut tried = vec![false; self.st.jobs.len()];
        let mut parked = false;
        loop {
            let mut per = self.jobs_by_queue(|s, j| {
                let job = &s.st.jobs[j as usize];
                job.admitted
                    && !job.parked
                    && s.has_pending(j, false)
                    && (round == 0 || !tried[j as usize] || job.quota_blocked)
            });
            for jobs in &per {
                for &j in jobs {
                    tried[j as usize] = true;
                }
            }
            self.allocate_queues(&mut per);
            round += 1;
            if round >= MAX_ROUNDS || !self.park_unplaceable() {
                break;
            }
            parked = true;
            // The parked groups' quota goes back: admission again, shares again.
            self.recompute_inqueue();
            if self.cfg.runs(Action::Enqueue) {
                self.enqueue();
            }
            self.compute_deserved();
        }
        if parked {
            // Parking is for allocation on free room only: preempt and reclaim
            // make room by eviction, and a parked group's demand is what
            // entitles its queue to that.
            for job in &mut self.st.jobs {
                job.parked = false;
            }
            self.compute_deserved();
        }
    }

    /// One pass of allocation over `per` (admitted jobs per queue, in order).
    fn allocate_queues(&mut self, per: &mut [VecDeque<JobId>]) {
        let mut heap: BinaryHeap<Reverse<(u64, QueueId)>> = BinaryHeap::new();
        let mut turns = vec![0u64; per.len()];
        for (q, jobs) in per.iter().enumerate() {
            if !jobs.is_empty() {
                heap.push(Reverse((self.order_key(q as QueueId, 0), q as QueueId)));
            }
        }
        while let Some(Reverse((_, q))) = heap.pop() {
            let Some(j) = per[q as usize].pop_front() else {
                continue;
            };
            self.allocate_job(j);
            turns[q as usize] += 1;
            if !per[q as usize].is_empty() {
                heap.push(Reverse((self.order_key(q, turns[q as usize]), q)));
            }
        }
    }

    /// Parks admitted groups that hold nothing and that no node can hold:
    /// those that found no node, and those stopped by quota that would not
    /// fit anyway. The gang the `reservation` plugin holds for keeps its
    /// quota. Returns whether any group was parked.
    fn park_unplaceable(&mut self) -> bool {
        let held = self.reserve.as_ref().map(|r| r.job);
        let mut changed = false;
        for j in 0..self.st.jobs.len() as JobId {
            let job = &self.st.jobs[j as usize];
            if !job.admitted
                || job.parked
                || job.occupied > 0
                || Some(j) == held
                || !(job.no_room || job.quota_blocked)
                || !self.has_pending(j, false)
            {
                continue;
            }
            if job.no_room || !self.dry_run(j) {
                self.st.jobs[j as usize].parked = true;
                changed = true;
            }
        }
        changed
    }

    /// Admission reservations again: what admitted groups that hold nothing
    /// yet (and are not parked) need to start.
    fn recompute_inqueue(&mut self) {
        for q in &mut self.st.queues {
            q.inqueue = Resources::default();
        }
        for j in 0..self.st.jobs.len() {
            let job = &self.st.jobs[j];
            let Some(q) = job.queue else { continue };
            if !job.admitted || job.parked || job.occupied > 0 {
                continue;
            }
            let min = job.min_request.clone();
            let mut cur = Some(q);
            while let Some(c) = cur {
                self.st.queues[c as usize]
                    .inqueue
                    .add_assign_saturating(&min);
                cur = self.st.queues[c as usize].parent;
            }
        }
    }

    fn order_key(&self, q: QueueId, turns: u64) -> u64 {
        if self.proportion {
            self.queue_share(q)
        } else {
            turns
        }
    }

    /// Allocates job `j`; a gang with a network-tier constraint is tried one
    /// tier domain at a time (the domain of a running member first; then
    /// binpack: the domain with the fewest free GPUs that could hold it;
    /// spread: the most), all of it or nothing in each. A soft constraint
    /// falls back to any nodes, preferring the domain of the first member.
    fn allocate_job(&mut self, j: JobId) {
        self.tier_pref = None;
        let job = &mut self.st.jobs[j as usize];
        job.no_room = false;
        job.quota_blocked = false;
        let Some(nt) = self.st.jobs[j as usize].src.network_topology else {
            self.allocate_job_once(j);
            return;
        };
        let (domains, roomiest, need) = self.tier_domains(j, nt);
        let tried = domains.len();
        let roomiest_none = roomiest.is_none();
        let most = roomiest
            .as_ref()
            .map(|(d, f)| format!(" (most: {f} in {d})"))
            .unwrap_or_default();
        let roomiest = roomiest.map(|(d, _)| d);
        let before = self.st.jobs[j as usize].occupied;
        for d in domains {
            self.tier_filter = Some((nt.tier, d.clone()));
            self.tier_pref = Some((nt.tier, d));
            self.allocate_job_once(j);
            self.tier_filter = None;
            self.tier_pref = None;
            // Something was kept (the gang is satisfied, or without the gang
            // plugin a part of it): it stays in this domain.
            if self.st.jobs[j as usize].occupied > before {
                return;
            }
        }
        if nt.strength == Strength::Soft {
            // Spill over, starting in the domain with the most free GPUs.
            self.tier_pref = roomiest.map(|d| (nt.tier, d));
            self.allocate_job_once(j);
            self.tier_pref = None;
            return;
        }
        if self.st.jobs[j as usize].occupied == before && !self.st.jobs[j as usize].quota_blocked {
            self.st.jobs[j as usize].no_room = true;
        }
        if self.st.jobs[j as usize].reason.is_none() && self.st.jobs[j as usize].occupied == before
        {
            self.st.jobs[j as usize].reason = Some(if roomiest_none {
                format!(
                    "needs its tasks within one tier-{} network domain (hard), and no schedulable node is in one",
                    nt.tier
                )
            } else if tried == 0 {
                format!(
                    "needs its tasks within one tier-{} network domain (hard), and no domain has the {need} free GPUs it needs{most}",
                    nt.tier
                )
            } else {
                format!(
                    "needs its tasks within one tier-{} network domain (hard); {tried} domain{} with {need} free GPUs had no room for the whole gang",
                    nt.tier,
                    if tried == 1 { "" } else { "s" }
                )
            });
        }
    }

    /// Network-tier domains a gang may try, in order (with members running,
    /// only theirs); the domain with the most free GPUs; and the whole GPUs
    /// the gang needs to start.
    fn tier_domains(&self, j: JobId, nt: NetworkTier) -> (Vec<String>, Option<(String, u32)>, u32) {
        let job = &self.st.jobs[j as usize];
        let domain = |n: NodeId| {
            let src = self.st.nodes[n as usize].src;
            nt.domain_of(&src.name, &src.network).map(str::to_string)
        };
        let running = job
            .tasks
            .iter()
            .find_map(|&t| self.st.tasks[t as usize].node)
            .and_then(domain);
        if let Some(d) = running {
            return (vec![d.clone()], Some((d, 0)), 0);
        }
        // Whole GPUs the gang needs to start, and free whole GPUs per domain.
        let need: u32 = job
            .tasks
            .iter()
            .filter(|&&t| self.st.tasks[t as usize].status == TaskStatus::Pending)
            .take(job.src.min_member.saturating_sub(job.occupied) as usize)
            .map(|&t| self.st.tasks[t as usize].gpu.whole())
            .sum();
        let mut free: BTreeMap<String, u32> = BTreeMap::new();
        for n in 0..self.st.nodes.len() as NodeId {
            let ns = &self.st.nodes[n as usize];
            if ns.src.unschedulable {
                continue;
            }
            if let Some(d) = domain(n) {
                *free.entry(d).or_insert(0) += ns.gpus.whole_free();
            }
        }
        let spread = job.tasks.first().is_some_and(|&t| self.spread_for(t));
        let roomiest = free
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(d, f)| (d.clone(), *f));
        let mut v: Vec<(String, u32)> = free.into_iter().filter(|(_, f)| *f >= need).collect();
        if spread {
            v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        } else {
            v.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        }
        (v.into_iter().map(|(d, _)| d).collect(), roomiest, need)
    }

    fn allocate_job_once(&mut self, j: JobId) {
        let Some(q) = self.st.jobs[j as usize].queue else {
            return;
        };
        let mut stmt = Stmt::default();
        let tasks = self.st.jobs[j as usize].tasks.clone();
        // Best-effort members of a job with real requests are placed with it,
        // so that a gang that needs them can start.
        for t in tasks {
            let ts = &self.st.tasks[t as usize];
            if ts.status != TaskStatus::Pending {
                continue;
            }
            if !ts.src.gpu_alternatives.is_empty() {
                if !self.try_place_options(j, t, q, &mut stmt) {
                    break;
                }
                continue;
            }
            if let Err(r) = self.queue_allows(q, &ts.request, true) {
                let job = &mut self.st.jobs[j as usize];
                job.reason = Some(r);
                job.quota_blocked = true;
                self.obs.decision();
                break;
            }
            if !self.try_place(j, t, &mut stmt) {
                break;
            }
        }
        self.finish(j, stmt);
    }

    /// One placement decision for a task with device alternatives: the first
    /// shape, in the task's order, that the queue's quota allows and some node
    /// holds is taken (and charged). If none, the task waits on the first
    /// shape, with the quota's reason when quota stopped every shape.
    fn try_place_options(&mut self, j: JobId, t: u32, q: QueueId, stmt: &mut Stmt) -> bool {
        let n = self.st.tasks[t as usize].src.gpu_alternatives.len() as u32;
        let mut quota: Option<String> = None;
        let mut room = false;
        for k in 0..=n {
            self.st.set_choice(t, k);
            let req = self.st.tasks[t as usize].request.clone();
            if let Err(r) = self.queue_allows(q, &req, true) {
                quota.get_or_insert(r);
                continue;
            }
            room = true;
            if let Some((node, pick)) = self.find_node(t) {
                self.obs.decision();
                self.place_task(t, node, pick);
                stmt.ops.push(Op::Placed(t));
                return true;
            }
        }
        self.obs.decision();
        self.st.set_choice(t, 0);
        if !room {
            let job = &mut self.st.jobs[j as usize];
            job.reason = quota;
            job.quota_blocked = true;
        } else {
            let partial = !stmt.ops.is_empty();
            self.st.jobs[j as usize].no_room = true;
            self.record_failure(j, t, partial);
        }
        false
    }

    /// One placement decision: finds a node for task `t` of job `j` and places
    /// it in `stmt`, or records why not. Returns whether it was placed.
    fn try_place(&mut self, j: JobId, t: u32, stmt: &mut Stmt) -> bool {
        let found = self.find_node(t);
        self.obs.decision();
        match found {
            Some((n, pick)) => {
                self.place_task(t, n, pick);
                stmt.ops.push(Op::Placed(t));
                if self.tier_pref.is_none() {
                    if let Some(nt) = self.st.jobs[j as usize].src.network_topology {
                        let src = self.st.nodes[n as usize].src;
                        self.tier_pref = nt
                            .domain_of(&src.name, &src.network)
                            .map(|d| (nt.tier, d.to_string()));
                    }
                }
                true
            }
            None => {
                let partial = !stmt.ops.is_empty();
                self.st.jobs[j as usize].no_room = true;
                self.record_failure(j, t, partial);
                false
            }
        }
    }

    /// Settles a job's attempt; a job left with nothing pending has no reason to wait.
    fn finish(&mut self, j: JobId, stmt: Stmt) {
        if stmt.ops.is_empty() {
            return;
        }
        if self.settle(j, stmt) {
            let job = &mut self.st.jobs[j as usize];
            if job.pending_tasks() == 0 {
                job.reason = None;
                job.failed_task = None;
            }
        }
    }

    /// Places best-effort tasks (no resource request but a pod slot) on any node
    /// the predicates allow.
    fn backfill(&mut self) {
        let per =
            self.jobs_by_queue(|s, j| s.st.jobs[j as usize].admitted && s.has_pending(j, true));
        for jobs in per {
            for j in jobs {
                let mut stmt = Stmt::default();
                let tasks = self.st.jobs[j as usize].tasks.clone();
                for t in tasks {
                    let ts = &self.st.tasks[t as usize];
                    if ts.status != TaskStatus::Pending || !ts.request.is_best_effort() {
                        continue;
                    }
                    if !self.try_place(j, t, &mut stmt) {
                        break;
                    }
                }
                self.settle(j, stmt);
                self.tier_pref = None;
            }
        }
    }

    /// Within a queue: a group with pending tasks may evict running tasks of
    /// strictly lower priority, only when that makes the whole gang fit; the
    /// victim set is the smallest (see [`crate::victims`]).
    fn preempt(&mut self) {
        let per =
            self.jobs_by_queue(|s, j| s.st.jobs[j as usize].admitted && s.has_pending(j, false));
        for (q, jobs) in per.into_iter().enumerate() {
            let q = q as QueueId;
            for j in jobs {
                let prio = self.st.jobs[j as usize].src.priority;
                let name = self.st.jobs[j as usize].src.name.clone();
                self.evicting_attempt(
                    j,
                    &|s, t, v| {
                        let vt = &s.st.tasks[v as usize];
                        let vj = &s.st.jobs[vt.job as usize];
                        vj.queue == Some(q)
                            && vt.job != s.st.tasks[t as usize].job
                            && vt.priority < s.st.tasks[t as usize].priority
                    },
                    &|_, _| true,
                    &|s, v| {
                        let vt = &s.st.tasks[v as usize];
                        format!("preempted by {name} (priority {prio} > {})", vt.priority)
                    },
                    false,
                );
            }
        }
    }

    /// Between queues: a queue below its deserved share may evict tasks of
    /// reclaimable queues that hold more than theirs, and only down to it.
    fn reclaim(&mut self) {
        if !self.proportion {
            return;
        }
        let per =
            self.jobs_by_queue(|s, j| s.st.jobs[j as usize].admitted && s.has_pending(j, false));
        let mut qs: Vec<QueueId> = (0..per.len() as QueueId)
            .filter(|&q| !per[q as usize].is_empty())
            .collect();
        qs.sort_by_key(|&q| (self.queue_share(q), q));
        for q in qs {
            let qname = self.st.queues[q as usize].name.to_string();
            for &j in &per[q as usize] {
                self.evicting_attempt(
                    j,
                    &|s, _t, v| {
                        // The victim's queue is reclaimable and above its
                        // deserved share in something the victim holds.
                        let vt = &s.st.tasks[v as usize];
                        let Some(vq) = s.st.jobs[vt.job as usize].queue else {
                            return false;
                        };
                        if vq == q || !s.st.queues[vq as usize].reclaimable {
                            return false;
                        }
                        let vs = &s.st.queues[vq as usize];
                        vt.request.dims().any(|(d, r)| {
                            r > 0 && d != Dim::Pods && vs.allocated.get(&d) > vs.deserved.get(&d)
                        })
                    },
                    &|s, victims| {
                        // Only down to the deserved share: per victim queue,
                        // what the set takes leaves it at or above deserved in
                        // every dimension it is above in.
                        let mut taken: BTreeMap<QueueId, Resources> = BTreeMap::new();
                        for &v in victims {
                            let vt = &s.st.tasks[v as usize];
                            if let Some(vq) = s.st.jobs[vt.job as usize].queue {
                                taken
                                    .entry(vq)
                                    .or_default()
                                    .add_assign_saturating(&vt.request);
                            }
                        }
                        taken.iter().all(|(&vq, t)| {
                            let vs = &s.st.queues[vq as usize];
                            t.dims().all(|(d, r)| {
                                let held = vs.allocated.get(&d);
                                let des = vs.deserved.get(&d);
                                r == 0 || d == Dim::Pods || held <= des || held - r.min(held) >= des
                            })
                        })
                    },
                    &|s, v| {
                        let vt = &s.st.tasks[v as usize];
                        let vq = s.st.jobs[vt.job as usize]
                            .queue
                            .map(|q| s.st.queues[q as usize].name)
                            .unwrap_or("?");
                        format!(
                            "reclaimed by queue {qname}: queue {vq} is above its deserved share"
                        )
                    },
                    true,
                );
            }
        }
    }

    /// Tries to place the pending tasks of job `j`, evicting victims accepted by
    /// `ok` (per task) and `set_ok` (per victim set) where free room is lacking.
    /// Gang rules apply to the whole attempt: a gang that needs several tasks
    /// placed is searched jointly when few victims are eligible, else task by
    /// task (see [`crate::victims`]).
    fn evicting_attempt(
        &mut self,
        j: JobId,
        ok: &dyn Fn(&Self, u32, u32) -> bool,
        set_ok: &dyn Fn(&Self, &[u32]) -> bool,
        reason: &dyn Fn(&Self, u32) -> String,
        check_deserved: bool,
    ) {
        let Some(q) = self.st.jobs[j as usize].queue else {
            return;
        };
        // Victim search does not know network tiers: a gang with a hard tier
        // constraint waits for free room instead.
        if self.st.jobs[j as usize]
            .src
            .network_topology
            .is_some_and(|nt| nt.strength == Strength::Hard)
        {
            return;
        }
        let job = &self.st.jobs[j as usize];
        if self.gang
            && job.src.min_member.saturating_sub(job.occupied) >= 2
            && self.joint_attempt(j, q, ok, set_ok, reason, check_deserved)
        {
            return;
        }
        let mut stmt = Stmt::default();
        let tasks = self.st.jobs[j as usize].tasks.clone();
        for t in tasks {
            let ts = &self.st.tasks[t as usize];
            if ts.status != TaskStatus::Pending {
                continue;
            }
            let req = ts.request.clone();
            // Free room is used only within the queue's deserved share, as in
            // allocate; evictions only as far as `check_deserved` allows.
            if self.queue_allows(q, &req, true).is_ok() {
                if let Some((n, pick)) = self.find_node(t) {
                    self.place_task(t, n, pick);
                    stmt.ops.push(Op::Placed(t));
                    continue;
                }
            }
            if req.is_best_effort() || self.queue_allows(q, &req, check_deserved).is_err() {
                break;
            }
            self.obs.search_begin();
            let found = {
                let ok_t = |v: u32| ok(self, t, v);
                let set_ok_t = |vs: &[u32]| set_ok(self, vs);
                let search = victims::Search {
                    st: &self.st,
                    task: t,
                    gang: self.gang,
                    ok: &ok_t,
                    set_ok: &set_ok_t,
                    nodes: &self.victim_nodes,
                };
                let mut stats = victims::Stats::default();
                search.run(&mut stats)
            };
            self.obs
                .search_end(found.as_ref().map_or(0, |f| f.victims.len()));
            let Some(found) = found else {
                break;
            };
            self.evict_set(&found.victims, &found.whole_jobs, reason, &mut stmt);
            let Some(pick) = self.st.fits(t, found.node) else {
                break;
            };
            self.place_task(t, found.node, pick);
            stmt.ops.push(Op::Placed(t));
        }
        self.finish(j, stmt);
    }

    /// Evicts `victims` in `stmt`; members of `whole` jobs go because the gang
    /// rule takes the whole gang, and their reason says so.
    fn evict_set(
        &mut self,
        victims: &[u32],
        whole: &[JobId],
        reason: &dyn Fn(&Self, u32) -> String,
        stmt: &mut Stmt,
    ) {
        let reasons: Vec<String> = victims
            .iter()
            .map(|&v| {
                let mut r = reason(self, v);
                let vj = self.st.tasks[v as usize].job;
                if whole.contains(&vj) {
                    let job = &self.st.jobs[vj as usize];
                    r.push_str(&format!(
                        "; with its whole gang ({} running, min_member {})",
                        job.occupied, job.src.min_member
                    ));
                }
                r
            })
            .collect();
        for (&v, r) in victims.iter().zip(reasons) {
            // A task on no known node frees room on none.
            if let Some(n) = self.st.tasks[v as usize].node {
                self.releasing[n as usize] += 1;
            }
            self.st.unplace(v, TaskStatus::Evicted);
            stmt.ops.push(Op::Evicted(v));
            self.pending_evictions.push((v, r));
        }
    }

    /// The joint victim search of a gang that needs several tasks placed: when
    /// at most [`victims::JOINT_MAX`] running tasks are eligible, every victim
    /// set in key order, the first with which the whole gang fits taken.
    /// Returns false when there are too many eligible victims (the caller then
    /// goes task by task).
    fn joint_attempt(
        &mut self,
        j: JobId,
        q: QueueId,
        ok: &dyn Fn(&Self, u32, u32) -> bool,
        set_ok: &dyn Fn(&Self, &[u32]) -> bool,
        reason: &dyn Fn(&Self, u32) -> String,
        check_deserved: bool,
    ) -> bool {
        let job = &self.st.jobs[j as usize];
        let pending: Vec<u32> = job
            .tasks
            .iter()
            .copied()
            .filter(|&t| self.st.tasks[t as usize].status == TaskStatus::Pending)
            .collect();
        let Some(&lowest) = pending.last() else {
            return true;
        };
        let mut eligible = Vec::new();
        for &n in &self.victim_nodes {
            for &v in &self.st.nodes[n as usize].tasks {
                let vt = &self.st.tasks[v as usize];
                if vt.status == TaskStatus::Running
                    && self.st.jobs[vt.job as usize].src.preemptable
                    && ok(self, lowest, v)
                {
                    eligible.push(v);
                    if eligible.len() > victims::JOINT_MAX {
                        return false;
                    }
                }
            }
        }
        eligible.sort_unstable();
        let want = job.src.min_member.saturating_sub(job.occupied) as usize;
        let mut need = Resources::default();
        for &t in pending.iter().take(want) {
            need.add_assign_saturating(&self.st.tasks[t as usize].request);
        }
        self.obs.search_begin();
        let sets = {
            let ok_t = |v: u32| ok(self, lowest, v);
            let set_ok_t = |vs: &[u32]| set_ok(self, vs);
            victims::joint_sets(&self.st, &eligible, self.gang, &ok_t, &set_ok_t, &need)
        };
        for (_, vs, whole) in sets {
            let mut stmt = Stmt::default();
            self.evict_set(&vs, &whole, reason, &mut stmt);
            let freed: Vec<NodeId> = vs
                .iter()
                .filter_map(|&v| self.st.tasks[v as usize].node)
                .collect();
            for &t in &pending {
                let req = self.st.tasks[t as usize].request.clone();
                if self.queue_allows(q, &req, check_deserved).is_err() {
                    break;
                }
                // Beyond the deserved share, only on room the victims free.
                let within = self.queue_allows(q, &req, true).is_ok();
                self.only_nodes = (!within).then(|| freed.clone());
                let found = self.find_node(t);
                self.only_nodes = None;
                let Some((n, pick)) = found else { break };
                self.place_task(t, n, pick);
                stmt.ops.push(Op::Placed(t));
            }
            if self.st.jobs[j as usize].ready() {
                self.obs.search_end(vs.len());
                self.finish(j, stmt);
                return true;
            }
            let job = &mut self.st.jobs[j as usize];
            job.placeable = job.placeable.max(job.occupied);
            self.rollback(stmt);
        }
        self.obs.search_end(0);
        true
    }

    // ----- the plan ---------------------------------------------------------

    fn task_id(&self, t: u32) -> TaskId {
        let ts = &self.st.tasks[t as usize];
        TaskId {
            group: self.st.jobs[ts.job as usize].src.name.clone(),
            task: ts.src.name.clone(),
        }
    }

    /// Notes that task `t` of job `j` found no node. A gang that placed some
    /// members is diagnosed now, while its members still hold their nodes (the
    /// reason must say what the gang saw); anything else is diagnosed once at
    /// the end of the session, against the final state, so that failures stay
    /// cheap on a full cluster.
    fn record_failure(&mut self, j: JobId, t: u32, partial: bool) {
        self.st.jobs[j as usize].failed_task = Some(t);
        if !partial {
            self.st.jobs[j as usize].diag = None;
            return;
        }
        let ts = &self.st.tasks[t as usize];
        let key = (ts.sig, ts.request.clone(), ts.gpu.clone());
        let diag = match self.diag_cache.get(&key) {
            Some((g, d)) if *g == self.generation => d.clone(),
            _ => {
                let d = self.diagnose(t);
                self.diag_cache.insert(key, (self.generation, d.clone()));
                d
            }
        };
        self.st.jobs[j as usize].diag = Some(diag);
    }

    fn into_plan(self) -> Plan {
        let mut plan = Plan::default();
        for &(v, ref reason) in &self.evicted {
            let n = self.st.tasks[v as usize].node.unwrap_or(0);
            plan.evictions.push(Eviction {
                task: self.task_id(v),
                node: self.st.nodes[n as usize].src.name.clone(),
                reason: reason.clone(),
            });
        }
        for &t in &self.placed {
            let ts = &self.st.tasks[t as usize];
            if !matches!(ts.status, TaskStatus::Bound | TaskStatus::Pipelined) {
                continue;
            }
            let n = ts.node.unwrap_or(0);
            plan.bindings.push(Binding {
                task: self.task_id(t),
                node: self.st.nodes[n as usize].src.name.clone(),
                gpus: ts.gpus.clone(),
                after_evictions: ts.status == TaskStatus::Pipelined,
                mig: match (&ts.gpu, &ts.mig) {
                    (GpuRequest::Mig { profile, .. }, Some(c)) => Some(MigStep {
                        profile: profile.clone(),
                        start: c.start,
                        create: c.create,
                        destroy: c
                            .remove_idle
                            .iter()
                            .map(|(p, s)| MigRef {
                                profile: p.clone(),
                                start: *s,
                            })
                            .collect(),
                    }),
                    _ => None,
                },
            });
        }
        plan.reservations = self.reservations.clone();
        for &t in &self.placed {
            let ts = &self.st.tasks[t as usize];
            if matches!(ts.status, TaskStatus::Bound | TaskStatus::Pipelined)
                && !ts.src.gpu_alternatives.is_empty()
            {
                plan.choices.push(tessera_model::Choice {
                    task: self.task_id(t),
                    index: ts.choice,
                    gpu: ts.gpu.clone(),
                });
            }
        }
        let mut cache = HashMap::new();
        for j in 0..self.st.jobs.len() as JobId {
            if let Some(p) = self.pending_reason(j, &mut cache) {
                plan.pending.push(p);
            }
        }
        plan
    }

    fn pending_reason(
        &self,
        j: JobId,
        cache: &mut HashMap<(u32, Resources, GpuRequest), String>,
    ) -> Option<Pending> {
        let job = &self.st.jobs[j as usize];
        let waiting: Vec<u32> = job
            .tasks
            .iter()
            .copied()
            .filter(|&t| self.st.tasks[t as usize].status == TaskStatus::Pending)
            .collect();
        if waiting.is_empty() {
            return None;
        }
        let group = job.src.name.clone();
        if job.queue.is_none() {
            return Some(Pending {
                group,
                admitted: false,
                reason: format!("queue {} does not exist", job.src.queue),
            });
        }
        if !job.admitted {
            let reason = self.enqueue_reason.get(&j).cloned().unwrap_or_else(|| {
                "not admitted yet: the enqueue action did not run after it".into()
            });
            return Some(Pending {
                group,
                admitted: false,
                reason,
            });
        }
        let first_real = waiting
            .iter()
            .copied()
            .find(|&t| !self.st.tasks[t as usize].request.is_best_effort());
        let why = if let Some(r) = &job.reason {
            r.clone()
        } else if let Some(d) = &job.diag {
            d.clone()
        } else if let Some(t) = job.failed_task.or(first_real) {
            if self.cfg.runs(Action::Allocate) || job.failed_task.is_some() {
                let ts = &self.st.tasks[t as usize];
                let key = (ts.sig, ts.request.clone(), ts.gpu.clone());
                cache.entry(key).or_insert_with(|| self.diagnose(t)).clone()
            } else {
                "the allocate action is not configured".into()
            }
        } else if !self.cfg.runs(Action::Backfill) {
            "best-effort tasks wait for the backfill action, which is not configured".into()
        } else {
            "no node has a free pod slot that the predicates allow".into()
        };
        let total = job.tasks.len() as u32;
        let reason = if self.gang && !job.ready() && job.src.min_member > 1 {
            format!(
                "gang {}/{} placeable: {why}",
                job.placeable.max(job.occupied),
                job.src.min_member
            )
        } else {
            format!("{}/{} tasks placed: {why}", job.occupied, total)
        };
        Some(Pending {
            group,
            admitted: true,
            reason,
        })
    }

    /// Whether task `t` fits on node `n` as things stand (the devices it would
    /// get), or the rule that drops the node, with the numbers.
    fn node_rule(&self, t: u32, n: NodeId) -> Result<Pick, String> {
        let ts = &self.st.tasks[t as usize];
        let ns = &self.st.nodes[n as usize];
        if ns.src.unschedulable {
            return Err("cordoned".into());
        }
        if self.st.predicates {
            if let Some(r) = class_failure(
                &self.st.classes[ns.class as usize],
                &self.st.sigs[ts.sig as usize],
            ) {
                return Err(format!("predicates: {}", singular(&r)));
            }
        }
        let mut lack = Vec::new();
        for d in ts.request.exceeding(&ns.free) {
            if matches!(d, Dim::Gpu | Dim::GpuMemory) {
                continue;
            }
            lack.push(format!(
                "{d}: needs {}, {} free",
                fmt_dim(&d, ts.request.get(&d)),
                fmt_dim(&d, ns.free.get(&d))
            ));
        }
        if !lack.is_empty() {
            return Err(format!("resources: {}", lack.join("; ")));
        }
        if let Some(p) = self.st.fits(t, n) {
            let ex = self.excluded_for(t, n);
            if ex == u64::MAX || (ex != 0 && self.st.fits_excluding(t, n, ex).is_none()) {
                let r = self.reserve.as_ref().map(|r| r.job).unwrap_or(0);
                return Err(format!(
                    "reservation: held for queued gang {}",
                    self.st.jobs[r as usize].src.name
                ));
            }
            return Ok(p);
        }
        Err(match &ts.gpu {
            GpuRequest::Whole { count, .. } if ns.gpus.whole_free() < *count => {
                format!("GPUs: needs {count} free, has {}", ns.gpus.whole_free())
            }
            GpuRequest::Whole { count, .. } => {
                let scope = ts.src.topology.map_or(GpuScope::NvlinkDomain, |x| x.scope);
                let best = ns
                    .gpus
                    .domain_units(scope, ts.gpu.models())
                    .into_iter()
                    .max_by_key(|u| u.free);
                format!(
                    "topology: no {} with {count} free GPUs{}",
                    match scope {
                        GpuScope::NvlinkDomain => "NVLink domain",
                        GpuScope::PcieRoot => "PCIe root",
                        GpuScope::Numa => "NUMA node",
                    },
                    best.map(|u| format!(" (best: {} free in {})", u.free, u.label))
                        .unwrap_or_default()
                )
            }
            GpuRequest::Shared { milli, memory, .. } => {
                let best = ns
                    .gpus
                    .slots
                    .iter()
                    .filter(|g| g.mig.is_none())
                    .max_by_key(|g| (g.free_milli, g.free_memory));
                format!(
                    "GPUs: no GPU with {milli}m and {} free{}",
                    tessera_model::quantity::format_bytes(*memory),
                    best.map(|g| format!(
                        " (most free: {}m and {} on GPU {})",
                        g.free_milli,
                        tessera_model::quantity::format_bytes(g.free_memory),
                        g.index
                    ))
                    .unwrap_or_default()
                )
            }
            GpuRequest::Mig { profile, .. } => {
                format!("GPUs: no room for a MIG {profile} instance")
            }
            GpuRequest::None => "no room".into(),
        })
    }

    /// Why task `t` fits on no node, counted over the nodes: "0/5 nodes fit: 3
    /// lack 8 free GPUs, 2 have untolerated taint dedicated=infer:NoSchedule".
    fn diagnose(&self, t: u32) -> String {
        let ts = &self.st.tasks[t as usize];
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut class_reason: Vec<Option<Option<String>>> = vec![None; self.st.classes.len()];
        let sig = &self.st.sigs[ts.sig as usize];
        let mut fit = 0usize;
        // The numbers behind the GPU reasons: free whole GPUs per node that
        // lacks them; the best topology domain; the roomiest GPU for a share.
        let mut whole: Vec<(u32, &str)> = Vec::new();
        let mut topo_best: Option<(u32, String, &str)> = None;
        let mut share_best: Option<(u32, u64, u32, &str)> = None;
        for (n, ns) in self.st.nodes.iter().enumerate() {
            let r = if ns.src.unschedulable {
                Some("are cordoned".to_string())
            } else if let Some(cr) = self
                .st
                .predicates
                .then(|| {
                    class_reason[ns.class as usize]
                        .get_or_insert_with(|| {
                            class_failure(&self.st.classes[ns.class as usize], sig)
                        })
                        .clone()
                })
                .flatten()
            {
                Some(cr)
            } else {
                let lack = ts.request.exceeding(&ns.free);
                let name = ns.src.name.as_str();
                let gpu_lack = match &ts.gpu {
                    GpuRequest::Whole { count, .. } if ns.gpus.whole_free() < *count => {
                        whole.push((ns.gpus.whole_free(), name));
                        Some(format!(
                            "lack {count} free GPU{}",
                            if *count == 1 { "" } else { "s" }
                        ))
                    }
                    GpuRequest::Mig { profile, .. } if ns.gpus.pick(ts.gpu, None, 0).is_none() => {
                        Some(format!("have no room for a MIG {profile} instance"))
                    }
                    GpuRequest::Whole { count, .. }
                        if *count > 1 && ns.gpus.pick(ts.gpu, ts.src.topology, 0).is_none() =>
                    {
                        let scope = ts.src.topology.map_or(GpuScope::NvlinkDomain, |x| x.scope);
                        for u in ns.gpus.domain_units(scope, ts.gpu.models()) {
                            if topo_best.as_ref().is_none_or(|b| u.free > b.0) {
                                topo_best = Some((u.free, u.label, name));
                            }
                        }
                        Some(format!(
                            "have no {} with {count} free GPUs",
                            match scope {
                                GpuScope::NvlinkDomain => "NVLink domain",
                                GpuScope::PcieRoot => "PCIe root",
                                GpuScope::Numa => "NUMA node",
                            }
                        ))
                    }
                    GpuRequest::Shared {
                        milli,
                        memory,
                        models,
                    } if ns.gpus.select(ts.gpu).is_none() => {
                        for g in ns.gpus.slots.iter().filter(|g| {
                            g.mig.is_none() && (models.is_empty() || models.contains(&g.model))
                        }) {
                            let k = (g.free_milli, g.free_memory);
                            if share_best.as_ref().is_none_or(|b| k > (b.0, b.1)) {
                                share_best = Some((g.free_milli, g.free_memory, g.index, name));
                            }
                        }
                        Some(format!(
                            "have no GPU with {}m and {} free",
                            milli,
                            tessera_model::quantity::format_bytes(*memory)
                        ))
                    }
                    _ => None,
                };
                let lack: Vec<String> = lack
                    .iter()
                    .filter(|d| !matches!(d, Dim::Gpu | Dim::GpuMemory))
                    .map(|d| {
                        if *d == Dim::Pods {
                            "pod slots".into()
                        } else {
                            d.to_string()
                        }
                    })
                    .collect();
                match (gpu_lack, lack.is_empty()) {
                    (Some(g), _) => Some(g),
                    (None, false) => Some(format!("lack free {}", lack.join(" and "))),
                    (None, true) => match self.st.fits(t, n as NodeId) {
                        Some(_) => {
                            let ex = self.excluded_for(t, n as NodeId);
                            let blocked = ex == u64::MAX
                                || (ex != 0
                                    && self.st.fits_excluding(t, n as NodeId, ex).is_none());
                            match (&self.reserve, blocked) {
                                (Some(r), true) => Some(format!(
                                    "are reserved for queued gang {}",
                                    self.st.jobs[r.job as usize].src.name
                                )),
                                _ => None,
                            }
                        }
                        None => Some("lack a suitable GPU".into()),
                    },
                }
            };
            match r {
                Some(r) => *counts.entry(r).or_insert(0) += 1,
                None => fit += 1,
            }
        }
        if self.st.nodes.is_empty() {
            return "the cluster has no nodes".into();
        }
        if fit > 0 {
            return format!(
                "{fit}/{} nodes have room, but the task did not fit when it was tried",
                self.st.nodes.len()
            );
        }
        let mut v: Vec<(String, usize)> = counts.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let detail = |r: &str| -> String {
            if r.starts_with("lack ") && (r.ends_with(" free GPU") || r.ends_with(" free GPUs")) {
                return whole_detail(&whole);
            }
            if r.starts_with("have no ") && r.ends_with(" free GPUs") {
                if let Some((f, label, node)) = &topo_best {
                    return format!(" (best: {f} free in {label} on {node})");
                }
            }
            if r.starts_with("have no GPU with ") {
                if let Some((m, mem, g, node)) = &share_best {
                    return format!(
                        " (most free: {m}m and {} on GPU {g} of {node})",
                        tessera_model::quantity::format_bytes(*mem)
                    );
                }
            }
            String::new()
        };
        let parts: Vec<String> = v
            .into_iter()
            .map(|(r, c)| {
                let d = detail(&r);
                if c == 1 {
                    format!("1 node {}{d}", singular(&r))
                } else {
                    format!("{c} nodes {r}{d}")
                }
            })
            .collect();
        format!("0/{} nodes fit: {}", self.st.nodes.len(), parts.join(", "))
    }
}

/// The first dimension (with a non-zero request) in which `held + req` exceeds
/// `limit`. Extended resources that `limit` does not name are not limited.
fn over(held: &Resources, req: &Resources, limit: &Resources) -> Option<Dim> {
    req.dims()
        .filter(|(d, r)| {
            *r > 0
                && *d != Dim::Pods
                && !matches!(d, Dim::Extended(n) if !limit.extended.contains_key(n))
        })
        .find(|(d, r)| held.get(d).saturating_add(*r) > limit.get(d))
        .map(|(d, _)| d)
}

fn fmt_dim(d: &Dim, v: u64) -> String {
    use tessera_model::quantity::{format_bytes, format_milli};
    match d {
        Dim::Cpu | Dim::Gpu => format_milli(v),
        Dim::Memory | Dim::GpuMemory => format_bytes(v),
        _ => v.to_string(),
    }
}

/// " (most free is 2, on node-b; 1 node has 2, 2 have 1)": the largest free
/// block of whole GPUs among the nodes that lack enough, where, and how many
/// nodes have how many (the three largest counts).
fn whole_detail(nodes: &[(u32, &str)]) -> String {
    let Some(&(max, at)) = nodes
        .iter()
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))
    else {
        return String::new();
    };
    if max == 0 {
        return if nodes.len() == 1 {
            " (it has no free GPU)".into()
        } else {
            " (none has a free GPU)".into()
        };
    }
    let mut hist: BTreeMap<u32, usize> = BTreeMap::new();
    for (f, _) in nodes {
        *hist.entry(*f).or_insert(0) += 1;
    }
    let parts: Vec<String> = hist
        .iter()
        .rev()
        .take(3)
        .enumerate()
        .map(|(i, (f, c))| match (i, *c) {
            (0, 1) => format!("1 node has {f}"),
            (0, c) => format!("{c} nodes have {f}"),
            (_, 1) => format!("1 has {f}"),
            (_, c) => format!("{c} have {f}"),
        })
        .collect();
    let more = if hist.len() > 3 { ", …" } else { "" };
    format!(" (most free is {max}, on {at}; {}{more})", parts.join(", "))
}

/// Turns a plural verb phrase ("lack 4 free GPUs") into its singular ("lacks 4 free GPUs").
fn singular(phrase: &str) -> String {
    let (verb, rest) = phrase.split_once(' ').unwrap_or((phrase, ""));
    let v = match verb {
        "have" => "has",
        "are" => "is",
        "do" => "does",
        "lack" => "lacks",
        other => other,
    };
    if rest.is_empty() {
        v.to_string()
    } else {
        format!("{v} {rest}")
    }
}
