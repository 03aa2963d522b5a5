//! The gateway's benchmark: overhead per tool call with the tool's own time
//! excluded, and ledger writes per second, on an embedded store in a scratch
//! folder and local HTTP tools (the counting service).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use tessera_store::{Key, SqliteStore, Store};

use super::testing::{CountingConfig, CountingService};
use super::{
    CallRequest, Completion, Grant, Status, ToolCaller, ToolGateway, ToolGatewayConfig, ToolSpec,
};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Calls measured per tool class.
    pub calls: usize,
    /// Calls in flight at once in the throughput phase.
    pub concurrency: usize,
    /// Where the scratch store goes (default: the system temp folder). Put it on
    /// the disk you want measured.
    pub dir: Option<PathBuf>,
    pub completion: Completion,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            calls: 2000,
            concurrency: 64,
            dir: None,
            completion: Completion::Background,
        }
    }
}

/// Overhead of one class of tool, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct ClassFigures {
    pub class: &'static str,
    /// Durable writes the reply waits for.
    pub writes_before_reply: u32,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

/// The results. `tool_overhead_*` are those of a side-effecting tool that does
/// not honour idempotency keys (the class that waits for one durable write).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub tool_overhead_p50_us: u64,
    pub tool_overhead_p99_us: u64,
    pub ledger_writes_per_sec: f64,
    pub calls_per_sec: f64,
    pub replay_p50_us: u64,
    pub replay_p99_us: u64,
    pub classes: Vec<ClassFigures>,
    pub calls: usize,
    pub concurrency: usize,
    pub store_dir: String,
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    match sorted.len().checked_sub(1) {
        None => 0,
        Some(last) => sorted[((last as f64 * p).round() as usize).min(last)],
    }
}

/// Runs the benchmark: sequential calls per class for latency, then
/// `concurrency` callers for throughput.
pub async fn bench(cfg: BenchConfig) -> Result<BenchReport, String> {
    let base = cfg.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("tessera-tools-bench-{}", super::random_hex(6)));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let r = run(&cfg, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    r
}

async fn run(cfg: &BenchConfig, dir: &std::path::Path) -> Result<BenchReport, String> {
    let store = SqliteStore::open(dir).map_err(|e| e.to_string())?;
    let gw = ToolGateway::new(
        store.clone(),
        ToolGatewayConfig {
            completion: cfg.completion,
            ..ToolGatewayConfig::default()
        },
    );
    let plain = CountingService::start(CountingConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let keyed = CountingService::start(CountingConfig {
        honour_keys: true,
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let tenant = "bench";
    let tools = [
        ("side-effect", "charge", plain.url(), false, false, 1u32),
        (
            "idempotency-key",
            "charge-keyed",
            keyed.url(),
            true,
            false,
            0,
        ),
        ("read-only", "lookup", plain.url(), false, true, 0),
    ];
    for (_, name, url, keys, ro, _) in &tools {
        let spec: ToolSpec = serde_json::from_value(json!({
            "name": name,
            "target": {"type": "http", "url": url},
            "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            "idempotency_keys": keys,
            "read_only": ro,
        }))
        .map_err(|e| e.to_string())?;
        gw.register(tenant, spec).await.map_err(|e| e.to_string())?;
        gw.set_grant(
            tenant,
            name,
            Grant {
                runtime: Some("bench".into()),
                role: None,
            },
            true,
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    store
        .create(
            Key::new(super::kind::SESSION, tenant, "s1"),
            json!({"id": "s1", "runtime": "bench", "state": "active"}),
        )
        .await
        .map_err(|e| e.to_string())?;
    let caller = ToolCaller {
        tenant: tenant.into(),
        subject: "session:s1".into(),
        role: "developer".into(),
    };
    let gw2 = gw.clone();
    let call = move |name: &'static str, id: String| {
        let gw = gw2.clone();
        let caller = caller.clone();
        async move {
            gw.call(
                &caller,
                name,
                CallRequest {
                    session_id: "s1".into(),
                    tool_call_id: id,
                    idempotency_key: None,
                    arguments: json!({"n": 1}),
                },
            )
            .await
        }
    };
    // Warm up connections and caches.
    for (_, name, ..) in tools.iter() {
        for i in 0..20 {
            call(name, format!("{name}-warm-{i}"))
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    let mut classes = Vec::new();
    let mut headline = (0, 0);
    for (class, name, _, _, _, writes) in &tools {
        let mut over = Vec::with_capacity(cfg.calls);
        for i in 0..cfg.calls {
            let o = call(name, format!("{name}-lat-{i}"))
                .await
                .map_err(|e| e.to_string())?;
            if o.status != Status::Completed {
                return Err(format!(
                    "call {i} of {name} ended {:?}: {:?}",
                    o.status, o.error
                ));
            }
            over.push(o.timing.total_us.saturating_sub(o.timing.tool_us));
        }
        over.sort_unstable();
        let f = ClassFigures {
            class,
            writes_before_reply: *writes + u32::from(cfg.completion == Completion::BeforeReply),
            p50_us: pct(&over, 0.5),
            p99_us: pct(&over, 0.99),
            max_us: *over.last().unwrap_or(&0),
        };
        if *class == "side-effect" {
            headline = (f.p50_us, f.p99_us);
        }
        classes.push(f);
    }
    // Replays: the same keys again.
    let mut rep = Vec::with_capacity(cfg.calls);
    gw.flush().await;
    for i in 0..cfg.calls {
        let o = call("charge", format!("charge-lat-{i}"))
            .await
            .map_err(|e| e.to_string())?;
        if !o.replayed {
            return Err(format!("call lat-{i} was sent again"));
        }
        rep.push(o.timing.total_us);
    }
    rep.sort_unstable();
    if plain.max_executions() > 1 {
        return Err("a call executed twice".into());
    }
    // Throughput of the side-effecting class: ledger writes per second.
    let before = gw.ledger_writes();
    let t = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let total = cfg.calls * 2;
    let mut workers = Vec::new();
    for _ in 0..cfg.concurrency.max(1) {
        let next = next.clone();
        let call = call.clone();
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return Ok::<(), String>(());
                }
                call("charge", format!("tp-{i}"))
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }));
    }
    for w in workers {
        w.await.map_err(|e| e.to_string())??;
    }
    gw.flush().await;
    let secs = t.elapsed().as_secs_f64().max(1e-9);
    let writes = gw.ledger_writes() - before;
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(BenchReport {
        tool_overhead_p50_us: headline.0,
        tool_overhead_p99_us: headline.1,
        ledger_writes_per_sec: writes as f64 / secs,
        calls_per_sec: total as f64 / secs,
        replay_p50_us: pct(&rep, 0.5),
        replay_p99_us: pct(&rep, 0.99),
        classes,
        calls: cfg.calls,
        concurrency: cfg.concurrency,
        store_dir: dir.display().to_string(),
    })
}
