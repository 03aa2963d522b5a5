//! Assembling the snapshot the schedulers read, and keeping it assembled.
//!
//! Each pod's part of the snapshot ([`PodOut`]: which group it joins with
//! which task, or why it waits; its request on its node; the affinity or claim
//! pin it adds to node labels) depends on the pod, the binding assumed for it,
//! and objects that are not pods (PodGroups, PriorityClasses, claims, shards,
//! nodes, victims awaited). So:
//!
//! * a **full assembly** works out every pod's part, folds the groups, and
//!   builds the nodes: [`State::build`], the reference;
//! * between two cycles usually only a few pods changed. When nothing but pods
//!   (and bindings assumed or forgotten) changed since the last assembly, and
//!   the PodDisruptionBudgets that allow no disruption are still the same
//!   ones (that decides which groups may be preempted, for every pod, so a
//!   change there ties every pod to every other), [`State::build_incremental`]
//!   counts the PDBs again and patches the last snapshot: it works
//!   out the changed pods' parts again, re-folds only the groups they left or
//!   joined, patches the others group task by task, and rebuilds the nodes only
//!   when the set of affinities or claim pins of pending pods changed. Anything
//!   else changing means a full assembly.
//!
//! A full assembly is the patch of an empty snapshot with every pod changed, so
//! both paths share every rule; a property test checks that a patched snapshot
//! always equals a fresh one.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1 as core;
use tessera_model::{GpuRequest, GroupKind, PodGroup, Queue, Resources, Task};

use super::{AgentPod, Built, GroupMeta, OTHERS, PodKey, State};
use crate::dra::{self, SliceInfo};
use crate::translate::{self, GroupRef, PodInfo};

/// Where one pod goes in the snapshot.
#[derive(Debug, Clone)]
enum Dest {
    /// Not in the snapshot (another scheduler's pending pod, a terminating one).
    Skip,
    Waiting(String),
    Agent(AgentPod),
    /// A task of the others group (capacity in use, never moved). The task
    /// moves into the snapshot when the part is applied (`None` after).
    Others(Option<Task>),
    Group(Member),
}

/// A pod's task in a model group of ours, with what the group takes from it.
#[derive(Debug, Clone)]
struct Member {
    gname: String,
    /// Moves into the snapshot's group when the group is folded (`None`
    /// after): a task is held once, by the snapshot.
    task: Option<Task>,
    pending: bool,
    /// `(namespace, PodGroup name)` when a PodGroup object defines the group.
    spec: Option<(String, String)>,
    namespace: String,
    queue: Option<String>,
    kind: Option<GroupKind>,
    created_ms: u64,
    priority: i32,
    preemptable: bool,
}

/// One pod's part of the snapshot.
#[derive(Debug, Clone)]
pub(super) struct PodOut {
    dest: Dest,
    /// Its request on its node, bound or assumed.
    usage: Option<(String, Resources)>,
    /// A required node affinity of a pending pod of ours: the synthetic label.
    affinity: Option<(String, core::NodeSelector)>,
    /// The node an allocated claim pins a pending pod to.
    claim_pin: Option<String>,
}

/// What the last assembly was made of, for the next one to patch.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// `State::global` when it was made.
    global: u64,
    outs: BTreeMap<PodKey, PodOut>,
    /// Model group name → its member pods, sorted (most groups have one
    /// member: a sorted `Vec` costs far less than a `BTreeSet` there).
    members: BTreeMap<String, Vec<PodKey>>,
    /// The pods behind the others group's tasks, in the same order.
    others: Vec<PodKey>,
    waiting: BTreeMap<PodKey, String>,
    agent: BTreeMap<PodKey, AgentPod>,
    /// Affinity label → (pending pods using it, its selector).
    affinities: BTreeMap<String, (usize, core::NodeSelector)>,
    /// Pinned node → pending pods pinned to it.
    pins: BTreeMap<String, usize>,
    /// Tasks that were in neither the changed parts nor the snapshot and had
    /// to be worked out again (tests check it stays 0).
    recomputed: u64,
}

impl Index {
    #[cfg(test)]
    pub(super) fn recomputed(&self) -> u64 {
        self.recomputed
    }
}

/// What every pod's part depends on that is the same for all pods.
struct Ctx<'a> {
    agent_nodes: &'a BTreeSet<&'a str>,
    /// MIG profiles some node time-slices.
    time_sliced: &'a BTreeSet<&'a str>,
}

fn others_group() -> PodGroup {
    let mut g = PodGroup::new(OTHERS, "~none", 0);
    g.preemptable = false;
    g
}

impl State {
    /// Assembles the snapshot the schedulers read, from scratch.
    pub fn build(&self) -> Built {
        self.assemble_full().1
    }

    /// [`State::build`], patching the snapshot last assembled and handed back
    /// with [`State::recycle`] when only pods changed since (see the module
    /// docs); a full assembly otherwise.
    pub fn build_incremental(&mut self) -> Built {
        let dirty = std::mem::take(&mut self.dirty);
        let last = match (self.index.take(), self.parked.take()) {
            (Some(ix), Some(b)) if ix.global == self.global => Some((ix, b)),
            _ => None,
        };
        let (ix, mut b) = match last.and_then(|(ix, b)| self.recount_pdbs(ix, b)) {
            Some((ix, b)) => {
                self.assembled_in_part += 1;
                self.patch(ix, b, dirty.into_iter().collect(), false)
            }
            None => self.assemble_full(),
        };
        // GPU indices that do not add up (out of range, held twice) are
        // dropped, with a logged reason, so accounting stays whole.
        for i in b.snapshot.repair() {
            self.note(format!("snapshot repaired: {i}"));
        }
        self.index = Some(ix);
        b
    }

    /// Hands a snapshot from [`State::build_incremental`] back (after the
    /// schedulers read it, unchanged), so that the next one patches it.
    pub fn recycle(&mut self, built: Built) {
        self.parked = Some(built);
    }

    /// How many assemblies so far patched the last snapshot instead of
    /// starting afresh.
    pub fn assembled_in_part(&self) -> u64 {
        self.assembled_in_part
    }

    fn assemble_full(&self) -> (Index, Built) {
        let mut b = Built::default();
        // Queues: Tessera's definition wins over Volcano's of the same name.
        for m in self.queues.values() {
            if let Some(q) = m.values().next() {
                b.snapshot.queues.push(q.clone());
            }
        }
        if !self.queues.contains_key("default") {
            b.snapshot.queues.push(Queue::new("default"));
        }
        self.pdb_counts(&mut b);
        let ix = Index {
            global: self.global,
            ..Index::default()
        };
        self.patch(ix, b, self.pods.keys().cloned().collect(), true)
    }

    /// Counts the PDBs again for a snapshot to be patched; `None` (assemble
    /// afresh) when the set of PDBs that allow no disruption changed, since
    /// that decides which groups may be preempted, unchanged pods' included.
    fn recount_pdbs(&self, ix: Index, mut b: Built) -> Option<(Index, Built)> {
        if self.pdbs.is_empty() && b.pdb_allowed.is_empty() {
            return Some((ix, b));
        }
        let zero = |b: &Built| -> BTreeSet<(String, String)> {
            b.pdb_allowed
                .iter()
                .filter(|(_, a)| **a == 0)
                .map(|(k, _)| k.clone())
                .collect()
        };
        let before = zero(&b);
        self.pdb_counts(&mut b);
        (zero(&b) == before).then_some((ix, b))
    }

    /// PDBs: bound matching pods and the disruptions they allow.
    fn pdb_counts(&self, b: &mut Built) {
        b.pdb_allowed.clear();
        b.pdb_of_pod.clear();
        if self.pdbs.is_empty() {
            return;
        }
        let mut healthy: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (key, p) in &self.pods {
            let bound = p.task.node.is_some() || self.assumed.contains_key(key);
            if !bound || p.terminating {
                continue;
            }
            for (k, pdb) in &self.pdbs {
                if pdb.namespace == p.namespace
                    && translate::selector_matches(&pdb.selector, &p.labels)
                {
                    *healthy.entry(k.clone()).or_default() += 1;
                    b.pdb_of_pod.entry(key.clone()).or_default().push(k.clone());
                }
            }
        }
        for (k, pdb) in &self.pdbs {
            let h = healthy.get(k).copied().unwrap_or(0);
            b.pdb_allowed.insert(k.clone(), pdb.allowed(h));
        }
    }

    /// Works the parts of the pods in `changed` out again and patches `b` (made
    /// from `ix`) with them; `fresh`: both start empty (a full assembly), so
    /// the nodes are built and nothing needs removing.
    fn patch(
        &self,
        mut ix: Index,
        mut b: Built,
        changed: Vec<PodKey>,
        fresh: bool,
    ) -> (Index, Built) {
        let mut nodes = fresh;
        let agent_nodes = self.agent_nodes();
        let time_sliced: BTreeSet<&str> = self
            .time_sliced_mig
            .values()
            .flatten()
            .map(String::as_str)
            .collect();
        let ctx = Ctx {
            agent_nodes: &agent_nodes,
            time_sliced: &time_sliced,
        };
        let mut groups: BTreeSet<String> = BTreeSet::new();
        let mut agent_usage = nodes;
        let others_at = |b: &Built| {
            b.snapshot
                .groups
                .binary_search_by(|g| g.name.as_str().cmp(OTHERS))
        };
        // Each touched group's members before this patch: its tasks in the
        // snapshot are theirs, in that order.
        let mut before: BTreeMap<String, Vec<PodKey>> = BTreeMap::new();
        for key in changed {
            let mut new = self.pods.get(&key).map(|p| self.pod_out(&key, p, &b, &ctx));
            let old = ix.outs.remove(&key);
            for (o, add) in [(old.as_ref(), false), (new.as_ref(), true)] {
                let Some(o) = o else { continue };
                if let Some((n, _)) = &o.usage
                    && agent_nodes.contains(n.as_str())
                {
                    agent_usage = true;
                }
                if let Some((k, sel)) = &o.affinity {
                    nodes |= count(
                        &mut ix.affinities,
                        k,
                        add,
                        || (0, sel.clone()),
                        |e| &mut e.0,
                    );
                }
                if let Some(n) = &o.claim_pin {
                    nodes |= count(&mut ix.pins, n, add, || 0, |e| e);
                }
                match &o.dest {
                    Dest::Skip | Dest::Others(_) => {}
                    Dest::Waiting(r) => {
                        if add {
                            ix.waiting.insert(key.clone(), r.clone());
                        } else {
                            ix.waiting.remove(&key);
                        }
                    }
                    Dest::Agent(a) => {
                        if add {
                            ix.agent.insert(key.clone(), a.clone());
                        } else {
                            ix.agent.remove(&key);
                        }
                    }
                    Dest::Group(m) => {
                        if !groups.contains(&m.gname) {
                            groups.insert(m.gname.clone());
                            before.insert(
                                m.gname.clone(),
                                ix.members.get(&m.gname).cloned().unwrap_or_default(),
                            );
                        }
                        let set = ix.members.entry(m.gname.clone()).or_default();
                        match (set.binary_search(&key), add) {
                            (Err(i), true) => set.insert(i, key.clone()),
                            (Ok(i), false) => {
                                set.remove(i);
                            }
                            _ => {}
                        }
                        if set.is_empty() {
                            ix.members.remove(&m.gname);
                        }
                    }
                }
            }
            // The others group, patched task by task: the old part's task
            // out, the new part's task (moved) in.
            if let Some(PodOut {
                dest: Dest::Others(_),
                ..
            }) = &old
                && let Ok(i) = ix.others.binary_search(&key)
                && let Ok(gi) = others_at(&b)
            {
                ix.others.remove(i);
                b.snapshot.groups[gi].tasks.remove(i);
                if b.snapshot.groups[gi].tasks.is_empty() {
                    b.snapshot.groups.remove(gi);
                }
            }
            if let Some(PodOut {
                dest: Dest::Others(t),
                ..
            }) = new.as_mut()
                && let Err(i) = ix.others.binary_search(&key)
                && let Some(task) = t.take()
            {
                let gi = match others_at(&b) {
                    Ok(gi) => gi,
                    Err(gi) => {
                        b.snapshot.groups.insert(gi, others_group());
                        gi
                    }
                };
                ix.others.insert(i, key.clone());
                b.snapshot.groups[gi].tasks.insert(i, task);
            }
            if let Some(o) = new {
                ix.outs.insert(key, o);
            }
        }
        for gname in &groups {
            let before = before.remove(gname).unwrap_or_default();
            self.fold(gname, &before, &mut ix, &mut b, fresh, &ctx);
        }
        b.waiting = ix
            .waiting
            .iter()
            .map(|(k, r)| (k.clone(), r.clone()))
            .chain(
                self.bad_pods
                    .iter()
                    .map(|(k, r)| (k.clone(), format!("cannot read the pod: {r}"))),
            )
            .collect();
        b.agent_pods = ix.agent.values().cloned().collect();
        if nodes {
            self.nodes_part(&ix, &mut b, &agent_nodes);
        } else if agent_usage {
            self.agent_part(&ix, &mut b, &agent_nodes);
        }
        (ix, b)
    }

    /// Replaces (or adds, or removes) model group `gname` in `b`, folded from
    /// its members in key order.
    /// `before`: the group's members before this patch (its tasks in the
    /// snapshot are theirs, in that order).
    fn fold(
        &self,
        gname: &str,
        before: &[PodKey],
        ix: &mut Index,
        b: &mut Built,
        fresh: bool,
        ctx: &Ctx<'_>,
    ) {
        let at = b
            .snapshot
            .groups
            .binary_search_by(|g| g.name.as_str().cmp(gname));
        if !fresh {
            b.meta.remove(gname);
            b.pending.remove(gname);
        }
        // The unchanged members' tasks, taken from the group as it was.
        let mut old_tasks: Vec<Option<Task>> = match at {
            Ok(i) => std::mem::take(&mut b.snapshot.groups[i].tasks)
                .into_iter()
                .map(Some)
                .collect(),
            Err(_) => Vec::new(),
        };
        let Index {
            outs,
            members,
            recomputed,
            ..
        } = ix;
        let members = members.get(gname).map(Vec::as_slice).unwrap_or_default();
        let mut g: Option<PodGroup> = None;
        let mut pending = Vec::new();
        for key in members {
            let Some(PodOut {
                dest: Dest::Group(m),
                ..
            }) = outs.get_mut(key)
            else {
                continue;
            };
            let task = match m.task.take() {
                Some(t) => t,
                None => match before
                    .binary_search(key)
                    .ok()
                    .and_then(|j| old_tasks.get_mut(j))
                    .and_then(Option::take)
                {
                    Some(t) => t,
                    // Never expected (a member's task is either new or in
                    // the group as it was); worked out again if it happens.
                    None => {
                        *recomputed += 1;
                        let again = self.pods.get(key).map(|p| self.pod_out(key, p, b, ctx));
                        match again {
                            Some(PodOut {
                                dest: Dest::Group(Member { task: Some(t), .. }),
                                ..
                            }) => t,
                            _ => continue,
                        }
                    }
                },
            };
            let spec = m
                .spec
                .as_ref()
                .and_then(|(ns, name)| self.group_spec(ns, name));
            let g = g.get_or_insert_with(|| {
                let (min, queue) = match spec {
                    Some(s) => (s.min_member, s.queue.clone()),
                    None => (1, m.queue.clone()),
                };
                let mut g = PodGroup::new(gname, queue.unwrap_or_else(|| "default".into()), min);
                g.min_resources = spec.and_then(|s| s.min_resources.clone());
                // A tier above the top one: within one domain of the top tier
                // (Volcano tries every HyperNode then); without tiers, as given.
                let top = self.topology.max_tier();
                g.network_topology = spec.and_then(|s| s.network_topology).map(|mut nt| {
                    if top > 0 && nt.tier > top {
                        nt.tier = top;
                    }
                    nt
                });
                g.kind = spec
                    .and_then(|s| s.kind)
                    .or(m.kind)
                    .unwrap_or(GroupKind::Batch);
                g.creation = spec.map(|s| s.created_ms).unwrap_or(m.created_ms);
                g.priority = spec
                    .and_then(|s| s.priority_class.as_ref())
                    .and_then(|c| self.priority_classes.get(c).copied())
                    .unwrap_or(i32::MIN);
                b.meta.insert(
                    gname.to_string(),
                    GroupMeta {
                        namespace: m.namespace.clone(),
                        podgroup: spec.map(|s| (s.api, s.name.clone())),
                    },
                );
                g
            });
            if spec.is_none_or(|s| s.priority_class.is_none()) {
                g.priority = g.priority.max(m.priority);
            }
            if !m.preemptable {
                g.preemptable = false;
            }
            if m.pending {
                pending.push(key.clone());
            }
            g.tasks.push(task);
        }
        if !pending.is_empty() {
            b.pending.insert(gname.to_string(), pending);
        }
        match (g, at) {
            (Some(mut g), at) => {
                if g.priority == i32::MIN {
                    g.priority = 0;
                }
                match at {
                    Ok(i) => b.snapshot.groups[i] = g,
                    Err(i) => b.snapshot.groups.insert(i, g),
                }
            }
            (None, Ok(i)) => {
                b.snapshot.groups.remove(i);
            }
            (None, Err(_)) => {}
        }
    }

    /// One pod's part of the snapshot (`b` holds the PDB counts).
    fn pod_out(&self, key: &PodKey, p: &PodInfo, b: &Built, ctx: &Ctx<'_>) -> PodOut {
        let agent_nodes = ctx.agent_nodes;
        let mut out = PodOut {
            dest: Dest::Skip,
            usage: None,
            affinity: None,
            claim_pin: None,
        };
        let ours = p.scheduler == self.scheduler_name;
        let assumed = self.assumed.get(key);
        let node = p
            .task
            .node
            .clone()
            .or_else(|| assumed.map(|a| a.node.clone()));
        if node.is_none() && (!ours || p.terminating) {
            return out;
        }
        let mut task = p.task.clone();
        // A time-sliced profile: several pods share an instance, so its
        // pods are counted (nvidia.com/mig-*), not given one.
        if let GpuRequest::Mig { profile, .. } = &task.gpu
            && ctx.time_sliced.contains(profile.as_str())
        {
            task.gpu = GpuRequest::None;
            task.gpu_indices.clear();
            task.mig_start = None;
        }
        if let Some(a) = assumed
            && task.node.is_none()
        {
            task.node = Some(a.node.clone());
            task.gpu_indices = a.gpus.clone();
            task.mig_start = a.mig_start;
        }
        // DRA claims: GPUs counted as whole GPUs of the claim's request.
        if !p.claims.is_empty() || !p.claims_missing.is_empty() {
            if node.is_none() {
                if let Some(m) = p.claims_missing.first() {
                    out.dest = Dest::Waiting(format!(
                        "waiting for the ResourceClaim of pod claim {m} to be created"
                    ));
                    return out;
                }
                let mut count = 0;
                let mut missing = None;
                // DRA's prioritized list (the first claim with one): its
                // first choice, and the others.
                let mut listed: Option<(u32, Vec<u32>)> = None;
                for c in &p.claims {
                    match self.claim(&p.namespace, c) {
                        Some(ci) => {
                            count += ci.gpus();
                            if listed.is_none() && !ci.first_available.is_empty() {
                                listed = Some((ci.gpus(), ci.gpu_alternatives()));
                            }
                            if let Some(n) = &ci.allocated_node {
                                out.claim_pin = Some(n.clone());
                            }
                        }
                        None => missing = Some(c.clone()),
                    }
                }
                if let Some(m) = missing {
                    out.dest = Dest::Waiting(format!("waiting for ResourceClaim {m}"));
                    return out;
                }
                if count > 0 {
                    let base = task.gpu.whole();
                    let models = task.gpu.models().to_vec();
                    if let Some((first, alts)) = listed {
                        task.gpu_alternatives = alts
                            .into_iter()
                            .map(|a| GpuRequest::Whole {
                                count: count - first + a + base,
                                models: models.clone(),
                            })
                            .collect();
                    }
                    task.gpu = GpuRequest::Whole {
                        count: count + base,
                        models,
                    };
                }
            } else {
                let count: u32 = p
                    .claims
                    .iter()
                    .filter_map(|c| self.claim(&p.namespace, c))
                    .map(|c| c.held_gpus())
                    .sum();
                if count > 0 && task.gpu == GpuRequest::None {
                    task.gpu = GpuRequest::Whole {
                        count,
                        models: vec![],
                    };
                }
            }
        }
        if let Some(n) = &node {
            let mut r = task.request();
            if let Some(nd) = self.nodes.get(n)
                && nd.gpus.is_empty()
            {
                r.gpu_memory = 0;
            }
            // Usage on a node Tessera does not know counts nowhere.
            let at = if self.nodes.contains_key(n) {
                n.clone()
            } else {
                String::new()
            };
            out.usage = Some((at, r));
        }
        if !ours {
            task.name = format!("{}/{}", p.namespace, p.name);
            out.dest = Dest::Others(Some(task));
            return out;
        }
        // Required node affinity becomes a synthetic node label.
        if node.is_none() {
            if let Some(a) = &p.affinity {
                let k = translate::affinity_key(a);
                task.node_selector.insert(k.clone(), "true".into());
                out.affinity = Some((k, a.clone()));
            }
            if let Some(n) = &out.claim_pin {
                task.node_selector.insert(
                    format!("{}claim", translate::keys::AFFINITY_PREFIX),
                    n.clone(),
                );
            }
        }
        let (gname, spec) = match &p.group {
            GroupRef::None => (format!("{}/{}@pod", p.namespace, p.name), None),
            GroupRef::Named(g) => match self.group_spec(&p.namespace, g) {
                Some(s) => (format!("{}/{}", p.namespace, g), Some(s)),
                None => {
                    if node.is_none() {
                        out.dest =
                            Dest::Waiting(format!("waiting for PodGroup {}/{g}", p.namespace));
                    } else {
                        // A bound pod of a vanished group still holds its node.
                        task.name = format!("{}/{}", p.namespace, p.name);
                        out.dest = Dest::Others(Some(task));
                    }
                    return out;
                }
            },
        };
        if let Some(victims) = self.awaiting.get(&gname)
            && node.is_none()
        {
            out.dest = Dest::Waiting(format!(
                "waiting for {} preempted pod(s) to terminate",
                victims.len()
            ));
            return out;
        }
        let is_agent = p.kind == Some(GroupKind::Agent)
            || spec.is_some_and(|s| s.kind == Some(GroupKind::Agent));
        if is_agent && !agent_nodes.is_empty() && node.is_none() {
            out.dest = Dest::Agent(AgentPod {
                key: key.clone(),
                request: task.request(),
                priority: p.priority.unwrap_or(0),
                tenant: p.namespace.clone(),
            });
            return out;
        }
        let priority = p
            .priority
            .or_else(|| {
                p.priority_class
                    .as_ref()
                    .and_then(|c| self.priority_classes.get(c).copied())
            })
            .unwrap_or(0);
        // PDB-aware: a running pod no disruption may touch keeps its group
        // out of victim searches.
        let protected = node.is_some()
            && b.pdb_of_pod
                .get(key)
                .is_some_and(|ks| ks.iter().any(|k| b.pdb_allowed.get(k) == Some(&0)));
        out.dest = Dest::Group(Member {
            gname,
            pending: node.is_none(),
            task: Some(task),
            spec: spec.map(|_| match &p.group {
                GroupRef::Named(g) => (p.namespace.clone(), g.clone()),
                GroupRef::None => (p.namespace.clone(), String::new()),
            }),
            namespace: p.namespace.clone(),
            queue: p.queue.clone(),
            kind: p.kind,
            created_ms: p.created_ms,
            priority,
            preemptable: p.preemptable && !protected,
        });
        out
    }

    /// Requests on each agent node, from every pod's part.
    fn agent_usage(&self, ix: &Index, agent_nodes: &BTreeSet<&str>) -> BTreeMap<String, Resources> {
        let mut usage: BTreeMap<String, Resources> = BTreeMap::new();
        if agent_nodes.is_empty() {
            return usage;
        }
        for o in ix.outs.values() {
            if let Some((n, r)) = &o.usage
                && agent_nodes.contains(n.as_str())
            {
                usage.entry(n.clone()).or_default().add_assign_saturating(r);
            }
        }
        usage
    }

    /// The agent shard's nodes with their free capacity (from the nodes as
    /// the snapshot has them, DRA devices applied).
    fn agent_part(&self, ix: &Index, b: &mut Built, agent_nodes: &BTreeSet<&str>) {
        let usage = self.agent_usage(ix, agent_nodes);
        b.agent_nodes.clear();
        for n in &b.snapshot.nodes {
            if agent_nodes.contains(n.name.as_str()) {
                let mut free = n.allocatable.clone();
                if let Some(u) = usage.get(&n.name) {
                    free.sub_assign_saturating(u);
                }
                b.agent_nodes.push((n.name.clone(), free));
            }
        }
    }

    /// Nodes: DRA GPUs, synthetic affinity labels, agent shard cordoned for
    /// the batch scheduler.
    fn nodes_part(&self, ix: &Index, b: &mut Built, agent_nodes: &BTreeSet<&str>) {
        let mut slices_by_node: BTreeMap<&str, Vec<&SliceInfo>> = BTreeMap::new();
        for s in self.slices.values() {
            slices_by_node.entry(s.node.as_str()).or_default().push(s);
        }
        b.snapshot.nodes.clear();
        b.snapshot.nodes.reserve(self.nodes.len());
        for (name, n) in &self.nodes {
            let mut n = n.clone();
            if let Some(s) = slices_by_node.get(name.as_str()) {
                dra::apply_to_node(&mut n, s);
            }
            for (k, (_, sel)) in &ix.affinities {
                if translate::node_selector_matches(sel, name, &n.labels) {
                    n.labels.insert(k.clone(), "true".into());
                }
            }
            if ix.pins.contains_key(name) {
                n.labels.insert(
                    format!("{}claim", translate::keys::AFFINITY_PREFIX),
                    name.clone(),
                );
            }
            if agent_nodes.contains(name.as_str()) {
                n.unschedulable = true;
            }
            b.snapshot.nodes.push(n);
        }
        self.agent_part(ix, b, agent_nodes);
    }
}

/// Counts one more (`add`) or one less user of `k` in `m`; whether the set of
/// keys changed.
fn count<V>(
    m: &mut BTreeMap<String, V>,
    k: &str,
    add: bool,
    new: impl FnOnce() -> V,
    n: impl Fn(&mut V) -> &mut usize,
) -> bool {
    if add {
        let fresh = !m.contains_key(k);
        *n(m.entry(k.to_string()).or_insert_with(new)) += 1;
        fresh
    } else {
        let Some(v) = m.get_mut(k) else {
            return false;
        };
        let c = n(v);
        *c = c.saturating_sub(1);
        if *c == 0 {
            m.remove(k);
            return true;
        }
        false
    }
}
