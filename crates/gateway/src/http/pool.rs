//! Pools: their specs, endpoints and live state, the in-flight guard, and
//! engine KV events.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::route::{
    EndpointLoad, MAX_ENDPOINTS, Policy, Router, ScaleAdvice, ScaleInput, recommend_replicas,
};

use super::InferenceGateway;
use super::metrics::{Percentiles, Window};
use super::queue::FairQueue;

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
/// [`prompt_text`](super::forward::prompt_text): 64-byte blocks of prompt text, each hash chained over the
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
    /// last [`STATS_WINDOW`](super::STATS_WINDOW) of them.
    pub requests: u64,
    pub ttft_ms: Option<Percentiles>,
    pub prefix_cache_hit_rate: Option<f64>,
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
pub(super) struct Slot {
    pub(super) url: String,
    pub(super) weight: u32,
    pub(super) load: EndpointLoad,
    /// Out of rotation until then (failure), or for good (removed).
    pub(super) down_until: Option<Instant>,
    /// Why it was last taken out of rotation (kept while it is out).
    pub(super) down_reason: Option<String>,
    /// How its health is known: `metrics` (vLLM gauges on `/metrics`), or the
    /// path it answered without them (`/metrics`, `/health`, `/v1/models`);
    /// `None` before the first probe.
    pub(super) probe: Option<&'static str>,
    pub(super) removed: bool,
    failures: u64,
    pub(super) stats: Window,
}

#[derive(Debug)]
pub(super) struct PoolInner {
    pub(super) spec: PoolSpec,
    pub(super) slots: Vec<Slot>,
    pub(super) router: Router,
    pub(super) queue: FairQueue,
    pub(super) in_flight: u32,
    /// Requests admitted past the queue (granted) and not yet routed.
    pub(super) granted: u32,
    pub(super) stats: Window,
}

impl PoolInner {
    pub(super) fn healthy(&self, s: &Slot, now: Instant) -> bool {
        !s.removed && s.down_until.is_none_or(|t| now >= t)
    }

    pub(super) fn capacity(&self, now: Instant) -> u32 {
        self.slots
            .iter()
            .filter(|s| self.healthy(s, now))
            .map(|s| s.weight * self.spec.max_in_flight)
            .sum()
    }

    pub(super) fn has_room(&self, now: Instant) -> bool {
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

    pub(super) fn release_and_grant(&mut self) {
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
pub(super) struct Pool {
    pub(super) inner: Mutex<PoolInner>,
}

/// Releases a request's place in the pool when dropped (stream end, error,
/// client gone).
pub(super) struct InFlight {
    pub(super) pool: Arc<Pool>,
    pub(super) slot: usize,
    pub(super) uncached: u64,
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

impl InferenceGateway {
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

    pub(super) fn pool_for_model(&self, model: &str) -> Option<Arc<Pool>> {
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

    pub(super) fn mark_down(&self, pool: &Pool, slot: usize, url: &str, why: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
