//! Inference pool gateway: OpenAI-compatible endpoints and pools (issue 10).
//!
//! This module owns its state ([`GatewayState`]), its configuration
//! ([`GatewayConfig`], a field of [`crate::ServerConfig`]), its routes and its
//! OpenAPI schemas; handlers only translate between HTTP and the crate that
//! owns the behaviour (`tessera-gateway`).
//!
//! Callers authenticate as for the rest of the API. `X-Session-Id` names the
//! session (a session-scoped key is always its own session), `X-Priority` the
//! priority in the gateway queue. Usage goes to the agent platform's meter
//! (`tokens_in`, `tokens_out`, `tokens_cached` per session) and budgets are
//! checked before dispatch. Pools are cluster-wide objects in the store (kind
//! `pool`, system tenant); system operators register and update them.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tessera_agent::meter::{self, UsageKind, UsageRecord};
use tessera_agent::trace;
use tessera_gateway::http::{self as gw, InferenceGateway, PoolSpec, Refusal, Usage, UsageSink};
use tessera_store::{AnyStore, Key, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::StartError;
use crate::api::{App, Body, SessionCaller};
use crate::auth::Role;
use crate::plane::{Caller, ControlPlane, SYSTEM_TENANT, now_ms};
use crate::problem::{ApiError, Code};

const KIND_POOL: &str = "pool";

/// Settings for this module, from `tessera up` flags.
#[derive(Clone, Debug, Default)]
pub struct GatewayConfig {
    /// Gateway tuning (scrape period, retry count, timeouts).
    pub gateway: gw::InferenceGatewayConfig,
}

/// What the handlers of this module share.
#[derive(Clone, Debug)]
pub struct GatewayState {
    pub gateway: InferenceGateway,
}

/// The agent platform's meter as the gateway's usage sink.
struct Meter {
    store: AnyStore,
}

impl UsageSink for Meter {
    fn check<'a>(&'a self, who: &'a gw::InferenceCaller) -> BoxFuture<'a, Result<(), Refusal>> {
        Box::pin(async move {
            let session = who.session.as_deref().unwrap_or("");
            match meter::check_budget(&self.store, &who.tenant, session).await {
                Ok(()) => Ok(()),
                Err(tessera_agent::AgentError::Budget(why)) => Err(Refusal::Budget(why)),
                // The meter cannot answer: do not block inference on it.
                Err(_) => Ok(()),
            }
        })
    }

    fn record<'a>(&'a self, who: &'a gw::InferenceCaller, u: Usage) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let session = who.session.clone().unwrap_or_else(|| "none".into());
            tracing::info!(
                tenant = %who.tenant,
                session_id = %session,
                model_request_id = %u.request_id,
                model = %u.model,
                pool = %u.pool,
                input_tokens = u.prompt_tokens,
                output_tokens = u.completion_tokens,
                cached_tokens = u.cached_tokens,
                ttft_ms = u.ttft_ms,
                "model request {} to {}: {} tokens in, {} out",
                u.request_id,
                u.model,
                u.prompt_tokens,
                u.completion_tokens
            );
            let uncached = u.prompt_tokens.saturating_sub(u.cached_tokens);
            let mut cost = 0.0;
            for (kind, q, tag) in [
                (UsageKind::TokensIn, uncached, "in"),
                (UsageKind::TokensCached, u.cached_tokens, "cached"),
                (UsageKind::TokensOut, u.completion_tokens, "out"),
            ] {
                if q == 0 {
                    continue;
                }
                match meter::record(
                    &self.store,
                    UsageRecord {
                        tenant: who.tenant.clone(),
                        session: session.clone(),
                        runtime: meter_runtime(&u.model),
                        kind,
                        quantity: q as f64,
                        at_ms: now_ms(),
                        source_id: format!("{session}/{}/{tag}", u.request_id),
                    },
                )
                .await
                {
                    Ok(r) => cost += r.cost,
                    Err(e) => tracing::warn!(
                        tenant = %who.tenant,
                        session_id = %session,
                        model_request_id = %u.request_id,
                        "gateway: metering {} tokens of {}/{session}: {e}",
                        kind.as_str(),
                        who.tenant
                    ),
                }
            }
            if who.session.is_some() {
                if let Err(e) =
                    trace::record_span(&self.store, &who.tenant, chat_span(who, &u, cost)).await
                {
                    tracing::warn!(
                        tenant = %who.tenant,
                        session_id = %session,
                        model_request_id = %u.request_id,
                        "gateway: recording the span of {}/{session}: {e}",
                        who.tenant
                    );
                }
            }
        })
    }
}

/// The meter's runtime name for a model: `model.` and the model name with
/// characters the meter's names do not take (`/`, `:`, …) as `_`, e.g.
/// `meta-llama/Llama-3-8B` -> `model.meta-llama_Llama-3-8B`.
fn meter_runtime(model: &str) -> String {
    let m: String = model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(128 - "model.".len())
        .collect();
    format!("model.{m}")
}

/// The OpenTelemetry GenAI span of one call (`chat {model}`, operation `chat`),
/// stored in the session's trace beside its invocations and tool calls (the
/// trace tree puts it under the invocation running when it started). The
/// caller's W3C `traceparent`, when sent, is kept in the attributes.
fn chat_span(who: &gw::InferenceCaller, u: &Usage, cost: f64) -> trace::Span {
    let session = who.session.clone().unwrap_or_default();
    let mut attrs = json!({
        "gen_ai.operation.name": "chat",
        "gen_ai.conversation.id": session,
        "gen_ai.request.model": u.model,
        "gen_ai.response.id": u.response_id,
        "gen_ai.usage.input_tokens": u.prompt_tokens,
        "gen_ai.usage.output_tokens": u.completion_tokens,
        "gen_ai.usage.cache_read.input_tokens": u.cached_tokens,
        "gen_ai.usage.reasoning.output_tokens": u.reasoning_tokens,
        "server.address": u.endpoint,
        "tessera.pool": u.pool,
        "tessera.tenant": who.tenant,
        "tessera.gateway.ttft_ms": u.ttft_ms,
        "tessera.gateway.overhead_us": u.overhead_us,
    });
    // traceparent: 00-<trace id>-<parent span id>-<flags>.
    if let Some(tp) = &who.traceparent {
        let parts: Vec<&str> = tp.split('-').collect();
        if parts.len() == 4 && parts[1].len() == 32 && parts[2].len() == 16 {
            attrs["trace_id"] = json!(parts[1]);
            attrs["parent_span_id"] = json!(parts[2]);
        }
    }
    trace::Span {
        session,
        span_id: format!("chat-{}", u.request_id),
        parent: None,
        name: format!("chat {}", u.model),
        operation: "chat".into(),
        start_ms: u.started_ms,
        duration_ms: u.total_ms,
        cost,
        attributes: attrs,
    }
}

impl GatewayState {
    /// Starts this module: its state and any background tasks, which end when
    /// `stop` turns true.
    pub(crate) async fn start(
        plane: &ControlPlane,
        cfg: &GatewayConfig,
        stop: &watch::Receiver<bool>,
    ) -> Result<(Self, Vec<JoinHandle<()>>), StartError> {
        let store = plane.store().clone();
        let gateway = InferenceGateway::new(
            Arc::new(Meter {
                store: store.clone(),
            }),
            cfg.gateway.clone(),
        );
        // Pools registered before a restart.
        if let Ok(l) = store.list(KIND_POOL, Some(SYSTEM_TENANT)).await {
            for o in l.objects {
                if let Ok(spec) = serde_json::from_value::<PoolSpec>(o.body) {
                    let _ = gateway.upsert_pool(spec);
                }
            }
        }
        let scraper = tokio::spawn(gateway.clone().run_scraper(stop.clone()));
        Ok((GatewayState { gateway }, vec![scraper]))
    }
}

fn who(c: &Caller, h: &HeaderMap) -> gw::InferenceCaller {
    let header = |n: &str| {
        h.get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.len() <= 256)
            .map(str::to_string)
    };
    let session = match c.subject.strip_prefix("session:") {
        Some(own) => Some(own.to_string()),
        None => header("x-session-id"),
    };
    gw::InferenceCaller {
        tenant: c.tenant.clone(),
        subject: c.subject.clone(),
        session,
        priority: header("x-priority")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
            .clamp(-100, 100),
        traceparent: header("traceparent"),
    }
}

/// The caller, or why `X-Session-Id` is not a session id the meter and
/// traces take.
fn checked_who(c: &Caller, h: &HeaderMap) -> Result<gw::InferenceCaller, String> {
    let w = who(c, h);
    if let Some(s) = &w.session {
        if tessera_agent::sessions::check_id(s).is_err() {
            return Err(format!(
                "X-Session-Id: {s:?} is not a session id: use 1 to 128 of a-z, A-Z, 0-9, '.', '_', '-'"
            ));
        }
    }
    Ok(w)
}

fn bad_request(msg: String) -> Response {
    gw::openai_error(
        axum::http::StatusCode::BAD_REQUEST,
        "invalid_request_error",
        msg,
    )
}

/// One call through the inference pool serving the body's `model`: the developer role,
/// a session id the meter takes, then the engine's answer, redacted per the pool
/// (`redact: false` for answers that carry no text, embeddings' vectors).
async fn pass_through(
    a: &App,
    c: &Caller,
    h: &HeaderMap,
    path: &'static str,
    body: Bytes,
    redact: bool,
) -> Response {
    if let Err(e) = c.require(Role::Developer) {
        return e.into_response();
    }
    let w = match checked_who(c, h) {
        Ok(w) => w,
        Err(m) => return bad_request(m),
    };
    let mode = redact.then(|| a.gateway.gateway.redact_mode(&model_of(&body)));
    let r = a.gateway.gateway.forward(w, path, body).await;
    match mode {
        Some(mode) => redact_completion(a, &c.tenant, mode, r).await,
        None => r,
    }
}

async fn chat(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    pass_through(&a, &c, &h, "/v1/chat/completions", body, true).await
}

async fn completions(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    pass_through(&a, &c, &h, "/v1/completions", body, true).await
}

/// The `model` a request body names (empty when it names none: the gateway refuses it).
fn model_of(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct M {
        #[serde(default)]
        model: String,
    }
    serde_json::from_slice::<M>(body)
        .map(|m| m.model)
        .unwrap_or_default()
}

/// Largest non-streamed completion redacted in one piece (larger ones pass through
/// in chunks, each redacted).
const MAX_BUFFERED: usize = 16 << 20;

/// An engine's answer with what the pool's `redact` setting covers replaced by
/// `[REDACTED:<rule>]`: a JSON answer string by string, a stream event by event
/// (server-sent events end with a blank line; an event is redacted whole). A secret
/// the engine spreads over several streamed tokens is not seen: each event carries
/// its own delta (docs/gateway.md says so).
async fn redact_completion(a: &App, tenant: &str, mode: gw::Redact, r: Response) -> Response {
    if mode == gw::Redact::Off {
        return r;
    }
    let guard = a.plane.guard().clone();
    let tenant = tenant.to_string();
    let redact = move |at: &str, b: &[u8]| match mode {
        gw::Redact::All => guard.redact_at(Some(&tenant), at, b),
        _ => guard.redact_secrets(Some(&tenant), at, b),
    };
    let sse = r
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let (mut parts, body) = r.into_parts();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    if sse {
        use futures_util::StreamExt;
        let src = body.into_data_stream();
        // (source, bytes held back, source ended)
        let stream = futures_util::stream::unfold(
            (src, Vec::<u8>::new(), false, redact),
            |(mut src, mut buf, ended, redact)| async move {
                if ended {
                    return None;
                }
                loop {
                    match src.next().await {
                        Some(Ok(chunk)) => {
                            buf.extend_from_slice(&chunk);
                            // Release every complete event; hold back the one arriving.
                            if let Some(end) = buf.windows(2).rposition(|w| w == b"\n\n") {
                                let rest = buf.split_off(end + 2);
                                let done = std::mem::replace(&mut buf, rest);
                                let out = redact("completion stream", &done).unwrap_or(done);
                                return Some((
                                    Ok::<_, std::io::Error>(Bytes::from(out)),
                                    (src, buf, false, redact),
                                ));
                            }
                        }
                        Some(Err(e)) => {
                            return Some((
                                Err(std::io::Error::other(e.to_string())),
                                (src, buf, true, redact),
                            ));
                        }
                        None => {
                            let out = redact("completion stream", &buf).unwrap_or(buf);
                            return Some((Ok(Bytes::from(out)), (src, Vec::new(), true, redact)));
                        }
                    }
                }
            },
        );
        return Response::from_parts(parts, axum::body::Body::from_stream(stream));
    }
    let bytes = match axum::body::to_bytes(body, MAX_BUFFERED).await {
        Ok(b) => b,
        Err(e) => {
            return gw::openai_error(
                axum::http::StatusCode::BAD_GATEWAY,
                "api_error",
                format!("reading the engine's answer: {e}"),
            );
        }
    };
    let out = match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut v) => {
            crate::redact::redact_strings(&mut v, &mut |s: &str| {
                redact("completion", s.as_bytes()).map(|b| String::from_utf8_lossy(&b).into_owned())
            });
            v.to_string().into_bytes()
        }
        Err(_) => redact("completion", &bytes).unwrap_or_else(|| bytes.to_vec()),
    };
    Response::from_parts(parts, axum::body::Body::from(out))
}

async fn models(State(a): State<App>, SessionCaller(c): SessionCaller) -> Response {
    if let Err(e) = c.require(Role::Viewer) {
        return e.into_response();
    }
    a.gateway.gateway.models()
}

/// `models.retrieve`: one model a pool serves, or OpenAI's 404.
async fn model(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if let Err(e) = c.require(Role::Viewer) {
        return e.into_response();
    }
    match a.gateway.gateway.model(&id) {
        Some(m) => axum::Json(m).into_response(),
        None => gw::openai_error(
            axum::http::StatusCode::NOT_FOUND,
            "model_not_found",
            format!(
                "The model {} does not exist: no pool serves it (GET /v1/models lists those that do)",
                crate::problem::quote(&id)
            ),
        ),
    }
}

/// Embeddings, passed through to the pool serving `model` (an engine that serves none
/// answers its own 404). Vectors carry no text: nothing to redact on the way back.
async fn embeddings(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    pass_through(&a, &c, &h, "/v1/embeddings", body, false).await
}

/// The Responses API, passed through like chat completions (and redacted the same way).
async fn responses(
    State(a): State<App>,
    SessionCaller(c): SessionCaller,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    pass_through(&a, &c, &h, "/v1/responses", body, true).await
}

/// Whether `path` is one of the OpenAI-compatible routes, whose errors must be in
/// OpenAI's shape so that OpenAI's clients show them.
pub(crate) fn is_openai_path(path: &str) -> bool {
    matches!(
        path,
        "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/responses"
            | "/v1/models"
    ) || path.starts_with("/v1/models/")
}

/// Every error on the OpenAI routes in OpenAI's shape, whatever produced it (the key
/// check, the role check, a body limit, a handler): a problem document there becomes
/// `{"error": {"message", "type", "param", "code"}}` with the same status.
pub(crate) async fn openai_errors(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !is_openai_path(req.uri().path()) {
        return next.run(req).await;
    }
    let r = next.run(req).await;
    let problem = r
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !problem {
        return r;
    }
    let (parts, body) = r.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let p: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let kind = match parts.status.as_u16() {
        401 => "invalid_api_key",
        403 => "permission_denied",
        404 => "not_found",
        413 | 400 | 422 => "invalid_request_error",
        429 => "rate_limit_exceeded",
        _ => "api_error",
    };
    let body = serde_json::json!({"error": {
        "message": p["detail"].as_str().unwrap_or("request failed"),
        "type": if parts.status.as_u16() == 401 { "invalid_request_error" } else { kind },
        "param": p["field"],
        "code": p["code"].as_str().unwrap_or(kind),
    }});
    let mut out = (parts.status, axum::Json(body)).into_response();
    for (k, v) in parts.headers.iter() {
        if k != axum::http::header::CONTENT_TYPE && k != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

type R = Result<Response, ApiError>;

async fn put_pool_spec(a: &App, spec: PoolSpec) -> Result<bool, ApiError> {
    spec.validate()
        .map_err(|e| ApiError::invalid(e.split(':').next().unwrap_or("pool").to_string(), e))?;
    let body =
        serde_json::to_value(&spec).map_err(|e| ApiError::new(Code::Internal, e.to_string()))?;
    let key = Key::new(KIND_POOL, SYSTEM_TENANT, &spec.name);
    let st = a.plane.store();
    // Check against the live gateway first (model already served elsewhere).
    let created = a
        .gateway
        .gateway
        .upsert_pool(spec.clone())
        .map_err(|e| ApiError::invalid(e.split(':').next().unwrap_or("pool").to_string(), e))?;
    match st.get(&key).await? {
        Some(o) => st.update(key, Some(o.version), body).await?,
        None => st.create(key, body).await?,
    };
    Ok(created)
}

async fn create_pool(State(a): State<App>, c: Caller, Body(spec): Body<PoolSpec>) -> R {
    c.require_system(Role::Operator)?;
    if a.gateway.gateway.pool_status(&spec.name).is_some() {
        return Err(ApiError::new(
            Code::AlreadyExists,
            format!(
                "pool {:?} exists: PUT /v1/pools/{} updates it",
                spec.name, spec.name
            ),
        ));
    }
    put_pool_spec(&a, spec.clone()).await?;
    let st = a.gateway.gateway.pool_status(&spec.name);
    Ok((axum::http::StatusCode::CREATED, axum::Json(json!(st))).into_response())
}

async fn update_pool(
    State(a): State<App>,
    c: Caller,
    Path(name): Path<String>,
    Body(spec): Body<PoolSpec>,
) -> R {
    c.require_system(Role::Operator)?;
    if spec.name != name {
        return Err(ApiError::invalid(
            "name",
            format!("name {:?} differs from the path's {name:?}", spec.name),
        ));
    }
    put_pool_spec(&a, spec).await?;
    Ok(axum::Json(json!(a.gateway.gateway.pool_status(&name))).into_response())
}

async fn list_pools(State(a): State<App>, c: Caller) -> R {
    c.require(Role::Viewer)?;
    Ok(axum::Json(json!({"items": a.gateway.gateway.pools()})).into_response())
}

/// The kind `/v1/watch` samples the pools for.
pub const WATCH_KIND: &str = "pool";

/// How often a pool watch samples the pools' figures.
pub const POOL_SAMPLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Each pool as `GET /v1/pools` shows it, by name.
fn pool_figures(g: &InferenceGateway) -> std::collections::BTreeMap<String, Value> {
    g.pools()
        .into_iter()
        .map(|p| (p.spec.name.clone(), json!(p)))
        .collect()
}

/// `GET /v1/watch?kind=pool`: a pool's figures are gauges, not stored changes, so
/// the server samples them for each watcher every [`POOL_SAMPLE`] and sends a pool
/// only when what it shows changed since the last sample (`created`, `updated`,
/// `deleted`; `id:` the sample's time in ms). Nothing is kept to resume from: an
/// `after` is answered 410, and the watcher lists the pools again.
pub(crate) fn watch_pools(
    a: &App,
    c: &Caller,
    after: Option<u64>,
) -> Result<
    impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>
    + Send
    + use<>,
    ApiError,
> {
    use axum::response::sse::Event;
    use futures_util::StreamExt;
    c.require(Role::Viewer)?;
    if let Some(n) = after {
        return Err(ApiError::new(
            Code::Compacted,
            format!(
                "pool figures are sampled, not kept: a watch cannot resume after {n}; list the pools again and watch from now"
            ),
        ));
    }
    let g = a.gateway.gateway.clone();
    let seen = pool_figures(&g);
    let mut tick = tokio::time::interval(POOL_SAMPLE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    Ok(
        futures_util::stream::unfold((g, seen, tick), |(g, mut seen, mut tick)| async move {
            loop {
                tick.tick().await;
                let now = pool_figures(&g);
                let mut out = Vec::new();
                for (name, v) in &now {
                    match seen.get(name) {
                        None => out.push(("created", v.clone())),
                        Some(old) if old != v => out.push(("updated", v.clone())),
                        Some(_) => {}
                    }
                }
                for (name, v) in &seen {
                    if !now.contains_key(name) {
                        out.push(("deleted", v.clone()));
                    }
                }
                seen = now;
                if out.is_empty() {
                    continue;
                }
                let id = now_ms().to_string();
                let events: Vec<Result<Event, std::convert::Infallible>> = out
                    .into_iter()
                    .map(|(op, v)| Ok(Event::default().event(op).id(&id).data(v.to_string())))
                    .collect();
                return Some((events, (g, seen, tick)));
            }
        })
        .flat_map(futures_util::stream::iter),
    )
}

async fn get_pool(State(a): State<App>, c: Caller, Path(name): Path<String>) -> R {
    c.require(Role::Viewer)?;
    match a.gateway.gateway.pool_status(&name) {
        Some(p) => Ok(axum::Json(json!(p)).into_response()),
        None => Err(ApiError::new(Code::NotFound, format!("no pool {name:?}"))),
    }
}

async fn delete_pool(State(a): State<App>, c: Caller, Path(name): Path<String>) -> R {
    c.require_system(Role::Operator)?;
    let key = Key::new(KIND_POOL, SYSTEM_TENANT, &name);
    let gone = a.gateway.gateway.remove_pool(&name);
    let st = a.plane.store();
    if let Some(o) = st.get(&key).await? {
        st.delete(key, Some(o.version)).await?;
    } else if !gone {
        return Err(ApiError::new(Code::NotFound, format!("no pool {name:?}")));
    }
    Ok(axum::http::StatusCode::NO_CONTENT.into_response())
}

/// Engine KV-cache events for the pool's precise prefix index, from an
/// adapter next to the engine (see docs/gateway.md, "Precise prefix mode").
async fn pool_kv_events(
    State(a): State<App>,
    c: Caller,
    Path(name): Path<String>,
    Body(b): Body<gw::KvEvents>,
) -> R {
    c.require_system(Role::Operator)?;
    match a.gateway.gateway.kv_events(&name, &b) {
        Ok(n) => Ok(axum::Json(json!({"applied_blocks": n})).into_response()),
        Err(e) if e.starts_with("no pool") => Err(ApiError::new(Code::NotFound, e)),
        Err(e) => Err(ApiError::invalid(
            e.split(':').next().unwrap_or("events").to_string(),
            e,
        )),
    }
}

crate::api::routes! {
    ROUTES, routes;
    post "/v1/chat/completions" chat "OpenAI chat completions through the inference pool serving `model` (streaming with SSE)" Some("ChatCompletionRequest"), 200;
    post "/v1/completions" completions "OpenAI completions through the inference pool serving `model`" Some("CompletionRequest"), 200;
    get "/v1/models" models "Models served by the registered pools (OpenAI shape)" None, 200;
    get "/v1/models/{id}" model "One model a pool serves (OpenAI's models.retrieve)" None, 200;
    post "/v1/embeddings" embeddings "OpenAI embeddings, passed through to the pool serving `model`" None, 200;
    post "/v1/responses" responses "The OpenAI Responses API, passed through to the pool serving `model` (redacted like completions)" None, 200;
    post "/v1/pools" create_pool "Register an inference pool (system operators)" Some("PoolSpec"), 201;
    get "/v1/pools" list_pools "Pools with endpoint health, load and recommended replicas" None, 200;
    get "/v1/pools/{name}" get_pool "One pool's state and scaling signal" None, 200;
    put "/v1/pools/{name}" update_pool "Update a pool in place (endpoints keep their state) (system operators)" Some("PoolSpec"), 200;
    delete "/v1/pools/{name}" delete_pool "Remove a pool (system operators)" None, 204;
    post "/v1/pools/{name}/kv-events" pool_kv_events "Engine KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared) for precise prefix routing (system operators)" Some("KvEvents"), 200;
}

/// Request-body schemas this module's routes name, for the OpenAPI document.
pub fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "ChatCompletionRequest",
            json!({"type": "object", "required": ["model", "messages"], "properties": {
                "model": {"type": "string"}, "messages": {"type": "array"}, "stream": {"type": "boolean"},
                "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}}}}),
        ),
        (
            "CompletionRequest",
            json!({"type": "object", "required": ["model", "prompt"], "properties": {
                "model": {"type": "string"}, "prompt": {}, "stream": {"type": "boolean"}}}),
        ),
        (
            "PoolSpec",
            json!({"type": "object", "required": ["name", "model", "endpoints"], "properties": {
                "name": {"type": "string"}, "model": {"type": "string"},
                "endpoints": {"type": "array", "items": {"type": "object", "required": ["url"], "properties": {
                    "url": {"type": "string"}, "weight": {"type": "integer", "minimum": 1}}}},
                "max_in_flight": {"type": "integer", "minimum": 1}, "max_queue": {"type": "integer"},
                "queue_timeout_ms": {"type": "integer"}}}),
        ),
        (
            "KvEvents",
            json!({"type": "object", "required": ["endpoint", "events"], "properties": {
                "endpoint": {"type": "string", "description": "the engine's URL as the pool lists it"},
                "events": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
                    "type": {"enum": ["BlockStored", "BlockRemoved", "AllBlocksCleared"]},
                    "block_hashes": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}}}}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_become_meter_runtime_names() {
        assert_eq!(
            meter_runtime("meta-llama/Llama-3-8B:q4"),
            "model.meta-llama_Llama-3-8B_q4"
        );
        let long = meter_runtime(&"x".repeat(300));
        assert!(tessera_agent::error::check_token("runtime", &long, 128).is_ok());
        assert!(tessera_agent::error::check_token("runtime", &meter_runtime("a/b:c"), 128).is_ok());
    }
}
