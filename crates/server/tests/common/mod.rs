//! The shared harness of the server's integration tests: a real server on
//! loopback over a fresh store in a temporary folder, and an HTTP client that
//! sends a key. Each test file that needs it says `mod common;`.
//!
//! ```ignore
//! mod common;
//! use common::{Server, json, Method, StatusCode};
//!
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn example() {
//!     let s = Server::start().await;                 // or Server::start_with(|cfg| …)
//!     let alpha = s.tenant("alpha").await;           // a tenant's admin client
//!     let dev = s.client(&alpha.key_for("dev", "developer").await);
//!     let (st, v) = dev.post("/v1/queues", json!({"name": "q"})).await;
//!     assert_eq!(st, StatusCode::CREATED, "{v}");
//! }
//! ```
//!
//! Every helper is used by some test file but not by all of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use reqwest::{Method, StatusCode};
pub use serde_json::{Value, json};
use tessera_model::{Binding, Plan, Snapshot, TaskId};
use tessera_server::{AnyStore, Running, ServerConfig, SqliteStore, start};

/// A stand-in scheduler: binds every unbound task to the first node, so tests
/// do not depend on the batch scheduler's decisions.
pub fn bind_all(s: &Snapshot) -> Plan {
    let mut p = Plan::default();
    let Some(n) = s.nodes.first() else { return p };
    for g in &s.groups {
        for t in &g.tasks {
            if t.node.is_none() {
                p.bindings.push(Binding {
                    task: TaskId {
                        group: g.name.clone(),
                        task: t.name.clone(),
                    },
                    node: n.name.clone(),
                    gpus: vec![],
                    after_evictions: false,
                    mig: None,
                });
            }
        }
    }
    p
}

/// The configuration tests start from: port 0 on loopback, the [`bind_all`]
/// scheduler every 100 ms, this machine as a node, the executor's logs under
/// the temporary folder. Change it in [`Server::start_with`].
pub fn test_config(dir: &Path) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        scheduler: Some(Arc::new(bind_all)),
        schedule_period: Duration::from_millis(100),
        register_local_node: true,
        executor_logs: Some(dir.join("logs")),
        ..ServerConfig::default()
    }
}

/// Whether job tasks can run here: they run in sandboxes of the node runtime, which
/// need root (cgroups, the uid range) and `tessera-sandbox-init` built next to the
/// tests (`cargo test --workspace` builds it). Says why when not; with `CI` set, a
/// missing piece fails the test instead.
pub fn can_run_tasks(test: &str) -> bool {
    let why = if !nix_root() {
        Some("job tasks run in sandboxes, which need root here")
    } else if tessera_sandbox::InitProgram::locate().is_none() {
        Some("tessera-sandbox-init is not built next to the tests (cargo build -p tessera-sandbox)")
    } else {
        None
    };
    match why {
        None => true,
        Some(w) if std::env::var_os("CI").is_some() => panic!("{test}: {w}"),
        Some(w) => {
            eprintln!("SKIPPED {test}: {w}");
            false
        }
    }
}

fn nix_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// A running server on a fresh SQLite store. Dropping it stops the server and
/// removes its folder.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The system tenant's admin (the key printed on first start).
    pub admin: Client,
    /// The running server (its control plane, its address).
    pub running: Running,
    dir: tempfile::TempDir,
}

impl Server {
    /// A server with [`test_config`].
    pub async fn start() -> Server {
        Self::start_with(|_| {}).await
    }

    /// A server with [`test_config`] changed by `f` (the folder is `cfg`'s
    /// temporary folder: see [`Server::dir`] afterwards).
    pub async fn start_with(f: impl FnOnce(&mut ServerConfig)) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("data")).unwrap();
        Self::start_on(store.into(), dir, f).await
    }

    /// A server over `store` (e.g. a `PgStore`), keeping `dir` alive with it.
    pub async fn start_on(
        store: AnyStore,
        dir: tempfile::TempDir,
        f: impl FnOnce(&mut ServerConfig),
    ) -> Server {
        let mut cfg = test_config(dir.path());
        f(&mut cfg);
        let running = start(store, cfg).await.unwrap();
        let key = running
            .admin_key
            .clone()
            .expect("a fresh store prints the admin key");
        let base = format!("http://{}", running.addr);
        Server {
            admin: Client::new(&base, Some(&key)),
            base,
            running,
            dir,
        }
    }

    /// The temporary folder (the store is in `data/`, task logs in `logs/`).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// A client that sends `key` (or no key at all with `None`: see [`Server::anonymous`]).
    pub fn client(&self, key: &str) -> Client {
        Client::new(&self.base, Some(key))
    }

    /// A client without a credential.
    pub fn anonymous(&self) -> Client {
        Client::new(&self.base, None)
    }

    /// Creates a tenant; returns a client with its admin key.
    pub async fn tenant(&self, name: &str) -> Client {
        let (st, v) = self.admin.post("/v1/tenants", json!({"name": name})).await;
        assert_eq!(st, StatusCode::CREATED, "creating tenant {name}: {v}");
        self.client(v["admin_key"].as_str().unwrap())
    }

    /// Writes an active agent session of `runtime` straight into the store (tool
    /// tests need one to call for, not a sandbox).
    pub async fn session(&self, tenant: &str, id: &str, runtime: &str) {
        self.session_started_by(tenant, id, runtime, None).await
    }

    /// [`Server::session`], recording the subject that started it (whom its
    /// exchanged tokens act for).
    pub async fn session_started_by(
        &self,
        tenant: &str,
        id: &str,
        runtime: &str,
        by: Option<&str>,
    ) {
        use tessera_store::Store;
        let mut body = json!({"id": id, "runtime": runtime, "state": "active"});
        if let Some(by) = by {
            body["started_by"] = json!(by);
        }
        self.running
            .plane
            .store()
            .create(tessera_store::Key::new("session", tenant, id), body)
            .await
            .unwrap();
    }

    /// Stops the server (open watches end) and keeps the folder for a restart.
    pub async fn stop(self) -> tempfile::TempDir {
        self.running.shutdown().await;
        self.dir
    }
}

/// An HTTP client bound to one server and one key.
#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub key: Option<String>,
    pub http: reqwest::Client,
}

impl Client {
    pub fn new(base: &str, key: Option<&str>) -> Client {
        Client {
            base: base.to_string(),
            key: key.map(str::to_string),
            http: reqwest::Client::new(),
        }
    }

    /// The API key this client sends.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or("")
    }

    /// A request builder for `path` with the key set.
    pub fn request(&self, m: Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(m, format!("{}{path}", self.base));
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// Opens `/v1/watch?kind=KIND` (after `after`, else from now); panics unless 200.
    pub async fn watch(&self, kind: &str, after: Option<u64>) -> Watch {
        let path = match after {
            Some(a) => format!("/v1/watch?kind={kind}&after={a}"),
            None => format!("/v1/watch?kind={kind}"),
        };
        let r = self
            .request(Method::GET, &path)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        Watch {
            r,
            buf: String::new(),
        }
    }

    /// Sends a JSON body (or none); returns the status and the reply as JSON (a
    /// reply that is not JSON comes back as a string value).
    pub async fn call(&self, m: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut r = self.request(m, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        reply(r.send().await.unwrap()).await
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }
    pub async fn post_empty(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::POST, path, None).await
    }
    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, path, Some(body)).await
    }
    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::DELETE, path, None).await
    }

    /// Sends raw bytes with a content type (bad bodies, YAML).
    pub async fn raw(
        &self,
        m: Method,
        path: &str,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> (StatusCode, Value) {
        let r = self
            .request(m, path)
            .header("content-type", content_type)
            .body(body);
        reply(r.send().await.unwrap()).await
    }

    /// Creates an API key for `subject` with `role` in this client's tenant (this
    /// client must be an admin); returns it.
    pub async fn key_for(&self, subject: &str, role: &str) -> String {
        let (st, v) = self
            .post("/v1/apikeys", json!({"subject": subject, "role": role}))
            .await;
        assert_eq!(st, StatusCode::CREATED, "creating a key for {subject}: {v}");
        v["key"].as_str().unwrap().to_string()
    }

    /// A client for a new key of `subject` with `role` in this client's tenant.
    pub async fn with_role(&self, subject: &str, role: &str) -> Client {
        let k = self.key_for(subject, role).await;
        Client::new(&self.base, Some(&k))
    }

    /// Polls `GET path` until `pred` holds (at most ~10 s); returns the last reply.
    pub async fn wait_for(&self, path: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_for_within(path, Duration::from_secs(10), pred)
            .await
    }

    /// Like [`Client::wait_for`], for at most `limit` (work that boots a micro-VM).
    pub async fn wait_for_within(
        &self,
        path: &str,
        limit: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut v = Value::Null;
        let polls = (limit.as_millis() / 25).max(1);
        for _ in 0..polls {
            (_, v) = self.get(path).await;
            if pred(&v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("GET {path} never got there: {v}");
    }
}

async fn reply(resp: reqwest::Response) -> (StatusCode, Value) {
    let st = resp.status();
    let text = resp.text().await.unwrap();
    (
        st,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The `code` of a problem document ("" when there is none).
pub fn code(v: &Value) -> &str {
    v["code"].as_str().unwrap_or("")
}

/// A simulated node `name` with four H100-80GB GPUs (64 cores, 1 TiB).
pub fn h100_node(name: &str) -> tessera_model::Node {
    let mut n = tessera_model::Node::new(name, tessera_model::Resources::new(64_000, 1 << 40));
    n.gpus = (0..4)
        .map(|i| tessera_model::GpuDevice::new(i, "H100-80GB", 80 << 30))
        .collect();
    n.allocatable.gpu_milli = 4000;
    n.allocatable.gpu_memory = 4 * (80 << 30);
    n.allocatable.pods = 110;
    n
}

/// Configures `c` for simulated `nodes` (real time) under the batch scheduler, with
/// no local node.
pub fn simulated_cluster(c: &mut ServerConfig, nodes: Vec<tessera_model::Node>) {
    c.register_local_node = false;
    c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
    c.simulated = Some(tessera_server::Simulated {
        nodes,
        speedup: 1.0,
    });
}

/// A job of `tasks` small tasks in queue `q`.
pub fn job(name: &str, tasks: usize) -> Value {
    let tasks: Vec<Value> = (0..tasks)
        .map(|i| json!({"name": format!("t{i}"), "resources": {"cpu_milli": 100, "memory": 1000}}))
        .collect();
    json!({"name": name, "queue": "q", "tasks": tasks})
}

/// An open server-sent event stream of `/v1/watch`.
pub struct Watch {
    r: reqwest::Response,
    buf: String,
}

impl Watch {
    /// The next `n` events, as (event, data); panics unless they come within 30 s.
    pub async fn next(&mut self, n: usize) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        self.until(|seen| seen.len() >= n, &mut out).await;
        out
    }

    /// Reads events into `out` until `done(out)`; panics unless that is within 30 s.
    pub async fn until(
        &mut self,
        done: impl Fn(&[(String, Value)]) -> bool,
        out: &mut Vec<(String, Value)>,
    ) {
        // One deadline for all of them: keep-alive comments arrive every 15 s.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done(out) {
            if let Some(cut) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..cut + 2).collect();
                let mut ev = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(e) = line.strip_prefix("event: ") {
                        ev = e.to_string();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                if !data.is_empty() {
                    out.push((ev, serde_json::from_str(&data).unwrap()));
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.r.chunk())
                .await
                .unwrap_or_else(|_| panic!("the watch did not deliver within 30 s; got {out:?}"))
                .unwrap()
                .expect("the stream stays open");
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}
