//! End-to-end test of the agent platform with a real agent: a LangGraph graph
//! (from PyPI; a fake chat model from `langchain_core`) deployed as a runtime,
//! run in many sessions (`TESSERA_E2E_SESSIONS`, default 200;
//! `TESSERA_E2E_CONCURRENCY` at a time, default 16), each turn calling a
//! side-effecting tool (a local HTTP service that counts executions and
//! honours idempotency keys) and a read-only tool through the tool gateway,
//! while the test kills sandboxes (starting ones too) and `kill -9`s the
//! server at random moments and restarts it on the same store. Every session
//! completes every turn; each logical side-effecting call executed exactly
//! once; every ledger entry is completed (nothing lost, nothing in doubt);
//! the metered totals equal the sum of the usage records, with one tool fee
//! per logical charge.
//!
//! Where the time goes: an agent start is a Python process importing
//! LangGraph and langchain-core (about 1.2 s of CPU), so the test starts one
//! agent per session (plus one per kill) and keeps many sessions in flight;
//! a session's sandbox is released 2 s after its last turn.
//!
//! Needs `TESSERA_PYTHON` (a Python with langgraph, langchain-core, httpx and
//! ./clients/python, under /usr so sandboxes can run it; `.ci/run` makes one).
//! Skips with a reason only when it is unset and `CI` is unset.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use common::{Up, up_with};
use serde_json::{Value, json};

const AGENT: &str = include_str!("agents/graph_agent.py");
const TURNS: u64 = 3;

/// The side-effecting service: executions per logical call, one per
/// idempotency key (a repeated key gets the recorded reply, no execution).
#[derive(Default)]
struct Counter {
    executions: BTreeMap<String, u64>,
    by_key: BTreeMap<String, String>,
    lookups: u64,
}

fn serve_counter(counter: Arc<Mutex<Counter>>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(c.try_clone().unwrap());
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    return;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let (mut len, mut key) = (0usize, None);
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                        break;
                    }
                    let (k, v) = h.split_once(':').unwrap_or(("", ""));
                    match k.trim().to_ascii_lowercase().as_str() {
                        "content-length" => len = v.trim().parse().unwrap_or(0),
                        "idempotency-key" => key = Some(v.trim().to_string()),
                        _ => {}
                    }
                }
                let mut body = vec![0; len];
                // A request cut short (its sender killed mid-send) is not
                // executed, as by any HTTP service.
                let args: Value = match r
                    .read_exact(&mut body)
                    .ok()
                    .and_then(|_| serde_json::from_slice(&body).ok())
                {
                    Some(v) if line.ends_with("\r\n") => v,
                    _ => {
                        let _ = write!(
                            c,
                            "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                        return;
                    }
                };
                let call = args["call"].as_str().unwrap_or("").to_string();
                let reply = {
                    let mut g = counter.lock().unwrap();
                    if path == "/lookup" {
                        g.lookups += 1;
                        json!({"found": call})
                    } else {
                        let key = key.unwrap_or_else(|| format!("no-key-{call}"));
                        match g.by_key.get(&key) {
                            Some(id) => json!({"charge_id": id}),
                            None => {
                                *g.executions.entry(call.clone()).or_insert(0) += 1;
                                let id = format!("ch-{call}");
                                g.by_key.insert(key, id.clone());
                                json!({"charge_id": id})
                            }
                        }
                    }
                };
                let b = reply.to_string();
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                    b.len()
                );
            });
        }
    });
    port
}

fn python() -> Option<String> {
    match std::env::var("TESSERA_PYTHON") {
        Ok(p) if !p.is_empty() => {
            // Fail now, with the reason, rather than after every session's retries.
            let out = std::process::Command::new(&p)
                .args([
                    "-c",
                    "import langgraph.graph, langchain_core, httpx, tessera_client.langgraph",
                ])
                .output()
                .unwrap_or_else(|e| panic!("TESSERA_PYTHON={p:?} does not run: {e}"));
            assert!(
                out.status.success(),
                "TESSERA_PYTHON={p:?} lacks langgraph, langchain-core, httpx or ./clients/python (pip install them): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(p)
        }
        _ if std::env::var_os("CI").is_some() => {
            panic!("TESSERA_PYTHON must be set in CI (.ci/run makes the venv)")
        }
        _ => {
            eprintln!(
                "SKIP: TESSERA_PYTHON is not set (a Python with langgraph and ./clients/python)"
            );
            None
        }
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

struct Chaos {
    url: RwLock<String>,
    key: String,
}

fn start(data: &std::path::Path) -> Up {
    up_with(&[
        "--data",
        data.to_str().unwrap(),
        "--agent-ping-interval",
        "0.5",
        "--agent-pool-min",
        "4",
    ])
}

async fn call(
    http: &reqwest::Client,
    c: &Chaos,
    m: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Option<(u16, Value)> {
    let url = c.url.read().unwrap().clone();
    let mut r = http
        .request(m, format!("{url}{path}"))
        .bearer_auth(&c.key)
        .timeout(Duration::from_secs(120));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.ok()?;
    let st = resp.status().as_u16();
    let v = resp.json().await.unwrap_or(Value::Null);
    Some((st, v))
}

/// Runs one session's turns, each retried until answered (the server may be
/// down, the sandbox killed). Returns the last reply and the milliseconds to
/// the first answered invocation.
async fn run_session(
    http: &reqwest::Client,
    chaos: &Chaos,
    sid: &str,
    retries: &AtomicU64,
) -> (Value, f64) {
    let t0 = Instant::now();
    let mut first_ms = 0.0;
    let mut last = Value::Null;
    for turn in 0..TURNS {
        let mut attempts = 0;
        let mut backoff = Duration::from_millis(100);
        loop {
            attempts += 1;
            assert!(
                attempts < 300,
                "session {sid} turn {turn} never answered: {last}"
            );
            let path = format!("/v1/runtimes/graph/invocations?session_id={sid}");
            match call(
                http,
                chaos,
                reqwest::Method::POST,
                &path,
                Some(json!({"turn": turn, "use_tools": true})),
            )
            .await
            {
                Some((200, v)) => {
                    last = v;
                    break;
                }
                Some((_, v)) => last = v,
                None => {}
            }
            retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(1000));
        }
        if turn == 0 {
            first_ms = t0.elapsed().as_secs_f64() * 1e3;
        }
    }
    (last, first_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn langgraph_sessions_survive_sandbox_and_server_kills() {
    let Some(py) = python() else { return };
    let sessions = env_usize("TESSERA_E2E_SESSIONS", 200);
    let concurrency = env_usize("TESSERA_E2E_CONCURRENCY", 16).max(1);
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let counter = Arc::new(Mutex::new(Counter::default()));
    let port = serve_counter(counter.clone());
    let server = Arc::new(Mutex::new(start(dir.path())));
    let key = server
        .lock()
        .unwrap()
        .key
        .clone()
        .expect("first start prints the key");
    let chaos = Arc::new(Chaos {
        url: RwLock::new(server.lock().unwrap().url.clone()),
        key,
    });
    let http = reqwest::Client::new();
    use reqwest::Method as M;
    // The tools: a side-effecting one that honours idempotency keys (with a
    // fee) and a read-only one, both granted to the runtime.
    let charge = json!({"name": "charge", "target": {"type": "http", "url": format!("http://127.0.0.1:{port}/charge")},
        "input_schema": {"type": "object", "required": ["call"]}, "idempotency_keys": true, "fee": 0.01});
    let lookup = json!({"name": "lookup", "target": {"type": "http", "url": format!("http://127.0.0.1:{port}/lookup")},
        "input_schema": {"type": "object"}, "read_only": true});
    for t in [charge, lookup] {
        let (st, v) = call(&http, &chaos, M::POST, "/v1/tools", Some(t))
            .await
            .unwrap();
        assert_eq!(st, 201, "{v}");
    }
    for t in ["charge", "lookup"] {
        let (st, v) = call(
            &http,
            &chaos,
            M::POST,
            &format!("/v1/tools/{t}/grants"),
            Some(json!({"runtime": "graph"})),
        )
        .await
        .unwrap();
        assert!(st < 300, "{v}");
    }
    let (st, v) = call(&http, &chaos, M::POST, "/v1/runtimes", Some(json!({
        "name": "graph", "command": [py, "-c", AGENT], "resources": {"memory_mb": 512, "pids": 512},
        "idle_timeout_s": 2,
    }))).await.unwrap();
    assert_eq!(st, 201, "{v}");
    let t_setup = t0.elapsed();

    // Sessions, `concurrency` at a time.
    let done = Arc::new(Mutex::new(BTreeMap::<String, Value>::new()));
    let first_ms = Arc::new(Mutex::new(Vec::<f64>::new()));
    let retries = Arc::new(AtomicU64::new(0));
    let next = Arc::new(Mutex::new(0usize));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (http, chaos, done, next, first_ms, retries) = (
            http.clone(),
            chaos.clone(),
            done.clone(),
            next.clone(),
            first_ms.clone(),
            retries.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    if *n >= sessions {
                        return;
                    }
                    *n += 1;
                    *n - 1
                };
                let sid = format!("e2e-{i}");
                let (last, ms) = run_session(&http, &chaos, &sid, &retries).await;
                first_ms.lock().unwrap().push(ms);
                done.lock().unwrap().insert(sid, last);
            }
        }));
    }

    // Chaos: kill a sandbox (starting ones too) every 0.7-2 s, at most
    // sessions/5 of them spread over the run; kill -9 the server at about a
    // third and two thirds of the sessions.
    let max_sandbox_kills = (sessions / 5).max(4);
    let chaos_task = {
        let (http, chaos, done, server, dir) = (
            http.clone(),
            chaos.clone(),
            done.clone(),
            server.clone(),
            dir.path().to_path_buf(),
        );
        tokio::spawn(async move {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ t0.elapsed().as_nanos() as u64;
            let mut rnd = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let mut restarts = 0;
            let (mut sandbox_kills, mut starting_kills) = (0, 0);
            let mut last_report = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(700 + rnd() % 1300)).await;
                let n = done.lock().unwrap().len();
                if n >= sessions {
                    return (restarts, sandbox_kills, starting_kills);
                }
                if last_report.elapsed() >= Duration::from_secs(15) {
                    last_report = Instant::now();
                    eprintln!(
                        "e2e: {n}/{sessions} sessions done at {:.0} s; server kill -9 x{restarts}, sandboxes killed {sandbox_kills}",
                        t0.elapsed().as_secs_f64()
                    );
                }
                if (restarts == 0 && n * 3 >= sessions) || (restarts == 1 && n * 3 >= 2 * sessions)
                {
                    let t = Instant::now();
                    let mut s = server.lock().unwrap();
                    let pid = s.child.id();
                    std::process::Command::new("kill")
                        .args(["-9", &pid.to_string()])
                        .status()
                        .unwrap();
                    let _ = s.child.wait();
                    *s = start(&dir);
                    *chaos.url.write().unwrap() = s.url.clone();
                    restarts += 1;
                    eprintln!(
                        "e2e: server kill -9 and restart in {:.1} s at {n}/{sessions} sessions",
                        t.elapsed().as_secs_f64()
                    );
                    continue;
                }
                // Spread over the run: a few at once, then in step with progress.
                if sandbox_kills >= (4 + n * max_sandbox_kills / sessions).min(max_sandbox_kills) {
                    continue;
                }
                if let Some((200, v)) = call(
                    &http,
                    &chaos,
                    reqwest::Method::GET,
                    "/v1/sessions?state=starting,active",
                    None,
                )
                .await
                {
                    let items = v["items"].as_array().cloned().unwrap_or_default();
                    if items.is_empty() {
                        continue;
                    }
                    let s = &items[(rnd() as usize) % items.len()];
                    if let Some(pid) = s["sandbox_pid"].as_i64() {
                        let _ = std::process::Command::new("kill")
                            .args(["-9", &pid.to_string()])
                            .status();
                        sandbox_kills += 1;
                        if s["state"] == "starting" {
                            starting_kills += 1;
                        }
                    }
                }
            }
        })
    };
    for w in workers {
        w.await.unwrap();
    }
    let (restarts, sandbox_kills, starting_kills) = chaos_task.await.unwrap();
    let elapsed = t0.elapsed();

    // How the time went: agent starts per session, first-invocation latency.
    let (st, v) = call(&http, &chaos, M::GET, "/v1/sessions?runtime=graph", None)
        .await
        .unwrap();
    assert_eq!(st, 200, "{v}");
    let listed = v["items"].as_array().cloned().unwrap_or_default();
    let starts: u64 = listed.iter().filter_map(|s| s["starts"].as_u64()).sum();
    let mut firsts = first_ms.lock().unwrap().clone();
    firsts.sort_by(f64::total_cmp);
    let pct = |p: f64| firsts[((firsts.len() - 1) as f64 * p) as usize];
    eprintln!(
        "e2e: {sessions} sessions x {TURNS} turns, {concurrency} at a time, in {:.0} s (setup {:.1} s); \
         server kill -9 x{restarts}, sandboxes killed {sandbox_kills} ({starting_kills} starting); \
         agent starts {starts} ({:.2} per session); invocation retries {}; \
         first invocation answered p50 {:.0} ms, p90 {:.0} ms, max {:.0} ms",
        elapsed.as_secs_f64(),
        t_setup.as_secs_f64(),
        starts as f64 / sessions as f64,
        retries.load(Ordering::Relaxed),
        pct(0.5),
        pct(0.9),
        pct(1.0),
    );

    // Every session completed every turn, and its checkpointed state holds
    // every turn's charge (nothing lost across restarts).
    let done = done.lock().unwrap().clone();
    assert_eq!(done.len(), sessions);
    for (sid, v) in &done {
        assert_eq!(v["turns_done"], TURNS, "session {sid}: {v}");
        for turn in 0..TURNS {
            assert_eq!(
                v["charges"][turn.to_string()],
                format!("ch-{sid}-turn{turn}"),
                "session {sid}: {v}"
            );
        }
    }
    // Each logical side-effecting call executed exactly once.
    {
        let c = counter.lock().unwrap();
        for i in 0..sessions {
            for turn in 0..TURNS {
                let call = format!("e2e-{i}-turn{turn}");
                assert_eq!(
                    c.executions.get(&call).copied(),
                    Some(1),
                    "{call} executions"
                );
            }
        }
        assert_eq!(
            c.executions.len(),
            sessions * TURNS as usize,
            "no stray executions"
        );
        assert!(c.lookups >= sessions as u64 * TURNS);
    }
    // The ledger: one completed entry per logical call (charge and lookup),
    // none dispatched, failed or in doubt.
    let (st, v) = call(&http, &chaos, M::GET, "/v1/ledger", None)
        .await
        .unwrap();
    assert_eq!(st, 200, "{v}");
    let entries = v["items"].as_array().cloned().unwrap_or_default();
    let mut per_tool = BTreeMap::<String, usize>::new();
    for e in &entries {
        assert_eq!(e["state"], "completed", "ledger entry {e}");
        *per_tool
            .entry(e["tool"].as_str().unwrap_or("").to_string())
            .or_default() += 1;
    }
    assert_eq!(per_tool.get("charge"), Some(&(sessions * TURNS as usize)));
    assert_eq!(per_tool.get("lookup"), Some(&(sessions * TURNS as usize)));

    // Metered totals equal the sum of the usage records; one tool fee per
    // logical charge; every answered invocation metered.
    // Sandboxes are metered (their CPU) when they are released, which goes on
    // after the sessions answered; the records and the totals are separate
    // reads, so a record can land between them. Read until two reads agree.
    // (At most 60 reads: metering that never settles fails below.)
    let mut last: Option<Value> = None;
    let mut reads = 0;
    let v = loop {
        let (st, v) = call(&http, &chaos, M::GET, "/v1/usage?records=true", None)
            .await
            .unwrap();
        assert_eq!(st, 200, "{v}");
        reads += 1;
        if last.as_ref() == Some(&v) || reads >= 60 {
            break v;
        }
        last = Some(v);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let records = v["records"].as_array().unwrap();
    let sum: f64 = records.iter().map(|r| r["cost"].as_f64().unwrap()).sum();
    let total = v["tenant_totals"]["cost"].as_f64().unwrap();
    assert!(
        (sum - total).abs() < 1e-6,
        "records sum {sum} != totals {total}"
    );
    assert_eq!(
        v["tenant_totals"]["records"].as_u64().unwrap() as usize,
        records.len()
    );
    let sandbox_cpu: f64 = records
        .iter()
        .filter(|r| r["kind"] == "cpu_seconds")
        .map(|r| r["quantity"].as_f64().unwrap())
        .sum();
    let server_cpu = {
        let pid = server.lock().unwrap().child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // After the command's ")": field 3 (state) onwards; utime and stime
        // are fields 14 and 15, in clock ticks (100 per second here).
        let f: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok());
        tick(11).zip(tick(12)).map(|(u, s)| (u + s) / 100.0)
    };
    eprintln!(
        "e2e: CPU: agents in the sandboxes released so far {sandbox_cpu:.0} s (metered); the last server process {server_cpu:?} s"
    );
    let fees = records.iter().filter(|r| r["kind"] == "tool_fee").count();
    assert_eq!(fees, sessions * TURNS as usize, "one tool fee per charge");
    let tokens: f64 = records
        .iter()
        .filter(|r| r["kind"] == "tokens_in")
        .map(|r| r["quantity"].as_f64().unwrap())
        .sum();
    assert!(
        tokens >= (sessions as u64 * TURNS * 7) as f64,
        "every answered invocation metered"
    );
}
