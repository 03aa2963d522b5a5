//! The executors: the local one runs the tasks bound to this machine's node as
//! child processes (the command of the task, with `CUDA_VISIBLE_DEVICES` set to the
//! GPUs the scheduler assigned), writes their output to a log file per task, and
//! records how they ended; the simulated one runs the tasks bound to simulated
//! nodes (`tessera up --cluster`) in simulated time: a task with a `duration`
//! succeeds that long (divided by the speed-up) after it started. The sandbox runtime will implement the same job later; until then
//! this is a plain child process.
//!
//! Protocol with the store: before starting a task the executor marks it `running`
//! with compare-and-swap, so a task is started at most once even across restarts. A
//! task found `running` at start without a process of ours was lost with the
//! previous control plane and is marked `failed`. A task without a command has no
//! process and no state: it holds its resources until the job is cancelled.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tessera_store::{AnyStore, ChangeOp, Key, Object, Op, Store, StoreError, WatchFilter};
use tokio::sync::{mpsc, oneshot};

use crate::plane::{event_op, kind, now_ms};
use crate::wire::{JobBody, Phase, TaskState};

/// Which tasks an executor runs, and how.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// The nodes whose tasks this executor runs.
    pub nodes: std::collections::BTreeSet<String>,
    pub runner: Runner,
}

/// How a task runs.
#[derive(Debug, Clone)]
pub enum Runner {
    /// A child process of the task's `command` on this machine; output in
    /// `<logs>/<tenant>/<job>/<task>.log`. Tasks without a command hold their
    /// resources until the job ends.
    Process { logs: PathBuf },
    /// Simulated nodes: a task with a `duration` (seconds) succeeds after
    /// `duration / speedup` seconds of real time; one without holds its resources
    /// until the job ends.
    Simulated { speedup: f64 },
}

impl ExecConfig {
    /// The local executor: processes for the tasks of `node`.
    pub fn local(node: impl Into<String>, logs: PathBuf) -> Self {
        ExecConfig {
            nodes: [node.into()].into(),
            runner: Runner::Process { logs },
        }
    }
}

/// The log file of one task.
pub fn log_path(logs: &Path, tenant: &str, job: &str, task: &str) -> PathBuf {
    logs.join(tenant).join(job).join(format!("{task}.log"))
}

type TaskRef = (String, String, String);

struct Exit {
    task: TaskRef,
    code: Option<i32>,
    message: String,
}

struct Executor {
    store: AnyStore,
    cfg: ExecConfig,
    children: HashMap<TaskRef, oneshot::Sender<()>>,
    exits: mpsc::UnboundedSender<Exit>,
}

/// Runs the executor until `stop` turns true; then kills its children.
pub async fn run_executor(
    store: AnyStore,
    cfg: ExecConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut ex = Executor {
        store: store.clone(),
        cfg,
        children: HashMap::new(),
        exits: tx,
    };
    let mut w = ex.resync().await;
    loop {
        tokio::select! {
            r = w.next() => match r {
                Ok(changes) => {
                    for c in changes {
                        if c.op == ChangeOp::Deleted {
                            ex.kill_job(&c.object.tenant, &c.object.name);
                        } else {
                            ex.handle(&c.object).await;
                        }
                    }
                }
                // Fell behind the change log's compaction: read the jobs again.
                Err(StoreError::Compacted { .. }) => w = ex.resync().await,
                Err(e) => {
                    eprintln!("executor: watch failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
            },
            Some(exit) = rx.recv() => ex.record_exit(exit).await,
            _ = stop.changed() => {
                for (_, kill) in ex.children.drain() {
                    let _ = kill.send(());
                }
                return;
            }
        }
    }
}

impl Executor {
    /// Reads every job (see [`Executor::recover`]) and watches from there.
    async fn resync(&mut self) -> tessera_store::Watcher<AnyStore> {
        let start = loop {
            match self.recover().await {
                Ok(rev) => break rev,
                Err(e) => {
                    eprintln!("executor: reading jobs failed: {e}; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        };
        self.store.watch(
            start,
            WatchFilter {
                kind: Some(kind::JOB.into()),
                tenant: None,
            },
        )
    }

    /// Marks tasks of this node left `running` without a process of ours (by a
    /// previous control plane) as lost, starts
    /// what is waiting, and returns the revision to watch from.
    async fn recover(&mut self) -> Result<u64, StoreError> {
        let rev = self.store.revision().await?;
        for o in self.store.list(kind::JOB, None).await?.objects {
            let Ok(mut job) = serde_json::from_value::<JobBody>(o.body.clone()) else {
                continue;
            };
            if job.status.phase.is_final() {
                continue;
            }
            let mut lost = Vec::new();
            for (name, st) in job.status.tasks.iter_mut() {
                let ours =
                    self.children
                        .contains_key(&(o.tenant.clone(), o.name.clone(), name.clone()));
                if self.cfg.nodes.contains(&st.node)
                    && st.state == Some(TaskState::Running)
                    && !ours
                {
                    st.state = Some(TaskState::Failed);
                    st.message = Some("lost: the control plane restarted while it ran".into());
                    lost.push(name.clone());
                }
            }
            if lost.is_empty() {
                self.handle(&o).await;
                continue;
            }
            job.status.phase = Phase::Failed;
            let body =
                serde_json::to_value(&job).map_err(|e| StoreError::Backend(e.to_string()))?;
            let mut ops = vec![Op::Update {
                key: o.key(),
                expected: Some(o.version),
                body,
            }];
            if let Ok(ev) = event_op(
                &o.tenant,
                format!("job/{}", o.name),
                "TaskLost",
                lost.join(", "),
                now_ms(),
            ) {
                ops.push(ev);
            }
            match self.store.commit(ops).await {
                Ok(_) | Err(StoreError::Conflict { .. } | StoreError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(rev)
    }

    fn kill_job(&mut self, tenant: &str, job: &str) {
        let keys: Vec<TaskRef> = self
            .children
            .keys()
            .filter(|(t, j, _)| t == tenant && j == job)
            .cloned()
            .collect();
        for k in keys {
            if let Some(kill) = self.children.remove(&k) {
                let _ = kill.send(());
            }
        }
    }

    /// Reacts to a job's latest state: start its waiting tasks on this node, or stop
    /// them when the job is over.
    async fn handle(&mut self, o: &Object) {
        let Ok(mut job) = serde_json::from_value::<JobBody>(o.body.clone()) else {
            return;
        };
        if job.status.phase.is_final() {
            self.kill_job(&o.tenant, &o.name);
            return;
        }
        if job.status.phase != Phase::Running {
            return;
        }
        // Tasks with nothing to run (no command; in simulation, no duration) only
        // hold their resources.
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
        let start: Vec<String> = job
            .status
            .tasks
            .iter()
            .filter(|(n, st)| self.cfg.nodes.contains(&st.node) && st.state.is_none() && runs(n))
            .map(|(n, _)| n.clone())
            .collect();
        if start.is_empty() {
            return;
        }
        for n in &start {
            if let Some(st) = job.status.tasks.get_mut(n) {
                st.state = Some(TaskState::Running);
            }
        }
        let Ok(body) = serde_json::to_value(&job) else {
            return;
        };
        // Claim first: if the job changed meanwhile, a newer change is on its way.
        if self
            .store
            .update(o.key(), Some(o.version), body)
            .await
            .is_err()
        {
            return;
        }
        for n in start {
            let Some(spec) = job.spec.tasks.iter().find(|t| t.name == n) else {
                continue;
            };
            let gpus = job
                .status
                .tasks
                .get(&n)
                .map(|s| s.gpus.clone())
                .unwrap_or_default();
            let task = (o.tenant.clone(), o.name.clone(), n.clone());
            let started = match &self.cfg.runner {
                Runner::Process { logs } => self.spawn(logs, &task, &spec.command, &gpus),
                Runner::Simulated { speedup } => {
                    Ok(self.simulate(&task, spec.duration.unwrap_or(0.0), *speedup))
                }
            };
            match started {
                Ok(kill) => {
                    self.children.insert(task, kill);
                }
                Err(message) => {
                    let _ = self.exits.send(Exit {
                        task,
                        code: None,
                        message,
                    });
                }
            }
        }
    }

    /// A simulated run: ends with status 0 after `duration / speedup` seconds.
    fn simulate(&self, task: &TaskRef, duration: f64, speedup: f64) -> oneshot::Sender<()> {
        let real = std::time::Duration::from_secs_f64((duration / speedup).clamp(0.0, 1e9));
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let exits = self.exits.clone();
        let task = task.clone();
        tokio::spawn(async move {
            let (code, message) = tokio::select! {
                _ = tokio::time::sleep(real) => (
                    Some(0),
                    format!("simulated: ran {duration} s ({:.3} s at {speedup}x)", real.as_secs_f64()),
                ),
                _ = kill_rx => (None, "killed: the job ended".to_string()),
            };
            let _ = exits.send(Exit {
                task,
                code,
                message,
            });
        });
        kill_tx
    }

    fn spawn(
        &self,
        logs: &Path,
        task: &TaskRef,
        command: &[String],
        gpus: &[u32],
    ) -> Result<oneshot::Sender<()>, String> {
        let (tenant, job, name) = task;
        let path = log_path(logs, tenant, job, name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let out = std::fs::File::create(&path)
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let visible: Vec<String> = gpus.iter().map(u32::to_string).collect();
        let mut child = tokio::process::Command::new(&command[0])
            .args(&command[1..])
            .env("CUDA_VISIBLE_DEVICES", visible.join(","))
            .env("TESSERA_TENANT", tenant)
            .env("TESSERA_JOB", job)
            .env("TESSERA_TASK", name)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {:?}: {e}", command[0]))?;
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let exits = self.exits.clone();
        let task = task.clone();
        tokio::spawn(async move {
            let (code, message) = tokio::select! {
                s = child.wait() => match s {
                    Ok(s) => (s.code(), format!("exited: {s}")),
                    Err(e) => (None, format!("waiting for the process: {e}")),
                },
                _ = kill_rx => {
                    let _ = child.kill().await;
                    (None, "killed: the job ended".to_string())
                }
            };
            let _ = exits.send(Exit {
                task,
                code,
                message,
            });
        });
        Ok(kill_tx)
    }

    /// Records a task's end; a failed task fails the job (and stops its siblings), the
    /// last successful one completes it.
    async fn record_exit(&mut self, exit: Exit) {
        let (tenant, job_name, task) = &exit.task;
        self.children.remove(&exit.task);
        let key = Key::new(kind::JOB, tenant, job_name);
        for _ in 0..20 {
            let Ok(Some(o)) = self.store.get(&key).await else {
                return;
            };
            let Ok(mut job) = serde_json::from_value::<JobBody>(o.body.clone()) else {
                return;
            };
            if job.status.phase.is_final() {
                return;
            }
            let Some(st) = job.status.tasks.get_mut(task) else {
                return;
            };
            let ok = exit.code == Some(0);
            st.state = Some(if ok {
                TaskState::Succeeded
            } else {
                TaskState::Failed
            });
            st.exit_code = exit.code;
            st.message = Some(exit.message.clone());
            let total = job.spec.tasks.len();
            let succeeded = job
                .status
                .tasks
                .values()
                .filter(|s| s.state == Some(TaskState::Succeeded))
                .count();
            if !ok {
                job.status.phase = Phase::Failed;
            } else if succeeded == total {
                job.status.phase = Phase::Succeeded;
            }
            let Ok(body) = serde_json::to_value(&job) else {
                return;
            };
            let mut ops = vec![Op::Update {
                key: key.clone(),
                expected: Some(o.version),
                body,
            }];
            let reason = if ok { "TaskSucceeded" } else { "TaskFailed" };
            if let Ok(ev) = event_op(
                tenant,
                format!("job/{job_name}"),
                reason,
                format!("{task}: {}", exit.message),
                now_ms(),
            ) {
                ops.push(ev);
            }
            match self.store.commit(ops).await {
                Ok(_) => {
                    if job.status.phase == Phase::Failed {
                        self.kill_job(tenant, job_name);
                    }
                    return;
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => {
                    eprintln!("executor: recording the end of {tenant}/{job_name}/{task}: {e}");
                    return;
                }
            }
        }
    }
}
