//! Tool gateway: registry, grants, the exactly-once ledger, the MCP endpoint (issue 8).
//!
//! This module owns its state ([`ToolsState`]), its configuration
//! ([`ToolsConfig`], a field of [`crate::ServerConfig`]), its routes and its
//! OpenAPI schemas; handlers only translate between HTTP and
//! [`tessera_agent::tools`], which owns the behaviour. The MCP endpoint is in
//! [`crate::mcp`].

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tessera_agent::tools::{
    self as gw, AdminError, CallError, CallRequest, Decision, Grant, Resolution, ToolGateway,
    ToolGatewayConfig, ToolSpec,
};
use tessera_store::{AnyStore, Key, Object, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::StartError;
use crate::api::{App, Body, Q, SessionCaller};
use crate::auth::Role;
use crate::plane::{Caller, ControlPlane, kind, now_ms, render};
use crate::problem::{ApiError, Code};
use crate::wire::AuditBody;

/// Settings for this module, from `tessera up` flags.
#[derive(Clone, Debug, Default)]
pub struct ToolsConfig {
    /// Write each call's outcome before replying (default: in the background,
    /// group-committed; see `docs/tools.md`).
    pub outcome_before_reply: bool,
}

/// What the handlers of this module share.
#[derive(Clone, Debug)]
pub struct ToolsState {
    pub gateway: ToolGateway<AnyStore>,
    pub(crate) mcp: crate::mcp::McpService,
    /// Mints the tokens of `POST /v1/token` and of tools with `auth: exchange`.
    pub tokens: std::sync::Arc<crate::exchange::TokenIssuer>,
}

impl ToolsState {
    /// Starts this module: its state and any background tasks, which end when
    /// `stop` turns true. The token signing key is kept under `data`.
    pub(crate) async fn start(
        plane: &ControlPlane,
        cfg: &ToolsConfig,
        data: &std::path::Path,
        stop: &watch::Receiver<bool>,
    ) -> Result<(Self, Vec<JoinHandle<()>>), StartError> {
        let store = plane.store().clone();
        let gateway = ToolGateway::new(
            store.clone(),
            ToolGatewayConfig {
                // The embedded store has one writer process: whatever another
                // owner left `dispatched` was orphaned by a restart.
                exclusive: store.backend() == "sqlite",
                completion: if cfg.outcome_before_reply {
                    gw::Completion::BeforeReply
                } else {
                    gw::Completion::Background
                },
                ..ToolGatewayConfig::default()
            },
        );
        // Recovery first: orphaned sends are settled before any call is taken.
        gateway.reindex().await.map_err(|e| StartError::Component {
            what: "tool gateway",
            message: format!("indexing the open ledger entries failed: {e}"),
        })?;
        gateway.sweep().await.map_err(|e| StartError::Component {
            what: "tool gateway",
            message: format!("ledger recovery failed: {e}"),
        })?;
        let g = gateway.clone();
        let mut stop = stop.clone();
        let sweeper = tokio::spawn(async move {
            loop {
                let stopped = tokio::select! {
                    _ = stop.wait_for(|s| *s) => true,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => false,
                };
                if stopped {
                    break;
                }
                if let Err(e) = g.sweep().await {
                    tracing::warn!("tool gateway: sweep failed: {e}");
                }
            }
            g.flush().await;
        });
        let mcp = crate::mcp::service(gateway.clone());
        let tokens = crate::exchange::TokenIssuer::open(data, plane.clone(), gateway.clone())
            .map_err(|message| StartError::Component {
                what: "token exchange",
                message,
            })?;
        let tokens = std::sync::Arc::new(tokens);
        gateway.set_delegation(std::sync::Arc::new(crate::exchange::GatewayDelegation(
            tokens.clone(),
        )));
        Ok((
            ToolsState {
                gateway,
                mcp,
                tokens,
            },
            vec![sweeper],
        ))
    }
}

crate::api::routes! {
    ROUTES, routes;
    post "/v1/tools" register "Register a tool (HTTP, remote MCP or built-in), its JSON Schemas checked" Some("ToolSpec"), 201;
    get "/v1/tools" list "List the tenant's tools" None, 200;
    get "/v1/tools/{name}" get_tool "Get a tool with its grants" None, 200;
    put "/v1/tools/{name}" put_tool "Replace or create a tool" Some("ToolSpec"), 200;
    delete "/v1/tools/{name}" delete_tool "Delete a tool and its grants" None, 200;
    get "/v1/tools/{name}/grants" list_grants "The grants of a tool" None, 200;
    post "/v1/tools/{name}/grants" add_grant "Grant a tool to a runtime and/or a role" Some("ToolGrant"), 200;
    delete "/v1/tools/{name}/grants" remove_grant "Revoke a grant (same body as the grant)" Some("ToolGrant"), 200;
    post "/v1/tools/{name}/call" call "Call a tool through the ledger (403 and an audit entry when not granted)" Some("ToolCall"), 200;
    get "/v1/ledger" ledger "Ledger entries (?session_id=&state=)" None, 200;
    get "/v1/ledger/{id}" ledger_entry "One ledger entry" None, 200;
    post "/v1/ledger/{id}/resolve" resolve "Resolve an in-doubt call after checking the tool" Some("LedgerResolution"), 200;
    get "/v1/approvals" approvals "Open approvals" None, 200;
    post "/v1/approvals/{id}" decide "Approve or deny a pending call" Some("ApprovalDecision"), 200;
    post "/v1/mcp" mcp_post "MCP endpoint (Streamable HTTP): the calling session's granted tools" None, 200;
    get "/v1/mcp" mcp_get "MCP endpoint: server-to-client stream (legacy sessions)" None, 200;
    delete "/v1/mcp" mcp_delete "MCP endpoint: end a legacy session" None, 200;
}

/// The gateway's caller for an authenticated API caller.
pub(crate) fn gw_caller(c: &Caller) -> gw::ToolCaller {
    gw::ToolCaller {
        tenant: c.tenant.clone(),
        subject: c.subject.clone(),
        role: c.role.as_str().to_string(),
    }
}

fn admin_error(e: AdminError) -> ApiError {
    match e {
        AdminError::Spec(s) => {
            let field = s.field.replace('/', ".");
            ApiError::invalid(field, format!("{}: {}", s.field, s.message))
        }
        AdminError::NotFound(what) => ApiError::not_found(what),
        AdminError::Conflict(m) => ApiError::new(Code::Conflict, m),
        AdminError::Store(e) => e.into(),
    }
}

/// A refused call as an API error.
pub(crate) fn call_error(e: CallError) -> ApiError {
    let msg = e.to_string();
    match e {
        CallError::ToolNotFound(_) | CallError::SessionNotFound(_) => {
            ApiError::new(Code::NotFound, msg)
        }
        CallError::NotYourSession { .. } | CallError::NotGranted { .. } => ApiError::forbidden(msg),
        CallError::InvalidArguments(v) => {
            let path = v.path.trim_start_matches('/').replace('/', ".");
            let field = if path.is_empty() {
                "arguments".to_string()
            } else {
                format!("arguments.{path}")
            };
            ApiError::invalid(field, msg)
        }
        CallError::Invalid { field, .. } => ApiError::invalid(field, msg),
        CallError::KeyReused { .. } | CallError::SessionOver { .. } => {
            ApiError::new(Code::Conflict, msg)
        }
        CallError::Store(e) => e.into(),
    }
}

/// Writes an audit entry (as the core API does: kind `audit`, a sortable name).
pub(crate) async fn audit(store: &AnyStore, c: &Caller, action: &str, object: String) {
    let now = now_ms();
    let body = AuditBody {
        at: now,
        subject: c.subject.clone(),
        key_id: c.key_id.clone(),
        action: action.into(),
        object,
    };
    let key = Key::new(
        kind::AUDIT,
        &c.tenant,
        format!("{now:013}-{}", crate::auth::random_hex(4)),
    );
    if let Err(e) = store
        .create(key, serde_json::to_value(body).unwrap_or_default())
        .await
    {
        tracing::warn!("tools: writing an audit entry failed: {e}");
    }
}

/// Calls a tool for an API caller; a refusal for want of a grant (or for
/// another session) is audited.
pub(crate) async fn call_tool(
    a: &App,
    c: &Caller,
    tool: &str,
    req: CallRequest,
) -> Result<gw::CallOutcome, ApiError> {
    c.require(Role::Developer)?;
    let session = req.session_id.clone();
    match a.tools.gateway.call(&gw_caller(c), tool, req).await {
        Ok(o) => Ok(o),
        Err(e @ (CallError::NotGranted { .. } | CallError::NotYourSession { .. })) => {
            audit(
                a.plane.store(),
                c,
                "denied-call",
                format!("tool/{tool} session/{session}"),
            )
            .await;
            Err(call_error(e))
        }
        Err(e) => Err(call_error(e)),
    }
}

use crate::api::{R, ok};

fn tool_view(o: &Object, grants: &gw::Grants) -> Value {
    let mut v = render(o);
    v["grants"] = serde_json::to_value(&grants.grants).unwrap_or_default();
    v
}

async fn register(State(a): State<App>, c: Caller, Body(spec): Body<ToolSpec>) -> R {
    c.require(Role::Operator)?;
    let name = spec.name.clone();
    let o = a
        .tools
        .gateway
        .register(&c.tenant, spec)
        .await
        .map_err(admin_error)?;
    audit(a.plane.store(), &c, "create", format!("tool/{name}")).await;
    Ok((
        StatusCode::CREATED,
        Json(tool_view(&o, &Default::default())),
    )
        .into_response())
}

async fn list(State(a): State<App>, c: Caller) -> R {
    c.require(Role::Viewer)?;
    let tools = a.tools.gateway.list_tools(&c.tenant).await?;
    let mut items = Vec::new();
    for t in &tools {
        let g = a.tools.gateway.grants(&c.tenant, &t.name).await?;
        items.push(tool_view(t, &g));
    }
    ok(json!({ "items": items }))
}

async fn get_tool(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    c.require(Role::Viewer)?;
    let o = a
        .tools
        .gateway
        .get_tool(&c.tenant, &n)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("tool {n:?}")))?;
    let g = a.tools.gateway.grants(&c.tenant, &n).await?;
    ok(tool_view(&o, &g))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutQuery {
    #[serde(default)]
    resource_version: Option<u64>,
}

async fn put_tool(
    State(a): State<App>,
    c: Caller,
    Path(n): Path<String>,
    Q(q): Q<PutQuery>,
    Body(spec): Body<ToolSpec>,
) -> R {
    c.require(Role::Operator)?;
    let o = a
        .tools
        .gateway
        .put(&c.tenant, &n, spec, q.resource_version)
        .await
        .map_err(admin_error)?;
    audit(a.plane.store(), &c, "update", format!("tool/{n}")).await;
    let g = a.tools.gateway.grants(&c.tenant, &n).await?;
    ok(tool_view(&o, &g))
}

async fn delete_tool(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    c.require(Role::Operator)?;
    let o = a
        .tools
        .gateway
        .delete_tool(&c.tenant, &n)
        .await
        .map_err(admin_error)?;
    audit(a.plane.store(), &c, "delete", format!("tool/{n}")).await;
    ok(render(&o))
}

async fn list_grants(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    c.require(Role::Viewer)?;
    if a.tools.gateway.get_tool(&c.tenant, &n).await?.is_none() {
        return Err(ApiError::not_found(format!("tool {n:?}")));
    }
    let g = a.tools.gateway.grants(&c.tenant, &n).await?;
    ok(json!({ "items": g.grants }))
}

async fn set_grant(a: &App, c: &Caller, n: &str, g: Grant, add: bool) -> R {
    c.require(Role::Admin)?;
    let what = format!(
        "tool/{n} runtime={} role={}",
        g.runtime.as_deref().unwrap_or("*"),
        g.role.as_deref().unwrap_or("*")
    );
    let out = a
        .tools
        .gateway
        .set_grant(&c.tenant, n, g, add)
        .await
        .map_err(admin_error)?;
    audit(
        a.plane.store(),
        c,
        if add { "grant" } else { "revoke" },
        what,
    )
    .await;
    ok(json!({ "items": out.grants }))
}

async fn add_grant(
    State(a): State<App>,
    c: Caller,
    Path(n): Path<String>,
    Body(g): Body<Grant>,
) -> R {
    set_grant(&a, &c, &n, g, true).await
}

async fn remove_grant(
    State(a): State<App>,
    c: Caller,
    Path(n): Path<String>,
    Body(g): Body<Grant>,
) -> R {
    set_grant(&a, &c, &n, g, false).await
}

async fn call(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(n): Path<String>,
    Body(req): Body<CallRequest>,
) -> R {
    let o = call_tool(&a, &c, &n, req).await?;
    ok(serde_json::to_value(&o).map_err(ApiError::internal)?)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerQuery {
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    state: Option<gw::State>,
}

/// A ledger entry as served: its arguments, result and error redacted (the stored
/// entry keeps the arguments as sent, for the idempotency check).
fn entry_view(a: &App, tenant: &str, e: &gw::Entry) -> Value {
    a.plane.redact_value(
        tenant,
        &format!("ledger {}", e.id),
        serde_json::to_value(e).unwrap_or_default(),
    )
}

async fn ledger(State(a): State<App>, SessionCaller(c): SessionCaller, Q(q): Q<LedgerQuery>) -> R {
    c.require(Role::Viewer)?;
    if let Some(s) = c.subject.strip_prefix("session:") {
        if q.session_id.as_deref() != Some(s) {
            return Err(ApiError::forbidden(format!(
                "a session key reads only its own ledger: add ?session_id={s}"
            )));
        }
    }
    let v = a
        .tools
        .gateway
        .ledger(&c.tenant, q.session_id.as_deref(), q.state)
        .await?;
    ok(json!({ "items": v.iter().map(|e| entry_view(&a, &c.tenant, e)).collect::<Vec<_>>() }))
}

async fn ledger_entry(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    Path(id): Path<String>,
) -> R {
    c.require(Role::Viewer)?;
    let e = a
        .tools
        .gateway
        .entry(&c.tenant, &id)
        .await?
        .filter(|e| {
            c.subject
                .strip_prefix("session:")
                .is_none_or(|s| s == e.session_id)
        })
        .ok_or_else(|| ApiError::not_found(format!("ledger entry {id:?}")))?;
    ok(entry_view(&a, &c.tenant, &e))
}

async fn resolve(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    Body(r): Body<Resolution>,
) -> R {
    c.require(Role::Operator)?;
    let e = a
        .tools
        .gateway
        .resolve(&c.tenant, &id, r.clone(), &c.subject)
        .await
        .map_err(admin_error)?;
    audit(
        a.plane.store(),
        &c,
        "resolve",
        format!("ledger/{id} as {:?}", r.outcome),
    )
    .await;
    ok(entry_view(&a, &c.tenant, &e))
}

async fn approvals(State(a): State<App>, c: Caller) -> R {
    c.require(Role::Viewer)?;
    let v = a.tools.gateway.approvals(&c.tenant).await?;
    ok(json!({ "items": v.iter().map(|e| entry_view(&a, &c.tenant, e)).collect::<Vec<_>>() }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalDecision {
    decision: Decision,
}

async fn decide(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    Body(d): Body<ApprovalDecision>,
) -> R {
    c.require(Role::Operator)?;
    if c.subject.starts_with("session:") {
        return Err(ApiError::forbidden(
            "a session cannot approve tool calls (its own or any other)",
        ));
    }
    let e = a
        .tools
        .gateway
        .decide_approval(&c.tenant, &id, d.decision, &c.subject)
        .await
        .map_err(admin_error)?;
    audit(
        a.plane.store(),
        &c,
        match d.decision {
            Decision::Approve => "approve",
            Decision::Deny => "deny",
        },
        format!("ledger/{id}"),
    )
    .await;
    ok(entry_view(&a, &c.tenant, &e))
}

async fn mcp_post(State(a): State<App>, SessionCaller(c): SessionCaller, req: Request) -> Response {
    crate::mcp::handle(&a, c, req).await
}
async fn mcp_get(State(a): State<App>, SessionCaller(c): SessionCaller, req: Request) -> Response {
    crate::mcp::handle(&a, c, req).await
}
async fn mcp_delete(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    req: Request,
) -> Response {
    crate::mcp::handle(&a, c, req).await
}

/// Request-body schemas this module's routes name, for the OpenAPI document.
pub fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "ToolSpec",
            json!({"type": "object", "additionalProperties": false, "required": ["name", "target"], "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]{0,63}$"},
                "description": {"type": "string"},
                "target": {"oneOf": [
                    {"type": "object", "required": ["type", "url"], "properties": {"type": {"const": "http"}, "url": {"type": "string"}, "headers": {"$ref": "#/components/schemas/ToolHeaders"}, "auth": {"$ref": "#/components/schemas/ToolAuth"}}},
                    {"type": "object", "required": ["type", "url"], "properties": {"type": {"const": "mcp"}, "url": {"type": "string"}, "tool": {"type": "string"}, "headers": {"$ref": "#/components/schemas/ToolHeaders"}, "auth": {"$ref": "#/components/schemas/ToolAuth"}}},
                    {"type": "object", "required": ["type", "builtin"], "properties": {"type": {"const": "builtin"}, "builtin": {"enum": ["exec", "read_file", "write_file", "list_files"]}}}
                ]},
                "input_schema": {"type": "object", "description": "JSON Schema of the arguments (type object)"},
                "output_schema": {"type": "object", "description": "JSON Schema every result is checked against"},
                "read_only": {"type": "boolean"},
                "idempotency_keys": {"type": "boolean", "description": "the tool honours the Idempotency-Key header"},
                "approval": {"type": "object", "required": ["ttl_seconds"], "properties": {"ttl_seconds": {"type": "integer", "minimum": 1}}},
                "fee": {"type": "number", "minimum": 0},
                "timeout_ms": {"type": "integer", "minimum": 1}}}),
        ),
        (
            "ToolHeaders",
            json!({"type": "object", "description": "Headers of every call. A value {\"secret\": \"…\"} is write-only: stored apart, put on the outgoing call only, shown as \"<secret>\"; sending \"<secret>\" back keeps the stored value.",
                "additionalProperties": {"oneOf": [
                    {"type": "string"},
                    {"type": "object", "additionalProperties": false, "required": ["secret"], "properties": {"secret": {"type": "string", "minLength": 8, "writeOnly": true}}}]}}),
        ),
        (
            "ToolAuth",
            json!({"enum": ["exchange"], "description": "exchange: each call carries Authorization: Bearer <a token minted for the calling session's user, audience this tool> (RFC 8693; POST /v1/token)"}),
        ),
        (
            "ToolGrant",
            json!({"type": "object", "additionalProperties": false, "properties": {
                "runtime": {"type": "string"}, "role": {"$ref": "#/components/schemas/Role"}}}),
        ),
        (
            "ToolCall",
            json!({"type": "object", "additionalProperties": false, "required": ["session_id", "tool_call_id"], "properties": {
                "session_id": {"type": "string"}, "tool_call_id": {"type": "string"},
                "idempotency_key": {"type": "string", "description": "default <session_id>/<tool_call_id>"},
                "arguments": {"type": "object"}}}),
        ),
        (
            "LedgerResolution",
            json!({"type": "object", "additionalProperties": false, "required": ["outcome"], "properties": {
                "outcome": {"enum": ["completed", "failed", "resend"]},
                "result": {}, "error": {"type": "string"}}}),
        ),
        (
            "ApprovalDecision",
            json!({"type": "object", "additionalProperties": false, "required": ["decision"], "properties": {
                "decision": {"enum": ["approve", "deny"]}}}),
        ),
    ]
}
