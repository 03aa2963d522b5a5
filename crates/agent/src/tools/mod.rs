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

mod admin;
mod approvals;
pub mod bench;
mod call;
pub mod dispatch;
pub mod ledger;
mod maintenance;
mod registry;
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

pub use admin::{Resolution, ResolvedAs};
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
