//! The gateway proper: pools of OpenAI-compatible engines, admission (a
//! saturation detector and a per-tenant fair queue at the gateway), routing
//! ([`crate::route`]), forwarding with retries before the first byte, streaming
//! pass-through, usage metering and engine health.
//!
//! The server authenticates the caller and hands the request here with a
//! [`InferenceCaller`]; replies and errors use OpenAI's shapes so OpenAI clients read them.
//!
//! The parts, each a child module: `pool` (pools and their endpoints, the
//! in-flight guard, KV events), `queue` (the per-tenant fair queue and
//! admission), `metrics` (engine scraping, the pools' figures, Prometheus gauges)
//! and `forward` (the request pipeline: accept, admit, route, send, relay).

mod forward;
mod metrics;
mod pool;
mod queue;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::json;

pub use forward::request_blocks;
pub use metrics::{Percentiles, STATS_WINDOW, parse_vllm_metrics, percentiles};
pub use pool::{
    EndpointSpec, EndpointStatus, KvEvent, KvEvents, MAX_KV_EVENT_BLOCKS, PoolSpec, PoolStats,
    PoolStatus, Redact,
};

use pool::Pool;

/// Who is calling (authenticated by the server) and what travels with the call.
#[derive(Debug, Clone, Default)]
pub struct InferenceCaller {
    pub tenant: String,
    pub subject: String,
    /// `X-Session-Id`.
    pub session: Option<String>,
    /// Higher first within the gateway queue (`X-Priority`).
    pub priority: i32,
    /// W3C `traceparent` of the caller's trace, forwarded to the engine.
    pub traceparent: Option<String>,
}

/// Token usage of one call, from the engine's `usage` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub pool: String,
    pub model: String,
    pub request_id: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    pub reasoning_tokens: u64,
    /// Request in to first byte out, and to the end, in ms.
    pub ttft_ms: f64,
    pub total_ms: f64,
    pub endpoint: String,
    /// The gateway's own time, in microseconds: request in to first byte
    /// forwarded, less the time spent waiting on engines (from sending to an
    /// engine to its first byte, failed attempts included).
    #[serde(default)]
    pub overhead_us: u64,
    /// The engine's response id (`id`), for the trace.
    #[serde(default)]
    pub response_id: String,
    /// When the request came in, ms since the Unix epoch.
    #[serde(default)]
    pub started_ms: u64,
}

/// Why a caller may not spend now.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// Budget spent: 402.
    Budget(String),
    /// Rate or quota: 429.
    Quota(String),
}

/// Where usage goes (the platform's meter) and who says whether a caller may
/// spend. The server implements it over the agent platform's meter.
pub trait UsageSink: Send + Sync + 'static {
    fn check<'a>(&'a self, who: &'a InferenceCaller) -> BoxFuture<'a, Result<(), Refusal>>;
    fn record<'a>(&'a self, who: &'a InferenceCaller, usage: Usage) -> BoxFuture<'a, ()>;
}

/// Keeps usage in memory (tests, and when no meter is wired).
#[derive(Debug, Default)]
pub struct MemorySink {
    pub records: Mutex<Vec<(String, Option<String>, Usage)>>,
    /// Tenants refused with a budget reason.
    pub over_budget: Mutex<BTreeMap<String, String>>,
}

impl UsageSink for MemorySink {
    fn check<'a>(&'a self, who: &'a InferenceCaller) -> BoxFuture<'a, Result<(), Refusal>> {
        let r = match self.over_budget.lock() {
            Ok(m) => m.get(&who.tenant).cloned(),
            Err(_) => None,
        };
        Box::pin(async move { r.map_or(Ok(()), |why| Err(Refusal::Budget(why))) })
    }
    fn record<'a>(&'a self, who: &'a InferenceCaller, usage: Usage) -> BoxFuture<'a, ()> {
        if let Ok(mut v) = self.records.lock() {
            v.push((who.tenant.clone(), who.session.clone(), usage));
        }
        Box::pin(async {})
    }
}

/// The inference gateway's settings.
#[derive(Debug, Clone)]
pub struct InferenceGatewayConfig {
    /// How often engines' `/metrics` are read.
    pub scrape_period: Duration,
    /// How long a failed endpoint stays out of rotation before it is tried again.
    pub down_for: Duration,
    /// Attempts on other endpoints when one fails before the first byte.
    pub retries: usize,
    /// Connect and first-byte timeout towards engines.
    pub engine_timeout: Duration,
}

impl Default for InferenceGatewayConfig {
    fn default() -> Self {
        InferenceGatewayConfig {
            scrape_period: Duration::from_millis(500),
            down_for: Duration::from_secs(10),
            retries: 2,
            engine_timeout: Duration::from_secs(30),
        }
    }
}

/// The gateway: pools, the engine client and the usage sink. Cheap to clone.
#[derive(Clone)]
pub struct InferenceGateway {
    pools: Arc<RwLock<BTreeMap<String, Arc<Pool>>>>,
    sink: Arc<dyn UsageSink>,
    client: reqwest::Client,
    cfg: InferenceGatewayConfig,
    ids: Arc<AtomicU64>,
    /// When this gateway started (ms): request ids are unique across restarts,
    /// so metering (idempotent by request id) never drops a new call as a
    /// repeat of an old one.
    boot: u64,
}

impl std::fmt::Debug for InferenceGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InferenceGateway").finish_non_exhaustive()
    }
}

impl InferenceGateway {
    pub fn new(sink: Arc<dyn UsageSink>, cfg: InferenceGatewayConfig) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(cfg.engine_timeout)
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        InferenceGateway {
            pools: Arc::default(),
            sink,
            client,
            cfg,
            ids: Arc::new(AtomicU64::new(1)),
            boot: now_ms(),
        }
    }
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "code"}}`.
pub fn openai_error(status: StatusCode, kind: &str, msg: impl Into<String>) -> Response {
    let body = json!({"error": {"message": msg.into(), "type": kind, "code": kind}});
    let mut r = (status, axum::Json(body)).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn too_many(msg: String, retry_after_s: u64) -> Response {
    let mut r = openai_error(StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded", msg);
    if let Ok(v) = HeaderValue::from_str(&retry_after_s.max(1).to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
