//! The routing simulation (`tessera sim routing`): a discrete-event model of an
//! inference pool behind a gateway, driven by multi-turn agent sessions from
//! several tenants with shared system prompts, run once per router on the same
//! workload.
//!
//! * **Engines** (vLLM-like): a KV cache of `cache_blocks` fixed blocks of
//!   `block_tokens` tokens with prefix caching and LRU eviction of unreferenced
//!   blocks; continuous batching up to `max_batch` running requests; each step
//!   prefills up to `chunk_tokens` uncached prompt tokens (chunked prefill) and
//!   decodes one token per running request, and lasts `step_ms + prefill_ms_per_token
//!   × prefilled + decode_ms_per_seq × decoding`. A request is admitted only when
//!   its uncached blocks and its output fit in the cache. Engines publish KV
//!   events (block stored, block removed) that precise routers read at once.
//! * **Sessions**: arrive as a Poisson process; a session belongs to a tenant
//!   (chosen by weight) whose system prompt opens every prompt; each turn's
//!   prompt is the whole conversation so far plus a new user message; the next
//!   turn arrives a think time (exponential) after the previous answer ends.
//! * **Routers**: [`tessera_gateway::route`], the code the gateway runs, fed
//!   with the load each router would see (in-flight counts at the gateway; the
//!   engines' waiting, running and KV utilisation, fresh at every decision).
//!
//! Deterministic for a seed: simulated time in microseconds, a seeded generator,
//! and ordered event ties.

pub mod plot;

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix64;
use tessera_gateway::route::{
    BlockHash, Decision, EndpointLoad, Policy, RouteRequest, Router, mix,
};

/// One tenant of a workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Share of sessions (relative).
    pub weight: f64,
    /// System prompt length, tokens (shared by all its sessions).
    pub system_tokens: u32,
    /// Turns per session, inclusive range.
    pub turns: (u32, u32),
}

/// The sessions that drive a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub name: String,
    pub tenants: Vec<TenantSpec>,
    /// New sessions per second.
    pub session_rate: f64,
    /// Sessions start during this many seconds; the run ends when all finish.
    pub duration_s: f64,
    /// User message per turn, tokens, inclusive range.
    pub user_tokens: (u32, u32),
    /// Answer per turn, tokens, inclusive range.
    pub output_tokens: (u32, u32),
    /// Mean think time between an answer and the next turn (tool calls), ms.
    pub think_ms: f64,
}

impl Workload {
    /// Eight tenants of equal weight, system prompts 1–3k tokens, 3–12 turns.
    pub fn default_workload() -> Self {
        let tenants = (0..8)
            .map(|i| TenantSpec {
                weight: 1.0,
                system_tokens: 1000 + 250 * i,
                turns: (3, 12),
            })
            .collect();
        Workload {
            name: "default".into(),
            tenants,
            session_rate: 8.0,
            duration_s: 120.0,
            user_tokens: (50, 400),
            output_tokens: (50, 300),
            think_ms: 3000.0,
        }
    }

    /// Two heavy tenants with long system prompts and long sessions opening 70 %
    /// of sessions (many at once, so their sessions interleave), and 24 light ones.
    pub fn tenant_heavy() -> Self {
        let mut tenants = vec![
            TenantSpec {
                weight: 35.0,
                system_tokens: 6000,
                turns: (8, 20),
            },
            TenantSpec {
                weight: 35.0,
                system_tokens: 4500,
                turns: (8, 20),
            },
        ];
        for i in 0..24 {
            tenants.push(TenantSpec {
                weight: 30.0 / 24.0,
                system_tokens: 400 + 100 * (i % 16),
                turns: (2, 6),
            });
        }
        Workload {
            name: "tenant-heavy".into(),
            tenants,
            session_rate: 4.0,
            duration_s: 120.0,
            user_tokens: (50, 400),
            output_tokens: (50, 300),
            think_ms: 3000.0,
        }
    }

    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "default" => Some(Self::default_workload()),
            "tenant-heavy" => Some(Self::tenant_heavy()),
            _ => None,
        }
    }
}

/// The engines of the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSpec {
    pub engines: usize,
    pub block_tokens: u32,
    pub cache_blocks: u32,
    pub max_batch: usize,
    pub chunk_tokens: u32,
    pub step_ms: f64,
    pub prefill_ms_per_token: f64,
    pub decode_ms_per_seq: f64,
}

impl Default for EngineSpec {
    /// Four replicas of an 8B model on one H100-class GPU each, roughly.
    fn default() -> Self {
        EngineSpec {
            engines: 4,
            block_tokens: 16,
            cache_blocks: 8_000,
            max_batch: 48,
            chunk_tokens: 2048,
            step_ms: 4.0,
            prefill_ms_per_token: 0.04,
            decode_ms_per_seq: 0.08,
        }
    }
}

/// One run's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingConfig {
    pub seed: u64,
    pub workload: Workload,
    pub engine: EngineSpec,
}

/// One router's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterResult {
    pub router: String,
    /// Prompt tokens served from the KV cache / prompt tokens.
    pub hit_rate: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Output tokens per second over the whole run.
    pub tokens_per_sec: f64,
    pub requests: u64,
    /// Prompt tokens the engines computed (not served from cache).
    pub prefill_tokens: u64,
}

/// The workload's draws: [`SplitMix64`] with routing's own seeding.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // Routing's recorded workloads were drawn from `mix(state)` after each
        // step, and `mix` adds the step itself: starting SplitMix64 one step
        // ahead yields the same sequence, so the published tables still hold.
        Rng(SplitMix64::new(
            mix(seed ^ 0x5EED).wrapping_add(0x9E37_79B9_7F4A_7C15),
        ))
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0.unit()
    }
    /// Uniform in `lo..=hi`, bounds in either order.
    pub fn range(&mut self, (lo, hi): (u32, u32)) -> u32 {
        let (lo, hi) = (lo.min(hi), lo.max(hi));
        self.0.between(u64::from(lo), u64::from(hi)) as u32
    }
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// A session's script: everything random is drawn up front, so every router
/// sees exactly the same sessions.
#[derive(Debug, Clone)]
struct SessionScript {
    tenant: usize,
    start_us: u64,
    /// Per turn: (user tokens, output tokens, think time after it in µs).
    turns: Vec<(u32, u32, u64)>,
}

fn script(w: &Workload, seed: u64) -> Vec<SessionScript> {
    let mut rng = Rng::new(seed);
    let total: f64 = w.tenants.iter().map(|t| t.weight).sum();
    let mut t = 0.0;
    let mut out = Vec::new();
    loop {
        t += rng.exp(1.0 / w.session_rate.max(1e-9));
        if t >= w.duration_s {
            break;
        }
        let mut x = rng.unit() * total;
        let mut tenant = 0;
        for (i, ts) in w.tenants.iter().enumerate() {
            tenant = i;
            if x < ts.weight {
                break;
            }
            x -= ts.weight;
        }
        let n = rng.range(w.tenants[tenant].turns);
        let turns = (0..n)
            .map(|_| {
                (
                    rng.range(w.user_tokens),
                    rng.range(w.output_tokens),
                    (rng.exp(w.think_ms) * 1000.0) as u64,
                )
            })
            .collect();
        out.push(SessionScript {
            tenant,
            start_us: (t * 1e6) as u64,
            turns,
        });
    }
    out
}

/// Hash of block `k` of a session's token stream: blocks wholly inside the
/// tenant's system prompt are shared by the tenant's sessions; the rest are the
/// session's own (their content follows the system prompt, so a chained hash
/// would differ per session too).
fn block_hash(tenant: usize, system_tokens: u32, session: usize, k: u32, bt: u32) -> BlockHash {
    if (k + 1) * bt <= system_tokens {
        mix(mix(0xA000_0000 ^ tenant as u64) ^ u64::from(k))
    } else {
        mix(mix(0xB000_0000_0000 ^ session as u64) ^ u64::from(k))
    }
}

#[derive(Debug)]
struct Req {
    session: usize,
    arrive_us: u64,
    prompt: u32,
    output: u32,
    blocks: Vec<BlockHash>,
    decision: Decision,
    /// Blocks this request holds a reference on (admitted).
    held: Vec<BlockHash>,
    reserve: u32,
    prefill_left: u32,
    generated: u32,
    first_token: bool,
}

#[derive(Debug, Default)]
struct Engine {
    /// Block -> (references, last use tick).
    cache: HashMap<BlockHash, (u32, u64)>,
    evictable: BTreeSet<(u64, BlockHash)>,
    reserved: u32,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    busy: bool,
}

enum KvEvent {
    Stored(usize, Vec<BlockHash>),
    Removed(usize, Vec<BlockHash>),
}

impl Engine {
    fn used(&self) -> u32 {
        self.cache.len() as u32 + self.reserved
    }

    fn unref(&mut self, b: BlockHash, tick: u64) {
        if let Some(e) = self.cache.get_mut(&b) {
            e.0 = e.0.saturating_sub(1);
            if e.0 == 0 {
                self.evictable.remove(&(e.1, b));
                e.1 = tick;
                self.evictable.insert((tick, b));
            }
        }
    }

    /// Evicts until `need` blocks are free; false when it cannot.
    fn make_room(&mut self, need: u32, cap: u32, removed: &mut Vec<BlockHash>) -> bool {
        while cap.saturating_sub(self.used()) < need {
            let Some((t, b)) = self.evictable.pop_first() else {
                return false;
            };
            let _ = t;
            self.cache.remove(&b);
            removed.push(b);
        }
        true
    }
}

struct Sim<'a> {
    cfg: &'a RoutingConfig,
    scripts: &'a [SessionScript],
    router: Router,
    engines: Vec<Engine>,
    loads: Vec<EndpointLoad>,
    reqs: Vec<Req>,
    /// Per session: (next turn index, tokens in its stream so far).
    sessions: Vec<(usize, u32)>,
    session_names: Vec<String>,
    tenant_names: Vec<String>,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    tick: u64,
    ttft_us: Vec<u64>,
    hit_tokens: u64,
    prompt_tokens: u64,
    output_tokens: u64,
    end_us: u64,
    kv: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A session's next turn arrives at the gateway.
    Turn(usize),
    /// An engine's step ends.
    Step(usize),
}

impl Sim<'_> {
    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    fn deliver(&mut self, ev: KvEvent) {
        if !self.kv {
            return;
        }
        match ev {
            KvEvent::Stored(e, b) if !b.is_empty() => self.router.kv_stored(e, &b),
            KvEvent::Removed(e, b) if !b.is_empty() => self.router.kv_removed(e, &b),
            _ => {}
        }
    }

    fn refresh_load(&mut self, e: usize) {
        let en = &self.engines[e];
        let l = &mut self.loads[e];
        l.waiting = en.waiting.len() as u32;
        l.running = en.running.len() as u32;
        l.kv_util = f64::from(en.used()) / f64::from(self.cfg.engine.cache_blocks);
    }

    fn turn(&mut self, now: u64, s: usize) {
        let sc = &self.scripts[s];
        let (ti, ctx) = self.sessions[s];
        let (user, output, _) = sc.turns[ti];
        let tenant = sc.tenant;
        let sys = self.cfg.workload.tenants[tenant].system_tokens;
        let bt = self.cfg.engine.block_tokens;
        let ctx = if ti == 0 { sys } else { ctx };
        let prompt = ctx + user;
        let blocks: Vec<BlockHash> = (0..prompt / bt)
            .map(|k| block_hash(tenant, sys, s, k, bt))
            .collect();
        let rr = RouteRequest {
            tenant: &self.tenant_names[tenant],
            session: Some(&self.session_names[s]),
            blocks: &blocks,
            block_tokens: bt,
            prompt_tokens: prompt,
            now_ms: now / 1000,
        };
        let Some(d) = self.router.pick(&rr, &self.loads) else {
            return;
        };
        self.router.routed(&rr, &d);
        let e = d.endpoint;
        self.loads[e].outstanding += 1;
        self.loads[e].pending_prefill += d.uncached_tokens;
        self.sessions[s] = (ti + 1, prompt + output);
        let id = self.reqs.len();
        self.reqs.push(Req {
            session: s,
            arrive_us: now,
            prompt,
            output: output.max(1),
            blocks,
            decision: d,
            held: Vec::new(),
            reserve: 0,
            prefill_left: 0,
            generated: 0,
            first_token: false,
        });
        self.engines[e].waiting.push_back(id);
        self.refresh_load(e);
        if !self.engines[e].busy {
            self.step(now, e);
        }
    }

    /// Admits what fits and runs one step of engine `e` starting at `now`.
    fn step(&mut self, now: u64, e: usize) {
        let spec = &self.cfg.engine;
        let cap = spec.cache_blocks;
        let bt = spec.block_tokens;
        let mut removed = Vec::new();
        let mut stored = Vec::new();
        // Admission, first come first served.
        while self.engines[e].running.len() < spec.max_batch {
            let Some(&id) = self.engines[e].waiting.front() else {
                break;
            };
            self.tick += 1;
            let tick = self.tick;
            let en = &mut self.engines[e];
            let r = &self.reqs[id];
            let mut hit = 0usize;
            while hit < r.blocks.len() && en.cache.contains_key(&r.blocks[hit]) {
                hit += 1;
            }
            let absent = r
                .blocks
                .iter()
                .filter(|b| !en.cache.contains_key(b))
                .count() as u32;
            let reserve = (r.output + r.prompt % bt).div_ceil(bt) + 1;
            // Pin the blocks it will use before evicting anything.
            for b in &r.blocks {
                if let Some(x) = en.cache.get_mut(b) {
                    if x.0 == 0 {
                        en.evictable.remove(&(x.1, *b));
                    }
                    x.0 += 1;
                    x.1 = tick;
                }
            }
            if !en.make_room(absent + reserve, cap, &mut removed) {
                // Does not fit yet: undo the pins, wait for running requests.
                let blocks = self.reqs[id].blocks.clone();
                for b in blocks {
                    en.unref(b, tick);
                }
                if en.running.is_empty() {
                    // Larger than the whole cache: serve it uncached.
                    en.waiting.pop_front();
                    let r = &mut self.reqs[id];
                    r.prefill_left = r.prompt.max(1);
                    r.reserve = 0;
                    en.running.push(id);
                    continue;
                }
                break;
            }
            let en = &mut self.engines[e];
            let r = &mut self.reqs[id];
            for b in &r.blocks {
                if !en.cache.contains_key(b) {
                    en.cache.insert(*b, (1, tick));
                    stored.push(*b);
                }
            }
            en.reserved += reserve;
            r.reserve = reserve;
            r.held = r.blocks.clone();
            let hit_tokens = (hit as u32 * bt).min(r.prompt.saturating_sub(1));
            r.prefill_left = (r.prompt - hit_tokens).max(1);
            self.hit_tokens += u64::from(hit_tokens);
            self.prompt_tokens += u64::from(r.prompt);
            en.waiting.pop_front();
            en.running.push(id);
        }
        self.deliver(KvEvent::Removed(e, std::mem::take(&mut removed)));
        self.deliver(KvEvent::Stored(e, std::mem::take(&mut stored)));
        if self.engines[e].running.is_empty() {
            self.engines[e].busy = false;
            self.refresh_load(e);
            return;
        }
        // One step: chunked prefill in admission order, one token per decoder.
        let mut budget = spec.chunk_tokens;
        let mut prefilled = 0u32;
        let mut decoding = 0u32;
        for &id in &self.engines[e].running {
            let r = &mut self.reqs[id];
            if r.prefill_left > 0 {
                let take = r.prefill_left.min(budget);
                r.prefill_left -= take;
                budget -= take;
                prefilled += take;
            } else {
                decoding += 1;
            }
        }
        let ms = spec.step_ms
            + spec.prefill_ms_per_token * f64::from(prefilled)
            + spec.decode_ms_per_seq * f64::from(decoding);
        self.engines[e].busy = true;
        self.refresh_load(e);
        let at = now + (ms * 1000.0).round().max(1.0) as u64;
        self.push(at, Ev::Step(e));
    }

    /// Engine `e`'s step ended at `now`: tokens out, finished requests leave.
    fn step_end(&mut self, now: u64, e: usize) {
        let bt = self.cfg.engine.block_tokens;
        let cap = self.cfg.engine.cache_blocks;
        let running = std::mem::take(&mut self.engines[e].running);
        let mut keep = Vec::with_capacity(running.len());
        let mut stored = Vec::new();
        let mut removed = Vec::new();
        for id in running {
            let r = &mut self.reqs[id];
            if r.prefill_left > 0 {
                keep.push(id);
                continue;
            }
            if !r.first_token {
                r.first_token = true;
                self.ttft_us.push(now - r.arrive_us);
                let l = &mut self.loads[e];
                l.pending_prefill = l.pending_prefill.saturating_sub(r.decision.uncached_tokens);
            }
            r.generated += 1;
            if r.generated < r.output {
                keep.push(id);
                continue;
            }
            // Finished: its prompt blocks become evictable; the conversation's
            // new full blocks (answer included) are cached for the next turn.
            self.output_tokens += u64::from(r.output);
            self.end_us = self.end_us.max(now);
            let held = std::mem::take(&mut r.held);
            let reserve = r.reserve;
            let (s, total) = (r.session, r.prompt + r.output);
            let from = r.blocks.len() as u32;
            let en = &mut self.engines[e];
            en.reserved -= reserve;
            let sc = &self.scripts[s];
            let sys = self.cfg.workload.tenants[sc.tenant].system_tokens;
            let new: Vec<BlockHash> = (from..total / bt)
                .map(|k| block_hash(sc.tenant, sys, s, k, bt))
                .filter(|b| !en.cache.contains_key(b))
                .collect();
            // Freed blocks join the LRU tail last-block-first (as vLLM's free
            // queue does), so eviction eats a conversation from its end and
            // its prefix stays usable longest.
            if en.make_room(new.len() as u32, cap, &mut removed) {
                for b in new.into_iter().rev() {
                    self.tick += 1;
                    en.cache.insert(b, (0, self.tick));
                    en.evictable.insert((self.tick, b));
                    stored.push(b);
                }
            }
            for b in held.into_iter().rev() {
                self.tick += 1;
                en.unref(b, self.tick);
            }
            self.loads[e].outstanding = self.loads[e].outstanding.saturating_sub(1);
            let (ti, _) = self.sessions[s];
            if ti < sc.turns.len() {
                let think = sc.turns[ti - 1].2;
                self.push(now + think, Ev::Turn(s));
            }
        }
        self.engines[e].running = keep;
        self.deliver(KvEvent::Removed(e, removed));
        self.deliver(KvEvent::Stored(e, stored));
        self.step(now, e);
    }
}

/// Runs one router over the workload of `cfg`.
pub fn run_one(cfg: &RoutingConfig, policy: Policy) -> RouterResult {
    let scripts = script(&cfg.workload, cfg.seed);
    run_scripts(cfg, &scripts, policy)
}

fn run_scripts(cfg: &RoutingConfig, scripts: &[SessionScript], policy: Policy) -> RouterResult {
    let n = cfg
        .engine
        .engines
        .clamp(1, tessera_gateway::route::MAX_ENDPOINTS);
    let router = Router::new(policy).with_approx_capacity(u64::from(cfg.engine.cache_blocks));
    let mut sim = Sim {
        cfg,
        scripts,
        router,
        engines: (0..n).map(|_| Engine::default()).collect(),
        loads: vec![
            EndpointLoad {
                healthy: true,
                weight: 1,
                ..Default::default()
            };
            n
        ],
        reqs: Vec::new(),
        sessions: vec![(0, 0); scripts.len()],
        session_names: (0..scripts.len()).map(|i| format!("s{i}")).collect(),
        tenant_names: (0..cfg.workload.tenants.len())
            .map(|i| format!("t{i}"))
            .collect(),
        heap: BinaryHeap::new(),
        seq: 0,
        tick: 0,
        ttft_us: Vec::new(),
        hit_tokens: 0,
        prompt_tokens: 0,
        output_tokens: 0,
        end_us: 0,
        kv: policy.uses_kv_events(),
    };
    for (i, s) in scripts.iter().enumerate() {
        if !s.turns.is_empty() {
            sim.push(s.start_us, Ev::Turn(i));
        }
    }
    while let Some(Reverse((now, _, ev))) = sim.heap.pop() {
        match ev {
            Ev::Turn(s) => sim.turn(now, s),
            Ev::Step(e) => sim.step_end(now, e),
        }
    }
    let mut t = sim.ttft_us.clone();
    t.sort_unstable();
    let pct = |p: f64| -> f64 {
        if t.is_empty() {
            return 0.0;
        }
        let i = ((t.len() - 1) as f64 * p).round() as usize;
        t[i.min(t.len() - 1)] as f64 / 1000.0
    };
    let start = scripts.first().map_or(0, |s| s.start_us);
    let span_s = (sim.end_us.saturating_sub(start)) as f64 / 1e6;
    RouterResult {
        router: policy.name().to_string(),
        hit_rate: if sim.prompt_tokens == 0 {
            0.0
        } else {
            sim.hit_tokens as f64 / sim.prompt_tokens as f64
        },
        ttft_p50_ms: pct(0.5),
        ttft_p99_ms: pct(0.99),
        tokens_per_sec: if span_s > 0.0 {
            sim.output_tokens as f64 / span_s
        } else {
            0.0
        },
        requests: t.len() as u64,
        prefill_tokens: sim.prompt_tokens - sim.hit_tokens,
    }
}

/// Runs every router over the same workload.
pub fn run_all(cfg: &RoutingConfig, policies: &[Policy]) -> Vec<RouterResult> {
    let scripts = script(&cfg.workload, cfg.seed);
    policies
        .iter()
        .map(|&p| run_scripts(cfg, &scripts, p))
        .collect()
}

/// Whether `ours` is at least as good as the best other router on hit rate and
/// on TTFT p99, and strictly better on at least one.
pub fn dominates(results: &[RouterResult], ours: &str) -> bool {
    let Some(o) = results.iter().find(|r| r.router == ours) else {
        return false;
    };
    let others: Vec<&RouterResult> = results.iter().filter(|r| r.router != ours).collect();
    if others.is_empty() {
        return true;
    }
    let best_hit = others.iter().map(|r| r.hit_rate).fold(f64::MIN, f64::max);
    let best_p99 = others
        .iter()
        .map(|r| r.ttft_p99_ms)
        .fold(f64::MAX, f64::min);
    o.hit_rate >= best_hit
        && o.ttft_p99_ms <= best_p99
        && (o.hit_rate > best_hit || o.ttft_p99_ms < best_p99)
}

/// Every router over one workload for several seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub workload: String,
    pub seeds: Vec<u64>,
    /// Per router, the mean over seeds.
    pub routers: Vec<RouterResult>,
    pub per_seed: Vec<SeedResult>,
    /// Tessera dominates (see [`dominates`]) on the means and on every seed.
    pub tessera_dominates: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedResult {
    pub seed: u64,
    pub routers: Vec<RouterResult>,
    pub tessera_dominates: bool,
}

/// Runs `policies` on `workload` for each seed (routers of a seed in parallel,
/// up to `threads` at once) and summarises.
pub fn compare(
    workload: &Workload,
    engine: &EngineSpec,
    seeds: &[u64],
    policies: &[Policy],
    threads: usize,
    progress: &(dyn Fn() + Sync),
) -> Comparison {
    let threads = threads.max(1);
    let mut per_seed = Vec::new();
    for &seed in seeds {
        let cfg = RoutingConfig {
            seed,
            workload: workload.clone(),
            engine: engine.clone(),
        };
        let scripts = script(&cfg.workload, seed);
        let mut results: Vec<Option<RouterResult>> = vec![None; policies.len()];
        for chunk in (0..policies.len()).collect::<Vec<_>>().chunks(threads) {
            std::thread::scope(|sc| {
                let hs: Vec<_> = chunk
                    .iter()
                    .map(|&i| {
                        let (cfg, scripts) = (&cfg, &scripts);
                        let p = policies[i];
                        sc.spawn(move || {
                            let r = run_scripts(cfg, scripts, p);
                            progress();
                            (i, r)
                        })
                    })
                    .collect();
                for h in hs {
                    if let Ok((i, r)) = h.join() {
                        results[i] = Some(r);
                    }
                }
            });
        }
        let routers: Vec<RouterResult> = results.into_iter().flatten().collect();
        per_seed.push(SeedResult {
            seed,
            tessera_dominates: dominates(&routers, Policy::Tessera.name()),
            routers,
        });
    }
    let k = per_seed.len().max(1) as f64;
    let routers: Vec<RouterResult> = policies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let col = per_seed.iter().filter_map(|s| s.routers.get(i));
            let mut m = RouterResult {
                router: p.name().to_string(),
                hit_rate: 0.0,
                ttft_p50_ms: 0.0,
                ttft_p99_ms: 0.0,
                tokens_per_sec: 0.0,
                requests: 0,
                prefill_tokens: 0,
            };
            for r in col {
                m.hit_rate += r.hit_rate / k;
                m.ttft_p50_ms += r.ttft_p50_ms / k;
                m.ttft_p99_ms += r.ttft_p99_ms / k;
                m.tokens_per_sec += r.tokens_per_sec / k;
                m.requests += r.requests;
                m.prefill_tokens += r.prefill_tokens;
            }
            m
        })
        .collect();
    let all =
        dominates(&routers, Policy::Tessera.name()) && per_seed.iter().all(|s| s.tessera_dominates);
    Comparison {
        workload: workload.name.clone(),
        seeds: seeds.to_vec(),
        routers,
        per_seed,
        tessera_dominates: all,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> RoutingConfig {
        let mut w = Workload::default_workload();
        w.duration_s = 6.0;
        RoutingConfig {
            seed: 1,
            workload: w,
            engine: EngineSpec::default(),
        }
    }

    #[test]
    fn same_seed_same_result() {
        let c = small();
        assert_eq!(run_one(&c, Policy::Tessera), run_one(&c, Policy::Tessera));
    }

    #[test]
    fn every_request_gets_an_answer() {
        let c = small();
        let scripts = script(&c.workload, c.seed);
        let turns: usize = scripts.iter().map(|s| s.turns.len()).sum();
        for p in Policy::ALL {
            let r = run_one(&c, p);
            assert_eq!(r.requests as usize, turns, "{}", p.name());
            assert!((0.0..=1.0).contains(&r.hit_rate));
        }
    }
}
