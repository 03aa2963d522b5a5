//! Deserved shares (water-filling over the queue tree), quota checks, and the
//! order queues and jobs take their turns in.

use std::cmp::Ordering;
use std::collections::VecDeque;

use tessera_model::{Dim, Resources};

use crate::config::PluginName;
use crate::proportion::water_fill_resources;
use crate::state::{JobId, QueueId, TaskStatus};

use super::{Session, fmt_dim};

impl Session<'_, '_, '_> {
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

    pub(super) fn compute_deserved(&mut self) {
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
    pub(super) fn queue_allows(
        &self,
        q: QueueId,
        req: &Resources,
        use_deserved: bool,
    ) -> Result<(), String> {
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
    pub(super) fn queue_share(&self, q: QueueId) -> u64 {
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
    pub(super) fn jobs_by_queue(
        &self,
        want: impl Fn(&Self, JobId) -> bool,
    ) -> Vec<VecDeque<JobId>> {
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

    pub(super) fn has_pending(&self, j: JobId, best_effort: bool) -> bool {
        self.st.jobs[j as usize].tasks.iter().any(|&t| {
            let ts = &self.st.tasks[t as usize];
            ts.status == TaskStatus::Pending && ts.request.is_best_effort() == best_effort
        })
    }
}

/// The first dimension (with a non-zero request) in which `held + req` exceeds
/// `limit`. Extended resources that `limit` does not name are not limited.
pub(super) fn over(held: &Resources, req: &Resources, limit: &Resources) -> Option<Dim> {
    req.dims()
        .filter(|(d, r)| {
            *r > 0
                && *d != Dim::Pods
                && !matches!(d, Dim::Extended(n) if !limit.extended.contains_key(n))
        })
        .find(|(d, r)| held.get(d).saturating_add(*r) > limit.get(d))
        .map(|(d, _)| d)
}
