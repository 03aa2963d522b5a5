//! `tessera bench k8s`: pods bound per second against a real apiserver with
//! fake nodes, in two runs:
//!
//! * **end to end**: the controller runs while the pods are created (with
//!   bounded concurrency); pods/s is pods over the time from the first create to
//!   the last binding seen by a watch, and latency is created (the create call
//!   answered) to bound (the watch shows `nodeName`).
//! * **binding only**: every pod is created first, then a fresh controller starts
//!   (initial lists included); pods/s is pods over the time from its start to the
//!   last binding. This is the scheduler's own rate, without the harness's
//!   creation rate in the way.
//!
//! The same two runs can measure Kubernetes' own kube-scheduler instead of
//! Tessera ([`Contender::KubeScheduler`]), against the same apiserver on the
//! same machine, so the comparison is like for like. [`cycle_cost`] measures
//! one controller cycle (snapshot assembly and scheduling) with no apiserver at
//! all.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, stream};
use k8s_openapi::api::core::v1 as core;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::controller::{Metrics, RunConfig};
use crate::state::State;
use crate::testenv::{fake_node, fake_pod};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub nodes: usize,
    pub pods: usize,
    /// Writes in flight at once, in the controller.
    pub concurrency: usize,
    /// Creates in flight at once, in the harness.
    pub create_concurrency: usize,
    /// Which scheduler binds the pods.
    pub contender: Contender,
    /// Processes whose CPU time each run reports (e.g. the apiserver and etcd
    /// the benchmark started): `(name, pid)`.
    pub processes: Vec<(&'static str, u32)>,
}

/// The scheduler under test.
#[derive(Debug, Clone, Default)]
pub enum Contender {
    /// Tessera's controller, in this process.
    #[default]
    Tessera,
    /// kube-scheduler, started as a child process with one profile per run
    /// (`schedulerName`), leader election off and client QPS/burst 5,000 (as
    /// Kubernetes' own scheduler_perf sets them; the default of 50 would
    /// measure the rate limiter).
    KubeScheduler {
        binary: PathBuf,
        kubeconfig: PathBuf,
        /// Where its configuration file and log go.
        dir: PathBuf,
    },
}

impl Contender {
    fn name(&self) -> &'static str {
        match self {
            Contender::Tessera => "tessera",
            Contender::KubeScheduler { .. } => "kube-scheduler",
        }
    }
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    pub mode: &'static str,
    pub pods: usize,
    pub bound: usize,
    pub seconds: f64,
    pub pods_per_sec: f64,
    /// Created-to-bound latency (end to end only; start-to-bound otherwise).
    pub bind_p50_ms: f64,
    pub bind_p99_ms: f64,
    /// Pods created per second by the harness.
    pub create_per_sec: f64,
    pub cycles: u64,
    /// Of them, cycles whose snapshot was patched from the last one.
    pub patched_cycles: u64,
    pub decide_ms: f64,
    pub apply_ms: f64,
    /// CPU seconds used during the run, by process: `this process` (the
    /// harness, and Tessera's controller when it is the contender),
    /// `kube-scheduler` when it is, and the processes named in
    /// [`BenchOptions::processes`].
    pub cpu_seconds: Vec<(String, f64)>,
}

/// The benchmark's result (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// `tessera` or `kube-scheduler`.
    pub scheduler: &'static str,
    pub nodes: usize,
    pub pods: usize,
    /// End-to-end pods per second (the headline figure).
    pub pods_per_sec: f64,
    /// End-to-end created-to-bound p99.
    pub bind_p99_ms: f64,
    /// Binding-only pods per second.
    pub bind_only_pods_per_sec: f64,
    pub node_create_per_sec: f64,
    pub runs: Vec<RunFigures>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn create_pods(
    client: &Client,
    ns: &str,
    scheduler: &str,
    n: usize,
    conc: usize,
    created: Arc<Mutex<HashMap<String, Instant>>>,
) -> Result<f64, String> {
    let api: Api<core::Pod> = Api::namespaced(client.clone(), ns);
    let t = Instant::now();
    let errs: Vec<String> = stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let created = created.clone();
            let name = format!("p{i:06}");
            let pod = fake_pod(ns, &name, scheduler, "100m", "128Mi");
            async move {
                match api.create(&PostParams::default(), &pod).await {
                    Ok(_) => {
                        created.lock().await.insert(name, Instant::now());
                        None
                    }
                    Err(e) => Some(format!("creating pod {name}: {e}")),
                }
            }
        })
        .buffer_unordered(conc.max(1))
        .filter_map(|e| async move { e })
        .collect()
        .await;
    if let Some(e) = errs.first() {
        return Err(e.clone());
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Watches `ns` and records when each pod is first seen bound.
fn watch_bound(
    client: &Client,
    ns: &str,
    bound: Arc<Mutex<HashMap<String, Instant>>>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<core::Pod> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let mut s = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = s.next().await {
            let pods = match ev {
                Ok(Event::Apply(p) | Event::InitApply(p)) => vec![p],
                _ => continue,
            };
            for p in pods {
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                    let now = Instant::now();
                    let name = p.metadata.name.clone().unwrap_or_default();
                    bound.lock().await.entry(name).or_insert(now);
                }
            }
        }
    })
}

async fn wait_bound(
    bound: &Arc<Mutex<HashMap<String, Instant>>>,
    n: usize,
    limit: Duration,
) -> usize {
    let start = Instant::now();
    loop {
        let have = bound.lock().await.len();
        if have >= n || start.elapsed() > limit {
            return have;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A scheduler under test, running.
struct Running {
    metrics: Arc<Metrics>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    task: Option<tokio::task::JoinHandle<Result<(), crate::RunError>>>,
    child: Option<std::process::Child>,
}

impl Drop for Running {
    /// kube-scheduler must not outlive a benchmark that returned early.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Running {
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// kube-scheduler's configuration: one profile per benchmark run.
fn kube_scheduler_config(kubeconfig: &std::path::Path) -> String {
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1beta1\n\
         kind: KubeSchedulerConfiguration\n\
         clientConnection:\n  kubeconfig: {}\n  qps: 5000\n  burst: 5000\n\
         leaderElection:\n  leaderElect: false\n\
         profiles:\n- schedulerName: tessera-bench-e2e\n- schedulerName: tessera-bench-bind\n",
        kubeconfig.display()
    )
}

fn start_scheduler(
    client: &Client,
    contender: &Contender,
    scheduler: &str,
    concurrency: usize,
) -> Result<Running, String> {
    match contender {
        Contender::Tessera => {
            let metrics = Arc::new(Metrics::default());
            let (tx, rx) = tokio::sync::watch::channel(false);
            let cfg = RunConfig {
                scheduler_name: scheduler.into(),
                concurrency,
                events: true,
                ..RunConfig::default()
            };
            let h = tokio::spawn(crate::controller::run(
                client.clone(),
                cfg,
                metrics.clone(),
                rx,
            ));
            Ok(Running {
                metrics,
                stop: Some(tx),
                task: Some(h),
                child: None,
            })
        }
        Contender::KubeScheduler {
            binary,
            kubeconfig,
            dir,
        } => {
            let conf = dir.join("kube-scheduler.yaml");
            std::fs::write(&conf, kube_scheduler_config(kubeconfig))
                .map_err(|e| format!("{}: {e}", conf.display()))?;
            let log = dir.join(format!("kube-scheduler-{scheduler}.log"));
            let log_file =
                std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
            let child = std::process::Command::new(binary)
                .arg(format!("--config={}", conf.display()))
                // No serving: nothing here reads its metrics or health.
                .args(["--port=0", "--secure-port=0", "--v=0", "--logtostderr=true"])
                .stdout(std::process::Stdio::null())
                .stderr(log_file)
                .spawn()
                .map_err(|e| format!("starting {}: {e}", binary.display()))?;
            Ok(Running {
                metrics: Arc::new(Metrics::default()),
                stop: None,
                task: None,
                child: Some(child),
            })
        }
    }
}

/// Waits until the scheduler binds a probe pod (of its scheduler name, in a
/// namespace of its own), so that the end-to-end run starts with a scheduler
/// that has its caches in.
async fn wait_ready(client: &Client, running: &mut Running, scheduler: &str) -> Result<(), String> {
    let api: Api<core::Pod> = Api::namespaced(client.clone(), "bench-probe");
    let pod = fake_pod("bench-probe", "probe", scheduler, "1m", "1Mi");
    match api.create(&PostParams::default(), &pod).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(format!("creating the probe pod: {e}")),
    }
    let wait = Instant::now();
    loop {
        if let Some(c) = running.child.as_mut()
            && let Ok(Some(st)) = c.try_wait()
        {
            return Err(format!(
                "the scheduler exited ({st}) before it bound the probe pod; see its log"
            ));
        }
        if let Ok(p) = api.get("probe").await
            && p.spec.and_then(|s| s.node_name).is_some()
        {
            let _ = api.delete("probe", &Default::default()).await;
            return Ok(());
        }
        if wait.elapsed() > Duration::from_secs(120) {
            return Err("the scheduler did not bind the probe pod in 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// CPU seconds (user + system) a process has used so far, from `/proc`.
pub fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let s = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces; count from after its ')'.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // The kernel's USER_HZ is 100 on every Linux ABI Tessera builds for.
    Some(ticks / 100.0)
}

/// CPU counters at the start of a run.
struct CpuMark(Vec<(String, Option<u32>, f64)>);

impl CpuMark {
    fn take(processes: &[(&'static str, u32)], running: &Running) -> CpuMark {
        let mut v: Vec<(String, Option<u32>)> = vec![("this process".into(), None)];
        if let Some(p) = running.pid() {
            v.push(("kube-scheduler".into(), Some(p)));
        }
        v.extend(processes.iter().map(|(n, p)| (n.to_string(), Some(*p))));
        CpuMark(
            v.into_iter()
                .map(|(n, p)| {
                    let c = cpu_seconds(p).unwrap_or(0.0);
                    (n, p, c)
                })
                .collect(),
        )
    }

    fn since(&self) -> Vec<(String, f64)> {
        self.0
            .iter()
            .map(|(n, p, c0)| (n.clone(), (cpu_seconds(*p).unwrap_or(*c0) - c0).max(0.0)))
            .collect()
    }
}

#[allow(clippy::too_many_arguments)]
fn figures(
    mode: &'static str,
    pods: usize,
    start: Instant,
    created: &HashMap<String, Instant>,
    bound: &HashMap<String, Instant>,
    create_per_sec: f64,
    m: &Metrics,
    cpu_seconds: Vec<(String, f64)>,
) -> RunFigures {
    let last = bound.values().max().copied().unwrap_or(start);
    let seconds = last.duration_since(start).as_secs_f64().max(1e-9);
    let mut lat: Vec<f64> = bound
        .iter()
        .map(|(k, b)| {
            let c = created.get(k).copied().unwrap_or(start);
            b.saturating_duration_since(c).as_secs_f64() * 1000.0
        })
        .collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    RunFigures {
        mode,
        pods,
        bound: bound.len(),
        seconds,
        pods_per_sec: bound.len() as f64 / seconds,
        bind_p50_ms: pct(&lat, 0.5),
        bind_p99_ms: pct(&lat, 0.99),
        create_per_sec,
        cycles: m.cycles.load(Relaxed),
        patched_cycles: m.assembled_in_part.load(Relaxed),
        decide_ms: m.decide_us.load(Relaxed) as f64 / 1000.0,
        apply_ms: m.apply_us.load(Relaxed) as f64 / 1000.0,
        cpu_seconds,
    }
}

/// Runs both measurements against `client` (an empty cluster: the benchmark
/// creates its own nodes and namespaces).
pub async fn run(client: Client, o: &BenchOptions) -> Result<BenchResult, String> {
    let nodes: Api<core::Node> = Api::all(client.clone());
    let t = Instant::now();
    let errs: Vec<String> = stream::iter(0..o.nodes)
        .map(|i| {
            let nodes = nodes.clone();
            let n = fake_node(
                &format!("bench-{i:05}"),
                "32",
                "128Gi",
                0,
                &[("bench", "k8s")],
            );
            async move {
                match nodes.create(&PostParams::default(), &n).await {
                    Ok(_) => None,
                    Err(kube::Error::Api(s)) if s.code == 409 => None,
                    Err(e) => Some(format!("creating node bench-{i:05}: {e}")),
                }
            }
        })
        .buffer_unordered(o.create_concurrency.max(1))
        .filter_map(|e| async move { e })
        .collect()
        .await;
    if let Some(e) = errs.first() {
        return Err(e.clone());
    }
    let node_create_per_sec = o.nodes as f64 / t.elapsed().as_secs_f64();
    let namespaces: Api<core::Namespace> = Api::all(client.clone());
    for ns in ["bench-e2e", "bench-bind", "bench-probe"] {
        let obj: core::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
                .map_err(|e| e.to_string())?;
        match namespaces.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(format!("creating namespace {ns}: {e}")),
        }
    }
    let limit = Duration::from_secs(600);
    let mut runs = Vec::new();

    // End to end.
    {
        let mut sched = start_scheduler(&client, &o.contender, "tessera-bench-e2e", o.concurrency)?;
        let ready = wait_ready(&client, &mut sched, "tessera-bench-e2e").await;
        if let Err(e) = ready {
            sched.stop().await;
            return Err(e);
        }
        let created = Arc::new(Mutex::new(HashMap::new()));
        let bound = Arc::new(Mutex::new(HashMap::new()));
        let w = watch_bound(&client, "bench-e2e", bound.clone());
        let cpu = CpuMark::take(&o.processes, &sched);
        let start = Instant::now();
        let cps = create_pods(
            &client,
            "bench-e2e",
            "tessera-bench-e2e",
            o.pods,
            o.create_concurrency,
            created.clone(),
        )
        .await;
        if cps.is_ok() {
            wait_bound(&bound, o.pods, limit).await;
        }
        let cpu = cpu.since();
        let metrics = sched.metrics.clone();
        sched.stop().await;
        w.abort();
        let cps = cps?;
        let (c, b) = (created.lock().await, bound.lock().await);
        runs.push(figures(
            "end-to-end",
            o.pods,
            start,
            &c,
            &b,
            cps,
            &metrics,
            cpu,
        ));
    }

    // Binding only: create everything, then start the scheduler.
    {
        let created = Arc::new(Mutex::new(HashMap::new()));
        let cps = create_pods(
            &client,
            "bench-bind",
            "tessera-bench-bind",
            o.pods,
            o.create_concurrency,
            created.clone(),
        )
        .await?;
        let bound = Arc::new(Mutex::new(HashMap::new()));
        let w = watch_bound(&client, "bench-bind", bound.clone());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let start = Instant::now();
        let sched = start_scheduler(&client, &o.contender, "tessera-bench-bind", o.concurrency)?;
        let cpu = CpuMark::take(&o.processes, &sched);
        wait_bound(&bound, o.pods, limit).await;
        let cpu = cpu.since();
        let metrics = sched.metrics.clone();
        sched.stop().await;
        w.abort();
        // Latency here is start-to-bound: every pod existed before the start.
        let starts: HashMap<String, Instant> = bound
            .lock()
            .await
            .keys()
            .map(|k| (k.clone(), start))
            .collect();
        let b = bound.lock().await;
        runs.push(figures(
            "binding-only",
            o.pods,
            start,
            &starts,
            &b,
            cps,
            &metrics,
            cpu,
        ));
    }
    Ok(BenchResult {
        scheduler: o.contender.name(),
        nodes: o.nodes,
        pods: o.pods,
        pods_per_sec: runs[0].pods_per_sec,
        bind_p99_ms: runs[0].bind_p99_ms,
        bind_only_pods_per_sec: runs[1].pods_per_sec,
        node_create_per_sec,
        runs,
    })
}

/// One controller cycle without an apiserver: the time to assemble the
/// snapshot from the translated objects and the time of the batch scheduler's
/// session over it, median of `runs`.
#[derive(Debug, Clone, Serialize)]
pub struct CycleCost {
    pub nodes: usize,
    /// Pods in the cluster, bound and pending.
    pub pods: usize,
    /// Of them, pending (ours, to place).
    pub pending: usize,
    pub runs: usize,
    /// `State::build`: the snapshot the schedulers read, assembled afresh.
    pub build_ms: f64,
    /// `State::build_incremental` after one pending pod changed: the last
    /// snapshot patched, as a controller cycle does when only pods changed.
    pub patch_ms: f64,
    /// `tessera_sched::schedule` over that snapshot.
    pub schedule_ms: f64,
    /// Pending pods the session placed.
    pub placed: usize,
}

/// Measures [`CycleCost`] for a cluster of `nodes` bench nodes holding `pods`
/// pods of 100m / 128 Mi, `pending` of them not yet bound.
pub fn cycle_cost(nodes: usize, pods: usize, pending: usize, runs: usize) -> CycleCost {
    let scheduler = "tessera-bench";
    let mut st = State::new(scheduler);
    let names: Vec<String> = (0..nodes).map(|i| format!("bench-{i:05}")).collect();
    for n in &names {
        st.apply_node(&fake_node(n, "32", "128Gi", 0, &[("bench", "k8s")]));
    }
    let pending = pending.min(pods);
    for i in 0..pods {
        let mut p = fake_pod("bench", &format!("p{i:06}"), scheduler, "100m", "128Mi");
        if i >= pending
            && !names.is_empty()
            && let Some(spec) = p.spec.as_mut()
        {
            spec.node_name = Some(names[i % names.len()].clone());
        }
        st.apply_pod(&p);
    }
    let cfg = tessera_sched::Config::default();
    let (mut build, mut sched) = (Vec::new(), Vec::new());
    let mut placed = 0;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let b = st.build();
        build.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let plan = tessera_sched::schedule(&b.snapshot, &cfg);
        sched.push(t.elapsed().as_secs_f64() * 1000.0);
        placed = plan.bindings.len();
    }
    // Patched: one pending pod changes between cycles (a label), the
    // snapshot of the last cycle is handed back and patched.
    let mut patch = Vec::new();
    let first = st.build_incremental();
    st.recycle(first);
    for r in 0..runs.max(1) {
        let mut p = fake_pod("bench", "p000000", scheduler, "100m", "128Mi");
        p.metadata.labels = Some([("run".to_string(), r.to_string())].into());
        st.apply_pod(&p);
        let t = Instant::now();
        let b = st.build_incremental();
        patch.push(t.elapsed().as_secs_f64() * 1000.0);
        st.recycle(b);
    }
    build.sort_by(|a, b| a.total_cmp(b));
    sched.sort_by(|a, b| a.total_cmp(b));
    patch.sort_by(|a, b| a.total_cmp(b));
    CycleCost {
        nodes,
        pods,
        pending,
        runs: runs.max(1),
        build_ms: pct(&build, 0.5),
        patch_ms: pct(&patch, 0.5),
        schedule_ms: pct(&sched, 0.5),
        placed,
    }
}
