//! Runs sessions: binds each active session to one sandbox claimed from a warm
//! pool, starts the runtime's agent inside it, talks to it over the agent
//! contract (`GET /ping` → `Healthy` | `HealthyBusy`, `POST /invocations`),
//! restarts an agent that exits or stops answering `/ping`, releases idle
//! sandboxes and ends sessions at their maximum lifetime. Nothing here is the
//! source of truth: the session record, memory and checkpoints are in the
//! store ([`crate::sessions`]), so a session resumes on a new sandbox after a
//! crash of its sandbox or of the server.
//!
//! The agent listens on the unix socket `$TESSERA_AGENT_SOCKET` inside its
//! sandbox (`/tmp/tessera-agent.sock`), which the host reaches through
//! `/proc/<init pid>/root`; the sandbox has no network, so the host also binds
//! a socket inside it (`/tmp/tessera.sock`, `TESSERA_URL=unix:///tmp/tessera.sock`)
//! that forwards to the control plane's API.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_sandbox::{
    ExecRequest, InitProgram, Limits, PoolConfig, Runtime, RuntimeConfig, Sandbox, SandboxSpec,
    Template, WarmPool,
};
use tessera_store::{AnyStore, Store};

use crate::error::{AgentError, now_ms};
use crate::meter::{self, UsageKind, UsageRecord};
use crate::runtimes::{self, RuntimeSpec, RuntimeVersion};
use crate::sessions::{self, Session, State};
use crate::trace;
use crate::unixhttp;

mod idle;

/// Where the agent listens, inside its sandbox.
pub const AGENT_SOCKET: &str = "/tmp/tessera-agent.sock";
/// Where the control plane is reachable, inside the sandbox.
pub const CONTROL_SOCKET: &str = "/tmp/tessera.sock";

/// Mints a session-scoped API key: `(tenant, session id, ttl seconds)` → key text.
pub type Minter = Arc<
    dyn Fn(String, String, u64) -> futures_lite::BoxedFuture<Result<String, String>> + Send + Sync,
>;

mod futures_lite {
    pub type BoxedFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
}

/// Settings of the session host.
#[derive(Clone)]
pub struct HostConfig {
    /// The sandbox init program (`None`: [`InitProgram::locate`]).
    pub init: Option<InitProgram>,
    /// Put sandboxes under cgroups (limits enforced, CPU and memory metered).
    pub cgroups: bool,
    /// How often each live agent is pinged.
    pub ping_interval: Duration,
    /// Failed pings in a row before the agent is restarted.
    pub ping_failures: u32,
    /// How long a new agent has to answer `/ping` with `Healthy`.
    pub start_timeout: Duration,
    /// Attempts to start a session's sandbox and agent before an invocation
    /// gives up (the session stays resumable).
    pub start_attempts: u32,
    /// Longest invocation.
    pub invoke_timeout: Duration,
    /// Warm sandboxes kept ready per runtime template.
    pub pool_min: usize,
    pub pool_max: usize,
    /// The control plane's address, forwarded into sandboxes.
    pub api_addr: Option<std::net::SocketAddr>,
    /// Runtime and version quotas.
    pub quotas: runtimes::Quotas,
    /// This process is the only session host on its store (the embedded
    /// store): a session another owner left starting or active is orphaned
    /// at once, not after its lease.
    pub exclusive: bool,
    /// How long a host's claim on its live sessions holds without renewal
    /// (renewed by the supervision loop at half of it).
    pub lease: Duration,
    /// The runtime guard of every session sandbox: each command, `execve` and file
    /// operation is checked for the session's tenant, and output redacted. The default
    /// is the shipped policy; the server passes its own (the operator's floor and the
    /// tenants' policies).
    pub guard: Arc<dyn tessera_sandbox::CommandCheck>,
    /// Where runtimes' templates are registered (`None`: only `host`).
    pub templates: Option<tessera_sandbox::TemplateRegistry>,
    /// Most warm pools kept at once (each keeps `pool_min` sandboxes ready). Pools are
    /// shared by tenants (a sandbox belongs to a tenant only once claimed) and keyed
    /// by template digest and limits; past this many, the least recently used pool
    /// goes, and a new kind of sandbox starts cold. This bounds idle sandboxes to
    /// `max_pools × pool_min`, whatever tenants ask for.
    pub max_pools: usize,
    /// Where idle sessions' writable folders are kept between their sandboxes (a
    /// folder of the node's data, root's alone): a session released for being idle
    /// gets its files back at its next invocation. `None`: they go with the sandbox.
    pub snapshots: Option<PathBuf>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            init: None,
            cgroups: true,
            ping_interval: Duration::from_secs(2),
            ping_failures: 3,
            start_timeout: Duration::from_secs(60),
            start_attempts: 6,
            invoke_timeout: Duration::from_secs(300),
            pool_min: 2,
            pool_max: 64,
            api_addr: None,
            quotas: runtimes::Quotas::default(),
            exclusive: true,
            lease: Duration::from_secs(30),
            guard: Arc::new(tessera_sandbox::PolicyGuard::default()),
            templates: None,
            max_pools: 8,
            snapshots: None,
        }
    }
}

impl std::fmt::Debug for HostConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostConfig")
            .field("ping_interval", &self.ping_interval)
            .field("pool_min", &self.pool_min)
            .field("api_addr", &self.api_addr)
            .finish()
    }
}

/// One running agent.
struct Live {
    sb: Arc<Sandbox>,
    pool: Arc<WarmPool>,
    socket: PathBuf,
    exited: Arc<AtomicBool>,
    output: Arc<Mutex<String>>,
    control: Option<tokio::task::JoinHandle<()>>,
    last_used: Instant,
    failures: u32,
    mem_gb_s: f64,
    last_sample: Instant,
    runtime: String,
}

#[derive(Default)]
struct Slot {
    live: Option<Live>,
}

type SlotRef = Arc<tokio::sync::Mutex<Slot>>;

/// One warm pool and who used it.
struct PoolEntry {
    pool: Arc<WarmPool>,
    /// Tenants whose runtimes use this pool (for `pool_stats`).
    tenants: std::collections::BTreeSet<String>,
    /// The template's digest (`host` for the built-in one).
    digest: String,
    last_used: Instant,
}

/// One invocation, as [`Host::invoke_with`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct Invoke<'a> {
    pub tenant: &'a str,
    pub runtime: &'a str,
    /// The runtime's endpoint (`DEFAULT` when `None`).
    pub endpoint: Option<&'a str>,
    pub session_id: &'a str,
    pub payload: &'a [u8],
    pub content_type: &'a str,
    /// The subject that starts the session, when this call creates it.
    pub started_by: Option<&'a str>,
}

/// What an invocation returns.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub session: Session,
    pub created: bool,
    pub reply: unixhttp::Reply,
    pub duration_ms: f64,
}

/// The session host.
#[derive(Clone)]
pub struct Host {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("cfg", &self.inner.cfg)
            .finish()
    }
}

struct Inner {
    store: AnyStore,
    cfg: HostConfig,
    rt: Result<Arc<Runtime>, String>,
    pools: Mutex<HashMap<String, PoolEntry>>,
    slots: Mutex<HashMap<(String, String), SlotRef>>,
    /// The sandbox of each live session, for a kill that must not wait for an
    /// invocation in progress.
    sandboxes: Mutex<HashMap<(String, String), Arc<Sandbox>>>,
    minter: Option<Minter>,
    keys: Mutex<HashMap<(String, String), String>>,
    /// This host's name in sessions' `owner`: `<hostname>/<pid>/<nonce>`.
    owner: String,
}

/// A name for this process as a session owner, unique across restarts.
fn owner_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("{host}/{}/{nonce:x}", std::process::id())
}

fn owner_host(owner: &str) -> &str {
    owner.split('/').next().unwrap_or_default()
}

/// The sandbox `tenant`'s sessions of a runtime get, and its template's digest. The
/// template is resolved through the registry (a name, never a host path) and admitted
/// by its trust policy for the tenant in the class agent sessions run in.
fn sandbox_spec(
    tenant: &str,
    spec: &RuntimeSpec,
    templates: Option<&tessera_sandbox::TemplateRegistry>,
) -> Result<(SandboxSpec, String), AgentError> {
    let who = tessera_sandbox::trust::Subject::new(tenant, tessera_sandbox::class::DEFAULT_CLASS);
    let (template, digest) = tessera_sandbox::registry::resolve_in(templates, &spec.template, &who)
        .map_err(|e| AgentError::invalid("template", e.to_string()))?;
    Ok((
        SandboxSpec {
            template,
            limits: Limits {
                memory_bytes: Some(spec.resources.memory_mb << 20),
                cpu_millis: Some(spec.resources.cpu_millis),
                pids: Some(spec.resources.pids),
                disk_bytes: spec.resources.disk_mb << 20,
            },
            hostname: "agent".into(),
            ..SandboxSpec::default()
        },
        digest,
    ))
}

/// A pool's key: the template's digest (never its path, so no spelling of a path
/// makes a second pool) and everything else of the spec.
fn pool_key(s: &SandboxSpec, digest: &str) -> String {
    let mut k = s.clone();
    k.template = Template::Host;
    format!("{digest}|{}", serde_json::to_string(&k).unwrap_or_default())
}

/// CPU seconds used by a sandbox's processes, read from `/proc`: each live
/// process's own time plus that of the children it reaped (the sandbox's init
/// reaps every orphan, so whatever ran there is counted once). Not from a
/// cgroup's accounting: a host may mount `cpu` and `cpuacct` apart (cgroup v1),
/// and a sandbox placed in `cpu` only is in the *root* `cpuacct` group, whose
/// counter is the whole machine's.
pub fn sandbox_cpu_seconds(sb: &Sandbox) -> Option<f64> {
    let mut pids = std::collections::BTreeSet::new();
    let mut todo = vec![sb.pid()];
    while let Some(p) = todo.pop() {
        if !pids.insert(p) {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    if let Some(c) = sb.cgroup() {
        pids.extend(c.procs());
    }
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .unwrap_or(100) as f64;
    let ticks: Vec<f64> = pids.into_iter().filter_map(proc_cpu_ticks).collect();
    (!ticks.is_empty()).then(|| ticks.iter().sum::<f64>() / tck)
}

/// utime + stime + cutime + cstime of `pid`, in clock ticks.
fn proc_cpu_ticks(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name's ")": field 3 onwards; fields 14 to 17.
    let f: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    (11..=14).map(|i| f.get(i)?.parse::<f64>().ok()).sum()
}

impl Host {
    /// A host over `store`. Sandboxes are made on first use; when they cannot
    /// be (no init program, no namespaces), invocations fail with the reason.
    pub fn new(store: AnyStore, cfg: HostConfig, minter: Option<Minter>) -> Host {
        let rt = Runtime::new(RuntimeConfig {
            init: cfg.init.clone(),
            cgroups: cfg.cgroups,
            guard: cfg.guard.clone(),
            ..RuntimeConfig::default()
        })
        .map_err(|e| e.to_string());
        Host {
            inner: Arc::new(Inner {
                store,
                cfg,
                rt,
                pools: Mutex::new(HashMap::new()),
                slots: Mutex::new(HashMap::new()),
                sandboxes: Mutex::new(HashMap::new()),
                minter,
                keys: Mutex::new(HashMap::new()),
                owner: owner_id(),
            }),
        }
    }

    pub fn store(&self) -> &AnyStore {
        &self.inner.store
    }

    pub fn config(&self) -> &HostConfig {
        &self.inner.cfg
    }

    fn pool(&self, tenant: &str, spec: &RuntimeSpec) -> Result<Arc<WarmPool>, AgentError> {
        let rt =
            self.inner.rt.clone().map_err(|e| {
                AgentError::Unavailable(format!("sandboxes cannot be made here: {e}"))
            })?;
        let (ss, digest) = sandbox_spec(tenant, spec, self.inner.cfg.templates.as_ref())?;
        let k = pool_key(&ss, &digest);
        let mut pools = self.inner.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = pools.get_mut(&k) {
            e.last_used = Instant::now();
            e.tenants.insert(tenant.to_string());
            return Ok(e.pool.clone());
        }
        let cfg = &self.inner.cfg;
        if pools.len() >= cfg.max_pools.max(1) {
            // The least recently used pool goes (its ready sandboxes with it; claimed
            // ones stay with their sessions).
            if let Some(old) = pools
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
            {
                pools.remove(&old);
            }
        }
        let pool = Arc::new(WarmPool::new(
            rt,
            ss,
            PoolConfig {
                min: cfg.pool_min,
                max: cfg.pool_max,
                ..PoolConfig::default()
            },
        ));
        pools.insert(
            k,
            PoolEntry {
                pool: pool.clone(),
                tenants: [tenant.to_string()].into(),
                digest,
                last_used: Instant::now(),
            },
        );
        Ok(pool)
    }

    /// Checks that this host can run `tenant`'s runtime: its template is registered
    /// here and the trust policy admits it.
    pub fn check(&self, tenant: &str, spec: &RuntimeSpec) -> Result<(), AgentError> {
        sandbox_spec(tenant, spec, self.inner.cfg.templates.as_ref()).map(drop)
    }

    /// Starts a warm pool for the runtime's template (called when a runtime
    /// is created or updated), so its first session claims a ready sandbox.
    /// Fails when the runtime's template is not registered.
    pub fn prime(&self, tenant: &str, spec: &RuntimeSpec) -> Result<(), AgentError> {
        match self.pool(tenant, spec) {
            Ok(_) | Err(AgentError::Unavailable(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Statistics of the warm pools `tenant`'s runtimes use (another tenant's are not
    /// shown), with each pool's template digest.
    pub fn pool_stats(&self, tenant: &str) -> Vec<(String, tessera_sandbox::PoolStats)> {
        self.inner
            .pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|e| e.tenants.contains(tenant))
            .map(|e| (e.digest.clone(), e.pool.stats()))
            .collect()
    }

    fn slot(&self, tenant: &str, id: &str) -> SlotRef {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((tenant.to_string(), id.to_string()))
            .or_default()
            .clone()
    }

    /// This host's name in sessions' `owner` field.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// Takes back sessions whose host is gone: run at start, then
    /// periodically. A session starting or active under another owner is
    /// orphaned when this host is the only one on its store (`exclusive`: the
    /// owner was a previous process), or when its owner stopped renewing its
    /// lease (several replicas on PostgreSQL); sessions of a live replica are
    /// left alone. An orphan's sandbox is destroyed if it outlived its server
    /// on this machine, and the session becomes idle (resumable).
    pub async fn recover(&self) -> Result<usize, AgentError> {
        let store = &self.inner.store;
        let me = self.inner.owner.clone();
        let mine = owner_host(&me).to_string();
        let exclusive = self.inner.cfg.exclusive;
        let mut n = 0;
        for st in [State::Starting, State::Active] {
            let l = store.list(&st.index_kind(), None).await?;
            for o in l.objects {
                let id = o.name.rsplit('/').next().unwrap_or_default();
                let Some(s) = sessions::get(store, &o.tenant, id).await? else {
                    continue;
                };
                let orphaned = |x: &Session| {
                    matches!(x.state, State::Starting | State::Active)
                        && x.owner.as_deref() != Some(me.as_str())
                        && (exclusive || x.owner.is_none() || now_ms() >= x.lease_until_ms)
                };
                if !orphaned(&s) {
                    continue;
                }
                let local = exclusive || s.owner.as_deref().map(owner_host) == Some(mine.as_str());
                if let (Some(pid), true) = (s.sandbox_pid, local) {
                    kill_stale_sandbox(pid);
                }
                let prev = s.owner.clone();
                let changed = sessions::update(store, &o.tenant, id, |x| {
                    if !orphaned(x) || x.owner != prev {
                        return Ok(false);
                    }
                    x.state = State::Idle;
                    x.sandbox = None;
                    x.sandbox_pid = None;
                    x.owner = None;
                    x.reason =
                        Some("its server stopped; the next invocation resumes the session".into());
                    x.updated_at_ms = now_ms();
                    Ok(true)
                })
                .await?;
                if changed.state == State::Idle {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Refuses to run a session another live host runs (its sandbox is
    /// there). Invocations are not forwarded between replicas: the caller
    /// retries, and after the owner's lease this host takes the session over.
    fn check_owner(&self, s: &Session) -> Result<(), AgentError> {
        if self.inner.cfg.exclusive || !matches!(s.state, State::Starting | State::Active) {
            return Ok(());
        }
        match &s.owner {
            Some(o) if *o != self.inner.owner && now_ms() < s.lease_until_ms => {
                Err(AgentError::Unavailable(format!(
                    "session {:?} is running on another server ({o}); retry there, or in {} s when its lease ends if that server is gone",
                    s.id,
                    (s.lease_until_ms - now_ms()).div_ceil(1000)
                )))
            }
            _ => Ok(()),
        }
    }

    async fn key_for(&self, tenant: &str, s: &Session) -> Result<String, AgentError> {
        let k = (tenant.to_string(), s.id.clone());
        if let Some(v) = self
            .inner
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&k)
        {
            return Ok(v.clone());
        }
        let Some(m) = &self.inner.minter else {
            return Ok(String::new());
        };
        let ttl = s.expires_at_ms.saturating_sub(now_ms()) / 1000 + 60;
        let key = m(tenant.to_string(), s.id.clone(), ttl)
            .await
            .map_err(|e| AgentError::Unavailable(format!("cannot mint the session's key: {e}")))?;
        self.inner
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(k, key.clone());
        Ok(key)
    }

    /// Invokes runtime `runtime` (through `endpoint`, `DEFAULT` when `None`)
    /// in session `session_id`, creating or resuming the session.
    pub async fn invoke(
        &self,
        tenant: &str,
        runtime: &str,
        endpoint: Option<&str>,
        session_id: &str,
        payload: &[u8],
        content_type: &str,
    ) -> Result<Invocation, AgentError> {
        self.invoke_with(Invoke {
            tenant,
            runtime,
            endpoint,
            session_id,
            payload,
            content_type,
            started_by: None,
        })
        .await
    }

    /// [`Host::invoke`], saying who starts the session if this call creates it
    /// (kept as its `started_by`: whom its exchanged tokens act for).
    pub async fn invoke_with(&self, call: Invoke<'_>) -> Result<Invocation, AgentError> {
        let Invoke {
            tenant,
            runtime,
            endpoint,
            session_id,
            payload,
            content_type,
            started_by,
        } = call;
        let store = &self.inner.store;
        sessions::check_id(session_id)?;
        let (mut s, created) = match sessions::get(store, tenant, session_id).await? {
            Some(s) => (s, false),
            None => {
                let rv = runtimes::resolve(store, tenant, runtime, endpoint).await?;
                let new = sessions::NewSession {
                    id: session_id,
                    started_by,
                };
                sessions::get_or_create(store, tenant, new, &rv, now_ms()).await?
            }
        };
        if s.runtime != runtime {
            return Err(AgentError::invalid(
                "session_id",
                format!(
                    "session {session_id:?} belongs to runtime {:?}, not {runtime:?}",
                    s.runtime
                ),
            ));
        }
        let rv = runtimes::get_version(store, tenant, &s.runtime, s.version).await?;
        let t0 = Instant::now();
        let started_ms = now_ms();
        let mut last_err = String::new();
        for attempt in 0..2 {
            self.check_runnable(tenant, &s).await?;
            let slot = self.slot(tenant, session_id);
            let mut g = slot.lock().await;
            // Re-read: a kill may have happened while waiting for the slot.
            s = sessions::get(store, tenant, session_id)
                .await?
                .ok_or_else(|| AgentError::NotFound(format!("session {session_id:?}")))?;
            self.check_runnable(tenant, &s).await?;
            self.check_owner(&s)?;
            let alive = g
                .live
                .as_ref()
                .is_some_and(|l| !l.exited.load(Ordering::Acquire));
            if !alive {
                if let Some(old) = g.live.take() {
                    self.release(tenant, &s.id, old, "agent exited").await;
                }
                let live = self.start(tenant, &s, &rv).await?;
                g.live = Some(live);
            }
            let live = g.live.as_mut().expect("just started");
            live.last_used = Instant::now();
            let socket = live.socket.clone();
            let sid = s.id.clone();
            let headers = [
                ("Content-Type", content_type),
                ("X-Tessera-Session-Id", sid.as_str()),
                ("X-Amzn-Bedrock-AgentCore-Runtime-Session-Id", sid.as_str()),
            ];
            let r = unixhttp::request(
                &socket,
                "POST",
                "/invocations",
                &headers,
                payload,
                self.inner.cfg.invoke_timeout,
            )
            .await;
            live.last_used = Instant::now();
            match r {
                Ok(mut reply) => {
                    drop(g);
                    // The agent's reply is output leaving tenant code: redacted.
                    let at = format!("session {} reply", s.id);
                    if let Some(b) = self.inner.cfg.guard.redact(Some(tenant), &at, &reply.body) {
                        reply.body = b;
                        reply.headers.retain(|(k, _)| k != "content-length");
                    }
                    let duration_ms = t0.elapsed().as_secs_f64() * 1e3;
                    let s = self
                        .after_invoke(tenant, &s, &reply, started_ms, duration_ms)
                        .await?;
                    return Ok(Invocation {
                        session: s,
                        created,
                        reply,
                        duration_ms,
                    });
                }
                Err(e) => {
                    // The agent died under the call (its sandbox killed, a
                    // crash): restart it and send the invocation once more.
                    last_err = e;
                    if let Some(old) = g.live.take() {
                        self.release(tenant, &s.id, old, "agent stopped answering")
                            .await;
                    }
                    let _ = attempt;
                }
            }
        }
        Err(AgentError::Unavailable(format!(
            "session {session_id:?}: the agent did not answer /invocations: {last_err}; the session is resumable, retry"
        )))
    }

    async fn check_runnable(&self, tenant: &str, s: &Session) -> Result<(), AgentError> {
        if s.state.is_final() {
            return Err(AgentError::State(format!(
                "session {:?} is {}{}: start a new session",
                s.id,
                s.state.as_str(),
                s.reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )));
        }
        if now_ms() >= s.expires_at_ms {
            self.end(tenant, &s.id, State::Ended, "reached its maximum lifetime")
                .await?;
            return Err(AgentError::State(format!(
                "session {:?} reached its maximum lifetime: start a new session",
                s.id
            )));
        }
        if let Err(e) = meter::check_budget(&self.inner.store, tenant, &s.id).await {
            self.end(tenant, &s.id, State::Killed, &e.to_string())
                .await?;
            return Err(e);
        }
        Ok(())
    }

    async fn after_invoke(
        &self,
        tenant: &str,
        s: &Session,
        reply: &unixhttp::Reply,
        started_ms: u64,
        duration_ms: f64,
    ) -> Result<Session, AgentError> {
        let store = &self.inner.store;
        let s = sessions::update(store, tenant, &s.id, |x| {
            x.invocations += 1;
            x.last_invoked_at_ms = Some(now_ms());
            x.updated_at_ms = now_ms();
            Ok(true)
        })
        .await?;
        let inv = s.invocations;
        // Usage the agent reports: `X-Tessera-Usage: {"tokens_in": 10, ...}`.
        let mut cost = 0.0;
        let mut usage = json!({});
        if let Some(u) = reply.header("x-tessera-usage") {
            if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(u) {
                for (k, v) in m {
                    let (Ok(kind), Some(q)) =
                        (serde_json::from_value::<UsageKind>(json!(k)), v.as_f64())
                    else {
                        continue;
                    };
                    let rec = UsageRecord {
                        tenant: tenant.into(),
                        session: s.id.clone(),
                        runtime: s.runtime.clone(),
                        kind,
                        quantity: q,
                        at_ms: now_ms(),
                        source_id: format!("{}/invocation/{inv}/{}", s.id, kind.as_str()),
                    };
                    if let Ok(r) = meter::record(store, rec).await {
                        cost += r.cost;
                        usage[kind.as_str()] = json!(q);
                        if let Some(why) = r.over_budget {
                            self.kill(tenant, &s.id, &why).await?;
                        }
                    }
                }
            }
        }
        let _ = trace::record_span(
            store,
            tenant,
            trace::Span {
                session: s.id.clone(),
                span_id: format!("inv-{inv:06}"),
                parent: None,
                name: format!("invoke_agent {}", s.runtime),
                operation: "invoke_agent".into(),
                start_ms: started_ms,
                duration_ms,
                cost,
                attributes: json!({
                    "gen_ai.conversation.id": s.id,
                    "gen_ai.agent.id": s.runtime,
                    "gen_ai.agent.version": s.version,
                    "gen_ai.response.id": reply.header("x-tessera-response-id"),
                    "http.response.status_code": reply.status,
                    "gen_ai.usage.input_tokens": usage.get("tokens_in"),
                    "gen_ai.usage.output_tokens": usage.get("tokens_out"),
                    "usage": usage,
                }),
            },
        )
        .await;
        Ok(s)
    }

    /// Claims a sandbox, starts the agent, waits for `/ping`. Retries with
    /// backoff; after the last attempt the session is left idle (resumable).
    async fn start(
        &self,
        tenant: &str,
        s: &Session,
        rv: &RuntimeVersion,
    ) -> Result<Live, AgentError> {
        let store = &self.inner.store;
        let pool = self.pool(tenant, &rv.spec)?;
        let key = self.key_for(tenant, s).await?;
        let mut last = String::new();
        for attempt in 0..self.inner.cfg.start_attempts.max(1) {
            if attempt > 0 {
                let ms = (100u64 << attempt.min(6)).min(5000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let cur = sessions::get(store, tenant, &s.id).await?;
            if cur.as_ref().is_some_and(|c| c.state.is_final()) {
                return Err(AgentError::State(format!(
                    "session {:?} was stopped while starting",
                    s.id
                )));
            }
            let lease_ms = self.inner.cfg.lease.as_millis() as u64;
            sessions::update(store, tenant, &s.id, |x| {
                x.state = State::Starting;
                x.sandbox = None;
                x.owner = Some(self.inner.owner.clone());
                x.lease_until_ms = now_ms() + lease_ms;
                x.updated_at_ms = now_ms();
                Ok(true)
            })
            .await?;
            let p = pool.clone();
            let sb = match tokio::task::spawn_blocking(move || p.claim()).await {
                Ok(Ok(mut sb)) => {
                    // The guard checks this session's commands as its tenant's.
                    sb.set_tenant(Some(tenant.to_string()));
                    Arc::new(sb)
                }
                Ok(Err(e)) => {
                    last = format!("claiming a sandbox: {e}");
                    continue;
                }
                Err(e) => {
                    last = format!("claiming a sandbox: {e}");
                    continue;
                }
            };
            // The files it had when it was last released for being idle.
            if let Some(root) = self.inner.cfg.snapshots.clone() {
                let (t, sid, b) = (tenant.to_string(), s.id.clone(), sb.clone());
                let restored =
                    tokio::task::spawn_blocking(move || idle::restore(&root, &t, &sid, &b))
                        .await
                        .unwrap_or_else(|e| Err(e.to_string()));
                if let Err(e) = restored {
                    // Not a passing fault: say why, keep the files, leave it resumable.
                    last = e;
                    let _ = sb.destroy();
                    if let Ok(sb) = Arc::try_unwrap(sb) {
                        pool.release(sb);
                    }
                    break;
                }
            }
            let id_key = (tenant.to_string(), s.id.clone());
            self.inner
                .sandboxes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id_key.clone(), sb.clone());
            sessions::update(store, tenant, &s.id, |x| {
                x.sandbox = Some(sb.id().to_string());
                x.sandbox_pid = Some(sb.pid());
                Ok(true)
            })
            .await?;
            match self.launch(tenant, s, rv, &sb, &key, pool.clone()).await {
                Ok(live) => {
                    let was_started = cur.as_ref().is_some_and(|c| c.starts > 0);
                    let upd = sessions::update(store, tenant, &s.id, |x| {
                        if x.state.is_final() {
                            return Err(AgentError::State(format!(
                                "session {:?} was stopped while starting",
                                x.id
                            )));
                        }
                        x.state = State::Active;
                        x.owner = Some(self.inner.owner.clone());
                        x.lease_until_ms = now_ms() + lease_ms;
                        x.starts += 1;
                        if was_started {
                            x.restarts += 1;
                        }
                        x.reason = None;
                        x.updated_at_ms = now_ms();
                        Ok(true)
                    })
                    .await;
                    if let Err(e) = upd {
                        self.release(tenant, &s.id, live, "stopped while starting")
                            .await;
                        return Err(e);
                    }
                    tracing::info!(
                        tenant = %tenant,
                        session_id = %s.id,
                        agent_id = %s.runtime,
                        agent_version = s.version,
                        sandbox = %sb.id(),
                        restarted = was_started,
                        "session {}: its agent answers in sandbox {}",
                        s.id,
                        sb.id()
                    );
                    return Ok(live);
                }
                Err(e) => {
                    tracing::warn!(
                        tenant = %tenant,
                        session_id = %s.id,
                        agent_id = %s.runtime,
                        "session {}: its agent did not start: {e}",
                        s.id
                    );
                    last = e;
                    self.inner
                        .sandboxes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id_key);
                    let _ = sb.destroy();
                    if let Ok(sb) = Arc::try_unwrap(sb) {
                        pool.release(sb);
                    }
                }
            }
        }
        let msg = format!(
            "session {:?}: could not start its agent after {} attempts: {last}; the session stays resumable",
            s.id, self.inner.cfg.start_attempts
        );
        let _ = sessions::update(store, tenant, &s.id, |x| {
            if x.state.is_final() {
                return Ok(false);
            }
            x.state = State::Idle;
            x.sandbox = None;
            x.sandbox_pid = None;
            x.owner = None;
            x.reason = Some(msg.clone());
            Ok(true)
        })
        .await;
        Err(AgentError::Unavailable(msg))
    }

    async fn launch(
        &self,
        tenant: &str,
        s: &Session,
        rv: &RuntimeVersion,
        sb: &Arc<Sandbox>,
        key: &str,
        pool: Arc<WarmPool>,
    ) -> Result<Live, String> {
        let root = PathBuf::from(format!("/proc/{}/root", sb.pid()));
        let socket = root.join(AGENT_SOCKET.trim_start_matches('/'));
        // The control plane inside the sandbox.
        let control = match self.inner.cfg.api_addr {
            Some(addr) => {
                let path = root.join(CONTROL_SOCKET.trim_start_matches('/'));
                let _ = std::fs::remove_file(&path);
                let l = bind_in_sandbox(&path)?;
                let l = tokio::net::UnixListener::from_std(l)
                    .map_err(|e| format!("listening on {}: {e}", path.display()))?;
                Some(tokio::spawn(forward(l, addr)))
            }
            None => None,
        };
        let mut req = ExecRequest::argv(rv.spec.command.clone());
        for (k, v) in &rv.spec.env {
            req = req.env(k, v);
        }
        req = req
            .env("TESSERA_AGENT_SOCKET", AGENT_SOCKET)
            .env("TESSERA_SESSION_ID", &s.id)
            .env("TESSERA_RUNTIME", &s.runtime)
            .env("TESSERA_RUNTIME_VERSION", s.version.to_string())
            .env("TESSERA_TENANT", tenant);
        if control.is_some() {
            req = req
                .env("TESSERA_URL", format!("unix://{CONTROL_SOCKET}"))
                .env("TESSERA_API_KEY", key);
        }
        if let Some(c) = &rv.spec.cwd {
            req = req.cwd(c);
        }
        req.max_output = 1 << 20;
        let exited = Arc::new(AtomicBool::new(false));
        let output = Arc::new(Mutex::new(String::new()));
        {
            let (sb, exited, output) = (sb.clone(), exited.clone(), output.clone());
            let name = format!("agent-{}", s.id);
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                let tail = |o: &Arc<Mutex<String>>, st: tessera_sandbox::Stream, d: &[u8]| {
                    let mut g = o.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = st;
                    g.push_str(&String::from_utf8_lossy(d));
                    if g.len() > 8192 {
                        let cut = g.len() - 4096;
                        let cut = (cut..g.len())
                            .find(|i| g.is_char_boundary(*i))
                            .unwrap_or(cut);
                        g.drain(..cut);
                    }
                };
                let r = sb.exec_streaming(&req, |st, d| tail(&output, st, d));
                let msg = match r {
                    Ok(o) => format!("\n[agent exited: {:?}]", o.status),
                    Err(e) => format!("\n[agent could not run: {e}]"),
                };
                output
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&msg);
                exited.store(true, Ordering::Release);
            });
            if let Err(e) = spawned {
                return Err(format!("starting the agent thread: {e}"));
            }
        }
        // Wait for /ping → Healthy.
        let deadline = Instant::now() + self.inner.cfg.start_timeout;
        let mut delay = Duration::from_millis(5);
        loop {
            if exited.load(Ordering::Acquire) {
                let out = output.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(c) = control {
                    c.abort();
                }
                return Err(format!(
                    "the agent exited before answering /ping: {}",
                    out.trim()
                ));
            }
            if let Ok(r) =
                unixhttp::request(&socket, "GET", "/ping", &[], b"", Duration::from_secs(2)).await
            {
                if r.status == 200 && ping_status(&r.body).is_some() {
                    break;
                }
            }
            if Instant::now() >= deadline {
                if let Some(c) = control {
                    c.abort();
                }
                let out = output.lock().unwrap_or_else(|p| p.into_inner()).clone();
                return Err(format!(
                    "the agent did not answer GET /ping on $TESSERA_AGENT_SOCKET within {:?}; its output: {}",
                    self.inner.cfg.start_timeout,
                    out.trim()
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(100));
        }
        Ok(Live {
            sb: sb.clone(),
            pool,
            socket,
            exited,
            output,
            control,
            last_used: Instant::now(),
            failures: 0,
            mem_gb_s: 0.0,
            last_sample: Instant::now(),
            runtime: s.runtime.clone(),
        })
    }

    /// Gives the sandbox back (destroyed in the background) and records its
    /// CPU seconds and memory GB-seconds.
    async fn release(&self, tenant: &str, session: &str, mut live: Live, why: &str) {
        tracing::info!(
            tenant = %tenant,
            session_id = %session,
            sandbox = %live.sb.id(),
            "session {session}: sandbox released ({why})"
        );
        if let Some(c) = live.control.take() {
            c.abort();
        }
        sample_memory(&mut live);
        let cpu = sandbox_cpu_seconds(&live.sb);
        let sbid = live.sb.id().to_string();
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(tenant.to_string(), session.to_string()));
        let _ = live.sb.destroy();
        if let Ok(sb) = Arc::try_unwrap(live.sb) {
            live.pool.release(sb);
        }
        let store = &self.inner.store;
        for (kind, q) in [
            (UsageKind::CpuSeconds, cpu),
            (UsageKind::MemoryGbSeconds, Some(live.mem_gb_s)),
        ] {
            let Some(q) = q else { continue };
            let rec = UsageRecord {
                tenant: tenant.into(),
                session: session.into(),
                runtime: live.runtime.clone(),
                kind,
                quantity: q,
                at_ms: now_ms(),
                source_id: format!("{session}/sandbox/{sbid}/{}", kind.as_str()),
            };
            let _ = meter::record(store, rec).await;
        }
    }

    /// Ends a session (`Ended`, `Killed`), destroying its sandbox at once.
    pub async fn end(
        &self,
        tenant: &str,
        id: &str,
        state: State,
        reason: &str,
    ) -> Result<Session, AgentError> {
        sessions::update(&self.inner.store, tenant, id, |x| {
            if x.state.is_final() {
                return Ok(false);
            }
            x.state = state;
            x.reason = Some(reason.to_string());
            x.updated_at_ms = now_ms();
            Ok(true)
        })
        .await?;
        // Destroy now, even while an invocation holds the slot.
        let sb = self
            .inner
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(tenant.to_string(), id.to_string()))
            .cloned();
        if let Some(sb) = sb {
            let _ = tokio::task::spawn_blocking(move || sb.destroy()).await;
        }
        let slot = self.slot(tenant, id);
        let mut g = slot.lock().await;
        if let Some(l) = g.live.take() {
            self.release(tenant, id, l, reason).await;
        }
        drop(g);
        // Its files kept from an idle release go with it.
        if let Some(root) = &self.inner.cfg.snapshots {
            idle::forget(root, tenant, id);
        }
        self.inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(tenant.to_string(), id.to_string()));
        self.inner
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(tenant.to_string(), id.to_string()));
        sessions::update(&self.inner.store, tenant, id, |x| {
            if x.sandbox.is_none() {
                return Ok(false);
            }
            x.sandbox = None;
            x.sandbox_pid = None;
            Ok(true)
        })
        .await
    }

    /// Kills a session: its sandbox is destroyed and it takes no more invocations.
    pub async fn kill(&self, tenant: &str, id: &str, reason: &str) -> Result<Session, AgentError> {
        self.end(tenant, id, State::Killed, reason).await
    }

    /// The live details of a session (for inspect): the tail of its agent's output.
    pub async fn live_info(&self, tenant: &str, id: &str) -> Value {
        let slot = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(tenant.to_string(), id.to_string()))
            .cloned();
        let Some(slot) = slot else { return Value::Null };
        let Ok(g) = slot.try_lock() else {
            return json!({"busy": true});
        };
        match &g.live {
            Some(l) => {
                // The agent's own output: redacted like any output leaving tenant code.
                let tail = l.output.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let at = format!("session {id} output");
                let tail = match self
                    .inner
                    .cfg
                    .guard
                    .redact(Some(tenant), &at, tail.as_bytes())
                {
                    Some(b) => String::from_utf8_lossy(&b).into_owned(),
                    None => tail,
                };
                // No host pid: it says nothing to a tenant and something to an attacker.
                json!({
                    "sandbox": l.sb.id(),
                    "idle_for_ms": l.last_used.elapsed().as_millis() as u64,
                    "agent_exited": l.exited.load(Ordering::Acquire),
                    "output_tail": tail,
                })
            }
            None => Value::Null,
        }
    }

    /// One round of the supervision loop: ping every live agent (restart the
    /// ones that exited or failed `ping_failures` pings in a row), release
    /// idle sandboxes, end sessions at their maximum lifetime.
    pub async fn tick(&self) {
        let slots: Vec<((String, String), SlotRef)> = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((tenant, id), slot) in slots {
            // Busy with an invocation: the agent is working.
            let Ok(mut g) = slot.try_lock() else { continue };
            let Some(live) = g.live.as_mut() else {
                continue;
            };
            sample_memory(live);
            let Ok(Some(s)) = sessions::get(&self.inner.store, &tenant, &id).await else {
                continue;
            };
            if s.state.is_final() {
                if let Some(l) = g.live.take() {
                    self.release(&tenant, &id, l, "session ended").await;
                }
                continue;
            }
            if now_ms() >= s.expires_at_ms {
                drop(g);
                let _ = self
                    .end(&tenant, &id, State::Ended, "reached its maximum lifetime")
                    .await;
                continue;
            }
            // Renew this host's claim at half its lease.
            let lease_ms = self.inner.cfg.lease.as_millis() as u64;
            if s.owner.as_deref() == Some(self.inner.owner.as_str())
                && s.lease_until_ms < now_ms() + lease_ms / 2
            {
                let me = self.inner.owner.clone();
                let _ = sessions::update(&self.inner.store, &tenant, &id, |x| {
                    if x.owner.as_deref() != Some(me.as_str()) {
                        return Ok(false);
                    }
                    x.lease_until_ms = now_ms() + lease_ms;
                    Ok(true)
                })
                .await;
            }
            let ping = unixhttp::request(
                &live.socket,
                "GET",
                "/ping",
                &[],
                b"",
                Duration::from_secs(2),
            )
            .await;
            let busy = match &ping {
                Ok(r) if r.status == 200 => match ping_status(&r.body) {
                    Some(b) => {
                        live.failures = 0;
                        b
                    }
                    None => {
                        live.failures += 1;
                        false
                    }
                },
                _ => {
                    live.failures += 1;
                    false
                }
            };
            if live.exited.load(Ordering::Acquire) || live.failures >= self.inner.cfg.ping_failures
            {
                // Restart: a new sandbox and agent, the same session.
                let why = if live.exited.load(Ordering::Acquire) {
                    "the agent exited"
                } else {
                    "the agent stopped answering /ping"
                };
                let Some(old) = g.live.take() else { continue };
                self.release(&tenant, &id, old, why).await;
                let rv =
                    match runtimes::get_version(&self.inner.store, &tenant, &s.runtime, s.version)
                        .await
                    {
                        Ok(rv) => rv,
                        Err(_) => continue,
                    };
                match self.start(&tenant, &s, &rv).await {
                    Ok(l) => g.live = Some(l),
                    Err(_) => continue,
                }
                continue;
            }
            let idle = live.last_used.elapsed() >= Duration::from_secs(s.idle_timeout_s);
            if idle && !busy {
                let Some(old) = g.live.take() else { continue };
                let mut kept = false;
                if let Some(root) = self.inner.cfg.snapshots.clone() {
                    let (t, sid, b) = (tenant.clone(), id.clone(), old.sb.clone());
                    match tokio::task::spawn_blocking(move || idle::keep(&root, &t, &sid, &b))
                        .await
                        .unwrap_or_else(|e| Err(e.to_string()))
                    {
                        Ok(()) => kept = true,
                        Err(e) => tracing::warn!(
                            tenant = %tenant,
                            session_id = %id,
                            "session {tenant}/{id}: its files were not kept on disk ({e}); they go with its sandbox"
                        ),
                    }
                }
                self.release(&tenant, &id, old, "idle timeout").await;
                let _ = sessions::update(&self.inner.store, &tenant, &id, |x| {
                    if x.state.is_final() {
                        return Ok(false);
                    }
                    x.state = State::Idle;
                    x.sandbox = None;
                    x.sandbox_pid = None;
                    x.owner = None;
                    x.reason = Some(format!(
                        "idle for {} s: sandbox released{}; the next invocation resumes",
                        x.idle_timeout_s,
                        if kept { ", its files kept on disk" } else { "" }
                    ));
                    x.updated_at_ms = now_ms();
                    Ok(true)
                })
                .await;
            }
        }
    }

    /// Runs [`Host::tick`] every `ping_interval` until `stop` turns true.
    /// With several hosts on one store (not `exclusive`), also takes over the
    /// sessions of hosts that stopped renewing their leases, once per lease.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut last_recover = Instant::now();
        loop {
            if *stop.borrow() {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.inner.cfg.ping_interval) => self.tick().await,
                r = stop.changed() => if r.is_err() { break },
            }
            if !self.inner.cfg.exclusive && last_recover.elapsed() >= self.inner.cfg.lease {
                last_recover = Instant::now();
                let _ = self.recover().await;
            }
        }
        self.shutdown().await;
    }

    /// Destroys every live sandbox (server shutdown).
    pub async fn shutdown(&self) {
        let sbs: Vec<Arc<Sandbox>> = self
            .inner
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, v)| v)
            .collect();
        for sb in sbs {
            let _ = sb.destroy();
        }
    }
}

/// The built-in sandbox tools of the gateway (exec, files) run in the
/// sandbox a session is bound to now.
impl crate::tools::SandboxAccess for Host {
    fn sandbox(&self, tenant: &str, session_id: &str) -> Option<Arc<Sandbox>> {
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(tenant.to_string(), session_id.to_string()))
            .cloned()
    }
}

fn sample_memory(l: &mut Live) {
    let dt = l.last_sample.elapsed().as_secs_f64();
    l.last_sample = Instant::now();
    if let Some(bytes) = l.sb.cgroup().and_then(|c| c.memory_current()) {
        l.mem_gb_s += bytes as f64 / 1e9 * dt;
    }
}

/// `Some(busy)` for a `/ping` body that says `Healthy` or `HealthyBusy` (as
/// plain text or AgentCore's `{"status": "..."}`).
pub fn ping_status(body: &[u8]) -> Option<bool> {
    let text = String::from_utf8_lossy(body);
    let s = match serde_json::from_str::<Value>(&text) {
        Ok(v) => v
            .get("status")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_default(),
        Err(_) => text.trim().trim_matches('"').to_string(),
    };
    match s.as_str() {
        "Healthy" => Some(false),
        "HealthyBusy" => Some(true),
        _ => None,
    }
}

/// Kills a sandbox init left by a server that died, if `pid` still is one.
fn kill_stale_sandbox(pid: i32) {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return;
    };
    if String::from_utf8_lossy(&cmd).contains("tessera-sandbox-init") {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

/// Binds a unix socket at `path` (inside a sandbox's filesystem, through
/// `/proc/<pid>/root`). The sandbox's tmpfs belongs to its user namespace, which
/// does not map the host's root: a root supervisor binds with the file-system
/// uid of the sandbox's user (per thread, so in a thread of its own), which
/// also makes the socket the sandbox user's to connect to.
fn bind_in_sandbox(path: &std::path::Path) -> Result<std::os::unix::net::UnixListener, String> {
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let root = nix::unistd::geteuid().is_root();
        if root {
            let id = tessera_sandbox::sandbox::HOST_ID_BASE + tessera_sandbox::sandbox::SANDBOX_UID;
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(id));
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(id));
        }
        let r = std::os::unix::net::UnixListener::bind(&p);
        if root {
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(0));
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(0));
        }
        let l = r.map_err(|e| format!("binding {}: {e}", p.display()))?;
        l.set_nonblocking(true)
            .map_err(|e| format!("binding {}: {e}", p.display()))?;
        Ok(l)
    })
    .join()
    .map_err(|_| "the bind thread panicked".to_string())?
}

async fn forward(l: tokio::net::UnixListener, addr: std::net::SocketAddr) {
    loop {
        let Ok((mut c, _)) = l.accept().await else {
            return;
        };
        tokio::spawn(async move {
            if let Ok(mut up) = tokio::net::TcpStream::connect(addr).await {
                let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
            }
        });
    }
}
