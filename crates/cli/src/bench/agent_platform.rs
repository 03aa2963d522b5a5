//! `tessera bench agent-platform`: new session to first invocation answered
//! (warm pool primed for the runtime's template), and the tool gateway's
//! overhead per call and ledger writes per second (measured by
//! `tessera_agent::tools`). Needs root for sandboxes (user-namespace id
//! ranges and cgroups) and `python3` for the benchmark's agent.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use tessera_agent::host::{Host, HostConfig};
use tessera_agent::runtimes::{self, Quotas, RuntimeSpec};
use tessera_store::{AnyStore, SqliteStore};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sessions started (each measured from invocation to answer, then killed).
    #[arg(long, default_value_t = 50)]
    pub sessions: usize,
    /// Warm sandboxes kept ready.
    #[arg(long, default_value_t = 4)]
    pub pool: usize,
    /// Tool calls measured per tool class.
    #[arg(long, default_value_t = 2000)]
    pub calls: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    sessions: usize,
    cores: usize,
    session_first_invoke_p50_ms: f64,
    session_first_invoke_p99_ms: f64,
    session_first_invoke_min_ms: f64,
    /// Invocation of a session that already has its agent running.
    warm_invoke_p50_ms: f64,
    warm_invoke_p99_ms: f64,
    pool_misses: u64,
    tool_overhead_p50_us: Option<u64>,
    tool_overhead_p99_us: Option<u64>,
    ledger_writes_per_sec: Option<f64>,
    tools: serde_json::Value,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    super::percentile(v, p).unwrap_or(f64::NAN)
}

pub fn run(a: Args) -> i32 {
    if a.sessions == 0 || a.pool == 0 {
        return fail(EXIT_BAD_INPUT, "--sessions and --pool must be at least 1");
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
            let opt = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
            println!(
                "tessera bench agent-platform ({} sessions, pool {}, {} cores)",
                r.sessions, a.pool, r.cores
            );
            println!("{:<40} {:>12}", "metric", "value");
            println!(
                "{:<40} {:>12.1}",
                "new session -> first answer p50 (ms)", r.session_first_invoke_p50_ms
            );
            println!(
                "{:<40} {:>12.1}",
                "new session -> first answer p99 (ms)", r.session_first_invoke_p99_ms
            );
            println!(
                "{:<40} {:>12.1}",
                "new session -> first answer min (ms)", r.session_first_invoke_min_ms
            );
            println!(
                "{:<40} {:>12.2}",
                "warm invocation p50 (ms)", r.warm_invoke_p50_ms
            );
            println!(
                "{:<40} {:>12.2}",
                "warm invocation p99 (ms)", r.warm_invoke_p99_ms
            );
            println!("{:<40} {:>12}", "warm-pool misses", r.pool_misses);
            println!(
                "{:<40} {:>12}",
                "tool overhead p50 (us)",
                opt(r.tool_overhead_p50_us)
            );
            println!(
                "{:<40} {:>12}",
                "tool overhead p99 (us)",
                opt(r.tool_overhead_p99_us)
            );
            println!(
                "{:<40} {:>12}",
                "ledger writes/s",
                r.ledger_writes_per_sec
                    .map(|x| format!("{x:.0}"))
                    .unwrap_or_else(|| "-".into())
            );
            0
        }
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

async fn bench(a: &Args) -> Result<Report, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("cannot make a scratch folder: {e}"))?;
    let store: AnyStore = SqliteStore::open(dir.path())
        .map_err(|e| e.to_string())?
        .into();
    let host = Host::new(
        store.clone(),
        HostConfig {
            init: crate::cmd::sandbox::init_program(),
            pool_min: a.pool,
            ..HostConfig::default()
        },
        None,
    );
    let spec: RuntimeSpec = serde_json::from_value(json!({
        "command": ["python3", "-c", tessera_agent::ECHO_AGENT_PY],
        "resources": {"memory_mb": 256},
    }))
    .map_err(|e| e.to_string())?;
    runtimes::create(&store, "bench", "echo", spec.clone(), Quotas::default(), 0)
        .await
        .map_err(|e| e.to_string())?;
    host.prime("bench", &spec).map_err(|e| e.to_string())?;
    let ready = |h: &Host| {
        h.pool_stats("bench")
            .iter()
            .map(|(_, p)| p.ready)
            .sum::<usize>()
    };
    let wait_ready = async |n: usize| {
        let t = Instant::now();
        while ready(&host) < n && t.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    wait_ready(a.pool).await;
    let misses0: u64 = host.pool_stats("bench").iter().map(|(_, p)| p.misses).sum();
    let mut first = Vec::new();
    let mut warm = Vec::new();
    for i in 0..a.sessions {
        // Measure hand-overs, not refills: wait for a ready sandbox first.
        wait_ready(1).await;
        let sid = format!("b{i}");
        let t = Instant::now();
        host.invoke("bench", "echo", None, &sid, b"{}", "application/json")
            .await
            .map_err(|e| e.to_string())?;
        first.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        host.invoke("bench", "echo", None, &sid, b"{}", "application/json")
            .await
            .map_err(|e| e.to_string())?;
        warm.push(t.elapsed().as_secs_f64() * 1e3);
        host.kill("bench", &sid, "benchmark done")
            .await
            .map_err(|e| e.to_string())?;
    }
    let misses: u64 = host
        .pool_stats("bench")
        .iter()
        .map(|(_, p)| p.misses)
        .sum::<u64>()
        - misses0;
    host.shutdown().await;
    let tools = tools_figures(a.calls).await;
    let get_u = |k: &str| tools.get(k).and_then(serde_json::Value::as_u64);
    Ok(Report {
        sessions: a.sessions,
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        session_first_invoke_p50_ms: pct(&mut first, 0.5),
        session_first_invoke_p99_ms: pct(&mut first, 0.99),
        session_first_invoke_min_ms: first.iter().copied().fold(f64::INFINITY, f64::min),
        warm_invoke_p50_ms: pct(&mut warm, 0.5),
        warm_invoke_p99_ms: pct(&mut warm, 0.99),
        pool_misses: misses,
        tool_overhead_p50_us: get_u("tool_overhead_p50_us"),
        tool_overhead_p99_us: get_u("tool_overhead_p99_us"),
        ledger_writes_per_sec: tools
            .get("ledger_writes_per_sec")
            .and_then(serde_json::Value::as_f64),
        tools,
    })
}

/// The tool gateway's figures (overhead per call, ledger writes per second).
async fn tools_figures(calls: usize) -> serde_json::Value {
    let cfg = tessera_agent::tools::bench::BenchConfig {
        calls,
        ..Default::default()
    };
    match tessera_agent::tools::bench::bench(cfg).await {
        Ok(r) => serde_json::to_value(r).unwrap_or_default(),
        Err(e) => serde_json::json!({ "error": e }),
    }
}
