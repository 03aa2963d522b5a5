//! `tessera bench gateway`: the gateway's own time per request, engine time
//! excluded, on loopback.
//!
//! An in-process gateway (this crate's [`InferenceGateway`] behind a minimal axum front,
//! no authentication and an in-memory usage sink) in front of two in-process
//! test engines ([`crate::mock`]) that answer at once with one token. For each
//! request the gateway measures, inside itself, request in to first byte
//! forwarded less the time it waited on the engine (sending to the engine up to
//! the engine's first byte): [`Usage::overhead_us`]. The client also measures
//! time to first byte through the gateway and straight to an engine, for
//! context (the difference includes the extra loopback hop and HTTP parsing).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use serde::Serialize;
use serde_json::{Value, json};

use crate::http::{
    EndpointSpec, InferenceCaller, InferenceGateway, InferenceGatewayConfig, MemorySink, PoolSpec,
    Usage,
};
use crate::mock;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Measured requests per mode (plain, streaming).
    pub requests: usize,
    /// Requests at once.
    pub concurrency: usize,
    /// Unmeasured requests per mode first.
    pub warmup: usize,
    /// Bytes of shared system prompt per request (prefix hashing is part of
    /// the gateway's work).
    pub prompt_bytes: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            requests: 2000,
            concurrency: 1,
            warmup: 200,
            prompt_bytes: 4096,
        }
    }
}

/// Raw samples of one mode, in microseconds (unsorted).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModeSamples {
    /// `plain` or `stream`.
    pub mode: &'static str,
    /// The gateway's own time per request (engine excluded).
    pub overhead_us: Vec<u64>,
    /// Client-side time to first byte through the gateway.
    pub ttfb_gateway_us: Vec<u64>,
    /// Client-side time to first byte straight to an engine.
    pub ttfb_direct_us: Vec<u64>,
}

/// Runs the benchmark. Errors say what failed.
pub async fn run(cfg: &BenchConfig) -> Result<Vec<ModeSamples>, String> {
    if cfg.requests == 0 || cfg.concurrency == 0 {
        return Err("requests and concurrency must be at least 1".into());
    }
    let e1 = mock::start()
        .await
        .map_err(|e| format!("test engine: {e}"))?;
    let e2 = mock::start()
        .await
        .map_err(|e| format!("test engine: {e}"))?;
    for e in [&e1, &e2] {
        e.knobs
            .tokens
            .store(1, std::sync::atomic::Ordering::Relaxed);
    }
    let sink = Arc::new(MemorySink::default());
    let gw = InferenceGateway::new(sink.clone(), InferenceGatewayConfig::default());
    gw.upsert_pool(PoolSpec {
        name: "bench".into(),
        model: "bench-model".into(),
        endpoints: [&e1, &e2]
            .iter()
            .map(|e| EndpointSpec {
                url: e.url.clone(),
                weight: 1,
            })
            .collect(),
        max_in_flight: 1024,
        max_queue: 4096,
        queue_timeout_ms: 10_000,
        redact: Default::default(),
    })?;
    let url = serve(gw.clone())
        .await
        .map_err(|e| format!("gateway: {e}"))?;
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(cfg.concurrency * 2)
        .build()
        .map_err(|e| e.to_string())?;
    let system = "You are a careful assistant. ".repeat(cfg.prompt_bytes / 29 + 1);
    let mut out = Vec::new();
    for (mode, stream) in [("plain", false), ("stream", true)] {
        let body = |i: usize| {
            json!({"model": "bench-model", "stream": stream, "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("question {i}")},
            ]})
        };
        // Warm-up (connections, allocator), then measure.
        let _ = drive(&client, &url, cfg.warmup, cfg.concurrency, &body).await?;
        let _ = drive(&client, &e1.url, cfg.warmup, cfg.concurrency, &body).await?;
        settle(&sink, 2 * cfg.warmup).await;
        take(&sink);
        let ttfb_gateway_us = drive(&client, &url, cfg.requests, cfg.concurrency, &body).await?;
        let ttfb_direct_us = drive(&client, &e1.url, cfg.requests, cfg.concurrency, &body).await?;
        settle(&sink, cfg.requests).await;
        let overhead_us = take(&sink).into_iter().map(|u| u.overhead_us).collect();
        out.push(ModeSamples {
            mode,
            overhead_us,
            ttfb_gateway_us,
            ttfb_direct_us,
        });
    }
    Ok(out)
}

/// Waits until the sink holds `n` records (metering happens after the reply).
async fn settle(sink: &MemorySink, n: usize) {
    let t0 = Instant::now();
    while sink.records.lock().map(|r| r.len()).unwrap_or(n) < n
        && t0.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn take(sink: &MemorySink) -> Vec<Usage> {
    sink.records
        .lock()
        .map(|mut r| std::mem::take(&mut *r).into_iter().map(|x| x.2).collect())
        .unwrap_or_default()
}

/// The gateway behind a minimal front: `X-Session-Id` and `X-Tenant` headers.
async fn serve(gw: InferenceGateway) -> std::io::Result<String> {
    let front = |path: &'static str| {
        let g = gw.clone();
        post(move |h: HeaderMap, body: Bytes| {
            let g = g.clone();
            async move {
                let hv = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
                let who = InferenceCaller {
                    tenant: hv("x-tenant").unwrap_or_else(|| "bench".into()),
                    session: hv("x-session-id"),
                    ..InferenceCaller::default()
                };
                g.forward(who, path, body).await
            }
        })
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", front("/v1/chat/completions"))
        .route("/v1/completions", front("/v1/completions"));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    use axum::serve::ListenerExt;
    let l = l.tap_io(|t| {
        let _ = t.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    Ok(format!("http://{addr}"))
}

/// Sends `n` requests, `conc` at a time; returns each one's time to first
/// body byte, µs. Reads every answer to its end.
async fn drive(
    client: &reqwest::Client,
    base: &str,
    n: usize,
    conc: usize,
    body: &(dyn Fn(usize) -> Value + Sync),
) -> Result<Vec<u64>, String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let url = format!("{base}/v1/chat/completions");
    let worker = || async {
        let mut v = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= n {
                return Ok::<_, String>(v);
            }
            let b = serde_json::to_vec(&body(i)).map_err(|e| e.to_string())?;
            let t0 = Instant::now();
            let mut r = client
                .post(&url)
                .header("content-type", "application/json")
                .header("x-session-id", format!("s{}", i % 64))
                .body(b)
                .send()
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            if !r.status().is_success() {
                let st = r.status();
                let t = r.text().await.unwrap_or_default();
                return Err(format!("{url} answered {st}: {t}"));
            }
            let first = r.chunk().await.map_err(|e| e.to_string())?;
            v.push(t0.elapsed().as_micros() as u64);
            if first.is_some() {
                while r.chunk().await.map_err(|e| e.to_string())?.is_some() {}
            }
        }
    };
    let results = futures_util::future::join_all((0..conc).map(|_| worker())).await;
    let mut all = Vec::with_capacity(n);
    for r in results {
        all.extend(r?);
    }
    Ok(all)
}
