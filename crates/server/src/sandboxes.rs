//! Sandboxes: create, commands, files, timeout, pause/resume, kill (issue 6), with
//! names familiar to E2B users (`POST /v1/sandboxes` is `Sandbox.create`, `commands`
//! is `commands.run`, `files` is `files.read/write/list/remove`, `timeout` is
//! `setTimeout`, `pause` is `betaPause`, `auto_pause` is `autoPause`, `DELETE` is
//! `kill`).
//!
//! A pause is to disk (issue 18): the sandbox is snapshotted into the node's data
//! folder (`sandbox-snapshots/ID`, root's alone) and its processes and memory are
//! freed, its room on the node given back; `resume` places it again and restores it
//! (the namespace tier keeps its writable folders, the micro-VM tier its whole
//! machine). With `auto_pause` its timeout pauses it instead of killing it. A paused
//! sandbox lives until killed, across restarts of the server too ([`kept`]); running
//! ones end with the server.
//!
//! This module owns its state ([`SandboxesState`]), its configuration
//! ([`SandboxesConfig`], a field of [`crate::ServerConfig`]), its routes and its
//! OpenAPI schemas; handlers only translate between HTTP and `tessera-sandbox`, whose
//! calls block and so run on tokio's blocking threads.
//!
//! Every sandbox belongs to the tenant that made it: another tenant gets 404 for it,
//! as for any object. Creating, running and file operations need the developer role;
//! listing and reading a sandbox's record need viewer. Off unless the server is
//! started with sandboxes enabled (`tessera up --sandboxes`): a sandbox runs code on
//! the server's own machine, and needs root (or unprivileged user namespaces).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{Value, json};
use tessera_sandbox::{
    AnySandbox, EgressPolicy, ExecRequest, FileError, InitProgram, Isolated, LifecycleError,
    Network, PauseOptions, PoolConfig, Runtime, RuntimeConfig, SandboxSpec, TarLimits, Tier,
    TierKind, WarmPool,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::StartError;
use crate::api::{App, Body, Q};
use crate::auth::Role;
use crate::plane::{Caller, ControlPlane};
use crate::problem::{ApiError, Code};

mod bodies;
mod cap;
mod feed;
mod files;
mod kept;
use bodies::{CommandResult, exec_error, file_error};
pub use bodies::{NewSandbox, PathQuery, SandboxCommand, SandboxTimeout, schemas};
use files::*;

/// The kind `/v1/watch` follows this module's feed for.
pub const WATCH_KIND: &str = "sandbox";

/// Lifetime of a sandbox when the create call names none (E2B's default too).
pub const DEFAULT_TIMEOUT_S: u64 = 300;
/// Longest lifetime a sandbox may be given.
pub const MAX_TIMEOUT_S: u64 = 24 * 3600;
/// Sandboxes one tenant may hold at once, unless configured.
pub const DEFAULT_MAX_PER_TENANT: usize = 32;
/// Default and longest command timeouts, in seconds.
pub const DEFAULT_COMMAND_TIMEOUT_S: f64 = 60.0;
pub const MAX_COMMAND_TIMEOUT_S: f64 = 3600.0;

/// Largest tar archive `files/tar` accepts or sends (its unpacked size may be up to
/// [`TarLimits::default`]'s).
pub const MAX_ARCHIVE_BYTES: u64 = 256 << 20;

/// Settings for this module, from `tessera up` flags.
#[derive(Clone, Default)]
pub struct SandboxesConfig {
    /// Serve `/v1/sandboxes` (off by default: see the module docs).
    pub enabled: bool,
    /// The sandboxes' init program; `None`: `tessera-sandbox-init` next to this program.
    pub init: Option<InitProgram>,
    /// Sandboxes one tenant may hold; 0 means [`DEFAULT_MAX_PER_TENANT`].
    pub max_per_tenant: usize,
    /// Sandboxes of the base template kept ready (a warm pool); 0 for none.
    pub warm: usize,
}

impl std::fmt::Debug for SandboxesConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxesConfig")
            .field("enabled", &self.enabled)
            .field("init", &self.init)
            .field("max_per_tenant", &self.max_per_tenant)
            .field("warm", &self.warm)
            .finish()
    }
}

struct Entry {
    id: String,
    tenant: String,
    template: String,
    /// Its runtime class, as decided at create (the tier is the sandbox's `kind`).
    class: String,
    sandbox: Arc<AnySandbox>,
    started: SystemTime,
    /// When the sandbox is killed (or, with `auto_pause`, paused) unless its timeout
    /// is changed; and the timeout's length, counted again from a resume.
    end_at: Mutex<(Instant, SystemTime, Duration)>,
    /// Its timeout pauses it to disk instead of killing it (E2B's `autoPause`).
    auto_pause: bool,
    metadata: BTreeMap<String, String>,
    /// The agent scheduler's decision while it runs (none while paused); given back
    /// when it pauses or the entry goes.
    placed: Mutex<Option<(Arc<crate::placement::Placer>, crate::placement::Placement)>>,
    /// Pause and resume of this sandbox, one at a time (with its placement).
    lifecycle: tokio::sync::Mutex<()>,
    /// The number of its last change on the feed (its `resource_version`).
    version: std::sync::atomic::AtomicU64,
}

impl Entry {
    /// Gives its room on the node back (it paused, or goes).
    fn release(&self) {
        if let Some((p, at)) = self.placed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            p.release(&at);
        }
    }

    /// Starts its time again (created, resumed, or given a new timeout).
    fn restart_clock(&self, t: Duration) {
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner()) =
            (Instant::now() + t, SystemTime::now() + t, t);
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.release();
    }
}

struct Inner {
    rt: Arc<Runtime>,
    pool: Option<WarmPool>,
    base: SandboxSpec,
    /// The server's template registry (`None`: only `host`).
    templates: Option<tessera_sandbox::TemplateRegistry>,
    max_per_tenant: usize,
    /// The listed sandboxes; every change to them is on `feed`.
    all: Mutex<feed::Listed>,
    feed: Arc<feed::Feed>,
    /// Creates in flight per tenant, counted against the cap ([`cap`]).
    creating: cap::Creating,
    /// The agent scheduler's nodes for sandboxes.
    placer: Arc<crate::placement::Placer>,
    /// The micro-VM tier, where this server runs one (`tessera up --vm-kernel`).
    microvm: Option<Arc<tessera_sandbox::vm::MicroVmTier>>,
    /// The namespace tier over `rt`: what restores its sandboxes' snapshots.
    namespace: Arc<dyn Tier>,
    /// Where paused sandboxes' snapshots go (root's alone, emptied at start).
    snapshots: std::path::PathBuf,
    /// Turns true when the server stops (ends the watchers' streams).
    stop: watch::Receiver<bool>,
}

/// What the handlers of this module share.
#[derive(Clone, Default)]
pub struct SandboxesState {
    /// `None`: sandboxes are off on this server.
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for SandboxesState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxesState")
            .field("enabled", &self.inner.is_some())
            .finish()
    }
}

impl SandboxesState {
    /// Listed sandboxes by (tenant, state, runtime class), for `/metrics`.
    pub fn counts(&self) -> std::collections::BTreeMap<(String, String, String), u64> {
        let mut out = std::collections::BTreeMap::new();
        if let Some(inner) = &self.inner {
            for e in inner.lock().values() {
                let state = json!(e.sandbox.phase())
                    .as_str()
                    .unwrap_or("unknown")
                    .to_string();
                *out.entry((e.tenant.clone(), state, e.class.clone()))
                    .or_default() += 1;
            }
        }
        out
    }

    /// Starts this module: its state and any background tasks, which end when
    /// `stop` turns true.
    pub(crate) async fn start(
        plane: &ControlPlane,
        cfg: &SandboxesConfig,
        stop: &watch::Receiver<bool>,
        nodes: Vec<(String, tessera_sched::agent::Demand)>,
        microvm: Option<Arc<tessera_sandbox::vm::MicroVmTier>>,
        snapshots: std::path::PathBuf,
    ) -> Result<(Self, Vec<JoinHandle<()>>), StartError> {
        if !cfg.enabled {
            return Ok((Self::default(), Vec::new()));
        }
        let fail = |message: String| StartError::Component {
            what: "sandboxes",
            message,
        };
        let rt = Runtime::new(RuntimeConfig {
            init: cfg.init.clone(),
            cgroups: true,
            // The server's guard: the operator's floor and each tenant's policy.
            guard: plane.guard().clone(),
            tenant: None,
            cgroup_backend: None,
            egress: None,
        })
        .map_err(|e| fail(e.to_string()))?;
        let base = SandboxSpec::default();
        // One sandbox up front: a host that cannot make sandboxes says so at start.
        let probe = rt.spawn(&base).map_err(|e| {
            fail(format!(
                "cannot create a sandbox on this machine ({e}); run as root, or start without --sandboxes"
            ))
        })?;
        let _ = probe.destroy();
        // The folder is root's alone (it holds tenants' files); the paused sandboxes
        // of an earlier run in it are listed again below.
        {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&snapshots)
                .and_then(|()| {
                    std::fs::set_permissions(&snapshots, std::fs::Permissions::from_mode(0o700))
                })
                .map_err(|e| fail(format!("{}: {e}", snapshots.display())))?;
        }
        let pool = (cfg.warm > 0).then(|| {
            WarmPool::new(
                rt.clone(),
                base.clone(),
                PoolConfig {
                    min: cfg.warm,
                    max: cfg.warm.max(64),
                    ..PoolConfig::default()
                },
            )
        });
        let namespace: Arc<dyn Tier> = Arc::new(tessera_sandbox::NamespaceTier::new(rt.clone()));
        let feed = Arc::new(feed::Feed::default());
        let inner = Arc::new(Inner {
            rt,
            pool,
            base,
            templates: plane.templates().cloned(),
            max_per_tenant: if cfg.max_per_tenant == 0 {
                DEFAULT_MAX_PER_TENANT
            } else {
                cfg.max_per_tenant
            },
            all: Mutex::new(feed::Listed::new(feed.clone())),
            feed,
            creating: Mutex::new(HashMap::new()),
            placer: Arc::new(crate::placement::Placer::new(nodes)),
            microvm,
            namespace,
            snapshots,
            stop: stop.clone(),
        });
        kept::relist(&inner);
        let task = tokio::spawn(reap_expired(inner.clone(), stop.clone()));
        Ok((Self { inner: Some(inner) }, vec![task]))
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, feed::Listed> {
        self.all.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes that `e` changed (paused, resumed, a new timeout).
    fn changed(&self, e: &Entry) {
        feed::changed(&self.feed, e, feed::Op::Updated);
    }

    /// The caller's sandbox `id`; another tenant's is "not found", like a missing one.
    fn get(&self, c: &Caller, id: &str) -> Result<Arc<Entry>, ApiError> {
        match self.lock().get(id) {
            Some(e) if e.tenant == c.tenant => Ok(e.clone()),
            _ => Err(ApiError::not_found(format!("sandbox {id:?}"))),
        }
    }
}

/// Kills sandboxes whose time is up, once a second; kills all of them at shutdown.
async fn reap_expired(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let now = Instant::now();
        let due: Vec<Arc<Entry>> = {
            let mut all = inner.lock();
            let ids: Vec<String> = all
                .values()
                .filter(|e| {
                    !e.sandbox.is_paused()
                        && e.end_at.lock().unwrap_or_else(|p| p.into_inner()).0 <= now
                })
                .map(|e| e.id.clone())
                .collect();
            // Those that pause stay listed; the others go.
            ids.iter()
                .filter_map(|id| match all.get(id) {
                    Some(e) if e.auto_pause => Some(e.clone()),
                    _ => all.remove(id),
                })
                .collect()
        };
        for e in due {
            if e.auto_pause {
                // Not picked again while the pause runs (it takes up to the drain);
                // the timeout's length stays, for the resume.
                e.end_at.lock().unwrap_or_else(|p| p.into_inner()).0 =
                    Instant::now() + Duration::from_secs(MAX_TIMEOUT_S);
                let i2 = inner.clone();
                tokio::spawn(async move {
                    if let Err(err) = pause_entry(&i2, &e).await {
                        // Its time is up and it cannot be kept: it goes, as without
                        // auto_pause.
                        tracing::warn!(
                            "sandbox {}: auto-pause at its timeout failed ({err}); killing it",
                            e.id
                        );
                        i2.lock().remove(&e.id);
                        kept::forget(&i2.snapshots, &e.id);
                        let _ = tokio::task::spawn_blocking(move || e.sandbox.destroy()).await;
                    }
                });
            } else {
                let _ = tokio::task::spawn_blocking(move || e.sandbox.destroy()).await;
            }
        }
    }
    // Running sandboxes end with the server; paused ones stay on disk for the next.
    let rest: Vec<Arc<Entry>> = inner
        .lock()
        .drain()
        .into_iter()
        .filter(|e| !e.sandbox.is_paused())
        .collect();
    let _ = tokio::task::spawn_blocking(move || {
        for e in rest {
            let _ = e.sandbox.destroy();
        }
    })
    .await;
}

/// `GET /v1/watch?kind=sandbox`: the caller's sandboxes' changes after `after` (from
/// now without), as server-sent events; 410 when `after` is not one this feed has.
pub(crate) fn watch(
    a: &App,
    c: &Caller,
    after: Option<u64>,
) -> Result<impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + use<>, ApiError> {
    c.require(Role::Viewer)?;
    let inner = enabled(a)?;
    let after = match after {
        Some(n) => {
            inner.feed.since(n, &c.tenant).map_err(feed::gone)?;
            n
        }
        None => inner.feed.last(),
    };
    Ok(feed::events(
        inner.feed.clone(),
        c.tenant.clone(),
        after,
        inner.stop.clone(),
    ))
}

fn enabled(a: &App) -> Result<Arc<Inner>, ApiError> {
    a.sandboxes.inner.clone().ok_or_else(|| {
        ApiError::new(
            Code::NotFound,
            "sandboxes are off on this server; start it with `tessera up --sandboxes`",
        )
    })
}

/// Runs blocking sandbox work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("sandbox task: {e}")))
}

/// What every file route does around its operation: the caller's own sandbox
/// (as a developer), `op` on a blocking thread with the query's path, and its
/// error naming sandbox and path.
async fn file_op<T: Send + 'static>(
    a: &App,
    c: &Caller,
    id: &str,
    path: &str,
    op: impl FnOnce(&AnySandbox, &str) -> Result<T, FileError> + Send + 'static,
) -> Result<T, ApiError> {
    c.require(Role::Developer)?;
    let e = enabled(a)?.get(c, id)?;
    let p = path.to_string();
    blocking(move || op(&e.sandbox, &p))
        .await?
        .map_err(|err| file_error(id, path, err))
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn info(e: &Entry) -> Value {
    let end = e.end_at.lock().unwrap_or_else(|p| p.into_inner()).1;
    let spec = e.sandbox.spec();
    // `pausing` and `paused` (on disk), `resuming`, `running`.
    let phase = e.sandbox.phase();
    let paused = matches!(
        phase,
        tessera_sandbox::Phase::Pausing | tessera_sandbox::Phase::Paused
    );
    json!({
        "sandbox_id": e.id,
        // As every watched object has them (`/v1/watch?kind=sandbox`).
        "name": e.id,
        "resource_version": e.version.load(std::sync::atomic::Ordering::Relaxed),
        "template": e.template,
        "runtime_class": e.class,
        "tier": e.sandbox.tier(),
        "state": phase,
        "auto_pause": e.auto_pause,
        "started_at": unix(e.started),
        // A paused sandbox has no end: it waits for resume or kill.
        "end_at": (!paused).then(|| unix(end)),
        "metadata": e.metadata,
        // Nor a node (its room is given back right after the snapshot is written).
        "node": e
            .placed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|_| !paused)
            .map(|(_, p)| p.node.clone()),
        "limits": {
            "memory_bytes": spec.limits.memory_bytes,
            "cpu_millis": spec.limits.cpu_millis,
            "pids": spec.limits.pids,
            "disk_bytes": spec.limits.disk_bytes,
        },
        "network": match &spec.network {
            Network::None => json!({"mode": "none"}),
            Network::Proxy(p) => json!({"mode": "proxy", "allow_domains": p.allow_domains}),
        },
    })
}

// ------------------------------------------------------------------ handlers

fn spec_for(
    inner: &Inner,
    b: &NewSandbox,
    who: &tessera_sandbox::trust::Subject<'_>,
) -> Result<(SandboxSpec, String), ApiError> {
    let mut spec = inner.base.clone();
    let name = b.template.clone().unwrap_or_else(|| "base".into());
    // A registered template by name (or name@digest), never a host path, and one the
    // trust policy admits for this tenant and class.
    let (template, _digest) =
        tessera_sandbox::registry::resolve_in(inner.templates.as_ref(), &name, who)
            .map_err(|e| crate::plane::template_error("template", e))?;
    spec.template = template;
    if let Some(m) = b.memory_mb {
        if m == 0 || m > 1 << 20 {
            return Err(ApiError::invalid("memory_mb", "between 1 and 1048576"));
        }
        spec.limits.memory_bytes = Some(m << 20);
    }
    if let Some(c) = b.cpus {
        if !(c.is_finite() && c > 0.0 && c <= 1024.0) {
            return Err(ApiError::invalid("cpus", "between 0 and 1024"));
        }
        spec.limits.cpu_millis = Some((c * 1000.0).round().max(1.0) as u32);
    }
    if let Some(p) = b.pids {
        if p == 0 {
            return Err(ApiError::invalid("pids", "at least 1"));
        }
        spec.limits.pids = Some(p);
    }
    if let Some(d) = b.disk_mb {
        if d == 0 || d > 1 << 20 {
            return Err(ApiError::invalid("disk_mb", "between 1 and 1048576"));
        }
        spec.limits.disk_bytes = d << 20;
    }
    for (k, v) in &b.env_vars {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(ApiError::invalid(
                format!("env_vars.{k}"),
                "a name without `=` or NUL",
            ));
        }
        spec.env.push((k.clone(), v.clone()));
    }
    if !b.allow_domains.is_empty() {
        spec.network = Network::Proxy(EgressPolicy {
            allow_domains: b.allow_domains.clone(),
            allow_private: false,
        });
    }
    Ok((spec, name))
}

fn new_id() -> String {
    let mut b = [0u8; 12];
    let _ = getrandom::fill(&mut b);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("sbx_{hex}")
}

async fn create(
    State(a): State<App>,
    c: Caller,
    Body(b): Body<NewSandbox>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    c.require(Role::Developer)?;
    let inner = enabled(&a)?;
    let timeout = b.timeout.unwrap_or(DEFAULT_TIMEOUT_S);
    if timeout == 0 || timeout > MAX_TIMEOUT_S {
        return Err(ApiError::invalid(
            "timeout",
            format!("seconds between 1 and {MAX_TIMEOUT_S}"),
        ));
    }
    let decided = a.plane.classes().decide(
        &c.tenant,
        "runtime_class",
        b.runtime_class.as_deref(),
        false,
    )?;
    let (spec, template) = spec_for(
        &inner,
        &b,
        &tessera_sandbox::trust::Subject::new(&c.tenant, &decided.class),
    )?;
    if decided.tier == TierKind::Microvm && inner.microvm.is_none() {
        return Err(ApiError::new(
            Code::Conflict,
            format!(
                "runtime class `{}` runs in a micro-VM, and this server has no micro-VM tier: start it with --vm-kernel DIR (see docs/sandbox.md)",
                decided.class
            ),
        ));
    }
    let seat = cap::take_seat(&inner, &c.tenant)?;
    let placement = inner
        .placer
        .place(demand(&spec))
        .map_err(|why| ApiError::new(Code::QuotaExceeded, why))?;
    let i2 = inner.clone();
    let tenant = c.tenant.clone();
    let tier = decided.tier;
    let spawned = blocking(move || -> Result<Box<dyn Isolated>, String> {
        match (tier, &i2.pool, &i2.microvm) {
            (TierKind::Microvm, _, Some(vm)) => vm
                .spawn_vm(&spec)
                .map(|v| Box::new(v) as Box<dyn Isolated>)
                .map_err(|e| e.to_string()),
            (_, Some(p), _) if spec == i2.base => p
                .claim()
                .map(|s| Box::new(s) as Box<dyn Isolated>)
                .map_err(|e| e.to_string()),
            _ => i2
                .rt
                .spawn(&spec)
                .map(|s| Box::new(s) as Box<dyn Isolated>)
                .map_err(|e| e.to_string()),
        }
    })
    .await;
    let sb = match spawned {
        Ok(Ok(sb)) => sb,
        other => {
            inner.placer.release(&placement);
            return Err(match other {
                Err(e) => e,
                Ok(Err(e)) => ApiError::internal(format!("creating the sandbox: {e}")),
                Ok(Ok(_)) => unreachable!(),
            });
        }
    };
    let restorer: Arc<dyn Tier> = match (tier, &inner.microvm) {
        (TierKind::Microvm, Some(vm)) => vm.clone(),
        _ => inner.namespace.clone(),
    };
    let mut sb = AnySandbox::wrap(restorer, sb);
    sb.set_tenant(Some(tenant.clone()));
    let now = SystemTime::now();
    let t = Duration::from_secs(timeout);
    let e = Arc::new(Entry {
        id: new_id(),
        tenant,
        template,
        class: decided.class,
        sandbox: Arc::new(sb),
        started: now,
        end_at: Mutex::new((Instant::now() + t, now + t, t)),
        auto_pause: b.auto_pause,
        metadata: b.metadata,
        placed: Mutex::new(Some((inner.placer.clone(), placement))),
        lifecycle: tokio::sync::Mutex::new(()),
        version: Default::default(),
    });
    inner.lock().insert(e.clone());
    // Listed: it counts as a sandbox now, not as a create in flight.
    drop(seat);
    Ok((StatusCode::CREATED, Json(info(&e))))
}

async fn list(State(a): State<App>, c: Caller) -> Result<Json<Value>, ApiError> {
    c.require(Role::Viewer)?;
    let inner = enabled(&a)?;
    let mut items: Vec<(f64, Value)> = inner
        .lock()
        .values()
        .filter(|e| e.tenant == c.tenant)
        .map(|e| (unix(e.started), info(e)))
        .collect();
    items.sort_by(|x, y| x.0.total_cmp(&y.0));
    Ok(Json(
        json!({"items": items.into_iter().map(|x| x.1).collect::<Vec<_>>()}),
    ))
}

async fn get_one(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    c.require(Role::Viewer)?;
    let inner = enabled(&a)?;
    let e = inner.get(&c, &id)?;
    Ok(Json(info(&e)))
}

async fn kill(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    c.require(Role::Developer)?;
    let inner = enabled(&a)?;
    let e = inner.get(&c, &id)?;
    inner.lock().remove(&id);
    kept::forget(&inner.snapshots, &id);
    blocking(move || e.sandbox.destroy())
        .await?
        .map_err(|err| ApiError::internal(format!("destroying sandbox {id:?}: {err}")))?;
    Ok(Json(json!({"sandbox_id": id, "killed": true})))
}

async fn set_timeout(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    Body(b): Body<SandboxTimeout>,
) -> Result<Json<Value>, ApiError> {
    c.require(Role::Developer)?;
    let inner = enabled(&a)?;
    if b.timeout == 0 || b.timeout > MAX_TIMEOUT_S {
        return Err(ApiError::invalid(
            "timeout",
            format!("seconds between 1 and {MAX_TIMEOUT_S}"),
        ));
    }
    let e = inner.get(&c, &id)?;
    e.restart_clock(Duration::from_secs(b.timeout));
    inner.changed(&e);
    Ok(Json(info(&e)))
}

/// What a sandbox of `spec` takes on its node.
fn demand(spec: &SandboxSpec) -> tessera_sched::agent::Demand {
    tessera_sched::agent::Demand::new(
        u64::from(spec.limits.cpu_millis.unwrap_or(0)),
        spec.limits.memory_bytes.unwrap_or(0),
    )
}

fn lifecycle_error(id: &str, what: &str, e: LifecycleError) -> ApiError {
    match e {
        LifecycleError::State { why, .. } => ApiError::new(
            Code::Conflict,
            format!("sandbox {id:?} cannot {what}: {why}"),
        ),
        other => ApiError::internal(format!("sandbox {id:?}: {what}: {other}")),
    }
}

/// Pauses `e` to disk (its snapshot under the server's snapshot folder) and gives
/// its room on the node back. A paused one stays as it is.
async fn pause_entry(inner: &Arc<Inner>, e: &Arc<Entry>) -> Result<(), ApiError> {
    let _one = e.lifecycle.lock().await;
    let (sb, dir) = (e.sandbox.clone(), inner.snapshots.join(&e.id));
    let r = blocking(move || sb.pause_to_disk(&dir, &PauseOptions::default())).await;
    // Paused or not, watchers see its state now.
    inner.changed(e);
    r?.map_err(|err| lifecycle_error(&e.id, "pause", err))?;
    e.release();
    if let Err(err) = kept::write(&inner.snapshots, e) {
        // Paused all the same, until this server stops.
        tracing::warn!(
            "sandbox {}: paused, but its record could not be written ({err}); it will not outlive this server",
            e.id
        );
    }
    Ok(())
}

/// Places `e` on a node again and restores it from its snapshot; its timeout counts
/// from now. A running one stays as it is.
async fn resume_entry(inner: &Arc<Inner>, e: &Arc<Entry>) -> Result<(), ApiError> {
    let _one = e.lifecycle.lock().await;
    if !e.sandbox.is_paused() {
        return Ok(());
    }
    let placement = inner
        .placer
        .place(demand(&e.sandbox.spec()))
        .map_err(|why| ApiError::new(Code::QuotaExceeded, format!("resuming: {why}")))?;
    *e.placed.lock().unwrap_or_else(|p| p.into_inner()) = Some((inner.placer.clone(), placement));
    // Its clock starts before it runs: the reaper must never see it running with the
    // end it had before the pause (a sandbox listed again after a restart has none).
    let t = e.end_at.lock().unwrap_or_else(|p| p.into_inner()).2;
    e.restart_clock(t);
    let sb = e.sandbox.clone();
    let r = blocking(move || sb.resume()).await;
    if !matches!(r, Ok(Ok(()))) {
        e.release();
    }
    if let Err(err) = r?.map_err(|err| lifecycle_error(&e.id, "resume", err)) {
        inner.changed(e);
        return Err(err);
    }
    // Running again: it ends with this server (a stale snapshot must not come back).
    kept::forget(&inner.snapshots, &e.id);
    e.restart_clock(t);
    inner.changed(e);
    Ok(())
}

async fn pause_or_resume(
    a: App,
    c: Caller,
    id: String,
    pause: bool,
) -> Result<Json<Value>, ApiError> {
    c.require(Role::Developer)?;
    let inner = enabled(&a)?;
    let e = inner.get(&c, &id)?;
    if pause {
        pause_entry(&inner, &e).await?;
    } else {
        resume_entry(&inner, &e).await?;
    }
    Ok(Json(info(&e)))
}

async fn pause(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    pause_or_resume(a, c, id, true).await
}

async fn resume(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    pause_or_resume(a, c, id, false).await
}

fn request_from(b: &SandboxCommand) -> Result<ExecRequest, ApiError> {
    let mut req = match (&b.cmd, &b.argv) {
        (Some(s), None) => ExecRequest::shell(s.clone()),
        (None, Some(v)) => ExecRequest::argv(v.clone()),
        _ => {
            return Err(ApiError::invalid(
                "cmd",
                "give exactly one of `cmd` (a shell line) and `argv` (a list)",
            ));
        }
    };
    let t = b.timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT_S);
    if !(t.is_finite() && t > 0.0 && t <= MAX_COMMAND_TIMEOUT_S) {
        return Err(ApiError::invalid(
            "timeout",
            format!("seconds between 0 and {MAX_COMMAND_TIMEOUT_S}"),
        ));
    }
    req = req.timeout(Duration::from_secs_f64(t));
    if let Some(cwd) = &b.cwd {
        if !cwd.starts_with('/') {
            return Err(ApiError::invalid(
                "cwd",
                "an absolute path inside the sandbox",
            ));
        }
        req = req.cwd(cwd.clone());
    }
    if let Some(s) = &b.stdin {
        req = req.stdin(s.as_bytes().to_vec());
    }
    for (k, v) in &b.envs {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(ApiError::invalid(
                format!("envs.{k}"),
                "a name without `=` or NUL",
            ));
        }
        req = req.env(k.clone(), v.clone());
    }
    req.max_output = 8 << 20;
    Ok(req)
}

async fn run_command(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(b): Body<SandboxCommand>,
) -> Result<Response, ApiError> {
    c.require(Role::Developer)?;
    let inner = enabled(&a)?;
    let e = inner.get(&c, &id)?;
    let req = request_from(&b)?;
    let sse = b.stream
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/event-stream"));
    if !sse {
        let out = blocking(move || e.sandbox.exec(&req))
            .await?
            .map_err(|err| exec_error(&id, err))?;
        return Ok(Json(CommandResult::new(&out, true)).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    tokio::task::spawn_blocking(move || {
        let send = |ev: Event| {
            let _ = tx.send(ev);
        };
        let r = e
            .sandbox
            .exec_streaming(&req, |stream: tessera_sandbox::Stream, data: &[u8]| {
                let name = match stream {
                    tessera_sandbox::Stream::Stdout => "stdout",
                    tessera_sandbox::Stream::Stderr => "stderr",
                };
                let text = String::from_utf8_lossy(data);
                send(
                    Event::default()
                        .event(name)
                        .data(json!({"data": text}).to_string()),
                );
            });
        match r {
            Ok(out) => send(
                Event::default()
                    .event("end")
                    .data(json!(CommandResult::new(&out, false)).to_string()),
            ),
            Err(err) => send(
                Event::default()
                    .event("error")
                    .data(crate::problem::problem_json(&exec_error(&id, err)).to_string()),
            ),
        }
    });
    let s = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (Ok::<Event, Infallible>(ev), rx))
    });
    Ok(Sse::new(s).keep_alive(KeepAlive::default()).into_response())
}

crate::api::routes! {
    ROUTES, routes;
    post "/v1/sandboxes" create "Create a sandbox (E2B Sandbox.create); it is killed after `timeout` seconds" Some("NewSandbox"), 201;
    get "/v1/sandboxes" list "List the tenant's sandboxes" None, 200;
    get "/v1/sandboxes/{id}" get_one "Get a sandbox" None, 200;
    delete "/v1/sandboxes/{id}" kill "Kill a sandbox and everything in it (E2B kill)" None, 200;
    post "/v1/sandboxes/{id}/timeout" set_timeout "Kill the sandbox this many seconds from now (E2B setTimeout)" Some("SandboxTimeout"), 200;
    post "/v1/sandboxes/{id}/pause" pause "Pause a sandbox to disk (E2B betaPause): snapshotted, its processes and memory freed, its room on the node given back" None, 200;
    post "/v1/sandboxes/{id}/resume" resume "Resume a paused sandbox from its snapshot (placed again; its timeout counts from now)" None, 200;
    post "/v1/sandboxes/{id}/commands" run_command "Run a command (E2B commands.run): JSON result, or server-sent events stdout/stderr/end with `stream` or Accept: text/event-stream" Some("SandboxCommand"), 200;
    get "/v1/sandboxes/{id}/files" read_file "Read a file (?path=), as raw bytes (E2B files.read)" None, 200;
    put "/v1/sandboxes/{id}/files" write_file "Write a file (?path=) with the raw body, making parent folders (E2B files.write)" None, 200;
    delete "/v1/sandboxes/{id}/files" remove_file "Remove a file, or a folder with ?recursive=true (E2B files.remove)" None, 200;
    get "/v1/sandboxes/{id}/files/list" list_files "List a folder (?path=) (E2B files.list)" None, 200;
    get "/v1/sandboxes/{id}/files/tar" download_tar "Download a folder (?path=; or one file) as a tar archive (application/x-tar); the archive comes from inside the sandbox: unpack it as untrusted" None, 200;
    put "/v1/sandboxes/{id}/files/tar" upload_tar "Unpack a tar archive (body, Content-Type application/x-tar, at most 256 MiB) into a folder (?path=), made if missing; absolute paths, `..`, links leaving the folder, device nodes and fifos are refused (400) and nothing is unpacked" None, 200;
}
