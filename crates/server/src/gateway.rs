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
use tessera_gateway::http::{self as gw, Gateway, PoolSpec, Refusal, Usage, UsageSink};
use tessera_store::{AnyStore, Key, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::StartError;
use crate::api::{App, Body};
use crate::auth::Role;
use crate::plane::{Caller, ControlPlane, SYSTEM_TENANT, now_ms};
use crate::problem::{ApiError, Code};

const KIND_POOL: &str = "pool";

/// Settings for this module, from `tessera up` flags.
#[derive(Clone, Debug, Default)]
pub struct GatewayConfig {
    /// Gateway tuning (scrape period, retry count, timeouts).
    pub gateway: gw::GatewayConfig,
}

/// What the handlers of this module share.
#[derive(Clone, Debug)]
pub struct GatewayState {
    pub gateway: Gateway,
}

/// The agent platform's meter as the gateway's usage sink.
struct Meter {
    store: AnyStore,
}

impl UsageSink for Meter {
    fn check<'a>(&'a self, who: &'a gw::Caller) -> BoxFuture<'a, Result<(), Refusal>> {
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

    fn record<'a>(&'a self, who: &'a gw::Caller, u: Usage) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let session = who.session.clone().unwrap_or_else(|| "none".into());
            let uncached = u.prompt_tokens.saturating_sub(u.cached_tokens);
            for (kind, q, tag) in [
                (UsageKind::TokensIn, uncached, "in"),
                (UsageKind::TokensCached, u.cached_tokens, "cached"),
                (UsageKind::TokensOut, u.completion_tokens, "out"),
            ] {
                if q == 0 {
                    continue;
                }
                let _ = meter::record(
                    &self.store,
                    UsageRecord {
                        tenant: who.tenant.clone(),
                        session: session.clone(),
                        runtime: format!("model:{}", u.model),
                        kind,
                        quantity: q as f64,
                        at_ms: now_ms(),
                        source_id: format!("{session}/{}/{tag}", u.request_id),
                    },
                )
                .await;
            }
        })
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
        let gateway = Gateway::new(
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

fn who(c: &Caller, h: &HeaderMap) -> gw::Caller {
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
    gw::Caller {
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

async fn chat(State(a): State<App>, c: Caller, h: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = c.require(Role::Developer) {
        return e.into_response();
    }
    a.gateway
        .gateway
        .forward(who(&c, &h), "/v1/chat/completions", body)
        .await
}

async fn completions(State(a): State<App>, c: Caller, h: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = c.require(Role::Developer) {
        return e.into_response();
    }
    a.gateway
        .gateway
        .forward(who(&c, &h), "/v1/completions", body)
        .await
}

async fn models(State(a): State<App>, c: Caller) -> Response {
    if let Err(e) = c.require(Role::Viewer) {
        return e.into_response();
    }
    a.gateway.gateway.models()
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

crate::api::routes! {
    ROUTES, routes;
    post "/v1/chat/completions" chat "OpenAI chat completions through the inference pool serving `model` (streaming with SSE)" Some("ChatCompletionRequest"), 200;
    post "/v1/completions" completions "OpenAI completions through the inference pool serving `model`" Some("CompletionRequest"), 200;
    get "/v1/models" models "Models served by the registered pools (OpenAI shape)" None, 200;
    post "/v1/pools" create_pool "Register an inference pool (system operators)" Some("PoolSpec"), 201;
    get "/v1/pools" list_pools "Pools with endpoint health, load and recommended replicas" None, 200;
    get "/v1/pools/{name}" get_pool "One pool's state and scaling signal" None, 200;
    put "/v1/pools/{name}" update_pool "Update a pool in place (endpoints keep their state) (system operators)" Some("PoolSpec"), 200;
    delete "/v1/pools/{name}" delete_pool "Remove a pool (system operators)" None, 204;
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
    ]
}
