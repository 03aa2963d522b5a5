//! The actions: enqueue, allocate, backfill, preempt and reclaim.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use tessera_model::{Dim, NetworkTier, Resources, Strength};

use crate::config::Action;
use crate::state::{JobId, NodeId, QueueId, TaskStatus};
use crate::victims;

use super::shares::over;
use super::undo::{Op, Stmt};
use super::{Session, fmt_dim};

/// Allocation rounds at most: each further round follows groups parked in the
/// one before (see `allocate`).
const MAX_ROUNDS: usize = 8;

impl Session<'_, '_, '_> {
    /// Admission: a group whose queue can take its minimum resources within
    /// capability, and which could fit in the cluster at all, becomes admitted.
    pub(super) fn enqueue(&mut self) {
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

    /// Places admitted groups, queue by queue in fair-share order, gang by gang.
    /// Quota is charged for what is placed: a group admitted but placeable on
    /// no node this session is parked (it gives back its admission reservation
    /// and its demand, and waits with its reason), and the groups its quota
    /// held back get another turn; until nothing more is parked.
    pub(super) fn allocate(&mut self) {
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
    pub(super) fn backfill(&mut self) {
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
    pub(super) fn preempt(&mut self) {
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
    pub(super) fn reclaim(&mut self) {
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
}
