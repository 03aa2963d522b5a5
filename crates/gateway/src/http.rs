//! The gateway proper: pools of OpenAI-compatible engines, admission (a
//! saturation detector and a per-tenant fair queue at the gateway), routing
//! ([`crate::route`]), forwarding with retries before the first byte, streaming
//! pass-through, usage metering and engine health.
//!
//! The server authenticates the caller and hands the request here with a
//! [`Caller`]; replies and errors use OpenAI's shapes so OpenAI clients read them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::route::{
    EndpointLoad, MAX_ENDPOINTS, Policy, RouteRequest, Router, ScaleAdvice, ScaleInput,
    recommend_replicas, text_blocks,
};

/// Who is calling (authenticated by the server) and what travels with the call.
#[derive(Debug, Clone, Default)]
pub struct Caller {
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
    fn check<'a>(&'a self, who: &'a Caller) -> BoxFuture<'a, Result<(), Refusal>>;
    fn record<'a>(&'a self, who: &'a Caller, usage: Usage) -> BoxFuture<'a, ()>;
}

/// Keeps usage in memory (tests, and when no meter is wired).
#[derive(Debug, Default)]
pub struct MemorySink {
    pub records: Mutex<Vec<(String, Option<String>, Usage)>>,
    /// Tenants refused with a budget reason.
    pub over_budget: Mutex<BTreeMap<String, String>>,
}

impl UsageSink for MemorySink {
    fn check<'a>(&'a self, who: &'a Caller) -> BoxFuture<'a, Result<(), Refusal>> {
        let r = match self.over_budget.lock() {
            Ok(m) => m.get(&who.tenant).cloned(),
            Err(_) => None,
        };
        Box::pin(async move { r.map_or(Ok(()), |why| Err(Refusal::Budget(why))) })
    }
    fn record<'a>(&'a self, who: &'a Caller, usage: Usage) -> BoxFuture<'a, ()> {
        if let Ok(mut v) = self.records.lock() {
            v.push((who.tenant.clone(), who.session.clone(), usage));
        }
        Box::pin(async {})
    }
}

/// One engine of a pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// Base URL, e.g. `http://10.0.0.5:8000` (the gateway calls `{url}/v1/...`).
    pub url: String,
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// A pool: one model served by several engines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    pub name: String,
    /// The model name callers ask for (`model` in the request).
    pub model: String,
    pub endpoints: Vec<EndpointSpec>,
    /// Requests in flight per unit of endpoint weight before the endpoint counts
    /// as saturated (further requests wait at the gateway).
    #[serde(default = "default_in_flight")]
    pub max_in_flight: u32,
    /// Requests waiting at the gateway before new ones get 429.
    #[serde(default = "default_queue")]
    pub max_queue: usize,
    /// Longest wait at the gateway, ms, before 429.
    #[serde(default = "default_queue_ms")]
    pub queue_timeout_ms: u64,
    /// What of the engines' answers the control plane redacts before they reach the
    /// caller: `credentials` (the default: keys, tokens, private keys), `all` (personal
    /// data too) or `off`. The gateway only carries the setting; the server redacts.
    #[serde(default)]
    pub redact: Redact,
}

/// A pool's redaction of completions (see [`PoolSpec::redact`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Redact {
    Off,
    #[default]
    Credentials,
    All,
}

fn default_in_flight() -> u32 {
    32
}
fn default_queue() -> usize {
    256
}
fn default_queue_ms() -> u64 {
    10_000
}

impl PoolSpec {
    /// Checks the fields; the error names the field and what to do.
    pub fn validate(&self) -> Result<(), String> {
        let ok_name = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b))
        };
        if !ok_name(&self.name) {
            return Err(format!(
                "name: {:?} must be 1-128 characters of letters, digits, `-_.:/`",
                self.name
            ));
        }
        if !ok_name(&self.model) {
            return Err(format!(
                "model: {:?} must be 1-128 characters of letters, digits, `-_.:/`",
                self.model
            ));
        }
        if self.endpoints.is_empty() || self.endpoints.len() > MAX_ENDPOINTS {
            return Err(format!(
                "endpoints: {} given; a pool has 1 to {MAX_ENDPOINTS}",
                self.endpoints.len()
            ));
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            let u = e.url.as_str();
            if !(u.starts_with("http://") || u.starts_with("https://")) || u.len() > 2048 {
                return Err(format!(
                    "endpoints[{i}].url: {u:?} is not an http:// or https:// URL"
                ));
            }
            if e.weight == 0 || e.weight > 1000 {
                return Err(format!(
                    "endpoints[{i}].weight: {} is outside 1..=1000",
                    e.weight
                ));
            }
            if self.endpoints[..i].iter().any(|o| o.url == e.url) {
                return Err(format!("endpoints[{i}].url: {u:?} is listed twice"));
            }
        }
        if self.max_in_flight == 0 {
            return Err("max_in_flight: must be at least 1".into());
        }
        Ok(())
    }
}

/// One engine KV-cache event, in vLLM's `KVEventBatch` vocabulary. Block
/// hashes are in the gateway's block scheme ([`crate::route::text_blocks`] of
/// [`prompt_text`]: 64-byte blocks of prompt text, each hash chained over the
/// prefix), not the engine's token-block hashes; other fields vLLM sends
/// (`parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium`) are
/// accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum KvEvent {
    BlockStored { block_hashes: Vec<u64> },
    BlockRemoved { block_hashes: Vec<u64> },
    AllBlocksCleared,
}

/// A batch of KV events from one engine of a pool
/// (`POST /v1/pools/{name}/kv-events`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEvents {
    /// The engine's URL as the pool lists it.
    pub endpoint: String,
    pub events: Vec<KvEvent>,
}

/// Most block hashes one batch may carry.
pub const MAX_KV_EVENT_BLOCKS: usize = 1 << 16;

/// The block hashes the gateway's prefix index uses for a request body (chat
/// messages or a completion prompt): what a KV-event adapter publishes.
pub fn request_blocks(body: &Value) -> Vec<u64> {
    text_blocks(&prompt_text(body))
}

/// An endpoint's live state.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointStatus {
    pub url: String,
    pub weight: u32,
    pub healthy: bool,
    /// Why it is out of rotation (absent while it is in).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_rotation: Option<String>,
    /// How its health is known: `metrics` (vLLM gauges), or `/metrics`, `/health`
    /// or `/v1/models` (an engine without vLLM's gauges, served on its health
    /// alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<&'static str>,
    pub outstanding: u32,
    pub waiting: u32,
    pub running: u32,
    pub kv_util: f64,
    pub failures: u64,
    /// Its cached prefixes come from its KV events (precise), not from
    /// routing history.
    pub precise_prefix: bool,
    /// Answered requests, time to first token and prefix-cache hit rate over the
    /// last [`STATS_WINDOW`] of them.
    pub requests: u64,
    pub ttft_ms: Option<Percentiles>,
    pub prefix_cache_hit_rate: Option<f64>,
}

/// Percentiles of a window of samples (nearest rank), and how many there were.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub samples: usize,
}

/// Nearest-rank percentiles of `samples`; `None` for none.
pub fn percentiles(samples: impl IntoIterator<Item = f64>) -> Option<Percentiles> {
    let mut v: Vec<f64> = samples.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Some(Percentiles {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        samples: v.len(),
    })
}

/// How many of the latest answered requests the pool's figures cover.
pub const STATS_WINDOW: usize = 1024;

/// The latest answered requests of a pool or an endpoint: time to first token and
/// prompt tokens (all, and those served from the prefix cache).
#[derive(Debug, Clone, Default)]
struct Window {
    ttft: VecDeque<f64>,
    tokens: VecDeque<(u64, u64)>,
    requests: u64,
}

impl Window {
    fn observe(&mut self, u: &Usage) {
        self.requests += 1;
        if self.ttft.len() == STATS_WINDOW {
            self.ttft.pop_front();
            self.tokens.pop_front();
        }
        self.ttft.push_back(u.ttft_ms);
        self.tokens
            .push_back((u.prompt_tokens, u.cached_tokens.min(u.prompt_tokens)));
    }

    fn ttft(&self) -> Option<Percentiles> {
        percentiles(self.ttft.iter().copied())
    }

    /// Prompt tokens served from the prefix cache, of all prompt tokens.
    fn hit_rate(&self) -> Option<f64> {
        let (all, cached) = self
            .tokens
            .iter()
            .fold((0u64, 0u64), |(a, c), (p, k)| (a + p, c + k));
        (all > 0).then(|| cached as f64 / all as f64)
    }
}

/// A pool's figures over its latest answered requests.
#[derive(Debug, Clone, Serialize)]
pub struct PoolStats {
    pub requests: u64,
    pub ttft_ms: Option<Percentiles>,
    pub prefix_cache_hit_rate: Option<f64>,
}

/// A pool's live state, with the scaling signal.
#[derive(Debug, Clone, Serialize)]
pub struct PoolStatus {
    pub spec: PoolSpec,
    pub endpoints: Vec<EndpointStatus>,
    pub queued: usize,
    pub in_flight: u32,
    /// Replicas recommended from queue length and utilisation
    /// (`scaling.replicas`).
    pub recommended_replicas: u32,
    /// The scaling signal with its inputs' verdicts.
    pub scaling: ScaleAdvice,
    /// Time to first token and prefix-cache hit rate of its latest requests.
    pub stats: PoolStats,
}

#[derive(Debug)]
struct Slot {
    url: String,
    weight: u32,
    load: EndpointLoad,
    /// Out of rotation until then (failure), or for good (removed).
    down_until: Option<Instant>,
    /// Why it was last taken out of rotation (kept while it is out).
    down_reason: Option<String>,
    /// How its health is known: `metrics` (vLLM gauges on `/metrics`), or the
    /// path it answered without them (`/metrics`, `/health`, `/v1/models`);
    /// `None` before the first probe.
    probe: Option<&'static str>,
    removed: bool,
    failures: u64,
    stats: Window,
}

#[derive(Debug)]
struct Ticket {
    id: u64,
    priority: i32,
    tx: oneshot::Sender<()>,
}

#[derive(Debug, Default)]
struct FairQueue {
    /// Per tenant, waiting tickets (FIFO within a tenant).
    by_tenant: BTreeMap<String, VecDeque<Ticket>>,
    /// Tenant served last (round-robin across tenants).
    last: Option<String>,
    len: usize,
}

impl FairQueue {
    fn push(&mut self, tenant: &str, t: Ticket) {
        self.by_tenant
            .entry(tenant.to_string())
            .or_default()
            .push_back(t);
        self.len += 1;
    }

    /// Next ticket: highest priority first; among equals, the next tenant after
    /// the one served last.
    fn pop(&mut self) -> Option<Ticket> {
        let top = self
            .by_tenant
            .values()
            .filter_map(|q| q.front().map(|t| t.priority))
            .max()?;
        let names: Vec<String> = self
            .by_tenant
            .iter()
            .filter(|(_, q)| q.front().is_some_and(|t| t.priority == top))
            .map(|(k, _)| k.clone())
            .collect();
        let next = match &self.last {
            Some(l) => names
                .iter()
                .find(|n| n.as_str() > l.as_str())
                .unwrap_or(&names[0])
                .clone(),
            None => names[0].clone(),
        };
        let q = self.by_tenant.get_mut(&next)?;
        let t = q.pop_front();
        if q.is_empty() {
            self.by_tenant.remove(&next);
        }
        self.len -= 1;
        self.last = Some(next);
        t
    }

    fn remove(&mut self, tenant: &str, id: u64) -> bool {
        let Some(q) = self.by_tenant.get_mut(tenant) else {
            return false;
        };
        let before = q.len();
        q.retain(|t| t.id != id);
        let gone = q.len() < before;
        if q.is_empty() {
            self.by_tenant.remove(tenant);
        }
        if gone {
            self.len -= 1;
        }
        gone
    }
}

#[derive(Debug)]
struct PoolInner {
    spec: PoolSpec,
    slots: Vec<Slot>,
    router: Router,
    queue: FairQueue,
    in_flight: u32,
    /// Requests admitted past the queue (granted) and not yet routed.
    granted: u32,
    stats: Window,
}

impl PoolInner {
    fn healthy(&self, s: &Slot, now: Instant) -> bool {
        !s.removed && s.down_until.is_none_or(|t| now >= t)
    }

    fn capacity(&self, now: Instant) -> u32 {
        self.slots
            .iter()
            .filter(|s| self.healthy(s, now))
            .map(|s| s.weight * self.spec.max_in_flight)
            .sum()
    }

    fn has_room(&self, now: Instant) -> bool {
        self.in_flight + self.granted < self.capacity(now)
    }

    fn scaling(&self, now: Instant) -> ScaleAdvice {
        let up = || self.slots.iter().filter(|s| self.healthy(s, now));
        recommend_replicas(&ScaleInput {
            replicas: up().map(|s| s.weight).sum(),
            in_flight: u64::from(self.in_flight),
            queued: self.queue.len as u64,
            engine_waiting: up().map(|s| u64::from(s.load.waiting)).sum(),
            per_replica: self.spec.max_in_flight,
            kv_used_permille: up()
                .map(|s| {
                    (s.load.kv_util.clamp(0.0, 1.0) * 1000.0).round() as u64 * u64::from(s.weight)
                })
                .sum(),
        })
    }

    fn apply_spec(&mut self, spec: PoolSpec) {
        // Endpoints keep their slot (and their cache index) by URL; removed ones
        // leave rotation and their index; new ones take a free slot.
        for (i, s) in self.slots.iter_mut().enumerate() {
            if !s.removed && !spec.endpoints.iter().any(|e| e.url == s.url) {
                s.removed = true;
                self.router.endpoint_reset(i);
            }
        }
        for e in &spec.endpoints {
            if let Some(s) = self.slots.iter_mut().find(|s| s.url == e.url) {
                s.weight = e.weight;
                s.removed = false;
                continue;
            }
            let slot = Slot {
                url: e.url.clone(),
                weight: e.weight,
                load: EndpointLoad::default(),
                down_until: None,
                down_reason: None,
                probe: None,
                removed: false,
                failures: 0,
                stats: Window::default(),
            };
            match self
                .slots
                .iter()
                .position(|s| s.removed && s.load.outstanding == 0)
            {
                Some(i) => {
                    self.router.endpoint_reset(i);
                    self.slots[i] = slot;
                }
                None => self.slots.push(slot),
            }
        }
        self.spec = spec;
    }

    fn release_and_grant(&mut self) {
        let now = Instant::now();
        while self.has_room(now) {
            let Some(t) = self.queue.pop() else {
                break;
            };
            if t.tx.send(()).is_ok() {
                self.granted += 1;
            }
        }
    }
}

/// A registered pool.
#[derive(Debug)]
struct Pool {
    inner: Mutex<PoolInner>,
}

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// How often engines' `/metrics` are read.
    pub scrape_period: Duration,
    /// How long a failed endpoint stays out of rotation before it is tried again.
    pub down_for: Duration,
    /// Attempts on other endpoints when one fails before the first byte.
    pub retries: usize,
    /// Connect and first-byte timeout towards engines.
    pub engine_timeout: Duration,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            scrape_period: Duration::from_millis(500),
            down_for: Duration::from_secs(10),
            retries: 2,
            engine_timeout: Duration::from_secs(30),
        }
    }
}

/// The gateway: pools, the engine client and the usage sink. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pools: Arc<RwLock<BTreeMap<String, Arc<Pool>>>>,
    sink: Arc<dyn UsageSink>,
    client: reqwest::Client,
    cfg: GatewayConfig,
    ids: Arc<AtomicU64>,
    /// When this gateway started (ms): request ids are unique across restarts,
    /// so metering (idempotent by request id) never drops a new call as a
    /// repeat of an old one.
    boot: u64,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
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

/// Counts an answered request in its pool's and endpoint's figures.
fn observe(pool: &Pool, slot: usize, u: &Usage) {
    if let Ok(mut g) = pool.inner.lock() {
        g.stats.observe(u);
        if let Some(s) = g.slots.get_mut(slot) {
            s.stats.observe(u);
        }
    }
}

/// Releases a request's place in the pool when dropped (stream end, error,
/// client gone).
struct InFlight {
    pool: Arc<Pool>,
    slot: usize,
    uncached: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut p) = self.pool.inner.lock() {
            p.in_flight = p.in_flight.saturating_sub(1);
            if let Some(s) = p.slots.get_mut(self.slot) {
                s.load.outstanding = s.load.outstanding.saturating_sub(1);
                s.load.pending_prefill = s.load.pending_prefill.saturating_sub(self.uncached);
            }
            p.release_and_grant();
        }
    }
}

/// The text a prompt's prefix is hashed over: chat messages (role and content)
/// in order, or the completion prompt.
fn prompt_text(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(ms) = v.get("messages").and_then(Value::as_array) {
        for m in ms {
            out.extend_from_slice(
                m.get("role")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .as_bytes(),
            );
            out.push(0);
            match m.get("content") {
                Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
                Some(other) => out.extend_from_slice(other.to_string().as_bytes()),
                None => {}
            }
            out.push(0);
        }
    } else if let Some(p) = v.get("prompt") {
        match p {
            Value::String(s) => out.extend_from_slice(s.as_bytes()),
            other => out.extend_from_slice(other.to_string().as_bytes()),
        }
    }
    out
}

/// Picks up an engine reply's id and token usage, in either of OpenAI's shapes:
/// chat, completions and embeddings (`prompt_tokens`, `completion_tokens`), and the
/// Responses API (`input_tokens`, `output_tokens`; in a stream, inside the
/// `response.completed` event's `response`). A reply in the Responses shape must
/// not meter as 0 tokens: budgets and prices are charged from these figures.
fn usage_of(v: &Value, u: &mut Usage) {
    let id = v
        .get("id")
        .or_else(|| v.pointer("/response/id"))
        .and_then(Value::as_str);
    if let Some(id) = id {
        if u.response_id.is_empty() && id.len() <= 256 {
            u.response_id = id.to_string();
        }
    }
    let Some(x) = v
        .get("usage")
        .or_else(|| v.pointer("/response/usage"))
        .filter(|x| x.is_object())
    else {
        return;
    };
    let n = |p: &str| x.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    u.prompt_tokens = n("/prompt_tokens").max(n("/input_tokens"));
    u.completion_tokens = n("/completion_tokens").max(n("/output_tokens"));
    u.cached_tokens =
        n("/prompt_tokens_details/cached_tokens").max(n("/input_tokens_details/cached_tokens"));
    u.reasoning_tokens = n("/completion_tokens_details/reasoning_tokens")
        .max(n("/output_tokens_details/reasoning_tokens"));
}

/// Parses a Prometheus text page for vLLM's gauges: (waiting, running, KV use).
pub fn parse_vllm_metrics(text: &str) -> (Option<u32>, Option<u32>, Option<f64>) {
    let mut w = None;
    let mut r = None;
    let mut kv = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap_or("");
        let val = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        let Some(val) = val else { continue };
        match name {
            "vllm:num_requests_waiting" => *w.get_or_insert(0) += val as u32,
            "vllm:num_requests_running" => *r.get_or_insert(0) += val as u32,
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => {
                kv = Some(kv.map_or(val, |k: f64| k.max(val)));
            }
            _ => {}
        }
    }
    (w, r, kv)
}

impl Gateway {
    pub fn new(sink: Arc<dyn UsageSink>, cfg: GatewayConfig) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(cfg.engine_timeout)
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        Gateway {
            pools: Arc::default(),
            sink,
            client,
            cfg,
            ids: Arc::new(AtomicU64::new(1)),
            boot: now_ms(),
        }
    }

    /// Registers a pool, or updates one in place (endpoints keep their state).
    pub fn upsert_pool(&self, spec: PoolSpec) -> Result<bool, String> {
        spec.validate()?;
        let mut pools = self.pools.write().map_err(|_| "gateway state poisoned")?;
        if let Some(p) = pools.get(&spec.name) {
            let mut g = p.inner.lock().map_err(|_| "pool state poisoned")?;
            g.apply_spec(spec);
            g.release_and_grant();
            return Ok(false);
        }
        if let Some(o) = pools.values().find(|p| {
            p.inner
                .lock()
                .map(|g| g.spec.model == spec.model)
                .unwrap_or(false)
        }) {
            let name = o
                .inner
                .lock()
                .map(|g| g.spec.name.clone())
                .unwrap_or_default();
            return Err(format!(
                "model: {:?} is already served by pool {name:?}; update that pool instead",
                spec.model
            ));
        }
        let mut inner = PoolInner {
            spec: spec.clone(),
            slots: Vec::new(),
            router: Router::new(Policy::Tessera),
            queue: FairQueue::default(),
            in_flight: 0,
            granted: 0,
            stats: Window::default(),
        };
        inner.apply_spec(spec.clone());
        pools.insert(
            spec.name.clone(),
            Arc::new(Pool {
                inner: Mutex::new(inner),
            }),
        );
        Ok(true)
    }

    pub fn remove_pool(&self, name: &str) -> bool {
        self.pools
            .write()
            .map(|mut p| p.remove(name).is_some())
            .unwrap_or(false)
    }

    pub fn pool_status(&self, name: &str) -> Option<PoolStatus> {
        let p = self.pools.read().ok()?.get(name).cloned()?;
        let g = p.inner.lock().ok()?;
        let now = Instant::now();
        Some(PoolStatus {
            spec: g.spec.clone(),
            endpoints: g
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.removed)
                .map(|(i, s)| EndpointStatus {
                    precise_prefix: i < MAX_ENDPOINTS && g.router.events_from & (1 << i) != 0,
                    url: s.url.clone(),
                    weight: s.weight,
                    healthy: g.healthy(s, now),
                    out_of_rotation: (!g.healthy(s, now))
                        .then(|| s.down_reason.clone().unwrap_or_else(|| "down".into())),
                    probe: s.probe,
                    outstanding: s.load.outstanding,
                    waiting: s.load.waiting,
                    running: s.load.running,
                    kv_util: s.load.kv_util,
                    failures: s.failures,
                    requests: s.stats.requests,
                    ttft_ms: s.stats.ttft(),
                    prefix_cache_hit_rate: s.stats.hit_rate(),
                })
                .collect(),
            queued: g.queue.len,
            in_flight: g.in_flight,
            recommended_replicas: g.scaling(now).replicas,
            scaling: g.scaling(now),
            stats: PoolStats {
                requests: g.stats.requests,
                ttft_ms: g.stats.ttft(),
                prefix_cache_hit_rate: g.stats.hit_rate(),
            },
        })
    }

    pub fn pools(&self) -> Vec<PoolStatus> {
        let names: Vec<String> = self
            .pools
            .read()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        names.iter().filter_map(|n| self.pool_status(n)).collect()
    }

    /// The pools' gauges in Prometheus text format (appended to the server's
    /// `/metrics`): the scaling signal, queue, in-flight requests, engines in
    /// rotation, and per engine its load and KV-cache use.
    pub fn prometheus(&self) -> String {
        use std::fmt::Write;
        let pools = self.pools();
        let mut s = String::new();
        let gauges: [Gauge; 5] = [
            (
                "tessera_gateway_pool_recommended_replicas",
                "Replicas recommended for the pool from queue length and utilisation.",
                |p| f64::from(p.scaling.replicas),
            ),
            (
                "tessera_gateway_pool_replicas_up",
                "Engines in rotation (weighted).",
                |p| {
                    p.endpoints
                        .iter()
                        .filter(|e| e.healthy)
                        .map(|e| f64::from(e.weight))
                        .sum()
                },
            ),
            (
                "tessera_gateway_pool_queued_requests",
                "Requests waiting at the gateway.",
                |p| p.queued as f64,
            ),
            (
                "tessera_gateway_pool_in_flight_requests",
                "Requests sent to engines and not finished.",
                |p| f64::from(p.in_flight),
            ),
            (
                "tessera_gateway_pool_engine_waiting_requests",
                "Requests waiting inside the engines (scraped).",
                |p| p.scaling.waiting.saturating_sub(p.queued as u64) as f64,
            ),
        ];
        for (name, help, f) in gauges {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge");
            for p in &pools {
                let _ = writeln!(
                    s,
                    "{name}{{pool=\"{}\",model=\"{}\"}} {}",
                    p.spec.name,
                    p.spec.model,
                    f(p)
                );
            }
        }
        let _ = writeln!(
            s,
            "# HELP tessera_gateway_endpoint_kv_cache_usage KV-cache use of an engine, 0..1 (scraped).\n# TYPE tessera_gateway_endpoint_kv_cache_usage gauge"
        );
        for p in &pools {
            for e in &p.endpoints {
                let _ = writeln!(
                    s,
                    "tessera_gateway_endpoint_kv_cache_usage{{pool=\"{}\",endpoint=\"{}\"}} {}",
                    p.spec.name,
                    label(&e.url),
                    e.kv_util
                );
            }
        }
        s
    }

    /// Applies a batch of engine KV events to a pool's precise prefix index:
    /// from then on, routing reads that engine's cached prefixes from its
    /// events instead of from routing history. Returns the blocks applied.
    pub fn kv_events(&self, pool: &str, batch: &KvEvents) -> Result<usize, String> {
        let n: usize = batch
            .events
            .iter()
            .map(|e| match e {
                KvEvent::BlockStored { block_hashes } | KvEvent::BlockRemoved { block_hashes } => {
                    block_hashes.len()
                }
                KvEvent::AllBlocksCleared => 0,
            })
            .sum();
        if n > MAX_KV_EVENT_BLOCKS {
            return Err(format!(
                "events: {n} block hashes in one batch; send at most {MAX_KV_EVENT_BLOCKS} per batch"
            ));
        }
        let p = self
            .pools
            .read()
            .map_err(|_| "gateway state poisoned".to_string())?
            .get(pool)
            .cloned()
            .ok_or_else(|| format!("no pool {pool:?}"))?;
        let mut g = p.inner.lock().map_err(|_| "pool state poisoned")?;
        let Some(ep) = g
            .slots
            .iter()
            .position(|s| !s.removed && s.url == batch.endpoint)
        else {
            return Err(format!(
                "endpoint: {:?} is not an engine of pool {pool:?}; use its url as the pool lists it",
                batch.endpoint
            ));
        };
        for e in &batch.events {
            match e {
                KvEvent::BlockStored { block_hashes } => g.router.kv_stored(ep, block_hashes),
                KvEvent::BlockRemoved { block_hashes } => g.router.kv_removed(ep, block_hashes),
                KvEvent::AllBlocksCleared => g.router.kv_cleared(ep),
            }
        }
        Ok(n)
    }

    /// `GET /v1/models`.
    pub fn models(&self) -> Response {
        let data: Vec<Value> = self
            .pools()
            .into_iter()
            .map(|p| json!({"id": p.spec.model, "object": "model", "created": 0, "owned_by": "tessera", "pool": p.spec.name}))
            .collect();
        axum::Json(json!({"object": "list", "data": data})).into_response()
    }

    /// One model a pool serves, in OpenAI's shape (`models.retrieve`).
    pub fn model(&self, id: &str) -> Option<Value> {
        let p = self.pool_for_model(id)?;
        let name = p.inner.lock().ok()?.spec.name.clone();
        Some(
            json!({"id": id, "object": "model", "created": 0, "owned_by": "tessera", "pool": name}),
        )
    }

    /// The redaction setting of the pool serving `model` (the default when none does).
    pub fn redact_mode(&self, model: &str) -> Redact {
        self.pool_for_model(model)
            .and_then(|p| p.inner.lock().ok().map(|g| g.spec.redact))
            .unwrap_or_default()
    }

    fn pool_for_model(&self, model: &str) -> Option<Arc<Pool>> {
        let pools = self.pools.read().ok()?;
        pools
            .values()
            .find(|p| {
                p.inner
                    .lock()
                    .map(|g| g.spec.model == model)
                    .unwrap_or(false)
            })
            .cloned()
    }

    /// Reads every endpoint's `/metrics` once (vLLM gauges) and marks endpoints
    /// that answer as healthy again.
    pub async fn scrape_once(&self) {
        let pools: Vec<Arc<Pool>> = self
            .pools
            .read()
            .map(|p| p.values().cloned().collect())
            .unwrap_or_default();
        for p in pools {
            let urls: Vec<(usize, String)> = match p.inner.lock() {
                Ok(g) => g
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.removed)
                    .map(|(i, s)| (i, s.url.clone()))
                    .collect(),
                Err(_) => continue,
            };
            for (i, url) in urls {
                let probed = self.probe(&url).await;
                let Ok(mut g) = p.inner.lock() else { continue };
                let pool_name = g.spec.name.clone();
                let Some(s) = g.slots.get_mut(i) else {
                    continue;
                };
                if s.url != url {
                    continue;
                }
                match probed {
                    Ok((path, text)) => {
                        let (w, r, kv) =
                            text.as_deref().map(parse_vllm_metrics).unwrap_or_default();
                        s.load.waiting = w.unwrap_or(0);
                        s.load.running = r.unwrap_or(0);
                        s.load.kv_util = kv.unwrap_or(0.0);
                        s.probe = Some(path);
                        if s.down_until.is_some_and(|t| Instant::now() >= t) {
                            s.down_until = None;
                            s.down_reason = None;
                        }
                    }
                    Err(why) => {
                        // No answer: keep it out of rotation until it answers.
                        if s.down_until.is_none() {
                            eprintln!(
                                "gateway: pool {pool_name:?}: endpoint {url} out of rotation: {why}"
                            );
                        }
                        s.down_until = Some(Instant::now() + self.cfg.down_for);
                        s.down_reason = Some(why);
                    }
                }
                g.release_and_grant();
            }
        }
    }

    /// Asks an engine how it is: its vLLM gauges on `/metrics` when it has them,
    /// else a plain health check (`/health`, as vLLM, TGI and llama.cpp serve it,
    /// then OpenAI's `/v1/models`), so that an engine without vLLM's metrics is
    /// served on its health alone (its load then counts only the requests this
    /// gateway has sent it). Returns the path that answered and the gauges' text,
    /// or why none answered.
    async fn probe(&self, url: &str) -> Result<(&'static str, Option<String>), String> {
        let get = |path: &'static str| {
            self.client
                .get(format!("{url}{path}"))
                .timeout(Duration::from_secs(2))
                .send()
        };
        let mut why = Vec::new();
        match get("/metrics").await {
            // It answers: it is up, with vLLM's gauges or without.
            Ok(r) if r.status().is_success() => {
                let t = r.text().await.unwrap_or_default();
                return Ok(if t.contains("vllm:") {
                    ("metrics", Some(t))
                } else {
                    ("/metrics", None)
                });
            }
            Ok(r) => why.push(format!("/metrics answered {}", r.status().as_u16())),
            Err(e) => return Err(format!("no answer from {url}: {e}")),
        }
        for path in ["/health", "/v1/models"] {
            match get(path).await {
                Ok(r) if r.status().is_success() => return Ok((path, None)),
                Ok(r) => why.push(format!("{path} answered {}", r.status().as_u16())),
                Err(e) => why.push(format!("{path}: {e}")),
            }
        }
        Err(format!("not healthy: {}", why.join(", ")))
    }

    /// Scrapes engines every `scrape_period` until `stop` turns true.
    pub async fn run_scraper(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            self.scrape_once().await;
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.scrape_period) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// `POST /v1/chat/completions` (`path` = `/v1/chat/completions`) and
    /// `POST /v1/completions`.
    pub async fn forward(&self, who: Caller, path: &'static str, body: Bytes) -> Response {
        let t0 = Instant::now();
        let started_ms = now_ms();
        let mut v: Value = match serde_json::from_slice(&body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return openai_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "the body must be a JSON object",
                );
            }
            Err(e) => {
                return openai_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    format!("the body is not valid JSON: {e}"),
                );
            }
        };
        let Some(model) = v.get("model").and_then(Value::as_str).map(str::to_string) else {
            return openai_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "model: missing; name a model from GET /v1/models",
            );
        };
        let Some(pool) = self.pool_for_model(&model) else {
            return openai_error(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("model {model:?} is served by no pool; see GET /v1/models"),
            );
        };
        if let Err(r) = self.sink.check(&who).await {
            return match r {
                Refusal::Budget(why) => openai_error(
                    StatusCode::PAYMENT_REQUIRED,
                    "budget_exceeded",
                    format!("budget exceeded: {why}"),
                ),
                Refusal::Quota(why) => too_many(format!("quota exceeded: {why}"), 60),
            };
        }
        let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let client_wants_usage = v
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if stream {
            // Usage is metered from the stream's last chunk; ask for it.
            v["stream_options"] = json!({"include_usage": true});
        }
        let text = prompt_text(&v);
        let blocks = text_blocks(&text);
        let prompt_tokens = (text.len() / 4) as u32;
        // Admission: room now, or a place in the fair queue.
        let mut queued_ticket = None;
        {
            let Ok(mut g) = pool.inner.lock() else {
                return openai_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "pool state poisoned",
                );
            };
            let now = Instant::now();
            if g.capacity(now) == 0 {
                return openai_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("pool {:?} has no healthy endpoint", g.spec.name),
                );
            }
            if g.queue.len == 0 && g.has_room(now) {
                g.granted += 1;
            } else if g.queue.len >= g.spec.max_queue {
                let cap = g.capacity(now).max(1) as u64;
                let wait = (g.queue.len as u64).div_ceil(cap).max(1);
                return too_many(
                    format!(
                        "pool {:?} is saturated: {} requests in flight, {} waiting at the gateway",
                        g.spec.name, g.in_flight, g.queue.len
                    ),
                    wait,
                );
            } else {
                let (tx, rx) = oneshot::channel();
                let id = self.ids.fetch_add(1, Ordering::Relaxed);
                g.queue.push(
                    &who.tenant,
                    Ticket {
                        id,
                        priority: who.priority,
                        tx,
                    },
                );
                queued_ticket = Some((id, rx, Duration::from_millis(g.spec.queue_timeout_ms)));
            }
        }
        if let Some((id, rx, timeout)) = queued_ticket {
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(())) => {}
                _ => {
                    let still_queued = pool
                        .inner
                        .lock()
                        .map(|mut g| g.queue.remove(&who.tenant, id))
                        .unwrap_or(true);
                    if still_queued {
                        return too_many(
                            format!(
                                "waited {} ms at the gateway for room in the pool",
                                timeout.as_millis()
                            ),
                            2,
                        );
                    }
                    // Granted as the wait ended: go on.
                }
            }
        }
        let body = match serde_json::to_vec(&v) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                return openai_error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string());
            }
        };
        let mut tried: u64 = 0;
        let mut last_err = String::new();
        // Time spent waiting on engines (excluded from the gateway's overhead).
        let mut engine_wait = Duration::ZERO;
        let mut granted = true;
        for _attempt in 0..=self.cfg.retries {
            // Route.
            let (slot, url, uncached, pool_name) = {
                let Ok(mut g) = pool.inner.lock() else {
                    break;
                };
                if granted {
                    g.granted = g.granted.saturating_sub(1);
                    granted = false;
                }
                let now = Instant::now();
                let limit = g.spec.max_in_flight;
                let loads: Vec<EndpointLoad> = g
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let mut l = s.load.clone();
                        l.weight = s.weight;
                        l.healthy = g.healthy(s, now) && tried & (1 << i) == 0;
                        l
                    })
                    .collect();
                // Prefer endpoints below their limit; all are over: least bad.
                let mut under = loads.clone();
                for (l, s) in under.iter_mut().zip(&g.slots) {
                    if l.outstanding >= s.weight * limit {
                        l.healthy = false;
                    }
                }
                let rr = RouteRequest {
                    tenant: &who.tenant,
                    session: who.session.as_deref(),
                    blocks: &blocks,
                    block_tokens: 16,
                    prompt_tokens,
                    now_ms: now_ms(),
                };
                let d = g
                    .router
                    .pick(&rr, &under)
                    .or_else(|| g.router.pick(&rr, &loads));
                let Some(d) = d else {
                    g.release_and_grant();
                    break;
                };
                g.router.routed(&rr, &d);
                g.in_flight += 1;
                let s = &mut g.slots[d.endpoint];
                s.load.outstanding += 1;
                s.load.pending_prefill += d.uncached_tokens;
                (
                    d.endpoint,
                    s.url.clone(),
                    d.uncached_tokens,
                    g.spec.name.clone(),
                )
            };
            tried |= 1 << slot;
            let guard = InFlight {
                pool: pool.clone(),
                slot,
                uncached,
            };
            let mut req = self
                .client
                .post(format!("{url}{path}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let Some(tp) = &who.traceparent {
                req = req.header("traceparent", tp);
            }
            let sent = Instant::now();
            let resp = tokio::time::timeout(self.cfg.engine_timeout, req.send()).await;
            let resp = match resp {
                Ok(Ok(r)) if !r.status().is_server_error() => r,
                Ok(Ok(r)) => {
                    engine_wait += sent.elapsed();
                    last_err = format!("{url} answered {}", r.status());
                    self.mark_down(&pool, slot, &url, &last_err);
                    continue;
                }
                Ok(Err(e)) => {
                    engine_wait += sent.elapsed();
                    last_err = format!("{url}: {e}");
                    self.mark_down(&pool, slot, &url, &last_err);
                    continue;
                }
                Err(_) => {
                    engine_wait += sent.elapsed();
                    last_err = format!("{url}: no answer in {:?}", self.cfg.engine_timeout);
                    self.mark_down(&pool, slot, &url, &last_err);
                    continue;
                }
            };
            let status = resp.status();
            let mut usage = Usage {
                pool: pool_name,
                model: model.clone(),
                request_id: format!(
                    "gw-{:x}-{}",
                    self.boot,
                    self.ids.fetch_add(1, Ordering::Relaxed)
                ),
                endpoint: url.clone(),
                started_ms,
                ..Usage::default()
            };
            if !stream || !status.is_success() {
                let bytes = match resp.bytes().await {
                    Ok(b) => b,
                    Err(e) => {
                        engine_wait += sent.elapsed();
                        last_err = format!("{url}: {e}");
                        self.mark_down(&pool, slot, &url, &last_err);
                        continue;
                    }
                };
                engine_wait += sent.elapsed();
                drop(guard);
                if status.is_success() {
                    if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                        usage_of(&v, &mut usage);
                    }
                }
                let mut r = Response::new(Body::from(bytes));
                *r.status_mut() =
                    StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                // The reply leaves now; metering (a store write) must not hold it.
                usage.ttft_ms = ms(t0);
                usage.total_ms = usage.ttft_ms;
                usage.overhead_us = overhead_us(t0, engine_wait);
                if status.is_success() {
                    observe(&pool, slot, &usage);
                    let sink = self.sink.clone();
                    tokio::spawn(async move { sink.record(&who, usage).await });
                }
                return r;
            }
            // Streaming: pass chunks through as they come; meter from the usage
            // chunk; an engine that dies mid-stream ends the stream with an
            // error event and leaves rotation.
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
            let gw = self.clone();
            let pool2 = pool.clone();
            let who2 = who.clone();
            tokio::spawn(async move {
                let _guard = guard;
                let mut resp = resp;
                let mut line = Vec::new();
                // Nothing forwarded yet: the engine's time runs until the chunk
                // that completes the first line to forward.
                let mut first = true;
                let mut failed = None;
                loop {
                    match resp.chunk().await {
                        Ok(Some(c)) => {
                            let engine_time = sent.elapsed();
                            let mut out = Vec::with_capacity(c.len());
                            for &b in c.iter() {
                                line.push(b);
                                if b == b'\n' {
                                    let keep = scan_sse_line(&line, &mut usage, client_wants_usage);
                                    if keep {
                                        out.extend_from_slice(&line);
                                    }
                                    line.clear();
                                }
                            }
                            if out.is_empty() {
                                continue;
                            }
                            if tx.send(Ok(Bytes::from(out))).await.is_err() {
                                break; // client gone
                            }
                            if first {
                                first = false;
                                usage.ttft_ms = ms(t0);
                                usage.overhead_us = overhead_us(t0, engine_wait + engine_time);
                            }
                        }
                        Ok(None) => {
                            if !line.is_empty() {
                                let _ = tx.send(Ok(Bytes::from(std::mem::take(&mut line)))).await;
                            }
                            break;
                        }
                        Err(e) => {
                            failed = Some(e.to_string());
                            break;
                        }
                    }
                }
                let failed_stream = failed.clone();
                if let Some(e) = failed {
                    gw.mark_down(&pool2, slot, &url, &format!("the stream broke: {e}"));
                    let ev = json!({"error": {"message": format!("the engine {url} failed mid-stream: {e}"), "type": "engine_failed", "code": "engine_failed"}});
                    let _ = tx.send(Ok(Bytes::from(format!("data: {ev}\n\n")))).await;
                }
                usage.total_ms = ms(t0);
                if failed_stream.is_none() {
                    observe(&pool2, slot, &usage);
                }
                gw.sink.record(&who2, usage).await;
            });
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|x| (x, rx))
            });
            let mut r = Response::new(Body::from_stream(stream));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            return r;
        }
        if granted {
            if let Ok(mut g) = pool.inner.lock() {
                g.granted = g.granted.saturating_sub(1);
                g.release_and_grant();
            }
        }
        openai_error(
            StatusCode::BAD_GATEWAY,
            "engine_failed",
            format!("no endpoint of the pool answered: {last_err}"),
        )
    }

    fn mark_down(&self, pool: &Pool, slot: usize, url: &str, why: &str) {
        if let Ok(mut g) = pool.inner.lock() {
            let pool_name = g.spec.name.clone();
            if let Some(s) = g.slots.get_mut(slot) {
                if s.url == url {
                    if s.down_until.is_none() {
                        eprintln!(
                            "gateway: pool {pool_name:?}: endpoint {url} out of rotation: a request failed: {why}"
                        );
                    }
                    s.down_until = Some(Instant::now() + self.cfg.down_for);
                    s.down_reason = Some(format!("a request failed: {why}"));
                    s.failures += 1;
                }
            }
            // Its cache is presumably gone with it.
            g.router.endpoint_reset(slot);
        }
    }
}

/// One SSE line from the engine: picks up usage; drops the usage-only chunk
/// when the client did not ask for it. Returns whether to forward the line.
fn scan_sse_line(line: &[u8], usage: &mut Usage, client_wants_usage: bool) -> bool {
    let Some(rest) = line.strip_prefix(b"data:") else {
        return true;
    };
    let rest = rest.trim_ascii();
    if rest.is_empty() || rest == b"[DONE]" || !rest.windows(7).any(|w| w == b"\"usage\"") {
        return true;
    }
    let Ok(v) = serde_json::from_slice::<Value>(rest) else {
        return true;
    };
    usage_of(&v, usage);
    let usage_only = v
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(|c| c.is_empty());
    client_wants_usage || !usage_only
}

/// A pool gauge: name, help, value.
type Gauge = (&'static str, &'static str, fn(&PoolStatus) -> f64);

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Request in to now, less the time spent waiting on engines, in µs.
fn overhead_us(t0: Instant, engine_wait: Duration) -> u64 {
    t0.elapsed().saturating_sub(engine_wait).as_micros() as u64
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn usage_is_read_in_the_chat_and_the_responses_shapes() {
        let mut u = Usage::default();
        usage_of(
            &serde_json::json!({"id": "chatcmpl-1", "usage": {"prompt_tokens": 10, "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 4}}}),
            &mut u,
        );
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cached_tokens),
            (10, 3, 4)
        );
        assert_eq!(u.response_id, "chatcmpl-1");
        // The Responses API, answered whole.
        let mut u = Usage::default();
        usage_of(
            &serde_json::json!({"id": "resp_1", "object": "response", "usage": {"input_tokens": 20,
                "input_tokens_details": {"cached_tokens": 8}, "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 25}}),
            &mut u,
        );
        assert_eq!(
            (
                u.prompt_tokens,
                u.completion_tokens,
                u.cached_tokens,
                u.reasoning_tokens
            ),
            (20, 5, 8, 2)
        );
        assert_eq!(u.response_id, "resp_1");
        // And streamed: the usage comes in the `response.completed` event.
        let mut u = Usage::default();
        let line = br#"data: {"type": "response.completed", "response": {"id": "resp_2", "usage": {"input_tokens": 7, "output_tokens": 9}}}"#;
        assert!(scan_sse_line(line, &mut u, false), "the event is forwarded");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (7, 9));
        assert_eq!(u.response_id, "resp_2");
    }

    use super::*;

    #[test]
    fn percentiles_by_nearest_rank_and_a_sliding_window() {
        assert_eq!(percentiles([]), None);
        let p = percentiles((1..=100).map(f64::from)).unwrap();
        assert_eq!((p.p50, p.p90, p.p99, p.samples), (50.0, 90.0, 99.0, 100));
        let p = percentiles([7.0]).unwrap();
        assert_eq!((p.p50, p.p99), (7.0, 7.0));
        let mut w = Window::default();
        assert_eq!(w.hit_rate(), None);
        for i in 0..(STATS_WINDOW + 10) {
            w.observe(&Usage {
                ttft_ms: i as f64,
                prompt_tokens: 100,
                cached_tokens: if i % 4 == 0 { 100 } else { 0 },
                ..Usage::default()
            });
        }
        // The oldest ten left the window; every request is counted.
        assert_eq!(w.requests, (STATS_WINDOW + 10) as u64);
        assert_eq!(w.ttft().unwrap().samples, STATS_WINDOW);
        assert_eq!(w.ttft.front(), Some(&10.0));
        assert!((w.hit_rate().unwrap() - 0.25).abs() < 0.01);
    }

    #[test]
    fn vllm_metrics_parse() {
        let t = "# HELP x\nvllm:num_requests_waiting{model_name=\"m\"} 3.0\nvllm:num_requests_running{model_name=\"m\"} 5\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n";
        assert_eq!(parse_vllm_metrics(t), (Some(3), Some(5), Some(0.25)));
    }

    #[test]
    fn fair_queue_alternates_tenants_and_honours_priority() {
        let mut q = FairQueue::default();
        let mut rxs = Vec::new();
        for (i, (t, p)) in [("a", 0), ("a", 0), ("a", 0), ("b", 0), ("c", 5)]
            .iter()
            .enumerate()
        {
            let (tx, rx) = oneshot::channel();
            rxs.push(rx);
            q.push(
                t,
                Ticket {
                    id: i as u64,
                    priority: *p,
                    tx,
                },
            );
        }
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|t| t.id)).collect();
        assert_eq!(order, vec![4, 0, 3, 1, 2]);
        assert_eq!(q.len, 0);
    }

    #[test]
    fn pool_spec_errors_name_the_field() {
        let mut p = PoolSpec {
            name: "p".into(),
            model: "m".into(),
            endpoints: vec![EndpointSpec {
                url: "ftp://x".into(),
                weight: 1,
            }],
            max_in_flight: 4,
            max_queue: 4,
            queue_timeout_ms: 10,
            redact: Redact::default(),
        };
        assert!(p.validate().unwrap_err().starts_with("endpoints[0].url"));
        p.endpoints[0].url = "http://x".into();
        assert!(p.validate().is_ok());
        p.endpoints.push(p.endpoints[0].clone());
        assert!(p.validate().unwrap_err().contains("twice"));
    }
}
