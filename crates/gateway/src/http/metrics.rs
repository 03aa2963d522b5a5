//! Metrics: engine scraping and health probes, the pools' figures over their
//! latest requests, and the Prometheus gauges.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::pool::{Pool, PoolStatus};
use super::{InferenceGateway, Usage};

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
pub(super) struct Window {
    ttft: VecDeque<f64>,
    tokens: VecDeque<(u64, u64)>,
    pub(super) requests: u64,
}

impl Window {
    pub(super) fn observe(&mut self, u: &Usage) {
        self.requests += 1;
        if self.ttft.len() == STATS_WINDOW {
            self.ttft.pop_front();
            self.tokens.pop_front();
        }
        self.ttft.push_back(u.ttft_ms);
        self.tokens
            .push_back((u.prompt_tokens, u.cached_tokens.min(u.prompt_tokens)));
    }

    pub(super) fn ttft(&self) -> Option<Percentiles> {
        percentiles(self.ttft.iter().copied())
    }

    /// Prompt tokens served from the prefix cache, of all prompt tokens.
    pub(super) fn hit_rate(&self) -> Option<f64> {
        let (all, cached) = self
            .tokens
            .iter()
            .fold((0u64, 0u64), |(a, c), (p, k)| (a + p, c + k));
        (all > 0).then(|| cached as f64 / all as f64)
    }
}

/// Counts an answered request in its pool's and endpoint's figures.
pub(super) fn observe(pool: &Pool, slot: usize, u: &Usage) {
    if let Ok(mut g) = pool.inner.lock() {
        g.stats.observe(u);
        if let Some(s) = g.slots.get_mut(slot) {
            s.stats.observe(u);
        }
    }
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

impl InferenceGateway {
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
}

/// A pool gauge: name, help, value.
type Gauge = (&'static str, &'static str, fn(&PoolStatus) -> f64);

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
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
}
