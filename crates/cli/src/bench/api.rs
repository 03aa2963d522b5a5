//! `tessera bench api`: the control plane end to end. A real server on loopback
//! (embedded SQLite in a temporary folder, or PostgreSQL with `--postgres`), the
//! real batch scheduler loop, simulated nodes, and an in-process HTTP client that
//! submits jobs from `--concurrency` connections while a server-sent-events watch
//! records when each job is bound. Reports submissions and tasks per second, and
//! p50/p99 latency of the submit call and from submit to bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tessera_model::{Node, Resources};
use tessera_server::{AnyStore, PgStore, ServerConfig, SqliteStore};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Jobs to submit.
    #[arg(long, default_value_t = 2000)]
    pub jobs: usize,
    /// Tasks per job (a gang: all bound together).
    #[arg(long, default_value_t = 4)]
    pub tasks_per_job: usize,
    /// Concurrent client connections.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Simulated nodes (64 cores, 512 GiB, 10,000 pods each).
    #[arg(long, default_value_t = 50)]
    pub nodes: usize,
    /// Use PostgreSQL at this URL (a fresh schema, dropped afterwards).
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    backend: &'static str,
    jobs: usize,
    tasks_per_job: usize,
    concurrency: usize,
    nodes: usize,
    submit_seconds: f64,
    jobs_per_second: f64,
    tasks_per_second: f64,
    submit_p50_ms: f64,
    submit_p99_ms: f64,
    bound: usize,
    to_bound_p50_ms: f64,
    to_bound_p99_ms: f64,
    all_bound_seconds: f64,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    super::percentile(v, p).unwrap_or(f64::NAN)
}

pub fn run(a: Args) -> i32 {
    if a.jobs == 0 || a.tasks_per_job == 0 || a.concurrency == 0 || a.nodes == 0 {
        return fail(
            EXIT_BAD_INPUT,
            "--jobs, --tasks-per-job, --concurrency and --nodes must be at least 1",
        );
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")),
    };
    match rt.block_on(bench(&a)) {
        Ok(r) if a.json => print_json(&r),
        Ok(r) => {
            println!(
                "tessera bench api ({}; {} jobs x {} tasks, {} connections, {} nodes)",
                r.backend, r.jobs, r.tasks_per_job, r.concurrency, r.nodes
            );
            println!("{:<28} {:>12}", "metric", "value");
            println!("{:<28} {:>12.0}", "jobs/s submitted", r.jobs_per_second);
            println!("{:<28} {:>12.0}", "tasks/s submitted", r.tasks_per_second);
            println!("{:<28} {:>12.2}", "submit p50 (ms)", r.submit_p50_ms);
            println!("{:<28} {:>12.2}", "submit p99 (ms)", r.submit_p99_ms);
            println!(
                "{:<28} {:>12.1}",
                "submit->bound p50 (ms)", r.to_bound_p50_ms
            );
            println!(
                "{:<28} {:>12.1}",
                "submit->bound p99 (ms)", r.to_bound_p99_ms
            );
            println!(
                "{:<28} {:>12}",
                "jobs bound",
                format!("{}/{}", r.bound, r.jobs)
            );
            println!(
                "{:<28} {:>12.2}",
                "all bound after (s)", r.all_bound_seconds
            );
            0
        }
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

async fn bench(a: &Args) -> Result<Report, String> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp =
        std::env::temp_dir().join(format!("tessera-bench-api-{}-{stamp}", std::process::id()));
    let schema = format!("bench_{}_{}", std::process::id(), stamp % 1_000_000_007);
    let store: AnyStore = match &a.postgres {
        Some(url) => PgStore::connect_in_schema(url, Some(&schema))
            .await
            .map_err(|e| e.to_string())?
            .into(),
        None => SqliteStore::open(&tmp).map_err(|e| e.to_string())?.into(),
    };
    let backend = store.backend();
    let result = run_against(a, store, backend).await;
    match &a.postgres {
        Some(url) => {
            let _ = PgStore::drop_schema(url, &schema).await;
        }
        None => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    result
}

async fn run_against(a: &Args, store: AnyStore, backend: &'static str) -> Result<Report, String> {
    let running = tessera_server::start(
        store,
        ServerConfig {
            listen: "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?,
            register_local_node: false,
            schedule_period: Duration::from_millis(200),
            ..ServerConfig::default()
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let key = running
        .admin_key
        .clone()
        .ok_or("the fresh store printed no admin key")?;
    for i in 0..a.nodes {
        let mut r = Resources::new(64_000, 512 << 30);
        r.pods = 10_000;
        running
            .plane
            .upsert_node(&Node::new(format!("sim-{i:04}"), r))
            .await
            .map_err(|e| e.to_string())?;
    }
    let url = format!("http://{}", running.addr);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(a.concurrency)
        .build()
        .map_err(|e| e.to_string())?;
    let r = http
        .post(format!("{url}/v1/queues"))
        .bearer_auth(&key)
        .json(&json!({"name": "bench"}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("creating the queue: {}", r.status()));
    }

    // The watch: records when each job is first seen running.
    let bound_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut watch = http
        .get(format!("{url}/v1/watch?kind=job"))
        .bearer_auth(&key)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let watcher = {
        let bound_at = bound_at.clone();
        let total = a.jobs;
        tokio::spawn(async move {
            let mut buf = String::new();
            while let Ok(Some(chunk)) = watch.chunk().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let ev: String = buf.drain(..end + 2).collect();
                    let Some(data) = ev.lines().find_map(|l| l.strip_prefix("data:")) else {
                        continue;
                    };
                    let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
                        continue;
                    };
                    if v["status"]["phase"] == "running" {
                        let mut m = bound_at.lock().unwrap();
                        let name = v["name"].as_str().unwrap_or("").to_string();
                        m.entry(name).or_insert_with(Instant::now);
                        if m.len() >= total {
                            return;
                        }
                    }
                }
            }
        })
    };

    let next = Arc::new(AtomicUsize::new(0));
    let submitted: Arc<Mutex<HashMap<String, (Instant, f64)>>> = Arc::default();
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..a.concurrency {
        let (http, url, key, next, submitted) = (
            http.clone(),
            url.clone(),
            key.clone(),
            next.clone(),
            submitted.clone(),
        );
        let (jobs, tpj) = (a.jobs, a.tasks_per_job);
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return Ok::<(), String>(());
                }
                let name = format!("job-{i:06}");
                let tasks: Vec<Value> = (0..tpj)
                    .map(|t| json!({"name": format!("t{t}"), "resources": {"cpu_milli": 10, "memory": 1 << 20}}))
                    .collect();
                let body = json!({"name": name, "queue": "bench", "tasks": tasks});
                let t0 = Instant::now();
                let r = http
                    .post(format!("{url}/v1/jobs"))
                    .bearer_auth(&key)
                    .json(&body)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let ms = t0.elapsed().as_secs_f64() * 1000.0;
                if r.status() != reqwest::StatusCode::CREATED {
                    return Err(format!("submit {name}: {}", r.status()));
                }
                submitted.lock().unwrap().insert(name, (t0, ms));
            }
        }));
    }
    for w in workers {
        w.await.map_err(|e| e.to_string())??;
    }
    let submit_secs = start.elapsed().as_secs_f64();
    let _ = tokio::time::timeout(Duration::from_secs(120), watcher).await;
    let all_bound = start.elapsed().as_secs_f64();
    running.shutdown().await;

    let submitted = submitted.lock().unwrap();
    let bound_at = bound_at.lock().unwrap();
    let mut submit_ms: Vec<f64> = submitted.values().map(|(_, ms)| *ms).collect();
    let mut to_bound: Vec<f64> = submitted
        .iter()
        .filter_map(|(n, (t0, _))| {
            bound_at
                .get(n)
                .map(|b| b.saturating_duration_since(*t0).as_secs_f64() * 1000.0)
        })
        .collect();
    Ok(Report {
        backend,
        jobs: a.jobs,
        tasks_per_job: a.tasks_per_job,
        concurrency: a.concurrency,
        nodes: a.nodes,
        submit_seconds: submit_secs,
        jobs_per_second: a.jobs as f64 / submit_secs,
        tasks_per_second: (a.jobs * a.tasks_per_job) as f64 / submit_secs,
        submit_p50_ms: pct(&mut submit_ms, 0.5),
        submit_p99_ms: pct(&mut submit_ms, 0.99),
        bound: to_bound.len(),
        to_bound_p50_ms: pct(&mut to_bound, 0.5),
        to_bound_p99_ms: pct(&mut to_bound, 0.99),
        all_bound_seconds: all_bound,
    })
}
