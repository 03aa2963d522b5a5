//! The controller: watch -> cache -> decide -> apply.
//!
//! * **watch** (`controller/watch.rs`): one watcher per kind (Nodes, Pods,
//!   PriorityClasses, PodDisruptionBudgets, Leases are read by the elector;
//!   PodGroups and Queues of Tessera, Volcano and scheduler-plugins, one
//!   generic watcher for each flavour, [`crate::gang`]; NodeShards; Volcano's
//!   HyperNodes; ResourceSlices and ResourceClaims), each turning events into
//!   small changes to [`State`]. Optional APIs are watched only where the
//!   server serves them ([`discover`], `controller/discover.rs`).
//! * **cache**: [`State`] translates each object once, when it changes.
//! * **decide** (`controller/cycle.rs`, the loop): the batch scheduler
//!   (`tessera_sched::schedule`) over the snapshot, on a blocking thread, and
//!   the agent scheduler for agent pods on the agent shard. Pure.
//! * **apply** (`controller/apply.rs`, each write through `controller/write.rs`):
//!   evictions through the Eviction API (PDBs checked first, and the server
//!   enforces them too), device assignments (DRA claim allocations, GPU index
//!   and MIG instance annotations; plans that would create MIG instances are
//!   held back, [`crate::translate::mig::hold_reconfigurations`]), bindings
//!   through the `binding` subresource, all with bounded concurrency. Bindings
//!   are pipelined: a planned pod is assumed on its node at once and its write
//!   goes on in the background while the next cycle decides (a failed write
//!   forgets it). Then pending reasons (`PodScheduled=False` and an event),
//!   PodGroup and NodeShard status. Every write first checks that this replica
//!   still leads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use kube::Client;
use tokio::sync::mpsc;

use crate::gang::Flavour;
use crate::leader::{self, Leadership, LeaseConfig};
use crate::state::{PodKey, State};

mod apply;
mod cycle;
mod discover;
mod watch;
mod write;

pub use discover::{Served, discover};
use watch::Watchers;
use write::Writer;
pub use write::bind_once;

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
    let (watchers, need) = Watchers::start(client.clone(), tx.clone(), &served);
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
