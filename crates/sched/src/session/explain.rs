//! Explanations: why a group waits (the plan's pending reasons, with the
//! numbers) and `explain`, every node's verdict for one task.

use std::collections::{BTreeMap, HashMap};

use tessera_model::{Dim, GpuRequest, GpuScope, Pending, Resources, Snapshot, TaskId};

use crate::config::{Action, Config};
use crate::gpu::Pick;
use crate::state::{JobId, NodeId, TaskStatus, class_failure};

use super::placement::ScoreKey;
use super::{NoObserver, Session, fmt_dim, run_session};

/// Why task `task` went where it went, or did not go: the session is run as
/// [`run`](super::run) does; then, on the cluster as the session leaves it (the task
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
    /// Notes that task `t` of job `j` found no node. A gang that placed some
    /// members is diagnosed now, while its members still hold their nodes (the
    /// reason must say what the gang saw); anything else is diagnosed once at
    /// the end of the session, against the final state, so that failures stay
    /// cheap on a full cluster.
    pub(super) fn record_failure(&mut self, j: JobId, t: u32, partial: bool) {
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

    pub(super) fn pending_reason(
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
