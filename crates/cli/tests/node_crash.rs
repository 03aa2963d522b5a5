//! `kill -9` of `tessera up` in the middle of an eviction: the victim ignores
//! SIGTERM and has a long grace period, so it is still `evicting` when the server
//! dies. Its sandbox dies with the server (the runtime's reaper), and the restarted
//! server records it evicted, starts the preemptor it was waiting for, and places
//! the victim again afterwards. Root only (sandboxes); fails without it when `CI` is
//! set.

mod common;

use std::time::Duration;

use common::{Up, up};
use serde_json::{Value, json};

fn root_or_skip(test: &str) -> bool {
    let root = common::is_root();
    if !root {
        assert!(std::env::var_os("CI").is_none(), "{test}: needs root");
        eprintln!("SKIPPED {test}: job tasks run in sandboxes, which need root here");
    }
    root
}

async fn call(up: &Up, key: &str, m: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let c = reqwest::Client::new();
    let mut r = c.request(m, format!("{}{path}", up.url)).bearer_auth(key);
    if let Some(b) = body {
        r = r.json(&b);
    }
    r.send().await.unwrap().json().await.unwrap_or(Value::Null)
}

async fn wait(up: &Up, key: &str, job: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut v = Value::Null;
    for _ in 0..600 {
        v = call(
            up,
            key,
            reqwest::Method::GET,
            &format!("/v1/jobs/{job}"),
            None,
        )
        .await;
        if pred(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{job}: never {what}: {v}");
}

fn sleeping(arg: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
            String::from_utf8_lossy(&c).replace('\0', " ").trim() == format!("sleep {arg}")
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_eviction_reconciles_on_restart() {
    if !root_or_skip("a_crash_mid_eviction_reconciles_on_restart") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = up(&data);
    let key = server.key.clone().expect("first start prints the key");
    let post = reqwest::Method::POST;
    call(
        &server,
        &key,
        post.clone(),
        "/v1/queues",
        Some(json!({"name": "q"})),
    )
    .await;
    let nodes = call(&server, &key, reqwest::Method::GET, "/v1/nodes", None).await;
    let cpu = nodes["items"][0]["allocatable"]["cpu_milli"]
        .as_u64()
        .unwrap();
    let big = cpu * 3 / 4;
    let job = |name: &str, prio: i32, cmd: &str| {
        json!({"name": name, "queue": "q", "priority": prio,
               "termination_grace_period_seconds": 600,
               "tasks": [{"name": "t", "resources": {"cpu_milli": big, "memory": 67108864},
                          "command": ["sh", "-c", cmd]}]})
    };
    call(
        &server,
        &key,
        post.clone(),
        "/v1/jobs",
        Some(job("low", 1, "trap '' TERM; sleep 8989")),
    )
    .await;
    wait(&server, &key, "low", "running", |v| {
        v["status"]["tasks"]["t"]["state"] == "running"
    })
    .await;
    for _ in 0..200 {
        if sleeping("8989") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(sleeping("8989"));
    call(
        &server,
        &key,
        post.clone(),
        "/v1/jobs",
        Some(job("urgent", 100, "echo ran")),
    )
    .await;
    wait(&server, &key, "low", "evicting", |v| {
        v["status"]["tasks"]["t"]["state"] == "evicting"
    })
    .await;
    // It ignores SIGTERM and has 600 s of grace: still there, the preemptor waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sleeping("8989"));
    let u = call(&server, &key, reqwest::Method::GET, "/v1/jobs/urgent", None).await;
    assert!(
        u["status"]["tasks"]["t"].get("state").is_none(),
        "the preemptor started early: {u}"
    );

    // SIGKILL: no shutdown path runs. The victim's sandbox goes with the server.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let mut gone = false;
    for _ in 0..250 {
        if !sleeping("8989") {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the victim outlived the server");

    let server = up(&data);
    // Recorded evicted at the restart (it may be placed again at once: the counter
    // and the event stay).
    wait(&server, &key, "low", "evicted", |v| {
        v["status"]["tasks"]["t"]["evictions"] == 1
    })
    .await;
    let u = wait(&server, &key, "urgent", "succeeded", |v| {
        v["status"]["phase"] == "succeeded"
    })
    .await;
    let events = call(&server, &key, reqwest::Method::GET, "/v1/events", None).await;
    let evicted_at = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["object"] == "job/low" && e["reason"] == "TaskEvicted")
        .and_then(|e| e["at"].as_u64())
        .expect("a TaskEvicted event");
    let started = u["status"]["tasks"]["t"]["started_at"].as_u64().unwrap();
    assert!(
        started >= evicted_at,
        "the preemptor started at {started}, before the victim was recorded gone at {evicted_at}"
    );
    // Room again: the victim runs once more.
    wait(&server, &key, "low", "placed again", |v| {
        v["status"]["tasks"]["t"]["state"] == "running" && v["status"]["tasks"]["t"]["attempt"] == 2
    })
    .await;
    call(&server, &key, post, "/v1/jobs/low/cancel", None).await;
}
