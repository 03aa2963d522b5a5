//! `/metrics` in Prometheus conventions (issue 25 item 5): request latency per route
//! family, the scheduler's cycle and bind latency, and the tenants' families
//! (queues, jobs by phase, GPUs by model, sandboxes by state and class, tokens and
//! cost), each tenant's series served only to keys that may see that tenant.
//! `promtool check metrics` (Debian's `prometheus` package) lints what a system key
//! scrapes; with `CI` set a missing promtool fails the test.

mod common;

use common::{Server, StatusCode, job, json};

async fn scrape(base: &str, key: Option<&str>) -> (StatusCode, String) {
    let mut r = reqwest::Client::new().get(format!("{base}/metrics"));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let r = r.send().await.unwrap();
    let st = r.status();
    (st, r.text().await.unwrap())
}

/// The value of the one sample whose line starts with `series` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn sandboxes_here() -> Option<tessera_sandbox::InitProgram> {
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")))
        .unwrap_or(false);
    match (root, tessera_sandbox::InitProgram::locate()) {
        (true, Some(p)) => Some(p),
        _ if std::env::var_os("CI").is_some() => {
            panic!("metrics: sandboxes need root and tessera-sandbox-init here")
        }
        _ => {
            eprintln!(
                "metrics: no sandboxes here (root and tessera-sandbox-init needed): their series are not checked"
            );
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_prometheus_conventions_and_keep_tenants_apart() {
    let init = sandboxes_here();
    let s = Server::start_with(|c| {
        common::simulated_cluster(c, vec![common::h100_node("gpu-0")]);
        if let Some(init) = init.clone() {
            c.sandboxes = tessera_server::sandboxes::SandboxesConfig {
                enabled: true,
                init: Some(init),
                warm: 0,
                max_per_tenant: 3,
            };
        }
    })
    .await;
    let alpha = s.tenant("alpha").await;
    let beta = s.tenant("beta").await;
    alpha.post("/v1/queues", json!({"name": "q"})).await;
    let mut j = job("two", 1);
    j["tasks"][0]["gpu"] = json!(2);
    let (st, v) = alpha.post("/v1/jobs", j).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    alpha
        .wait_for("/v1/jobs/two", |v| v["status"]["phase"] == "running")
        .await;
    // beta's job asks for more GPUs than the node has: it waits.
    beta.post("/v1/queues", json!({"name": "q"})).await;
    let mut j = job("big", 1);
    j["tasks"][0]["gpu"] = json!(8);
    let (st, v) = beta.post("/v1/jobs", j).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    beta.wait_for("/v1/jobs/big", |v| {
        v["status"]["pending_reason"].is_string()
    })
    .await;
    for (t, q) in [(&alpha, 120.0), (&beta, 7.0)] {
        let rec = json!({"session": "s1", "runtime": "bot", "kind": "tokens_out", "quantity": q, "source_id": "m-1"});
        let (st, v) = t.post("/v1/usage", rec).await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    if init.is_some() {
        let (st, v) = alpha.post("/v1/sandboxes", json!({})).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }

    // Without a key: the process's own families, no tenant's series.
    let (st, open) = scrape(&s.base, None).await;
    assert_eq!(st, StatusCode::OK);
    assert!(!open.contains("tenant="), "{open}");
    assert!(!open.contains("alpha") && !open.contains("beta"), "{open}");
    let posts = value(
        &open,
        "tessera_http_request_duration_seconds_count{family=\"jobs\",method=\"POST\",class=\"2xx\"}",
    );
    assert_eq!(posts, Some(2.0), "{open}");
    assert!(
        value(&open, "tessera_scheduler_cycle_duration_seconds_count").unwrap() >= 1.0,
        "{open}"
    );
    assert!(
        value(&open, "tessera_scheduler_bind_duration_seconds_count").unwrap() >= 1.0,
        "{open}"
    );

    // alpha's key: alpha's series only.
    let (st, a) = scrape(&s.base, alpha.key.as_deref()).await;
    assert_eq!(st, StatusCode::OK);
    assert!(!a.contains("beta"), "{a}");
    for (series, want) in [
        (
            "tessera_gpus_allocated{tenant=\"alpha\",model=\"H100-80GB\"}",
            2.0,
        ),
        (
            "tessera_jobs{tenant=\"alpha\",queue=\"q\",phase=\"running\"}",
            1.0,
        ),
        (
            "tessera_queue_allocated{tenant=\"alpha\",queue=\"q\",resource=\"gpu\"}",
            2.0,
        ),
        (
            "tessera_tokens_total{tenant=\"alpha\",type=\"output\"}",
            120.0,
        ),
    ] {
        assert_eq!(value(&a, series), Some(want), "{series} in\n{a}");
    }
    if init.is_some() {
        assert_eq!(
            value(
                &a,
                "tessera_sandboxes{tenant=\"alpha\",state=\"running\",runtime_class=\"standard\"}"
            ),
            Some(1.0),
            "{a}"
        );
    }

    // The system's key: every tenant.
    let (_, all) = scrape(&s.base, s.admin.key.as_deref()).await;
    assert_eq!(
        value(
            &all,
            "tessera_queue_pending{tenant=\"beta\",queue=\"q\",resource=\"gpu\"}"
        ),
        Some(8.0),
        "{all}"
    );
    assert_eq!(
        value(
            &all,
            "tessera_jobs{tenant=\"beta\",queue=\"q\",phase=\"pending\"}"
        ),
        Some(1.0),
        "{all}"
    );
    assert_eq!(
        value(
            &all,
            "tessera_tokens_total{tenant=\"beta\",type=\"output\"}"
        ),
        Some(7.0),
        "{all}"
    );

    // A wrong key is refused, not served as an anonymous scrape.
    let (st, _) = scrape(&s.base, Some("tsk_wrong")).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);

    promtool_check(&all);
}

/// `promtool check metrics` over `text`: no lint problems.
fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        if std::env::var_os("CI").is_some() {
            panic!("promtool is not installed (apt-get install prometheus)");
        }
        eprintln!("SKIPPED promtool check: promtool is not installed (apt-get install prometheus)");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n--- scraped:\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
