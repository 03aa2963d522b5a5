//! `tessera bench node`: the node runtime on this machine. Per-task start overhead
//! side by side with a plain `fork+exec` of the same command and eviction latency
//! (from `tessera_node::bench`), then jobs per second through a real server on
//! loopback with this machine as its node: submit → task running in its sandbox,
//! and submit → job succeeded. Needs root (sandboxes with cgroups).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tessera_server::{ServerConfig, SqliteStore};
use tessera_store::{Store, WatchFilter};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Runs of each start and eviction measure.
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// Jobs (one task each, `true`) submitted through the server; 0 skips that part.
    #[arg(long, default_value_t = 200)]
    pub jobs: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Jobs {
    jobs: usize,
    /// Jobs per second from the first submit to the last task running.
    running_per_second: f64,
    /// Jobs per second from the first submit to the last job succeeded.
    completed_per_second: f64,
    submit_to_running: tessera_node::bench::Stat,
    submit_to_succeeded: tessera_node::bench::Stat,
}

#[derive(Debug, Serialize)]
struct Report {
    runtime: tessera_node::bench::Report,
    #[serde(skip_serializing_if = "Option::is_none")]
    jobs: Option<Jobs>,
}

fn stat(mut v: Vec<f64>) -> tessera_node::bench::Stat {
    v.sort_by(f64::total_cmp);
    let p = |q| super::percentile(&v, q).unwrap_or(f64::NAN);
    tessera_node::bench::Stat {
        p50_ms: p(0.5),
        p99_ms: p(0.99),
        max_ms: v.last().copied().unwrap_or(f64::NAN),
    }
}

pub fn run(a: Args) -> i32 {
    if a.runs == 0 {
        return fail(EXIT_BAD_INPUT, "--runs must be at least 1");
    }
    let mut node = tessera_node::NodeConfig::new("bench");
    node.init = crate::cmd::sandbox::init_program();
    node.gpus = std::sync::Arc::new(tessera_node::gpu::FakeSource(vec![]));
    let runtime = match tessera_node::bench::run(tessera_node::bench::Config {
        runs: a.runs,
        command: vec!["true".into()],
        node,
    }) {
        Ok(r) => r,
        Err(e) => return fail(EXIT_FAILURE, format!("bench node: {e} (it needs root)")),
    };
    let jobs = if a.jobs == 0 {
        None
    } else {
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => return fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")),
        };
        match rt.block_on(jobs(a.jobs)) {
            Ok(j) => Some(j),
            Err(e) => return fail(EXIT_FAILURE, format!("bench node: {e}")),
        }
    };
    let r = Report { runtime, jobs };
    if a.json {
        return print_json(&r);
    }
    let row = |name: &str, s: &tessera_node::bench::Stat| {
        println!(
            "{name:<34} {:>9.2} {:>9.2} {:>9.2}",
            s.p50_ms, s.p99_ms, s.max_ms
        )
    };
    println!(
        "node runtime, {} runs each, cgroups {}, command `{}`",
        r.runtime.runs,
        r.runtime.cgroups.as_deref().unwrap_or("none"),
        r.runtime.command
    );
    println!(
        "{:<34} {:>9} {:>9} {:>9}",
        "measure", "p50_ms", "p99_ms", "max_ms"
    );
    row("plain fork+exec, run to exit", &r.runtime.plain_run);
    row("sandboxed start call", &r.runtime.sandboxed_start);
    row("sandboxed, start to end reported", &r.runtime.sandboxed_run);
    row("eviction, grace 0 s (tree gone)", &r.runtime.eviction_0s);
    row("eviction, SIGTERM handled", &r.runtime.eviction_sigterm);
    if let Some(j) = &r.jobs {
        println!();
        println!(
            "{} jobs through the server: {:.1} jobs/s to running, {:.1} jobs/s to succeeded",
            j.jobs, j.running_per_second, j.completed_per_second
        );
        row("submit to task running", &j.submit_to_running);
        row("submit to job succeeded", &j.submit_to_succeeded);
    }
    0
}

async fn jobs(n: usize) -> Result<Jobs, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = SqliteStore::open(dir.path().join("data")).map_err(|e| e.to_string())?;
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        schedule_period: Duration::from_millis(100),
        executor_logs: Some(dir.path().join("logs")),
        node: tessera_server::NodeSettings {
            init: crate::cmd::sandbox::init_program(),
            data_dir: Some(dir.path().join("data")),
            gpus: Some(std::sync::Arc::new(tessera_node::gpu::FakeSource(vec![]))),
            ..Default::default()
        },
        ..ServerConfig::default()
    };
    let running = tessera_server::start(store.into(), cfg)
        .await
        .map_err(|e| e.to_string())?;
    let key = running.admin_key.clone().ok_or("no admin key")?;
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(&key)
            .json(&body)
            .send()
    };
    post("/v1/queues", json!({"name": "bench"}))
        .await
        .map_err(|e| e.to_string())?;
    let st = running.plane.store().clone();
    let rev = st.revision().await.map_err(|e| e.to_string())?;
    let mut w = st.watch(
        rev,
        WatchFilter {
            kind: Some("job".into()),
            tenant: None,
        },
    );
    let t0 = Instant::now();
    let mut submitted: HashMap<String, Instant> = HashMap::new();
    for i in 0..n {
        let name = format!("b{i}");
        submitted.insert(name.clone(), Instant::now());
        let r = post(
            "/v1/jobs",
            json!({"name": name, "queue": "bench", "tasks": [{"name": "t", "command": ["true"],
                   "resources": {"cpu_milli": 10, "memory": 67108864}}]}),
        )
        .await
        .map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("submit: {}", r.text().await.unwrap_or_default()));
        }
    }
    let (mut to_run, mut to_done) = (HashMap::new(), HashMap::new());
    let deadline = Instant::now() + Duration::from_secs(600);
    while to_done.len() < n && Instant::now() < deadline {
        let Ok(Ok(changes)) = tokio::time::timeout(Duration::from_secs(5), w.next()).await else {
            continue;
        };
        let now = Instant::now();
        for c in changes {
            let b = &c.object.body;
            let name = c.object.name.clone();
            if b["status"]["tasks"]["t"]["state"].is_string() {
                to_run.entry(name.clone()).or_insert(now);
            }
            match b["status"]["phase"].as_str() {
                Some("succeeded") => {
                    to_done.entry(name).or_insert(now);
                }
                Some("failed") => {
                    return Err(format!("job {name} failed: {}", b["status"]));
                }
                _ => {}
            }
        }
    }
    running.shutdown().await;
    if to_done.len() < n {
        return Err(format!(
            "only {} of {n} jobs finished in 10 minutes",
            to_done.len()
        ));
    }
    let last = |m: &HashMap<String, Instant>| {
        m.values()
            .max()
            .map(|t| (*t - t0).as_secs_f64())
            .unwrap_or(f64::NAN)
    };
    let lat = |m: &HashMap<String, Instant>| {
        stat(
            m.iter()
                .filter_map(|(k, t)| submitted.get(k).map(|s| (*t - *s).as_secs_f64() * 1000.0))
                .collect(),
        )
    };
    Ok(Jobs {
        jobs: n,
        running_per_second: n as f64 / last(&to_run),
        completed_per_second: n as f64 / last(&to_done),
        submit_to_running: lat(&to_run),
        submit_to_succeeded: lat(&to_done),
    })
}
