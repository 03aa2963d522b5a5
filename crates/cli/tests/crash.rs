//! Crash test: submit jobs concurrently, `kill -9` the server at a random moment,
//! restart it on the same store, and check that every acknowledged submission is
//! there, none twice, and no node holds more than it has (no task bound twice).
//! Runs on SQLite always, and on PostgreSQL when `TESSERA_PG_URL` is set.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Up, up_with};
use serde_json::{Value, json};

const ROUNDS: usize = 3;
const WORKERS: usize = 8;

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Submits jobs from `WORKERS` tasks until the server dies; returns acknowledged names.
async fn submit_until_killed(
    server: &mut Up,
    key: &str,
    round: usize,
    kill_after: usize,
) -> Vec<String> {
    let acked = Arc::new(Mutex::new(Vec::new()));
    let http = reqwest::Client::new();
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (http, url, key, acked) = (
            http.clone(),
            server.url.clone(),
            key.to_string(),
            acked.clone(),
        );
        workers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("r{round}-w{w}-{i}");
                let job = json!({"name": name, "queue": "q", "tasks": [
                    {"name": "a", "resources": {"cpu_milli": 1, "memory": 1}},
                    {"name": "b", "resources": {"cpu_milli": 1, "memory": 1}}]});
                let r = http
                    .post(format!("{url}/v1/jobs"))
                    .bearer_auth(&key)
                    .json(&job)
                    .send()
                    .await;
                match r {
                    Ok(resp) if resp.status() == reqwest::StatusCode::CREATED => {
                        acked.lock().unwrap().push(name)
                    }
                    Ok(resp) => panic!("unexpected {}: {:?}", resp.status(), resp.text().await),
                    Err(_) => return,
                }
            }
        }));
    }
    while acked.lock().unwrap().len() < kill_after {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // SIGKILL: no shutdown path runs.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    for w in workers {
        w.await.unwrap();
    }
    Arc::try_unwrap(acked).unwrap().into_inner().unwrap()
}

async fn crash_rounds(args: Vec<String>) {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = up_with(&a);
    let key = server
        .key
        .clone()
        .expect("a fresh store prints the admin key");
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/v1/queues", server.url))
        .bearer_auth(&key)
        .json(&json!({"name": "q"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::CREATED);
    let mut all_acked = Vec::new();
    let mut rng = seed();
    for round in 0..ROUNDS {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let kill_after = 10 + (rng >> 33) as usize % 150;
        let acked = submit_until_killed(&mut server, &key, round, kill_after).await;
        assert!(acked.len() >= kill_after);
        all_acked.extend(acked);
        server = up_with(&a);
        assert_eq!(server.key, None, "a restart must not bootstrap again");
    }
    let jobs: Value = http
        .get(format!("{}/v1/jobs", server.url))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let items = jobs["items"].as_array().unwrap();
    let names: Vec<&str> = items.iter().map(|j| j["name"].as_str().unwrap()).collect();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "a job is listed twice");
    for a in &all_acked {
        assert!(
            unique.contains(a.as_str()),
            "acknowledged job {a} is missing after kill -9"
        );
    }
    // No node holds more tasks or CPU than it has.
    let nodes: Value = http
        .get(format!("{}/v1/nodes", server.url))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for n in nodes["items"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        let (mut pods, mut cpu) = (0u64, 0u64);
        // Jobs that are over hold nothing (the scheduler frees their tasks).
        let active = items.iter().filter(|j| {
            !["succeeded", "failed", "cancelled"]
                .contains(&j["status"]["phase"].as_str().unwrap_or(""))
        });
        for j in active {
            for (t, st) in j["status"]["tasks"].as_object().into_iter().flatten() {
                if st["node"] == name {
                    pods += 1;
                    let spec = j["spec"]["tasks"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|x| x["name"] == t.as_str())
                        .unwrap();
                    cpu += spec["resources"]["cpu_milli"].as_u64().unwrap();
                }
            }
        }
        assert!(
            pods <= n["allocatable"]["pods"].as_u64().unwrap(),
            "{name} holds {pods} tasks"
        );
        assert!(
            cpu <= n["allocatable"]["cpu_milli"].as_u64().unwrap(),
            "{name} holds {cpu} milli-CPU"
        );
    }
    eprintln!(
        "crash test: {} acknowledged over {ROUNDS} kill -9 rounds, all present",
        all_acked.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_job_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").to_str().unwrap().to_string();
    crash_rounds(vec!["--data".into(), data]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_job_postgres() {
    let Ok(url) = std::env::var("TESSERA_PG_URL") else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "PostgreSQL skipped: TESSERA_PG_URL is not set"
        );
        return;
    };
    let schema = format!("crash_{}_{}", std::process::id(), seed() % 1_000_000_007);
    crash_rounds(vec![
        "--postgres".into(),
        url,
        "--postgres-schema".into(),
        schema,
    ])
    .await;
}
