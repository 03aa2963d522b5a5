//! The session's working state, built from a snapshot: interned nodes, queues,
//! jobs and tasks with derived free capacity, and the node index.

use std::collections::{BTreeMap, BTreeSet};

use tessera_model::node::untolerated;
use tessera_model::{GpuRequest, Node, PodGroup, Resources, Snapshot, Taint, Task, Toleration};

use crate::gpu::{MigChoice, NodeGpus, Pick};
use crate::index::NodeIndex;

pub type NodeId = u32;
pub type JobId = u32;
pub type QueueId = u32;

/// Where a task stands during the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// Not placed.
    Pending,
    /// Running before the session started.
    Running,
    /// Placed by this session.
    Bound,
    /// Placed by this session on resources that evictions free.
    Pipelined,
    /// Evicted by this session.
    Evicted,
}

#[derive(Debug, Clone)]
pub struct TaskState<'s> {
    pub src: &'s Task,
    pub job: JobId,
    /// The device shape in force: the task's `gpu`, or the alternative being
    /// tried or taken (`choice`).
    pub gpu: &'s GpuRequest,
    /// Index of `gpu` in the task's options (0: `gpu`).
    pub choice: u32,
    /// The full request with `gpu`.
    pub request: Resources,
    pub priority: i32,
    /// Interned (selector, tolerations, models) signature.
    pub sig: u32,
    pub status: TaskStatus,
    pub node: Option<NodeId>,
    pub gpus: Vec<u32>,
    /// For a MIG request: the instance it holds on `gpus[0]`.
    pub mig: Option<MigChoice>,
}

#[derive(Debug, Clone)]
pub struct JobState<'s> {
    pub src: &'s PodGroup,
    pub queue: Option<QueueId>,
    /// Task ids (into `State::tasks`), sorted by priority then name.
    pub tasks: Vec<u32>,
    /// Tasks that hold resources (running before, or placed now).
    pub occupied: u32,
    pub allocated: Resources,
    pub min_request: Resources,
    pub admitted: bool,
    /// Why the job did not get everything it asked for (set by actions).
    pub reason: Option<String>,
    /// How many tasks could be placed in the last attempt, for gang reasons.
    pub placeable: u32,
    /// First task that did not fit.
    pub failed_task: Option<u32>,
    /// Why it did not fit, as the cluster was when it was tried.
    pub diag: Option<String>,
    /// Original priority-ordered position used for tie breaks.
    pub order: u32,
    /// The last allocate attempt found no node for a task.
    pub no_room: bool,
    /// The last allocate attempt was stopped by the queue's quota.
    pub quota_blocked: bool,
    /// Admitted, holding nothing, and placeable on no node this session: it
    /// holds no quota (no admission reservation, no demand) and waits with
    /// its reason.
    pub parked: bool,
}

impl JobState<'_> {
    pub fn ready(&self) -> bool {
        self.occupied >= self.src.min_member
    }
    pub fn pending_tasks(&self) -> usize {
        self.tasks.len() - self.occupied as usize
    }
}

#[derive(Debug, Clone)]
pub struct QueueState<'s> {
    pub name: &'s str,
    pub parent: Option<QueueId>,
    pub children: Vec<QueueId>,
    pub weight: u64,
    pub guarantee: Resources,
    pub capability: Option<Resources>,
    pub reclaimable: bool,
    /// Held by tasks in this queue's subtree.
    pub allocated: Resources,
    /// Held plus still asked for by admitted jobs, in this subtree.
    pub demand: Resources,
    /// Reserved at admission for admitted jobs that hold nothing yet.
    pub inqueue: Resources,
    pub deserved: Resources,
}

#[derive(Debug, Clone)]
pub struct NodeState<'s> {
    pub src: &'s Node,
    pub free: Resources,
    pub gpus: NodeGpus,
    pub class: u32,
    /// Tasks holding resources here.
    pub tasks: Vec<u32>,
}

/// Equivalence class of nodes for predicates: same labels, taints, GPU models,
/// schedulability.
#[derive(Debug, Clone)]
pub struct NodeClass<'s> {
    pub rep: &'s Node,
    pub models: Vec<String>,
}

/// A task's predicate signature.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sig<'s> {
    pub selector: &'s BTreeMap<String, String>,
    pub tolerations: &'s [Toleration],
    pub models: &'s [String],
}

pub struct State<'s> {
    pub nodes: Vec<NodeState<'s>>,
    pub classes: Vec<NodeClass<'s>>,
    pub queues: Vec<QueueState<'s>>,
    pub jobs: Vec<JobState<'s>>,
    pub tasks: Vec<TaskState<'s>>,
    pub sigs: Vec<Sig<'s>>,
    /// `sig_classes[sig][class]`: does the class pass the signature's predicates.
    pub sig_classes: Vec<Vec<bool>>,
    /// The same, as lists of the classes that pass, per signature.
    pub sig_class_list: Vec<Vec<u32>>,
    /// Every class id (when predicates are off).
    pub all_classes: Vec<u32>,
    pub index: NodeIndex,
    pub total: Resources,
    pub predicates: bool,
}

fn class_models(n: &Node) -> Vec<String> {
    let mut m: Vec<String> = n.gpus.iter().map(|g| g.model.clone()).collect();
    if m.is_empty() && n.allocatable.gpu_milli > 0 {
        if let Some(l) = n.labels.get("nvidia.com/gpu.product") {
            m.push(l.clone());
        }
    }
    m.sort();
    m.dedup();
    m
}

impl<'s> State<'s> {
    pub fn new(snap: &'s Snapshot, predicates: bool) -> State<'s> {
        // Canonical order: whatever order the snapshot lists things in, the
        // session sees them sorted, so the plan does not depend on it.
        let mut nodes: Vec<&Node> = snap.nodes.iter().collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes.dedup_by(|a, b| a.name == b.name);

        type ClassKey<'a> = (&'a BTreeMap<String, String>, Vec<Taint>, Vec<String>);
        let mut class_key: BTreeMap<ClassKey, u32> = BTreeMap::new();
        let mut classes: Vec<NodeClass> = Vec::new();
        let mut node_states = Vec::with_capacity(nodes.len());
        let mut total = Resources::default();
        let mut max_gpus = 0u32;
        for n in &nodes {
            let models = class_models(n);
            let mut taints = n.taints.clone();
            taints.sort();
            let key = (&n.labels, taints, models.clone());
            let next = classes.len() as u32;
            let class = *class_key.entry(key).or_insert_with(|| {
                classes.push(NodeClass { rep: n, models });
                next
            });
            let gpus = NodeGpus::from_node(n);
            max_gpus = max_gpus.max(gpus.slots.len() as u32);
            if !n.unschedulable {
                total.add_assign_saturating(&n.allocatable);
            }
            node_states.push(NodeState {
                src: n,
                free: n.allocatable.clone(),
                gpus,
                class,
                tasks: Vec::new(),
            });
        }
        let node_by_name: BTreeMap<&str, NodeId> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i as NodeId))
            .collect();

        let mut qs: Vec<&tessera_model::Queue> = snap.queues.iter().collect();
        qs.sort_by(|a, b| a.name.cmp(&b.name));
        qs.dedup_by(|a, b| a.name == b.name);
        let queue_by_name: BTreeMap<&str, QueueId> = qs
            .iter()
            .enumerate()
            .map(|(i, q)| (q.name.as_str(), i as QueueId))
            .collect();
        let mut queues: Vec<QueueState> = qs
            .iter()
            .map(|q| QueueState {
                name: &q.name,
                parent: q
                    .parent
                    .as_deref()
                    .and_then(|p| queue_by_name.get(p).copied()),
                children: Vec::new(),
                weight: u64::from(q.weight),
                guarantee: q.guarantee.clone(),
                capability: q.capability.clone(),
                reclaimable: q.reclaimable,
                allocated: Resources::default(),
                demand: Resources::default(),
                inqueue: Resources::default(),
                deserved: Resources::default(),
            })
            .collect();
        // Break cycles (the loader rejects them; the core must still terminate).
        for i in 0..queues.len() {
            let mut seen = vec![false; queues.len()];
            let mut cur = Some(i as QueueId);
            while let Some(c) = cur {
                if seen[c as usize] {
                    queues[i].parent = None;
                    break;
                }
                seen[c as usize] = true;
                cur = queues[c as usize].parent;
            }
        }
        for i in 0..queues.len() {
            if let Some(p) = queues[i].parent {
                queues[p as usize].children.push(i as QueueId);
            }
        }

        let mut groups: Vec<&PodGroup> = snap.groups.iter().collect();
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        groups.dedup_by(|a, b| a.name == b.name);

        let mut sig_ids: BTreeMap<Sig, u32> = BTreeMap::new();
        let mut sigs: Vec<Sig> = Vec::new();
        let mut jobs = Vec::with_capacity(groups.len());
        let mut tasks: Vec<TaskState> = Vec::new();
        for (j, g) in groups.iter().enumerate() {
            let queue = queue_by_name.get(g.queue.as_str()).copied();
            let mut ts: Vec<&Task> = g.tasks.iter().collect();
            ts.sort_by(|a, b| {
                let pa = a.priority.unwrap_or(g.priority);
                let pb = b.priority.unwrap_or(g.priority);
                pb.cmp(&pa).then_with(|| a.name.cmp(&b.name))
            });
            ts.dedup_by(|a, b| a.name == b.name);
            let mut ids = Vec::with_capacity(ts.len());
            for t in ts {
                // With alternatives of different models, the class-level
                // model check is left to device selection, which checks the
                // shape in force.
                let models: &[String] = if t.gpu_options().all(|g| g.models() == t.gpu.models()) {
                    t.gpu.models()
                } else {
                    &[]
                };
                let sig = Sig {
                    selector: &t.node_selector,
                    tolerations: &t.tolerations,
                    models,
                };
                let next = sigs.len() as u32;
                let sig = *sig_ids.entry(sig.clone()).or_insert_with(|| {
                    sigs.push(sig);
                    next
                });
                ids.push(tasks.len() as u32);
                let choice = match (&t.node, t.gpu_choice) {
                    (Some(_), Some(k)) if (k as usize) <= t.gpu_alternatives.len() => k,
                    _ => 0,
                };
                let gpu = t.gpu_option(choice);
                tasks.push(TaskState {
                    src: t,
                    job: j as JobId,
                    gpu,
                    choice,
                    request: t.request_with(gpu),
                    priority: t.priority.unwrap_or(g.priority),
                    sig,
                    status: TaskStatus::Pending,
                    node: None,
                    gpus: Vec::new(),
                    mig: None,
                });
            }
            let min_request = match &g.min_resources {
                Some(r) => r.clone(),
                None => {
                    // A task with alternatives counts as the least of them.
                    let mut r = Resources::default();
                    for &t in ids.iter().take(g.min_member as usize) {
                        let ts = &tasks[t as usize];
                        let least = ts
                            .src
                            .gpu_options()
                            .map(|o| ts.src.request_with(o))
                            .reduce(|a, b| a.min(&b))
                            .unwrap_or_else(|| ts.request.clone());
                        r.add_assign_saturating(&least);
                    }
                    r
                }
            };
            jobs.push(JobState {
                src: g,
                queue,
                tasks: ids,
                occupied: 0,
                allocated: Resources::default(),
                min_request,
                admitted: false,
                reason: None,
                placeable: 0,
                failed_task: None,
                diag: None,
                order: j as u32,
                no_room: false,
                quota_blocked: false,
                parked: false,
            });
        }

        let sig_classes: Vec<Vec<bool>> = sigs
            .iter()
            .map(|s| classes.iter().map(|c| class_passes(c, s)).collect())
            .collect();
        let sig_class_list = sig_classes
            .iter()
            .map(|v| (0..v.len() as u32).filter(|&c| v[c as usize]).collect())
            .collect();
        let all_classes = (0..classes.len() as u32).collect();

        let mut st = State {
            index: NodeIndex::new(classes.len().max(1), max_gpus, node_states.len()),
            nodes: node_states,
            classes,
            queues,
            jobs,
            tasks,
            sigs,
            sig_classes,
            sig_class_list,
            all_classes,
            total,
            predicates,
        };

        // Account for what already runs. MIG instances claimed so far, per node.
        let mut claimed: BTreeSet<(NodeId, u32, u8)> = BTreeSet::new();
        for t in 0..st.tasks.len() {
            let Some(node_name) = st.tasks[t].src.node.as_deref() else {
                continue;
            };
            st.tasks[t].status = TaskStatus::Running;
            st.tasks[t].gpus = st.tasks[t].src.gpu_indices.clone();
            if let Some(&n) = node_by_name.get(node_name) {
                st.tasks[t].node = Some(n);
                let ns = &mut st.nodes[n as usize];
                ns.free.sub_assign_saturating(&st.tasks[t].request);
                let task = &st.tasks[t];
                let mut mig = None;
                let gpus = if let GpuRequest::Mig { profile, .. } = &task.gpu {
                    // The recorded instance; else an in-use instance of the
                    // profile no other task claimed; else a fresh selection.
                    let recorded = match (task.src.gpu_indices.as_slice(), task.src.mig_start) {
                        ([g], Some(s)) => Some((*g, s)),
                        _ => None,
                    };
                    let found = recorded
                        .filter(|&(g, s)| {
                            !claimed.contains(&(n, g, s)) && ns.gpus.claim_mig(g, profile, s)
                        })
                        .or_else(|| {
                            ns.gpus
                                .mig_in_use(profile)
                                .into_iter()
                                .find(|&(g, s)| !claimed.contains(&(n, g, s)))
                        })
                        .or_else(|| {
                            let c = ns.gpus.pick(task.gpu, None, 0)?.mig?;
                            ns.gpus.assign_mig(profile, &c).then_some((c.gpu, c.start))
                        });
                    match found {
                        Some((g, s)) => {
                            claimed.insert((n, g, s));
                            mig = Some(MigChoice {
                                gpu: g,
                                start: s,
                                create: false,
                                remove_idle: Vec::new(),
                            });
                            vec![g]
                        }
                        None => Vec::new(),
                    }
                } else {
                    // Charge the recorded devices; if none are recorded, or they
                    // do not exist or are already taken (an inconsistent
                    // snapshot), charge what a fresh selection picks, so
                    // accounting stays whole.
                    let mut gpus = task.gpus.clone();
                    if gpus.len() != task.gpu.devices() as usize || !ns.gpus.assign(task.gpu, &gpus)
                    {
                        gpus = ns.gpus.select(task.gpu).unwrap_or_default();
                        ns.gpus.assign(task.gpu, &gpus);
                    }
                    gpus
                };
                ns.tasks.push(t as u32);
                st.tasks[t].gpus = gpus;
                st.tasks[t].mig = mig;
            }
            let j = st.tasks[t].job as usize;
            st.jobs[j].occupied += 1;
            let req = st.tasks[t].request.clone();
            st.jobs[j].allocated.add_assign_saturating(&req);
            if let Some(q) = st.jobs[j].queue {
                st.add_queue_allocated(q, &req);
            }
        }
        for n in 0..st.nodes.len() {
            st.reindex(n as NodeId);
        }
        st
    }

    pub fn add_queue_allocated(&mut self, q: QueueId, r: &Resources) {
        let mut cur = Some(q);
        while let Some(c) = cur {
            self.queues[c as usize].allocated.add_assign_saturating(r);
            cur = self.queues[c as usize].parent;
        }
    }

    pub fn sub_queue_allocated(&mut self, q: QueueId, r: &Resources) {
        let mut cur = Some(q);
        while let Some(c) = cur {
            self.queues[c as usize].allocated.sub_assign_saturating(r);
            cur = self.queues[c as usize].parent;
        }
    }

    /// Puts a node back in the index at its current free capacity.
    pub fn reindex(&mut self, n: NodeId) {
        let ns = &self.nodes[n as usize];
        if ns.src.unschedulable || ns.free.pods == 0 {
            self.index.remove(n);
        } else {
            self.index
                .set(n, ns.class, ns.gpus.whole_free(), ns.free.cpu_milli);
        }
    }

    /// Puts option `k` of task `t`'s device shapes in force (the task must
    /// not be placed).
    pub fn set_choice(&mut self, t: u32, k: u32) {
        let ts = &mut self.tasks[t as usize];
        ts.choice = k;
        ts.gpu = ts.src.gpu_option(k);
        ts.request = ts.src.request_with(ts.gpu);
    }

    /// Whether the task passes the class-level predicates on this node.
    pub fn class_ok(&self, t: u32, n: NodeId) -> bool {
        !self.predicates
            || self.sig_classes[self.tasks[t as usize].sig as usize]
                [self.nodes[n as usize].class as usize]
    }

    /// Whether `task` fits on node `n` as it is now, and on which devices.
    pub fn fits(&self, t: u32, n: NodeId) -> Option<Pick> {
        self.fits_excluding(t, n, 0)
    }

    /// [`State::fits`], never on the GPUs in the `exclude` bitmask.
    pub fn fits_excluding(&self, t: u32, n: NodeId, exclude: u64) -> Option<Pick> {
        let task = &self.tasks[t as usize];
        let ns = &self.nodes[n as usize];
        if ns.src.unschedulable || !task.request.fits_in(&ns.free) {
            return None;
        }
        ns.gpus.pick(task.gpu, task.src.topology, exclude)
    }

    /// Places task `t` on node `n` with the devices of `pick`.
    pub fn place(&mut self, t: u32, n: NodeId, pick: Pick, status: TaskStatus) {
        let req = self.tasks[t as usize].request.clone();
        let ns = &mut self.nodes[n as usize];
        ns.free.sub_assign_saturating(&req);
        let gpu_req = &self.tasks[t as usize].gpu;
        let assigned = match (gpu_req, &pick.mig) {
            (GpuRequest::Mig { profile, .. }, Some(c)) => ns.gpus.assign_mig(profile, c),
            _ => ns.gpus.assign(gpu_req, &pick.gpus),
        };
        debug_assert!(assigned, "placing on GPUs that are not free");
        ns.tasks.push(t);
        let task = &mut self.tasks[t as usize];
        task.status = status;
        task.node = Some(n);
        task.gpus = pick.gpus;
        task.mig = pick.mig;
        let j = task.job as usize;
        self.jobs[j].occupied += 1;
        self.jobs[j].allocated.add_assign_saturating(&req);
        if let Some(q) = self.jobs[j].queue {
            self.add_queue_allocated(q, &req);
        }
        self.reindex(n);
    }

    /// Takes task `t` off its node; `to` is its new status (pending on undo,
    /// evicted on eviction).
    pub fn unplace(&mut self, t: u32, to: TaskStatus) {
        let Some(n) = self.tasks[t as usize].node else {
            self.tasks[t as usize].status = to;
            return;
        };
        let req = self.tasks[t as usize].request.clone();
        let gpus = std::mem::take(&mut self.tasks[t as usize].gpus);
        let mut mig = self.tasks[t as usize].mig.take();
        let ns = &mut self.nodes[n as usize];
        ns.free.add_assign_saturating(&req);
        ns.free = ns.free.min(&ns.src.allocatable);
        match (&self.tasks[t as usize].gpu, &mut mig) {
            (GpuRequest::Mig { profile, .. }, Some(c)) => {
                if to == TaskStatus::Evicted {
                    // The instance stays, idle; putting the task back reuses it.
                    ns.gpus.release_mig(c.gpu, profile, c.start);
                    c.create = false;
                    c.remove_idle.clear();
                } else {
                    ns.gpus.unassign_mig(profile, c);
                }
            }
            (req, _) => ns.gpus.release(req, &gpus),
        }
        if let Some(p) = ns.tasks.iter().position(|&x| x == t) {
            ns.tasks.swap_remove(p);
        }
        let task = &mut self.tasks[t as usize];
        if to == TaskStatus::Evicted {
            // An evicted task keeps its node and devices on record for the plan.
            task.gpus = gpus;
            task.mig = mig;
        } else {
            task.node = None;
        }
        task.status = to;
        let j = task.job as usize;
        self.jobs[j].occupied -= 1;
        self.jobs[j].allocated.sub_assign_saturating(&req);
        if let Some(q) = self.jobs[j].queue {
            self.sub_queue_allocated(q, &req);
        }
        self.reindex(n);
    }

    /// Leaf queue ids from the root down (parents before children).
    pub fn queues_top_down(&self) -> Vec<QueueId> {
        let mut out: Vec<QueueId> = (0..self.queues.len() as QueueId)
            .filter(|&q| self.queues[q as usize].parent.is_none())
            .collect();
        let mut i = 0;
        while i < out.len() {
            let q = out[i];
            out.extend(self.queues[q as usize].children.iter().copied());
            i += 1;
        }
        out
    }
}

/// Class-level predicates: selector, taints, GPU models.
fn class_passes(c: &NodeClass<'_>, s: &Sig<'_>) -> bool {
    s.selector
        .iter()
        .all(|(k, v)| c.rep.labels.get(k) == Some(v))
        && untolerated(&c.rep.taints, s.tolerations).is_none()
        && (s.models.is_empty() || c.models.iter().any(|m| s.models.contains(m)))
}

/// Why a class fails a signature (for reasons), or `None` if it passes.
pub fn class_failure(c: &NodeClass<'_>, s: &Sig<'_>) -> Option<String> {
    for (k, v) in s.selector {
        if c.rep.labels.get(k) != Some(v) {
            if let Some(class) = k.strip_prefix(tessera_model::RUNTIME_CLASS_LABEL_PREFIX) {
                return Some(format!(
                    "do not run runtime class `{class}` (no label {k}={v})"
                ));
            }
            if k == tessera_model::ATTESTED_LABEL {
                return Some(format!(
                    "are not attested (no label {k}={v}: `tessera node attestation NODE` says why)"
                ));
            }
            return Some(format!("do not match node selector {k}={v}"));
        }
    }
    if let Some(t) = untolerated(&c.rep.taints, s.tolerations) {
        let eff = format!("{:?}", t.effect);
        return Some(if t.value.is_empty() {
            format!("have untolerated taint {}:{eff}", t.key)
        } else {
            format!("have untolerated taint {}={}:{eff}", t.key, t.value)
        });
    }
    if !s.models.is_empty() && !c.models.iter().any(|m| s.models.contains(m)) {
        return Some(format!("have no GPU of model {}", s.models.join("|")));
    }
    None
}
