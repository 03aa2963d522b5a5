//! The executors: the per-node side of the job lifecycle. The local one runs the
//! tasks bound to this machine's node through the node runtime (`tessera-node`):
//! each task in a sandbox of its own — an unprivileged user inside, its own
//! namespaces and cgroup (CPU quota, memory and pids limits from its resources), a
//! clean environment, the runtime guard as its tenant's, the host's `/usr` read-only
//! without the data folder, only the GPUs of its binding — with its output redacted
//! into a log file per task. The simulated one runs the tasks bound to simulated
//! nodes (`tessera up --cluster`) in simulated time.
//!
//! Protocol with the store: before starting a task the executor marks it `running`
//! (attempt + 1) with compare-and-swap, so a run starts at most once even across
//! restarts; an end is recorded only against the run it belongs to (a late report
//! of an evicted run never touches the task placed again). A task the controller or
//! the scheduler marked `terminating` or `evicting` has its tree stopped: SIGTERM,
//! the job's grace period, SIGKILL. A binding "after evictions" starts only once no
//! task of its node is being evicted. At start, tasks left live by a previous
//! control plane (whose sandboxes its reaper killed) are recorded as ended: lost,
//! evicted or stopped. How an end changes the job (restart policy, back-off, gang
//! failure) is [`crate::jobs`]'s decision.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tessera_model::{GpuDevice, Node};
use tessera_node::mig::{Actuator, Applied, Held};
use tessera_node::{
    GpuAssignment, NodeRuntime, Outcome, TaskKey, TemplateRef, Usage, WorkloadSpec,
};
use tessera_store::{AnyStore, ChangeOp, Key, Op, Store, StoreError, WatchFilter};
use tokio::sync::{mpsc, oneshot};

use crate::jobs::{self, End, Lifecycle};
use crate::plane::{event_op, kind, now_ms};
use crate::wire::{JobBody, Phase, TaskState};

/// Which tasks an executor runs, and how.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// The nodes whose tasks this executor runs.
    pub nodes: BTreeSet<String>,
    pub runner: Runner,
    pub lifecycle: Lifecycle,
}

/// How a task runs.
#[derive(Debug, Clone)]
pub enum Runner {
    /// In the node runtime of this machine.
    Node(NodeRunner),
    /// Simulated nodes: a task with a `duration` (seconds) succeeds after
    /// `duration / speedup` seconds of real time; one without holds its resources
    /// until the job ends.
    Simulated { speedup: f64 },
}

/// The local node's runtime and where its files go.
#[derive(Debug, Clone)]
pub struct NodeRunner {
    /// The runtime, or why this node cannot run tasks (every start then fails with it).
    pub node: Result<Arc<NodeRuntime>, String>,
    /// Task logs: `<logs>/<tenant>/<job>/<uid>/<task>.log`.
    pub logs: PathBuf,
    /// The template registry a task's `template` names one of.
    pub templates: Option<tessera_sandbox::TemplateRegistry>,
    /// MIG steps of bindings.
    pub mig: Arc<Actuator>,
    /// How often the node reports its heartbeat and conditions.
    pub heartbeat: Duration,
    /// The data folder (for disk pressure).
    pub data_dir: Option<PathBuf>,
    /// The class table: a task's stored class names its tier.
    pub classes: Arc<crate::classes::ClassPolicy>,
}

impl ExecConfig {
    /// The executor of the local node.
    pub fn local(node: impl Into<String>, runner: NodeRunner) -> Self {
        ExecConfig {
            nodes: [node.into()].into(),
            runner: Runner::Node(runner),
            lifecycle: Lifecycle::default(),
        }
    }
}

/// The folder of one job's logs (a job's `created_at` keeps a reused name's logs
/// apart from its predecessor's).
pub fn job_log_dir(logs: &Path, tenant: &str, job: &str, uid: u64) -> PathBuf {
    logs.join(tenant).join(job).join(uid.to_string())
}

/// The log file of one task.
pub fn log_path(logs: &Path, tenant: &str, job: &str, uid: u64, task: &str) -> PathBuf {
    job_log_dir(logs, tenant, job, uid).join(format!("{task}.log"))
}

type TaskRef = (String, String, String);

enum Handle {
    Node(TaskKey),
    Sim(Option<oneshot::Sender<()>>),
}

struct Run {
    /// The run's attempt number (the task's `attempt` was this + 1 when it started).
    attempt: u32,
    handle: Handle,
    stopping: bool,
}

struct Exit {
    task: TaskRef,
    attempt: u32,
    outcome: Outcome,
    usage: Option<Usage>,
    devices: Vec<String>,
    note: Option<String>,
}

struct Executor {
    store: AnyStore,
    cfg: ExecConfig,
    jobs: BTreeMap<(String, String), (u64, JobBody)>,
    runs: HashMap<TaskRef, Run>,
    exits: mpsc::UnboundedSender<Exit>,
    /// A job one of whose tasks just started in the runtime (a stop asked during its
    /// start is carried out then).
    started: mpsc::UnboundedSender<(String, String)>,
}

/// Runs the executor until `stop` turns true; then kills what it runs.
pub async fn run_executor(
    store: AnyStore,
    cfg: ExecConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    if let Runner::Node(n) = &cfg.runner
        && let Ok(node) = &n.node
        && let Some(name) = cfg.nodes.iter().next()
    {
        tokio::spawn(crate::heartbeat::heartbeat(
            store.clone(),
            node.clone(),
            name.clone(),
            n.clone(),
            stop.clone(),
        ));
        reconcile_mig(n, node);
    }
    let mut ex = Executor {
        store: store.clone(),
        cfg,
        jobs: BTreeMap::new(),
        runs: HashMap::new(),
        exits: tx,
        started: started_tx,
    };
    let mut w = ex.resync().await;
    loop {
        let wake = ex.next_wake();
        tokio::select! {
            r = w.next() => match r {
                Ok(changes) => {
                    let mut touched = BTreeSet::new();
                    for c in changes {
                        let key = (c.object.tenant.clone(), c.object.name.clone());
                        if c.op == ChangeOp::Deleted {
                            if let Some((_, old)) = ex.jobs.remove(&key) {
                                ex.forget_logs(&key, &old);
                            }
                        } else if let Ok(j) = serde_json::from_value::<JobBody>(c.object.body.clone()) {
                            let newer = ex.jobs.get(&key).is_none_or(|(v, _)| *v <= c.object.version);
                            if newer {
                                ex.jobs.insert(key.clone(), (c.object.version, j));
                            }
                        }
                        touched.insert(key);
                    }
                    ex.reconcile_all(Some(&touched)).await;
                }
                // Fell behind the change log's compaction: read the jobs again.
                Err(StoreError::Compacted { .. }) => w = ex.resync().await,
                Err(e) => {
                    tracing::warn!("executor: watch failed: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            },
            Some(exit) = rx.recv() => ex.record_exit(exit).await,
            Some(k) = started_rx.recv() => {
                let t = BTreeSet::from([k]);
                ex.reconcile_all(Some(&t)).await;
            }
            _ = tokio::time::sleep(wake) => ex.reconcile_all(None).await,
            _ = stop.changed() => {
                ex.shutdown();
                return;
            }
        }
    }
}

/// Finishes MIG steps a previous run of this node left half done.
fn reconcile_mig(n: &NodeRunner, node: &Arc<NodeRuntime>) {
    let _ = node;
    for (intent, r) in n.mig.reconcile(&Held::new()) {
        match r {
            Ok(a) => tracing::info!(
                "tessera: MIG step of {} on GPU {} finished after a restart: {a:?}",
                intent.owner,
                intent.gpu
            ),
            Err(e) => tracing::warn!("tessera: MIG step of {} not finished: {e}", intent.owner),
        }
    }
}

impl Executor {
    fn mine(&self, node: &str) -> bool {
        self.cfg.nodes.contains(node)
    }

    /// Reads every job, records the ends of runs a previous control plane left
    /// behind, and returns the watch from there.
    async fn resync(&mut self) -> tessera_store::Watcher<AnyStore> {
        let rev = loop {
            match self.load().await {
                Ok(rev) => break rev,
                Err(e) => {
                    tracing::warn!("executor: reading jobs failed: {e}; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        self.recover().await;
        self.reconcile_all(None).await;
        self.store.watch(
            rev,
            WatchFilter {
                kind: Some(kind::JOB.into()),
                tenant: None,
            },
        )
    }

    async fn load(&mut self) -> Result<u64, StoreError> {
        let rev = self.store.revision().await?;
        self.jobs.clear();
        for o in self.store.list(kind::JOB, None).await?.objects {
            if let Ok(j) = serde_json::from_value::<JobBody>(o.body.clone()) {
                self.jobs
                    .insert((o.tenant.clone(), o.name.clone()), (o.version, j));
            }
        }
        Ok(rev)
    }

    /// Live tasks of this executor's nodes without a run here had their processes
    /// with a previous control plane (its reaper killed their sandboxes): they are
    /// recorded as ended — a running one as lost (the restart policy decides), an
    /// evicting one as evicted, a terminating one as stopped.
    async fn recover(&mut self) {
        let mut ends = Vec::new();
        for ((tenant, name), (_, job)) in &self.jobs {
            for (t, st) in &job.status.tasks {
                let tref = (tenant.clone(), name.clone(), t.clone());
                if !self.mine(&st.node)
                    || !st.state.is_some_and(TaskState::live)
                    || self.runs.contains_key(&tref)
                {
                    continue;
                }
                let outcome = match st.state {
                    Some(TaskState::Running) => {
                        Outcome::Failed("lost: the control plane restarted while it ran".into())
                    }
                    _ => Outcome::Stopped {
                        reason: "the control plane restarted while it was being stopped".into(),
                        forced: true,
                    },
                };
                ends.push(Exit {
                    task: tref,
                    attempt: st.attempt.saturating_sub(1),
                    outcome,
                    usage: None,
                    devices: vec![],
                    note: None,
                });
            }
        }
        for e in ends {
            self.record_exit(e).await;
        }
    }

    /// When the executor must look again without a change: the earliest back-off
    /// of a task of its nodes (at most a second away, for deadlines of tasks that
    /// wait for evictions elsewhere).
    fn next_wake(&self) -> Duration {
        let now = now_ms();
        let mut next = now + 1000;
        for (_, job) in self.jobs.values() {
            if job.status.phase.is_final() {
                continue;
            }
            for st in job.status.tasks.values() {
                if let Some(nb) = st.not_before
                    && self.mine(&st.node)
                {
                    next = next.min(nb.max(now));
                }
            }
        }
        Duration::from_millis(next - now + 1)
    }

    /// Reconciles the jobs `touched` (all when `None`) and every job with a task of
    /// this executor waiting for evictions or a back-off.
    async fn reconcile_all(&mut self, touched: Option<&BTreeSet<(String, String)>>) {
        let mut keys: BTreeSet<(String, String)> = match touched {
            Some(t) => t.clone(),
            None => self.jobs.keys().cloned().collect(),
        };
        for (k, (_, job)) in &self.jobs {
            if job.status.tasks.values().any(|t| {
                t.state.is_none()
                    && self.mine(&t.node)
                    && (t.after_evictions || t.not_before.is_some())
            }) {
                keys.insert(k.clone());
            }
        }
        // Runs of jobs that are gone.
        let gone: Vec<TaskRef> = self
            .runs
            .keys()
            .filter(|(t, j, _)| !self.jobs.contains_key(&(t.clone(), j.clone())))
            .cloned()
            .collect();
        for tref in gone {
            self.stop_run(&tref, Duration::ZERO, "the job was deleted");
        }
        for k in keys {
            self.reconcile(&k).await;
        }
    }

    /// Nodes with a task being evicted.
    fn evicting_on(&self, node: &str) -> bool {
        self.jobs.values().any(|(_, j)| {
            j.status
                .tasks
                .values()
                .any(|t| t.node == node && t.state == Some(TaskState::Evicting))
        })
    }

    fn stop_run(&mut self, tref: &TaskRef, grace: Duration, reason: &str) {
        let Some(run) = self.runs.get_mut(tref) else {
            return;
        };
        if run.stopping && !grace.is_zero() {
            return;
        }
        match &mut run.handle {
            Handle::Node(key) => {
                // Not yet started in the runtime (its start runs on a blocking
                // thread): not marked, so the next look (within a second) stops it.
                if let Runner::Node(NodeRunner { node: Ok(n), .. }) = &self.cfg.runner {
                    run.stopping = n.stop(key, grace, reason);
                }
            }
            Handle::Sim(kill) => {
                run.stopping = true;
                if let Some(k) = kill.take() {
                    let _ = k.send(());
                }
            }
        }
    }

    /// Brings one job's tasks on this executor's nodes in line with the store.
    async fn reconcile(&mut self, key: &(String, String)) {
        let Some((version, job)) = self.jobs.get(key).cloned() else {
            return;
        };
        let (tenant, name) = key;
        let grace = job.spec.grace();
        // Runs that must stop, and live tasks without a run (nothing to stop).
        let mut ended = Vec::new();
        for (t, st) in &job.status.tasks {
            if !self.mine(&st.node) {
                continue;
            }
            let tref = (tenant.clone(), name.clone(), t.clone());
            let current = self
                .runs
                .get(&tref)
                .is_some_and(|r| r.attempt + 1 == st.attempt);
            match st.state {
                Some(TaskState::Evicting) | Some(TaskState::Terminating) if current => {
                    let why = match st.state {
                        Some(TaskState::Evicting) => {
                            format!("Evicted: {}", st.message.clone().unwrap_or_default())
                        }
                        _ => st.reason.clone().unwrap_or_else(|| "stopped".into()),
                    };
                    self.stop_run(&tref, grace, &why);
                }
                Some(TaskState::Evicting) | Some(TaskState::Terminating)
                    if !self.runs.contains_key(&tref) =>
                {
                    ended.push(Exit {
                        task: tref,
                        attempt: st.attempt.saturating_sub(1),
                        outcome: Outcome::Stopped {
                            reason: "it had no process".into(),
                            forced: false,
                        },
                        usage: None,
                        devices: vec![],
                        note: None,
                    });
                }
                _ => {}
            }
        }
        // Runs of this job whose task is no longer theirs.
        let stale: Vec<TaskRef> = self
            .runs
            .iter()
            .filter(|((t, j, n), r)| {
                t == tenant
                    && j == name
                    && !job.status.tasks.get(n).is_some_and(|st| {
                        st.attempt == r.attempt + 1 && st.state.is_some_and(TaskState::live)
                    })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for tref in stale {
            self.stop_run(&tref, grace, "the task is no longer bound here");
        }
        for e in ended {
            self.record_exit(e).await;
        }
        if job.status.phase != Phase::Running {
            return;
        }
        self.start_waiting(key, version, job).await;
    }

    /// Claims and starts the tasks of `job` that wait on this executor's nodes.
    async fn start_waiting(&mut self, key: &(String, String), version: u64, mut job: JobBody) {
        let (tenant, name) = key;
        let now = now_ms();
        let simulated = matches!(self.cfg.runner, Runner::Simulated { .. });
        let runs = |n: &str| {
            job.spec.tasks.iter().any(|t| {
                t.name == n
                    && if simulated {
                        t.duration.is_some()
                    } else {
                        !t.command.is_empty()
                    }
            })
        };
        let mut start: Vec<String> = Vec::new();
        for (n, st) in &job.status.tasks {
            if !self.mine(&st.node)
                || st.state.is_some()
                || !runs(n)
                || st.not_before.is_some_and(|nb| nb > now)
                || (st.after_evictions && self.evicting_on(&st.node))
                || self
                    .runs
                    .contains_key(&(tenant.clone(), name.clone(), n.clone()))
            {
                continue;
            }
            // A MIG step that would destroy an instance a running task holds waits.
            if let (Some(step), Runner::Node(nr)) = (&st.mig, &self.cfg.runner)
                && let Ok(node) = &nr.node
            {
                let held = self.held_mig(node);
                let g = st.gpus.first().copied().unwrap_or(0);
                if step
                    .destroy
                    .iter()
                    .any(|d| held.contains_key(&(g, d.profile.clone(), d.start)))
                {
                    continue;
                }
            }
            start.push(n.clone());
        }
        if start.is_empty() {
            return;
        }
        for n in &start {
            if let Some(st) = job.status.tasks.get_mut(n) {
                st.state = Some(TaskState::Running);
                st.attempt += 1;
                st.started_at = Some(now);
                st.finished_at = None;
                st.not_before = None;
                st.after_evictions = false;
                st.exit_code = None;
                st.message = None;
                st.usage = None;
            }
        }
        job.status.started_at.get_or_insert(now);
        let Ok(body) = serde_json::to_value(&job) else {
            return;
        };
        // Claim first: if the job changed meanwhile, a newer change is on its way.
        let Ok(o) = self
            .store
            .update(Key::new(kind::JOB, tenant, name), Some(version), body)
            .await
        else {
            return;
        };
        self.jobs.insert(key.clone(), (o.version, job.clone()));
        for n in start {
            let Some(spec) = job.spec.tasks.iter().find(|t| t.name == n).cloned() else {
                continue;
            };
            let Some(st) = job.status.tasks.get(&n).cloned() else {
                continue;
            };
            let tref = (tenant.clone(), name.clone(), n.clone());
            let attempt = st.attempt - 1;
            let handle = match self.cfg.runner.clone() {
                Runner::Simulated { speedup } => Handle::Sim(Some(self.simulate(
                    &tref,
                    attempt,
                    spec.duration.unwrap_or(0.0),
                    speedup,
                ))),
                Runner::Node(nr) => {
                    let tkey = TaskKey::new(tenant.clone(), name.clone(), n.clone(), attempt);
                    self.spawn(&nr, &tref, tkey.clone(), &job, &spec, &st).await;
                    Handle::Node(tkey)
                }
            };
            self.runs.insert(
                tref,
                Run {
                    attempt,
                    handle,
                    stopping: false,
                },
            );
        }
    }

    /// MIG instances held by tasks running on this node.
    fn held_mig(&self, node: &NodeRuntime) -> Held {
        let _ = node;
        let mut held = Held::new();
        for ((tenant, name), (_, job)) in &self.jobs {
            for (t, st) in &job.status.tasks {
                if let (Some(m), Some(&g)) = (&st.mig, st.gpus.first())
                    && self.mine(&st.node)
                    && st.state.is_some_and(TaskState::live)
                {
                    held.insert(
                        (g, m.profile.clone(), m.start),
                        format!("{tenant}/{name}/{t}"),
                    );
                }
            }
        }
        held
    }

    /// A simulated run: ends with status 0 after `duration / speedup` seconds.
    fn simulate(
        &self,
        task: &TaskRef,
        attempt: u32,
        duration: f64,
        speedup: f64,
    ) -> oneshot::Sender<()> {
        let real = Duration::from_secs_f64((duration / speedup).clamp(0.0, 1e9));
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let exits = self.exits.clone();
        let task = task.clone();
        tokio::spawn(async move {
            let (outcome, note) = tokio::select! {
                _ = tokio::time::sleep(real) => (
                    Outcome::Exited(0),
                    Some(format!("simulated: ran {duration} s ({:.3} s at {speedup}x)", real.as_secs_f64())),
                ),
                _ = kill_rx => (Outcome::Stopped { reason: "stopped".into(), forced: false }, None),
            };
            let _ = exits.send(Exit {
                task,
                attempt,
                outcome,
                usage: Some(Usage {
                    wall_seconds: real.as_secs_f64(),
                    ..Usage::default()
                }),
                devices: vec![],
                note,
            });
        });
        kill_tx
    }

    /// Starts one task in the node runtime (on a blocking thread). A task that cannot
    /// start ends at once with the reason.
    async fn spawn(
        &self,
        nr: &NodeRunner,
        tref: &TaskRef,
        tkey: TaskKey,
        job: &JobBody,
        spec: &crate::wire::TaskSpec,
        st: &crate::wire::TaskStatus,
    ) {
        let fail = |m: String| Exit {
            task: tref.clone(),
            attempt: tkey.attempt,
            outcome: Outcome::Failed(m),
            usage: None,
            devices: vec![],
            note: None,
        };
        let node = match &nr.node {
            Ok(n) => n.clone(),
            Err(e) => {
                let _ = self
                    .exits
                    .send(fail(format!("this node cannot run tasks: {e}")));
                return;
            }
        };
        let template = match spec.template.as_deref() {
            None => TemplateRef::Host,
            // The trust policy is asked again at every start (a signature may have
            // been revoked since the job was admitted).
            Some(t) => match tessera_sandbox::registry::resolve_in(
                nr.templates.as_ref(),
                t,
                &tessera_sandbox::trust::Subject::new(
                    &tref.0,
                    spec.runtime_class
                        .as_deref()
                        .unwrap_or(tessera_sandbox::class::DEFAULT_CLASS),
                ),
            ) {
                Ok((tessera_sandbox::Template::Host, _)) => TemplateRef::Host,
                Ok((tessera_sandbox::Template::Dir(d), _)) => TemplateRef::Dir(d),
                Err(e) => {
                    let _ = self.exits.send(fail(format!("template: {e}")));
                    return;
                }
            },
        };
        let record: Vec<GpuDevice> = if st.gpus.is_empty() {
            vec![]
        } else {
            match self.store.get(&Key::new(kind::NODE, "", &st.node)).await {
                Ok(Some(o)) => serde_json::from_value::<Node>(o.body)
                    .map(|n| n.gpus)
                    .unwrap_or_default(),
                _ => vec![],
            }
        };
        let gpus = match GpuAssignment::from_binding(
            &spec.gpu,
            &st.gpus,
            st.mig.as_ref().map(|m| m.start),
        ) {
            Ok(g) => g,
            Err(e) => {
                let _ = self.exits.send(fail(format!("the binding's GPUs: {e}")));
                return;
            }
        };
        let w = WorkloadSpec {
            key: tkey.clone(),
            command: spec.command.clone(),
            env: spec
                .env
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect(),
            working_dir: spec.working_dir.clone(),
            template,
            requests: spec.resources.clone(),
            limits: spec.limits,
            gpus,
            record,
            log: log_path(&nr.logs, &tref.0, &tref.1, job.created_at, &tref.2),
            tier: nr.classes.tier_of(spec.runtime_class.as_deref()),
            weights: spec
                .weights
                .iter()
                .map(|w| tessera_node::weights::WeightsMount::new(w))
                .collect(),
        };
        let mig = st.mig.clone();
        let first_gpu = st.gpus.first().copied();
        let held = self.held_mig(&node);
        let actuator = nr.mig.clone();
        let exits = self.exits.clone();
        let started = self.started.clone();
        let tref = tref.clone();
        // Detached: the task's end comes back on the exit channel.
        drop(tokio::task::spawn_blocking(move || {
            let fail = |m: String| Exit {
                task: tref.clone(),
                attempt: tkey.attempt,
                outcome: Outcome::Failed(m),
                usage: None,
                devices: vec![],
                note: None,
            };
            if let (Some(step), Some(g)) = (&mig, first_gpu) {
                let mut held = held;
                held.retain(|_, t| *t != format!("{}/{}/{}", tref.0, tref.1, tref.2));
                match actuator.apply(&tkey.to_string(), g, step, &held) {
                    Ok(Applied::Skipped(why)) => {
                        let _ = exits.send(fail(why));
                        return;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = exits.send(fail(format!("MIG step: {e}")));
                        return;
                    }
                }
            }
            let tx = exits.clone();
            let t2 = tref.clone();
            let devices = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
            let d2 = devices.clone();
            let r = node.start(
                w,
                Box::new(move |e| {
                    let devices = d2.lock().map(|d| d.clone()).unwrap_or_default();
                    let _ = tx.send(Exit {
                        task: t2,
                        attempt: e.key.attempt,
                        outcome: e.outcome,
                        usage: Some(e.usage),
                        devices,
                        note: None,
                    });
                }),
            );
            match r {
                Ok(s) => {
                    if let Ok(mut d) = devices.lock() {
                        *d = s
                            .view
                            .iter()
                            .map(|v| v.mig_uuid.clone().unwrap_or_else(|| v.uuid.clone()))
                            .collect();
                    }
                    let _ = started.send((tref.0.clone(), tref.1.clone()));
                }
                Err(e) => {
                    let _ = exits.send(fail(e.to_string()));
                }
            }
        }));
    }

    /// Records a run's end (the lifecycle decides what it does to the job), then its
    /// usage.
    async fn record_exit(&mut self, exit: Exit) {
        let (tenant, job_name, task) = &exit.task;
        if self
            .runs
            .get(&exit.task)
            .is_some_and(|r| r.attempt == exit.attempt)
        {
            self.runs.remove(&exit.task);
        }
        let key = Key::new(kind::JOB, tenant, job_name);
        let end = End {
            outcome: exit.outcome.clone(),
            usage: exit.usage,
            devices: exit.devices.clone(),
            note: exit.note.clone(),
        };
        for _ in 0..50 {
            let Ok(Some(o)) = self.store.get(&key).await else {
                return;
            };
            let Ok(mut job) = serde_json::from_value::<JobBody>(o.body.clone()) else {
                return;
            };
            let now = now_ms();
            let Some(rec) =
                jobs::record_end(&mut job, task, exit.attempt, &end, now, &self.cfg.lifecycle)
            else {
                return;
            };
            let mut ops = vec![if jobs::delete_due(&job, now) && job.status.deleting {
                Op::Delete {
                    key: key.clone(),
                    expected: Some(o.version),
                }
            } else {
                Op::Update {
                    key: key.clone(),
                    expected: Some(o.version),
                    body: match serde_json::to_value(&job) {
                        Ok(b) => b,
                        Err(_) => return,
                    },
                }
            }];
            if let Ok(ev) = event_op(
                tenant,
                format!("job/{job_name}"),
                rec.event,
                rec.message.clone(),
                now,
            ) {
                ops.push(ev);
            }
            match self.store.commit(ops).await {
                Ok(_) => {
                    if let Some(u) = exit.usage {
                        self.meter(
                            tenant,
                            job_name,
                            job.created_at,
                            task,
                            exit.attempt,
                            &u,
                            &job,
                        )
                        .await;
                    }
                    return;
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(StoreError::NotFound(_)) => return,
                Err(e) => {
                    tracing::warn!(
                        "executor: recording the end of {tenant}/{job_name}/{task}: {e}"
                    );
                    return;
                }
            }
        }
    }

    /// Usage records for a run, through the agent platform's meter (session
    /// `job.<name>`, runtime `jobs`), once per run and kind.
    #[allow(clippy::too_many_arguments)]
    async fn meter(
        &self,
        tenant: &str,
        job: &str,
        uid: u64,
        task: &str,
        attempt: u32,
        u: &Usage,
        body: &JobBody,
    ) {
        use tessera_agent::meter::{UsageKind, UsageRecord, record};
        let mem_gb_s = u.peak_memory.map(|m| m as f64 / 1e9 * u.wall_seconds);
        let _ = body;
        for (kind, q) in [
            (UsageKind::GpuSeconds, Some(u.gpu_seconds)),
            (UsageKind::CpuSeconds, u.cpu_seconds),
            (UsageKind::MemoryGbSeconds, mem_gb_s),
        ] {
            let Some(q) = q.filter(|q| *q > 0.0) else {
                continue;
            };
            let rec = UsageRecord {
                tenant: tenant.to_string(),
                session: format!("job.{job}"),
                runtime: "jobs".into(),
                kind,
                quantity: q,
                at_ms: now_ms(),
                source_id: format!("job/{job}/{uid}/{task}/{attempt}/{}", kind.as_str()),
            };
            if let Err(e) = record(&self.store, rec).await {
                tracing::warn!("executor: usage of {tenant}/{job}/{task}: {e}");
            }
        }
    }

    /// A deleted job's logs go once none of its runs is left here.
    fn forget_logs(&self, key: &(String, String), job: &JobBody) {
        if let Runner::Node(nr) = &self.cfg.runner
            && !self.runs.keys().any(|(t, j, _)| *t == key.0 && *j == key.1)
        {
            let dir = job_log_dir(&nr.logs, &key.0, &key.1, job.created_at);
            let _ = std::fs::remove_dir_all(&dir);
            // The job's folder too, when this was its last instance.
            if let Some(parent) = dir.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }

    fn shutdown(&mut self) {
        let refs: Vec<TaskRef> = self.runs.keys().cloned().collect();
        for r in refs {
            self.stop_run(&r, Duration::ZERO, "the control plane stopped");
        }
    }
}

pub use crate::heartbeat::{MISMATCH_TAINT, NODESTATUS};
