//! `tessera bench console`: the console (issue 23) in headless Chromium against a
//! large simulated cluster, timed by the browser itself.
//!
//! It writes a cluster file of `--nodes` nodes with `--gpus` GPUs each, taking each
//! node's CPU, memory and GPU model in turn from the Alibaba node list
//! (`--node-list`, `data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv`), placed in
//! racks of 40 under spines of 25 racks; starts this binary's `tessera up --cluster`
//! on it; submits `--jobs` one-task jobs (whole GPUs, 1, 2 or 4, and quarter and
//! half GPUs) and waits until they are bound. Then, in one browser:
//!
//! - **first paint** of `/ui/cluster`: navigation start to the frame after the heat
//!   map is drawn (`performance.now()` at the second animation frame), also split
//!   into the list call and the drawing; `--loads` page loads, median and worst;
//! - **an update applied** (A): a job is cancelled, and the time from sending the
//!   cancel to the page having redrawn that node from the watch (`Date.now()` in
//!   the page and here share the clock) — `--updates` cancels, p50 and p99;
//! - **list again and redraw** (B): what a console that polls would pay for the
//!   same change — the list call plus a full redraw, timed in the same page (the
//!   redraw is a plainer one than the console's: one group and rectangle per GPU,
//!   no colours, so B errs on the fast side).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::browser::Browser;
use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus: u32,
    /// Jobs to submit (one task each) before the page is opened.
    #[arg(long, default_value_t = 10000)]
    pub jobs: usize,
    /// The Alibaba node list the nodes' CPU, memory and GPU model come from.
    #[arg(
        long,
        default_value = "data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv"
    )]
    pub node_list: PathBuf,
    /// Page loads timed for the first paint.
    #[arg(long, default_value_t = 5)]
    pub loads: usize,
    /// Cancels timed for an update applied.
    #[arg(long, default_value_t = 20)]
    pub updates: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    nodes: usize,
    gpus: usize,
    jobs: usize,
    jobs_bound: usize,
    setup_seconds: f64,
    /// Navigation start to the heat map painted (ms), per load: the racks of the
    /// first screen and more (about one and a half screens of nodes).
    first_paint_ms: Vec<f64>,
    first_paint_p50_ms: f64,
    first_paint_max_ms: f64,
    /// Navigation start to every node drawn and painted (ms), per load.
    complete_ms: Vec<f64>,
    complete_p50_ms: f64,
    complete_max_ms: f64,
    /// Of that: navigation start to the view mounted (modules loaded, `whoami`
    /// answered), per load; the `/v1/cluster/gpus` call and the drawing (median).
    mount_ms: Vec<f64>,
    list_call_p50_ms: f64,
    draw_p50_ms: f64,
    list_bytes: usize,
    /// A: cancel sent to the node redrawn from the watch (ms).
    update_applied_ms: Vec<f64>,
    update_applied_p50_ms: f64,
    update_applied_p99_ms: f64,
    /// B: the list call plus a full redraw, in the same page (ms).
    refetch_redraw_ms: Vec<f64>,
    refetch_redraw_p50_ms: f64,
    browser: String,
}

fn median(v: &[f64]) -> f64 {
    pct(v, 0.5)
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    super::percentile(&s, p).unwrap_or(f64::NAN)
}

pub fn run(a: Args) -> i32 {
    if a.nodes == 0 || a.gpus == 0 || a.loads == 0 || a.updates == 0 {
        return fail(
            EXIT_BAD_INPUT,
            "--nodes, --gpus, --loads and --updates must be at least 1",
        );
    }
    if let Err(e) = super::browser::tools() {
        return fail(EXIT_FAILURE, e);
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
                "tessera bench console ({} nodes x {} GPUs = {} GPUs, {} jobs of which {} bound; {})",
                r.nodes, a.gpus, r.gpus, r.jobs, r.jobs_bound, r.browser
            );
            println!("{:<46} {:>10} {:>10}", "metric", "p50", "max/p99");
            let row = |m: &str, p50: f64, hi: f64| println!("{m:<46} {p50:>10.1} {hi:>10.1}");
            row(
                "first paint of /ui/cluster (ms)",
                r.first_paint_p50_ms,
                r.first_paint_max_ms,
            );
            row(
                "  of which the list call (ms)",
                r.list_call_p50_ms,
                f64::NAN,
            );
            row(
                "  of which drawing the heat map (ms)",
                r.draw_p50_ms,
                f64::NAN,
            );
            row(
                "every node drawn and painted (ms)",
                r.complete_p50_ms,
                r.complete_max_ms,
            );
            row(
                "A: update applied from the watch (ms)",
                r.update_applied_p50_ms,
                r.update_applied_p99_ms,
            );
            row(
                "B: list again + redraw, as polling would (ms)",
                r.refetch_redraw_p50_ms,
                pct(&r.refetch_redraw_ms, 0.99),
            );
            println!(
                "list reply {:.1} MiB; B/A = {:.0}x; setup {:.0} s",
                r.list_bytes as f64 / (1 << 20) as f64,
                r.refetch_redraw_p50_ms / r.update_applied_p50_ms,
                r.setup_seconds
            );
            0
        }
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

/// GPU memory (GiB) of the Alibaba trace's models (the trace does not give it).
fn gib(model: &str) -> u64 {
    match model {
        "A10" => 24,
        "V100M32" => 32,
        _ => 16,
    }
}

/// The cluster file: `n` nodes, their shapes taken in turn from the node list.
fn cluster_file(list: &Path, n: usize, gpus: u32, out: &Path) -> Result<(), String> {
    let rows = tessera_sim::trace::load_nodes(list).map_err(|e| {
        format!("{e} (give the Alibaba node list with --node-list; the repository has it under data/alibaba-gpu-v2023/)")
    })?;
    let rows: Vec<_> = rows.into_iter().filter(|r| r.gpus > 0).collect();
    if rows.is_empty() {
        return Err(format!("{}: no GPU nodes in the node list", list.display()));
    }
    let mut y = String::from("description: tessera bench console (generated)\nnodes:\n");
    for i in 0..n {
        let r = &rows[i % rows.len()];
        let rack = i / 40;
        let spine = rack / 25;
        y.push_str(&format!(
            "  - {{name: n{i:05}, cpu: {}, memory: {}Mi, gpus: {gpus}, gpu_model: {}, gpu_memory: {}Gi, network: [rack-{rack}, spine-{spine}]}}\n",
            (r.cpu_milli / 1000).max(8),
            r.memory_mib.max(1024),
            r.model,
            gib(&r.model),
        ));
    }
    std::fs::write(out, y).map_err(|e| format!("{}: {e}", out.display()))
}

struct Server {
    child: Child,
    url: String,
    key: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn up(data: &Path, cluster: &Path) -> Result<Server, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let mut child = Command::new(exe)
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--no-local-node",
            "--agent-pool-min",
            "0",
            "--data",
        ])
        .arg(data)
        .arg("--cluster")
        .arg(cluster)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting tessera up: {e}"))?;
    let (tx, rx) = mpsc::channel();
    for r in [
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
    }
    let (mut url, mut key) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(300);
    while url.is_none() || key.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let l = rx.recv_timeout(left).map_err(|_| {
            "tessera up did not print its URL and admin key within 5 minutes".to_string()
        })?;
        if let Some(u) = l.strip_prefix("tessera: listening on ") {
            url = Some(u.to_string());
        }
        if let Some(k) = l.trim().strip_prefix("export TESSERA_API_KEY=") {
            key = Some(k.to_string());
        }
    }
    Ok(Server {
        child,
        url: url.unwrap_or_default(),
        key: key.unwrap_or_default(),
    })
}

fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

async fn call(
    http: &reqwest::Client,
    s: &Server,
    m: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let mut r = http
        .request(m, format!("{}{path}", s.url))
        .bearer_auth(&s.key);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.map_err(|e| format!("{path}: {e}"))?;
    let st = resp.status();
    let text = resp.text().await.map_err(|e| format!("{path}: {e}"))?;
    if !st.is_success() {
        return Err(format!("{path}: {st} {text}"));
    }
    Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn bench(a: &Args) -> Result<Report, String> {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary folder: {e}"))?;
    let cluster = dir.path().join("cluster.yaml");
    cluster_file(&a.node_list, a.nodes, a.gpus, &cluster)?;
    let s = up(&dir.path().join("data"), &cluster)?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| e.to_string())?;
    call(
        &http,
        &s,
        reqwest::Method::POST,
        "/v1/queues",
        Some(json!({"name": "default"})),
    )
    .await?;
    // The load: one-task jobs, 16 at a time.
    let gpu = |i: usize| match i % 10 {
        0..=5 => json!({"whole": {"count": 1}}),
        6 | 7 => json!({"whole": {"count": 2}}),
        8 => json!({"whole": {"count": 4}}),
        _ => {
            json!({"shared": {"milli": if i % 20 == 9 { 250 } else { 500 }, "memory": 4u64 << 30}})
        }
    };
    let mut next = 0usize;
    while next < a.jobs {
        let batch: Vec<_> = (next..(next + 16).min(a.jobs))
            .map(|i| {
                let body = json!({"name": format!("j{i:05}"), "queue": "default",
                    "tasks": [{"name": "t", "resources": {"cpu_milli": 100}, "gpu": gpu(i)}]});
                call(&http, &s, reqwest::Method::POST, "/v1/jobs", Some(body))
            })
            .collect();
        for r in futures_util::future::join_all(batch).await {
            r?;
        }
        next += 16;
    }
    // Bound: the cluster view counts holders.
    let deadline = Instant::now() + Duration::from_secs(600);
    let (bytes, bound) = loop {
        let r = http
            .get(format!("{}/v1/cluster/gpus", s.url))
            .bearer_auth(&s.key)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body = r.bytes().await.map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let bound: usize = v["nodes"]
            .as_array()
            .map(|n| {
                n.iter()
                    .map(|n| n["holders"].as_array().map_or(0, Vec::len))
                    .sum()
            })
            .unwrap_or(0);
        if bound >= a.jobs || Instant::now() > deadline {
            break (body.len(), bound);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let setup_seconds = t0.elapsed().as_secs_f64();

    let b = Browser::start(1600, 1000).await?;
    let version = b
        .js(
            "return navigator.userAgent.match(/Chrome\\/[0-9.]+/)?.[0] || navigator.userAgent",
            vec![],
        )
        .await?
        .as_str()
        .unwrap_or("")
        .replace('/', " ");
    let timeout = Duration::from_secs(120);
    let (mut paints, mut lists, mut draws, mut mounts, mut completes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..a.loads {
        let target = if i == 0 {
            format!("{}/ui/cluster#key={}", s.url, s.key)
        } else {
            format!("{}/ui/cluster", s.url)
        };
        b.goto(&target).await?;
        let d = b
            .wait_for(
                "the heat map's first paint",
                "const c = window.__console; return c && c.paints.cluster && [c.paints.cluster, c.paints.clusterDetail.fetchMs, c.paints.clusterDetail.drawMs, c.paints.clusterDetail.mountMs]",
                timeout,
            )
            .await?;
        // The racks below the first screen are drawn right after, in short chunks.
        let all = b
            .wait_for(
                "the whole heat map drawn",
                "const c = window.__console; return c && c.paints.clusterComplete",
                timeout,
            )
            .await?;
        completes.push(all.as_f64().unwrap_or(f64::NAN));
        paints.push(d[0].as_f64().unwrap_or(f64::NAN));
        lists.push(d[1].as_f64().unwrap_or(f64::NAN));
        draws.push(d[2].as_f64().unwrap_or(f64::NAN));
        mounts.push(d[3].as_f64().unwrap_or(f64::NAN));
    }
    // A: cancels, each applied from the watch.
    let mut applied = Vec::new();
    for i in 0..a.updates {
        let name = format!("j{:05}", i * 7 % a.jobs.max(1));
        let job = call(
            &http,
            &s,
            reqwest::Method::GET,
            &format!("/v1/jobs/{name}"),
            None,
        )
        .await?;
        let Some(node) = job["status"]["tasks"]["t"]["node"]
            .as_str()
            .map(str::to_string)
        else {
            continue;
        };
        let sent = now_ms();
        call(
            &http,
            &s,
            reqwest::Method::POST,
            &format!("/v1/jobs/{name}/cancel"),
            Some(json!({})),
        )
        .await?;
        let at = b
            .wait_for(
                &format!("{node} redrawn after cancelling {name}"),
                &format!(
                    "const a = window.__console.applied.filter(x => x.node === {} && x.painted && x.at >= {sent}); return a.length && a[0].painted",
                    json!(node)
                ),
                timeout,
            )
            .await?;
        applied.push(at.as_f64().unwrap_or(f64::NAN) - sent);
    }
    // B: the list call and a full redraw, as a polling console would per change.
    let mut refetch = Vec::new();
    for _ in 0..a.loads {
        let ms = b
            .client
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 const el = document.getElementById('heatmap');
                 const old = el.innerHTML;
                 const t = performance.now();
                 const k = sessionStorage.getItem('tessera.key');
                 fetch('/v1/cluster/gpus', {headers: {Authorization: 'Bearer ' + k}}).then(r => r.json()).then(d => {
                   const svg = d.nodes.map(n => `<svg class=\"node\" data-node=\"${n.name}\">${(n.gpus || []).map(g => `<g class=\"gpu\" data-gpu=\"${g.index}\"><rect width=\"16\" height=\"16\"/></g>`).join('')}</svg>`).join('');
                   el.innerHTML = svg;
                   requestAnimationFrame(() => requestAnimationFrame(() => { const ms = performance.now() - t; el.innerHTML = old; done(ms); }));
                 }).catch(e => done(-1));",
                vec![],
            )
            .await
            .map_err(|e| format!("timing a list and redraw: {e}"))?;
        refetch.push(ms.as_f64().unwrap_or(f64::NAN));
    }
    let _ = b.client.clone().close().await;
    let _ = std::io::stdout().flush();
    Ok(Report {
        nodes: a.nodes,
        gpus: a.nodes * a.gpus as usize,
        jobs: a.jobs,
        jobs_bound: bound,
        setup_seconds,
        first_paint_p50_ms: median(&paints),
        first_paint_max_ms: pct(&paints, 1.0),
        complete_p50_ms: median(&completes),
        complete_max_ms: pct(&completes, 1.0),
        complete_ms: completes,
        list_call_p50_ms: median(&lists),
        draw_p50_ms: median(&draws),
        list_bytes: bytes,
        update_applied_p50_ms: median(&applied),
        update_applied_p99_ms: pct(&applied, 0.99),
        refetch_redraw_p50_ms: median(&refetch),
        first_paint_ms: paints,
        mount_ms: mounts,
        update_applied_ms: applied,
        refetch_redraw_ms: refetch,
        browser: version,
    })
}
