//! Routing decisions, pure: no I/O, no clock, no randomness (time and load are
//! inputs). The gateway and the routing simulator (`tessera sim routing`) run the
//! same code, so what the simulator measures is what the gateway does.
//!
//! A prompt is a chain of fixed-size token blocks; block `k`'s hash covers the
//! whole prefix up to and including block `k` (as vLLM's prefix cache does), so a
//! set of block hashes per endpoint *is* a radix tree over blocks, flattened: the
//! longest cached prefix is the first block whose hash the endpoint lacks.
//!
//! Routers:
//! - [`Policy::RoundRobin`], [`Policy::LeastLoad`]: baselines.
//! - [`Policy::CacheAware`]: SGLang's cache-aware router (an approximate tree per
//!   worker from routing history; below a load imbalance it sends a request to
//!   the worker with the longest match when the match rate exceeds a threshold,
//!   else to the worker with the smallest tree; above the imbalance, to the least
//!   loaded worker).
//! - [`Policy::WeightedScorer`]: llm-d's inference scheduler (a weighted sum of a
//!   precise prefix scorer fed by engine KV events, a queue scorer and a KV-cache
//!   utilisation scorer, each normalised to 0..1; weights 3, 2, 2).
//! - [`Policy::Tessera`]: ours, see [`TesseraParams`].

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

/// A block's chained hash.
pub type BlockHash = u64;

/// Most endpoints one pool may have (endpoint sets are 64-bit masks).
pub const MAX_ENDPOINTS: usize = 64;

/// 64-bit mixing (splitmix64's finaliser): stable across runs and platforms.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// FNV-1a over bytes, then mixed: a stable string hash.
pub fn hash_bytes(seed: u64, b: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &c in b {
        h ^= u64::from(c);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(h)
}

/// The chained hash of the next block after `parent`.
pub fn chain(parent: BlockHash, content: u64) -> BlockHash {
    mix(parent ^ mix(content))
}

/// Bytes of prompt text per block when the gateway has no tokenizer: about 4
/// bytes per token and 16 tokens per block.
pub const TEXT_BLOCK_BYTES: usize = 64;

/// Block hashes of a prompt text (full blocks only), for the gateway's
/// approximate prefix index.
pub fn text_blocks(text: &[u8]) -> Vec<BlockHash> {
    let mut out = Vec::with_capacity(text.len() / TEXT_BLOCK_BYTES);
    let mut parent = 0u64;
    for chunk in text.chunks_exact(TEXT_BLOCK_BYTES) {
        parent = chain(parent, hash_bytes(0, chunk));
        out.push(parent);
    }
    out
}

/// Which endpoints hold which blocks. Exact when fed by engine KV events
/// ([`PrefixIndex::stored`] / [`PrefixIndex::removed`]), approximate when fed
/// from routing history ([`ApproxIndex`]).
#[derive(Debug, Default, Clone)]
pub struct PrefixIndex {
    map: HashMap<BlockHash, u64>,
    counts: Vec<u64>,
}

impl PrefixIndex {
    pub fn stored(&mut self, ep: usize, blocks: &[BlockHash]) {
        if ep >= MAX_ENDPOINTS {
            return;
        }
        if self.counts.len() <= ep {
            self.counts.resize(ep + 1, 0);
        }
        for b in blocks {
            let m = self.map.entry(*b).or_insert(0);
            if *m & (1 << ep) == 0 {
                *m |= 1 << ep;
                self.counts[ep] += 1;
            }
        }
    }

    pub fn removed(&mut self, ep: usize, blocks: &[BlockHash]) {
        if ep >= MAX_ENDPOINTS {
            return;
        }
        for b in blocks {
            if let Some(m) = self.map.get_mut(b) {
                if *m & (1 << ep) != 0 {
                    *m &= !(1 << ep);
                    self.counts[ep] -= 1;
                    if *m == 0 {
                        self.map.remove(b);
                    }
                }
            }
        }
    }

    /// An endpoint dropped its whole cache (restart, `AllBlocksCleared`).
    pub fn cleared(&mut self, ep: usize) {
        if ep >= MAX_ENDPOINTS {
            return;
        }
        self.map.retain(|_, m| {
            *m &= !(1 << ep);
            *m != 0
        });
        if let Some(c) = self.counts.get_mut(ep) {
            *c = 0;
        }
    }

    /// Blocks indexed for an endpoint.
    pub fn size(&self, ep: usize) -> u64 {
        self.counts.get(ep).copied().unwrap_or(0)
    }

    pub fn contains(&self, ep: usize, b: BlockHash) -> bool {
        ep < MAX_ENDPOINTS && self.map.get(&b).is_some_and(|m| m & (1 << ep) != 0)
    }

    /// Longest cached prefix (in blocks) per endpoint `0..n`.
    pub fn matches(&self, blocks: &[BlockHash], n: usize, out: &mut Vec<usize>) {
        out.clear();
        out.resize(n, 0);
        let n = n.min(MAX_ENDPOINTS);
        let mut alive: u64 = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        for (i, b) in blocks.iter().enumerate() {
            let m = self.map.get(b).copied().unwrap_or(0);
            let dropped = alive & !m;
            let mut d = dropped;
            while d != 0 {
                let ep = d.trailing_zeros() as usize;
                out[ep] = i;
                d &= d - 1;
            }
            alive &= m;
            if alive == 0 {
                return;
            }
        }
        let mut a = alive;
        while a != 0 {
            let ep = a.trailing_zeros() as usize;
            out[ep] = blocks.len();
            a &= a - 1;
        }
    }
}

/// A prefix index built from routing history: each routed prompt's blocks are
/// assumed cached on the endpoint it went to, and forgotten least recently used
/// first once an endpoint holds `capacity` blocks.
#[derive(Debug, Clone)]
pub struct ApproxIndex {
    pub index: PrefixIndex,
    capacity: u64,
    tick: u64,
    last: HashMap<(BlockHash, u8), u64>,
    lru: Vec<VecDeque<(BlockHash, u64)>>,
}

impl ApproxIndex {
    pub fn new(capacity_blocks: u64) -> Self {
        ApproxIndex {
            index: PrefixIndex::default(),
            capacity: capacity_blocks.max(1),
            tick: 0,
            last: HashMap::new(),
            lru: Vec::new(),
        }
    }

    pub fn touch(&mut self, ep: usize, blocks: &[BlockHash]) {
        if ep >= MAX_ENDPOINTS {
            return;
        }
        if self.lru.len() <= ep {
            self.lru.resize(ep + 1, VecDeque::new());
        }
        self.index.stored(ep, blocks);
        for b in blocks {
            self.tick += 1;
            self.last.insert((*b, ep as u8), self.tick);
            self.lru[ep].push_back((*b, self.tick));
        }
        while self.index.size(ep) > self.capacity {
            let Some((b, t)) = self.lru[ep].pop_front() else {
                break;
            };
            if self.last.get(&(b, ep as u8)) == Some(&t) {
                self.last.remove(&(b, ep as u8));
                self.index.removed(ep, &[b]);
            }
        }
        // Stale queue entries (touched again later) are dropped lazily; keep the
        // queue from growing without bound when the same blocks are touched often.
        if self.lru[ep].len() as u64 > 4 * self.capacity {
            let last = &self.last;
            self.lru[ep].retain(|(b, t)| last.get(&(*b, ep as u8)) == Some(t));
        }
    }

    pub fn forget(&mut self, ep: usize) {
        self.index.cleared(ep);
        self.last.retain(|(_, e), _| usize::from(*e) != ep);
        if let Some(q) = self.lru.get_mut(ep) {
            q.clear();
        }
    }
}

/// What a router knows of one endpoint when it decides.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointLoad {
    /// In rotation (not failed, not draining).
    pub healthy: bool,
    /// Relative capacity from the pool definition (1 = one replica's worth).
    pub weight: u32,
    /// Requests this gateway sent and that have not finished.
    pub outstanding: u32,
    /// The engine's waiting requests (vLLM `num_requests_waiting`).
    pub waiting: u32,
    /// The engine's running requests (vLLM `num_requests_running`).
    pub running: u32,
    /// KV-cache utilisation 0..1 (vLLM `kv_cache_usage_perc`).
    pub kv_util: f64,
    /// Uncached prompt tokens this gateway sent that have not reached their first
    /// token yet: the prefill work queued ahead of a new request.
    pub pending_prefill: u64,
}

/// One request, as routing sees it.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub tenant: &'a str,
    pub session: Option<&'a str>,
    /// Chained hashes of the prompt's full blocks.
    pub blocks: &'a [BlockHash],
    pub block_tokens: u32,
    pub prompt_tokens: u32,
    /// Now, in milliseconds on any fixed clock (sessions idle longer than
    /// [`TesseraParams::session_idle_ms`] stop counting as resident).
    pub now_ms: u64,
}

/// Where a session's last turn ran.
#[derive(Debug, Clone, Copy)]
struct Home {
    ep: usize,
    blocks: u64,
    last_ms: u64,
}

/// Where a request goes and what the router expects of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub endpoint: usize,
    /// Prompt blocks the router believes are cached there.
    pub matched_blocks: usize,
    /// Uncached prompt tokens expected (what to add to `pending_prefill`).
    pub uncached_tokens: u64,
}

/// The routing policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    RoundRobin,
    LeastLoad,
    CacheAware,
    WeightedScorer,
    Tessera,
}

impl Policy {
    pub const ALL: [Policy; 5] = [
        Policy::RoundRobin,
        Policy::LeastLoad,
        Policy::CacheAware,
        Policy::WeightedScorer,
        Policy::Tessera,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round-robin",
            Policy::LeastLoad => "least-load",
            Policy::CacheAware => "sglang-cache-aware",
            Policy::WeightedScorer => "llm-d-weighted",
            Policy::Tessera => "tessera",
        }
    }

    /// Whether the policy reads engine KV events (precise prefix index).
    pub fn uses_kv_events(self) -> bool {
        matches!(self, Policy::WeightedScorer | Policy::Tessera)
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Policy::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown routing policy {s:?}: use one of {}",
                    names.join(", ")
                )
            })
    }
}

/// SGLang cache-aware router parameters (sgl-router's defaults).
#[derive(Debug, Clone, Copy)]
pub struct CacheAwareParams {
    pub cache_threshold: f64,
    pub balance_abs_threshold: u32,
    pub balance_rel_threshold: f64,
    /// Tree size bound per worker, in blocks.
    pub max_tree_blocks: u64,
}

impl Default for CacheAwareParams {
    fn default() -> Self {
        CacheAwareParams {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            max_tree_blocks: 1 << 22,
        }
    }
}

/// llm-d weighted-scorer weights (its default "inference scheduling" profile).
#[derive(Debug, Clone, Copy)]
pub struct WeightedParams {
    pub prefix: f64,
    pub queue: f64,
    pub kv_util: f64,
}

impl Default for WeightedParams {
    fn default() -> Self {
        WeightedParams {
            prefix: 3.0,
            queue: 2.0,
            kv_util: 2.0,
        }
    }
}

/// Tessera's router. Endpoints more loaded than the least loaded by the band
/// (requests in flight) are out of the running. Among the rest it takes the
/// longest cached prefix from the precise index (engine KV events; the routing
/// history for endpoints that publish none): when one endpoint has it, the
/// session's own context lives there. When several tie (a new session, or one
/// whose context was evicted everywhere so only the tenant's system prompt is
/// left), the request is placed afresh: least loaded, then the smallest resident
/// working set (prompt blocks of the active sessions living there), then the
/// session's home, then the tenant's.
#[derive(Debug, Clone, Copy)]
pub struct TesseraParams {
    /// Requests in flight above the least-loaded endpoint accepted to keep a
    /// longer cached prefix ...
    pub band_abs: u64,
    /// ... or this fraction of the least load, whichever is larger.
    pub band_rel: f64,
    /// A session unseen this long no longer counts as living on its endpoint.
    pub session_idle_ms: u64,
}

impl Default for TesseraParams {
    fn default() -> Self {
        TesseraParams {
            band_abs: 16,
            band_rel: 0.5,
            session_idle_ms: 60_000,
        }
    }
}

/// A router: one policy with its state (indexes, counters).
#[derive(Debug, Clone)]
pub struct Router {
    pub policy: Policy,
    rr: usize,
    /// Precise index (engine KV events).
    pub precise: PrefixIndex,
    /// Approximate index (routing history), used by the cache-aware policy and by
    /// Tessera for endpoints that publish no KV events.
    pub approx: ApproxIndex,
    /// Endpoints whose KV events feed `precise`.
    pub events_from: u64,
    pub cache_aware: CacheAwareParams,
    pub weighted: WeightedParams,
    pub tessera: TesseraParams,
    /// Session -> where its last turn ran, its size and when.
    homes: HashMap<u64, Home>,
    /// Per endpoint: prompt blocks of the active sessions homed there (their
    /// working set in that endpoint's KV cache).
    resident: Vec<u64>,
    /// (last seen, session) in the order seen, for idle expiry.
    expiry: VecDeque<(u64, u64)>,
    /// Tenant -> endpoint of its last new session.
    tenant_homes: HashMap<u64, usize>,
    scratch: Vec<usize>,
    scratch2: Vec<usize>,
}

impl Router {
    pub fn new(policy: Policy) -> Self {
        let ca = CacheAwareParams::default();
        Router {
            policy,
            rr: 0,
            precise: PrefixIndex::default(),
            approx: ApproxIndex::new(ca.max_tree_blocks),
            events_from: 0,
            cache_aware: ca,
            weighted: WeightedParams::default(),
            tessera: TesseraParams::default(),
            homes: HashMap::new(),
            resident: Vec::new(),
            expiry: VecDeque::new(),
            tenant_homes: HashMap::new(),
            scratch: Vec::new(),
            scratch2: Vec::new(),
        }
    }

    /// Approximate-index capacity per endpoint, in blocks.
    pub fn with_approx_capacity(mut self, blocks: u64) -> Self {
        self.approx = ApproxIndex::new(blocks);
        self
    }

    /// An engine KV event: blocks stored on an endpoint.
    pub fn kv_stored(&mut self, ep: usize, blocks: &[BlockHash]) {
        if ep < MAX_ENDPOINTS {
            self.events_from |= 1 << ep;
        }
        self.precise.stored(ep, blocks);
    }

    /// An engine KV event: blocks evicted on an endpoint.
    pub fn kv_removed(&mut self, ep: usize, blocks: &[BlockHash]) {
        self.precise.removed(ep, blocks);
    }

    /// An engine KV event: the endpoint dropped its whole cache
    /// (`AllBlocksCleared`); it still publishes events.
    pub fn kv_cleared(&mut self, ep: usize) {
        if ep < MAX_ENDPOINTS {
            self.events_from |= 1 << ep;
        }
        self.precise.cleared(ep);
    }

    /// An endpoint's cache is gone (restart, removal, failure). Until it
    /// publishes KV events again, its prefixes come from routing history.
    pub fn endpoint_reset(&mut self, ep: usize) {
        if ep < MAX_ENDPOINTS {
            self.events_from &= !(1 << ep);
        }
        self.precise.cleared(ep);
        self.approx.forget(ep);
        self.homes.retain(|_, h| h.ep != ep);
        if let Some(r) = self.resident.get_mut(ep) {
            *r = 0;
        }
        self.tenant_homes.retain(|_, e| *e != ep);
    }

    /// Cached-prefix lengths per endpoint: precise where the endpoint publishes
    /// events, approximate otherwise.
    fn prefix_matches(&mut self, blocks: &[BlockHash], n: usize, precise_ok: bool) -> Vec<usize> {
        let mut a = std::mem::take(&mut self.scratch);
        if precise_ok && self.policy.uses_kv_events() && self.events_from != 0 {
            self.precise.matches(blocks, n, &mut a);
            let mut b = std::mem::take(&mut self.scratch2);
            self.approx.index.matches(blocks, n, &mut b);
            for (ep, m) in a.iter_mut().enumerate() {
                if ep >= MAX_ENDPOINTS || self.events_from & (1 << ep) == 0 {
                    *m = b[ep];
                }
            }
            self.scratch2 = b;
        } else {
            self.approx.index.matches(blocks, n, &mut a);
        }
        a
    }

    /// Picks an endpoint, or `None` when none is healthy. The caller records the
    /// decision with [`Router::routed`].
    pub fn pick(&mut self, req: &RouteRequest<'_>, eps: &[EndpointLoad]) -> Option<Decision> {
        let n = eps.len().min(MAX_ENDPOINTS);
        let healthy: Vec<usize> = (0..n).filter(|&i| eps[i].healthy).collect();
        if healthy.is_empty() {
            return None;
        }
        let bt = u64::from(req.block_tokens.max(1));
        let prompt = u64::from(req.prompt_tokens);
        let uncached = |m: usize| prompt.saturating_sub(m as u64 * bt).max(1);
        let ep = match self.policy {
            Policy::RoundRobin => {
                let e = healthy[self.rr % healthy.len()];
                self.rr = self.rr.wrapping_add(1);
                e
            }
            Policy::LeastLoad => {
                let start = self.rr;
                self.rr = self.rr.wrapping_add(1);
                *min_by_key_rotated(&healthy, start, |&e| {
                    (u64::from(eps[e].outstanding) * 1000) / u64::from(eps[e].weight.max(1))
                })
            }
            Policy::CacheAware => {
                let p = self.cache_aware;
                let loads: Vec<u32> = healthy.iter().map(|&e| eps[e].outstanding).collect();
                let max = *loads.iter().max().unwrap_or(&0);
                let min = *loads.iter().min().unwrap_or(&0);
                let imbalanced = max.saturating_sub(min) > p.balance_abs_threshold
                    && f64::from(max) > f64::from(min) * p.balance_rel_threshold;
                let start = self.rr;
                self.rr = self.rr.wrapping_add(1);
                if imbalanced {
                    *min_by_key_rotated(&healthy, start, |&e| eps[e].outstanding)
                } else {
                    let m = self.prefix_matches(req.blocks, n, false);
                    let best = *min_by_key_rotated(&healthy, start, |&e| std::cmp::Reverse(m[e]));
                    let rate = if req.blocks.is_empty() {
                        0.0
                    } else {
                        m[best] as f64 / req.blocks.len() as f64
                    };
                    self.scratch = m;
                    if rate > p.cache_threshold {
                        best
                    } else {
                        *min_by_key_rotated(&healthy, start, |&e| self.approx.index.size(e))
                    }
                }
            }
            Policy::WeightedScorer => {
                let w = self.weighted;
                let m = self.prefix_matches(req.blocks, n, true);
                let qmax = healthy.iter().map(|&e| eps[e].waiting).max().unwrap_or(0);
                let qmin = healthy.iter().map(|&e| eps[e].waiting).min().unwrap_or(0);
                let nb = req.blocks.len().max(1) as f64;
                let start = self.rr;
                self.rr = self.rr.wrapping_add(1);
                let score = |e: usize| {
                    let prefix = m[e] as f64 / nb;
                    let queue = if qmax == qmin {
                        1.0
                    } else {
                        f64::from(qmax - eps[e].waiting) / f64::from(qmax - qmin)
                    };
                    let kv = 1.0 - eps[e].kv_util.clamp(0.0, 1.0);
                    w.prefix * prefix + w.queue * queue + w.kv_util * kv
                };
                let e = *min_by_key_rotated(&healthy, start, |&e| {
                    std::cmp::Reverse((score(e) * 1e9) as i64)
                });
                self.scratch = m;
                e
            }
            Policy::Tessera => {
                let t = self.tessera;
                self.expire(req.now_ms);
                let m = self.prefix_matches(req.blocks, n, true);
                let load = |e: usize| {
                    (u64::from(eps[e].outstanding) * 1000) / u64::from(eps[e].weight.max(1))
                };
                let min_load = healthy.iter().map(|&e| load(e)).min().unwrap_or(0);
                let band =
                    min_load + (t.band_abs * 1000).max((min_load as f64 * t.band_rel) as u64);
                let session_home = req.session.and_then(|s| {
                    self.homes
                        .get(&hash_bytes(1, s.as_bytes()))
                        .map(|h| h.ep)
                        .filter(|&e| e < n && eps[e].healthy)
                });
                let th = hash_bytes(2, req.tenant.as_bytes());
                let tenant_home = self
                    .tenant_homes
                    .get(&th)
                    .copied()
                    .filter(|&e| e < n && eps[e].healthy);
                let resident = |e: usize| {
                    let r = self.resident.get(e).copied().unwrap_or(0);
                    r * 1000 / u64::from(eps[e].weight.max(1))
                };
                // Within the load band, the longest cached prefix. When that is
                // one endpoint, the session's own context lives there: follow it.
                // When several tie (a new session, or one whose context is gone
                // everywhere and only the tenant's system prompt is left), the
                // request is placed afresh: least loaded, then least resident
                // working set, then the session's and tenant's last endpoint.
                let in_band: Vec<usize> = healthy
                    .iter()
                    .copied()
                    .filter(|&e| load(e) <= band)
                    .collect();
                let mm = in_band.iter().map(|&e| m[e]).max().unwrap_or(0);
                let e = in_band
                    .iter()
                    .copied()
                    .filter(|&e| m[e] == mm)
                    .min_by_key(|&e| {
                        (
                            load(e),
                            resident(e),
                            Some(e) != session_home,
                            Some(e) != tenant_home,
                            e,
                        )
                    })
                    .unwrap_or(healthy[0]);
                self.scratch = m;
                if session_home.is_none() {
                    self.tenant_homes.insert(th, e);
                }
                e
            }
        };
        let matched = self.scratch.get(ep).copied().unwrap_or(0);
        let matched = if matches!(self.policy, Policy::RoundRobin | Policy::LeastLoad) {
            self.prefix_matches(req.blocks, n, true)
                .get(ep)
                .copied()
                .unwrap_or(0)
        } else {
            matched
        };
        Some(Decision {
            endpoint: ep,
            matched_blocks: matched,
            uncached_tokens: uncached(matched),
        })
    }

    /// Records where a request went: routing history for the approximate index,
    /// the session's and tenant's homes.
    pub fn routed(&mut self, req: &RouteRequest<'_>, d: &Decision) {
        self.approx.touch(d.endpoint, req.blocks);
        let Some(s) = req.session else {
            return;
        };
        let k = hash_bytes(1, s.as_bytes());
        if self.resident.len() <= d.endpoint {
            self.resident.resize(d.endpoint + 1, 0);
        }
        let blocks = req.blocks.len() as u64;
        if let Some(h) = self.homes.get(&k) {
            if let Some(r) = self.resident.get_mut(h.ep) {
                *r = r.saturating_sub(h.blocks);
            }
        }
        self.resident[d.endpoint] += blocks;
        self.homes.insert(
            k,
            Home {
                ep: d.endpoint,
                blocks,
                last_ms: req.now_ms,
            },
        );
        self.expiry.push_back((req.now_ms, k));
    }

    /// Sessions idle longer than the idle time stop counting.
    fn expire(&mut self, now_ms: u64) {
        let idle = self.tessera.session_idle_ms;
        while let Some(&(at, k)) = self.expiry.front() {
            if at + idle > now_ms {
                break;
            }
            self.expiry.pop_front();
            if let Some(h) = self.homes.get(&k) {
                if h.last_ms == at {
                    if let Some(r) = self.resident.get_mut(h.ep) {
                        *r = r.saturating_sub(h.blocks);
                    }
                    self.homes.remove(&k);
                }
            }
        }
    }
}

/// What the scaling signal reads of a pool (weights count as replicas: an
/// engine of weight 2 is two replicas' worth).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScaleInput {
    /// Replicas in rotation now (sum of the healthy engines' weights).
    pub replicas: u32,
    /// Requests this gateway has in flight at the engines.
    pub in_flight: u64,
    /// Requests waiting at the gateway.
    pub queued: u64,
    /// Requests waiting inside the engines (vLLM `num_requests_waiting`).
    pub engine_waiting: u64,
    /// Requests in flight one replica takes (the pool's `max_in_flight`).
    pub per_replica: u32,
    /// KV-cache use summed over the engines in rotation, per mille (weighted:
    /// an engine of weight 2 at 50 % counts 1000).
    pub kv_used_permille: u64,
}

/// A recommended replica count and why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleAdvice {
    /// Replicas to run (at least 1).
    pub replicas: u32,
    /// Replicas the request load needs at the target utilisation.
    pub by_load: u32,
    /// Replicas the KV-cache use needs at the target utilisation.
    pub by_kv_cache: u32,
    /// Requests waiting (at the gateway and inside engines): while any wait,
    /// the advice is above the replicas in rotation.
    pub waiting: u64,
}

/// Target utilisation of a replica, per mille: 80 % of its in-flight limit
/// and of its KV cache.
pub const SCALE_TARGET_PERMILLE: u64 = 800;

/// The scaling signal: replicas needed so that requests (in flight and
/// waiting) fill each replica to [`SCALE_TARGET_PERMILLE`] of its in-flight
/// limit and the KV cache to the same share; while anything waits, at least
/// one replica more than are in rotation. Stateless: an autoscaler applies its
/// own stabilisation window before scaling down.
pub fn recommend_replicas(x: &ScaleInput) -> ScaleAdvice {
    let per = u64::from(x.per_replica.max(1)) * SCALE_TARGET_PERMILLE;
    let waiting = x.queued.saturating_add(x.engine_waiting);
    let demand = x.in_flight.saturating_add(waiting);
    let by_load = demand.saturating_mul(1000).div_ceil(per);
    let by_kv = x.kv_used_permille.div_ceil(SCALE_TARGET_PERMILLE);
    let mut want = by_load.max(by_kv).max(1);
    if waiting > 0 {
        want = want.max(u64::from(x.replicas) + 1);
    }
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    ScaleAdvice {
        replicas: clamp(want),
        by_load: clamp(by_load),
        by_kv_cache: clamp(by_kv),
        waiting,
    }
}

/// The element with the smallest key, ties broken by rotating start position
/// (so equal endpoints share work instead of the first taking all).
fn min_by_key_rotated<T, K: Ord>(v: &[T], start: usize, key: impl Fn(&T) -> K) -> &T {
    let n = v.len();
    let mut best = &v[start % n];
    let mut bk = key(best);
    for i in 1..n {
        let x = &v[(start + i) % n];
        let k = key(x);
        if k < bk {
            best = x;
            bk = k;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(n: usize) -> Vec<EndpointLoad> {
        vec![
            EndpointLoad {
                healthy: true,
                weight: 1,
                ..Default::default()
            };
            n
        ]
    }

    #[test]
    fn prefix_index_matches_longest_prefix_per_endpoint() {
        let blocks: Vec<u64> = (1..=5).collect();
        let mut ix = PrefixIndex::default();
        ix.stored(0, &blocks[..3]);
        ix.stored(1, &blocks[..5]);
        ix.stored(2, &blocks[1..5]); // no first block: no prefix
        let mut out = Vec::new();
        ix.matches(&blocks, 4, &mut out);
        assert_eq!(out, vec![3, 5, 0, 0]);
        ix.removed(1, &[3]);
        ix.matches(&blocks, 4, &mut out);
        assert_eq!(out, vec![3, 2, 0, 0]);
        ix.cleared(0);
        ix.matches(&blocks, 4, &mut out);
        assert_eq!(out, vec![0, 2, 0, 0]);
    }

    #[test]
    fn approx_index_forgets_least_recently_used() {
        let mut a = ApproxIndex::new(3);
        a.touch(0, &[1, 2, 3]);
        a.touch(0, &[1]);
        a.touch(0, &[4]);
        assert!(a.index.contains(0, 1));
        assert!(!a.index.contains(0, 2));
        assert_eq!(a.index.size(0), 3);
    }

    #[test]
    fn tessera_follows_the_cache_until_the_load_band() {
        let blocks: Vec<u64> = (1..=100).collect();
        let req = RouteRequest {
            tenant: "t",
            session: Some("s"),
            blocks: &blocks,
            block_tokens: 16,
            prompt_tokens: 1610,
            now_ms: 0,
        };
        let mut r = Router::new(Policy::Tessera);
        r.kv_stored(1, &blocks);
        let mut eps = load(3);
        assert_eq!(r.pick(&req, &eps).unwrap().endpoint, 1);
        eps[1].outstanding = 16;
        assert_eq!(r.pick(&req, &eps).unwrap().endpoint, 1, "inside the band");
        eps[1].outstanding = 17;
        assert_ne!(r.pick(&req, &eps).unwrap().endpoint, 1, "outside the band");
        eps[1].outstanding = 0;
        eps[1].healthy = false;
        assert_ne!(r.pick(&req, &eps).unwrap().endpoint, 1);
    }

    #[test]
    fn no_healthy_endpoint_no_decision() {
        let mut r = Router::new(Policy::RoundRobin);
        let req = RouteRequest {
            tenant: "t",
            session: None,
            blocks: &[],
            block_tokens: 16,
            prompt_tokens: 0,
            now_ms: 0,
        };
        assert_eq!(r.pick(&req, &[]), None);
    }

    #[test]
    fn text_blocks_chain_prefixes() {
        let a = text_blocks(&[b'a'; 200]);
        let mut t = vec![b'a'; 128];
        t.extend([b'b'; 72]);
        let b = text_blocks(&t);
        assert_eq!(a.len(), 3);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
    }
}
