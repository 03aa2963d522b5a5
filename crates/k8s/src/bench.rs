//! `tessera bench k8s`: pods bound per second against a real apiserver with
//! fake nodes, in two runs:
//!
//! * **end to end**: the controller runs while the pods are created (with
//!   bounded concurrency); pods/s is pods over the time from the first create to
//!   the last binding seen by a watch, and latency is created (the create call
//!   answered) to bound (the watch shows `nodeName`).
//! * **binding only**: every pod is created first, then a fresh controller starts
//!   (initial lists included); pods/s is pods over the time from its start to the
//!   last binding. This is the scheduler's own rate, without the harness's
//!   creation rate in the way.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, stream};
use k8s_openapi::api::core::v1 as core;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::controller::{Metrics, RunConfig};
use crate::testenv::{fake_node, fake_pod};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub nodes: usize,
    pub pods: usize,
    /// Writes in flight at once, in the controller.
    pub concurrency: usize,
    /// Creates in flight at once, in the harness.
    pub create_concurrency: usize,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    pub mode: &'static str,
    pub pods: usize,
    pub bound: usize,
    pub seconds: f64,
    pub pods_per_sec: f64,
    /// Created-to-bound latency (end to end only; start-to-bound otherwise).
    pub bind_p50_ms: f64,
    pub bind_p99_ms: f64,
    /// Pods created per second by the harness.
    pub create_per_sec: f64,
    pub cycles: u64,
    pub decide_ms: f64,
    pub apply_ms: f64,
}

/// The benchmark's result (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub nodes: usize,
    pub pods: usize,
    /// End-to-end pods per second (the headline figure).
    pub pods_per_sec: f64,
    /// End-to-end created-to-bound p99.
    pub bind_p99_ms: f64,
    /// Binding-only pods per second.
    pub bind_only_pods_per_sec: f64,
    pub node_create_per_sec: f64,
    pub runs: Vec<RunFigures>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn create_pods(
    client: &Client,
    ns: &str,
    scheduler: &str,
    n: usize,
    conc: usize,
    created: Arc<Mutex<HashMap<String, Instant>>>,
) -> Result<f64, String> {
    let api: Api<core::Pod> = Api::namespaced(client.clone(), ns);
    let t = Instant::now();
    let errs: Vec<String> = stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let created = created.clone();
            let name = format!("p{i:06}");
            let pod = fake_pod(ns, &name, scheduler, "100m", "128Mi");
            async move {
                match api.create(&PostParams::default(), &pod).await {
                    Ok(_) => {
                        created.lock().await.insert(name, Instant::now());
                        None
                    }
                    Err(e) => Some(format!("creating pod {name}: {e}")),
                }
            }
        })
        .buffer_unordered(conc.max(1))
        .filter_map(|e| async move { e })
        .collect()
        .await;
    if let Some(e) = errs.first() {
        return Err(e.clone());
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Watches `ns` and records when each pod is first seen bound.
fn watch_bound(
    client: &Client,
    ns: &str,
    bound: Arc<Mutex<HashMap<String, Instant>>>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<core::Pod> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let mut s = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = s.next().await {
            let pods = match ev {
                Ok(Event::Apply(p) | Event::InitApply(p)) => vec![p],
                _ => continue,
            };
            for p in pods {
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                    let now = Instant::now();
                    let name = p.metadata.name.clone().unwrap_or_default();
                    bound.lock().await.entry(name).or_insert(now);
                }
            }
        }
    })
}

async fn wait_bound(
    bound: &Arc<Mutex<HashMap<String, Instant>>>,
    n: usize,
    limit: Duration,
) -> usize {
    let start = Instant::now();
    loop {
        let have = bound.lock().await.len();
        if have >= n || start.elapsed() > limit {
            return have;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn controller(
    client: &Client,
    scheduler: &str,
    concurrency: usize,
) -> (
    Arc<Metrics>,
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Result<(), crate::RunError>>,
) {
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = tokio::sync::watch::channel(false);
    let cfg = RunConfig {
        scheduler_name: scheduler.into(),
        concurrency,
        events: true,
        ..RunConfig::default()
    };
    let h = tokio::spawn(crate::controller::run(
        client.clone(),
        cfg,
        metrics.clone(),
        rx,
    ));
    (metrics, tx, h)
}

fn figures(
    mode: &'static str,
    pods: usize,
    start: Instant,
    created: &HashMap<String, Instant>,
    bound: &HashMap<String, Instant>,
    create_per_sec: f64,
    m: &Metrics,
) -> RunFigures {
    let last = bound.values().max().copied().unwrap_or(start);
    let seconds = last.duration_since(start).as_secs_f64().max(1e-9);
    let mut lat: Vec<f64> = bound
        .iter()
        .map(|(k, b)| {
            let c = created.get(k).copied().unwrap_or(start);
            b.saturating_duration_since(c).as_secs_f64() * 1000.0
        })
        .collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    RunFigures {
        mode,
        pods,
        bound: bound.len(),
        seconds,
        pods_per_sec: bound.len() as f64 / seconds,
        bind_p50_ms: pct(&lat, 0.5),
        bind_p99_ms: pct(&lat, 0.99),
        create_per_sec,
        cycles: m.cycles.load(Relaxed),
        decide_ms: m.decide_us.load(Relaxed) as f64 / 1000.0,
        apply_ms: m.apply_us.load(Relaxed) as f64 / 1000.0,
    }
}

/// Runs both measurements against `client` (an empty cluster: the benchmark
/// creates its own nodes and namespaces).
pub async fn run(client: Client, o: &BenchOptions) -> Result<BenchResult, String> {
    let nodes: Api<core::Node> = Api::all(client.clone());
    let t = Instant::now();
    let errs: Vec<String> = stream::iter(0..o.nodes)
        .map(|i| {
            let nodes = nodes.clone();
            let n = fake_node(
                &format!("bench-{i:05}"),
                "32",
                "128Gi",
                0,
                &[("bench", "k8s")],
            );
            async move {
                match nodes.create(&PostParams::default(), &n).await {
                    Ok(_) => None,
                    Err(kube::Error::Api(s)) if s.code == 409 => None,
                    Err(e) => Some(format!("creating node bench-{i:05}: {e}")),
                }
            }
        })
        .buffer_unordered(o.create_concurrency.max(1))
        .filter_map(|e| async move { e })
        .collect()
        .await;
    if let Some(e) = errs.first() {
        return Err(e.clone());
    }
    let node_create_per_sec = o.nodes as f64 / t.elapsed().as_secs_f64();
    let namespaces: Api<core::Namespace> = Api::all(client.clone());
    for ns in ["bench-e2e", "bench-bind"] {
        let obj: core::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
                .map_err(|e| e.to_string())?;
        match namespaces.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(format!("creating namespace {ns}: {e}")),
        }
    }
    let limit = Duration::from_secs(600);
    let mut runs = Vec::new();

    // End to end.
    {
        let (metrics, stop, h) = controller(&client, "tessera-bench-e2e", o.concurrency);
        let wait = Instant::now();
        while !metrics.ready.load(Relaxed) {
            if wait.elapsed() > Duration::from_secs(120) {
                return Err("the controller did not become ready in 120 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let created = Arc::new(Mutex::new(HashMap::new()));
        let bound = Arc::new(Mutex::new(HashMap::new()));
        let w = watch_bound(&client, "bench-e2e", bound.clone());
        let start = Instant::now();
        let cps = create_pods(
            &client,
            "bench-e2e",
            "tessera-bench-e2e",
            o.pods,
            o.create_concurrency,
            created.clone(),
        )
        .await?;
        wait_bound(&bound, o.pods, limit).await;
        let _ = stop.send(true);
        let _ = h.await;
        w.abort();
        let (c, b) = (created.lock().await, bound.lock().await);
        runs.push(figures("end-to-end", o.pods, start, &c, &b, cps, &metrics));
    }

    // Binding only: create everything, then start the controller.
    {
        let created = Arc::new(Mutex::new(HashMap::new()));
        let cps = create_pods(
            &client,
            "bench-bind",
            "tessera-bench-bind",
            o.pods,
            o.create_concurrency,
            created.clone(),
        )
        .await?;
        let bound = Arc::new(Mutex::new(HashMap::new()));
        let w = watch_bound(&client, "bench-bind", bound.clone());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let start = Instant::now();
        let (metrics, stop, h) = controller(&client, "tessera-bench-bind", o.concurrency);
        wait_bound(&bound, o.pods, limit).await;
        let _ = stop.send(true);
        let _ = h.await;
        w.abort();
        // Latency here is start-to-bound: every pod existed before the start.
        let starts: HashMap<String, Instant> = bound
            .lock()
            .await
            .keys()
            .map(|k| (k.clone(), start))
            .collect();
        let b = bound.lock().await;
        runs.push(figures(
            "binding-only",
            o.pods,
            start,
            &starts,
            &b,
            cps,
            &metrics,
        ));
    }
    Ok(BenchResult {
        nodes: o.nodes,
        pods: o.pods,
        pods_per_sec: runs[0].pods_per_sec,
        bind_p99_ms: runs[0].bind_p99_ms,
        bind_only_pods_per_sec: runs[1].pods_per_sec,
        node_create_per_sec,
        runs,
    })
}
