//! Drives a real server on loopback: authentication (401), roles (403), tenant
//! isolation (404, never another tenant's data), bad bodies (400 with the field
//! path), the body limit (413), conflicts (409), the scheduler loop and watches.

use std::time::Duration;

mod common;

use common::{Client, Method, Server, StatusCode, Value, code, job, json};

/// A server from the shared harness, with calls that take the key per call.
struct Env {
    base: String,
    admin: String,
    http: reqwest::Client,
    server: Server,
}

const LIMIT: usize = 64 * 1024;

async fn env() -> Env {
    let server = Server::start_with(|c| c.body_limit = LIMIT).await;
    Env {
        base: server.base.clone(),
        admin: server.admin.key().to_string(),
        http: reqwest::Client::new(),
        server,
    }
}

impl Env {
    async fn call(
        &self,
        key: Option<&str>,
        m: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        Client::new(&self.base, key).call(m, path, body).await
    }

    async fn raw(&self, key: &str, path: &str, ct: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let (st, v) = Client::new(&self.base, Some(key))
            .raw(Method::POST, path, ct, body)
            .await;
        (st, if v.is_string() { Value::Null } else { v })
    }

    /// Creates a tenant; returns its admin key.
    async fn tenant(&self, name: &str) -> String {
        self.server.tenant(name).await.key().to_string()
    }

    async fn key(&self, admin: &str, subject: &str, role: &str) -> String {
        Client::new(&self.base, Some(admin))
            .key_for(subject, role)
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_calls_get_401() {
    let e = env().await;
    let (st, v) = e.call(None, Method::GET, "/v1/jobs", None).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::UNAUTHORIZED, "unauthenticated")
    );
    assert_eq!(v["status"], 401);
    for bad in [
        "nonsense",
        "tsk_000000000000_0000000000000000000000000000000000000000000000000000000000000000",
    ] {
        let (st, _) = e.call(Some(bad), Method::GET, "/v1/jobs", None).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{bad}");
    }
    // A real key id with a wrong secret.
    let (id, _) = e.admin.trim_start_matches("tsk_").split_once('_').unwrap();
    let forged = format!("tsk_{id}_{}", "ab".repeat(32));
    let (st, _) = e.call(Some(&forged), Method::GET, "/v1/jobs", None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    // Expired and revoked keys.
    let (st, v) = e
        .call(
            Some(&e.admin),
            Method::POST,
            "/v1/apikeys",
            Some(json!({"subject": "bot", "role": "viewer", "expires_in_seconds": 0})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let expired = v["key"].as_str().unwrap().to_string();
    assert!(v.get("hash").is_none() && v.get("salt").is_none());
    let (st, v) = e
        .call(Some(&expired), Method::GET, "/v1/whoami", None)
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{v}");
    let k = e.key(&e.admin, "temp", "viewer").await;
    let (st, _) = e.call(Some(&k), Method::GET, "/v1/whoami", None).await;
    assert_eq!(st, StatusCode::OK);
    let id = k.trim_start_matches("tsk_").split_once('_').unwrap().0;
    let (st, _) = e
        .call(
            Some(&e.admin),
            Method::DELETE,
            &format!("/v1/apikeys/{id}"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = e.call(Some(&k), Method::GET, "/v1/whoami", None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    // The key list never shows secrets.
    let (_, v) = e
        .call(Some(&e.admin), Method::GET, "/v1/apikeys", None)
        .await;
    assert!(!v.to_string().contains(&k[20..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_are_enforced_with_403() {
    let e = env().await;
    let a = e.tenant("alpha").await;
    let viewer = e.key(&a, "vic", "viewer").await;
    let dev = e.key(&a, "dev", "developer").await;
    let (st, v) = e
        .call(
            Some(&viewer),
            Method::POST,
            "/v1/queues",
            Some(json!({"name": "q"})),
        )
        .await;
    assert_eq!((st, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
    let (st, _) = e
        .call(
            Some(&dev),
            Method::POST,
            "/v1/queues",
            Some(json!({"name": "q"})),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = e
        .call(
            Some(&a),
            Method::POST,
            "/v1/queues",
            Some(json!({"name": "q"})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _) = e
        .call(Some(&viewer), Method::POST, "/v1/jobs", Some(job("j", 1)))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = e
        .call(Some(&dev), Method::POST, "/v1/jobs", Some(job("j", 1)))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _) = e
        .call(
            Some(&dev),
            Method::POST,
            "/v1/apikeys",
            Some(json!({"subject": "x"})),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    // Only the system tenant's admins create tenants or register nodes.
    let (st, _) = e
        .call(
            Some(&a),
            Method::POST,
            "/v1/tenants",
            Some(json!({"name": "gamma"})),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let node = json!({"name": "n1", "allocatable": {"cpu_milli": 1000}});
    let (st, _) = e
        .call(Some(&a), Method::PUT, "/v1/nodes/n1", Some(node.clone()))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = e
        .call(Some(&e.admin), Method::PUT, "/v1/nodes/n1", Some(node))
        .await;
    assert_eq!(st, StatusCode::OK);
    // The viewer reads.
    let (st, v) = e.call(Some(&viewer), Method::GET, "/v1/jobs", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_see_each_other() {
    let e = env().await;
    let a = e.tenant("alpha").await;
    let b = e.tenant("beta").await;
    for k in [&a, &b] {
        let (st, _) = e
            .call(
                Some(k),
                Method::POST,
                "/v1/queues",
                Some(json!({"name": "q"})),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED);
    }
    let (st, _) = e
        .call(Some(&a), Method::POST, "/v1/jobs", Some(job("secret-a", 1)))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    // Same name in another tenant is another object.
    let (st, _) = e
        .call(Some(&b), Method::POST, "/v1/jobs", Some(job("secret-a", 2)))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _) = e
        .call(Some(&a), Method::POST, "/v1/jobs", Some(job("only-a", 1)))
        .await;
    assert_eq!(st, StatusCode::CREATED);

    let (_, v) = e.call(Some(&b), Method::GET, "/v1/jobs", None).await;
    let names: Vec<_> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["secret-a"]);
    assert_eq!(v["items"][0]["tenant"], "beta");
    assert_eq!(v["items"][0]["spec"]["tasks"].as_array().unwrap().len(), 2);
    // Reading, cancelling, or updating another tenant's object: 404, same as absent.
    for (m, p) in [
        (Method::GET, "/v1/jobs/only-a"),
        (Method::POST, "/v1/jobs/only-a/cancel"),
        (Method::GET, "/v1/tenants/alpha"),
    ] {
        let (st, v) = e.call(Some(&b), m.clone(), p, None).await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::NOT_FOUND, "not_found"),
            "{m} {p}"
        );
        let (st2, v2) = e
            .call(
                Some(&b),
                m,
                &p.replace("only-a", "never-existed")
                    .replace("alpha", "nope"),
                None,
            )
            .await;
        assert_eq!(st2, StatusCode::NOT_FOUND);
        assert_eq!(v["title"], v2["title"]);
    }
    let (st, _) = e
        .call(Some(&b), Method::DELETE, "/v1/queues/zzz", None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (_, v) = e.call(Some(&a), Method::GET, "/v1/jobs/only-a", None).await;
    assert!(v["status"]["phase"].as_str().is_some());
    // Keys of another tenant cannot be revoked either.
    let (_, keys) = e.call(Some(&a), Method::GET, "/v1/apikeys", None).await;
    let a_key_id = keys["items"][0]["id"].as_str().unwrap().to_string();
    let (st, _) = e
        .call(
            Some(&b),
            Method::DELETE,
            &format!("/v1/apikeys/{a_key_id}"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Tenants list: own only.
    let (_, v) = e.call(Some(&b), Method::GET, "/v1/tenants", None).await;
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    // Events and audit stay in the tenant.
    let (_, v) = e.call(Some(&b), Method::GET, "/v1/audit", None).await;
    assert!(!v.to_string().contains("only-a"), "{v}");
    let (_, v) = e.call(Some(&b), Method::GET, "/v1/events", None).await;
    assert!(!v.to_string().contains("only-a"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_get_400_with_the_field_and_big_ones_413() {
    let e = env().await;
    let a = e.tenant("alpha").await;
    e.call(
        Some(&a),
        Method::POST,
        "/v1/queues",
        Some(json!({"name": "q"})),
    )
    .await;
    let (st, v) = e
        .raw(
            &a,
            "/v1/jobs",
            "application/json",
            b"{\"name\": \"x\", ".to_vec(),
        )
        .await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{v}"
    );
    let mut unknown = job("j", 1);
    unknown["tasks"][0]["colour"] = json!("red");
    let (st, v) = e
        .call(Some(&a), Method::POST, "/v1/jobs", Some(unknown))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(v["field"], "tasks[0].colour", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("colour"), "{v}");
    let mut wrong = job("j", 2);
    wrong["tasks"][1]["resources"]["cpu_milli"] = json!("lots");
    let (st, v) = e
        .call(Some(&a), Method::POST, "/v1/jobs", Some(wrong))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(v["field"], "tasks[1].resources.cpu_milli", "{v}");
    let (st, v) = e
        .call(
            Some(&a),
            Method::POST,
            "/v1/jobs",
            Some(json!({"name": "Bad Name", "queue": "q", "tasks": []})),
        )
        .await;
    assert_eq!(
        (st, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("name")),
        "{v}"
    );
    let (st, v) = e
        .call(
            Some(&a),
            Method::POST,
            "/v1/jobs",
            Some(json!({"name": "j", "queue": "nope", "tasks": [{"name": "t"}]})),
        )
        .await;
    assert_eq!(
        (st, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("queue")),
        "{v}"
    );
    // YAML is accepted, and its errors name the field too.
    let yaml = "name: y\nqueue: q\ntasks:\n  - name: t0\n    resources: {cpu_milli: 100}\n";
    let (st, v) = e.raw(&a, "/v1/jobs", "application/yaml", yaml.into()).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let yaml = "name: y2\nqueue: q\ntasks:\n  - name: t0\n    resources: {cpu_milli: [1]}\n";
    let (st, v) = e.raw(&a, "/v1/jobs", "application/yaml", yaml.into()).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(v["field"], "tasks[0].resources.cpu_milli", "{v}");
    // A job file's short words (docs/api.md, "Job files") are folded into the stored form.
    let yaml = "name: y3\nqueue: q\ntasks:\n  - name: w\n    replicas: 2\n    resources: {cpu: 0.1, memory: 64Mi}\n";
    let (st, v) = e.raw(&a, "/v1/jobs", "application/yaml", yaml.into()).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let tasks = v["spec"]["tasks"]
        .as_array()
        .expect("the stored job")
        .clone();
    let names: Vec<_> = tasks.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["w-0", "w-1"], "{v}");
    assert_eq!(tasks[0]["resources"]["cpu_milli"], 100, "{v}");
    assert_eq!(tasks[0]["resources"]["memory"], 64 << 20, "{v}");
    assert!(tasks[0].get("replicas").is_none(), "{v}");
    let yaml = "name: y4\nqueue: q\ntasks:\n  - name: w\n    gpu: 1.5\n";
    let (st, v) = e.raw(&a, "/v1/jobs", "application/yaml", yaml.into()).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(v["field"], "tasks[0].gpu", "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("gpu_milli: 500"),
        "{v}"
    );
    let (st, _) = e.raw(&a, "/v1/jobs", "text/plain", b"hi".to_vec()).await;
    assert_eq!(st, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Over the limit.
    let mut big = job("big", 1);
    big["tasks"][0]["command"] = json!(["x".repeat(LIMIT)]);
    let (st, v) = e.call(Some(&a), Method::POST, "/v1/jobs", Some(big)).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
        "{v}"
    );
    // Problem documents have the RFC 9457 shape.
    assert_eq!(v["status"], 413);
    assert!(v["type"].as_str().unwrap().starts_with("https://"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_versions_and_duplicates_get_409() {
    let e = env().await;
    let a = e.tenant("alpha").await;
    let (_, q) = e
        .call(
            Some(&a),
            Method::POST,
            "/v1/queues",
            Some(json!({"name": "q"})),
        )
        .await;
    let (st, v) = e
        .call(
            Some(&a),
            Method::POST,
            "/v1/queues",
            Some(json!({"name": "q"})),
        )
        .await;
    assert_eq!((st, code(&v)), (StatusCode::CONFLICT, "already_exists"));
    let rv = q["resource_version"].as_u64().unwrap();
    let (st, v) = e
        .call(
            Some(&a),
            Method::PUT,
            "/v1/queues/q",
            Some(json!({"name": "q", "weight": 2, "resource_version": rv})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = e
        .call(
            Some(&a),
            Method::PUT,
            "/v1/queues/q",
            Some(json!({"name": "q", "weight": 3, "resource_version": rv})),
        )
        .await;
    assert_eq!((st, code(&v)), (StatusCode::CONFLICT, "conflict"), "{v}");
    let (_, v) = e.call(Some(&a), Method::GET, "/v1/queues/q", None).await;
    assert_eq!(v["weight"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_loop_binds_jobs_and_records_events() {
    let e = env().await;
    let a = e.tenant("alpha").await;
    e.call(
        Some(&a),
        Method::POST,
        "/v1/queues",
        Some(json!({"name": "q"})),
    )
    .await;
    let (st, _) = e
        .call(Some(&a), Method::POST, "/v1/jobs", Some(job("train", 2)))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let mut v = Value::Null;
    for _ in 0..200 {
        (_, v) = e.call(Some(&a), Method::GET, "/v1/jobs/train", None).await;
        if v["status"]["phase"] == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(v["status"]["phase"], "running", "{v}");
    let node = tessera_server::node::local_name();
    assert_eq!(v["status"]["tasks"]["t0"]["node"], node.as_str());
    let (_, ev) = e.call(Some(&a), Method::GET, "/v1/events", None).await;
    assert!(
        ev["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["reason"] == "Scheduled"),
        "{ev}"
    );
    let (_, n) = e.call(Some(&a), Method::GET, "/v1/nodes", None).await;
    assert_eq!(n["items"][0]["name"], node.as_str());
    // Cancel releases the tasks.
    let (st, v) = e
        .call(Some(&a), Method::POST, "/v1/jobs/train/cancel", None)
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["status"]["phase"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_only_the_callers_tenant() {
    let e = env().await;
    let a = e.tenant("alpha").await;
    let b = e.tenant("beta").await;
    for k in [&a, &b] {
        e.call(
            Some(k),
            Method::POST,
            "/v1/queues",
            Some(json!({"name": "q"})),
        )
        .await;
    }
    let mut resp = e
        .http
        .get(format!("{}/v1/watch?kind=job", e.base))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    e.call(
        Some(&b),
        Method::POST,
        "/v1/jobs",
        Some(job("from-beta", 1)),
    )
    .await;
    e.call(
        Some(&a),
        Method::POST,
        "/v1/jobs",
        Some(job("from-alpha", 1)),
    )
    .await;
    let mut seen = String::new();
    while !seen.contains("from-alpha") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), resp.chunk())
            .await
            .expect("the watch delivers")
            .unwrap()
            .expect("stream open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("event: created"), "{seen}");
    assert!(!seen.contains("from-beta"), "{seen}");
    let (st, v) = e
        .call(Some(&a), Method::GET, "/v1/watch?kind=apikey", None)
        .await;
    assert_eq!(
        (st, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("kind"))
    );
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("session, sandbox, pool"),
        "{v}"
    );
    // A hostile `after` is refused or waits, never breaks the server.
    for kind in ["job", "session"] {
        let r = e
            .http
            .get(format!(
                "{}/v1/watch?kind={kind}&after={}",
                e.base,
                u64::MAX
            ))
            .bearer_auth(&a)
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success() || r.status().is_client_error(),
            "{kind}: {}",
            r.status()
        );
    }
    let (st, _) = e.call(Some(&a), Method::GET, "/healthz", None).await;
    assert_eq!(st, StatusCode::OK);
    // Pools' figures are sampled, not kept: there is nothing to resume from.
    let (st, v) = e
        .call(Some(&a), Method::GET, "/v1/watch?kind=pool&after=5", None)
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::GONE, Some("compacted")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_every_route_and_each_requires_a_key() {
    let e = env().await;
    let (st, doc) = e.call(None, Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    for r in tessera_server::api::ROUTE_TABLES
        .iter()
        .flat_map(|t| t.iter())
    {
        assert!(
            doc["paths"][r.path][r.method].is_object(),
            "{} {}",
            r.method,
            r.path
        );
        let path = r
            .path
            .replace("{name}", "x")
            .replace("{id}", "x")
            .replace("{subject}", "x");
        let m = Method::from_bytes(r.method.to_uppercase().as_bytes()).unwrap();
        let (st, _) = e.call(None, m, &path, None).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{} {}", r.method, r.path);
    }
    let (st, v) = e
        .call(Some(&e.admin), Method::GET, "/v2/nothing", None)
        .await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    // The audit log names who did what.
    let (_, v) = e.call(Some(&e.admin), Method::GET, "/v1/audit", None).await;
    assert!(v["items"].as_array().unwrap().is_empty());
    e.tenant("alpha").await;
    let (_, v) = e.call(Some(&e.admin), Method::GET, "/v1/audit", None).await;
    assert_eq!(v["items"][0]["object"], "tenant/alpha");
    assert_eq!(v["items"][0]["subject"], "admin");
    // Prometheus counters saw the 401s above.
    let m = e
        .http
        .get(format!("{}/metrics", e.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = m
        .lines()
        .find(|l| l.starts_with("tessera_http_responses_total{class=\"4xx\"}"))
        .unwrap();
    let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= tessera_server::api::ROUTES.len() as u64, "{m}");
    assert!(m.contains("tessera_scheduler_rounds_total"), "{m}");
}

async fn wait_for(e: &Env, key: &str, job: &str, pred: impl Fn(&Value) -> bool) -> Value {
    Client::new(&e.base, Some(key))
        .wait_for(&format!("/v1/jobs/{job}"), pred)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_runs_bound_tasks_and_records_how_they_end() {
    if !common::can_run_tasks("executor_runs_bound_tasks_and_records_how_they_end") {
        return;
    }
    let e = env().await;
    let a = e.tenant("alpha").await;
    let b = e.tenant("beta").await;
    e.call(
        Some(&a),
        Method::POST,
        "/v1/queues",
        Some(json!({"name": "q"})),
    )
    .await;
    let mut ok = job("ok", 2);
    for t in ok["tasks"].as_array_mut().unwrap() {
        t["command"] = json!([
            "sh",
            "-c",
            "echo hello-$TESSERA_TASK gpus=[$CUDA_VISIBLE_DEVICES]"
        ]);
    }
    let (st, v) = e.call(Some(&a), Method::POST, "/v1/jobs", Some(ok)).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let v = wait_for(&e, &a, "ok", |v| v["status"]["phase"] == "succeeded").await;
    assert_eq!(v["status"]["tasks"]["t1"]["exit_code"], 0, "{v}");
    let logs = e
        .http
        .get(format!("{}/v1/jobs/ok/logs", e.base))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap();
    assert_eq!(logs.status(), StatusCode::OK);
    let text = logs.text().await.unwrap();
    assert!(
        text.contains("hello-t0 gpus=[]") && text.contains("hello-t1"),
        "{text}"
    );
    // Another tenant cannot read them.
    let (st, _) = e
        .call(Some(&b), Method::GET, "/v1/jobs/ok/logs", None)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    let mut bad = job("bad", 1);
    bad["tasks"][0]["command"] = json!(["sh", "-c", "exit 3"]);
    e.call(Some(&a), Method::POST, "/v1/jobs", Some(bad)).await;
    let v = wait_for(&e, &a, "bad", |v| v["status"]["phase"] == "failed").await;
    assert_eq!(v["status"]["tasks"]["t0"]["exit_code"], 3, "{v}");

    let mut missing = job("missing", 1);
    missing["tasks"][0]["command"] = json!(["/nonexistent/binary"]);
    e.call(Some(&a), Method::POST, "/v1/jobs", Some(missing))
        .await;
    let v = wait_for(&e, &a, "missing", |v| v["status"]["phase"] == "failed").await;
    assert!(
        v["status"]["tasks"]["t0"]["message"]
            .as_str()
            .unwrap()
            .contains("nonexistent"),
        "{v}"
    );

    let mut sleeper = job("sleeper", 1);
    sleeper["tasks"][0]["command"] = json!(["sleep", "60"]);
    e.call(Some(&a), Method::POST, "/v1/jobs", Some(sleeper))
        .await;
    wait_for(&e, &a, "sleeper", |v| {
        v["status"]["tasks"]["t0"]["state"] == "running"
    })
    .await;
    let (st, _) = e
        .call(Some(&a), Method::POST, "/v1/jobs/sleeper/cancel", None)
        .await;
    assert_eq!(st, StatusCode::OK);
    // Cancelled at once; its task is released once the node stopped its tree
    // (SIGTERM ends `sleep`).
    let v = wait_for(&e, &a, "sleeper", |v| {
        v["status"]["phase"] == "cancelled"
            && v["status"]["tasks"]
                .as_object()
                .is_none_or(|m| m.is_empty())
    })
    .await;
    assert_eq!(v["status"]["reason"], "Cancelled", "{v}");
}
