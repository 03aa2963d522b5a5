//! One scheduling session: the actions, run in the configured order over the
//! session state, and the plan they leave behind.
//!
//! `Session` holds the state; its methods are grouped by seam, each in an
//! `impl Session` block of a child module: `shares` (deserved shares, quota
//! checks, queue and job order), `placement` (finding and scoring nodes),
//! `undo` (the statement that makes gang placement all-or-nothing),
//! `reservation` (the `reservation` plugin), `actions` (enqueue, allocate,
//! backfill, preempt, reclaim) and `explain` (pending reasons and
//! `explain`).

mod actions;
mod explain;
mod placement;
mod reservation;
mod shares;
mod undo;

use std::collections::{BTreeMap, HashMap};

use tessera_model::{
    Binding, Dim, Eviction, GpuRequest, MigRef, MigStep, Plan, Reservation, Resources, Snapshot,
    TaskId,
};

use crate::config::{Action, Config, PluginName, SharePolicy};
use crate::index::cpu_mag;
use crate::state::{JobId, NodeId, State, TaskStatus};

use placement::ShareScorer;
use reservation::Reserve;

pub use explain::{Explanation, NodeVerdict, explain};

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

impl Session<'_, '_, '_> {
    fn task_id(&self, t: u32) -> TaskId {
        let ts = &self.st.tasks[t as usize];
        TaskId {
            group: self.st.jobs[ts.job as usize].src.name.clone(),
            task: ts.src.name.clone(),
        }
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
}

fn fmt_dim(d: &Dim, v: u64) -> String {
    use tessera_model::quantity::{format_bytes, format_milli};
    match d {
        Dim::Cpu | Dim::Gpu => format_milli(v),
        Dim::Memory | Dim::GpuMemory => format_bytes(v),
        _ => v.to_string(),
    }
}
