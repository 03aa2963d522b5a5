//! The console (issue 23) in a real headless Chromium, driven over WebDriver
//! (chromedriver + `fantoccini`), against `tessera up --cluster` with simulated
//! nodes (`tests/console/cluster.yaml`) and a known allocation:
//!
//! - tenant `alpha`: a 2+4-GPU job pinned to `big-0`/`big-1`, a MIG task (one
//!   `3g.40gb` instance on `mig-0`), a quarter of a GPU on `share-0`, and a queued
//!   8-GPU training gang that fits nowhere, so the scheduler holds `big-0` for it
//!   (the node closest to fitting) and the gang shows why it waits;
//! - tenant `beta`: a 4-GPU job on an H100 node;
//! - a session `s1` of an echo agent with an `invoke_agent`, a `chat` (through the
//!   inference pool) and an `execute_tool` span and a ledger entry; a sandbox; an
//!   inference pool in front of a mock engine.
//!
//! Each view renders that data; the heat map shows the MIG instance, the fraction
//! and the reservation in their cells; the pending job's reason is shown; the
//! waterfall has its spans in order; beta sees none of alpha's names; a system admin
//! views alpha read-only; an update reaches the page through the watch without a
//! reload; the `#key=` fragment is moved to session storage and cleared. A PNG per
//! view is written under `target/tmp/console/` and checked not blank. Keyboard
//! navigation and text contrast pass axe-core 4.14.1 (vendored under
//! `tests/vendor/`, MPL-2.0, loaded into the page by the test only) with the WCAG 2
//! A/AA rules, and a keyboard walk of our own (Tab through the navigation, arrows
//! and Enter on the heat map, a visible focus ring).
//!
//! Skips with a message when Chromium or chromedriver is missing (`apt-get install
//! chromium chromium-driver`), and fails then when `CI` is set. The session part
//! needs sandboxes (root and `tessera-sandbox-init` next to the binary, as `cargo
//! test --workspace` builds it); without them it is skipped with a message, failed
//! under `CI`.

#[path = "../src/bench/browser.rs"]
mod browser;
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use browser::Browser;
use common::{Up, up_with};
use serde_json::{Value, json};

const AGENT: &str = include_str!("../../agent/tests/agents/echo_agent.py");
const AXE: &str = include_str!("vendor/axe-core-4.14.1/axe.min.js");
const MODEL: &str = "tiny-chat";
const WAIT: Duration = Duration::from_secs(20);

fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

fn have_browser() -> bool {
    match browser::tools() {
        Ok(_) => true,
        Err(e) if ci() => panic!("{e} (CI is set: the console's browser tests must run)"),
        Err(e) => {
            eprintln!("SKIP: {e}");
            false
        }
    }
}

fn artefacts() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Api {
    http: reqwest::Client,
    url: String,
}

impl Api {
    async fn call(
        &self,
        key: &str,
        m: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = self
            .http
            .request(m, format!("{}{path}", self.url))
            .bearer_auth(key)
            .timeout(Duration::from_secs(60));
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let st = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            st,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
    async fn get(&self, key: &str, path: &str) -> Value {
        let (st, v) = self.call(key, reqwest::Method::GET, path, None).await;
        assert_eq!(st, 200, "GET {path}: {v}");
        v
    }
    async fn post(&self, key: &str, path: &str, body: Value) -> Value {
        let (st, v) = self
            .call(key, reqwest::Method::POST, path, Some(body))
            .await;
        assert!((200..300).contains(&st), "POST {path}: {st} {v}");
        v
    }
    /// Polls `path` until `f` accepts it.
    async fn until(&self, key: &str, path: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let t0 = Instant::now();
        loop {
            let v = self.get(key, path).await;
            if f(&v) {
                return v;
            }
            assert!(t0.elapsed() < WAIT, "timed out waiting for {what}: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A tiny HTTP tool: answers every POST with `{"ok": true}`.
fn serve_tool() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut len = 0usize;
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            loop {
                let mut hl = String::new();
                if r.read_line(&mut hl).is_err() || hl == "\r\n" || hl.is_empty() {
                    break;
                }
                if let Some(v) = hl.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            let b = r#"{"ok": true}"#;
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                b.len()
            );
        }
    });
    port
}

fn sandboxes_here() -> bool {
    let init = std::path::Path::new(common::BIN).with_file_name("tessera-sandbox-init");
    let why = if !init.exists() {
        Some(format!("{} is not built", init.display()))
    } else if !common::is_root() {
        Some("sandboxes need root here".to_string())
    } else {
        None
    };
    match why {
        None => true,
        Some(w) if ci() => panic!("{w} (CI is set: the console's session view must be tested)"),
        Some(w) => {
            eprintln!("SKIP (sessions and sandboxes part): {w}");
            false
        }
    }
}

struct World {
    api: Api,
    up: Up,
    admin: String,
    alpha: String,
    beta: String,
    sessions: bool,
    _dir: tempfile::TempDir,
    _engine: tessera_gateway::mock::MockEngine,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/console/cluster.yaml");
    let sessions = sandboxes_here();
    let d = dir.path().join("data").to_str().unwrap().to_string();
    let up = tokio::task::spawn_blocking(move || {
        let mut args = vec![
            "--data",
            &d,
            "--no-local-node",
            "--cluster",
            cluster,
            "--agent-pool-min",
            "0",
        ];
        if sessions {
            args.push("--sandboxes");
            args.extend(["--sandbox-warm", "0"]);
        }
        up_with(&args)
    })
    .await
    .unwrap();
    let admin = up.key.clone().expect("a fresh store prints the admin key");
    let api = Api {
        http: reqwest::Client::new(),
        url: up.url.clone(),
    };
    let alpha = api
        .post(&admin, "/v1/tenants", json!({"name": "alpha"}))
        .await["admin_key"]
        .as_str()
        .unwrap()
        .to_string();
    let beta = api
        .post(&admin, "/v1/tenants", json!({"name": "beta"}))
        .await["admin_key"]
        .as_str()
        .unwrap()
        .to_string();
    for k in [&alpha, &beta] {
        api.post(k, "/v1/queues", json!({"name": "default"})).await;
    }
    let whole = |n: u32| json!({"whole": {"count": n}});
    api.post(
        &alpha,
        "/v1/jobs",
        // Not preemptable: `train` (priority 5) must wait for room, not evict it (the
        // scheduler's gang-aware preemption would take this whole gang otherwise).
        json!({"name": "held", "queue": "default", "preemptable": false, "tasks": [
        {"name": "a", "gpu": whole(2), "node_selector": {"slot": "big-0"}},
        {"name": "b", "gpu": whole(4), "node_selector": {"slot": "big-1"}}]}),
    )
    .await;
    api.post(
        &alpha,
        "/v1/jobs",
        json!({"name": "mig", "queue": "default", "tasks": [
        {"name": "m", "gpu": {"mig": {"profile": "3g.40gb"}}}]}),
    )
    .await;
    api.post(&alpha, "/v1/jobs", json!({"name": "frac", "queue": "default", "tasks": [
        {"name": "f", "gpu": {"shared": {"milli": 250, "memory": 10u64 << 30}}, "node_selector": {"slot": "share-0"}}]})).await;
    api.post(&beta, "/v1/jobs", json!({"name": "theirs", "queue": "default", "tasks": [
        {"name": "t", "gpu": {"whole": {"count": 4, "models": ["H100-80GB"]}}, "node_selector": {"pool": "train"}}]})).await;
    for j in ["held", "mig", "frac"] {
        api.until(
            &alpha,
            &format!("/v1/jobs/{j}"),
            &format!("{j} running"),
            |v| v["status"]["phase"] == "running",
        )
        .await;
    }
    // Submitted once the others hold their GPUs: it fits nowhere and waits, and the
    // scheduler holds big-0 (6 of 8 free, the closest to fitting) for it.
    api.post(&alpha, "/v1/jobs", json!({"name": "train", "queue": "default", "kind": "training", "priority": 5,
        "tasks": [{"name": "w", "resources": {"cpu_milli": 8000}, "gpu": {"whole": {"count": 8, "models": ["A100-80GB"]}}}]})).await;
    // The inference pool, in front of a mock engine; alpha's calls give it figures.
    let engine = tessera_gateway::mock::start().await.unwrap();
    api.post(
        &admin,
        "/v1/pools",
        json!({"name": "tiny", "model": MODEL, "endpoints": [{"url": engine.url}]}),
    )
    .await;
    if sessions {
        api.post(&alpha, "/v1/runtimes", json!({"name": "echo", "command": ["python3", "-c", AGENT], "resources": {"memory_mb": 256}}))
            .await;
        api.post(
            &alpha,
            "/v1/runtimes/echo/invocations?session_id=s1",
            json!({"hello": 1}),
        )
        .await;
        // A chat in the session, through the pool: a `chat` span.
        let r = api
            .http
            .post(format!("{}/v1/chat/completions", api.url))
            .bearer_auth(&alpha)
            .header("x-session-id", "s1")
            .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
        // A tool call through the ledger (its `execute_tool` span comes with it).
        let port = serve_tool();
        api.post(&alpha, "/v1/tools", json!({"name": "lookup", "target": {"type": "http", "url": format!("http://127.0.0.1:{port}/")}}))
            .await;
        api.post(
            &alpha,
            "/v1/tools/lookup/grants",
            json!({"role": "developer"}),
        )
        .await;
        // The tool gateway records the call's `execute_tool` span itself.
        api.post(
            &alpha,
            "/v1/tools/lookup/call",
            json!({"session_id": "s1", "tool_call_id": "call-1", "arguments": {"q": "x"}}),
        )
        .await;
        api.post(&alpha, "/v1/sandboxes", json!({})).await;
    } else {
        for _ in 0..3 {
            let _ = api
                .http
                .post(format!("{}/v1/chat/completions", api.url))
                .bearer_auth(&alpha)
                .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}))
                .send()
                .await
                .unwrap();
        }
    }
    World {
        api,
        up,
        admin,
        alpha,
        beta,
        sessions,
        _dir: dir,
        _engine: engine,
    }
}

/// How often the page read the list at `path` (not its watch, nor other routes).
async fn list_reads(b: &Browser, path: &str) -> u64 {
    b.js(
        "return performance.getEntriesByType('resource').filter(e => new URL(e.name).pathname === arguments[0]).length",
        vec![json!(path)],
    )
    .await
    .unwrap()
    .as_u64()
    .unwrap()
}

fn common_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Opens `path` as `key` (handed in the fragment, as a wall display would).
async fn open(b: &Browser, w: &World, key: &str, path: &str) {
    // A new sign-in: the previous key leaves session storage first.
    b.goto(&format!("{}/healthz", w.up.url)).await.unwrap();
    b.js("sessionStorage.clear(); return true", vec![])
        .await
        .unwrap();
    b.goto(&format!("{}{path}#key={key}", w.up.url))
        .await
        .unwrap();
}

/// The page's script errors so far (app.js keeps them): none is allowed.
async fn no_errors(b: &Browser, view: &str) {
    let e = b
        .js(
            "return window.__console ? window.__console.errors : ['no console']",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(e, json!([]), "script errors in the {view} view");
}

async fn shot(b: &Browser, name: &str) {
    no_errors(b, name).await;
    let path = artefacts().join(format!("{name}.png"));
    let s = b.screenshot(&path).await.unwrap();
    assert!(s.has_content(), "{} looks blank: {s:?}", path.display());
    eprintln!(
        "screenshot {} ({}x{}, {} colours)",
        path.display(),
        s.width,
        s.height,
        s.colours
    );
}

/// axe-core's WCAG 2 A/AA rules on the page as it is: no violation.
async fn axe(b: &Browser, view: &str) {
    let loaded = b
        .js("return typeof window.axe === 'object'", vec![])
        .await
        .unwrap();
    if loaded != Value::Bool(true) {
        b.js(&format!("{AXE}\n;return true;"), vec![])
            .await
            .unwrap();
    }
    let r = b
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}, resultTypes: ['violations']})
               .then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                   nodes: v.nodes.slice(0, 3).map(n => n.html.slice(0, 160) + ' :: ' + n.failureSummary)}))))
               .catch(e => done([{id: 'axe-error', help: String(e)}]));",
            vec![],
        )
        .await
        .unwrap();
    let v = r.as_array().cloned().unwrap_or_default();
    assert!(
        v.is_empty(),
        "axe finds accessibility violations in the {view} view:\n{}",
        serde_json::to_string_pretty(&v).unwrap()
    );
}

/// The focused element: tag, text or label, and whether its focus ring shows.
async fn focused(b: &Browser) -> Value {
    b.js(
        "const e = document.activeElement; const s = getComputedStyle(e);
         return {tag: e.tagName.toLowerCase(), text: (e.getAttribute('aria-label') || e.textContent || '').trim().slice(0, 60),
                 node: e.dataset ? (e.dataset.node || null) : null,
                 ring: s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 2};",
        vec![],
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_shows_the_cluster_queues_jobs_sessions_and_pools() {
    if !have_browser() {
        return;
    }
    let w = world().await;
    let b = Browser::start(1400, 1000).await.unwrap();

    // ---- where things are, as the API says (the page must draw the same) ----
    let mig = w.api.get(&w.alpha, "/v1/jobs/mig").await;
    let mig_task = &mig["status"]["tasks"]["m"];
    assert_eq!(mig_task["node"], "mig-0", "{mig}");
    let mig_gpu = mig_task["gpus"][0].as_u64().unwrap();
    let mig_start = mig_task["mig"]["start"].as_u64();
    let frac = w.api.get(&w.alpha, "/v1/jobs/frac").await;
    let frac_gpu = frac["status"]["tasks"]["f"]["gpus"][0].as_u64().unwrap();
    let theirs = w.api.get(&w.beta, "/v1/jobs/theirs").await;
    let theirs_node = theirs["status"]["tasks"]["t"]["node"]
        .as_str()
        .unwrap()
        .to_string();
    let train = w
        .api
        .until(&w.alpha, "/v1/jobs/train", "train's pending reason", |v| {
            v["status"]["pending_reason"].is_string()
        })
        .await;
    let reason = train["status"]["pending_reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.contains("8 free GPUs") || reason.contains("lack"),
        "{reason}"
    );
    w.api
        .until(
            &w.alpha,
            "/v1/cluster/gpus",
            "the reservation of big-0",
            |v| {
                v["nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|n| n["name"] == "big-0" && n["reservations"].is_array())
            },
        )
        .await;

    // ---- the key handed in the fragment ----
    open(&b, &w, &w.alpha, "/ui/cluster").await;
    b.wait_for(
        "the cluster view's first paint",
        "return window.__console && window.__console.paints.cluster",
        WAIT,
    )
    .await
    .unwrap();
    let loc = b
        .js("return {hash: location.hash, href: location.href, stored: sessionStorage.getItem('tessera.key')}", vec![])
        .await
        .unwrap();
    assert_eq!(loc["hash"], "", "the key stays in the address bar: {loc}");
    assert!(!loc["href"].as_str().unwrap().contains("tsk_"), "{loc}");
    assert_eq!(loc["stored"], w.alpha.as_str());

    // ---- the heat map: the MIG instance, the fraction, the reservation ----
    let cells = b
        .js(
            "const q = (s) => document.querySelector(s);
             const n = (name) => `svg.node[data-node=\"${name}\"]`;
             const mig = q(`${n('mig-0')} .gpu[data-gpu=\"${arguments[0]}\"]`);
             const held = mig ? [...mig.querySelectorAll('rect.mig[data-held]')].map(r => [r.dataset.mig, r.dataset.held]) : null;
             const share = q(`${n('share-0')} .gpu[data-gpu=\"${arguments[1]}\"]`);
             const big0 = [...document.querySelectorAll(`${n('big-0')} .gpu`)].map(g => [g.dataset.state, g.dataset.reserved || null]);
             const big1 = [...document.querySelectorAll(`${n('big-1')} .gpu`)].map(g => g.dataset.reserved || null);
             const theirs = [...document.querySelectorAll(`${n(arguments[2])} .gpu`)].map(g => g.dataset.state);
             return {mig: mig && mig.dataset.state, held, share: share && [share.dataset.state, share.dataset.share],
                     big0, big1, theirs, frag: q('#frag').innerText, nodes: document.querySelectorAll('svg.node').length};",
            vec![json!(mig_gpu), json!(frac_gpu), json!(theirs_node)],
        )
        .await
        .unwrap();
    assert_eq!(cells["nodes"], 9, "{cells}");
    assert_eq!(cells["mig"], "mig", "{cells}");
    let held = cells["held"].as_array().unwrap();
    assert_eq!(held.len(), 1, "one instance held: {cells}");
    assert_eq!(held[0][1], "alpha/mig", "{cells}");
    let inst = held[0][0].as_str().unwrap();
    assert!(inst.starts_with("3g.40gb@"), "{inst}");
    if let Some(s) = mig_start {
        assert_eq!(
            inst,
            format!("3g.40gb@{s}"),
            "the instance the binding names"
        );
    }
    assert_eq!(cells["share"], json!(["share", "250"]), "{cells}");
    // big-0 is held whole for alpha/train: its 6 free GPUs drawn reserved, its 2
    // used ones still whole (and held too); big-1 holds nothing back.
    let big0 = cells["big0"].as_array().unwrap();
    assert_eq!(big0.len(), 8);
    assert!(big0.iter().all(|c| c[1] == "alpha/train"), "{cells}");
    assert_eq!(
        big0.iter().filter(|c| c[0] == "reserved").count(),
        6,
        "{cells}"
    );
    assert_eq!(
        big0.iter().filter(|c| c[0] == "whole").count(),
        2,
        "{cells}"
    );
    assert!(
        cells["big1"].as_array().unwrap().iter().all(Value::is_null),
        "{cells}"
    );
    assert_eq!(
        cells["theirs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| *s == "whole")
            .count(),
        4,
        "{cells}"
    );
    let frag = cells["frag"].as_str().unwrap();
    assert!(
        frag.contains("A100-80GB") && frag.contains("1 node has 4 free"),
        "{frag}"
    );
    shot(&b, "cluster").await;
    // Hover: the tooltip names the holder.
    b.js(
        "const g = document.querySelector(`svg.node[data-node=\"share-0\"] g.gpu[data-gpu=\"${arguments[0]}\"] rect`);
         g.dispatchEvent(new MouseEvent('mouseover', {bubbles: true})); return true;",
        vec![json!(frac_gpu)],
    )
    .await
    .unwrap();
    let tip = b
        .js("return document.getElementById('tip').innerText", vec![])
        .await
        .unwrap();
    assert!(
        tip.as_str().unwrap().contains("25% share: alpha/frac/f"),
        "{tip}"
    );
    axe(&b, "cluster").await;

    // ---- keyboard: Tab through the navigation, arrows and Enter on the map ----
    b.js("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); return true", vec![])
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut on_map = None;
    for _ in 0..40 {
        b.keys(&fantoccini::key::Key::Tab).await.unwrap();
        let f = focused(&b).await;
        assert_eq!(f["ring"], true, "no visible focus ring on {f}");
        if f["node"].is_string() {
            on_map = Some(f);
            break;
        }
        seen.push(f["text"].as_str().unwrap_or("").to_string());
    }
    for v in [
        "Skip to content",
        "Cluster",
        "Queues",
        "Jobs",
        "Sandboxes",
        "Sessions",
        "Inference pools",
        "Colour by",
    ] {
        assert!(
            seen.iter().any(|s| s.starts_with(v)) || v == "Colour by",
            "Tab never reached {v:?}: {seen:?}"
        );
    }
    let first = on_map.expect("Tab reaches the heat map");
    b.keys(&fantoccini::key::Key::Right).await.unwrap();
    let second = focused(&b).await;
    assert!(
        second["node"].is_string() && second["node"] != first["node"],
        "ArrowRight moves: {first} -> {second}"
    );
    b.keys(&fantoccini::key::Key::Enter).await.unwrap();
    let shown = b.js("return document.querySelector('#details h2') && document.querySelector('#details h2').innerText", vec![])
        .await
        .unwrap();
    assert_eq!(shown, second["node"], "Enter shows the node's details");
    let url = b.js("return location.search", vec![]).await.unwrap();
    assert!(
        url.as_str()
            .unwrap()
            .contains(&format!("node={}", second["node"].as_str().unwrap())),
        "{url}"
    );

    // ---- a live update: the fraction ends, its cell empties without a reload ----
    b.js("window.__marker = 1; return true", vec![])
        .await
        .unwrap();
    let before = common_now_ms();
    w.api
        .post(&w.alpha, "/v1/jobs/frac/cancel", json!({}))
        .await;
    b.wait_for(
        "share-0's cell to empty",
        &format!("const g = document.querySelector('svg.node[data-node=\"share-0\"] .gpu[data-gpu=\"{frac_gpu}\"]'); return g && g.dataset.state === 'free'"),
        WAIT,
    )
    .await
    .unwrap();
    let applied = b
        .js("return window.__marker === 1 && window.__console.applied.filter(a => a.node === 'share-0').map(a => a.at).pop()", vec![])
        .await
        .unwrap();
    let at = applied
        .as_u64()
        .expect("the update came through the watch, not a reload");
    eprintln!(
        "console: share-0 updated {} ms after the cancel was sent",
        at.saturating_sub(before)
    );

    // ---- queues: bars and the pending job with its reason ----
    b.goto(&format!("{}/ui/queues", w.up.url)).await.unwrap();
    let q = b
        .wait_for("the queue tree", "const r = document.querySelector('tr[data-queue=\"default\"]'); return r && r.innerText", WAIT)
        .await
        .unwrap();
    assert!(q.as_str().unwrap().contains("train"), "{q}");
    assert!(
        q.as_str().unwrap().contains(&reason),
        "the queue view shows the reason {reason:?}: {q}"
    );
    let bars = b.js("return document.querySelectorAll('tr[data-queue=\"default\"] svg.bar rect[data-part=\"allocated\"]').length", vec![])
        .await
        .unwrap();
    assert_eq!(bars, 3, "GPU, CPU and memory bars");
    shot(&b, "queues").await;
    axe(&b, "queues").await;

    // ---- jobs: the list and a job page ----
    b.goto(&format!("{}/ui/jobs", w.up.url)).await.unwrap();
    let row = b
        .wait_for(
            "the jobs list",
            "const r = document.querySelector('tr[data-job=\"train\"]'); return r && r.innerText",
            WAIT,
        )
        .await
        .unwrap();
    assert!(
        row.as_str().unwrap().contains("pending") && row.as_str().unwrap().contains(&reason),
        "{row}"
    );
    let names = b
        .js(
            "return [...document.querySelectorAll('#jobs tr[data-job]')].map(r => r.dataset.job)",
            vec![],
        )
        .await
        .unwrap();
    for j in ["held", "mig", "frac", "train"] {
        assert!(
            names.as_array().unwrap().iter().any(|n| n == j),
            "{j} listed: {names}"
        );
    }
    assert!(
        !names.as_array().unwrap().iter().any(|n| n == "theirs"),
        "beta's job listed for alpha: {names}"
    );
    // A job submitted now appears without a reload.
    b.js("window.__marker = 2; return true", vec![])
        .await
        .unwrap();
    w.api.post(&w.alpha, "/v1/jobs", json!({"name": "late", "queue": "default", "tasks": [{"name": "t", "resources": {"cpu_milli": 100}}]}))
        .await;
    b.wait_for(
        "the new job's row",
        "return !!document.querySelector('tr[data-job=\"late\"]') && window.__marker === 2",
        WAIT,
    )
    .await
    .unwrap();
    shot(&b, "jobs").await;
    axe(&b, "jobs").await;
    b.goto(&format!("{}/ui/jobs/mig", w.up.url)).await.unwrap();
    let t = b
        .wait_for("the job page's tasks", "const r = document.querySelector('#tasks tr[data-task=\"m\"]'); return r && r.innerText", WAIT)
        .await
        .unwrap();
    let t = t.as_str().unwrap();
    assert!(t.contains("mig-0") && t.contains("3g.40gb"), "{t}");
    b.wait_for(
        "the job's timeline",
        "return document.querySelectorAll('#timeline li[data-event]').length",
        WAIT,
    )
    .await
    .unwrap();
    let tl = b
        .js(
            "return document.getElementById('timeline').innerText",
            vec![],
        )
        .await
        .unwrap();
    assert!(tl.as_str().unwrap().contains("Scheduled"), "{tl}");
    assert!(
        b.js("return !!document.getElementById('cancel')", vec![])
            .await
            .unwrap()
            == Value::Bool(true)
    );
    shot(&b, "job").await;
    axe(&b, "job").await;
    b.goto(&format!("{}/ui/jobs/train", w.up.url))
        .await
        .unwrap();
    let r = b
        .wait_for(
            "the pending job's reason",
            "const r = document.getElementById('job-reason'); return r && r.innerText",
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(r, reason.as_str());

    // ---- sessions, sandboxes ----
    if w.sessions {
        b.goto(&format!("{}/ui/sessions", w.up.url)).await.unwrap();
        let s = b
            .wait_for("the sessions list", "const r = document.querySelector('#sessions tr[data-key=\"s1\"]'); return r && r.innerText", WAIT)
            .await
            .unwrap();
        assert!(s.as_str().unwrap().contains("echo"), "{s}");
        // Followed, not read again: a new session's row comes in on top by itself,
        // the row of s1 is the same element where it was (rows do not jump), and
        // the list was read once.
        b.js(
            "document.querySelector('#sessions tr[data-key=\"s1\"]').__kept = true; return true",
            vec![],
        )
        .await
        .unwrap();
        w.api
            .post(
                &w.alpha,
                "/v1/runtimes/echo/invocations?session_id=s2",
                json!({"hello": 2}),
            )
            .await;
        let rows = b
            .wait_for("the new session's row", "const r = [...document.querySelectorAll('#sessions tbody tr')]; return r.some(x => x.dataset.key === 's2') && r.map(x => [x.dataset.key, !!x.__kept])", WAIT)
            .await
            .unwrap();
        assert_eq!(rows, json!([["s2", false], ["s1", true]]));
        assert_eq!(list_reads(&b, "/v1/sessions").await, 1);
        shot(&b, "sessions").await;
        axe(&b, "sessions").await;
        b.goto(&format!("{}/ui/sessions/s1", w.up.url))
            .await
            .unwrap();
        let spans = b
            .wait_for("the waterfall", "const s = [...document.querySelectorAll('#waterfall g.span')]; return s.length >= 3 && s.map(g => [g.dataset.op, Number(g.dataset.start), Number(g.dataset.order), g.querySelector('rect').getAttribute('x')])", WAIT)
            .await
            .unwrap();
        let spans = spans.as_array().unwrap();
        let ops: Vec<&str> = spans.iter().map(|s| s[0].as_str().unwrap()).collect();
        assert_eq!(ops, ["invoke_agent", "chat", "execute_tool"], "{spans:?}");
        let starts: Vec<u64> = spans.iter().map(|s| s[1].as_u64().unwrap()).collect();
        assert!(
            starts.windows(2).all(|p| p[0] <= p[1]),
            "spans in start order: {starts:?}"
        );
        let xs: Vec<f64> = spans
            .iter()
            .map(|s| s[3].as_str().unwrap().parse().unwrap())
            .collect();
        assert!(
            xs.windows(2).all(|p| p[0] <= p[1]),
            "bars left to right: {xs:?}"
        );
        let page = b
            .wait_for("the ledger and cost", "const l = document.querySelector('#ledger tr[data-entry]'); const c = document.getElementById('cost-total'); return l && c && document.getElementById('main').innerText", WAIT)
            .await
            .unwrap();
        let page = page.as_str().unwrap();
        assert!(
            page.contains("call-1") && page.contains("lookup"),
            "the ledger entry: {page}"
        );
        assert!(page.contains("input tokens"), "the cost breakdown: {page}");
        assert!(
            b.js("return !!document.getElementById('kill')", vec![])
                .await
                .unwrap()
                == Value::Bool(true)
        );
        shot(&b, "session").await;
        axe(&b, "session").await;
        b.goto(&format!("{}/ui/sandboxes", w.up.url)).await.unwrap();
        b.wait_for(
            "the sandboxes list",
            "return document.querySelectorAll('#sandboxes tbody tr').length",
            WAIT,
        )
        .await
        .unwrap();
        // A sandbox made, paused and killed elsewhere: its row comes, changes and
        // goes by itself; the first row stays the same element, first.
        b.js(
            "document.querySelector('#sandboxes tbody tr').__kept = true; return true",
            vec![],
        )
        .await
        .unwrap();
        let made = w.api.post(&w.alpha, "/v1/sandboxes", json!({})).await;
        let id = made["sandbox_id"].as_str().unwrap().to_string();
        let rows_js = format!(
            "const r = [...document.querySelectorAll('#sandboxes tbody tr')]; const n = r.find(x => x.dataset.key === '{id}'); return n && n.innerText.includes('STATE') && r.map(x => [x.dataset.key === '{id}', !!x.__kept])"
        );
        let rows = b
            .wait_for(
                "the new sandbox's row",
                &rows_js.replace("STATE", "running"),
                WAIT,
            )
            .await
            .unwrap();
        assert_eq!(rows, json!([[false, true], [true, false]]));
        w.api
            .post(&w.alpha, &format!("/v1/sandboxes/{id}/pause"), json!(null))
            .await;
        b.wait_for(
            "the paused sandbox's row",
            &rows_js.replace("STATE", "paused"),
            WAIT,
        )
        .await
        .unwrap();
        w.api
            .call(
                &w.alpha,
                reqwest::Method::DELETE,
                &format!("/v1/sandboxes/{id}"),
                None,
            )
            .await;
        let left = b
            .wait_for("the killed sandbox's row gone", &format!("const r = [...document.querySelectorAll('#sandboxes tbody tr')]; return !r.some(x => x.dataset.key === '{id}') && r.map(x => !!x.__kept)"), WAIT)
            .await
            .unwrap();
        assert_eq!(left, json!([true]));
        assert_eq!(list_reads(&b, "/v1/sandboxes").await, 1);
        shot(&b, "sandboxes").await;
        axe(&b, "sandboxes").await;
    }

    // ---- inference pools ----
    b.goto(&format!("{}/ui/pools", w.up.url)).await.unwrap();
    let p = b
        .wait_for(
            "the pool's card",
            "const c = document.querySelector('[data-pool=\"tiny\"]'); return c && c.innerText",
            WAIT,
        )
        .await
        .unwrap();
    let p = p.as_str().unwrap();
    assert!(
        p.contains("tiny-chat") && p.contains("p50") && p.contains("Recommended replicas"),
        "{p}"
    );
    // A request through the pool shows in its card by itself: the pools are
    // listed once and followed (sampled by the server), not read again.
    let requests = "return Number(document.querySelector('[data-pool=\"tiny\"] [data-k=\"requests\"]').textContent)";
    let before = b.js(requests, vec![]).await.unwrap().as_u64().unwrap();
    let r = w
        .api
        .http
        .post(format!("{}/v1/chat/completions", w.api.url))
        .bearer_auth(&w.alpha)
        .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "again"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    b.wait_for(
        "the pool's figures after a request",
        &format!("{requests} > {before}"),
        WAIT,
    )
    .await
    .unwrap();
    assert_eq!(list_reads(&b, "/v1/pools").await, 1);
    shot(&b, "pools").await;
    axe(&b, "pools").await;

    // ---- beta sees none of alpha's names ----
    open(&b, &w, &w.beta, "/ui/cluster").await;
    b.wait_for(
        "beta's cluster view",
        "return window.__console && window.__console.paints.cluster",
        WAIT,
    )
    .await
    .unwrap();
    let html = b
        .js("return document.documentElement.outerHTML", vec![])
        .await
        .unwrap();
    let html = html.as_str().unwrap();
    for name in ["alpha", "held/", "/held", "train/w", "mig/m", "frac/f"] {
        assert!(!html.contains(name), "beta's page shows {name:?}");
    }
    let other = b
        .js("return [document.querySelectorAll('svg.node[data-node=\"mig-0\"] rect.mig[data-held=\"other\"]').length, document.querySelectorAll('svg.node[data-node=\"big-0\"] .gpu[data-reserved=\"other\"]').length]", vec![])
        .await
        .unwrap();
    assert_eq!(
        other,
        json!([1, 8]),
        "alpha's work is drawn as another tenant's"
    );
    b.goto(&format!("{}/ui/jobs", w.up.url)).await.unwrap();
    let names = b
        .wait_for("beta's jobs", "const r = [...document.querySelectorAll('#jobs tr[data-job]')].map(r => r.dataset.job); return r.length && r", WAIT)
        .await
        .unwrap();
    assert_eq!(names, json!(["theirs"]));

    // ---- a system admin views alpha, read only ----
    open(&b, &w, &w.admin, "/ui/jobs/train?tenant=alpha").await;
    let r = b
        .wait_for(
            "alpha's job as the system admin",
            "const r = document.getElementById('job-reason'); return r && r.innerText",
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(r, reason.as_str());
    let ro = b.js("return [!!document.getElementById('cancel'), document.querySelector('.actions').innerText]", vec![])
        .await
        .unwrap();
    assert_eq!(ro[0], false, "no cancel while viewing as a tenant: {ro}");
    let (st, _) = w
        .api
        .call(&w.beta, reqwest::Method::GET, "/v1/jobs", None)
        .await;
    assert_eq!(st, 200);
    // The header is the system admin's alone.
    let resp = w
        .api
        .http
        .get(format!("{}/v1/jobs", w.api.url))
        .bearer_auth(&w.beta)
        .header("x-tessera-tenant", "alpha")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    let _ = b.client.clone().close().await;
}

/// Cells: the browser test above reads the same view the API serves. This checks
/// the API side of the SSE resume rule without a browser: a watcher that resumes
/// from a sequence number of another view instance is told to list again. And the
/// console's tenant switch tried from outside the page: `X-Tessera-Tenant` reads as
/// a tenant for a system admin only, and writes nothing there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_watch_resumes_or_resets() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/console/cluster.yaml");
    let d = dir.path().join("data").to_str().unwrap().to_string();
    let up = tokio::task::spawn_blocking(move || {
        up_with(&["--data", &d, "--no-local-node", "--cluster", cluster])
    })
    .await
    .unwrap();
    let key = up.key.clone().unwrap();
    let http = reqwest::Client::new();
    let g: Value = http
        .get(format!("{}/v1/cluster/gpus", up.url))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(g["nodes"].as_array().unwrap().len(), 9);
    let seq = g["seq"].as_u64().unwrap();
    let first_event = |url: String| {
        let http = http.clone();
        let key = key.clone();
        async move {
            let mut r = http.get(url).bearer_auth(&key).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            let mut text = String::new();
            let t0 = Instant::now();
            while !text.contains("\n\n") && t0.elapsed() < WAIT {
                match tokio::time::timeout(Duration::from_secs(5), r.chunk()).await {
                    Ok(Ok(Some(c))) => text.push_str(&String::from_utf8_lossy(&c)),
                    _ => break,
                }
            }
            text
        }
    };
    let t = first_event(format!(
        "{}/v1/cluster/watch?after={seq}&instance=not-this-one",
        up.url
    ))
    .await;
    assert!(t.starts_with("event: reset"), "{t}");
    // A change after `seq` comes as a `node` event.
    http.post(format!("{}/v1/queues", up.url))
        .bearer_auth(&key)
        .json(&json!({"name": "q"}))
        .send()
        .await
        .unwrap();
    http.post(format!("{}/v1/jobs", up.url))
        .bearer_auth(&key)
        .json(&json!({"name": "j", "queue": "q", "tasks": [{"name": "t", "gpu": {"whole": {"count": 1}}}]}))
        .send()
        .await
        .unwrap();
    let t = first_event(format!(
        "{}/v1/cluster/watch?after={seq}&instance={}",
        up.url,
        g["instance"].as_str().unwrap()
    ))
    .await;
    assert!(t.starts_with("event: node"), "{t}");
    let data: Value =
        serde_json::from_str(t.lines().find_map(|l| l.strip_prefix("data: ")).unwrap()).unwrap();
    assert_eq!(data["holders"][0]["job"], "j", "{data}");

    // X-Tessera-Tenant: a system admin reads as a tenant, and can write nothing there.
    let send = |key: &str, m: reqwest::Method, path: &str, view_as: Option<&str>| {
        let mut r = http
            .request(m, format!("{}{path}", up.url))
            .bearer_auth(key)
            .json(&json!({"name": "default"}));
        if let Some(t) = view_as {
            r = r.header("x-tessera-tenant", t);
        }
        r.send()
    };
    let tenant = |name: &str| {
        http.post(format!("{}/v1/tenants", up.url))
            .bearer_auth(&key)
            .json(&json!({"name": name}))
            .send()
    };
    let a: Value = tenant("alpha").await.unwrap().json().await.unwrap();
    let alpha_key = a["admin_key"]
        .as_str()
        .expect("alpha's admin key")
        .to_string();
    assert_eq!(
        send(&alpha_key, reqwest::Method::POST, "/v1/queues", None)
            .await
            .unwrap()
            .status()
            .as_u16(),
        201
    );
    let r = send(&key, reqwest::Method::GET, "/v1/queues", Some("alpha"))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "a system admin reads as alpha");
    let v: Value = r.json().await.unwrap();
    assert!(
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["name"] == "default"),
        "{v}"
    );
    for (m, path) in [
        (reqwest::Method::POST, "/v1/queues"),
        (reqwest::Method::DELETE, "/v1/queues/default"),
    ] {
        let st = send(&key, m.clone(), path, Some("alpha"))
            .await
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(
            st, 403,
            "{m} {path} as alpha through the header must be refused"
        );
    }
    // Not a system admin: the header itself is refused, even naming one's own tenant.
    for t in ["admin", "alpha"] {
        let st = send(&alpha_key, reqwest::Method::GET, "/v1/queues", Some(t))
            .await
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(st, 403, "alpha's key with X-Tessera-Tenant: {t}");
    }
    let r = send(&alpha_key, reqwest::Method::GET, "/v1/queues", None)
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// A cluster larger than a screen is drawn in two steps (the first screen's racks
/// at once, the rest in chunks right after): every node ends up drawn once, in
/// rack order, the counts are right from the first paint, a filter reaches nodes
/// drawn late, and a change to a node drawn late arrives from the watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_cluster_is_drawn_in_chunks() {
    if !have_browser() {
        return;
    }
    const RACKS: usize = 30;
    const PER: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = String::from("nodes:\n");
    for r in 0..RACKS {
        yaml.push_str(&format!(
            "  - {{name: r{r}n, count: {PER}, cpu: 64, memory: 256Gi, gpus: 8, gpu_model: H100-80GB, gpu_memory: 80Gi, network: [rack-{r}, spine-{}], labels: {{rack: r{r}}}}}\n",
            r / 10
        ));
    }
    let file = dir.path().join("big.yaml");
    std::fs::write(&file, yaml).unwrap();
    let d = dir.path().join("data").to_str().unwrap().to_string();
    let f = file.to_str().unwrap().to_string();
    let up = tokio::task::spawn_blocking(move || {
        up_with(&["--data", &d, "--no-local-node", "--cluster", &f])
    })
    .await
    .unwrap();
    let key = up.key.clone().unwrap();
    let b = Browser::start(1400, 1000).await.unwrap();
    b.goto(&format!("{}/ui/cluster#key={key}", up.url))
        .await
        .unwrap();
    let first = b
        .wait_for(
            "the first paint",
            "const c = window.__console; return c && c.paints.cluster && [c.paints.clusterDrawnAtOnce, document.getElementById('counts').textContent]",
            WAIT,
        )
        .await
        .unwrap();
    let total = RACKS * PER;
    let at_once = first[0].as_u64().unwrap() as usize;
    assert!(
        at_once > 0 && at_once < total,
        "{at_once} of {total} nodes drawn at once"
    );
    // Counted from the data, not from what is drawn yet.
    assert_eq!(
        first[1].as_str().unwrap(),
        format!("{total} of {total} nodes, {} GPUs", total * 8)
    );
    let all = b
        .wait_for(
            "every node drawn",
            "const c = window.__console; return c.paints.clusterComplete && [...document.querySelectorAll('#heatmap svg.node')].map(s => s.dataset.node)",
            WAIT,
        )
        .await
        .unwrap();
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(names.len(), total, "each node drawn once");
    let unique: std::collections::BTreeSet<&&str> = names.iter().collect();
    assert_eq!(unique.len(), total);
    // Rack order: every node of rack r before any of rack r + 1.
    let rack_of = |n: &str| n[1..n.find('n').unwrap()].parse::<usize>().unwrap();
    let racks: Vec<usize> = names.iter().map(|n| rack_of(n)).collect();
    assert!(racks.windows(2).all(|w| w[0] <= w[1]), "{racks:?}");
    // A filter by name reaches the last rack (drawn late), and hides the others.
    b.js(
        "const i = document.getElementById('q'); i.value = arguments[0]; i.dispatchEvent(new Event('input')); return true",
        vec![json!(format!("r{}n", RACKS - 1))],
    )
    .await
    .unwrap();
    let shown = b
        .js(
            "return [[...document.querySelectorAll('#heatmap svg.node:not(.hidden)')].length, document.getElementById('counts').textContent, [...document.querySelectorAll('#heatmap section.rack:not([hidden])')].map(s => s.dataset.rack)]",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        shown,
        json!([
            PER,
            format!("{PER} of {total} nodes, {} GPUs", total * 8),
            [format!("rack-{}", RACKS - 1)]
        ])
    );
    // Opened with that filter in its address, the map's one tab stop is on a node
    // drawn late (the first screen's nodes are all filtered out).
    b.goto(&format!("{}/ui/cluster?q=r{}n", up.url, RACKS - 1))
        .await
        .unwrap();
    let stop = b
        .wait_for(
            "the tab stop on a late rack",
            "const c = window.__console; const t = [...document.querySelectorAll('#heatmap svg.node[tabindex=\"0\"]')]; return c && c.paints.clusterComplete && t.map(s => s.dataset.node)",
            WAIT,
        )
        .await
        .unwrap();
    let stop = stop.as_array().unwrap();
    assert_eq!(stop.len(), 1, "{stop:?}");
    assert_eq!(rack_of(stop[0].as_str().unwrap()), RACKS - 1, "{stop:?}");
    // A job bound to a node drawn late shows in its cell from the watch.
    let http = reqwest::Client::new();
    for (path, body) in [
        ("/v1/queues", json!({"name": "q"})),
        (
            "/v1/jobs",
            json!({"name": "late", "queue": "q", "tasks": [{"name": "t", "gpu": 8, "node_selector": {"rack": format!("r{}", RACKS - 1)}}]}),
        ),
    ] {
        let r = http
            .post(format!("{}{path}", up.url))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "{path}: {}",
            r.text().await.unwrap()
        );
    }
    let node = b
        .wait_for(
            "the bound job's node drawn whole",
            "const s = [...document.querySelectorAll('#heatmap svg.node')].find(s => s.querySelectorAll('[data-state=\"whole\"]').length === 8); return s && s.dataset.node",
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(rack_of(node.as_str().unwrap()), RACKS - 1, "{node}");
    assert!(
        !names[..at_once].contains(&node.as_str().unwrap()),
        "{node} was drawn at once, not late"
    );
    no_errors(&b, "large cluster").await;
    let _ = b.client.clone().close().await;
}
