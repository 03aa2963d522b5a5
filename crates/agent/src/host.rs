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
use tessera_sandbox::{InitProgram, Runtime, RuntimeConfig, Sandbox, WarmPool};
use tessera_store::AnyStore;

use crate::runtimes;
use crate::sessions::Session;
use crate::unixhttp;

mod idle;
mod invoke;
mod launch;
mod pool;
mod release;
mod supervise;

pub use release::sandbox_cpu_seconds;

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
