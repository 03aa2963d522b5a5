//! Victim search for `preempt` and `reclaim`: which running tasks to evict so
//! that a waiting task (or a whole waiting gang) fits.
//!
//! A victim set is judged by a [`VictimKey`], compared field by field: the number
//! of tasks it evicts, then their priorities (the highest first), then what it
//! frees beyond what the preemptor asks for, then the task ids (so ties are
//! broken the same way every time). Gang-aware, as Volcano 1.15's gang-aware
//! preemption: evicting a member of a running gang that would leave the gang
//! below its `min_member` evicts every running member of it, and all of them
//! count; so the scheduler prefers one gang over breaking two.
//!
//! The search, for one task, is exact within a budget:
//!
//! - a cheap pass over the nodes that run evictable tasks computes, per node, a
//!   lower bound on the victims needed there (the deficit of each resource over
//!   the largest single victim); nodes are searched in the order of that bound,
//!   and the pass stops at the first node whose bound exceeds the best count found;
//! - on a node, a branch-and-bound search over *units* (one task; or a whole gang
//!   where taking one more member would break it) in the order priority, cost,
//!   size; a branch is cut when what is left cannot cover the deficit, or when
//!   its count plus the lower bound of what is left exceeds the best count;
//!   every set that covers the deficit is checked for real device fit (the GPUs
//!   of the victims released, [`crate::gpu::NodeGpus::pick`]);
//! - at most [`NODE_STEPS`] search steps per node and [`DECISION_STEPS`] per
//!   decision; a node whose search runs out of steps before it found a set falls
//!   back to the greedy choice (lowest priority first until the task fits, never
//!   breaking a gang), and the best set found is taken.
//!
//! A gang that needs several tasks placed is searched jointly when at most
//! [`JOINT_MAX`] running tasks are eligible victims: every victim set (closed
//! under the gang rule) in key order, each tried by placing the whole gang, the
//! first that makes it fit taken. Beyond that, its tasks are placed one at a
//! time, each with the per-task search above.

use tessera_model::{GpuRequest, Resources};

use crate::gpu::NodeGpus;
use crate::state::{JobId, NodeId, State, TaskStatus};

/// Search steps allowed on one node, per decision.
pub const NODE_STEPS: u32 = 512;
/// Search steps allowed over all nodes, per decision.
pub const DECISION_STEPS: u32 = 16_384;
/// Eligible victims in the cluster up to which a gang's victim set is searched
/// jointly (2^JOINT_MAX sets at most).
pub const JOINT_MAX: usize = 10;

/// How good a victim set is: smaller is better, field by field.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct VictimKey {
    /// Tasks evicted (whole gangs counted member by member).
    pub count: u32,
    /// Their priorities, highest first.
    pub prios: Vec<i32>,
    /// What the set frees beyond what the preemptor asks for, in millionths of
    /// the cluster's total, summed over CPU, memory, GPU and GPU memory.
    pub excess: u64,
    /// The evicted tasks' ids, ascending (the final tie break).
    pub ids: Vec<u32>,
}

/// The key of evicting `victims` for a preemptor asking for `need`.
pub fn key_of(st: &State<'_>, victims: &[u32], need: &Resources) -> VictimKey {
    let mut ids = victims.to_vec();
    ids.sort_unstable();
    let mut prios: Vec<i32> = ids.iter().map(|&v| st.tasks[v as usize].priority).collect();
    prios.sort_unstable_by(|a, b| b.cmp(a));
    let mut freed = Resources::default();
    for &v in &ids {
        freed.add_assign_saturating(&st.tasks[v as usize].request);
    }
    VictimKey {
        count: ids.len() as u32,
        prios,
        excess: excess(&freed, need, &st.total),
        ids,
    }
}

/// `freed - need` where positive, per dimension, in millionths of `total`.
pub fn excess(freed: &Resources, need: &Resources, total: &Resources) -> u64 {
    let part = |f: u64, n: u64, t: u64| -> u64 {
        let e = f.saturating_sub(n) as u128;
        if t == 0 {
            0
        } else {
            (e * 1_000_000 / t as u128) as u64
        }
    };
    part(freed.cpu_milli, need.cpu_milli, total.cpu_milli)
        + part(freed.memory, need.memory, total.memory)
        + part(freed.gpu_milli, need.gpu_milli, total.gpu_milli)
        + part(freed.gpu_memory, need.gpu_memory, total.gpu_memory)
}

/// What the gang rule allows of a job as a victim.
#[derive(Debug, Clone, Copy)]
pub struct JobRule {
    /// Members that may be evicted one by one (`u32::MAX`: any).
    pub slack: u32,
    /// Whether the whole job may go (every member running and evictable).
    pub whole: bool,
}

/// The gang rule for job `j`: with the gang plugin, a job may lose members one
/// by one down to `min_member`; below that, only all of its running members
/// together. `ok` says whether a running task may be a victim at all.
pub fn job_rule(st: &State<'_>, j: JobId, gang: bool, ok: &dyn Fn(u32) -> bool) -> JobRule {
    let job = &st.jobs[j as usize];
    if !gang || job.src.min_member <= 1 {
        return JobRule {
            slack: u32::MAX,
            whole: false,
        };
    }
    let slack = job.occupied.saturating_sub(job.src.min_member);
    let whole = job.src.preemptable
        && job.tasks.iter().all(|&t| {
            let ts = &st.tasks[t as usize];
            match ts.status {
                TaskStatus::Running => ok(t),
                TaskStatus::Bound | TaskStatus::Pipelined => false,
                TaskStatus::Pending | TaskStatus::Evicted => true,
            }
        });
    JobRule { slack, whole }
}

/// The running members of job `j`.
pub fn running_members(st: &State<'_>, j: JobId) -> Vec<u32> {
    st.jobs[j as usize]
        .tasks
        .iter()
        .copied()
        .filter(|&t| st.tasks[t as usize].status == TaskStatus::Running)
        .collect()
}

/// The dimensions the search bounds: CPU, memory, GPU, GPU memory, pods.
const DIMS: usize = 5;

fn dims(r: &Resources) -> [u64; DIMS] {
    [r.cpu_milli, r.memory, r.gpu_milli, r.gpu_memory, r.pods]
}

/// One choice in a node's search: a single task, or a whole gang.
#[derive(Debug, Clone)]
struct Unit {
    job: JobId,
    whole: bool,
    /// Every task the unit evicts, on any node.
    tasks: Vec<u32>,
    /// Those on the searched node.
    here: Vec<u32>,
    max_prio: i32,
    /// Freed on the searched node.
    freed: [u64; DIMS],
    /// The largest single task on the searched node.
    max_task: [u64; DIMS],
}

/// What a node's search found.
#[derive(Debug, Clone)]
pub struct Found {
    pub key: VictimKey,
    pub node: NodeId,
    pub victims: Vec<u32>,
    /// Jobs evicted whole (by the gang rule).
    pub whole_jobs: Vec<JobId>,
}

/// The inputs of one decision's victim search.
pub struct Search<'a, 's> {
    pub st: &'a State<'s>,
    /// The task to make room for.
    pub task: u32,
    pub gang: bool,
    /// May this running task be evicted for `task`?
    pub ok: &'a dyn Fn(u32) -> bool,
    /// Does the whole set respect the action's limits (reclaim: the victims'
    /// queues stay at or above their deserved shares)?
    pub set_ok: &'a dyn Fn(&[u32]) -> bool,
    /// Nodes that run evictable tasks.
    pub nodes: &'a [NodeId],
}

/// Search statistics, for the benchmark.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub steps: u32,
    pub nodes_searched: u32,
    pub fallbacks: u32,
}

impl Search<'_, '_> {
    fn need(&self) -> &Resources {
        &self.st.tasks[self.task as usize].request
    }

    /// Whether `task` could fit on node `n` at all (predicates, and within the
    /// node's allocatable).
    fn node_ok(&self, n: NodeId) -> bool {
        let ns = &self.st.nodes[n as usize];
        !ns.tasks.is_empty()
            && !ns.src.unschedulable
            && self.st.class_ok(self.task, n)
            && self.need().fits_in(&ns.src.allocatable)
    }

    /// A lower bound on the tasks to evict on node `n`, or `None` when even
    /// evicting every eligible task there would not cover the deficit.
    fn lower_bound(&self, n: NodeId) -> Option<u32> {
        let ns = &self.st.nodes[n as usize];
        let need = dims(self.need());
        let free = dims(&ns.free);
        let mut sum = [0u64; DIMS];
        let mut max = [0u64; DIMS];
        for &v in &ns.tasks {
            let vt = &self.st.tasks[v as usize];
            if vt.status != TaskStatus::Running
                || !self.st.jobs[vt.job as usize].src.preemptable
                || !(self.ok)(v)
            {
                continue;
            }
            let r = dims(&vt.request);
            for d in 0..DIMS {
                sum[d] = sum[d].saturating_add(r[d]);
                max[d] = max[d].max(r[d]);
            }
        }
        let mut lb = 0u32;
        for d in 0..DIMS {
            let deficit = need[d].saturating_sub(free[d]);
            if deficit == 0 {
                continue;
            }
            if sum[d] < deficit || max[d] == 0 {
                return None;
            }
            lb = lb.max(deficit.div_ceil(max[d]) as u32);
        }
        Some(lb)
    }

    /// Runs the search; see the module documentation.
    pub fn run(&self, stats: &mut Stats) -> Option<Found> {
        let mut order: Vec<(u32, NodeId)> = self
            .nodes
            .iter()
            .copied()
            .filter(|&n| self.node_ok(n))
            .filter_map(|n| self.lower_bound(n).map(|lb| (lb, n)))
            .collect();
        order.sort_unstable();
        let mut best: Option<Found> = None;
        let mut left = DECISION_STEPS;
        for (lb, n) in order {
            if best.as_ref().is_some_and(|b| lb > b.key.count) {
                break;
            }
            stats.nodes_searched += 1;
            let budget = NODE_STEPS.min(left);
            let (found, used, exhausted) = self.search_node(n, budget, best.as_ref());
            left = left.saturating_sub(used);
            stats.steps += used;
            let found = match found {
                Some(f) => Some(f),
                None if exhausted => {
                    stats.fallbacks += 1;
                    self.greedy(n)
                }
                None => None,
            };
            if let Some(f) = found {
                if best.as_ref().is_none_or(|b| f.key < b.key) {
                    best = Some(f);
                }
            }
        }
        best
    }

    /// The units of node `n`, in search order.
    fn units(&self, n: NodeId) -> Vec<Unit> {
        let st = self.st;
        let ns = &st.nodes[n as usize];
        let mut cands: Vec<u32> = ns
            .tasks
            .iter()
            .copied()
            .filter(|&v| {
                let vt = &st.tasks[v as usize];
                vt.status == TaskStatus::Running
                    && st.jobs[vt.job as usize].src.preemptable
                    && (self.ok)(v)
            })
            .collect();
        cands.sort_unstable();
        let mut units: Vec<Unit> = Vec::new();
        let mut jobs: Vec<JobId> = cands.iter().map(|&v| st.tasks[v as usize].job).collect();
        jobs.sort_unstable();
        jobs.dedup();
        for j in jobs {
            let rule = job_rule(st, j, self.gang, self.ok);
            let here: Vec<u32> = cands
                .iter()
                .copied()
                .filter(|&v| st.tasks[v as usize].job == j)
                .collect();
            if rule.slack > 0 {
                for &v in &here {
                    let r = dims(&st.tasks[v as usize].request);
                    units.push(Unit {
                        job: j,
                        whole: false,
                        tasks: vec![v],
                        here: vec![v],
                        max_prio: st.tasks[v as usize].priority,
                        freed: r,
                        max_task: r,
                    });
                }
            }
            if rule.whole && (rule.slack as usize) < here.len() {
                let tasks = running_members(st, j);
                let mut freed = [0u64; DIMS];
                let mut max_task = [0u64; DIMS];
                for &v in &here {
                    let r = dims(&st.tasks[v as usize].request);
                    for d in 0..DIMS {
                        freed[d] = freed[d].saturating_add(r[d]);
                        max_task[d] = max_task[d].max(r[d]);
                    }
                }
                let max_prio = tasks
                    .iter()
                    .map(|&v| st.tasks[v as usize].priority)
                    .max()
                    .unwrap_or(i32::MIN);
                units.push(Unit {
                    job: j,
                    whole: true,
                    tasks,
                    here,
                    max_prio,
                    freed,
                    max_task,
                });
            }
        }
        units.sort_by(|a, b| {
            a.max_prio
                .cmp(&b.max_prio)
                .then_with(|| a.tasks.len().cmp(&b.tasks.len()))
                .then_with(|| b.freed[2].cmp(&a.freed[2]))
                .then_with(|| b.freed[0].cmp(&a.freed[0]))
                .then_with(|| a.tasks[0].cmp(&b.tasks[0]))
        });
        units
    }

    /// Branch and bound on node `n` within `budget` steps. Returns the best set
    /// found (only if better than `bound`), the steps used, and whether the
    /// budget ran out.
    fn search_node(
        &self,
        n: NodeId,
        budget: u32,
        bound: Option<&Found>,
    ) -> (Option<Found>, u32, bool) {
        let units = self.units(n);
        if units.is_empty() {
            return (None, 0, false);
        }
        let k = units.len();
        let mut suffix_sum = vec![[0u64; DIMS]; k + 1];
        let mut suffix_max = vec![[0u64; DIMS]; k + 1];
        for i in (0..k).rev() {
            for d in 0..DIMS {
                suffix_sum[i][d] = suffix_sum[i + 1][d].saturating_add(units[i].freed[d]);
                suffix_max[i][d] = suffix_max[i + 1][d].max(units[i].max_task[d]);
            }
        }
        let ns = &self.st.nodes[n as usize];
        let mut dfs = Dfs {
            s: self,
            units: &units,
            suffix_sum: &suffix_sum,
            suffix_max: &suffix_max,
            need: dims(self.need()),
            free: ns.free.clone(),
            gpus: ns.gpus.clone(),
            chosen: Vec::new(),
            count: 0,
            taken: Vec::new(),
            best: bound.map(|b| (b.key.clone(), Vec::new())),
            found: false,
            steps: 0,
            budget,
            exhausted: false,
        };
        dfs.go(0);
        let (steps, exhausted) = (dfs.steps, dfs.exhausted);
        let found = if dfs.found {
            dfs.best.map(|(key, chosen)| {
                let mut victims: Vec<u32> = Vec::new();
                let mut whole_jobs = Vec::new();
                for u in chosen {
                    victims.extend_from_slice(&units[u].tasks);
                    if units[u].whole {
                        whole_jobs.push(units[u].job);
                    }
                }
                victims.sort_unstable();
                Found {
                    key,
                    node: n,
                    victims,
                    whole_jobs,
                }
            })
        } else {
            None
        };
        (found, steps, exhausted)
    }

    /// The old greedy choice on node `n`: lowest priority (youngest) first until
    /// the task fits, never taking a member that would break its gang.
    fn greedy(&self, n: NodeId) -> Option<Found> {
        let st = self.st;
        let ns = &st.nodes[n as usize];
        let mut cands: Vec<u32> = ns
            .tasks
            .iter()
            .copied()
            .filter(|&v| {
                let vt = &st.tasks[v as usize];
                vt.status == TaskStatus::Running
                    && st.jobs[vt.job as usize].src.preemptable
                    && (self.ok)(v)
            })
            .collect();
        cands.sort_by(|&a, &b| {
            let (ta, tb) = (&st.tasks[a as usize], &st.tasks[b as usize]);
            let (ja, jb) = (&st.jobs[ta.job as usize], &st.jobs[tb.job as usize]);
            ta.priority
                .cmp(&tb.priority)
                .then_with(|| jb.src.creation.cmp(&ja.src.creation))
                .then_with(|| b.cmp(&a))
        });
        let mut free = ns.free.clone();
        let mut gpus = ns.gpus.clone();
        let mut from_job: Vec<(JobId, u32)> = Vec::new();
        let mut chosen = Vec::new();
        let task = &st.tasks[self.task as usize];
        for v in cands {
            let vt = &st.tasks[v as usize];
            if self.gang {
                let vj = &st.jobs[vt.job as usize];
                let taken = from_job.iter().find(|x| x.0 == vt.job).map_or(0, |x| x.1);
                let left = vj.occupied - taken - 1;
                if left < vj.src.min_member && left > 0 {
                    continue;
                }
            }
            match from_job.iter_mut().find(|x| x.0 == vt.job) {
                Some(x) => x.1 += 1,
                None => from_job.push((vt.job, 1)),
            }
            free.add_assign_saturating(&vt.request);
            release(&mut gpus, st, v);
            chosen.push(v);
            if task.request.fits_in(&free) && gpus.pick(task.gpu, task.src.topology, 0).is_some() {
                if !(self.set_ok)(&chosen) {
                    return None;
                }
                let key = key_of(st, &chosen, self.need());
                chosen.sort_unstable();
                return Some(Found {
                    key,
                    node: n,
                    victims: chosen,
                    whole_jobs: Vec::new(),
                });
            }
        }
        None
    }
}

/// Gives back, in `gpus`, the devices task `v` holds.
fn release(gpus: &mut NodeGpus, st: &State<'_>, v: u32) {
    let vt = &st.tasks[v as usize];
    match (&vt.gpu, &vt.mig) {
        (GpuRequest::Mig { profile, .. }, Some(c)) => gpus.release_mig(c.gpu, profile, c.start),
        (r, _) => gpus.release(r, &vt.gpus),
    }
}

/// Takes back, in `gpus`, the devices task `v` holds (undoes [`release`]).
fn reclaim(gpus: &mut NodeGpus, st: &State<'_>, v: u32) {
    let vt = &st.tasks[v as usize];
    match (&vt.gpu, &vt.mig) {
        (GpuRequest::Mig { profile, .. }, Some(c)) => {
            gpus.claim_mig(c.gpu, profile, c.start);
        }
        (r, _) => {
            gpus.assign(r, &vt.gpus);
        }
    }
}

struct Dfs<'a, 'b, 's> {
    s: &'a Search<'b, 's>,
    units: &'a [Unit],
    suffix_sum: &'a [[u64; DIMS]],
    suffix_max: &'a [[u64; DIMS]],
    need: [u64; DIMS],
    free: Resources,
    gpus: NodeGpus,
    chosen: Vec<usize>,
    count: u32,
    /// Individual members taken per job, and whether the job goes whole.
    taken: Vec<(JobId, u32, bool)>,
    best: Option<(VictimKey, Vec<usize>)>,
    /// Whether `best` was found here (not just the bound passed in).
    found: bool,
    steps: u32,
    budget: u32,
    exhausted: bool,
}

impl Dfs<'_, '_, '_> {
    fn best_count(&self) -> u32 {
        self.best.as_ref().map_or(u32::MAX, |b| b.0.count)
    }

    fn fits(&self) -> bool {
        let task = &self.s.st.tasks[self.s.task as usize];
        task.request.fits_in(&self.free) && self.gpus.pick(task.gpu, task.src.topology, 0).is_some()
    }

    fn victims(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .chosen
            .iter()
            .flat_map(|&u| self.units[u].tasks.iter().copied())
            .collect();
        v.sort_unstable();
        v
    }

    fn go(&mut self, i: usize) {
        if self.exhausted {
            return;
        }
        if self.steps >= self.budget {
            self.exhausted = true;
            return;
        }
        self.steps += 1;
        if !self.chosen.is_empty() && self.fits() {
            let victims = self.victims();
            if (self.s.set_ok)(&victims) {
                let key = key_of(self.s.st, &victims, self.s.need());
                if self.best.as_ref().is_none_or(|b| key < b.0) {
                    self.best = Some((key, self.chosen.clone()));
                    self.found = true;
                }
            }
            // A superset evicts more, and takes more from the same queues.
            return;
        }
        if i == self.units.len() {
            return;
        }
        // Bounds on what is left: it must cover the deficit, and the count
        // plus the fewest further tasks must not exceed the best count.
        let free = dims(&self.free);
        let mut lb = 1u32;
        for (d, &f) in free.iter().enumerate() {
            let deficit = self.need[d].saturating_sub(f);
            if deficit == 0 {
                continue;
            }
            if self.suffix_sum[i][d] < deficit || self.suffix_max[i][d] == 0 {
                return;
            }
            lb = lb.max(deficit.div_ceil(self.suffix_max[i][d]) as u32);
        }
        if self.count.saturating_add(lb) > self.best_count() {
            return;
        }
        let u = &self.units[i];
        let rule_slack = if u.whole {
            0
        } else {
            job_rule(self.s.st, u.job, self.s.gang, self.s.ok).slack
        };
        let entry = self.taken.iter().position(|x| x.0 == u.job);
        let allowed = match entry {
            None => true,
            Some(k) => {
                let (_, ind, whole) = self.taken[k];
                !whole && if u.whole { ind == 0 } else { ind < rule_slack }
            }
        };
        if allowed && self.count + u.tasks.len() as u32 <= self.best_count() {
            // Take unit i.
            let k = match entry {
                Some(k) => k,
                None => {
                    self.taken.push((u.job, 0, false));
                    self.taken.len() - 1
                }
            };
            if u.whole {
                self.taken[k].2 = true;
            } else {
                self.taken[k].1 += 1;
            }
            for &v in &u.here {
                let vt = &self.s.st.tasks[v as usize];
                self.free.add_assign_saturating(&vt.request);
                release(&mut self.gpus, self.s.st, v);
            }
            self.chosen.push(i);
            self.count += u.tasks.len() as u32;
            self.go(i + 1);
            self.count -= u.tasks.len() as u32;
            self.chosen.pop();
            for &v in u.here.iter().rev() {
                let vt = &self.s.st.tasks[v as usize];
                self.free.sub_assign_saturating(&vt.request);
                reclaim(&mut self.gpus, self.s.st, v);
            }
            if u.whole {
                self.taken[k].2 = false;
            } else {
                self.taken[k].1 -= 1;
            }
            if entry.is_none() {
                self.taken.pop();
            }
        }
        // Leave unit i.
        self.go(i + 1);
    }
}

/// Every victim set over `eligible` (running tasks, at most [`JOINT_MAX`])
/// closed under the gang rule, in key order, for a gang asking for `need`.
/// `set_ok` filters sets the action does not allow.
pub fn joint_sets(
    st: &State<'_>,
    eligible: &[u32],
    gang: bool,
    ok: &dyn Fn(u32) -> bool,
    set_ok: &dyn Fn(&[u32]) -> bool,
    need: &Resources,
) -> Vec<(VictimKey, Vec<u32>, Vec<JobId>)> {
    let m = eligible.len().min(JOINT_MAX);
    let eligible = &eligible[..m];
    let pos = |t: u32| eligible.iter().position(|&e| e == t);
    let mut jobs: Vec<JobId> = eligible.iter().map(|&v| st.tasks[v as usize].job).collect();
    jobs.sort_unstable();
    jobs.dedup();
    // Per job: its bit mask over `eligible`, its rule, and the mask of all its
    // running members (None when one of them is not eligible).
    let info: Vec<(JobId, u64, JobRule, Option<u64>)> = jobs
        .iter()
        .map(|&j| {
            let mask = eligible
                .iter()
                .enumerate()
                .filter(|(_, v)| st.tasks[**v as usize].job == j)
                .fold(0u64, |m, (i, _)| m | (1 << i));
            let rule = job_rule(st, j, gang, ok);
            let all = running_members(st, j)
                .into_iter()
                .try_fold(0u64, |m, t| pos(t).map(|i| m | (1 << i)));
            (j, mask, rule, all)
        })
        .collect();
    let mut closed: Vec<(u64, Vec<JobId>)> = Vec::new();
    'sets: for mask in 1u64..(1u64 << m) {
        let mut c = mask;
        let mut whole = Vec::new();
        for &(j, jm, rule, all) in &info {
            let k = (mask & jm).count_ones();
            if k == 0 || k <= rule.slack {
                continue;
            }
            match all {
                Some(a) if rule.whole => {
                    c |= a;
                    whole.push(j);
                }
                _ => continue 'sets,
            }
        }
        closed.push((c, whole));
    }
    closed.sort_by_key(|x| x.0);
    closed.dedup_by_key(|x| x.0);
    let mut out: Vec<(VictimKey, Vec<u32>, Vec<JobId>)> = closed
        .into_iter()
        .filter_map(|(c, whole)| {
            let victims: Vec<u32> = (0..m)
                .filter(|i| c & (1 << i) != 0)
                .map(|i| eligible[i])
                .collect();
            set_ok(&victims).then(|| (key_of(st, &victims, need), victims, whole))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
