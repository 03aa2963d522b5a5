//! Agent platform: runtimes, versions, endpoints, sessions, memory, checkpoints, events, usage, traces (issue 8).
//!
//! This module owns its state ([`AgentsState`]), its configuration
//! ([`AgentsConfig`], a field of [`crate::ServerConfig`]), its routes and its
//! OpenAPI schemas; handlers only translate between HTTP and `tessera-agent`,
//! which owns the behaviour.
//!
//! Access: viewers read; developers deploy runtimes, invoke them and write
//! memory, checkpoints, events and usage; admins set prices and budgets. A
//! session-scoped key (subject `session:<id>`, minted for the agent inside
//! each session's sandbox) reaches only its own session.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream;
use serde::Deserialize;
use serde_json::{Value, json};
use tessera_agent::host::{Host, HostConfig, Minter};
use tessera_agent::meter::{self, PriceTable, UsageRecord};
use tessera_agent::runtimes::{self, RuntimeSpec};
use tessera_agent::sessions::{self, Checkpoint};
use tessera_agent::{AgentError, events, trace};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::StartError;
use crate::api::{App, Body, Q, SessionCaller};
use crate::auth::Role;
use crate::plane::{Caller, ControlPlane, now_ms};
use crate::problem::{ApiError, Code};
use crate::wire::NewApiKey;

mod topics;
use topics::*;

/// Settings for this module, from `tessera up` flags.
#[derive(Clone, Debug, Default)]
pub struct AgentsConfig {
    /// Sandboxes, pools, supervision and quotas of the session host.
    pub host: HostConfig,
}

/// What the handlers of this module share.
#[derive(Clone, Debug, Default)]
pub struct AgentsState {
    host: Option<Host>,
}

impl AgentsState {
    /// Starts this module: the session host, its supervision loop, and the
    /// recovery of sessions a previous server left starting or active.
    pub(crate) async fn start(
        plane: &ControlPlane,
        cfg: &AgentsConfig,
        stop: &watch::Receiver<bool>,
    ) -> Result<(Self, Vec<JoinHandle<()>>), StartError> {
        let p = plane.clone();
        let minter: Minter =
            std::sync::Arc::new(move |tenant: String, session: String, ttl: u64| {
                let p = p.clone();
                Box::pin(async move {
                    let system = Caller {
                        tenant,
                        subject: "system:agents".into(),
                        key_id: String::new(),
                        role: Role::Admin,
                    };
                    let v = p
                        .create_key(
                            &system,
                            NewApiKey {
                                subject: format!("session:{session}"),
                                role: Some(Role::Developer),
                                expires_in_seconds: Some(ttl),
                            },
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                    v.get("key")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| "no key in the reply".to_string())
                })
            });
        let mut host_cfg = cfg.host.clone();
        // The embedded store has one writer process: sessions another owner
        // left starting or active were orphaned by a restart. On PostgreSQL,
        // replicas share sessions and take over only after an owner's lease.
        host_cfg.exclusive = plane.store().backend() == "sqlite";
        // Session sandboxes answer to the same guard as every other workload.
        host_cfg.guard = plane.guard().clone();
        host_cfg.templates = plane.templates().cloned();
        let host = Host::new(plane.store().clone(), host_cfg, Some(minter));
        host.recover().await.map_err(|e| StartError::Component {
            what: "agents",
            message: format!("recovering sessions: {e}"),
        })?;
        let task = tokio::spawn(host.clone().run(stop.clone()));
        Ok((Self { host: Some(host) }, vec![task]))
    }

    /// The session host, for the tool gateway's built-in sandbox tools.
    pub(crate) fn session_host(&self) -> Option<Host> {
        self.host.clone()
    }

    fn host(&self) -> Result<&Host, ApiError> {
        self.host
            .as_ref()
            .ok_or_else(|| ApiError::new(Code::Unavailable, "the agent platform is not running"))
    }
}

impl From<AgentError> for ApiError {
    fn from(e: AgentError) -> Self {
        match e {
            AgentError::Invalid { field, message } => {
                ApiError::invalid(field.clone(), format!("{field}: {message}"))
            }
            AgentError::NotFound(w) => ApiError::not_found(w),
            AgentError::AlreadyExists(w) => {
                ApiError::new(Code::AlreadyExists, format!("{w} already exists"))
            }
            AgentError::Conflict(m) | AgentError::State(m) => ApiError::new(Code::Conflict, m),
            AgentError::Quota(m) => {
                ApiError::new(Code::QuotaExceeded, format!("quota exceeded: {m}"))
            }
            AgentError::Budget(m) => {
                ApiError::new(Code::BudgetExceeded, format!("budget exceeded: {m}"))
            }
            AgentError::Unavailable(m) => ApiError::new(Code::Unavailable, m),
            AgentError::Store(e) => ApiError::from(e),
        }
    }
}

use crate::api::{R, created, items, ok};

fn to_v<T: serde::Serialize>(v: &T) -> Result<Value, ApiError> {
    serde_json::to_value(v).map_err(ApiError::internal)
}

/// A session-scoped key reaches only its own session.
fn own_session(c: &Caller, id: &str) -> Result<(), ApiError> {
    match c.subject.strip_prefix("session:") {
        Some(s) if s != id => Err(ApiError::forbidden(format!(
            "{:?} may only use its own session, not {id:?}",
            c.subject
        ))),
        _ => Ok(()),
    }
}

/// A session as a tenant sees it: no host pid (it says nothing to a tenant and
/// something to an attacker); the store keeps it for crash recovery.
fn session_view(s: &sessions::Session) -> Result<Value, ApiError> {
    let mut v = to_v(s)?;
    if let Some(m) = v.as_object_mut() {
        m.remove("sandbox_pid");
    }
    Ok(v)
}

/// A session record from the store's change log, as the session list shows it, with
/// its `resource_version` (`/v1/watch?kind=session`); `None` for a record that does
/// not read as a session.
pub(crate) fn watched_session(o: &tessera_store::Object) -> Option<Value> {
    let s: sessions::Session = serde_json::from_value(o.body.clone()).ok()?;
    let mut v = session_view(&s).ok()?;
    v["resource_version"] = o.version.into();
    Some(v)
}

/// Writes into a session (memory, history, checkpoints, spans) need the session to
/// exist: a write for a session nobody started is a 404, not a stray record.
async fn session_exists(a: &App, tenant: &str, id: &str) -> Result<(), ApiError> {
    match sessions::get(a.plane.store(), tenant, id).await? {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found(format!(
            "session {}",
            crate::problem::quote(id)
        ))),
    }
}

// ---- runtimes ----

fn parse_spec(v: Value) -> Result<RuntimeSpec, ApiError> {
    serde_path_to_error::deserialize::<_, RuntimeSpec>(v).map_err(|e| {
        let path = e.path().to_string();
        ApiError::invalid(path.clone(), format!("{path}: {}", e.inner()))
    })
}

/// `POST /v1/runtimes`: a [`RuntimeSpec`] plus its `name`.
async fn create_runtime(State(a): State<App>, c: Caller, Body(mut b): Body<Value>) -> R {
    c.require(Role::Developer)?;
    a.plane
        .classes()
        .namespace_only(&c.tenant, "agent sessions")?;
    let h = a.agents.host()?;
    let name = match b.as_object_mut().and_then(|m| m.remove("name")) {
        Some(Value::String(n)) => n,
        _ => {
            return Err(ApiError::invalid(
                "name",
                "name: a runtime needs a name (a string)",
            ));
        }
    };
    let spec = parse_spec(b)?;
    h.check(&c.tenant, &spec)?;
    let v = runtimes::create(
        a.plane.store(),
        &c.tenant,
        &name,
        spec,
        h.config().quotas,
        now_ms(),
    )
    .await?;
    h.prime(&c.tenant, &v.spec)?;
    created(to_v(&v)?)
}
async fn list_runtimes(State(a): State<App>, c: Caller) -> R {
    c.require(Role::Viewer)?;
    items(runtimes::list(a.plane.store(), &c.tenant).await?)
}
async fn get_runtime(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    c.require(Role::Viewer)?;
    ok(runtimes::get(a.plane.store(), &c.tenant, &n).await?)
}
async fn update_runtime(
    State(a): State<App>,
    c: Caller,
    Path(n): Path<String>,
    Body(b): Body<Value>,
) -> R {
    c.require(Role::Developer)?;
    let h = a.agents.host()?;
    let spec = parse_spec(b)?;
    h.check(&c.tenant, &spec)?;
    let v = runtimes::update(
        a.plane.store(),
        &c.tenant,
        &n,
        spec,
        h.config().quotas,
        now_ms(),
    )
    .await?;
    h.prime(&c.tenant, &v.spec)?;
    ok(to_v(&v)?)
}
async fn delete_runtime(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    c.require(Role::Developer)?;
    runtimes::delete(a.plane.store(), &c.tenant, &n).await?;
    ok(json!({"deleted": n}))
}
async fn list_versions(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    c.require(Role::Viewer)?;
    let v = runtimes::versions(a.plane.store(), &c.tenant, &n).await?;
    items(v.iter().map(to_v).collect::<Result<_, _>>()?)
}
async fn get_version(State(a): State<App>, c: Caller, Path((n, v)): Path<(String, u64)>) -> R {
    c.require(Role::Viewer)?;
    ok(to_v(
        &runtimes::get_version(a.plane.store(), &c.tenant, &n, v).await?,
    )?)
}
async fn list_endpoints(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    c.require(Role::Viewer)?;
    items(runtimes::list_endpoints(a.plane.store(), &c.tenant, &n).await?)
}
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointSpec {
    version: u64,
}
async fn put_endpoint(
    State(a): State<App>,
    c: Caller,
    Path((n, e)): Path<(String, String)>,
    Body(b): Body<EndpointSpec>,
) -> R {
    c.require(Role::Developer)?;
    ok(runtimes::put_endpoint(a.plane.store(), &c.tenant, &n, &e, b.version).await?)
}
async fn delete_endpoint(
    State(a): State<App>,
    c: Caller,
    Path((n, e)): Path<(String, String)>,
) -> R {
    c.require(Role::Developer)?;
    runtimes::delete_endpoint(a.plane.store(), &c.tenant, &n, &e).await?;
    ok(json!({"deleted": e}))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InvokeQuery {
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
}

/// Invokes a runtime: the body goes to the agent's `POST /invocations` as is,
/// and its reply comes back as is, with `X-Tessera-Session-Id`.
async fn invoke(
    State(a): State<App>,
    c: Caller,
    Path(n): Path<String>,
    Q(q): Q<InvokeQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> R {
    c.require(Role::Developer)?;
    a.plane
        .classes()
        .namespace_only(&c.tenant, "agent sessions")?;
    let sid = q
        .session_id
        .or_else(|| {
            headers
                .get("x-tessera-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
        .or_else(|| c.subject.strip_prefix("session:").map(str::to_string))
        .unwrap_or_else(|| format!("s-{}", crate::auth::random_hex(12)));
    own_session(&c, &sid)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let inv = a
        .agents
        .host()?
        .invoke_with(tessera_agent::host::Invoke {
            tenant: &c.tenant,
            runtime: &n,
            endpoint: q.endpoint.as_deref(),
            session_id: &sid,
            payload: &body,
            content_type: &ct,
            started_by: Some(&c.subject),
        })
        .await?;
    let status = StatusCode::from_u16(inv.reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut r = (status, inv.reply.body.clone()).into_response();
    let hs = r.headers_mut();
    if let Some(ct) = inv
        .reply
        .header("content-type")
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        hs.insert(header::CONTENT_TYPE, ct);
    }
    if let Ok(v) = HeaderValue::from_str(&sid) {
        hs.insert("x-tessera-session-id", v);
    }
    if let Ok(v) = HeaderValue::from_str(&inv.session.version.to_string()) {
        hs.insert("x-tessera-runtime-version", v);
    }
    Ok(r)
}

// ---- sessions ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionQuery {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    runtime: Option<String>,
}

async fn list_sessions(State(a): State<App>, c: Caller, Q(q): Q<SessionQuery>) -> R {
    c.require(Role::Viewer)?;
    let mut states = Vec::new();
    if let Some(s) = &q.state {
        for part in s.split(',') {
            states.push(sessions::State::parse(part).ok_or_else(|| {
                ApiError::invalid(
                    "state",
                    format!("{part:?} is not a state: use starting, active, idle, ended, failed or killed"),
                )
            })?);
        }
    }
    let l =
        sessions::list_versioned(a.plane.store(), &c.tenant, &states, q.runtime.as_deref()).await?;
    let mut out = Vec::with_capacity(l.len());
    for (s, version) in &l {
        let mut v = session_view(s)?;
        v["resource_version"] = (*version).into();
        out.push(v);
    }
    items(out)
}
async fn get_session(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(id): Path<String>,
) -> R {
    c.require(Role::Viewer)?;
    own_session(&c, &id)?;
    let s = sessions::get(a.plane.store(), &c.tenant, &id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("session {id:?}")))?;
    let mut v = session_view(&s)?;
    v["usage"] = to_v(&meter::session_totals(a.plane.store(), &c.tenant, &id).await?)?;
    v["live"] = a.agents.host()?.live_info(&c.tenant, &id).await;
    ok(v)
}
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KillSpec {
    #[serde(default)]
    reason: Option<String>,
}
async fn kill_session(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(id): Path<String>,
    body: Bytes,
) -> R {
    c.require(Role::Developer)?;
    own_session(&c, &id)?;
    let spec: KillSpec = if body.is_empty() {
        KillSpec::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid("reason", e.to_string()))?
    };
    let why = spec
        .reason
        .unwrap_or_else(|| format!("killed by {}", c.subject));
    let s = a.agents.host()?.kill(&c.tenant, &id, &why).await?;
    ok(session_view(&s)?)
}

async fn memory_keys(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(id): Path<String>,
) -> R {
    c.require(Role::Viewer)?;
    own_session(&c, &id)?;
    ok(json!({"keys": sessions::memory_keys(a.plane.store(), &c.tenant, &id).await?}))
}
async fn memory_get(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path((id, k)): Path<(String, String)>,
) -> R {
    c.require(Role::Viewer)?;
    own_session(&c, &id)?;
    let v = sessions::memory_get(a.plane.store(), &c.tenant, &id, &k).await?;
    let at = format!("session {id} memory {k}");
    ok(json!({"key": k, "value": a.plane.redact_value(&c.tenant, &at, v)}))
}
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemoryValue {
    value: Value,
}
async fn memory_put(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path((id, k)): Path<(String, String)>,
    Body(b): Body<MemoryValue>,
) -> R {
    c.require(Role::Developer)?;
    own_session(&c, &id)?;
    session_exists(&a, &c.tenant, &id).await?;
    sessions::memory_put(a.plane.store(), &c.tenant, &id, &k, b.value.clone()).await?;
    ok(json!({"key": k, "value": b.value}))
}
async fn memory_delete(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path((id, k)): Path<(String, String)>,
) -> R {
    c.require(Role::Developer)?;
    own_session(&c, &id)?;
    session_exists(&a, &c.tenant, &id).await?;
    sessions::memory_delete(a.plane.store(), &c.tenant, &id, &k).await?;
    ok(json!({"deleted": k}))
}
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AfterQuery {
    #[serde(default)]
    after: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}
async fn history_read(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(id): Path<String>,
    Q(q): Q<AfterQuery>,
) -> R {
    c.require(Role::Viewer)?;
    own_session(&c, &id)?;
    let h = sessions::history_read(
        a.plane.store(),
        &c.tenant,
        &id,
        q.after.unwrap_or(0),
        q.limit.unwrap_or(100),
    )
    .await?;
    let at = format!("session {id} history");
    items(
        h.iter()
            .map(|x| Ok(a.plane.redact_value(&c.tenant, &at, to_v(x)?)))
            .collect::<Result<_, ApiError>>()?,
    )
}
async fn history_append(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(id): Path<String>,
    Body(b): Body<Value>,
) -> R {
    c.require(Role::Developer)?;
    own_session(&c, &id)?;
    session_exists(&a, &c.tenant, &id).await?;
    let seq = sessions::history_append(a.plane.store(), &c.tenant, &id, b, now_ms()).await?;
    created(json!({"seq": seq}))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointQuery {
    #[serde(default)]
    ns: Option<String>,
    #[serde(default)]
    before: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointBody {
    #[serde(default)]
    ns: String,
    #[serde(default)]
    parent_id: Option<String>,
    checkpoint: Value,
    #[serde(default)]
    metadata: Value,
}
async fn checkpoint_list(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(id): Path<String>,
    Q(q): Q<CheckpointQuery>,
) -> R {
    c.require(Role::Viewer)?;
    own_session(&c, &id)?;
    let l = sessions::checkpoint_list(
        a.plane.store(),
        &c.tenant,
        &id,
        q.ns.as_deref().unwrap_or(""),
        q.before,
        q.limit.unwrap_or(20).min(1000),
    )
    .await?;
    let at = format!("session {id} checkpoints");
    items(
        l.iter()
            .map(|x| Ok(a.plane.redact_value(&c.tenant, &at, to_v(x)?)))
            .collect::<Result<_, ApiError>>()?,
    )
}
async fn checkpoint_put(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path((id, cid)): Path<(String, String)>,
    Body(b): Body<CheckpointBody>,
) -> R {
    c.require(Role::Developer)?;
    own_session(&c, &id)?;
    session_exists(&a, &c.tenant, &id).await?;
    let cp = Checkpoint {
        ns: b.ns,
        id: cid,
        parent_id: b.parent_id,
        checkpoint: b.checkpoint,
        metadata: b.metadata,
        created_at_ms: 0,
        seq: 0,
    };
    ok(to_v(
        &sessions::checkpoint_put(a.plane.store(), &c.tenant, &id, cp, now_ms()).await?,
    )?)
}
async fn checkpoint_get(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path((id, cid)): Path<(String, String)>,
    Q(q): Q<CheckpointQuery>,
) -> R {
    c.require(Role::Viewer)?;
    own_session(&c, &id)?;
    let ns = q.ns.as_deref().unwrap_or("");
    let st = a.plane.store();
    let cp = if cid == "latest" {
        sessions::checkpoint_list(st, &c.tenant, &id, ns, None, 1)
            .await?
            .into_iter()
            .next()
    } else {
        sessions::checkpoint_get(st, &c.tenant, &id, ns, &cid).await?
    };
    let cp =
        cp.ok_or_else(|| ApiError::not_found(format!("checkpoint {cid:?} of session {id:?}")))?;
    let mut v = to_v(&cp)?;
    v["pending_writes"] =
        Value::Array(sessions::checkpoint_writes(st, &c.tenant, &id, ns, &cp.id).await?);
    ok(a.plane
        .redact_value(&c.tenant, &format!("session {id} checkpoint {cid}"), v))
}
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WritesBody {
    #[serde(default)]
    ns: String,
    writes: Vec<Value>,
}
async fn checkpoint_writes(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path((id, cid)): Path<(String, String)>,
    Body(b): Body<WritesBody>,
) -> R {
    c.require(Role::Developer)?;
    own_session(&c, &id)?;
    session_exists(&a, &c.tenant, &id).await?;
    sessions::checkpoint_put_writes(a.plane.store(), &c.tenant, &id, &b.ns, &cid, b.writes).await?;
    ok(json!({"ok": true}))
}

async fn session_trace(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(id): Path<String>,
) -> R {
    c.require(Role::Viewer)?;
    own_session(&c, &id)?;
    let spans = trace::spans(a.plane.store(), &c.tenant, &id).await?;
    let tree = trace::tree(&spans);
    let v = json!({"session": id, "spans": spans, "tree": tree, "text": trace::render(&id, &tree)});
    ok(a.plane
        .redact_value(&c.tenant, &format!("session {id} trace"), v))
}
async fn record_span(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(id): Path<String>,
    Body(mut b): Body<trace::Span>,
) -> R {
    c.require(Role::Developer)?;
    own_session(&c, &id)?;
    session_exists(&a, &c.tenant, &id).await?;
    b.session = id;
    // Attributes are what the agent reports: redacted before they are stored or exported.
    let at = format!("session {} span", b.session);
    let b: trace::Span = serde_json::from_value(a.plane.redact_value(&c.tenant, &at, to_v(&b)?))
        .map_err(ApiError::internal)?;
    let seq = trace::record_span(a.plane.store(), &c.tenant, b).await?;
    created(json!({"seq": seq}))
}

// ---- usage ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewUsage {
    session: String,
    runtime: String,
    kind: meter::UsageKind,
    quantity: f64,
    source_id: String,
    #[serde(default)]
    at_ms: Option<u64>,
}
async fn record_usage(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Body(b): Body<NewUsage>,
) -> R {
    c.require(Role::Developer)?;
    own_session(&c, &b.session)?;
    let r = meter::record(
        a.plane.store(),
        UsageRecord {
            tenant: c.tenant.clone(),
            session: b.session.clone(),
            runtime: b.runtime,
            kind: b.kind,
            quantity: b.quantity,
            at_ms: b.at_ms.unwrap_or_else(now_ms),
            source_id: b.source_id,
        },
    )
    .await?;
    if let Some(why) = &r.over_budget {
        a.agents.host()?.kill(&c.tenant, &b.session, why).await?;
    }
    ok(
        json!({"counted": r.counted, "cost": r.cost, "session": to_v(&r.session)?, "over_budget": r.over_budget}),
    )
}
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    runtime: Option<String>,
    /// `true`: the records themselves (a scan of the tenant's records).
    #[serde(default)]
    records: Option<bool>,
}
async fn usage(State(a): State<App>, SessionCaller(c): SessionCaller, Q(q): Q<UsageQuery>) -> R {
    c.require(Role::Viewer)?;
    if let Some(s) = &q.session {
        own_session(&c, s)?;
    } else if c.subject.starts_with("session:") {
        return Err(ApiError::forbidden(
            "a session key reads its own session's usage only: add ?session=",
        ));
    }
    let st = a.plane.store();
    let prices = meter::prices(st, &c.tenant).await?;
    let mut v = json!({"tenant": c.tenant, "currency": prices.currency});
    v["tenant_totals"] = to_v(&meter::tenant_totals(st, &c.tenant).await?)?;
    if let Some(s) = &q.session {
        v["session"] = json!(s);
        v["session_totals"] = to_v(&meter::session_totals(st, &c.tenant, s).await?)?;
    }
    if let Some(r) = &q.runtime {
        v["runtime"] = json!(r);
        v["runtime_totals"] = to_v(&meter::runtime_totals(st, &c.tenant, r).await?)?;
    }
    if q.records.unwrap_or(false) {
        v["records"] = Value::Array(meter::records(st, &c.tenant, q.session.as_deref()).await?);
    }
    ok(v)
}
async fn get_prices(State(a): State<App>, c: Caller) -> R {
    c.require(Role::Viewer)?;
    ok(to_v(&meter::prices(a.plane.store(), &c.tenant).await?)?)
}
async fn put_prices(State(a): State<App>, c: Caller, Body(b): Body<PriceTable>) -> R {
    c.require(Role::Admin)?;
    meter::set_prices(a.plane.store(), &c.tenant, &b).await?;
    ok(to_v(&b)?)
}
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetBody {
    max_cost: Option<f64>,
}
async fn put_budget(State(a): State<App>, c: Caller, Body(b): Body<BudgetBody>) -> R {
    c.require(Role::Admin)?;
    meter::set_tenant_budget(a.plane.store(), &c.tenant, b.max_cost).await?;
    ok(json!({"tenant": c.tenant, "max_cost": b.max_cost}))
}
async fn pool_stats(State(a): State<App>, c: Caller) -> R {
    c.require(Role::Viewer)?;
    let v: Vec<Value> = a
        .agents
        .host()?
        .pool_stats(&c.tenant)
        .iter()
        .map(|(d, p)| json!({"template_digest": d, "ready": p.ready, "creating": p.creating, "target": p.target, "claims": p.claims, "misses": p.misses}))
        .collect();
    items(v)
}

crate::api::routes! {
    ROUTES, routes;
    post "/v1/runtimes" create_runtime "Create an agent runtime (version 1)" Some("NewRuntime"), 201;
    get "/v1/runtimes" list_runtimes "List agent runtimes" None, 200;
    get "/v1/runtimes/{name}" get_runtime "Get a runtime with its latest spec and endpoints" None, 200;
    put "/v1/runtimes/{name}" update_runtime "Update a runtime: makes a new immutable version" Some("RuntimeSpec"), 200;
    delete "/v1/runtimes/{name}" delete_runtime "Delete a runtime, its versions and endpoints" None, 200;
    get "/v1/runtimes/{name}/versions" list_versions "List a runtime's versions" None, 200;
    get "/v1/runtimes/{name}/versions/{version}" get_version "Get one version" None, 200;
    get "/v1/runtimes/{name}/endpoints" list_endpoints "List endpoints (DEFAULT follows the latest version)" None, 200;
    put "/v1/runtimes/{name}/endpoints/{endpoint}" put_endpoint "Pin an endpoint to a version" Some("EndpointSpec"), 200;
    delete "/v1/runtimes/{name}/endpoints/{endpoint}" delete_endpoint "Delete an endpoint" None, 200;
    post "/v1/runtimes/{name}/invocations" invoke "Invoke the agent in a session (?session_id= or X-Tessera-Session-Id; created or resumed)" None, 200;
    get "/v1/sessions" list_sessions "List sessions (?state=active,idle&runtime=NAME)" None, 200;
    get "/v1/sessions/{id}" get_session "Inspect a session: state, sandbox, usage, agent output" None, 200;
    post "/v1/sessions/{id}/kill" kill_session "Kill a session and its sandbox" None, 200;
    get "/v1/sessions/{id}/memory" memory_keys "List the session's memory keys" None, 200;
    get "/v1/sessions/{id}/memory/{key}" memory_get "Read a memory value" None, 200;
    put "/v1/sessions/{id}/memory/{key}" memory_put "Write a memory value" Some("MemoryValue"), 200;
    delete "/v1/sessions/{id}/memory/{key}" memory_delete "Delete a memory value" None, 200;
    get "/v1/sessions/{id}/history" history_read "Read the session's append-only history (?after=SEQ)" None, 200;
    post "/v1/sessions/{id}/history" history_append "Append to the session's history" None, 201;
    get "/v1/sessions/{id}/checkpoints" checkpoint_list "List checkpoints, newest first (?ns=&before=SEQ&limit=)" None, 200;
    put "/v1/sessions/{id}/checkpoints/{checkpoint}" checkpoint_put "Store a checkpoint (idempotent)" Some("CheckpointBody"), 200;
    get "/v1/sessions/{id}/checkpoints/{checkpoint}" checkpoint_get "Get a checkpoint (or `latest`) with its pending writes" None, 200;
    post "/v1/sessions/{id}/checkpoints/{checkpoint}/writes" checkpoint_writes "Store pending writes of a checkpoint" Some("WritesBody"), 200;
    get "/v1/sessions/{id}/trace" session_trace "The session's steps as a tree with durations and cost" None, 200;
    post "/v1/sessions/{id}/spans" record_span "Record a finished step (GenAI span)" Some("Span"), 201;
    post "/v1/topics/{topic}/events" publish "Publish an event to a topic" None, 201;
    get "/v1/topics/{topic}/events" read_events "Read events after an offset (SSE with Accept: text/event-stream)" None, 200;
    put "/v1/topics/{topic}/offsets/{consumer}" commit_offset "Commit a consumer's offset" Some("OffsetBody"), 200;
    get "/v1/topics/{topic}/offsets/{consumer}" get_offset "A consumer's committed offset" None, 200;
    post "/v1/usage" record_usage "Record a usage record (idempotent by source_id)" Some("NewUsage"), 200;
    get "/v1/usage" usage "Usage totals of the tenant (?session=&runtime=&records=true)" None, 200;
    get "/v1/usage/prices" get_prices "The tenant's price table" None, 200;
    put "/v1/usage/prices" put_prices "Replace the tenant's price table (admins)" Some("PriceTable"), 200;
    put "/v1/usage/budget" put_budget "Set the tenant's budget (admins)" Some("BudgetBody"), 200;
    get "/v1/agent-pools" pool_stats "Warm pools of the agent runtimes" None, 200;
}

/// Request-body schemas this module's routes name, for the OpenAPI document.
pub fn schemas() -> Vec<(&'static str, Value)> {
    let resources = json!({"type": "object", "additionalProperties": false, "properties": {
        "cpu_millis": {"type": "integer"}, "memory_mb": {"type": "integer"}, "pids": {"type": "integer"}, "disk_mb": {"type": "integer"}}});
    let spec_props = json!({
        "command": {"type": "array", "items": {"type": "string"}, "description": "argv of the agent's server; it serves POST /invocations and GET /ping on $TESSERA_AGENT_SOCKET"},
        "template": {"type": "string", "description": "host, or an absolute directory holding a root filesystem"},
        "resources": resources,
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "cwd": {"type": "string"},
        "idle_timeout_s": {"type": "integer"},
        "max_lifetime_s": {"type": "integer"},
        "session_budget": {"type": "number"},
        "description": {"type": "string"},
    });
    let mut new_props = spec_props.clone();
    new_props["name"] = json!({"type": "string"});
    vec![
        (
            "RuntimeSpec",
            json!({"type": "object", "additionalProperties": false, "required": ["command"], "properties": spec_props}),
        ),
        (
            "NewRuntime",
            json!({"type": "object", "additionalProperties": false, "required": ["name", "command"], "properties": new_props}),
        ),
        (
            "EndpointSpec",
            json!({"type": "object", "additionalProperties": false, "required": ["version"], "properties": {"version": {"type": "integer"}}}),
        ),
        (
            "MemoryValue",
            json!({"type": "object", "additionalProperties": false, "required": ["value"], "properties": {"value": {}}}),
        ),
        (
            "CheckpointBody",
            json!({"type": "object", "additionalProperties": false, "required": ["checkpoint"], "properties": {
            "ns": {"type": "string"}, "parent_id": {"type": "string"}, "checkpoint": {}, "metadata": {}}}),
        ),
        (
            "WritesBody",
            json!({"type": "object", "additionalProperties": false, "required": ["writes"], "properties": {
            "ns": {"type": "string"}, "writes": {"type": "array", "items": {"type": "object", "required": ["task_id", "channel"]}}}}),
        ),
        (
            "Span",
            json!({"type": "object", "required": ["span_id", "name", "operation", "start_ms", "duration_ms"], "properties": {
            "span_id": {"type": "string"}, "parent": {"type": "string"}, "name": {"type": "string"}, "operation": {"type": "string"},
            "start_ms": {"type": "integer"}, "duration_ms": {"type": "number"}, "cost": {"type": "number"}, "attributes": {"type": "object"}}}),
        ),
        (
            "OffsetBody",
            json!({"type": "object", "additionalProperties": false, "required": ["offset"], "properties": {"offset": {"type": "integer"}}}),
        ),
        (
            "NewUsage",
            json!({"type": "object", "additionalProperties": false, "required": ["session", "runtime", "kind", "quantity", "source_id"], "properties": {
            "session": {"type": "string"}, "runtime": {"type": "string"},
            "kind": {"type": "string", "enum": ["tokens_in", "tokens_out", "tokens_cached", "gpu_seconds", "cpu_seconds", "memory_gb_seconds", "tool_fee"]},
            "quantity": {"type": "number"}, "source_id": {"type": "string"}, "at_ms": {"type": "integer"}}}),
        ),
        (
            "PriceTable",
            json!({"type": "object", "additionalProperties": false, "required": ["currency", "prices"], "properties": {
            "currency": {"type": "string"}, "prices": {"type": "object", "additionalProperties": {"type": "number"}}}}),
        ),
        (
            "BudgetBody",
            json!({"type": "object", "additionalProperties": false, "properties": {"max_cost": {"type": ["number", "null"]}}}),
        ),
    ]
}
