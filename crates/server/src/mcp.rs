//! The MCP endpoint `/v1/mcp` (Streamable HTTP, served by the official `rmcp`
//! crate): `tools/list` lists the calling session's granted tools (a key without a
//! session: the tools its role is granted in any runtime, to browse), `tools/call`
//! goes through the same ledger as `POST /v1/tools/{name}/call`; arguments a model
//! got wrong come back as a tool result with `isError`, not a protocol error.
//!
//! The request is authenticated by the API (bearer key) before rmcp sees it; the
//! handler reads the [`Caller`] from the HTTP request parts rmcp passes along.
//! The session is the caller's own (`session:<id>` keys) or the
//! `Tessera-Session-Id` header; the tool call id comes from `_meta`
//! (`tessera.dev/tool_call_id`), the `Tessera-Tool-Call-Id` header, or else the
//! JSON-RPC request id; the idempotency key from `_meta`
//! (`tessera.dev/idempotency_key`) or the `Idempotency-Key` header.
//!
//! A call waiting for an approval (a two-phase confirm) answers a client on
//! MCP 2026-07-28 or later with `resultType: "input_required"` and a
//! `requestState` (`approval:<ledger id>`, only a handle: the state is the
//! ledger entry, checked again on the retry); the client retries with it and
//! gets the outcome once someone decided. Older clients get a result with
//! `isError` (nothing ran yet) whose `structuredContent.status` is
//! `pending_approval` and call again with the same tool call id.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    InitializeResult, InputRequiredResult, ListToolsResult, MetaObject, PaginatedRequestParams,
    ProtocolVersion, ServerCapabilities, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};
use tessera_agent::tools::{self as gw, CallError, CallRequest, Status, ToolGateway};
use tessera_store::AnyStore;

use crate::api::App;
use crate::plane::Caller;
use crate::tools::{audit, gw_caller};

/// The rmcp service behind `/v1/mcp`. Cheap to clone.
#[derive(Clone)]
pub(crate) struct McpService(Arc<StreamableHttpService<McpTools, LocalSessionManager>>);

impl std::fmt::Debug for McpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("McpService")
    }
}

pub(crate) fn service(gateway: ToolGateway<AnyStore>) -> McpService {
    let cfg = StreamableHttpServerConfig::default()
        .with_json_response(true)
        // Every request is authenticated by an API key before it reaches rmcp,
        // so the Host allow-list (a DNS-rebinding guard for unauthenticated
        // local servers) would only get in the way of remote agents.
        .disable_allowed_hosts();
    let svc = StreamableHttpService::new(
        move || {
            Ok(McpTools {
                gateway: gateway.clone(),
            })
        },
        Arc::new(LocalSessionManager::default()),
        cfg,
    );
    McpService(Arc::new(svc))
}

/// Hands an authenticated request to rmcp.
pub(crate) async fn handle(a: &App, c: Caller, mut req: Request) -> Response {
    let closing = req.method() == axum::http::Method::DELETE;
    req.extensions_mut().insert(c);
    let mut resp = a
        .tools
        .mcp
        .0
        .handle(req)
        .await
        .map(axum::body::Body::new)
        .into_response();
    // Closing a session is done when it answers: 204, as clients expect (rmcp says 202,
    // which the official SDK reports as a failed termination).
    if closing && resp.status() == axum::http::StatusCode::ACCEPTED {
        *resp.status_mut() = axum::http::StatusCode::NO_CONTENT;
        *resp.body_mut() = axum::body::Body::empty();
    }
    resp
}

#[derive(Clone)]
pub(crate) struct McpTools {
    gateway: ToolGateway<AnyStore>,
}

fn parts(ctx: &RequestContext<RoleServer>) -> Result<&axum::http::request::Parts, ErrorData> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .ok_or_else(|| ErrorData::internal_error("no HTTP request parts", None))
}

fn header<'a>(p: &'a axum::http::request::Parts, name: &str) -> Option<&'a str> {
    p.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The caller and the session a request is for, if it names one: a session key's own,
/// else the `Tessera-Session-Id` header.
fn who_maybe(ctx: &RequestContext<RoleServer>) -> Result<(Caller, Option<String>), ErrorData> {
    let p = parts(ctx)?;
    let c = p
        .extensions
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| ErrorData::internal_error("unauthenticated MCP request", None))?;
    let session = match c.subject.strip_prefix("session:") {
        Some(s) => Some(s.to_string()),
        None => header(p, "tessera-session-id").map(str::to_string),
    };
    Ok((c, session))
}

/// The caller and the session a call is for (a call always needs one).
fn who(ctx: &RequestContext<RoleServer>) -> Result<(Caller, String), ErrorData> {
    let (c, session) = who_maybe(ctx)?;
    let session = session.ok_or_else(|| {
        ErrorData::invalid_request(
            "which session? a tool is called for an agent session: use a session key, or send the Tessera-Session-Id header (tools/list works without one)",
            None,
        )
    })?;
    Ok((c, session))
}

/// A mistake the model can correct (bad arguments): a tool result with `isError`, so
/// an agent sees the message instead of a protocol failure.
fn correctable(e: &CallError) -> Option<CallToolResult> {
    let detail = match e {
        CallError::InvalidArguments(v) => json!({"path": v.path}),
        CallError::Invalid { field, .. } => json!({"field": field}),
        _ => return None,
    };
    let mut r = CallToolResult::error(vec![ContentBlock::text(format!("invalid arguments: {e}"))]);
    r.structured_content =
        Some(json!({"status": "invalid_arguments", "error": e.to_string(), "detail": detail}));
    Some(r)
}

fn refusal(e: CallError) -> ErrorData {
    let msg = e.to_string();
    match e {
        CallError::InvalidArguments(v) => {
            ErrorData::invalid_params(msg, Some(json!({"path": v.path})))
        }
        CallError::Invalid { field, .. } => {
            ErrorData::invalid_params(msg, Some(json!({"field": field})))
        }
        CallError::Store(_) => ErrorData::internal_error(msg, None),
        _ => ErrorData::invalid_request(msg, None),
    }
}

fn to_tool(t: &gw::CompiledTool) -> Tool {
    let s = &t.spec;
    let schema = s.input_schema.as_object().cloned().unwrap_or_default();
    let mut tool = Tool::new(s.name.clone(), s.description.clone(), Arc::new(schema));
    if let Some(o) = s.output_schema.as_ref().and_then(Value::as_object) {
        tool = tool.with_raw_output_schema(Arc::new(o.clone()));
    }
    tool.with_annotations(
        ToolAnnotations::new()
            .read_only(s.read_only)
            .destructive(!s.read_only)
            .idempotent(s.read_only || s.idempotency_keys),
    )
}

impl McpTools {
    /// The ledger entry an echoed `requestState` names, if it is a call of
    /// this session to this tool (the state comes back from the client, so it
    /// is only a handle, checked here).
    async fn pending_entry(
        &self,
        c: &Caller,
        session: &str,
        tool: &str,
        state: &str,
    ) -> Result<gw::Entry, ErrorData> {
        let bad = || {
            ErrorData::invalid_params(
                format!(
                    "requestState {state:?} names no call of this session to tool {tool:?}: call again without it"
                ),
                None,
            )
        };
        let id = state.strip_prefix("approval:").ok_or_else(bad)?;
        let e = self
            .gateway
            .entry(&c.tenant, id)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
            .ok_or_else(bad)?;
        if e.session_id != session || e.tool != tool {
            return Err(bad());
        }
        Ok(e)
    }
}

impl ServerHandler for McpTools {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions(
                "Tessera tool gateway: the tools granted to your session. Every call is recorded in an exactly-once ledger; pass _meta \"tessera.dev/tool_call_id\" so a retried call is recognised. A call waiting for an approval answers input_required (MCP 2026-07-28) or a result with status pending_approval: call again later with the requestState, or with the same tool_call_id.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (c, session) = who_maybe(&ctx)?;
        let tools = match session {
            Some(session) => self.gateway.granted_tools(&gw_caller(&c), &session).await,
            None => self.gateway.browsable_tools(&gw_caller(&c)).await,
        }
        .map_err(refusal)?;
        Ok(ListToolsResult::with_all_items(
            tools.iter().map(to_tool).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (c, session) = who(&ctx)?;
        let p = parts(&ctx)?;
        // rmcp moves the request's `_meta` into the context; look at both.
        let metas = [
            request
                .meta
                .as_ref()
                .and_then(|m| serde_json::to_value(m).ok()),
            serde_json::to_value(&ctx.meta).ok(),
        ];
        let from_meta = |k: &str| {
            metas
                .iter()
                .flatten()
                .find_map(|m| m.get(k).and_then(Value::as_str).map(str::to_string))
        };
        let tool_call_id = from_meta("tessera.dev/tool_call_id")
            .or_else(|| header(p, "tessera-tool-call-id").map(str::to_string))
            .unwrap_or_else(|| match serde_json::to_value(&ctx.id) {
                Ok(Value::String(s)) => format!("jsonrpc-{s}"),
                Ok(v) => format!("jsonrpc-{v}"),
                Err(_) => "jsonrpc".into(),
            });
        let mut idempotency_key = from_meta("tessera.dev/idempotency_key")
            .or_else(|| header(p, "idempotency-key").map(str::to_string));
        let mut tool_call_id = tool_call_id;
        // An MRTR retry: the echoed handle names the pending ledger entry, so
        // the retry is the same logical call even under a new JSON-RPC id.
        if let Some(state) = &request.request_state {
            let e = self
                .pending_entry(&c, &session, &request.name, state)
                .await?;
            tool_call_id = e.tool_call_id;
            idempotency_key = Some(e.idempotency_key);
        }
        let req = CallRequest {
            session_id: session.clone(),
            tool_call_id,
            idempotency_key,
            arguments: Value::Object(request.arguments.clone().unwrap_or_default()),
        };
        let name = request.name.to_string();
        let out = match self.gateway.call(&gw_caller(&c), &name, req).await {
            Ok(o) => o,
            Err(e @ (CallError::NotGranted { .. } | CallError::NotYourSession { .. })) => {
                audit(
                    self.gateway.store(),
                    &c,
                    "denied-call",
                    format!("tool/{name} session/{session} via mcp"),
                )
                .await;
                return Err(refusal(e));
            }
            Err(e) => match correctable(&e) {
                Some(r) => return Ok(CallToolResponse::Complete(r)),
                None => return Err(refusal(e)),
            },
        };
        let structured = serde_json::to_value(&out).unwrap_or_default();
        let mrtr = ctx
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        if mrtr && matches!(out.status, Status::PendingApproval | Status::InProgress) {
            let mut meta = MetaObject::new();
            meta.0.insert("tessera.dev/outcome".into(), structured);
            return Ok(CallToolResponse::InputRequired(
                InputRequiredResult::from_request_state(format!("approval:{}", out.ledger_id))
                    .with_meta(meta),
            ));
        }
        let result = match out.status {
            Status::Completed => {
                let text = out
                    .result
                    .as_ref()
                    .map(Value::to_string)
                    .unwrap_or_default();
                let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
                r.structured_content = out.result.clone().filter(Value::is_object);
                r
            }
            Status::PendingApproval | Status::InProgress => {
                // A client before MCP 2026-07-28 has no `input_required`: it
                // polls with the same tool call id. Not a success: nothing ran yet.
                let mut r = CallToolResult::error(vec![ContentBlock::text(format!(
                    "{}: not done yet; call again with the same tool_call_id later",
                    match out.status {
                        Status::PendingApproval => "waiting for an approval",
                        _ => "in progress",
                    }
                ))]);
                r.structured_content = Some(structured);
                r
            }
            Status::Failed | Status::InDoubt | Status::Denied => {
                let mut r = CallToolResult::error(vec![ContentBlock::text(format!(
                    "{:?}: {}",
                    out.status,
                    out.error.clone().unwrap_or_default()
                ))]);
                r.structured_content = Some(structured);
                r
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}
