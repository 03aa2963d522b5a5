//! The tool gateway: a registry of tools (HTTP, remote MCP, built-in sandbox
//! tools), per-tenant grants to runtimes and roles, and the ledger that makes
//! every logical call happen at most once per idempotency key.
//!
//! Start at [`ToolGateway::call`]. The ledger's rule is the pure [`ledger::decide`];
//! [`dispatch`] sends a call; [`spec`] says what a tool and a grant are.
//!
//! Store kinds owned here: `tool` (a [`ToolSpec`]), `tool_grant` (the [`Grants`]
//! of one tool, named after it), `tool_secret` (the [`ToolSecrets`] of one tool:
//! never rendered by any route) and `ledger` (an [`Entry`] per idempotency key).
//! The gateway reads `session` objects (owned by the session manager) to learn a
//! call's runtime.
//!
//! Cost per call: re-send-safe tools (read-only, or honouring idempotency keys)
//! wait for no store write at all; any other call waits for exactly one durable
//! write, the `dispatched` record that must precede its side effect. Outcomes are
//! written in the background (the store commits them in groups) and served from
//! memory until they are durable.

pub mod bench;
pub mod dispatch;
pub mod ledger;
pub mod secrets;
pub mod spec;
pub mod testing;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_store::{Key, Object, Op, Store, StoreError};
use tokio::sync::{Notify, watch};

pub use dispatch::{BoxFuture, Delegation, SandboxAccess, Sent};
pub use ledger::{Approval, Decision, Entry, State};
pub use secrets::ToolSecrets;
pub use spec::{
    ApprovalPolicy, Builtin, CompiledTool, Grant, Grants, HeaderValue, SECRET_MARK,
    SchemaViolation, Secret, SpecError, Target, ToolAuth, ToolSpec,
};

/// Store kinds of the gateway.
pub mod kind {
    pub const TOOL: &str = "tool";
    pub const GRANT: &str = "tool_grant";
    /// The secret header values of one tool, named after it: read only to send.
    pub const SECRET: &str = "tool_secret";
    pub const LEDGER: &str = "ledger";
    /// One object per *open* ledger entry (`intended` or `dispatched`), written
    /// in the same commit as the entry's transition: what the sweep reads.
    pub const LEDGER_OPEN: &str = "ledger_open";
    /// `ledger_meta/""/indexed`: the open index covers entries written before it.
    pub const LEDGER_META: &str = "ledger_meta";
    /// Read only: owned by the session manager.
    pub const SESSION: &str = "session";
}

/// The topic approval requests and decisions are published on.
pub const APPROVALS_TOPIC: &str = "approvals";

/// Who is calling, after authentication.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCaller {
    pub tenant: String,
    /// `session:<id>` for a session-scoped key.
    pub subject: String,
    /// One of [`spec::ROLES`].
    pub role: String,
}

impl ToolCaller {
    /// The session this caller is confined to, if it is a session-scoped key.
    pub fn own_session(&self) -> Option<&str> {
        self.subject.strip_prefix("session:")
    }
}

/// One call as the agent sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    pub session_id: String,
    pub tool_call_id: String,
    /// Defaults to `<session_id>/<tool_call_id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    json!({})
}

/// What a call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Completed,
    Failed,
    InDoubt,
    PendingApproval,
    Denied,
    /// Another replica is sending it right now: call again.
    InProgress,
}

/// The answer to a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallOutcome {
    pub status: Status,
    pub ledger_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_expires_at_ms: Option<u64>,
    /// The ledger holds this outcome (a failure that surely did not execute is
    /// not recorded: calling again with the same key sends it again).
    pub recorded: bool,
    /// Answered from the ledger without sending.
    pub replayed: bool,
    /// Microseconds spent in the gateway, and inside the tool (not serialized).
    #[serde(skip)]
    pub timing: Timing,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    pub total_us: u64,
    pub tool_us: u64,
}

/// Why a call was refused before it reached the ledger.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("tool {0:?} is not registered in this tenant")]
    ToolNotFound(String),
    #[error("session {0:?} not found in this tenant: invoke a runtime to create it")]
    SessionNotFound(String),
    #[error("session {session:?} is {state}: it makes no more tool calls")]
    SessionOver { session: String, state: String },
    #[error("{subject:?} may only call tools for its own session, not {session:?}")]
    NotYourSession { subject: String, session: String },
    #[error(
        "tool {tool:?} is not granted to runtime {runtime:?} nor to role {role:?}: an admin grants it with POST /v1/tools/{tool}/grants"
    )]
    NotGranted {
        tool: String,
        runtime: Option<String>,
        role: String,
    },
    #[error("arguments{}: {}", .0.path.trim_end_matches('/'), .0.message)]
    InvalidArguments(SchemaViolation),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error(
        "idempotency key {key:?} (ledger {ledger_id}) was used for another call (other tool or arguments): use a new tool_call_id"
    )]
    KeyReused { key: String, ledger_id: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a registry or ledger operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// When an outcome is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Completion {
    /// In the background, batched by the store's group commit; the reply does not
    /// wait for it. A crash before it lands leaves the entry `dispatched`, which
    /// recovery turns into `in_doubt` (or a re-send for re-send-safe tools):
    /// never a second execution.
    #[default]
    Background,
    /// Before the reply.
    BeforeReply,
}

/// Settings of a gateway.
#[derive(Debug, Clone)]
pub struct ToolGatewayConfig {
    /// This process is the ledger's only writer (embedded store): entries another
    /// process dispatched are orphaned as soon as they are seen.
    pub exclusive: bool,
    /// A send's lease is its tool's timeout plus this.
    pub lease_margin: Duration,
    pub completion: Completion,
    /// Sends of a re-send-safe call whose outcome was unknown, at most.
    pub max_attempts: u32,
}

impl Default for ToolGatewayConfig {
    fn default() -> Self {
        ToolGatewayConfig {
            exclusive: true,
            lease_margin: Duration::from_secs(5),
            completion: Completion::Background,
            max_attempts: 3,
        }
    }
}

/// The OpenTelemetry GenAI `execute_tool` span of one ended call.
fn tool_span(
    tool: &str,
    session: &str,
    tool_call_id: &str,
    out: &CallOutcome,
    started_ms: u64,
    cost: f64,
) -> crate::trace::Span {
    let status = serde_json::to_value(out.status).unwrap_or_default();
    crate::trace::Span {
        session: session.to_string(),
        span_id: format!("tool-{}", out.ledger_id),
        parent: None,
        name: format!("execute_tool {tool}"),
        operation: "execute_tool".into(),
        start_ms: started_ms,
        duration_ms: out.timing.total_us as f64 / 1e3,
        cost,
        attributes: json!({
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.conversation.id": session,
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": tool_call_id,
            "gen_ai.tool.type": "function",
            "tessera.ledger_id": out.ledger_id,
            "tessera.tool.status": status,
            "tessera.tool.fee": cost,
            "error.type": if out.status == Status::Completed { Value::Null } else { status.clone() },
        }),
    }
}

pub use crate::error::now_ms;

fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    let _ = getrandom::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

type FlightKey = (String, String);
/// A tool, its grants and its secrets, as stored.
type ToolAndGrants = (Option<Object>, Option<Object>, Option<Object>);
/// Values read from the store at an instant, by (tenant, name).
type TtlCache<V> = Mutex<HashMap<(String, String), (Instant, V)>>;

/// How long a call trusts a tool, its grants and its session's runtime without
/// reading them again. Registry changes made through this process apply at
/// once; those made through another replica (or a session ending) within this.
pub const CACHE_TTL: Duration = Duration::from_secs(1);

fn fresh<V: Clone>(m: &TtlCache<V>, k: &(String, String)) -> Option<V> {
    let mut m = m.lock().unwrap();
    match m.get(k) {
        Some((at, v)) if at.elapsed() < CACHE_TTL => Some(v.clone()),
        Some(_) => {
            m.remove(k);
            None
        }
        None => None,
    }
}

/// The tool gateway over a store. Cheap to clone.
#[derive(Clone)]
pub struct ToolGateway<S: Store> {
    inner: Arc<Inner<S>>,
}

struct Inner<S: Store> {
    store: S,
    cfg: ToolGatewayConfig,
    /// This process's identity in `owner` fields.
    owner: String,
    dispatcher: dispatch::Dispatcher,
    /// Redacts results and errors (see [`ToolGateway::set_guard`]).
    guard: std::sync::RwLock<Arc<dyn tessera_sandbox::CommandCheck>>,
    /// Calls this process is sending now; followers wait for the outcome.
    inflight: Mutex<HashMap<FlightKey, watch::Receiver<Option<CallOutcome>>>>,
    /// Entries written in the background and not yet durable.
    recent: Mutex<HashMap<FlightKey, Entry>>,
    pending_writes: AtomicUsize,
    written: Notify,
    compiled: Mutex<HashMap<(String, String), CompiledTool>>,
    ledger_writes: AtomicUsize,
    /// Tools with their grants, and sessions' runtimes, as read at most
    /// [`CACHE_TTL`] ago (cleared at once by this process's registry writes).
    tool_cache: TtlCache<ToolAndGrants>,
    session_cache: TtlCache<Option<String>>,
    /// A one-shot crash point for tests ([`Fault`] as u8; 0 = none).
    fault: std::sync::atomic::AtomicU8,
}

/// Where a test makes the next send "crash" (the process stops there: nothing
/// after that point happens). For crash-recovery tests only.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// After the `dispatched` record is durable, before the send.
    AfterIntent = 1,
    /// After the send, before its outcome is recorded.
    AfterSend = 2,
    /// After the reply, before the background outcome write lands.
    LoseOutcome = 3,
}

impl<S: Store> std::fmt::Debug for ToolGateway<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolGateway")
            .field("owner", &self.inner.owner)
            .field("cfg", &self.inner.cfg)
            .finish()
    }
}

/// Whether an entry in this state has an object in the open index.
fn is_open(s: State) -> bool {
    matches!(s, State::Intended | State::Dispatched)
}

fn open_key(tenant: &str, id: &str) -> Key {
    Key::new(kind::LEDGER_OPEN, tenant, id)
}

/// The open-index write that goes with an entry's transition from `before`
/// (`None`: no entry) to `after` (`None`: the entry is deleted), committed
/// together so that the index holds exactly the open entries.
fn index_op(tenant: &str, id: &str, before: Option<State>, after: Option<State>) -> Option<Op> {
    match (before.is_some_and(is_open), after.is_some_and(is_open)) {
        (false, true) => Some(Op::Create {
            key: open_key(tenant, id),
            body: json!({}),
        }),
        (true, false) => Some(Op::Delete {
            key: open_key(tenant, id),
            expected: None,
        }),
        _ => None,
    }
}

fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn entry_of(o: &Object) -> Result<Entry, StoreError> {
    serde_json::from_value(o.body.clone())
        .map_err(|e| StoreError::Backend(format!("stored {} is unreadable: {e}", o.key())))
}

impl<S: Store> ToolGateway<S> {
    pub fn new(store: S, cfg: ToolGatewayConfig) -> Self {
        Self::with(store, cfg, None)
    }

    /// A gateway whose built-in tools reach sessions' sandboxes through `sandboxes`.
    pub fn with(
        store: S,
        cfg: ToolGatewayConfig,
        sandboxes: Option<Arc<dyn SandboxAccess>>,
    ) -> Self {
        ToolGateway {
            inner: Arc::new(Inner {
                store,
                cfg,
                owner: format!("gw-{}", random_hex(6)),
                dispatcher: dispatch::Dispatcher::new(sandboxes),
                guard: std::sync::RwLock::new(Arc::new(tessera_sandbox::PolicyGuard::default())),
                inflight: Mutex::new(HashMap::new()),
                recent: Mutex::new(HashMap::new()),
                pending_writes: AtomicUsize::new(0),
                written: Notify::new(),
                compiled: Mutex::new(HashMap::new()),
                ledger_writes: AtomicUsize::new(0),
                fault: std::sync::atomic::AtomicU8::new(0),
                tool_cache: Mutex::new(HashMap::new()),
                session_cache: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Lets the built-in tools reach sessions' sandboxes (set once the session
    /// host is up).
    pub fn set_sandboxes(&self, s: Arc<dyn SandboxAccess>) {
        self.inner.dispatcher.set_sandboxes(s);
    }

    /// Lets tools registered with `auth: exchange` be called: `d` mints their
    /// tokens (set once the server's token issuer is up).
    pub fn set_delegation(&self, d: Arc<dyn Delegation>) {
        self.inner.dispatcher.set_delegation(d);
    }

    /// The guard whose scanner redacts every tool result and error before it reaches
    /// the ledger, the agent and the caller (default: the shipped policy).
    pub fn set_guard(&self, g: Arc<dyn tessera_sandbox::CommandCheck>) {
        *self.inner.guard.write().unwrap_or_else(|p| p.into_inner()) = g;
    }

    fn redact_outcome(&self, tenant: &str, e: &mut Entry) {
        let g = self
            .inner
            .guard
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let at = format!("tool {} call {} result", e.tool, e.id);
        if let Some(v) = e.result.as_mut() {
            tessera_sandbox::redact_json(&*g, Some(tenant), &at, v);
        }
        for m in [e.error.as_mut(), e.note.as_mut()].into_iter().flatten() {
            if let Some(b) = g.redact(Some(tenant), &at, m.as_bytes()) {
                *m = String::from_utf8_lossy(&b).into_owned();
            }
        }
    }

    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// This process's owner id in ledger entries.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// Makes the next send stop at `f`, as if the process died there (tests).
    #[doc(hidden)]
    pub fn inject(&self, f: Fault) {
        self.inner.fault.store(f as u8, Ordering::SeqCst);
    }

    fn faulted(&self, f: Fault) -> bool {
        self.inner
            .fault
            .compare_exchange(f as u8, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Ledger writes committed by this gateway so far.
    pub fn ledger_writes(&self) -> usize {
        self.inner.ledger_writes.load(Ordering::Relaxed)
    }

    // ---- registry ----

    fn forget_tools(&self) {
        self.inner.tool_cache.lock().unwrap().clear();
    }

    /// Checks and registers a new tool. Secret header values are stored apart
    /// from it (see [`secrets`]).
    pub async fn register(&self, tenant: &str, spec: ToolSpec) -> Result<Object, AdminError> {
        self.write_tool(tenant, spec, secrets::Write::Create).await
    }

    /// Replaces (or creates) a tool; with `expected`, only if still at that version.
    /// A header sent back as [`SECRET_MARK`] keeps its stored secret.
    pub async fn put(
        &self,
        tenant: &str,
        name: &str,
        spec: ToolSpec,
        expected: Option<u64>,
    ) -> Result<Object, AdminError> {
        if spec.name != name {
            return Err(SpecError {
                field: "name".into(),
                message: format!("the body names {:?} but the path {name:?}", spec.name),
            }
            .into());
        }
        self.write_tool(tenant, spec, secrets::Write::Replace(expected))
            .await
    }

    pub async fn get_tool(&self, tenant: &str, name: &str) -> Result<Option<Object>, StoreError> {
        self.inner
            .store
            .get(&Key::new(kind::TOOL, tenant, name))
            .await
    }

    pub async fn list_tools(&self, tenant: &str) -> Result<Vec<Object>, StoreError> {
        Ok(self
            .inner
            .store
            .list(kind::TOOL, Some(tenant))
            .await?
            .objects)
    }

    /// Deletes a tool with its grants and secrets.
    pub async fn delete_tool(&self, tenant: &str, name: &str) -> Result<Object, AdminError> {
        let key = Key::new(kind::TOOL, tenant, name);
        let mut ops = vec![Op::Delete {
            key: key.clone(),
            expected: None,
        }];
        for k in [kind::GRANT, kind::SECRET] {
            let k = Key::new(k, tenant, name);
            if self.inner.store.get(&k).await?.is_some() {
                ops.push(Op::Delete {
                    key: k,
                    expected: None,
                });
            }
        }
        let r = self.inner.store.commit(ops).await;
        self.forget_tools();
        match r {
            Ok(mut v) => Ok(v.remove(0)),
            Err(StoreError::NotFound(_)) => Err(AdminError::NotFound(format!("tool {name:?}"))),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn grants(&self, tenant: &str, tool: &str) -> Result<Grants, StoreError> {
        let o = self
            .inner
            .store
            .get(&Key::new(kind::GRANT, tenant, tool))
            .await?;
        Ok(o.and_then(|o| serde_json::from_value(o.body).ok())
            .unwrap_or_default())
    }

    /// Adds (`add`) or removes a grant of a tool.
    pub async fn set_grant(
        &self,
        tenant: &str,
        tool: &str,
        grant: Grant,
        add: bool,
    ) -> Result<Grants, AdminError> {
        grant.check()?;
        if self.get_tool(tenant, tool).await?.is_none() {
            return Err(AdminError::NotFound(format!("tool {tool:?}")));
        }
        let key = Key::new(kind::GRANT, tenant, tool);
        for _ in 0..16 {
            let cur = self.inner.store.get(&key).await?;
            let mut g: Grants = cur
                .as_ref()
                .and_then(|o| serde_json::from_value(o.body.clone()).ok())
                .unwrap_or_default();
            if add {
                if !g.grants.contains(&grant) {
                    g.grants.push(grant.clone());
                    g.grants.sort();
                }
            } else {
                g.grants.retain(|x| x != &grant);
            }
            let r = match &cur {
                Some(o) => {
                    self.inner
                        .store
                        .update(key.clone(), Some(o.version), to_value(&g))
                        .await
                }
                None => self.inner.store.create(key.clone(), to_value(&g)).await,
            };
            self.forget_tools();
            match r {
                Ok(_) => return Ok(g),
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(AdminError::Conflict(
            "the grants changed under us 16 times: retry".into(),
        ))
    }

    fn compiled(&self, tenant: &str, o: &Object) -> Result<CompiledTool, StoreError> {
        let ck = (tenant.to_string(), o.name.clone());
        if let Some(c) = self.inner.compiled.lock().unwrap().get(&ck) {
            if c.version == o.version {
                return Ok(c.clone());
            }
        }
        let spec: ToolSpec = serde_json::from_value(o.body.clone())
            .map_err(|e| StoreError::Backend(format!("stored {} is unreadable: {e}", o.key())))?;
        let c = CompiledTool::compile(spec, o.version)
            .map_err(|e| StoreError::Backend(format!("stored {} is invalid: {e}", o.key())))?;
        self.inner.compiled.lock().unwrap().insert(ck, c.clone());
        Ok(c)
    }

    /// The session's runtime, checking that it may still call tools.
    async fn session_runtime(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<String>, CallError> {
        let o = self
            .inner
            .store
            .get(&Key::new(kind::SESSION, tenant, session))
            .await?
            .ok_or_else(|| CallError::SessionNotFound(session.into()))?;
        if let Some(state) = o.body.get("state").and_then(Value::as_str) {
            if matches!(state, "ended" | "failed" | "killed") {
                return Err(CallError::SessionOver {
                    session: session.into(),
                    state: state.into(),
                });
            }
        }
        Ok(o.body
            .get("runtime")
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    /// The tools `caller` may call for `session_id`, sorted by name.
    pub async fn granted_tools(
        &self,
        caller: &ToolCaller,
        session_id: &str,
    ) -> Result<Vec<CompiledTool>, CallError> {
        check_session_caller(caller, session_id)?;
        let runtime = self.session_runtime(&caller.tenant, session_id).await?;
        self.tools_where(&caller.tenant, |g| {
            g.admits(runtime.as_deref(), &caller.role)
        })
        .await
    }

    /// The tools a key without a session may browse (an IDE-style MCP client): every
    /// tool of its tenant one of whose grants admits the key's role, whatever runtime
    /// the grant names, sorted by name. Calling one still needs a session it is
    /// granted to. Session keys get [`ToolGateway::granted_tools`] instead.
    pub async fn browsable_tools(
        &self,
        caller: &ToolCaller,
    ) -> Result<Vec<CompiledTool>, CallError> {
        self.tools_where(&caller.tenant, |g| {
            g.grants.iter().any(|one| {
                let mut any_runtime = one.clone();
                any_runtime.runtime = None;
                any_runtime.admits(None, &caller.role)
            })
        })
        .await
    }

    async fn tools_where(
        &self,
        tenant: &str,
        admit: impl Fn(&Grants) -> bool,
    ) -> Result<Vec<CompiledTool>, CallError> {
        let tools = self.list_tools(tenant).await?;
        let grants = self.inner.store.list(kind::GRANT, Some(tenant)).await?;
        let mut out = Vec::new();
        for t in &tools {
            let g: Grants = grants
                .objects
                .iter()
                .find(|g| g.name == t.name)
                .and_then(|g| serde_json::from_value(g.body.clone()).ok())
                .unwrap_or_default();
            if admit(&g) {
                if let Ok(c) = self.compiled(tenant, t) {
                    out.push(c);
                }
            }
        }
        Ok(out)
    }

    // ---- calls ----

    /// Calls a tool through the ledger.
    pub async fn call(
        &self,
        caller: &ToolCaller,
        tool_name: &str,
        req: CallRequest,
    ) -> Result<CallOutcome, CallError> {
        let t0 = Instant::now();
        check_session_caller(caller, &req.session_id)?;
        for (field, v) in [
            ("session_id", &req.session_id),
            ("tool_call_id", &req.tool_call_id),
        ] {
            if v.is_empty() || v.len() > 200 {
                return Err(CallError::Invalid {
                    field: field.into(),
                    message: "use 1 to 200 characters".into(),
                });
            }
        }
        let key = match &req.idempotency_key {
            Some(k) if k.is_empty() || k.len() > 256 => {
                return Err(CallError::Invalid {
                    field: "idempotency_key".into(),
                    message: "use 1 to 256 characters, or leave it out".into(),
                });
            }
            Some(k) => k.clone(),
            None => ledger::default_key(&req.session_id, &req.tool_call_id),
        };
        let id = ledger::ledger_id(&key);
        let tenant = caller.tenant.as_str();
        let store = &self.inner.store;
        let tkey = Key::new(kind::TOOL, tenant, tool_name);
        let gkey = Key::new(kind::GRANT, tenant, tool_name);
        let skey = Key::new(kind::SECRET, tenant, tool_name);
        let tck = (tenant.to_string(), tool_name.to_string());
        let sck = (tenant.to_string(), req.session_id.clone());
        let cached_tool = fresh(&self.inner.tool_cache, &tck);
        let cached_session = fresh(&self.inner.session_cache, &sck);
        let (tool_grants, runtime) = tokio::join!(
            async {
                match cached_tool {
                    Some(tg) => Ok::<_, StoreError>(tg),
                    None => {
                        let (t, g, s) =
                            tokio::join!(store.get(&tkey), store.get(&gkey), store.get(&skey));
                        let tg = (t?, g?, s?);
                        self.inner
                            .tool_cache
                            .lock()
                            .unwrap()
                            .insert(tck.clone(), (Instant::now(), tg.clone()));
                        Ok(tg)
                    }
                }
            },
            async {
                match cached_session {
                    Some(r) => Ok::<_, CallError>(r),
                    None => {
                        let r = self.session_runtime(tenant, &req.session_id).await?;
                        self.inner
                            .session_cache
                            .lock()
                            .unwrap()
                            .insert(sck.clone(), (Instant::now(), r.clone()));
                        Ok(r)
                    }
                }
            }
        );
        let (tool, grants, secrets) = tool_grants?;
        let tool = tool.ok_or_else(|| CallError::ToolNotFound(tool_name.into()))?;
        let runtime = runtime?;
        let grants: Grants = grants
            .and_then(|o| serde_json::from_value(o.body).ok())
            .unwrap_or_default();
        if !grants.admits(runtime.as_deref(), &caller.role) {
            return Err(CallError::NotGranted {
                tool: tool_name.into(),
                runtime,
                role: caller.role.clone(),
            });
        }
        let tool = self.compiled(tenant, &tool)?;
        tool.check_arguments(&req.arguments)
            .map_err(CallError::InvalidArguments)?;
        let secrets = secrets
            .as_ref()
            .map(secrets::secrets_of)
            .transpose()?
            .unwrap_or_default();
        let hash = ledger::args_hash(&req.arguments);
        let started_ms = now_ms();
        let (session, tool_call_id, fee, agent) = (
            req.session_id.clone(),
            req.tool_call_id.clone(),
            tool.spec.fee,
            runtime.clone().unwrap_or_default(),
        );
        let call = Arc::new(Call {
            tenant: tenant.to_string(),
            id,
            key,
            hash,
            runtime,
            req,
            tool,
            secrets,
        });
        let mut out = self.run(call).await?;
        out.timing.total_us = t0.elapsed().as_micros() as u64;
        tracing::info!(
            tenant = %tenant,
            session_id = %session,
            agent_id = %agent,
            tool_call_id = %tool_call_id,
            ledger_id = %out.ledger_id,
            tool = %tool_name,
            status = ?out.status,
            replayed = out.replayed,
            duration_ms = out.timing.total_us as f64 / 1000.0,
            "tool call {tool_call_id} ({tool_name}): {:?}",
            out.status
        );
        // One `execute_tool` span per call that ended (a replay or a call still
        // waiting for its approval adds none), with its fee as its cost.
        if !out.replayed
            && matches!(
                out.status,
                Status::Completed | Status::Failed | Status::Denied | Status::InDoubt
            )
        {
            let span = tool_span(
                tool_name,
                &session,
                &tool_call_id,
                &out,
                started_ms,
                if out.status == Status::Completed {
                    fee
                } else {
                    0.0
                },
            );
            if let Err(e) = crate::trace::record_span(store, tenant, span).await {
                tracing::warn!(
                    session_id = %session,
                    tool_call_id = %tool_call_id,
                    ledger_id = %out.ledger_id,
                    "tool gateway: recording the span of ledger {}: {e}",
                    out.ledger_id
                );
            }
        }
        Ok(out)
    }

    async fn run(&self, call: Arc<Call>) -> Result<CallOutcome, CallError> {
        let fk: FlightKey = (call.tenant.clone(), call.id.clone());
        let traits = ledger::Traits {
            resend_safe: call.tool.resend_safe(),
            needs_approval: call.tool.spec.approval.is_some(),
        };
        let mut optimistic = !traits.resend_safe && !traits.needs_approval;
        for _round in 0..64 {
            // A send of the same key in this process: wait for its outcome.
            let follow = self.inner.inflight.lock().unwrap().get(&fk).cloned();
            if let Some(mut rx) = follow {
                let out = rx
                    .wait_for(|o| o.is_some())
                    .await
                    .ok()
                    .and_then(|o| o.clone());
                match out {
                    Some(mut o) => {
                        o.replayed = true;
                        o.timing = Timing::default();
                        return Ok(o);
                    }
                    None => continue,
                }
            }
            let recent = self.inner.recent.lock().unwrap().get(&fk).cloned();
            // A call that must be written before it is sent skips the read on
            // its first round: creating the entry fails if one exists (then
            // the next round reads it), so the read would only cost time.
            let skip_read = optimistic && recent.is_none();
            optimistic = false;
            let (entry, version) = match recent {
                Some(e) => (Some(e), None),
                None if skip_read => (None, None),
                None => match self
                    .inner
                    .store
                    .get(&Key::new(kind::LEDGER, &call.tenant, &call.id))
                    .await?
                {
                    Some(o) => (Some(entry_of(&o)?), Some(o.version)),
                    None => (None, None),
                },
            };
            if let (None, Some(e)) = (version, entry.as_ref()) {
                // Known from memory, not yet durable: it is final (only outcomes
                // are written in the background).
                if e.tool != call.tool.spec.name || e.args_hash != call.hash {
                    return Err(CallError::KeyReused {
                        key: call.key.clone(),
                        ledger_id: call.id.clone(),
                    });
                }
                return Ok(outcome_of(e, true));
            }
            // Looked at after the store read: a send of this process either is
            // still in flight, or its outcome is in `recent` until durable.
            let in_flight = self.inner.inflight.lock().unwrap().contains_key(&fk)
                || self.inner.recent.lock().unwrap().contains_key(&fk);
            let now = now_ms();
            let action = ledger::decide(
                entry.as_ref(),
                &call.tool.spec.name,
                &call.hash,
                traits,
                ledger::Here {
                    owner: &self.inner.owner,
                    exclusive: self.inner.cfg.exclusive,
                    in_flight,
                    now_ms: now,
                },
            );
            use ledger::Action;
            match action {
                Action::Replay => return Ok(outcome_of(entry.as_ref().unwrap(), true)),
                Action::KeyReused => {
                    return Err(CallError::KeyReused {
                        key: call.key.clone(),
                        ledger_id: call.id.clone(),
                    });
                }
                Action::AwaitApproval => return Ok(outcome_of(entry.as_ref().unwrap(), true)),
                Action::RequestApproval => {
                    let ttl = call
                        .tool
                        .spec
                        .approval
                        .as_ref()
                        .map_or(0, |a| a.ttl_seconds);
                    let mut e = self.new_entry(&call, State::Intended, now);
                    e.approval = Some(Approval {
                        expires_at_ms: now + ttl * 1000,
                        decision: None,
                        by: None,
                    });
                    let mut ops = vec![Op::Create {
                        key: Key::new(kind::LEDGER, &call.tenant, &call.id),
                        body: to_value(&e),
                    }];
                    ops.extend(index_op(&call.tenant, &call.id, None, Some(e.state)));
                    match self.inner.store.commit(ops).await {
                        Ok(_) => {
                            self.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
                            self.publish(
                                &call.tenant,
                                json!({
                                    "approval_id": e.id, "event": "requested", "tool": e.tool,
                                    "session_id": e.session_id, "tool_call_id": e.tool_call_id,
                                    "arguments": e.arguments, "expires_at_ms": now + ttl * 1000,
                                }),
                            )
                            .await;
                            return Ok(outcome_of(&e, false));
                        }
                        Err(StoreError::AlreadyExists(_)) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
                Action::Deny { expired } => {
                    let mut e = entry.unwrap();
                    let before = e.state;
                    e.state = State::Denied;
                    e.updated_at_ms = now;
                    e.error = Some(if expired {
                        "nobody approved the call before its approval expired".into()
                    } else {
                        format!(
                            "denied by {}",
                            e.approval
                                .as_ref()
                                .and_then(|a| a.by.clone())
                                .unwrap_or_default()
                        )
                    });
                    match self.cas(&call.tenant, before, &e, version).await {
                        Ok(()) => {
                            if expired {
                                self.publish(
                                    &call.tenant,
                                    json!({"approval_id": e.id, "decision": "deny", "by": "timeout"}),
                                )
                                .await;
                            }
                            return Ok(outcome_of(&e, true));
                        }
                        Err(StoreError::Conflict { .. }) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
                Action::MarkInDoubt => {
                    let mut e = entry.unwrap();
                    let before = e.state;
                    e.state = State::InDoubt;
                    e.updated_at_ms = now;
                    e.note = Some(format!(
                        "sent by {} (attempt {}), which stopped before recording the outcome; the tool does not honour idempotency keys, so it is not sent again: check the tool and resolve this entry",
                        e.owner, e.attempts
                    ));
                    match self.cas(&call.tenant, before, &e, version).await {
                        Ok(()) => return Ok(outcome_of(&e, true)),
                        Err(StoreError::Conflict { .. }) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
                Action::Wait => {
                    // Another sender holds the lease: poll until it records, or
                    // its lease runs out (then the next round takes over).
                    let e = entry.unwrap();
                    if e.owner == self.inner.owner {
                        // Ours: follow it through `inflight` on the next round.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    let waited = Instant::now();
                    loop {
                        if now_ms() >= e.lease_until_ms {
                            break;
                        }
                        if waited.elapsed() >= Duration::from_secs(5) {
                            return Ok(outcome_of(&e, true));
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let o = self
                            .inner
                            .store
                            .get(&Key::new(kind::LEDGER, &call.tenant, &call.id))
                            .await?;
                        if o.map(|o| o.version) != version {
                            break;
                        }
                    }
                    continue;
                }
                Action::Dispatch {
                    write_first,
                    takeover,
                } => {
                    // Become the one sender of this key in this process.
                    let (tx, rx) = watch::channel(None);
                    {
                        let mut m = self.inner.inflight.lock().unwrap();
                        if m.contains_key(&fk) {
                            continue;
                        }
                        m.insert(fk.clone(), rx);
                    }
                    let me = self.clone();
                    let c = call.clone();
                    let fk2 = fk.clone();
                    // The send runs to its end even if the caller goes away.
                    let h = tokio::spawn(async move {
                        let r = me.lead(&c, entry, version, write_first, takeover).await;
                        if let Ok(Some(o)) = &r {
                            let _ = tx.send(Some(o.clone()));
                        }
                        me.inner.inflight.lock().unwrap().remove(&fk2);
                        r
                    });
                    match h.await {
                        Ok(Ok(Some(o))) => return Ok(o),
                        Ok(Ok(None)) => continue,
                        Ok(Err(e)) => return Err(e),
                        Err(e) => {
                            return Err(CallError::Store(StoreError::Backend(format!(
                                "the call's task stopped: {e}"
                            ))));
                        }
                    }
                }
            }
        }
        Err(CallError::Store(StoreError::Backend(
            "the ledger entry kept changing under this call: retry".into(),
        )))
    }

    fn new_entry(&self, call: &Call, state: State, now: u64) -> Entry {
        Entry {
            id: call.id.clone(),
            session_id: call.req.session_id.clone(),
            tool_call_id: call.req.tool_call_id.clone(),
            idempotency_key: call.key.clone(),
            tool: call.tool.spec.name.clone(),
            runtime: call.runtime.clone(),
            args_hash: call.hash.clone(),
            arguments: call.req.arguments.clone(),
            state,
            attempts: 0,
            owner: self.inner.owner.clone(),
            lease_until_ms: 0,
            created_at_ms: now,
            updated_at_ms: now,
            result: None,
            error: None,
            approval: None,
            note: None,
        }
    }

    /// Writes `e` over the stored entry at `version` (compare-and-swap), with
    /// its open-index change from `before`.
    async fn cas(
        &self,
        tenant: &str,
        before: State,
        e: &Entry,
        version: Option<u64>,
    ) -> Result<(), StoreError> {
        let op = Op::Update {
            key: Key::new(kind::LEDGER, tenant, &e.id),
            expected: version,
            body: to_value(e),
        };
        let index = index_op(tenant, &e.id, Some(before), Some(e.state));
        self.commit_indexed(op, index).await?;
        self.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Commits an entry's write with its open-index change. An index object
    /// found missing (an entry written before the index existed) does not
    /// hold the entry's write back.
    async fn commit_indexed(&self, op: Op, index: Option<Op>) -> Result<Object, StoreError> {
        let Some(index) = index else {
            return Ok(self.inner.store.commit(vec![op]).await?.remove(0));
        };
        let deleting_index = matches!(index, Op::Delete { .. });
        match self.inner.store.commit(vec![op.clone(), index]).await {
            Ok(mut v) => Ok(v.remove(0)),
            Err(StoreError::NotFound(k)) if deleting_index && k.kind == kind::LEDGER_OPEN => {
                Ok(self.inner.store.commit(vec![op]).await?.remove(0))
            }
            Err(e) => Err(e),
        }
    }

    /// Sends a call this process leads. `Ok(None)`: lost a race, decide again.
    async fn lead(
        &self,
        call: &Call,
        entry: Option<Entry>,
        version: Option<u64>,
        write_first: bool,
        takeover: bool,
    ) -> Result<Option<CallOutcome>, CallError> {
        let now = now_ms();
        let lease =
            call.tool.timeout() * self.inner.cfg.max_attempts.max(1) + self.inner.cfg.lease_margin;
        let before = entry.as_ref().map(|e| e.state);
        let mut e = match entry {
            Some(e) => e,
            None => self.new_entry(call, State::Dispatched, now),
        };
        e.state = State::Dispatched;
        e.owner = self.inner.owner.clone();
        e.lease_until_ms = now + lease.as_millis() as u64;
        e.updated_at_ms = now;
        e.attempts += 1;
        let key = Key::new(kind::LEDGER, &call.tenant, &call.id);
        // The durable record that must precede the side effect.
        let mut version = version;
        if write_first {
            let op = if takeover {
                Op::Update {
                    key: key.clone(),
                    expected: version,
                    body: to_value(&e),
                }
            } else {
                Op::Create {
                    key: key.clone(),
                    body: to_value(&e),
                }
            };
            let index = index_op(&call.tenant, &call.id, before, Some(State::Dispatched));
            let r = self.commit_indexed(op, index).await;
            match r {
                Ok(o) => {
                    self.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
                    version = Some(o.version);
                }
                Err(StoreError::AlreadyExists(_) | StoreError::Conflict { .. }) => {
                    return Ok(None);
                }
                Err(err) => return Err(err.into()),
            }
        }
        if self.faulted(Fault::AfterIntent) {
            return Err(crashed());
        }
        let ids = dispatch::CallIds {
            tenant: &call.tenant,
            session_id: &call.req.session_id,
            tool_call_id: &call.req.tool_call_id,
            idempotency_key: &call.key,
        };
        let mut tool_us = 0u64;
        let sent = loop {
            let t = Instant::now();
            let s = self
                .inner
                .dispatcher
                .send(&call.tool, &call.secrets, &ids, &call.req.arguments)
                .await;
            tool_us += t.elapsed().as_micros() as u64;
            match s {
                Sent::Unknown(_)
                    if call.tool.resend_safe() && e.attempts < self.inner.cfg.max_attempts =>
                {
                    e.attempts += 1;
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(e.attempts))).await;
                }
                s => break s,
            }
        };
        if self.faulted(Fault::AfterSend) {
            return Err(crashed());
        }
        let now = now_ms();
        e.updated_at_ms = now;
        e.lease_until_ms = 0;
        let recorded = match sent {
            Sent::Ok(v) => {
                match call.tool.check_result(&v) {
                    Ok(()) => {
                        e.state = State::Completed;
                    }
                    Err(viol) => {
                        e.state = State::Failed;
                        e.error = Some(format!(
                            "the tool's result does not match its output_schema at {}: {}",
                            viol.path, viol.message
                        ));
                    }
                }
                e.result = Some(v);
                true
            }
            Sent::Failed(msg) => {
                e.state = State::Failed;
                e.error = Some(msg);
                true
            }
            Sent::Unknown(msg) if !call.tool.resend_safe() => {
                e.state = State::InDoubt;
                e.note = Some(format!(
                    "the outcome is unknown ({msg}) and the tool does not honour idempotency keys: check the tool and resolve this entry"
                ));
                true
            }
            Sent::Unknown(msg) | Sent::NotSent(msg) => {
                // Surely not executed, or safe to send again: record nothing, so
                // that calling again with the same key sends it again.
                e.state = State::Failed;
                e.error = Some(msg);
                false
            }
        };
        // Whatever the tool said, in a result, an error or an in-doubt note.
        self.redact_outcome(&call.tenant, &mut e);
        let out = {
            let mut o = outcome_of(&e, recorded);
            o.replayed = false;
            o.timing.tool_us = tool_us;
            o
        };
        if !recorded {
            if write_first {
                // Undo the `dispatched` record: back to no entry, or to the
                // approved (or resend-requested) intent it was taken from.
                if takeover {
                    e.state = State::Intended;
                    e.owner = self.inner.owner.clone();
                    self.inner
                        .store
                        .update(key, version, to_value(&e))
                        .await
                        .map_err(CallError::Store)?;
                } else {
                    let index = index_op(&call.tenant, &call.id, Some(State::Dispatched), None);
                    self.commit_indexed(
                        Op::Delete {
                            key,
                            expected: version,
                        },
                        index,
                    )
                    .await
                    .map_err(CallError::Store)?;
                }
                self.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Some(out));
        }
        let fee = call.tool.spec.fee;
        let usage = (e.state == State::Completed && fee > 0.0).then(|| crate::meter::UsageRecord {
            tenant: call.tenant.clone(),
            session: e.session_id.clone(),
            runtime: e.runtime.clone().unwrap_or_default(),
            kind: crate::meter::UsageKind::ToolFee,
            quantity: fee,
            at_ms: now,
            source_id: format!("tool/{}", e.id),
        });
        let (op, index) = if write_first {
            let op = Op::Update {
                key,
                expected: version,
                body: to_value(&e),
            };
            let index = index_op(
                &call.tenant,
                &call.id,
                Some(State::Dispatched),
                Some(e.state),
            );
            (op, index)
        } else {
            let op = Op::Create {
                key,
                body: to_value(&e),
            };
            (op, None)
        };
        self.record(&call.tenant, e, op, index, usage).await;
        Ok(Some(out))
    }

    /// Writes an outcome: in the background (served from memory until durable)
    /// or before the reply, as configured.
    async fn record(
        &self,
        tenant: &str,
        e: Entry,
        op: Op,
        index: Option<Op>,
        usage: Option<crate::meter::UsageRecord>,
    ) {
        let fk: FlightKey = (tenant.to_string(), e.id.clone());
        let me = self.clone();
        let lose = self.faulted(Fault::LoseOutcome);
        let write = async move {
            // The fee first: the tool answered, so the call happened. Were the
            // process to die between the two writes, the fee is kept and the
            // ledger entry is left as it was (replayed or re-sent with the same
            // key, whose fee the meter counts once); the other order would
            // lose the fee of a call the ledger records as completed.
            if let Some(u) = usage.filter(|_| !lose) {
                // Once per ledger entry: the meter counts a source id once.
                if let Err(err) = crate::meter::record(&me.inner.store, u).await {
                    tracing::warn!(
                        ledger_id = %fk.1,
                        "tool gateway: metering ledger {} failed: {err}",
                        fk.1
                    );
                }
            }
            let r = if lose {
                Err(StoreError::Closed)
            } else {
                me.commit_indexed(op, index).await.map(|_| ())
            };
            match r {
                Ok(_) => {
                    me.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
                }
                Err(StoreError::AlreadyExists(_) | StoreError::Conflict { .. }) => {
                    // Another replica recorded this key meanwhile: its record stands.
                }
                Err(StoreError::Closed) if lose => {}
                Err(err) => {
                    tracing::warn!(
                        ledger_id = %fk.1,
                        "tool gateway: recording ledger {} failed: {err}",
                        fk.1
                    );
                }
            }
            me.inner.recent.lock().unwrap().remove(&fk);
            me.inner.pending_writes.fetch_sub(1, Ordering::AcqRel);
            me.inner.written.notify_waiters();
        };
        self.inner.pending_writes.fetch_add(1, Ordering::AcqRel);
        match self.inner.cfg.completion {
            Completion::Background => {
                self.inner
                    .recent
                    .lock()
                    .unwrap()
                    .insert((tenant.to_string(), e.id.clone()), e);
                tokio::spawn(write);
            }
            Completion::BeforeReply => write.await,
        }
    }

    /// Waits until every outcome written in the background is durable.
    pub async fn flush(&self) {
        loop {
            let n = self.inner.written.notified();
            if self.inner.pending_writes.load(Ordering::Acquire) == 0 {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), n).await;
        }
    }

    /// Publishes on the tenant's `approvals` topic (durable; a failure is logged,
    /// the ledger entry stays the source of truth).
    async fn publish(&self, tenant: &str, payload: Value) {
        if let Err(e) = crate::events::publish(
            &self.inner.store,
            tenant,
            APPROVALS_TOPIC,
            payload,
            now_ms(),
        )
        .await
        {
            tracing::warn!("tool gateway: publishing on {tenant}/{APPROVALS_TOPIC} failed: {e}");
        }
    }

    // ---- ledger administration ----

    /// Ledger entries of a tenant, optionally of one session and in one state,
    /// oldest first.
    pub async fn ledger(
        &self,
        tenant: &str,
        session_id: Option<&str>,
        state: Option<State>,
    ) -> Result<Vec<Entry>, StoreError> {
        let l = self.inner.store.list(kind::LEDGER, Some(tenant)).await?;
        let mut out: Vec<Entry> = l
            .objects
            .iter()
            .filter_map(|o| entry_of(o).ok())
            .filter(|e| session_id.is_none_or(|s| e.session_id == s))
            .filter(|e| state.is_none_or(|s| e.state == s))
            .collect();
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(out)
    }

    pub async fn entry(&self, tenant: &str, id: &str) -> Result<Option<Entry>, StoreError> {
        if let Some(e) = self
            .inner
            .recent
            .lock()
            .unwrap()
            .get(&(tenant.to_string(), id.to_string()))
        {
            return Ok(Some(e.clone()));
        }
        match self
            .inner
            .store
            .get(&Key::new(kind::LEDGER, tenant, id))
            .await?
        {
            Some(o) => Ok(Some(entry_of(&o)?)),
            None => Ok(None),
        }
    }

    /// Resolves an in-doubt entry after someone checked the tool.
    pub async fn resolve(
        &self,
        tenant: &str,
        id: &str,
        r: Resolution,
        by: &str,
    ) -> Result<Entry, AdminError> {
        let key = Key::new(kind::LEDGER, tenant, id);
        let o = self
            .inner
            .store
            .get(&key)
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("ledger entry {id:?}")))?;
        let mut e = entry_of(&o)?;
        if e.state != State::InDoubt {
            return Err(AdminError::Conflict(format!(
                "ledger entry {id} is {}, not in_doubt: only in-doubt entries are resolved",
                e.state.as_str()
            )));
        }
        let now = now_ms();
        e.updated_at_ms = now;
        match r.outcome {
            ResolvedAs::Completed => {
                e.state = State::Completed;
                e.result = Some(r.result.unwrap_or(Value::Null));
            }
            ResolvedAs::Failed => {
                e.state = State::Failed;
                e.error = Some(r.error.unwrap_or_else(|| "resolved as failed".into()));
            }
            ResolvedAs::Resend => {
                e.state = State::Intended;
                e.approval = None;
            }
        }
        e.note = Some(format!(
            "resolved as {:?} by {by} at {now}{}",
            r.outcome,
            e.note
                .as_deref()
                .map(|n| format!(" (was: {n})"))
                .unwrap_or_default()
        ));
        let index = index_op(tenant, id, Some(State::InDoubt), Some(e.state));
        self.commit_indexed(
            Op::Update {
                key,
                expected: Some(o.version),
                body: to_value(&e),
            },
            index,
        )
        .await
        .map_err(|err| match err {
            StoreError::Conflict { .. } | StoreError::AlreadyExists(_) => {
                AdminError::Conflict(format!("ledger entry {id} changed meanwhile: retry"))
            }
            err => err.into(),
        })?;
        Ok(e)
    }

    /// Approves or denies a pending approval (its id is the ledger id).
    pub async fn decide_approval(
        &self,
        tenant: &str,
        id: &str,
        decision: Decision,
        by: &str,
    ) -> Result<Entry, AdminError> {
        let key = Key::new(kind::LEDGER, tenant, id);
        let o = self
            .inner
            .store
            .get(&key)
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("approval {id:?}")))?;
        let mut e = entry_of(&o)?;
        let now = now_ms();
        let open = e.state == State::Intended
            && e.approval
                .as_ref()
                .is_some_and(|a| a.decision.is_none() && now < a.expires_at_ms);
        if !open {
            return Err(AdminError::Conflict(format!(
                "approval {id} is not open (the call is {}{})",
                e.state.as_str(),
                if e.approval.as_ref().is_some_and(|a| now >= a.expires_at_ms) {
                    ", and its approval expired"
                } else {
                    ""
                }
            )));
        }
        if let Some(a) = &mut e.approval {
            a.decision = Some(decision);
            a.by = Some(by.to_string());
        }
        e.updated_at_ms = now;
        self.inner
            .store
            .update(key, Some(o.version), to_value(&e))
            .await
            .map_err(|err| match err {
                StoreError::Conflict { .. } => {
                    AdminError::Conflict(format!("approval {id} changed meanwhile: retry"))
                }
                err => err.into(),
            })?;
        let d = match decision {
            Decision::Approve => "approve",
            Decision::Deny => "deny",
        };
        self.publish(tenant, json!({"approval_id": id, "decision": d, "by": by}))
            .await;
        Ok(e)
    }

    /// Open approvals of a tenant.
    pub async fn approvals(&self, tenant: &str) -> Result<Vec<Entry>, StoreError> {
        let open = self
            .inner
            .store
            .list(kind::LEDGER_OPEN, Some(tenant))
            .await?;
        let mut out = Vec::new();
        for o in &open.objects {
            if let Some(e) = self
                .inner
                .store
                .get(&Key::new(kind::LEDGER, tenant, &o.name))
                .await?
            {
                let e = entry_of(&e)?;
                if e.state == State::Intended
                    && e.approval.as_ref().is_some_and(|a| a.decision.is_none())
                {
                    out.push(e);
                }
            }
        }
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(out)
    }

    /// Puts entries written before the open index existed into it (once per
    /// store: a marker records that it was done). Run at start, before
    /// [`ToolGateway::sweep`].
    pub async fn reindex(&self) -> Result<usize, StoreError> {
        let marker = Key::new(kind::LEDGER_META, "", "indexed");
        if self.inner.store.get(&marker).await?.is_some() {
            return Ok(0);
        }
        let l = self.inner.store.list(kind::LEDGER, None).await?;
        let mut n = 0;
        for o in &l.objects {
            let Ok(e) = entry_of(o) else { continue };
            if !is_open(e.state) {
                continue;
            }
            match self
                .inner
                .store
                .create(open_key(&o.tenant, &o.name), json!({}))
                .await
            {
                Ok(_) => n += 1,
                Err(StoreError::AlreadyExists(_)) => {}
                Err(err) => return Err(err),
            }
        }
        match self
            .inner
            .store
            .create(marker, json!({"at_ms": now_ms()}))
            .await
        {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(n),
            Err(err) => Err(err),
        }
    }

    /// Housekeeping, run at start and then periodically: entries orphaned by a
    /// dead sender are marked in doubt (tools that are not re-send safe); open
    /// approvals past their time are denied. Returns how many entries changed.
    ///
    /// It reads the open index (one object per `intended` or `dispatched`
    /// entry), not the ledger: its cost follows the calls in flight and the
    /// open approvals, not the ledger's size.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        let open = self.inner.store.list(kind::LEDGER_OPEN, None).await?;
        let now = now_ms();
        let mut changed = 0;
        for ix in &open.objects {
            let entry = self
                .inner
                .store
                .get(&Key::new(kind::LEDGER, &ix.tenant, &ix.name))
                .await?;
            let open_entry = entry
                .as_ref()
                .and_then(|o| entry_of(o).ok())
                .is_some_and(|e| is_open(e.state));
            if !open_entry {
                // Not open (written by hand, or half of a lost race): drop the
                // index object, unless it changed meanwhile.
                match self.inner.store.delete(ix.key(), Some(ix.version)).await {
                    Ok(_) | Err(StoreError::NotFound(_) | StoreError::Conflict { .. }) => {}
                    Err(err) => return Err(err),
                }
                continue;
            }
            let Some(o) = entry else { continue };
            let o = &o;
            let Ok(mut e) = entry_of(o) else { continue };
            let before = e.state;
            let fk = (o.tenant.clone(), o.name.clone());
            match e.state {
                State::Dispatched => {
                    let in_flight = self.inner.inflight.lock().unwrap().contains_key(&fk)
                        || self.inner.recent.lock().unwrap().contains_key(&fk);
                    let tool = self
                        .inner
                        .store
                        .get(&Key::new(kind::TOOL, &o.tenant, &e.tool))
                        .await?
                        .and_then(|t| self.compiled(&o.tenant, &t).ok());
                    let traits = ledger::Traits {
                        // A deleted tool is treated as the unsafe kind.
                        resend_safe: tool.as_ref().is_some_and(|t| t.resend_safe()),
                        needs_approval: false,
                    };
                    let here = ledger::Here {
                        owner: &self.inner.owner,
                        exclusive: self.inner.cfg.exclusive,
                        in_flight,
                        now_ms: now,
                    };
                    // Only the in-doubt marking is done here; a re-send-safe call
                    // is re-sent with the same key when the agent calls again.
                    if ledger::decide(
                        Some(&e),
                        &e.tool.clone(),
                        &e.args_hash.clone(),
                        traits,
                        here,
                    ) != ledger::Action::MarkInDoubt
                    {
                        continue;
                    }
                    e.state = State::InDoubt;
                    e.updated_at_ms = now;
                    e.note = Some(format!(
                        "found orphaned after a restart (sent by {}, attempt {}); the tool does not honour idempotency keys, so it is not sent again: check the tool and resolve this entry",
                        e.owner, e.attempts
                    ));
                }
                State::Intended
                    if e.approval
                        .as_ref()
                        .is_some_and(|a| a.decision.is_none() && now >= a.expires_at_ms) =>
                {
                    e.state = State::Denied;
                    e.updated_at_ms = now;
                    e.error = Some("nobody approved the call before its approval expired".into());
                }
                _ => continue,
            }
            let index = index_op(&o.tenant, &o.name, Some(before), Some(e.state));
            let op = Op::Update {
                key: o.key(),
                expected: Some(o.version),
                body: to_value(&e),
            };
            match self.commit_indexed(op, index).await {
                Ok(_) => {
                    changed += 1;
                    if e.state == State::Denied {
                        self.publish(
                            &o.tenant,
                            json!({"approval_id": e.id, "decision": "deny", "by": "timeout"}),
                        )
                        .await;
                    }
                }
                Err(StoreError::Conflict { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(changed)
    }
}

/// How an in-doubt entry was resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resolution {
    pub outcome: ResolvedAs,
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolvedAs {
    /// It happened: record this result.
    Completed,
    /// It did not happen and must not: record a failure.
    Failed,
    /// It did not happen: send it again on the next call with this key.
    Resend,
}

struct Call {
    tenant: String,
    id: String,
    key: String,
    hash: String,
    runtime: Option<String>,
    req: CallRequest,
    tool: CompiledTool,
    /// Its secret header values: put on the outgoing request only.
    secrets: ToolSecrets,
}

fn crashed() -> CallError {
    CallError::Store(StoreError::Backend("injected crash".into()))
}

fn check_session_caller(caller: &ToolCaller, session_id: &str) -> Result<(), CallError> {
    match caller.own_session() {
        Some(s) if s != session_id => Err(CallError::NotYourSession {
            subject: caller.subject.clone(),
            session: session_id.into(),
        }),
        _ => Ok(()),
    }
}

/// The answer an entry gives.
pub fn outcome_of(e: &Entry, replayed: bool) -> CallOutcome {
    let (status, approval_id, exp) = match e.state {
        State::Completed => (Status::Completed, None, None),
        State::Failed => (Status::Failed, None, None),
        State::InDoubt => (Status::InDoubt, None, None),
        State::Denied => (Status::Denied, Some(e.id.clone()), None),
        State::Dispatched => (Status::InProgress, None, None),
        State::Intended => match &e.approval {
            Some(a) => (
                Status::PendingApproval,
                Some(e.id.clone()),
                Some(a.expires_at_ms),
            ),
            None => (Status::InProgress, None, None),
        },
    };
    CallOutcome {
        status,
        ledger_id: e.id.clone(),
        result: e.result.clone(),
        error: e
            .error
            .clone()
            .or_else(|| (e.state == State::InDoubt).then(|| e.note.clone().unwrap_or_default())),
        approval_id,
        approval_expires_at_ms: exp,
        recorded: true,
        replayed,
        timing: Timing::default(),
    }
}
