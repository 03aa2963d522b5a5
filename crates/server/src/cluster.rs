//! The cluster as the console shows it (issue 23), as public API routes:
//!
//! - `GET /v1/cluster/gpus`: every node's GPUs in one compact reply (who holds each,
//!   fractions, MIG instances, reservations, node conditions) and the per-model
//!   fragmentation summary;
//! - `GET /v1/cluster/watch`: the same, live, as server-sent events (one `node` event
//!   per changed node, `fragmentation` when the summary changes);
//! - `GET /v1/cluster/queues`: the caller's queue tree with deserved, allocated and
//!   pending resources and its pending jobs with their reasons;
//! - `GET /v1/cluster/events?object=job/NAME`: the events of one object.
//!
//! [`ClusterState`] owns the view: it reads the store once (on the first request) and
//! then follows its change log, redrawing only the nodes a change touches; the
//! scheduler's reservations come from the plan of its latest round
//! ([`ClusterState::observe`]). What a node looks like is the pure [`view`] module.
//! Every reply is rendered for the caller: other tenants' tasks and reservations
//! are drawn without their names.
//!
//! A system admin may look at the console as any tenant: [`view_as`] turns a request
//! with `X-Tessera-Tenant: NAME` into a read-only (viewer) caller in that tenant.

pub mod view;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, RwLock};

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::{Stream, StreamExt, stream};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_model::{Node, Queue, Reservation, Resources};
use tessera_store::{AnyStore, ChangeOp, Key, Object, Store, StoreError};
use tokio::sync::broadcast;

use crate::api::{App, Q, R, items, ok, routes};
use crate::auth::Role;
use crate::plane::{Caller, ControlPlane, SYSTEM_TENANT, kind};
use crate::problem::ApiError;
use crate::scheduler::ScheduleFn;
use view::{Bound, JobLite, ModelSummary, NodeView, Viewer};

/// The store kind of the node runtime's heartbeats (conditions), read here.
pub const NODESTATUS: &str = "nodestatus";
/// The header with which a system admin views the API as another tenant (read only).
pub const VIEW_AS_HEADER: &str = "x-tessera-tenant";
/// Node labels the console offers as filters beside GPU model and any label.
pub const SHARD_LABEL: &str = "tessera.io/shard";
pub const RUNTIME_CLASSES_LABEL: &str = "tessera.io/runtime-classes";

/// A change the console's watchers get.
#[derive(Debug)]
pub enum Update {
    /// A node looks different now.
    Node { seq: u64, view: Arc<NodeView> },
    /// A node left the cluster.
    Removed { seq: u64, name: String },
    /// The fragmentation summary changed.
    Fragmentation {
        seq: u64,
        models: Arc<Vec<ModelSummary>>,
    },
    /// The view was read again (the change log was compacted past it, or the
    /// watcher fell behind): list again.
    Reset,
}

/// The console's view of the cluster. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ClusterState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: AnyStore,
    view: RwLock<View>,
    tx: broadcast::Sender<Arc<Update>>,
    loaded: tokio::sync::OnceCell<()>,
    /// The latest plan's reservations, written by the scheduler loop.
    reservations: Mutex<Vec<Reservation>>,
    poke: tokio::sync::watch::Sender<u64>,
    stop: tokio::sync::watch::Receiver<bool>,
    /// Names this view instance, so a watcher resuming with a sequence number from
    /// another replica (or from before a restart) is told to list again.
    instance: String,
}

/// Objects as last read, with the revision each was read at (a change older than
/// what a listing returned is skipped).
#[derive(Debug, Default)]
struct View {
    rev: u64,
    /// Bumped by every redraw that changed something: what watchers resume from.
    seq: u64,
    /// Watchers resuming from before this sequence number must list again.
    floor: u64,
    nodes: BTreeMap<String, (u64, Node)>,
    status: HashMap<String, (u64, Value)>,
    jobs: HashMap<(String, String), (u64, JobLite)>,
    on_node: HashMap<String, BTreeSet<(String, String)>>,
    queues: BTreeMap<(String, String), (u64, Queue)>,
    views: BTreeMap<String, (u64, Arc<NodeView>)>,
    removed: BTreeMap<String, u64>,
    reservations: Vec<Reservation>,
    frag: Arc<Vec<ModelSummary>>,
    frag_seq: u64,
    /// Stored jobs the console could not read (reported, never fatal).
    unreadable: BTreeSet<(String, String)>,
}

impl View {
    /// Applies one stored object (created or updated); returns the nodes to redraw.
    fn put(&mut self, o: &Object, dirty: &mut BTreeSet<String>) {
        match o.kind.as_str() {
            kind::NODE if o.tenant.is_empty() => {
                if self.nodes.get(&o.name).is_some_and(|(v, _)| *v > o.version) {
                    return;
                }
                if let Ok(n) = serde_json::from_value::<Node>(o.body.clone()) {
                    self.nodes.insert(o.name.clone(), (o.version, n));
                    dirty.insert(o.name.clone());
                }
            }
            NODESTATUS if o.tenant.is_empty() => {
                if self
                    .status
                    .get(&o.name)
                    .is_some_and(|(v, _)| *v > o.version)
                {
                    return;
                }
                self.status
                    .insert(o.name.clone(), (o.version, o.body.clone()));
                dirty.insert(o.name.clone());
            }
            kind::QUEUE => {
                let key = (o.tenant.clone(), o.name.clone());
                if self.queues.get(&key).is_some_and(|(v, _)| *v > o.version) {
                    return;
                }
                if let Ok(q) = serde_json::from_value::<Queue>(o.body.clone()) {
                    self.queues.insert(key, (o.version, q));
                }
            }
            kind::JOB => {
                let key = (o.tenant.clone(), o.name.clone());
                if self.jobs.get(&key).is_some_and(|(v, _)| *v > o.version) {
                    return;
                }
                match serde_json::from_value::<JobLite>(o.body.clone()) {
                    Ok(j) => {
                        self.unreadable.remove(&key);
                        self.unhook(&key, dirty);
                        for n in j.nodes() {
                            self.on_node
                                .entry(n.to_string())
                                .or_default()
                                .insert(key.clone());
                            dirty.insert(n.to_string());
                        }
                        self.jobs.insert(key, (o.version, j));
                    }
                    Err(_) => {
                        self.unreadable.insert(key);
                    }
                }
            }
            _ => {}
        }
    }

    /// Forgets which nodes a job holds (marking them for redraw).
    fn unhook(&mut self, key: &(String, String), dirty: &mut BTreeSet<String>) {
        if let Some((_, old)) = self.jobs.get(key) {
            for n in old.nodes() {
                if let Some(s) = self.on_node.get_mut(n) {
                    s.remove(key);
                    if s.is_empty() {
                        self.on_node.remove(n);
                    }
                }
                dirty.insert(n.to_string());
            }
        }
    }

    fn remove(&mut self, o: &Object, dirty: &mut BTreeSet<String>) {
        match o.kind.as_str() {
            kind::NODE if o.tenant.is_empty() => {
                self.nodes.remove(&o.name);
                dirty.insert(o.name.clone());
            }
            NODESTATUS => {
                self.status.remove(&o.name);
                dirty.insert(o.name.clone());
            }
            kind::QUEUE => {
                self.queues.remove(&(o.tenant.clone(), o.name.clone()));
            }
            kind::JOB => {
                let key = (o.tenant.clone(), o.name.clone());
                self.unhook(&key, dirty);
                self.jobs.remove(&key);
                self.unreadable.remove(&key);
            }
            _ => {}
        }
    }

    /// The tasks holding resources on `node`.
    fn bound_on<'a>(&'a self, node: &str) -> Vec<Bound<'a>> {
        let mut out = Vec::new();
        for key in self.on_node.get(node).into_iter().flatten() {
            let Some((_, j)) = self.jobs.get(key) else {
                continue;
            };
            for (t, s) in j.holding().filter(|(_, s)| s.node == node) {
                out.push(Bound {
                    tenant: &key.0,
                    job_name: &key.1,
                    job: j,
                    task: t,
                    status: s,
                });
            }
        }
        out
    }

    /// Redraws the `dirty` nodes; returns what changed.
    fn redraw(&mut self, dirty: &BTreeSet<String>) -> Vec<Arc<Update>> {
        let mut out = Vec::new();
        let seq = self.seq + 1;
        for name in dirty {
            match self.nodes.get(name) {
                Some((_, n)) => {
                    let v = view::node_view(
                        n,
                        self.status.get(name).map(|(_, s)| s),
                        &self.bound_on(name),
                        &self.reservations,
                    );
                    if self.views.get(name).is_some_and(|(_, old)| **old == v) {
                        continue;
                    }
                    let v = Arc::new(v);
                    self.views.insert(name.clone(), (seq, v.clone()));
                    self.removed.remove(name);
                    out.push(Arc::new(Update::Node { seq, view: v }));
                }
                None => {
                    if self.views.remove(name).is_some() {
                        self.removed.insert(name.clone(), seq);
                        out.push(Arc::new(Update::Removed {
                            seq,
                            name: name.clone(),
                        }));
                    }
                }
            }
        }
        if !out.is_empty() {
            let frag = view::fragmentation(self.views.values().map(|(_, v)| &**v));
            if *self.frag != frag {
                self.frag = Arc::new(frag);
                self.frag_seq = seq;
                out.push(Arc::new(Update::Fragmentation {
                    seq,
                    models: self.frag.clone(),
                }));
            }
            self.seq = seq;
        }
        out
    }

    /// Takes the scheduler's latest reservations; returns what changed.
    fn set_reservations(&mut self, r: Vec<Reservation>) -> Vec<Arc<Update>> {
        if r == self.reservations {
            return Vec::new();
        }
        let dirty: BTreeSet<String> = self
            .reservations
            .iter()
            .chain(r.iter())
            .map(|x| x.node.clone())
            .collect();
        self.reservations = r;
        self.redraw(&dirty)
    }
}

/// The latest snapshot of the view, for one reply.
pub struct Snapshot {
    pub seq: u64,
    pub instance: String,
    pub nodes: Vec<Arc<NodeView>>,
    pub fragmentation: Arc<Vec<ModelSummary>>,
    pub unreadable: usize,
}

impl ClusterState {
    /// A view over `store`; it reads the store on first use and follows it until
    /// `stop` turns true.
    pub fn new(store: AnyStore, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        let (tx, _) = broadcast::channel(4096);
        let (poke, _) = tokio::sync::watch::channel(0);
        ClusterState {
            inner: Arc::new(Inner {
                store,
                view: RwLock::new(View::default()),
                tx,
                loaded: tokio::sync::OnceCell::new(),
                reservations: Mutex::new(Vec::new()),
                poke,
                stop,
                instance: crate::auth::random_hex(8),
            }),
        }
    }

    /// Wraps the scheduler so that each round's reservations reach the view.
    pub fn observe(&self, f: ScheduleFn) -> ScheduleFn {
        let inner = self.inner.clone();
        Arc::new(move |s| {
            let plan = f(s);
            if let Ok(mut r) = inner.reservations.lock()
                && *r != plan.reservations
            {
                *r = plan.reservations.clone();
                inner.poke.send_modify(|v| *v += 1);
            }
            plan
        })
    }

    /// Reads the store and starts following it, once.
    async fn ensure(&self) -> Result<(), ApiError> {
        self.inner
            .loaded
            .get_or_try_init(|| async {
                // Subscribed before the reservations are read: none is missed.
                let poke = self.inner.poke.subscribe();
                let view = load(&self.inner.store, 0).await?;
                let rev = {
                    let mut v = self.inner.view.write().map_err(poisoned)?;
                    *v = view;
                    let r = self.inner.reservations.lock().map_err(poisoned)?.clone();
                    v.set_reservations(r);
                    v.rev
                };
                tokio::spawn(follow(self.inner.clone(), rev, poke));
                Ok::<(), ApiError>(())
            })
            .await
            .map(|_| ())
    }

    /// Every node's view and the fragmentation summary, now.
    pub async fn snapshot(&self) -> Result<Snapshot, ApiError> {
        self.ensure().await?;
        let v = self.inner.view.read().map_err(poisoned)?;
        Ok(Snapshot {
            seq: v.seq,
            instance: self.inner.instance.clone(),
            nodes: v.views.values().map(|(_, n)| n.clone()).collect(),
            fragmentation: v.frag.clone(),
            unreadable: v.unreadable.len(),
        })
    }

    /// Adds `gpu_use` to each node object of the node API: its GPUs (`total`), those
    /// free as whole GPUs (`free`: nothing uses them, no reservation holds them, MIG
    /// off) and the milli-GPUs allocated on it (`allocated_milli`), from this view. A
    /// node the view does not know yet gets none.
    pub async fn with_gpu_use(&self, mut nodes: Vec<Value>) -> Result<Vec<Value>, ApiError> {
        let snap = self.snapshot().await?;
        let by: std::collections::BTreeMap<&str, &NodeView> =
            snap.nodes.iter().map(|n| (n.name.as_str(), &**n)).collect();
        for n in &mut nodes {
            let Some(v) = n["name"].as_str().and_then(|name| by.get(name)) else {
                continue;
            };
            let allocated: u64 = v
                .gpus
                .iter()
                .flat_map(|g| g.uses.iter().map(|(_, m)| u64::from(*m)))
                .sum();
            n["gpu_use"] = json!({
                "total": v.gpus.len(),
                "free": v.gpus.iter().filter(|g| g.is_free()).count(),
                "allocated_milli": allocated,
            });
        }
        Ok(nodes)
    }

    /// Subscribes to updates after `after` (of this view `instance`): what changed
    /// since then first, then the live stream. A sequence number this view cannot
    /// resume from (another instance's, or from before a reload) starts with a reset.
    pub async fn subscribe(
        &self,
        after: Option<u64>,
        instance: Option<&str>,
    ) -> Result<(Vec<Arc<Update>>, broadcast::Receiver<Arc<Update>>), ApiError> {
        self.ensure().await?;
        let v = self.inner.view.read().map_err(poisoned)?;
        // Subscribing under the lock: no update falls between the catch-up and the stream.
        let rx = self.inner.tx.subscribe();
        let Some(after) = after else {
            return Ok((Vec::new(), rx));
        };
        if instance.is_some_and(|i| i != self.inner.instance) || after < v.floor || after > v.seq {
            return Ok((vec![Arc::new(Update::Reset)], rx));
        }
        let mut first: Vec<Arc<Update>> = v
            .views
            .values()
            .filter(|(s, _)| *s > after)
            .map(|(s, n)| {
                Arc::new(Update::Node {
                    seq: *s,
                    view: n.clone(),
                })
            })
            .collect();
        first.extend(v.removed.iter().filter(|(_, s)| **s > after).map(|(n, s)| {
            Arc::new(Update::Removed {
                seq: *s,
                name: n.clone(),
            })
        }));
        if v.frag_seq > after {
            first.push(Arc::new(Update::Fragmentation {
                seq: v.frag_seq,
                models: v.frag.clone(),
            }));
        }
        Ok((first, rx))
    }

    /// The queue tree of `tenant` (deserved shares divided among all tenants' queues).
    pub async fn queues(&self, tenant: &str) -> Result<Vec<view::QueueRow>, ApiError> {
        Ok(self
            .queues_of(|t| t == tenant)
            .await?
            .into_iter()
            .map(|(_, row)| row)
            .collect())
    }

    /// The queue trees of every tenant `keep` admits, with their tenants, the shares
    /// divided once ([`view::queue_rows`]).
    async fn queues_of(
        &self,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<(String, view::QueueRow)>, ApiError> {
        self.ensure().await?;
        let v = self.inner.view.read().map_err(poisoned)?;
        let mut total = Resources::default();
        for (_, n) in v.nodes.values().filter(|(_, n)| !n.unschedulable) {
            total.add_assign_saturating(&n.allocatable);
        }
        let queues: Vec<(&str, &Queue)> = v
            .queues
            .iter()
            .map(|((t, _), (_, q))| (t.as_str(), q))
            .collect();
        let jobs = v
            .jobs
            .iter()
            .map(|((t, n), (_, j))| (t.as_str(), n.as_str(), j));
        Ok(view::queue_rows(&queues, jobs, &total, keep)
            .into_iter()
            .map(|(t, row)| (t.to_string(), row))
            .collect())
    }

    /// The queues, jobs by phase and GPUs held of the tenants `scope` sees, for
    /// `/metrics` ([`crate::metrics::tenants`]).
    pub async fn metric_facts(
        &self,
        scope: &crate::metrics::tenants::Scope,
        facts: &mut crate::metrics::tenants::Facts,
    ) -> Result<(), ApiError> {
        use crate::metrics::tenants::{Amounts, QueueFacts};
        {
            self.ensure().await?;
            let v = self.inner.view.read().map_err(poisoned)?;
            for ((t, _), (_, j)) in v.jobs.iter().filter(|((t, _), _)| scope.sees(t)) {
                *facts
                    .jobs
                    .entry((t.clone(), j.spec.queue.clone(), j.status.phase.clone()))
                    .or_default() += 1;
            }
            for (_, n) in v.views.values() {
                let model = n.model.clone().unwrap_or_else(|| "unknown".into());
                for g in &n.gpus {
                    for (h, milli) in &g.uses {
                        let Some(t) = n.holders.get(*h).and_then(|h| h.tenant.as_ref()) else {
                            continue;
                        };
                        if scope.sees(t) {
                            *facts
                                .gpu_milli
                                .entry((t.clone(), model.clone()))
                                .or_default() += u64::from(*milli);
                        }
                    }
                }
            }
        }
        let amounts = |s: &view::Shown| Amounts {
            cpu: s.cpu_milli as f64 / 1000.0,
            memory_bytes: s.memory as f64,
            gpu: s.gpu_milli as f64 / 1000.0,
        };
        for (tenant, row) in self.queues_of(|t| scope.sees(t)).await? {
            facts.queues.push(QueueFacts {
                tenant,
                queue: row.name,
                deserved: amounts(&row.deserved),
                allocated: amounts(&row.allocated),
                pending: amounts(&row.pending),
            });
        }
        Ok(())
    }
}

fn poisoned<T>(_: T) -> ApiError {
    ApiError::internal("the console's cluster view lock is poisoned")
}

/// Reads nodes, heartbeats, queues and jobs; `seq` continues from a previous view.
async fn load(store: &AnyStore, seq: u64) -> Result<View, ApiError> {
    let mut v = View {
        rev: store.revision().await?,
        seq,
        floor: seq + 1,
        ..View::default()
    };
    let mut dirty = BTreeSet::new();
    for k in [kind::NODE, NODESTATUS, kind::QUEUE, kind::JOB] {
        for o in store.list(k, None).await?.objects {
            v.put(&o, &mut dirty);
        }
    }
    let names: BTreeSet<String> = v.nodes.keys().cloned().collect();
    v.redraw(&names);
    // A fresh view: everything in it is "changed since the floor".
    v.floor = v.seq;
    Ok(v)
}

/// Follows the change log from `rev`, redrawing the nodes each batch touches and
/// sending what changed to the watchers; reads everything again when the log was
/// compacted past it.
async fn follow(inner: Arc<Inner>, mut rev: u64, mut poke: tokio::sync::watch::Receiver<u64>) {
    let mut wake = inner.store.notifier();
    let mut stop = inner.stop.clone();
    loop {
        if *stop.borrow() {
            return;
        }
        wake.mark_unchanged();
        match inner.store.changes(rev, 5000).await {
            Ok(batch) if !batch.is_empty() => {
                rev = batch.last().map_or(rev, |c| c.version());
                let updates = match inner.view.write() {
                    Ok(mut v) => {
                        let mut dirty = BTreeSet::new();
                        for c in &batch {
                            match c.op {
                                ChangeOp::Deleted => v.remove(&c.object, &mut dirty),
                                _ => v.put(&c.object, &mut dirty),
                            }
                        }
                        v.rev = rev;
                        v.redraw(&dirty)
                    }
                    Err(_) => return,
                };
                for u in updates {
                    let _ = inner.tx.send(u);
                }
                continue;
            }
            Ok(_) => {}
            Err(StoreError::Compacted { .. }) => {
                let seq = inner.view.read().map(|v| v.seq).unwrap_or(0);
                match load(&inner.store, seq).await {
                    Ok(mut fresh) => {
                        rev = fresh.rev;
                        if let Ok(r) = inner.reservations.lock() {
                            fresh.set_reservations(r.clone());
                        }
                        if let Ok(mut v) = inner.view.write() {
                            *v = fresh;
                        }
                        let _ = inner.tx.send(Arc::new(Update::Reset));
                    }
                    Err(e) => {
                        tracing::warn!("console: reading the cluster again failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                }
                continue;
            }
            Err(e) => {
                tracing::warn!("console: following the change log failed: {e}");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        }
        tokio::select! {
            _ = wake.changed() => {}
            r = poke.changed() => {
                if r.is_err() {
                    return;
                }
                let res = inner.reservations.lock().map(|r| r.clone()).unwrap_or_default();
                let updates = match inner.view.write() {
                    Ok(mut v) => v.set_reservations(res),
                    Err(_) => return,
                };
                for u in updates {
                    let _ = inner.tx.send(u);
                }
            }
            // Commits by other replicas wake no notifier here.
            _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// How a caller sees the cluster: its own tenant's names, or everyone's for a
/// system admin (not viewing as a tenant).
pub fn viewer(c: &Caller) -> Viewer {
    Viewer {
        tenant: c.tenant.clone(),
        all: c.tenant == SYSTEM_TENANT && c.role >= Role::Admin,
    }
}

/// `X-Tessera-Tenant: NAME` from an admin of the system tenant: the request acts as a
/// viewer in tenant NAME (read only: every write needs more than the viewer role).
/// Anyone else sending it is refused, so the header never widens what a key may do
/// by accident.
pub async fn view_as(
    plane: &ControlPlane,
    c: Caller,
    header: Option<&HeaderValue>,
) -> Result<Caller, ApiError> {
    let Some(h) = header else {
        return Ok(c);
    };
    let name = h.to_str().unwrap_or("").trim();
    if c.session().is_some() || c.tenant != SYSTEM_TENANT || c.role < Role::Admin {
        return Err(ApiError::forbidden(format!(
            "the X-Tessera-Tenant header is for admins of the system tenant {SYSTEM_TENANT:?}; \
             {:?} is {} in tenant {:?}: send the request without it",
            c.subject,
            c.role.as_str(),
            c.tenant
        )));
    }
    if name == SYSTEM_TENANT {
        return Ok(c);
    }
    crate::plane::check_name("X-Tessera-Tenant", name)?;
    if plane
        .store()
        .get(&Key::new(kind::TENANT, "", name))
        .await?
        .is_none()
    {
        return Err(ApiError::invalid(
            "X-Tessera-Tenant",
            format!("no tenant {name:?}: list them with GET /v1/tenants"),
        ));
    }
    Ok(Caller {
        tenant: name.to_string(),
        role: Role::Viewer,
        ..c
    })
}

#[derive(Serialize)]
struct GpusReply<'a> {
    /// Resume the watch from here: `/v1/cluster/watch?after=SEQ&instance=INSTANCE`.
    seq: u64,
    instance: &'a str,
    viewer: &'a Viewer,
    nodes: Vec<std::borrow::Cow<'a, NodeView>>,
    fragmentation: &'a [ModelSummary],
    unreadable_jobs: usize,
}

impl Serialize for Viewer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        json!({"tenant": self.tenant, "all_tenants": self.all}).serialize(s)
    }
}

async fn gpus(State(a): State<App>, c: Caller) -> R {
    c.require(Role::Viewer)?;
    let snap = a.cluster.snapshot().await?;
    let v = viewer(&c);
    let body = serde_json::to_vec(&GpusReply {
        seq: snap.seq,
        instance: &snap.instance,
        viewer: &v,
        nodes: snap.nodes.iter().map(|n| n.for_viewer(&v)).collect(),
        fragmentation: &snap.fragmentation,
        unreadable_jobs: snap.unreadable,
    })
    .map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchQuery {
    #[serde(default)]
    after: Option<u64>,
    #[serde(default)]
    instance: Option<String>,
}

fn event(u: &Update, v: &Viewer) -> Event {
    match u {
        Update::Node { seq, view } => Event::default()
            .event("node")
            .id(seq.to_string())
            .data(serde_json::to_string(&view.for_viewer(v)).unwrap_or_default()),
        Update::Removed { seq, name } => Event::default()
            .event("removed")
            .id(seq.to_string())
            .data(json!({ "name": name }).to_string()),
        Update::Fragmentation { seq, models } => Event::default()
            .event("fragmentation")
            .id(seq.to_string())
            .data(json!({ "models": &**models }).to_string()),
        Update::Reset => Event::default().event("reset").data("{}"),
    }
}

async fn watch(
    State(a): State<App>,
    c: Caller,
    Q(q): Q<WatchQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    c.require(Role::Viewer)?;
    let v = viewer(&c);
    let (first, rx) = a.cluster.subscribe(q.after, q.instance.as_deref()).await?;
    let live = stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(u) => Some((u, rx)),
            // Fell behind: the client lists again, then resumes.
            Err(broadcast::error::RecvError::Lagged(_)) => Some((Arc::new(Update::Reset), rx)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    });
    let s = stream::iter(first)
        .chain(live)
        .map(move |u| Ok(event(&u, &v)));
    Ok(Sse::new(s).keep_alive(KeepAlive::default()))
}

async fn queues(State(a): State<App>, c: Caller) -> R {
    c.require(Role::Viewer)?;
    let rows = a.cluster.queues(&c.tenant).await?;
    ok(json!({ "items": rows }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    object: String,
}

async fn events(State(a): State<App>, c: Caller, Q(q): Q<EventsQuery>) -> R {
    let all = a.plane.list_events(&c).await?;
    items(
        all.into_iter()
            .filter(|e| e.get("object").and_then(Value::as_str) == Some(q.object.as_str()))
            .collect(),
    )
}

routes! {
    ROUTES, routes;
    get "/v1/cluster/gpus" gpus "Every node's GPUs as the console draws them (who holds each, fractions, MIG instances, reservations, conditions; other tenants' tasks without names) and the per-model fragmentation summary" None, 200;
    get "/v1/cluster/watch" watch "Changes of /v1/cluster/gpus as server-sent events (?after=SEQ&instance=ID from its reply): `node` (one node, as listed), `removed`, `fragmentation`, `reset` (list again)" None, 200;
    get "/v1/cluster/queues" queues "The caller's queue tree: deserved, allocated and pending resources per queue, and its pending jobs with their reasons" None, 200;
    get "/v1/cluster/events" events "The events of one object (?object=job/NAME), oldest first" None, 200;
}

/// Response schemas of this module, for the OpenAPI document.
pub fn schemas() -> Vec<(&'static str, Value)> {
    let shown = json!({"type": "object", "properties": {
        "cpu_milli": {"type": "integer"}, "memory": {"type": "integer"}, "gpu_milli": {"type": "integer"}}});
    vec![
        (
            "ClusterGpus",
            json!({"type": "object", "description": "GET /v1/cluster/gpus", "properties": {
                "seq": {"type": "integer", "description": "resume /v1/cluster/watch from here"},
                "instance": {"type": "string", "description": "the view instance the sequence number belongs to"},
                "viewer": {"type": "object", "properties": {"tenant": {"type": "string"}, "all_tenants": {"type": "boolean"}}},
                "nodes": {"type": "array", "items": {"$ref": "#/components/schemas/NodeView"}},
                "fragmentation": {"type": "array", "items": {"$ref": "#/components/schemas/ModelSummary"}},
                "unreadable_jobs": {"type": "integer"}}}),
        ),
        (
            "NodeView",
            json!({"type": "object", "properties": {
                "name": {"type": "string"}, "model": {"type": "string"}, "gpu_memory": {"type": "integer"},
                "net": {"type": "array", "items": {"type": "string"}, "description": "network-tier domains, bottom up (rack, spine)"},
                "labels": {"type": "object"}, "unschedulable": {"type": "boolean"},
                "taints": {"type": "array", "items": {"type": "string"}},
                "conditions": {"type": "array", "items": {"type": "object", "properties": {
                    "kind": {"type": "string"}, "reason": {"type": "string"}, "message": {"type": "string"}}}},
                "cpu_milli": {"type": "integer"}, "cpu_used": {"type": "integer"},
                "gpus": {"type": "array", "items": {"type": "object", "properties": {
                    "index": {"type": "integer"}, "nvlink": {"type": "integer"},
                    "uses": {"type": "array", "description": "[holder index, milli-GPU] pairs"},
                    "slices": {"type": "integer", "description": "memory slices, when MIG is on"},
                    "mig": {"type": "array", "items": {"type": "object", "properties": {
                        "profile": {"type": "string"}, "start": {"type": "integer"}, "size": {"type": "integer"},
                        "holder": {"type": "integer"}, "busy": {"type": "boolean"}}}},
                    "reserved": {"type": "integer", "description": "index into reservations"}}}},
                "holders": {"type": "array", "items": {"type": "object", "properties": {
                    "tenant": {"type": ["string", "null"]}, "job": {"type": ["string", "null"]}, "task": {"type": ["string", "null"]},
                    "since": {"type": "integer"}, "kind": {"type": "string", "enum": ["whole", "share", "mig", "cpu"]},
                    "state": {"type": "string"}, "other": {"type": "boolean"}}}},
                "reservations": {"type": "array", "items": {"type": "object", "properties": {
                    "tenant": {"type": ["string", "null"]}, "job": {"type": ["string", "null"]},
                    "reason": {"type": ["string", "null"]}, "whole_node": {"type": "boolean"}, "other": {"type": "boolean"}}}}}}),
        ),
        (
            "ModelSummary",
            json!({"type": "object", "properties": {
                "model": {"type": "string"}, "nodes": {"type": "integer"}, "gpus": {"type": "integer"},
                "free": {"type": "integer"}, "shared": {"type": "integer"}, "mig": {"type": "integer"},
                "reserved": {"type": "integer"}, "full": {"type": "integer"},
                "blocks": {"type": "array", "description": "[free GPUs on a node, nodes with that many] pairs"},
                "text": {"type": "string"}}}),
        ),
        (
            "QueueRow",
            json!({"type": "object", "properties": {
                "name": {"type": "string"}, "parent": {"type": "string"}, "depth": {"type": "integer"},
                "weight": {"type": "integer"}, "reclaimable": {"type": "boolean"},
                "guarantee": shown, "capability": shown, "deserved": shown, "allocated": shown, "pending": shown,
                "running_jobs": {"type": "integer"}, "pending_jobs": {"type": "integer"},
                "waiting": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "priority": {"type": "integer"}, "created_at": {"type": "integer"},
                    "admitted": {"type": "boolean"}, "reason": {"type": "string"}, "asks": shown}}}}}),
        ),
    ]
}
