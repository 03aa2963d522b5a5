//! A real kube-apiserver and etcd on loopback, for the integration tests and
//! `tessera bench k8s`. The binaries come from `TESSERA_KUBE_APISERVER` and
//! `TESSERA_ETCD` (`.ci/k8s-apiserver.sh` builds and installs them).
//!
//! Nodes only, as KWOK does: no kubelet, no controller manager. The apiserver
//! serves HTTPS on a loopback port with a self-signed certificate it makes in
//! the temporary folder, and a static bearer token; every request is allowed.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1 as core;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, Config};

/// The bearer token of the test apiserver (loopback only, a throwaway server).
const TOKEN: &str = "tessera-test-token";

/// Where the binaries are, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub apiserver: PathBuf,
    pub etcd: PathBuf,
}

/// The binaries, or why they are missing.
pub fn binaries() -> Result<Binaries, String> {
    let apiserver = std::env::var_os("TESSERA_KUBE_APISERVER")
        .map(PathBuf::from)
        .ok_or("TESSERA_KUBE_APISERVER is not set (run .ci/k8s-apiserver.sh, then export the path it prints)")?;
    let etcd = std::env::var_os("TESSERA_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
    for p in [&apiserver, &etcd] {
        if !p.is_file() {
            return Err(format!("{} does not exist", p.display()));
        }
    }
    Ok(Binaries { apiserver, etcd })
}

/// For tests: the binaries, `None` to skip (with the reason printed) when they
/// are absent and `CI` is unset; in CI a missing binary fails the test.
pub fn binaries_or_skip(test: &str) -> Option<Binaries> {
    match binaries() {
        Ok(b) => Some(b),
        Err(e) if std::env::var_os("CI").is_none_or(|v| v.is_empty()) => {
            eprintln!("skipping {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: {e}; CI must provide the apiserver"),
    }
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// A running apiserver and etcd; both are killed when this is dropped.
#[derive(Debug)]
pub struct TestEnv {
    etcd: Child,
    apiserver: Child,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT`
    pub url: String,
}

fn tail(path: &Path, n: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File, String> {
    std::fs::File::create(dir.join(name)).map_err(|e| format!("{name}: {e}"))
}

impl TestEnv {
    /// Starts etcd and the apiserver and waits until the apiserver serves.
    pub async fn start(b: &Binaries) -> Result<TestEnv, String> {
        // etcd fsyncs every write; on tmpfs that costs nothing.
        let base = Path::new("/dev/shm");
        let dir = if base.is_dir() {
            tempfile::Builder::new()
                .prefix("tessera-k8s")
                .tempdir_in(base)
        } else {
            tempfile::Builder::new().prefix("tessera-k8s").tempdir()
        }
        .map_err(|e| format!("temporary folder: {e}"))?;
        let d = dir.path();
        let (client_port, peer_port, secure) = (free_port()?, free_port()?, free_port()?);
        let etcd = Command::new(&b.etcd)
            .args([
                "--name=default".to_string(),
                format!("--data-dir={}", d.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                "--quota-backend-bytes=4294967296".to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(log_file(d, "etcd.log")?)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", b.etcd.display()))?;
        let key = d.join("sa.key");
        let out = Command::new("openssl")
            .args([
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
            ])
            .arg(&key)
            .output()
            .map_err(|e| format!("openssl (for the service-account key): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "openssl ecparam failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // A static bearer token in system:masters; every request is allowed anyway.
        let tokens = d.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{TOKEN},tessera-test,1,\"system:masters\"\n"),
        )
        .map_err(|e| format!("{}: {e}", tokens.display()))?;
        let apiserver = Command::new(&b.apiserver)
            .args([
                format!("--etcd-servers=http://127.0.0.1:{client_port}"),
                "--insecure-port=0".into(),
                format!("--secure-port={secure}"),
                format!("--token-auth-file={}", tokens.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--cert-dir={}", d.join("certs").display()),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={}", key.display()),
                format!("--service-account-signing-key-file={}", key.display()),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--authorization-mode=AlwaysAllow".into(),
                // No node lifecycle controller runs to lift the not-ready taint that
                // TaintNodesByCondition puts on every new node.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".into(),
                "--enable-priority-and-fairness=false".into(),
                "--max-requests-inflight=4000".into(),
                "--max-mutating-requests-inflight=2000".into(),
                "--event-ttl=10m".into(),
                "--logtostderr=true".into(),
                "--v=0".into(),
            ])
            .stdout(Stdio::null())
            .stderr(log_file(d, "apiserver.log")?)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", b.apiserver.display()))?;
        let mut env = TestEnv {
            etcd,
            apiserver,
            url: format!("https://127.0.0.1:{secure}"),
            dir,
        };
        env.wait_ready(Duration::from_secs(120)).await?;
        Ok(env)
    }

    /// A client for the apiserver.
    pub fn client(&self) -> Result<Client, String> {
        let uri = self.url.parse().map_err(|e| format!("{}: {e}", self.url))?;
        let mut cfg = Config::new(uri);
        // Longer than a watch's server-side timeout (kube's watcher asks for
        // 290 s), so that a watch with no events ends normally instead of
        // failing every minute on an idle cluster.
        cfg.read_timeout = Some(Duration::from_secs(295));
        // The serving certificate is self-signed, made by the apiserver at start.
        cfg.accept_invalid_certs = true;
        cfg.headers.push((
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(&format!("Bearer {TOKEN}")).map_err(|e| e.to_string())?,
        ));
        Client::try_from(cfg).map_err(|e| e.to_string())
    }

    /// Writes a kubeconfig for this apiserver (for programs that are not
    /// Tessera, such as kube-scheduler in `tessera bench k8s
    /// --kube-scheduler`) and returns its path, inside the server's temporary
    /// folder.
    pub fn write_kubeconfig(&self) -> Result<PathBuf, String> {
        let path = self.dir.path().join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: test\n  user:\n    token: {TOKEN}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n",
            self.url
        );
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// Process ids of the apiserver and etcd (for CPU accounting).
    pub fn pids(&self) -> (u32, u32) {
        (self.apiserver.id(), self.etcd.id())
    }

    /// The temporary folder the server's files live in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of the apiserver's log (for failure messages).
    pub fn apiserver_log(&self, lines: usize) -> String {
        tail(&self.dir.path().join("apiserver.log"), lines)
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let start = Instant::now();
        let client = self.client()?;
        let ns: Api<core::Namespace> = Api::all(client);
        loop {
            if let Ok(Some(status)) = self.apiserver.try_wait() {
                return Err(format!(
                    "kube-apiserver exited ({status}):\n{}",
                    self.apiserver_log(30)
                ));
            }
            if let Ok(Some(status)) = self.etcd.try_wait() {
                return Err(format!(
                    "etcd exited ({status}):\n{}",
                    tail(&self.dir.path().join("etcd.log"), 30)
                ));
            }
            // The bootstrap controller creates `default` once the server is up.
            if let Ok(Some(_)) = ns.get_opt("default").await {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(format!(
                    "kube-apiserver not ready after {limit:?}:\n{}",
                    self.apiserver_log(30)
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let _ = self.apiserver.kill();
        let _ = self.apiserver.wait();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}

/// A fake node of `cpu` cores, `memory` and `gpus` GPUs (status included: nodes
/// keep their status on create).
pub fn fake_node(
    name: &str,
    cpu: &str,
    memory: &str,
    gpus: u32,
    labels: &[(&str, &str)],
) -> core::Node {
    let mut alloc = serde_json::json!({"cpu": cpu, "memory": memory, "pods": "110"});
    if gpus > 0 {
        alloc["nvidia.com/gpu"] = gpus.to_string().into();
    }
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": alloc, "capacity": alloc,
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap_or_default()
}

/// A pod for `scheduler` asking for `cpu` and `memory`.
pub fn fake_pod(ns: &str, name: &str, scheduler: &str, cpu: &str, memory: &str) -> core::Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.invalid/none",
                     "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    }))
    .unwrap_or_default()
}

/// Stands in for kubelets: pods marked for deletion are deleted at once.
pub fn fake_kubelet(client: Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let pods: Api<core::Pod> = Api::all(client.clone());
        loop {
            if let Ok(list) = pods.list(&ListParams::default()).await {
                for p in list.items {
                    if p.metadata.deletion_timestamp.is_some() {
                        let ns = p.metadata.namespace.clone().unwrap_or_default();
                        let name = p.metadata.name.clone().unwrap_or_default();
                        let api: Api<core::Pod> = Api::namespaced(client.clone(), &ns);
                        let _ = api
                            .delete(&name, &DeleteParams::default().grace_period(0))
                            .await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}
