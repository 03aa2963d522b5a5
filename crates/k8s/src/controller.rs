//! The controller: watch -> cache -> decide -> apply.
//!
//! * **watch**: one watcher per kind (Nodes, Pods, PriorityClasses,
//!   PodDisruptionBudgets, Leases are read by the elector; PodGroups and Queues of
//!   Tessera, Volcano and scheduler-plugins; NodeShards; Volcano's HyperNodes;
//!   ResourceSlices and ResourceClaims), each turning events into small changes
//!   to [`State`].
//!   Optional APIs are watched only where the server serves them.
//! * **cache**: [`State`] translates each object once, when it changes.
//! * **decide**: the batch scheduler (`tessera_sched::schedule`) over the
//!   snapshot, on a blocking thread, and the agent scheduler for agent pods on the
//!   agent shard. Pure.
//! * **apply**: evictions through the Eviction API (PDBs checked first, and the
//!   server enforces them too), device assignments (DRA claim allocations, GPU
//!   index and MIG instance annotations; plans that would create MIG instances
//!   are held back, [`crate::translate::mig::hold_reconfigurations`]), bindings through the `binding` subresource, all with
//!   bounded concurrency. Bindings are pipelined: a planned pod is assumed on
//!   its node at once and its write goes on in the background while the next
//!   cycle decides (a failed write forgets it). Then pending reasons (`PodScheduled=False` and an
//!   event), PodGroup and NodeShard status. Every write first checks that this
//!   replica still leads.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, stream};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, EvictParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::mpsc;

use crate::crd;
use crate::dra;
use crate::gang::{self, Flavour, GangSource, QueueSource};
use crate::leader::{self, Leadership, LeaseConfig};
use crate::state::{Built, PodKey, State};
use crate::translate::{keys, mig};

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Pods with this `spec.schedulerName` are Tessera's (default `tessera`).
    pub scheduler_name: String,
    /// Leader election; `None` runs without (one replica only).
    pub lease: Option<LeaseConfig>,
    /// Writes in flight at once (bindings, evictions, status).
    pub concurrency: usize,
    /// A cycle runs at least this often even without changes.
    pub period: Duration,
    /// How often to ask the server again which optional APIs it serves; when
    /// one appeared (a CRD installed after the start), [`run`] returns
    /// [`RunError::ApisChanged`] so that the caller starts it again with
    /// watchers for it.
    pub rediscover: Duration,
    /// The batch scheduler's configuration.
    pub sched: tessera_sched::Config,
    /// Write an event for each pending reason (beside the pod condition).
    pub events: bool,
    /// Node label keys of the network tiers, bottom up, read when the cluster
    /// has no Volcano HyperNodes (see [`crate::network`]).
    pub network_label_keys: Vec<String>,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            scheduler_name: "tessera".into(),
            lease: None,
            concurrency: 64,
            period: Duration::from_secs(5),
            rediscover: Duration::from_secs(60),
            sched: tessera_sched::Config::default(),
            events: true,
            network_label_keys: crate::network::default_label_keys(),
        }
    }
}

/// Counters a caller can read while the controller runs.
#[derive(Debug, Default)]
pub struct Metrics {
    pub cycles: AtomicU64,
    pub bound: AtomicU64,
    /// Bindings refused because the pod was already bound (409).
    pub bind_conflicts: AtomicU64,
    pub bind_errors: AtomicU64,
    pub evicted: AtomicU64,
    /// Evictions not made because a PodDisruptionBudget allows none.
    pub evictions_blocked: AtomicU64,
    pub pending_written: AtomicU64,
    pub group_status_written: AtomicU64,
    pub claims_allocated: AtomicU64,
    /// Microseconds spent in the schedulers (snapshot assembly included).
    pub decide_us: AtomicU64,
    /// Cycles whose snapshot was patched from the last one rather than
    /// assembled afresh.
    pub assembled_in_part: AtomicU64,
    /// Microseconds spent applying plans.
    pub apply_us: AtomicU64,
    /// Whether the initial lists are in and this replica leads.
    pub ready: std::sync::atomic::AtomicBool,
}

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("lost the lease {0}: another replica leads now")]
    LostLease(String),
    #[error("watching {0} failed: {1}")]
    Watch(&'static str, String),
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("the server now serves {0}; start again to watch it")]
    ApisChanged(String),
}

type Change = Box<dyn FnOnce(&mut State) + Send>;

enum Msg {
    Change(Change),
    /// A watcher's first list is in (or its optional API is absent).
    Synced(String),
}

/// Which optional APIs the server serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    /// The scheduling APIs whose PodGroups are served (Tessera's Queues and
    /// NodeShards, and Volcano's Queues, are watched with them).
    pub scheduling: BTreeSet<Flavour>,
    pub dra: bool,
    /// `policy/v1` PodDisruptionBudgets (else `policy/v1beta1`, before 1.21).
    pub pdb_v1: bool,
    /// Volcano's `topology.volcano.sh/v1alpha1` HyperNodes (Volcano 1.11+).
    pub hypernodes: bool,
}

impl Served {
    /// Whether the PodGroups of `f` are served.
    pub fn serves(&self, f: Flavour) -> bool {
        self.scheduling.contains(&f)
    }

    /// The optional APIs `now` serves that `self` did not.
    pub fn appeared(&self, now: &Served) -> Vec<String> {
        let mut new: Vec<String> = now
            .scheduling
            .difference(&self.scheduling)
            .map(|f| f.podgroups().api_version)
            .collect();
        let pairs = [
            (self.dra, now.dra, "resource.k8s.io/v1"),
            (self.pdb_v1, now.pdb_v1, "policy/v1"),
            (
                self.hypernodes,
                now.hypernodes,
                "topology.volcano.sh/v1alpha1",
            ),
        ];
        new.extend(
            pairs
                .into_iter()
                .filter(|(was, is, _)| !was && *is)
                .map(|(_, _, api)| api.to_string()),
        );
        new
    }
}

/// Asks the server which optional APIs it serves.
pub async fn discover(client: &Client) -> Served {
    let mut scheduling = BTreeSet::new();
    for f in Flavour::ALL {
        let r = f.podgroups();
        if serves(client, &r.api_version, &r.kind).await {
            scheduling.insert(f);
        }
    }
    Served {
        scheduling,
        dra: serves(client, "resource.k8s.io/v1", "ResourceSlice").await,
        pdb_v1: serves(client, "policy/v1", "PodDisruptionBudget").await,
        hypernodes: serves(client, "topology.volcano.sh/v1alpha1", "HyperNode").await,
    }
}

async fn serves(client: &Client, gv: &str, kind: &str) -> bool {
    client
        .list_api_group_resources(gv)
        .await
        .map(|l| l.resources.iter().any(|r| r.kind == kind))
        .unwrap_or(false)
}

/// Tasks aborted when this is dropped: the watchers and the lease renewal end
/// with the controller, also when its future is dropped (aborted) midway.
#[derive(Default)]
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Whether the controller may start without a watcher's first list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Nodes and pods: nothing can be scheduled without them.
    Required,
    /// Everything else: when its first list fails (the API is absent, or RBAC
    /// forbids it), the controller logs that once and goes on as if the list
    /// were empty; the watcher keeps retrying and takes objects in when the
    /// list succeeds.
    Optional,
}

/// Runs one watcher, turning its events into changes. `reset` receives the
/// full list after every (re)list, so objects deleted while disconnected go.
#[allow(clippy::too_many_arguments)]
fn spawn_watch<K>(
    name: String,
    need: Need,
    api: Api<K>,
    cfg: watcher::Config,
    tx: mpsc::UnboundedSender<Msg>,
    apply: fn(&mut State, &K),
    delete: fn(&mut State, &K),
    reset: Option<fn(&mut State, Vec<K>)>,
) -> tokio::task::JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut s = watcher::watcher(api, cfg).default_backoff().boxed();
        let mut buf: Vec<K> = Vec::new();
        let mut synced = false;
        let mut errors = 0u64;
        // Whether a list ever succeeded (an absent optional API stays quiet).
        let mut listed = false;
        while let Some(ev) = s.next().await {
            let msg: Option<Change> = match ev {
                Ok(Event::Apply(o)) => Some(Box::new(move |st| apply(st, &o))),
                Ok(Event::Delete(o)) => Some(Box::new(move |st| delete(st, &o))),
                Ok(Event::Init) => {
                    buf.clear();
                    None
                }
                Ok(Event::InitApply(o)) => {
                    if reset.is_some() {
                        buf.push(o);
                        None
                    } else {
                        Some(Box::new(move |st| apply(st, &o)))
                    }
                }
                Ok(Event::InitDone) => {
                    listed = true;
                    let objs = std::mem::take(&mut buf);
                    let r = reset;
                    let m: Change = Box::new(move |st| {
                        if let Some(r) = r {
                            r(st, objs)
                        }
                    });
                    if tx.send(Msg::Change(m)).is_err() {
                        return;
                    }
                    if !synced {
                        synced = true;
                        if tx.send(Msg::Synced(name.clone())).is_err() {
                            return;
                        }
                    }
                    None
                }
                Err(e) => {
                    errors += 1;
                    if !synced && need == Need::Optional {
                        synced = true;
                        eprintln!(
                            "tessera-k8s: {name} not available ({e}); going on without them, retrying in the background"
                        );
                        if tx.send(Msg::Synced(name.clone())).is_err() {
                            return;
                        }
                    } else if (need == Need::Required || listed) && errors.is_power_of_two() {
                        // 1st, 2nd, 4th, 8th, ... error: visible, not a flood.
                        eprintln!("tessera-k8s: watching {name} (error {errors}): {e}");
                    }
                    None
                }
            };
            if let Some(m) = msg
                && tx.send(Msg::Change(m)).is_err()
            {
                return;
            }
        }
    })
}

/// An object's name (empty if it has none).
fn name_of(m: &ObjectMeta) -> &str {
    m.name.as_deref().unwrap_or_default()
}

fn meta_key(m: &ObjectMeta) -> (String, String) {
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

fn to_typed<K: DeserializeOwned>(o: &DynamicObject) -> Option<K> {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
}

/// The controller's writer: one client, the leadership, the counters.
#[derive(Clone)]
struct Writer {
    client: Client,
    leadership: Leadership,
    timeout: Duration,
    metrics: Arc<Metrics>,
    scheduler: String,
}

enum WriteError {
    NotLeader,
    Timeout,
    Api(kube::Error),
}

impl Writer {
    async fn write<T, F>(&self, f: F) -> Result<T, WriteError>
    where
        F: std::future::Future<Output = Result<T, kube::Error>>,
    {
        if !self.leadership.is_leader() {
            return Err(WriteError::NotLeader);
        }
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(WriteError::Api(e)),
            Err(_) => Err(WriteError::Timeout),
        }
    }

    fn pods(&self, ns: &str) -> Api<core::Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Binds one pod: DRA claims first, GPU indices and MIG instance, then the binding.
    async fn bind(&self, job: BindJob) -> BindOutcome {
        let (ns, name) = &job.key;
        for (claim, patch) in &job.claims {
            let api: Api<res::ResourceClaim> = Api::namespaced(self.client.clone(), ns);
            match self
                .write(api.patch_status(claim, &PatchParams::default(), &Patch::Merge(patch)))
                .await
            {
                Ok(_) => {
                    self.metrics.claims_allocated.fetch_add(1, Relaxed);
                }
                Err(e) => return BindOutcome::Failed(format!("allocating claim {claim}: {e:?}")),
            }
        }
        let annotations = bind_annotations(&job);
        if !annotations.is_empty() {
            let patch = json!({"metadata": {"annotations": annotations}});
            if let Err(e) = self
                .write(
                    self.pods(ns)
                        .patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
                )
                .await
            {
                return BindOutcome::Failed(format!("recording GPUs: {e:?}"));
            }
        }
        let binding = core::Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            target: core::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(job.node.clone()),
                ..core::ObjectReference::default()
            },
        };
        // The binding subresource answers with a Status, not a Binding.
        match self
            .write(self.pods(ns).create_subresource::<_, serde_json::Value>(
                "binding",
                name,
                &PostParams::default(),
                &binding,
            ))
            .await
        {
            Ok(_) => BindOutcome::Bound,
            Err(WriteError::Api(kube::Error::Api(s))) if s.code == 409 => BindOutcome::Conflict,
            Err(WriteError::Api(kube::Error::Api(s))) if s.code == 404 => BindOutcome::Gone,
            Err(WriteError::NotLeader) => BindOutcome::NotLeader,
            Err(e) => BindOutcome::Failed(format!("{e:?}")),
        }
    }

    /// `PodScheduled=False` with the reason, and an event.
    async fn pending(&self, key: PodKey, uid: String, message: String, events: bool) -> bool {
        let (ns, name) = &key;
        let now = k8s_openapi::jiff::Timestamp::now();
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": now.to_string()
        }]}});
        let ok = self
            .write(self.pods(ns).patch_status(
                name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            ))
            .await
            .is_ok();
        if events {
            let ev = core::Event {
                metadata: ObjectMeta {
                    name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                    namespace: Some(ns.clone()),
                    ..ObjectMeta::default()
                },
                involved_object: core::ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    uid: Some(uid),
                    ..core::ObjectReference::default()
                },
                reason: Some("FailedScheduling".into()),
                message: Some(message),
                type_: Some("Warning".into()),
                count: Some(1),
                first_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                last_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                source: Some(core::EventSource {
                    component: Some(self.scheduler.clone()),
                    ..core::EventSource::default()
                }),
                reporting_component: Some(self.scheduler.clone()),
                ..core::Event::default()
            };
            let api: Api<core::Event> = Api::namespaced(self.client.clone(), ns);
            let _ = self.write(api.create(&PostParams::default(), &ev)).await;
        }
        ok
    }
}

impl std::fmt::Debug for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::NotLeader => f.write_str("not the leader"),
            WriteError::Timeout => f.write_str("timed out"),
            WriteError::Api(e) => write!(f, "{e}"),
        }
    }
}

struct BindJob {
    key: PodKey,
    node: String,
    gpus: Vec<u32>,
    /// `(claim name, status patch)`.
    claims: Vec<(String, serde_json::Value)>,
    /// The MIG instance the pod gets (an existing one: see [`mig::hold_reconfigurations`]).
    mig: Option<mig::Instance>,
}

/// The annotations recording what a binding gives the pod: its GPUs, or its
/// MIG instance. Not both: a MIG pod's GPU index is Tessera's bookkeeping (see
/// [`crate::translate::mig`]), which a device plugin reading `gpu-indices` would take
/// for a physical GPU.
fn bind_annotations(job: &BindJob) -> serde_json::Map<String, serde_json::Value> {
    let mut annotations = serde_json::Map::new();
    if let Some(m) = &job.mig {
        annotations.insert(keys::MIG_INSTANCE.into(), m.to_string().into());
    } else if !job.gpus.is_empty() && job.claims.is_empty() {
        let list: Vec<String> = job.gpus.iter().map(u32::to_string).collect();
        annotations.insert(keys::GPU_INDICES.into(), list.join(",").into());
    }
    annotations
}

enum BindOutcome {
    Bound,
    Conflict,
    Gone,
    NotLeader,
    Failed(String),
}

fn bind_job(state: &State, key: PodKey, node: String, gpus: Vec<u32>) -> BindJob {
    let mut claims = Vec::new();
    if let Some(p) = state.pod(&key)
        && !p.claims.is_empty()
    {
        let slices = state.slices_of(&node);
        let mut used = 0;
        for c in &p.claims {
            let Some(ci) = state.claim(&p.namespace, c) else {
                continue;
            };
            if ci.allocated || ci.gpus() == 0 {
                continue;
            }
            if let Some((patch, n)) = dra::allocation_patch(
                ci,
                &node,
                &slices,
                gpus.get(used..).unwrap_or(&[]),
                &p.name,
                &p.uid,
            ) {
                used += n;
                claims.push((c.clone(), patch));
            }
        }
    }
    BindJob {
        key,
        node,
        gpus,
        claims,
        mig: None,
    }
}

/// Writes one binding of a cycle in the background, once one of the
/// `concurrency` permits is free. The pod was assumed on its node when the cycle
/// planned it; unless it is bound now, it is forgotten and planned again.
async fn bind_pipelined(
    w: Writer,
    tx: mpsc::UnboundedSender<Msg>,
    permits: Arc<tokio::sync::Semaphore>,
    j: BindJob,
) {
    let Ok(_permit) = permits.acquire().await else {
        return;
    };
    let key = j.key.clone();
    match w.bind(j).await {
        BindOutcome::Bound => {
            w.metrics.bound.fetch_add(1, Relaxed);
            return;
        }
        BindOutcome::Conflict => {
            w.metrics.bind_conflicts.fetch_add(1, Relaxed);
        }
        BindOutcome::Gone | BindOutcome::NotLeader => {}
        BindOutcome::Failed(e) => {
            if w.metrics.bind_errors.fetch_add(1, Relaxed) < 5 {
                eprintln!("tessera-k8s: binding {}/{}: {e}", key.0, key.1);
            }
        }
    }
    let _ = tx.send(Msg::Change(Box::new(move |st| st.forget(&key))));
}

/// Binds one pod as a cycle would (DRA claim allocations, GPU annotation, the
/// binding), without leader election. For tests and tools.
pub async fn bind_once(
    client: &Client,
    state: &State,
    key: PodKey,
    node: String,
    gpus: Vec<u32>,
) -> Result<(), String> {
    let w = Writer {
        client: client.clone(),
        leadership: Leadership::always(),
        timeout: Duration::from_secs(30),
        metrics: Arc::new(Metrics::default()),
        scheduler: state.scheduler_name.clone(),
    };
    match w.bind(bind_job(state, key, node, gpus)).await {
        BindOutcome::Bound => Ok(()),
        BindOutcome::Conflict => Err("already bound".into()),
        BindOutcome::Gone => Err("the pod is gone".into()),
        BindOutcome::NotLeader => Err("not the leader".into()),
        BindOutcome::Failed(e) => Err(e),
    }
}

/// The watchers of one run, and the names of those whose first list the
/// controller still waits for.
struct Watchers {
    client: Client,
    tx: mpsc::UnboundedSender<Msg>,
    tasks: Tasks,
    need: BTreeSet<String>,
}

impl Watchers {
    /// Starts one watcher (see [`spawn_watch`]).
    #[allow(clippy::too_many_arguments)]
    fn watch<K>(
        &mut self,
        name: impl Into<String>,
        need: Need,
        api: Api<K>,
        cfg: watcher::Config,
        apply: fn(&mut State, &K),
        delete: fn(&mut State, &K),
        reset: Option<fn(&mut State, Vec<K>)>,
    ) where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let name = name.into();
        self.need.insert(name.clone());
        let h = spawn_watch(name, need, api, cfg, self.tx.clone(), apply, delete, reset);
        self.tasks.0.push(h);
    }

    /// An optional kind, listed whole, without a reset on a re-list.
    fn optional<K>(
        &mut self,
        name: impl Into<String>,
        apply: fn(&mut State, &K),
        delete: fn(&mut State, &K),
    ) where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let api = Api::<K>::all(self.client.clone());
        let cfg = watcher::Config::default();
        self.watch(name, Need::Optional, api, cfg, apply, delete, None);
    }

    /// The PodGroups of one flavour.
    fn gangs<G: GangSource>(&mut self) {
        self.optional::<G>(
            gang::watch_name(&ApiResource::erase::<G>(&())),
            |s, g| s.apply_gang(g),
            |s, g| {
                let (ns, n) = meta_key(g.meta());
                s.delete_group(G::FLAVOUR, &ns, &n)
            },
        );
    }

    /// The Queues of one flavour.
    fn queues<Q: QueueSource>(&mut self) {
        self.optional::<Q>(
            gang::watch_name(&ApiResource::erase::<Q>(&())),
            |s, q| s.apply_queue(q),
            |s, q| s.delete_queue(Q::FLAVOUR, name_of(q.meta())),
        );
    }

    /// Every kind this controller reads that the server serves.
    fn spawn_all(&mut self, served: &Served) {
        let c = self.client.clone();
        self.watch(
            "nodes",
            Need::Required,
            Api::<core::Node>::all(c.clone()),
            watcher::Config::default(),
            |s, n| s.apply_node(n),
            |s, n| s.delete_node(name_of(&n.metadata)),
            Some(|s, all: Vec<core::Node>| s.reset_nodes(&all)),
        );
        self.watch(
            "pods",
            Need::Required,
            Api::<core::Pod>::all(c.clone()),
            watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
            |s, p| s.apply_pod(p),
            |s, p| s.delete_pod(&meta_key(&p.metadata)),
            Some(|s, all: Vec<core::Pod>| s.reset_pods(&all)),
        );
        self.optional::<PriorityClass>(
            "priorityclasses",
            |s, p| s.apply_priority_class(name_of(&p.metadata), p.value),
            |s, p| s.delete_priority_class(name_of(&p.metadata)),
        );
        let pdb_ar = if served.pdb_v1 {
            ApiResource::erase::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(&())
        } else {
            ApiResource {
                group: "policy".into(),
                version: "v1beta1".into(),
                api_version: "policy/v1beta1".into(),
                kind: "PodDisruptionBudget".into(),
                plural: "poddisruptionbudgets".into(),
            }
        };
        self.watch(
            "poddisruptionbudgets",
            Need::Optional,
            Api::<DynamicObject>::all_with(c.clone(), &pdb_ar),
            watcher::Config::default(),
            |s, o| {
                if let Some(p) = to_typed(o) {
                    s.apply_pdb(&p)
                }
            },
            |s, o| {
                let (ns, n) = meta_key(&o.metadata);
                s.delete_pdb(&ns, &n)
            },
            None,
        );
        if served.serves(Flavour::Tessera) {
            self.gangs::<crd::PodGroup>();
            self.queues::<crd::Queue>();
            self.optional::<crd::NodeShard>(
                "nodeshards.scheduling.tessera.dev",
                |s, n| s.apply_shard(n),
                |s, n| s.delete_shard(name_of(&n.metadata)),
            );
        }
        if served.serves(Flavour::Volcano) {
            self.gangs::<crd::volcano::PodGroup>();
            self.queues::<crd::volcano::Queue>();
        }
        if served.serves(Flavour::XK8s) {
            self.gangs::<crd::x_k8s::PodGroup>();
        }
        if served.hypernodes {
            self.watch(
                "hypernodes.topology.volcano.sh",
                Need::Optional,
                Api::<crd::topology::HyperNode>::all(c),
                watcher::Config::default(),
                |s, h| s.apply_hypernode(h),
                |s, h| s.delete_hypernode(name_of(&h.metadata)),
                Some(|s, all: Vec<crd::topology::HyperNode>| s.reset_hypernodes(&all)),
            );
        }
        if served.dra {
            self.optional::<res::ResourceSlice>(
                "resourceslices",
                |s, r| s.apply_slice(r),
                |s, r| s.delete_slice(name_of(&r.metadata)),
            );
            self.optional::<res::ResourceClaim>(
                "resourceclaims",
                |s, r| s.apply_claim(r),
                |s, r| {
                    let (ns, n) = meta_key(&r.metadata);
                    s.delete_claim(&ns, &n)
                },
            );
        }
    }
}

/// The controller's loop state.
struct Loop {
    cfg: RunConfig,
    served: Served,
    state: State,
    writer: Writer,
    /// Reasons this replica wrote (so an unchanged reason is not rewritten).
    written: BTreeMap<PodKey, String>,
    /// Group statuses this replica wrote: `(phase, running)`.
    group_written: BTreeMap<(Flavour, String, String), (String, i32)>,
    errors_logged: usize,
    /// For the binding tasks: their outcomes come back as changes.
    tx: mpsc::UnboundedSender<Msg>,
    /// Writes in flight for bindings, across cycles.
    permits: Arc<tokio::sync::Semaphore>,
    /// The binding tasks (aborted with the loop).
    binds: Tasks,
}

/// Runs the controller until `stop` turns true or the lease is lost.
pub async fn run(
    client: Client,
    cfg: RunConfig,
    metrics: Arc<Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), RunError> {
    let (leadership, renew) = match &cfg.lease {
        Some(l) => {
            let acq = leader::acquire(client.clone(), l.clone());
            tokio::select! {
                r = acq => { let (a, b) = r; (a, Some(b)) }
                _ = stop.changed() => return Ok(()),
            }
        }
        None => (Leadership::always(), None),
    };
    let timeout = cfg
        .lease
        .as_ref()
        .map(|l| l.write_timeout())
        .unwrap_or(Duration::from_secs(30));
    let served = discover(&client).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    // Aborted on every way out, an abort of this future included: a replica
    // that is killed must not go on renewing its lease.
    let renew = Tasks(renew.into_iter().collect());
    let mut watchers = Watchers {
        client: client.clone(),
        tx: tx.clone(),
        tasks: Tasks::default(),
        need: BTreeSet::new(),
    };
    watchers.spawn_all(&served);
    let Watchers {
        tasks: watchers,
        need,
        ..
    } = watchers;
    let mut lp = Loop {
        tx,
        permits: Arc::new(tokio::sync::Semaphore::new(cfg.concurrency.max(1))),
        binds: Tasks::default(),
        state: {
            let mut st = State::new(cfg.scheduler_name.clone());
            st.set_network_label_keys(cfg.network_label_keys.clone());
            st
        },
        writer: Writer {
            client: client.clone(),
            leadership: leadership.clone(),
            timeout,
            metrics: metrics.clone(),
            scheduler: cfg.scheduler_name.clone(),
        },
        served,
        cfg,
        written: BTreeMap::new(),
        group_written: BTreeMap::new(),
        errors_logged: 0,
    };
    let result = lp.run(&mut rx, &mut stop, need).await;
    drop(watchers);
    metrics.ready.store(false, Relaxed);
    let had_lease = !renew.0.is_empty();
    drop(renew);
    // Stopped, or starting again to watch a new API: give the lease up now
    // rather than make the next holder wait for it to expire.
    if had_lease
        && matches!(result, Ok(()) | Err(RunError::ApisChanged(_)))
        && let Some(l) = &lp.cfg.lease
    {
        leader::release(client, l).await;
    }
    result
}

impl Loop {
    async fn run(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Msg>,
        stop: &mut tokio::sync::watch::Receiver<bool>,
        mut need: BTreeSet<String>,
    ) -> Result<(), RunError> {
        let mut last_gen = u64::MAX;
        let mut last_cycle = Instant::now();
        let every = self.cfg.rediscover.max(Duration::from_millis(10));
        let mut rediscover = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        rediscover.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        let mut wait_logged = false;
        loop {
            let mut forced = false;
            tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => self.handle(m, &mut need),
                    None => return Err(RunError::Watch("all", "watchers ended".into())),
                },
                _ = tokio::time::sleep(self.cfg.period) => forced = true,
                _ = rediscover.tick() => {
                    let now = discover(&self.writer.client).await;
                    let new = self.served.appeared(&now);
                    if !new.is_empty() {
                        return Err(RunError::ApisChanged(new.join(", ")));
                    }
                }
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                return Ok(());
            }
            while let Ok(m) = rx.try_recv() {
                self.handle(m, &mut need);
            }
            self.log_errors();
            if !need.is_empty() {
                if !wait_logged && started.elapsed() > Duration::from_secs(10) {
                    wait_logged = true;
                    eprintln!("tessera-k8s: still waiting for the first list of {need:?}");
                }
                continue;
            }
            if !self.writer.leadership.is_leader() {
                return Err(RunError::LostLease(
                    self.cfg
                        .lease
                        .as_ref()
                        .map(|l| l.name.clone())
                        .unwrap_or_default(),
                ));
            }
            self.writer.metrics.ready.store(true, Relaxed);
            if self.state.generation == last_gen
                && !(forced || last_cycle.elapsed() >= self.cfg.period)
            {
                continue;
            }
            last_gen = self.state.generation;
            last_cycle = Instant::now();
            let decide = self.cycle().await;
            // Changes caused by our own writes arrive next; take them in one
            // go. Bindings are written in the background meanwhile; waiting at
            // least as long as the decision took keeps the scheduler to half
            // of the time when changes arrive without pause.
            tokio::time::sleep(decide.max(Duration::from_millis(5))).await;
        }
    }

    fn handle(&mut self, m: Msg, need: &mut BTreeSet<String>) {
        match m {
            Msg::Change(f) => f(&mut self.state),
            Msg::Synced(n) => {
                need.remove(&n);
            }
        }
    }

    fn log_errors(&mut self) {
        for e in self.state.errors.drain(..) {
            if self.errors_logged < 100 {
                eprintln!("tessera-k8s: {e}");
            }
            self.errors_logged += 1;
        }
    }

    /// One cycle; returns how long the decision took.
    async fn cycle(&mut self) -> Duration {
        let t0 = Instant::now();
        // Patched from the last cycle's snapshot when only pods changed.
        let mut built = self.state.build_incremental();
        let snapshot = std::mem::take(&mut built.snapshot);
        let sched = self.cfg.sched.clone();
        let agent_pods = std::mem::take(&mut built.agent_pods);
        let agent_nodes = std::mem::take(&mut built.agent_nodes);
        let decided = tokio::task::spawn_blocking(move || {
            let plan = tessera_sched::schedule(&snapshot, &sched);
            let agent = crate::agent::place(&agent_pods, &agent_nodes);
            (snapshot, plan, agent, agent_pods, agent_nodes)
        })
        .await;
        let Ok((snapshot, plan, agent, agent_pods, agent_nodes)) = decided else {
            // The snapshot is lost with the thread; the next one is assembled afresh.
            eprintln!("tessera-k8s: the scheduler panicked; skipping this cycle");
            return t0.elapsed();
        };
        built.snapshot = snapshot;
        built.agent_nodes = agent_nodes;
        let m = self.writer.metrics.clone();
        let decide = t0.elapsed();
        m.decide_us.fetch_add(decide.as_micros() as u64, Relaxed);
        m.cycles.fetch_add(1, Relaxed);
        let t1 = Instant::now();
        self.apply(&built, plan, agent, &agent_pods).await;
        m.apply_us
            .fetch_add(t1.elapsed().as_micros() as u64, Relaxed);
        built.agent_pods = agent_pods;
        self.state.recycle(built);
        m.assembled_in_part
            .store(self.state.assembled_in_part(), Relaxed);
        decide
    }

    async fn apply(
        &mut self,
        built: &Built,
        plan: tessera_model::Plan,
        agent: Vec<(PodKey, String)>,
        agent_pods: &[crate::state::AgentPod],
    ) {
        let w = self.writer.clone();
        let conc = self.cfg.concurrency.max(1);
        // MIG instances are used as the node has them, never made here.
        let mut plan = plan;
        mig::hold_reconfigurations(&mut plan);

        // 1. Evictions, PDBs checked first.
        let mut allowed = built.pdb_allowed.clone();
        let mut evict_jobs = Vec::new();
        for e in &plan.evictions {
            let Some(key) = built.pod_of(&e.task.group, &e.task.task) else {
                continue;
            };
            let pdbs = built.pdb_of_pod.get(&key).cloned().unwrap_or_default();
            if pdbs.iter().any(|k| allowed.get(k) == Some(&0)) {
                w.metrics.evictions_blocked.fetch_add(1, Relaxed);
                continue;
            }
            for k in &pdbs {
                if let Some(a) = allowed.get_mut(k) {
                    *a -= 1;
                }
            }
            evict_jobs.push(key);
        }
        let evicted: Vec<(PodKey, bool)> = stream::iter(evict_jobs)
            .map(|key| {
                let w = w.clone();
                async move {
                    let ok = match w
                        .write(w.pods(&key.0).evict(&key.1, &EvictParams::default()))
                        .await
                    {
                        Ok(_) => true,
                        Err(WriteError::Api(kube::Error::Api(s))) if s.code == 429 => {
                            w.metrics.evictions_blocked.fetch_add(1, Relaxed);
                            false
                        }
                        Err(WriteError::Api(kube::Error::Api(s))) if s.code == 404 => true,
                        Err(e) => {
                            eprintln!("tessera-k8s: evicting {}/{}: {e:?}", key.0, key.1);
                            false
                        }
                    };
                    (key, ok)
                }
            })
            .buffer_unordered(conc)
            .collect()
            .await;
        let victims: BTreeSet<PodKey> = evicted
            .iter()
            .filter(|(_, ok)| *ok)
            .map(|(k, _)| k.clone())
            .collect();
        w.metrics.evicted.fetch_add(victims.len() as u64, Relaxed);

        // 2. Bindings (those that wait for victims are held until they are gone).
        let mut jobs = Vec::new();
        for b in &plan.bindings {
            let Some(key) = built.pod_of(&b.task.group, &b.task.task) else {
                continue;
            };
            if b.after_evictions {
                self.state
                    .await_victims(b.task.group.clone(), victims.clone());
                continue;
            }
            let mut job = bind_job(&self.state, key, b.node.clone(), b.gpus.clone());
            job.mig = match (&b.mig, b.gpus.first()) {
                (Some(m), Some(&gpu)) => Some(mig::Instance {
                    gpu,
                    profile: m.profile.clone(),
                    start: m.start,
                }),
                _ => None,
            };
            jobs.push(job);
        }
        for (key, node) in &agent {
            jobs.push(bind_job(&self.state, key.clone(), node.clone(), Vec::new()));
        }
        // Pipelined: each planned pod is assumed on its node now, so that the
        // next cycle plans around it while the writes are still in flight (at
        // most `concurrency` at once, across cycles). A write that does not
        // bind forgets the pod, and the next cycle plans it again.
        let mut bound: BTreeSet<PodKey> = BTreeSet::new();
        for j in &jobs {
            self.state.assume(
                j.key.clone(),
                j.node.clone(),
                j.gpus.clone(),
                j.mig.as_ref().map(|m| m.start),
            );
            self.written.remove(&j.key);
            bound.insert(j.key.clone());
        }
        if !jobs.is_empty() {
            let (tx, permits, w) = (self.tx.clone(), self.permits.clone(), w.clone());
            self.binds.0.retain(|h| !h.is_finished());
            self.binds.0.push(tokio::spawn(
                stream::iter(jobs).for_each_concurrent(None, move |j| {
                    bind_pipelined(w.clone(), tx.clone(), permits.clone(), j)
                }),
            ));
        }

        // 3. Pending reasons.
        let mut reasons: Vec<(PodKey, String)> = Vec::new();
        for p in &plan.pending {
            for key in built.pending.get(&p.group).into_iter().flatten() {
                if !bound.contains(key) {
                    reasons.push((key.clone(), p.reason.clone()));
                }
            }
        }
        reasons.extend(built.waiting.iter().cloned());
        let placed: BTreeSet<&PodKey> = agent.iter().map(|(k, _)| k).collect();
        for a in agent_pods {
            if !placed.contains(&a.key) {
                reasons.push((
                    a.key.clone(),
                    "no room in the agent shard: no agent node has the free CPU, memory and pod slots"
                        .into(),
                ));
            }
        }
        let mut writes = Vec::new();
        for (key, reason) in reasons {
            let Some(p) = self.state.pod(&key) else {
                continue;
            };
            if p.scheduled_message.as_deref() == Some(reason.as_str())
                || self.written.get(&key) == Some(&reason)
            {
                continue;
            }
            self.written.insert(key.clone(), reason.clone());
            writes.push((key, p.uid.clone(), reason));
        }
        let events = self.cfg.events;
        let n: usize = stream::iter(writes)
            .map(|(k, uid, r)| {
                let w = w.clone();
                async move { w.pending(k, uid, r, events).await as usize }
            })
            .buffer_unordered(conc)
            .fold(0, |a, b| async move { a + b })
            .await;
        w.metrics.pending_written.fetch_add(n as u64, Relaxed);

        // 4. PodGroup status.
        self.write_group_status(built, &plan).await;
        // 5. NodeShard status.
        self.write_shard_status().await;
    }

    async fn write_group_status(&mut self, built: &Built, plan: &tessera_model::Plan) {
        let pending: BTreeMap<&str, &tessera_model::Pending> =
            plan.pending.iter().map(|p| (p.group.as_str(), p)).collect();
        let mut running: BTreeMap<&str, i32> = BTreeMap::new();
        let mut min: BTreeMap<&str, u32> = BTreeMap::new();
        for g in &built.snapshot.groups {
            min.insert(g.name.as_str(), g.min_member);
            let r = g.tasks.iter().filter(|t| t.node.is_some()).count() as i32;
            running.insert(g.name.as_str(), r);
        }
        for b in &plan.bindings {
            if !b.after_evictions {
                *running.entry(b.task.group.as_str()).or_default() += 1;
            }
        }
        let mut writes = Vec::new();
        for (gname, meta) in &built.meta {
            let Some((api, name)) = &meta.podgroup else {
                continue;
            };
            let r = running.get(gname.as_str()).copied().unwrap_or(0);
            let enough = r as u32 >= min.get(gname.as_str()).copied().unwrap_or(1).max(1);
            let waiting = pending.get(gname.as_str());
            let phase = api.phase(enough, waiting.map(|p| p.admitted));
            let k = (*api, meta.namespace.clone(), name.clone());
            let now = (phase.to_string(), r);
            if self.group_written.get(&k) == Some(&now) {
                continue;
            }
            let seen = self
                .state
                .groups()
                .find(|g| g.api == *api && g.namespace == meta.namespace && &g.name == name)
                .map(|g| (g.status_phase.clone(), g.status_running));
            if seen == Some((Some(now.0.clone()), Some(r))) {
                self.group_written.insert(k, now);
                continue;
            }
            self.group_written.insert(k.clone(), now);
            let status = api.status_patch(phase, r, waiting.map(|p| p.reason.as_str()));
            writes.push((k, status));
        }
        let w = self.writer.clone();
        let n: usize = stream::iter(writes)
            .map(|((api, ns, name), status)| {
                let w = w.clone();
                async move {
                    let podgroups: Api<DynamicObject> =
                        Api::namespaced_with(w.client.clone(), &ns, &api.podgroups());
                    let (pp, patch) = (PatchParams::default(), Patch::Merge(&status));
                    let write = podgroups.patch_status(&name, &pp, &patch);
                    w.write(write).await.is_ok() as usize
                }
            })
            .buffer_unordered(self.cfg.concurrency.max(1))
            .fold(0, |a, b| async move { a + b })
            .await;
        self.writer
            .metrics
            .group_status_written
            .fetch_add(n as u64, Relaxed);
    }

    async fn write_shard_status(&mut self) {
        if !self.served.serves(Flavour::Tessera) {
            return;
        }
        let mut writes = Vec::new();
        for (name, s) in self.state.shards() {
            let in_use: Vec<String> = s
                .nodes
                .iter()
                .filter(|n| self.state.has_node(n))
                .cloned()
                .collect();
            if in_use != s.status_in_use {
                writes.push((name.clone(), in_use));
            }
        }
        for (name, in_use) in writes {
            let api: Api<crd::NodeShard> = Api::all(self.writer.client.clone());
            let patch =
                json!({"status": {"nodesInUse": in_use, "nodesToAdd": [], "nodesToRemove": []}});
            let _ = self
                .writer
                .write(api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)))
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_pods_get_their_instance_recorded_not_gpu_indices() {
        let job = |mig: Option<mig::Instance>| BindJob {
            key: ("ns".into(), "p".into()),
            node: "a1".into(),
            gpus: vec![3],
            claims: Vec::new(),
            mig,
        };
        let a = bind_annotations(&job(Some(mig::Instance {
            gpu: 3,
            profile: "3g.20gb".into(),
            start: 4,
        })));
        assert_eq!(
            a.get(keys::MIG_INSTANCE).and_then(|v| v.as_str()),
            Some("gpu=3,profile=3g.20gb,start=4")
        );
        assert!(a.get(keys::GPU_INDICES).is_none(), "{a:?}");
        let a = bind_annotations(&job(None));
        assert_eq!(a.get(keys::GPU_INDICES).and_then(|v| v.as_str()), Some("3"));
        assert!(a.get(keys::MIG_INSTANCE).is_none(), "{a:?}");
    }
}
