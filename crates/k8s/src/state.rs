//! The cache stage: what the watchers saw, already translated, kept up to date
//! object by object (an event costs the translation of one object, never a
//! rebuild), and the snapshot the schedulers read, assembled from it.
//!
//! Pure: no I/O, no clock. The controller feeds it watch events and reads
//! snapshots; tests feed it objects directly.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tessera_model::{Queue, Resources, Snapshot};

use crate::crd;
use crate::dra::{self, ClaimInfo, SliceInfo};
use crate::gang::{Flavour, GangSource, QueueSource};
use crate::network::{self, Topology};
use crate::translate::{self, GroupSpec, PodInfo};

mod assemble;

/// A pod's key: namespace and name.
pub type PodKey = (String, String);

/// The group name of all pods Tessera does not schedule but that run on nodes
/// (their requests use capacity).
pub const OTHERS: &str = "~others";

/// `p` without Tessera's annotations and labels (and Volcano's preemptable
/// annotation): what is left of a pod whose scheduling keys cannot be read.
fn without_scheduling_keys(p: &core::Pod) -> core::Pod {
    let mut p = p.clone();
    let drop =
        |k: &String| k.starts_with("scheduling.tessera.dev/") || k == translate::keys::PREEMPTABLE;
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.retain(|k, _| !drop(k));
    }
    if let Some(l) = p.metadata.labels.as_mut() {
        l.retain(|k, _| !drop(k));
    }
    p
}

/// A PodDisruptionBudget, as far as eviction needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pdb {
    pub namespace: String,
    pub name: String,
    pub selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    pub min_available: Option<IntOrString>,
    pub max_unavailable: Option<IntOrString>,
}

fn scaled(v: &IntOrString, n: usize, round_up: bool) -> usize {
    match v {
        IntOrString::Int(i) => (*i).max(0) as usize,
        IntOrString::String(s) => {
            let p: usize = s.trim_end_matches('%').parse().unwrap_or(100);
            if round_up {
                (n * p).div_ceil(100)
            } else {
                n * p / 100
            }
        }
    }
}

impl Pdb {
    /// Disruptions allowed with `healthy` matching pods running (the disruption
    /// controller's rule, with every bound pod counted as healthy and expected).
    pub fn allowed(&self, healthy: usize) -> usize {
        if let Some(m) = &self.min_available {
            healthy.saturating_sub(scaled(m, healthy, true))
        } else if let Some(u) = &self.max_unavailable {
            scaled(u, healthy, true)
        } else {
            // Neither set: Kubernetes defaults to minAvailable 1.
            healthy.saturating_sub(1)
        }
    }
}

/// A node shard, as far as the schedulers need it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    pub agent: bool,
    pub nodes: BTreeSet<String>,
    pub status_in_use: Vec<String>,
}

/// A binding the controller made and the watch has not shown yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assumed {
    pub node: String,
    pub gpus: Vec<u32>,
    /// For a MIG pod: the first memory slice of its instance on `gpus[0]`.
    pub mig_start: Option<u8>,
}

/// Every translated object, by key.
#[derive(Debug, Default)]
pub struct State {
    pub scheduler_name: String,
    nodes: BTreeMap<String, tessera_model::Node>,
    pods: BTreeMap<PodKey, PodInfo>,
    /// Pods of ours that could not be translated, and why.
    bad_pods: BTreeMap<PodKey, String>,
    /// PodGroups by namespace and name, then by API (in order of precedence).
    groups: BTreeMap<(String, String), BTreeMap<Flavour, GroupSpec>>,
    queues: BTreeMap<String, BTreeMap<Flavour, Queue>>,
    priority_classes: BTreeMap<String, i32>,
    pdbs: BTreeMap<(String, String), Pdb>,
    shards: BTreeMap<String, Shard>,
    slices: BTreeMap<String, SliceInfo>,
    claims: BTreeMap<(String, String), ClaimInfo>,
    assumed: BTreeMap<PodKey, Assumed>,
    /// Groups whose placement waits for preempted pods to go: group -> victims.
    awaiting: BTreeMap<String, BTreeSet<PodKey>>,
    /// The network tiers above nodes (HyperNodes, else node labels); each
    /// node's domains are kept in its translated `network`.
    topology: Topology,
    /// Nodes whose device plugin time-slices MIG profiles: node -> profiles.
    time_sliced_mig: BTreeMap<String, BTreeSet<String>>,
    /// Objects that could not be translated (logged once by the controller).
    pub errors: Vec<String>,
    /// Bumped on every change; the controller schedules when it moved.
    pub generation: u64,
    /// Bumped on every change that is not only to pods (or their assumed
    /// bindings): a snapshot can then not be patched.
    global: u64,
    /// Pods changed since the last assembly.
    dirty: BTreeSet<PodKey>,
    /// What the last assembly was made of, and the snapshot handed back.
    index: Option<assemble::Index>,
    parked: Option<Built>,
    assembled_in_part: u64,
}

/// Where a model group came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMeta {
    pub namespace: String,
    /// `(api, name)` of the PodGroup object, when the group is one.
    pub podgroup: Option<(Flavour, String)>,
}

/// An agent pod waiting for the agent scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentPod {
    pub key: PodKey,
    pub request: Resources,
    pub priority: i32,
    pub tenant: String,
}

/// What a cycle works on.
#[derive(Debug, Default)]
pub struct Built {
    pub snapshot: Snapshot,
    pub meta: BTreeMap<String, GroupMeta>,
    /// Pending pods of each model group.
    pub pending: BTreeMap<String, Vec<PodKey>>,
    /// Agent pods for the agent scheduler, and the agent shard's nodes with
    /// their free capacity.
    pub agent_pods: Vec<AgentPod>,
    pub agent_nodes: Vec<(String, Resources)>,
    /// Pods of ours left out of the snapshot, with the reason.
    pub waiting: Vec<(PodKey, String)>,
    /// Disruptions each PDB still allows, and the pods each covers.
    pub pdb_allowed: BTreeMap<(String, String), usize>,
    pub pdb_of_pod: BTreeMap<PodKey, Vec<(String, String)>>,
}

impl Built {
    /// The pod behind a model task.
    pub fn pod_of(&self, group: &str, task: &str) -> Option<PodKey> {
        if group == OTHERS {
            return task
                .split_once('/')
                .map(|(a, b)| (a.to_string(), b.to_string()));
        }
        let m = self.meta.get(group)?;
        Some((m.namespace.clone(), task.to_string()))
    }
}

impl State {
    pub fn new(scheduler_name: impl Into<String>) -> Self {
        State {
            scheduler_name: scheduler_name.into(),
            topology: Topology::new(network::default_label_keys()),
            ..State::default()
        }
    }

    fn touch(&mut self) {
        self.generation += 1;
        self.global += 1;
    }

    /// A change to one pod only (or to the binding assumed for it).
    fn touch_pod(&mut self, key: &PodKey) {
        self.generation += 1;
        self.dirty.insert(key.clone());
    }

    fn note(&mut self, e: impl ToString) {
        if self.errors.len() < 10_000 {
            self.errors.push(e.to_string());
        }
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn pod(&self, k: &PodKey) -> Option<&PodInfo> {
        self.pods.get(k)
    }

    pub fn pods(&self) -> impl Iterator<Item = &PodInfo> {
        self.pods.values()
    }

    pub fn claim(&self, ns: &str, name: &str) -> Option<&ClaimInfo> {
        self.claims.get(&(ns.to_string(), name.to_string()))
    }

    pub fn slices_of(&self, node: &str) -> Vec<&SliceInfo> {
        self.slices.values().filter(|s| s.node == node).collect()
    }

    pub fn shards(&self) -> &BTreeMap<String, Shard> {
        &self.shards
    }

    pub fn groups(&self) -> impl Iterator<Item = &GroupSpec> {
        self.groups.values().flat_map(|m| m.values())
    }

    pub fn apply_node(&mut self, n: &core::Node) {
        let name = n.metadata.name.clone().unwrap_or_default();
        match translate::node_noting(n) {
            Ok((mut m, mig_problem)) => {
                let (net, problem) = self.topology.network_of(&name, &m.labels);
                // Reported when it changes, not on every status update.
                if let Some(p) = problem
                    && self.nodes.get(&name).is_none_or(|old| old.network != net)
                {
                    self.note(p);
                }
                m.network = net;
                // A status update that changes nothing the schedulers read
                // (most node updates) does not start a cycle.
                if self.nodes.get(&name) == Some(&m) {
                    return;
                }
                // Reported when the node changes, not on every status update.
                if let Some(p) = mig_problem {
                    self.note(p);
                }
                let sliced = crate::translate::mig::time_sliced_profiles(&m.labels);
                if sliced.is_empty() {
                    self.time_sliced_mig.remove(&name);
                } else {
                    self.time_sliced_mig.insert(name.clone(), sliced);
                }
                self.nodes.insert(name, m);
            }
            Err(e) => {
                self.nodes.remove(&name);
                self.time_sliced_mig.remove(&name);
                self.note(e);
            }
        }
        self.touch();
    }

    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
        self.time_sliced_mig.remove(name);
        self.touch();
    }

    pub fn apply_pod(&mut self, p: &core::Pod) {
        let key = (
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default(),
        );
        if translate::pod_finished(p) {
            self.delete_pod(&key);
            return;
        }
        match translate::pod(p) {
            Ok(info) => {
                // Reported when they change, not on every update of the pod.
                if self
                    .pods
                    .get(&key)
                    .is_none_or(|old| old.notes != info.notes)
                {
                    for n in &info.notes {
                        self.note(n);
                    }
                }
                let unchanged = self.reads_the_same(&key, &info);
                if info.task.node.is_some() {
                    self.assumed.remove(&key);
                }
                self.bad_pods.remove(&key);
                self.pods.insert(key.clone(), info);
                // The watch confirming a binding this controller made, or an
                // update of a field the schedulers do not read (our own
                // `PodScheduled` condition, say): the snapshot would come out
                // the same, so no cycle is started for it.
                if unchanged {
                    return;
                }
            }
            Err(e) => {
                // A bound pod holds its node whatever Tessera can read of it:
                // when only Tessera's own keys are bad, count it without them
                // rather than drop it (its node would look emptier than it is).
                if p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                    && let Ok(info) = translate::pod(&without_scheduling_keys(p))
                {
                    self.note(format!(
                        "{e} (the pod is bound: counted without those keys)"
                    ));
                    self.bad_pods.remove(&key);
                    self.pods.insert(key.clone(), info);
                    self.assumed.remove(&key);
                    self.touch_pod(&key);
                    return;
                }
                let ours = p.spec.as_ref().and_then(|s| s.scheduler_name.as_deref())
                    == Some(self.scheduler_name.as_str());
                self.pods.remove(&key);
                if ours {
                    self.bad_pods.insert(key.clone(), e.to_string());
                }
                self.note(e);
            }
        }
        self.touch_pod(&key);
    }

    /// Whether `build` would read `new` exactly as it reads the pod at `key`
    /// now: the stored pod, with the binding this controller assumed for it
    /// (if any) in place, equals `new` in every field but the condition
    /// message (which only the controller's writes read).
    fn reads_the_same(&self, key: &PodKey, new: &PodInfo) -> bool {
        let Some(old) = self.pods.get(key) else {
            return false;
        };
        if self.bad_pods.contains_key(key) {
            return false;
        }
        let assumed = self.assumed.get(key).filter(|_| old.task.node.is_none());
        let task_same = match assumed {
            Some(a) => {
                new.task.node.as_deref() == Some(a.node.as_str())
                    && new.task.gpu_indices == a.gpus
                    && new.task.mig_start == a.mig_start
                    && {
                        let mut t = old.task.clone();
                        t.node = new.task.node.clone();
                        t.gpu_indices = new.task.gpu_indices.clone();
                        t.mig_start = new.task.mig_start;
                        t == new.task
                    }
            }
            None => old.task == new.task,
        };
        task_same && {
            let PodInfo {
                namespace,
                name,
                uid,
                scheduler,
                group,
                queue,
                kind,
                priority_class,
                priority,
                task: _,
                affinity,
                claims,
                claims_missing,
                labels,
                terminating,
                created_ms,
                preemptable,
                scheduled_message: _,
                notes: _,
            } = old;
            *namespace == new.namespace
                && *name == new.name
                && *uid == new.uid
                && *scheduler == new.scheduler
                && *group == new.group
                && *queue == new.queue
                && *kind == new.kind
                && *priority_class == new.priority_class
                && *priority == new.priority
                && *affinity == new.affinity
                && *claims == new.claims
                && *claims_missing == new.claims_missing
                && *labels == new.labels
                && *terminating == new.terminating
                && *created_ms == new.created_ms
                && *preemptable == new.preemptable
        }
    }

    pub fn delete_pod(&mut self, key: &PodKey) {
        self.pods.remove(key);
        self.bad_pods.remove(key);
        self.assumed.remove(key);
        let mut awaited = false;
        self.awaiting.retain(|_, victims| {
            awaited |= victims.remove(key);
            !victims.is_empty()
        });
        if awaited {
            // A group's wait for its victims changed: not a change to this
            // pod alone.
            self.touch();
        } else {
            self.touch_pod(key);
        }
    }

    /// Replaces every node with a fresh list (after a watch re-list).
    pub fn reset_nodes(&mut self, all: &[core::Node]) {
        let keep: BTreeSet<&str> = all
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        self.nodes.retain(|k, _| keep.contains(k.as_str()));
        for n in all {
            self.apply_node(n);
        }
        self.touch();
    }

    /// Replaces every pod with a fresh list (after a watch re-list).
    pub fn reset_pods(&mut self, all: &[core::Pod]) {
        let keep: BTreeSet<(String, String)> = all
            .iter()
            .map(|p| {
                (
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect();
        let gone: Vec<PodKey> = self
            .pods
            .keys()
            .chain(self.bad_pods.keys())
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            self.delete_pod(&k);
        }
        for p in all {
            self.apply_pod(p);
        }
        self.touch();
    }

    /// The node label keys of the network tiers, bottom up, read when the
    /// cluster has no HyperNodes (default [`network::DEFAULT_LABEL_KEYS`]).
    pub fn set_network_label_keys(&mut self, keys: Vec<String>) {
        if self.topology.set_label_keys(keys) {
            self.renetwork(Vec::new());
        }
    }

    /// A HyperNode added or changed. One whose spec is what it was (Volcano's
    /// controller writing `status.nodeCount`, auto-discovery rewriting every
    /// HyperNode each interval) changes nothing and starts no cycle.
    pub fn apply_hypernode(&mut self, h: &crd::topology::HyperNode) {
        let name = h.metadata.name.clone().unwrap_or_default();
        let x = network::hypernode(h).map_err(|e| e.to_string());
        if self.topology.unchanged(&name, &x) {
            return;
        }
        let mut problems = Vec::new();
        match x {
            Ok(x) => self.topology.insert(x),
            Err(e) => {
                self.topology.reject(&name, e.clone());
                problems.push(e);
            }
        }
        self.renetwork(problems);
    }

    pub fn delete_hypernode(&mut self, name: &str) {
        if self.topology.remove(name) {
            self.renetwork(Vec::new());
        }
    }

    /// Replaces every HyperNode with a fresh list (after a watch re-list); the
    /// same list as before changes nothing.
    pub fn reset_hypernodes(&mut self, all: &[crd::topology::HyperNode]) {
        let all: BTreeMap<String, Result<network::HyperNode, String>> = all
            .iter()
            .map(|h| {
                (
                    h.metadata.name.clone().unwrap_or_default(),
                    network::hypernode(h).map_err(|e| e.to_string()),
                )
            })
            .collect();
        if all.len() == self.topology.known_count()
            && all.iter().all(|(n, x)| self.topology.unchanged(n, x))
        {
            return;
        }
        self.topology.clear();
        let mut problems = Vec::new();
        for (name, x) in all {
            match x {
                Ok(x) => self.topology.insert(x),
                Err(e) => {
                    self.topology.reject(&name, e.clone());
                    problems.push(e);
                }
            }
        }
        self.renetwork(problems);
    }

    /// Resolves every node's network tiers again (the HyperNodes or the label
    /// keys changed) and reports what is wrong with them, briefly.
    fn renetwork(&mut self, mut problems: Vec<String>) {
        problems.extend(self.topology.rebuild());
        let mut ambiguous = Vec::new();
        for (name, n) in self.nodes.iter_mut() {
            let (net, problem) = self.topology.network_of(name, &n.labels);
            n.network = net;
            ambiguous.extend(problem);
        }
        let more = ambiguous.len().saturating_sub(5);
        problems.extend(ambiguous.into_iter().take(5));
        if more > 0 {
            problems.push(format!(
                "{more} more node(s) held by more than one HyperNode of one tier"
            ));
        }
        for p in problems {
            self.note(p);
        }
        self.touch();
    }

    pub fn has_node(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    /// Records a binding made by this controller until the watch shows it.
    pub fn assume(&mut self, key: PodKey, node: String, gpus: Vec<u32>, mig_start: Option<u8>) {
        if let Some(p) = self.pods.get(&key)
            && p.task.node.is_none()
        {
            self.assumed.insert(
                key.clone(),
                Assumed {
                    node,
                    gpus,
                    mig_start,
                },
            );
            self.touch_pod(&key);
        }
    }

    /// Forgets an assumed binding (the write failed).
    pub fn forget(&mut self, key: &PodKey) {
        if self.assumed.remove(key).is_some() {
            self.touch_pod(key);
        }
    }

    /// Holds `group` until every pod in `victims` is gone.
    pub fn await_victims(&mut self, group: String, victims: BTreeSet<PodKey>) {
        let alive: BTreeSet<PodKey> = victims
            .into_iter()
            .filter(|v| self.pods.contains_key(v))
            .collect();
        if !alive.is_empty() {
            self.awaiting.entry(group).or_default().extend(alive);
            self.touch();
        }
    }

    pub fn apply_group(&mut self, g: GroupSpec) {
        self.groups
            .entry((g.namespace.clone(), g.name.clone()))
            .or_default()
            .insert(g.api, g);
        self.touch();
    }

    pub fn delete_group(&mut self, api: Flavour, ns: &str, name: &str) {
        let k = (ns.to_string(), name.to_string());
        if let Some(m) = self.groups.get_mut(&k) {
            m.remove(&api);
            if m.is_empty() {
                self.groups.remove(&k);
            }
        }
        self.touch();
    }

    /// A PodGroup of any flavour added or changed.
    pub fn apply_gang<G: GangSource>(&mut self, g: &G) {
        match translate::group(g) {
            Ok(g) => self.apply_group(g),
            Err(e) => self.note(e),
        }
    }

    /// A Queue of either flavour added or changed.
    pub fn apply_queue<Q: QueueSource>(&mut self, q: &Q) {
        match translate::queue(q) {
            Ok(q) => {
                self.queues
                    .entry(q.name.clone())
                    .or_default()
                    .insert(Q::FLAVOUR, q);
                self.touch();
            }
            Err(e) => self.note(e),
        }
    }

    pub fn delete_queue(&mut self, api: Flavour, name: &str) {
        if let Some(m) = self.queues.get_mut(name) {
            m.remove(&api);
            if m.is_empty() {
                self.queues.remove(name);
            }
        }
        self.touch();
    }

    pub fn apply_priority_class(&mut self, name: &str, value: i32) {
        self.priority_classes.insert(name.to_string(), value);
        self.touch();
    }

    pub fn delete_priority_class(&mut self, name: &str) {
        self.priority_classes.remove(name);
        self.touch();
    }

    pub fn apply_pdb(&mut self, p: &PodDisruptionBudget) {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let name = p.metadata.name.clone().unwrap_or_default();
        let spec = p.spec.clone().unwrap_or_default();
        self.pdbs.insert(
            (ns.clone(), name.clone()),
            Pdb {
                namespace: ns,
                name,
                selector: spec.selector.unwrap_or_default(),
                min_available: spec.min_available,
                max_unavailable: spec.max_unavailable,
            },
        );
        self.touch();
    }

    pub fn delete_pdb(&mut self, ns: &str, name: &str) {
        self.pdbs.remove(&(ns.to_string(), name.to_string()));
        self.touch();
    }

    pub fn apply_shard(&mut self, s: &crd::NodeShard) {
        let name = s.metadata.name.clone().unwrap_or_default();
        let agent = match s.spec.owner.as_deref() {
            Some(o) => o == "agent",
            None => name == "agent",
        };
        self.shards.insert(
            name,
            Shard {
                agent,
                nodes: s.spec.nodes_desired.iter().cloned().collect(),
                status_in_use: s
                    .status
                    .as_ref()
                    .map(|s| s.nodes_in_use.clone())
                    .unwrap_or_default(),
            },
        );
        self.touch();
    }

    pub fn delete_shard(&mut self, name: &str) {
        self.shards.remove(name);
        self.touch();
    }

    pub fn apply_slice(&mut self, s: &res::ResourceSlice) {
        let name = s.metadata.name.clone().unwrap_or_default();
        match dra::slice(s) {
            Ok(Some(info)) => {
                self.slices.insert(name, info);
            }
            Ok(None) => {
                self.slices.remove(&name);
            }
            Err(e) => {
                self.slices.remove(&name);
                self.note(e);
            }
        }
        self.touch();
    }

    pub fn delete_slice(&mut self, name: &str) {
        self.slices.remove(name);
        self.touch();
    }

    pub fn apply_claim(&mut self, c: &res::ResourceClaim) {
        let k = (
            c.metadata.namespace.clone().unwrap_or_default(),
            c.metadata.name.clone().unwrap_or_default(),
        );
        match dra::claim(c) {
            Ok(info) => {
                self.claims.insert(k, info);
            }
            Err(e) => {
                self.claims.remove(&k);
                self.note(e);
            }
        }
        self.touch();
    }

    pub fn delete_claim(&mut self, ns: &str, name: &str) {
        self.claims.remove(&(ns.to_string(), name.to_string()));
        self.touch();
    }

    /// The nodes of agent shards.
    pub fn agent_nodes(&self) -> BTreeSet<&str> {
        self.shards
            .values()
            .filter(|s| s.agent)
            .flat_map(|s| s.nodes.iter().map(String::as_str))
            .filter(|n| self.nodes.contains_key(*n))
            .collect()
    }

    /// The PodGroup `ns/name`: Tessera's, else Volcano's, else scheduler-plugins'.
    fn group_spec(&self, ns: &str, name: &str) -> Option<&GroupSpec> {
        let m = self.groups.get(&(ns.to_string(), name.to_string()))?;
        m.values().next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cpu: &str) -> core::Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"zone": if name.ends_with('1') {"a"} else {"b"}}},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "10"}}
        }))
        .unwrap()
    }

    fn pod(
        ns: &str,
        name: &str,
        sched: &str,
        node: Option<&str>,
        group: Option<&str>,
    ) -> core::Pod {
        let mut ann = serde_json::Map::new();
        if let Some(g) = group {
            ann.insert("scheduling.k8s.io/group-name".into(), g.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "annotations": ann},
            "spec": {"schedulerName": sched, "nodeName": node,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
        }))
        .unwrap()
    }

    /// A pod of ours with a label, an optional node and an optional
    /// `PodScheduled=False` message.
    fn pod_with(name: &str, node: Option<&str>, label: &str, message: Option<&str>) -> core::Pod {
        let mut p = pod("ns", name, "tessera", node, None);
        p.metadata.labels = Some([("l".to_string(), label.to_string())].into());
        if let Some(m) = message {
            p.status = Some(core::PodStatus {
                conditions: Some(vec![core::PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    message: Some(m.into()),
                    ..core::PodCondition::default()
                }]),
                ..core::PodStatus::default()
            });
        }
        p
    }

    #[test]
    fn a_confirmed_binding_or_an_unread_field_starts_no_cycle() {
        let mut st = State::new("tessera");
        st.apply_node(&node("n1", "8"));
        st.apply_node(&node("n2", "8"));
        st.apply_pod(&pod_with("a", None, "x", None));
        let g = st.generation;
        // The same object again, and a new condition message: nothing to do.
        st.apply_pod(&pod_with("a", None, "x", None));
        st.apply_pod(&pod_with("a", None, "x", Some("waiting")));
        assert_eq!(st.generation, g);
        // The same node status again: nothing to do.
        st.apply_node(&node("n1", "8"));
        assert_eq!(st.generation, g);
        st.assume(("ns".into(), "a".into()), "n1".into(), vec![], None);
        let assumed = format!("{:?}", st.build());
        let g = st.generation;
        // The watch shows the binding this controller made.
        st.apply_pod(&pod_with("a", Some("n1"), "x", None));
        assert_eq!(st.generation, g);
        assert_eq!(format!("{:?}", st.build()), assumed);
        assert!(st.assumed.is_empty());
        // A change the schedulers read does start one.
        st.apply_pod(&pod_with("a", Some("n1"), "y", None));
        assert_ne!(st.generation, g);
        let g = st.generation;
        st.apply_node(&node("n1", "16"));
        assert_ne!(st.generation, g);
    }

    #[test]
    fn a_binding_on_another_node_than_assumed_starts_a_cycle() {
        let mut st = State::new("tessera");
        st.apply_node(&node("n1", "8"));
        st.apply_node(&node("n2", "8"));
        st.apply_pod(&pod_with("a", None, "x", None));
        st.assume(("ns".into(), "a".into()), "n1".into(), vec![], None);
        let g = st.generation;
        st.apply_pod(&pod_with("a", Some("n2"), "x", None));
        assert_ne!(st.generation, g);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        /// The generation is what tells the controller to run a cycle: an
        /// operation that leaves it unchanged must leave the snapshot (and
        /// everything else a cycle reads) unchanged too.
        #[test]
        fn an_unchanged_generation_means_an_unchanged_build(
            ops in proptest::collection::vec((0u8..6, 0u8..3, 0u8..3, 0u8..2, 0u8..2), 1..40)
        ) {
            let mut st = State::new("tessera");
            st.apply_node(&node("n1", "8"));
            st.apply_node(&node("n2", "8"));
            let nodes = [None, Some("n1"), Some("n2")];
            for (op, p, n, l, m) in ops {
                let name = ["a", "b", "c"][p as usize];
                let key: PodKey = ("ns".into(), name.into());
                let before = (st.generation, format!("{:?}", st.build()));
                let node_name = nodes[n as usize];
                let label = ["x", "y"][l as usize];
                let message = [None, Some("waiting")][m as usize];
                match op {
                    0 | 1 => st.apply_pod(&pod_with(name, node_name, label, message)),
                    2 => st.assume(key, node_name.unwrap_or("n1").into(), vec![], None),
                    3 => st.forget(&key),
                    4 => st.delete_pod(&key),
                    _ => st.apply_node(&node(node_name.unwrap_or("n2"), ["8", "16"][l as usize])),
                }
                if st.generation == before.0 {
                    proptest::prop_assert_eq!(format!("{:?}", st.build()), before.1);
                }
            }
        }
    }

    /// A pod for the equivalence test: ours or another scheduler's, maybe
    /// bound, in a PodGroup or not, maybe an agent, maybe with a required node
    /// affinity, with a priority and a label.
    fn any_pod(name: &str, v: [u8; 6]) -> core::Pod {
        let mut ann = serde_json::Map::new();
        if v[2] == 1 {
            ann.insert("scheduling.k8s.io/group-name".into(), "g".into());
        }
        if v[3] == 1 {
            ann.insert("scheduling.tessera.dev/kind".into(), "agent".into());
        }
        let node = [None, Some("n1"), Some("n2"), Some("n3")][v[1] as usize % 4];
        let mut spec = serde_json::json!({
            "schedulerName": (["tessera", "other"][v[0] as usize % 2]),
            "nodeName": node,
            "priority": v[5] as i32 % 3,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]
        });
        if v[4] == 1 {
            spec["affinity"] = serde_json::json!({"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}});
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": ann,
                         "labels": {"l": (["x", "y"][v[5] as usize % 2])}},
            "spec": spec
        }))
        .unwrap()
    }

    fn group_g(min: u32) -> GroupSpec {
        GroupSpec {
            api: Flavour::Volcano,
            namespace: "ns".into(),
            name: "g".into(),
            min_member: min,
            min_resources: None,
            queue: None,
            priority_class: None,
            kind: None,
            network_topology: None,
            created_ms: 7,
            status_phase: None,
            status_running: None,
        }
    }

    #[test]
    fn a_patched_snapshot_equals_a_fresh_one_and_is_used() {
        let mut st = State::new("tessera");
        st.apply_node(&node("n1", "8"));
        st.apply_node(&node("n2", "8"));
        st.apply_group(group_g(2));
        for (i, n) in ["a", "b", "c", "d"].iter().enumerate() {
            st.apply_pod(&any_pod(n, [0, i as u8 % 3, (i % 2) as u8, 0, 0, i as u8]));
        }
        let b = st.build_incremental();
        assert_eq!(format!("{b:?}"), format!("{:?}", st.build()));
        st.recycle(b);
        assert_eq!(st.assembled_in_part(), 0);
        // Only pods change: the next assembly patches.
        st.apply_pod(&any_pod("e", [0, 0, 1, 0, 1, 1]));
        st.assume(("ns".into(), "a".into()), "n2".into(), vec![], None);
        st.delete_pod(&("ns".into(), "b".into()));
        let b = st.build_incremental();
        assert_eq!(st.assembled_in_part(), 1);
        assert_eq!(format!("{b:?}"), format!("{:?}", st.build()));
        st.recycle(b);
        // Anything else: afresh.
        st.apply_node(&node("n2", "16"));
        let b = st.build_incremental();
        assert_eq!(st.assembled_in_part(), 1);
        assert_eq!(format!("{b:?}"), format!("{:?}", st.build()));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..Default::default() })]

        /// Whatever happens between cycles, the snapshot a cycle reads
        /// (patched when only pods changed) equals one assembled afresh.
        #[test]
        fn a_patched_snapshot_always_equals_a_fresh_one(
            ops in proptest::collection::vec(
                (0u8..13, 0u8..5, proptest::array::uniform6(0u8..4)), 1..60)
        ) {
            let mut st = State::new("tessera");
            st.apply_node(&node("n1", "8"));
            st.apply_node(&node("n2", "8"));
            for (op, p, v) in ops {
                let name = ["a", "b", "c", "d", "e"][p as usize];
                let key: PodKey = ("ns".into(), name.into());
                let on = ["n1", "n2", "n3"][v[1] as usize % 3];
                match op {
                    0..=4 => st.apply_pod(&any_pod(name, v)),
                    5 => st.assume(key, on.into(), vec![], None),
                    6 => st.forget(&key),
                    7 => st.delete_pod(&key),
                    8 => {
                        if v[0] % 2 == 0 {
                            st.apply_group(group_g(v[2] as u32));
                        } else {
                            st.delete_group(Flavour::Volcano, "ns", "g");
                        }
                    }
                    9 => st.apply_node(&node(on, ["8", "16"][v[2] as usize % 2])),
                    10 => {
                        let shard: crd::NodeShard = serde_json::from_value(serde_json::json!({
                            "apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "NodeShard",
                            "metadata": {"name": "agents"},
                            "spec": {"owner": "agent", "nodesDesired": [on]}
                        })).unwrap();
                        if v[0] % 2 == 0 { st.apply_shard(&shard) } else { st.delete_shard("agents") }
                    }
                    11 => {
                        // A victim awaited, then gone.
                        st.await_victims("ns/g".into(), [key.clone()].into());
                    }
                    _ => {
                        // A PDB over label l=x: allowing none, one, or gone.
                        if v[0] == 3 {
                            st.delete_pdb("ns", "pdb");
                        } else {
                            // maxUnavailable 0 allows none; minAvailable 1 or 2
                            // allows none until enough matching pods are bound.
                            let spec = if v[0] == 0 {
                                serde_json::json!({"selector": {"matchLabels": {"l": "x"}},
                                                   "maxUnavailable": 0})
                            } else {
                                serde_json::json!({"selector": {"matchLabels": {"l": "x"}},
                                                   "minAvailable": v[0] as i32})
                            };
                            let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
                                "metadata": {"name": "pdb", "namespace": "ns"}, "spec": spec
                            })).unwrap();
                            st.apply_pdb(&pdb);
                        }
                    }
                }
                let b = st.build_incremental();
                proptest::prop_assert_eq!(format!("{b:?}"), format!("{:?}", st.build()));
                proptest::prop_assert_eq!(st.index.as_ref().map(|ix| ix.recomputed()), Some(0));
                st.recycle(b);
            }
        }
    }

    #[test]
    fn a_bound_pod_with_bad_scheduling_keys_still_counts() {
        let mut st = State::new("tessera");
        st.apply_node(&node("n1", "2"));
        let mut p = pod("ns", "a", "tessera", Some("n1"), None);
        p.metadata.annotations =
            Some([(translate::keys::GPU_MILLI.to_string(), "lots".to_string())].into());
        st.apply_pod(&p);
        assert!(
            st.errors
                .iter()
                .any(|e| e.contains("lots") && e.contains("counted")),
            "{:?}",
            st.errors
        );
        let b = st.build();
        let tasks: Vec<_> = b.snapshot.groups.iter().flat_map(|g| &g.tasks).collect();
        assert_eq!(tasks.len(), 1, "the bound pod still holds its CPU");
        assert_eq!(tasks[0].node.as_deref(), Some("n1"));
        // The same keys on a pod still to place: it waits with the reason.
        let mut q = pod("ns", "b", "tessera", None, None);
        q.metadata.annotations = p.metadata.annotations.clone();
        st.apply_pod(&q);
        let b = st.build();
        assert!(
            b.waiting
                .iter()
                .any(|(k, r)| k.1 == "b" && r.contains("lots")),
            "{:?}",
            b.waiting
        );
    }

    #[test]
    fn foreign_pods_use_capacity_and_ours_are_planned() {
        let mut s = State::new("tessera");
        s.apply_node(&node("n1", "2"));
        s.apply_pod(&pod("ns", "other", "default-scheduler", Some("n1"), None));
        s.apply_pod(&pod("ns", "mine", "tessera", None, None));
        s.apply_pod(&pod(
            "ns",
            "theirs-pending",
            "default-scheduler",
            None,
            None,
        ));
        let b = s.build();
        assert_eq!(b.snapshot.groups.len(), 2);
        let plan = tessera_sched::schedule(&b.snapshot, &tessera_sched::Config::default());
        assert_eq!(plan.bindings.len(), 1);
        let bd = &plan.bindings[0];
        assert_eq!(
            b.pod_of(&bd.task.group, &bd.task.task),
            Some(("ns".into(), "mine".into()))
        );
        // A second pod of ours does not fit beside the two.
        s.assume(("ns".into(), "mine".into()), "n1".into(), vec![], None);
        s.apply_pod(&pod("ns", "mine2", "tessera", None, None));
        let b = s.build();
        let plan = tessera_sched::schedule(&b.snapshot, &tessera_sched::Config::default());
        assert!(plan.bindings.is_empty(), "{plan}");
        assert_eq!(plan.pending.len(), 1);
    }

    #[test]
    fn missing_pod_group_waits() {
        let mut s = State::new("tessera");
        s.apply_node(&node("n1", "4"));
        s.apply_pod(&pod("ns", "a", "tessera", None, Some("job")));
        let b = s.build();
        assert!(b.snapshot.groups.is_empty());
        assert_eq!(b.waiting[0].1, "waiting for PodGroup ns/job");
    }

    /// A PodGroup of one name in two or three APIs: Tessera's wins, then
    /// Volcano's, then scheduler-plugins'; deleting one falls back to the next.
    #[test]
    fn pod_group_flavours_by_precedence() {
        let pg = |api: &str, min: u32| {
            serde_json::json!({"apiVersion": api, "kind": "PodGroup",
                "metadata": {"name": "job", "namespace": "ns"}, "spec": {"minMember": min}})
        };
        let x: crd::x_k8s::PodGroup =
            serde_json::from_value(pg("scheduling.x-k8s.io/v1alpha1", 3)).unwrap();
        let v: crd::volcano::PodGroup =
            serde_json::from_value(pg("scheduling.volcano.sh/v1beta1", 2)).unwrap();
        let t: crd::PodGroup =
            serde_json::from_value(pg("scheduling.tessera.dev/v1alpha1", 1)).unwrap();
        let mut s = State::new("tessera");
        let min = |s: &State| s.group_spec("ns", "job").map(|g| (g.api, g.min_member));
        s.apply_gang(&x);
        assert_eq!(min(&s), Some((Flavour::XK8s, 3)));
        s.apply_gang(&t);
        s.apply_gang(&v);
        assert_eq!(min(&s), Some((Flavour::Tessera, 1)));
        s.delete_group(Flavour::Tessera, "ns", "job");
        assert_eq!(min(&s), Some((Flavour::Volcano, 2)));
        s.delete_group(Flavour::Volcano, "ns", "job");
        s.delete_group(Flavour::XK8s, "ns", "job");
        assert_eq!(min(&s), None);
    }

    #[test]
    fn affinity_becomes_a_label() {
        let mut s = State::new("tessera");
        s.apply_node(&node("n1", "4"));
        s.apply_node(&node("n2", "4"));
        let p: core::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"schedulerName": "tessera", "containers": [{"name": "c"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["b"]}]}]}}}}
        }))
        .unwrap();
        s.apply_pod(&p);
        let b = s.build();
        let plan = tessera_sched::schedule(&b.snapshot, &tessera_sched::Config::default());
        assert_eq!(plan.bindings[0].node, "n2");
    }

    fn racked_node(name: &str, rack: &str) -> core::Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {crate::network::DEFAULT_LABEL_KEYS[0]: rack}},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"}}
        }))
        .unwrap()
    }

    fn gang(s: &mut State, name: &str, pods: usize, topology: serde_json::Value) {
        let g: crd::volcano::PodGroup = serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"minMember": pods, "networkTopology": topology}
        }))
        .unwrap();
        s.apply_gang(&g);
        for i in 0..pods {
            let mut p = pod("ns", &format!("{name}-{i}"), "tessera", None, Some(name));
            p.spec.as_mut().unwrap().containers[0].resources =
                serde_json::from_value(serde_json::json!({"requests": {"cpu": "3"}})).unwrap();
            s.apply_pod(&p);
        }
    }

    /// Rack `a` (a1, a2) is fuller, so binpack prefers it; rack `b` (b1..b3)
    /// is the only one with room for three 3-core pods.
    fn two_racks() -> State {
        let mut s = State::new("tessera");
        for (n, r) in [
            ("a1", "a"),
            ("a2", "a"),
            ("b1", "b"),
            ("b2", "b"),
            ("b3", "b"),
        ] {
            s.apply_node(&racked_node(n, r));
        }
        for n in ["a1", "a2"] {
            s.apply_pod(&pod(
                "other",
                &format!("on-{n}"),
                "default-scheduler",
                Some(n),
                None,
            ));
        }
        s
    }

    fn placed(s: &State) -> (Vec<String>, tessera_model::Plan) {
        let b = s.build();
        let plan = tessera_sched::schedule(&b.snapshot, &tessera_sched::Config::default());
        let mut nodes: Vec<String> = plan.bindings.iter().map(|b| b.node.clone()).collect();
        nodes.sort();
        (nodes, plan)
    }

    #[test]
    fn hard_tier_one_gang_stays_in_one_rack() {
        // Without a constraint the gang takes the fuller rack first and spans.
        let mut s = two_racks();
        gang(&mut s, "free", 3, serde_json::Value::Null);
        let (nodes, _) = placed(&s);
        assert_eq!(nodes.len(), 3);
        assert!(nodes.iter().any(|n| n.starts_with('a')), "{nodes:?}");
        // Hard tier 1: all in rack b.
        let mut s = two_racks();
        gang(
            &mut s,
            "job",
            3,
            serde_json::json!({"mode": "hard", "highestTierAllowed": 1}),
        );
        let b = s.build();
        assert_eq!(
            b.snapshot
                .groups
                .iter()
                .find(|g| g.name == "ns/job")
                .unwrap()
                .network_topology,
            Some(tessera_model::NetworkTier {
                tier: 1,
                strength: tessera_model::Strength::Hard
            })
        );
        let (nodes, _) = placed(&s);
        assert_eq!(nodes, ["b1", "b2", "b3"]);
    }

    #[test]
    fn soft_gang_spans_when_it_must_and_hard_waits() {
        let mut s = two_racks();
        gang(
            &mut s,
            "soft",
            4,
            serde_json::json!({"mode": "soft", "highestTierAllowed": 1}),
        );
        let (nodes, _) = placed(&s);
        assert_eq!(nodes.len(), 4, "{nodes:?}");
        let mut s = two_racks();
        gang(
            &mut s,
            "hard",
            4,
            serde_json::json!({"mode": "hard", "highestTierAllowed": 1}),
        );
        let (nodes, plan) = placed(&s);
        assert!(nodes.is_empty(), "{nodes:?}");
        assert!(
            plan.pending[0].reason.contains("tier-1"),
            "{}",
            plan.pending[0].reason
        );
    }

    #[test]
    fn hypernodes_replace_labels_and_follow_changes() {
        let mut s = two_racks();
        let net = |s: &State, n: &str| {
            s.build()
                .snapshot
                .nodes
                .iter()
                .find(|x| x.name == n)
                .map(|x| x.network.clone())
                .unwrap()
        };
        // Up to the top tier of the three default keys.
        assert_eq!(net(&s, "a1"), ["a", "~t1/a", "~t1/a"]);
        s.apply_hypernode(&hn(
            "rack-x",
            1,
            serde_json::json!([{"type": "Node", "selector": {"regexMatch": {"pattern": "^(a1|b1)$"}}}]),
        ));
        s.apply_hypernode(&hn(
            "spine",
            2,
            serde_json::json!([{"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-x"}}}]),
        ));
        assert_eq!(net(&s, "a1"), ["rack-x", "spine"]);
        assert!(net(&s, "a2").is_empty());
        // A node that arrives later is resolved on arrival.
        s.apply_node(&racked_node("c1", "c"));
        assert!(net(&s, "c1").is_empty());
        // A bad HyperNode is reported and holds nothing.
        s.errors.clear();
        s.apply_hypernode(&hn("rack-x", 0, serde_json::json!([])));
        assert!(s.errors[0].contains("spec.tier"), "{:?}", s.errors);
        assert!(net(&s, "a1").is_empty());
        // Without HyperNodes, the labels count again.
        s.reset_hypernodes(&[]);
        assert_eq!(net(&s, "b1"), ["b", "~t1/b", "~t1/b"]);
        s.set_network_label_keys(vec!["zone".into()]);
        assert!(net(&s, "b1").is_empty());
    }

    fn hn(name: &str, tier: i64, members: serde_json::Value) -> crd::topology::HyperNode {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": {"name": name}, "spec": {"tier": tier, "members": members}
        }))
        .unwrap()
    }

    fn exact(kind: &str, names: &[&str]) -> serde_json::Value {
        serde_json::Value::Array(
            names
                .iter()
                .map(|n| serde_json::json!({"type": kind, "selector": {"exactMatch": {"name": n}}}))
                .collect(),
        )
    }

    /// Nodes a1, a2 (4 cores each, in rack-a) and b1 (in rack-b); the gang
    /// needs two 3-core pods.
    fn hypernode_racks(spine_over: &[&str]) -> State {
        let mut s = State::new("tessera");
        for n in ["a1", "a2", "b1"] {
            s.apply_node(&node(n, "4"));
        }
        s.apply_hypernode(&hn("rack-a", 1, exact("Node", &["a1", "a2"])));
        s.apply_hypernode(&hn("rack-b", 1, exact("Node", &["b1"])));
        if !spine_over.is_empty() {
            s.apply_hypernode(&hn("spine", 2, exact("HyperNode", spine_over)));
        }
        s
    }

    #[test]
    fn hard_tier_2_gang_uses_a_rack_without_a_spine() {
        // Volcano tries tier-1 HyperNodes for highestTierAllowed 2 as well.
        let mut s = hypernode_racks(&["rack-b"]);
        gang(
            &mut s,
            "job",
            2,
            serde_json::json!({"mode": "hard", "highestTierAllowed": 2}),
        );
        let (nodes, plan) = placed(&s);
        assert_eq!(nodes, ["a1", "a2"], "{:?}", plan.pending);
    }

    #[test]
    fn a_tier_above_the_top_means_the_top_tier() {
        // Top tier 1: a tier-5 gang is a tier-1 gang (Volcano tries every
        // HyperNode, never the nodes outside them).
        let mut s = hypernode_racks(&[]);
        s.apply_node(&node("loose", "4"));
        gang(
            &mut s,
            "job",
            2,
            serde_json::json!({"mode": "hard", "highestTierAllowed": 5}),
        );
        let b = s.build();
        let g = b
            .snapshot
            .groups
            .iter()
            .find(|g| g.name == "ns/job")
            .unwrap();
        assert_eq!(g.network_topology.map(|n| n.tier), Some(1));
        let (nodes, plan) = placed(&s);
        assert_eq!(nodes, ["a1", "a2"], "{:?}", plan.pending);
        // Three pods: rack-a holds two, rack-b one, `loose` is in no
        // HyperNode; the gang waits.
        let mut s = hypernode_racks(&[]);
        s.apply_node(&node("loose", "4"));
        gang(
            &mut s,
            "job",
            3,
            serde_json::json!({"mode": "hard", "highestTierAllowed": 5}),
        );
        assert!(placed(&s).0.is_empty());
        // Without any tier (no HyperNodes, no label keys) the tier stays.
        let mut s = State::new("tessera");
        s.set_network_label_keys(Vec::new());
        gang(
            &mut s,
            "job",
            1,
            serde_json::json!({"mode": "hard", "highestTierAllowed": 5}),
        );
        s.apply_node(&node("n1", "4"));
        let b = s.build();
        assert_eq!(
            b.snapshot.groups[0].network_topology.map(|n| n.tier),
            Some(5)
        );
        // The gang waits, and says why (not "the 0 free GPUs it needs").
        let (nodes, plan) = placed(&s);
        assert!(nodes.is_empty());
        assert!(
            plan.pending[0]
                .reason
                .contains("no schedulable node is in one"),
            "{}",
            plan.pending[0].reason
        );
    }

    #[test]
    fn tiers_1_and_3_only_confine_a_tier_2_gang_to_a_rack_not_a_node() {
        let mut s = State::new("tessera");
        for n in ["a1", "a2", "b1"] {
            s.apply_node(&node(n, "4"));
        }
        s.apply_hypernode(&hn("rack-a", 1, exact("Node", &["a1", "a2"])));
        s.apply_hypernode(&hn("rack-b", 1, exact("Node", &["b1"])));
        s.apply_hypernode(&hn("zone", 3, exact("HyperNode", &["rack-a", "rack-b"])));
        gang(
            &mut s,
            "job",
            2,
            serde_json::json!({"mode": "hard", "highestTierAllowed": 2}),
        );
        let (nodes, plan) = placed(&s);
        assert_eq!(nodes, ["a1", "a2"], "{:?}", plan.pending);
    }

    #[test]
    fn the_same_hypernode_again_starts_no_cycle() {
        let mut s = hypernode_racks(&["rack-a", "rack-b"]);
        let g = s.generation;
        // Volcano's controller writing `status.nodeCount`.
        let mut again = hn("rack-a", 1, exact("Node", &["a1", "a2"]));
        again.status = serde_json::from_value(serde_json::json!({"nodeCount": 2})).unwrap();
        s.apply_hypernode(&again);
        assert_eq!(s.generation, g);
        s.delete_hypernode("never-there");
        assert_eq!(s.generation, g);
        let all = [
            hn("rack-b", 1, exact("Node", &["b1"])),
            again.clone(),
            hn("spine", 2, exact("HyperNode", &["rack-a", "rack-b"])),
        ];
        s.reset_hypernodes(&all);
        assert_eq!(s.generation, g);
        // A bad one is reported once, however often it arrives.
        s.errors.clear();
        s.apply_hypernode(&hn("bad", 0, serde_json::json!([])));
        let g = s.generation;
        s.apply_hypernode(&hn("bad", 0, serde_json::json!([])));
        assert_eq!(s.generation, g);
        assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
        // A change is one.
        s.apply_hypernode(&hn("rack-a", 1, exact("Node", &["a1"])));
        assert_ne!(s.generation, g);
        let net = s
            .build()
            .snapshot
            .nodes
            .iter()
            .find(|n| n.name == "a2")
            .map(|n| n.network.clone());
        assert_eq!(net, Some(Vec::new()));
    }

    proptest::proptest! {
        /// HyperNodes applied one event at a time (repeats, changes, bad
        /// ones, deletions, in any order) leave every node where a fresh
        /// controller that lists the final set puts it: skipping unchanged
        /// HyperNodes never keeps a stale domain.
        #[test]
        fn hypernode_events_agree_with_a_fresh_list(
            events in proptest::collection::vec((0usize..4, 0usize..5), 0..16)
        ) {
            // Variants of four HyperNodes; variant 4 is a deletion, 3 bad.
            let variant = |h: usize, v: usize| -> Option<crd::topology::HyperNode> {
                let name = format!("h{h}");
                match (h, v) {
                    (_, 4) => None,
                    (_, 3) => Some(hn(&name, 0, serde_json::json!([]))),
                    (0 | 1, v) => Some(hn(&name, 1, exact("Node", &[["a1", "a2", "b1"][v], "a2"]))),
                    (2, v) => Some(hn(&name, 2, exact("HyperNode", &[["h0", "h1", "h0"][v]]))),
                    (_, v) => Some(hn(&name, [1, 2, 3][v], serde_json::json!(
                        [{"type": "Node", "selector": {"regexMatch": {"pattern": "^b"}}}]))),
                }
            };
            let mut s = State::new("tessera");
            for n in ["a1", "a2", "b1"] {
                s.apply_node(&node(n, "4"));
            }
            let mut last: BTreeMap<usize, crd::topology::HyperNode> = BTreeMap::new();
            for (h, v) in events {
                match variant(h, v) {
                    Some(x) => {
                        s.apply_hypernode(&x);
                        last.insert(h, x);
                    }
                    None => {
                        s.delete_hypernode(&format!("h{h}"));
                        last.remove(&h);
                    }
                }
            }
            let mut fresh = State::new("tessera");
            for n in ["a1", "a2", "b1"] {
                fresh.apply_node(&node(n, "4"));
            }
            fresh.reset_hypernodes(&last.values().cloned().collect::<Vec<_>>());
            let nets = |s: &State| -> Vec<Vec<String>> {
                s.build().snapshot.nodes.iter().map(|n| n.network.clone()).collect()
            };
            proptest::prop_assert_eq!(nets(&s), nets(&fresh));
        }
    }

    #[test]
    fn pdb_allowed() {
        let p = Pdb {
            namespace: "ns".into(),
            name: "p".into(),
            selector: Default::default(),
            min_available: Some(IntOrString::Int(2)),
            max_unavailable: None,
        };
        assert_eq!(p.allowed(3), 1);
        assert_eq!(p.allowed(2), 0);
        let p = Pdb {
            min_available: None,
            max_unavailable: Some(IntOrString::String("50%".into())),
            ..p
        };
        assert_eq!(p.allowed(3), 2);
    }
}
