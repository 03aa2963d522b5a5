//! The `reservation` plugin: devices held for the highest-priority queued
//! training gang that does not fit.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use tessera_model::{GpuScope, GroupKind, Reservation, Strength};

use crate::config::PluginName;
use crate::state::{JobId, NodeId, TaskStatus};

use super::Session;
use super::undo::{Op, Stmt};

/// A reservation in force: tasks of other jobs below `priority` stay off the
/// GPUs in `masks` (per node; all ones: the whole node).
#[derive(Debug)]
pub(super) struct Reserve {
    pub(super) job: JobId,
    pub(super) priority: i32,
    pub(super) masks: BTreeMap<NodeId, u64>,
}

impl Session<'_, '_, '_> {
    /// The `reservation` plugin: elects the highest-priority queued training
    /// gang (admitted, nothing running, needs whole GPUs) that does not fit
    /// now, and holds for it the NVLink domains (or PCIe roots / NUMA nodes, by
    /// its tasks' topology; whole nodes where the domain cannot hold a task)
    /// with the most free GPUs, one per task as far as they hold several.
    /// Lower-priority tasks stay off the held GPUs for the session, so that
    /// they drain instead of being nibbled away. One gang per session.
    pub(super) fn elect_reservation(&mut self) {
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
    pub(super) fn dry_run(&mut self, j: JobId) -> bool {
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
}
