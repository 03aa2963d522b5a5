//! The scheduler loop: build a snapshot from the store, run the batch scheduler,
//! write the plan back in one transaction (compare-and-swap on every job it
//! touches, so a concurrent change makes the round retry instead of overwriting).
//! It runs on a short period and whenever the store changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_model::{Node, PodGroup, Queue, Snapshot, Task};
use tessera_store::{AnyStore, Key, Object, Op, Store, StoreError};

use crate::plane::{event_op, kind, now_ms};
use crate::problem::ApiError;
use crate::wire::{JobBody, Phase, TaskStatus};

/// A scheduling function: snapshot in, plan out.
pub type ScheduleFn = Arc<dyn Fn(&Snapshot) -> tessera_model::Plan + Send + Sync>;

/// The batch scheduler with its default configuration.
pub fn batch_scheduler() -> ScheduleFn {
    let cfg = tessera_sched::Config::default();
    Arc::new(move |s| tessera_sched::schedule(s, &cfg))
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    pub jobs_considered: usize,
    pub jobs_updated: usize,
    pub bindings: usize,
    pub evictions: usize,
    /// The plan was not applied because a job changed meanwhile; run again.
    pub conflict: bool,
}

/// Scoped names in the snapshot: `tenant/name`.
fn scoped(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

/// Builds the scheduler's snapshot from stored nodes, queues and jobs. Returns the
/// snapshot and the jobs it includes, by scoped name.
pub fn build_snapshot(
    nodes: &[Object],
    queues: &[Object],
    jobs: &[Object],
) -> (Snapshot, BTreeMap<String, (Object, JobBody)>) {
    let mut snap = Snapshot::default();
    for o in nodes {
        if let Ok(n) = serde_json::from_value::<Node>(o.body.clone()) {
            snap.nodes.push(n);
        }
    }
    for o in queues {
        if let Ok(mut q) = serde_json::from_value::<Queue>(o.body.clone()) {
            q.name = scoped(&o.tenant, &q.name);
            q.parent = q.parent.map(|p| scoped(&o.tenant, &p));
            snap.queues.push(q);
        }
    }
    let mut index = BTreeMap::new();
    for o in jobs {
        let Ok(job) = serde_json::from_value::<JobBody>(o.body.clone()) else {
            continue;
        };
        if job.status.phase == Phase::Cancelled {
            continue;
        }
        let name = scoped(&o.tenant, &o.name);
        let spec = &job.spec;
        let mut g = PodGroup::new(
            name.clone(),
            scoped(&o.tenant, &spec.queue),
            spec.min_member.unwrap_or(spec.tasks.len() as u32),
        );
        g.min_resources = spec.min_resources.clone();
        g.priority = spec.priority;
        g.kind = spec.kind;
        g.creation = job.created_at;
        g.preemptable = spec.preemptable;
        for t in &spec.tasks {
            let mut task = Task::new(t.name.clone(), t.resources.clone()).with_gpu(t.gpu.clone());
            task.node_selector = t.node_selector.clone();
            task.tolerations = t.tolerations.clone();
            task.priority = t.priority;
            if let Some(st) = job.status.tasks.get(&t.name) {
                task.node = Some(st.node.clone());
                task.gpu_indices = st.gpus.clone();
            }
            g.tasks.push(task);
        }
        snap.groups.push(g);
        index.insert(name, (o.clone(), job));
    }
    (snap, index)
}

/// Runs one round: snapshot, schedule, write back.
pub async fn run_once(store: &AnyStore, schedule: &ScheduleFn) -> Result<Round, ApiError> {
    let nodes = store.list(kind::NODE, Some("")).await?;
    let queues = store.list(kind::QUEUE, None).await?;
    let jobs = store.list(kind::JOB, None).await?;
    let (snap, mut index) = build_snapshot(&nodes.objects, &queues.objects, &jobs.objects);
    let mut round = Round {
        jobs_considered: index.len(),
        ..Round::default()
    };
    if snap.groups.is_empty() {
        return Ok(round);
    }
    let f = schedule.clone();
    let plan = tokio::task::spawn_blocking(move || f(&snap))
        .await
        .map_err(ApiError::internal)?;
    round.bindings = plan.bindings.len();
    round.evictions = plan.evictions.len();

    let old: BTreeMap<String, JobBody> = index
        .iter()
        .map(|(k, (_, j))| (k.clone(), j.clone()))
        .collect();
    let mut bound: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut evicted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &plan.evictions {
        if let Some((_, job)) = index.get_mut(&e.task.group) {
            job.status.tasks.remove(&e.task.task);
            evicted
                .entry(e.task.group.clone())
                .or_default()
                .push(format!("{} from {}: {}", e.task.task, e.node, e.reason));
        }
    }
    for b in &plan.bindings {
        if let Some((_, job)) = index.get_mut(&b.task.group) {
            job.status.tasks.insert(
                b.task.task.clone(),
                TaskStatus {
                    node: b.node.clone(),
                    gpus: b.gpus.clone(),
                },
            );
            bound
                .entry(b.task.group.clone())
                .or_default()
                .push(format!("{} -> {}", b.task.task, b.node));
        }
    }
    let pending: BTreeMap<&str, &tessera_model::Pending> =
        plan.pending.iter().map(|p| (p.group.as_str(), p)).collect();
    let now = now_ms();
    let mut ops = Vec::new();
    for (name, (obj, job)) in &mut index {
        let min = job.spec.min_member.unwrap_or(job.spec.tasks.len() as u32) as usize;
        match pending.get(name.as_str()) {
            Some(p) => {
                job.status.pending_reason = Some(p.reason.clone());
                job.status.admitted = p.admitted;
            }
            None => {
                job.status.pending_reason = None;
                job.status.admitted = job.status.admitted || !job.status.tasks.is_empty();
            }
        }
        job.status.phase = if job.status.tasks.len() >= min {
            Phase::Running
        } else {
            Phase::Pending
        };
        if old.get(name) == Some(job) {
            continue;
        }
        let prev = &old[name];
        ops.push(Op::Update {
            key: Key::new(kind::JOB, &obj.tenant, &obj.name),
            expected: Some(obj.version),
            body: serde_json::to_value(&*job).map_err(ApiError::internal)?,
        });
        let object = format!("job/{}", obj.name);
        if let Some(b) = bound.get(name) {
            ops.push(event_op(
                &obj.tenant,
                object.clone(),
                "Scheduled",
                b.join(", "),
                now,
            )?);
        }
        if let Some(e) = evicted.get(name) {
            ops.push(event_op(
                &obj.tenant,
                object.clone(),
                "Evicted",
                e.join(", "),
                now,
            )?);
        }
        if job.status.pending_reason != prev.status.pending_reason
            && let Some(r) = &job.status.pending_reason
        {
            ops.push(event_op(&obj.tenant, object, "Pending", r.clone(), now)?);
        }
        round.jobs_updated += 1;
    }
    if ops.is_empty() {
        return Ok(round);
    }
    match store.commit(ops).await {
        Ok(_) => Ok(round),
        Err(StoreError::Conflict { .. } | StoreError::NotFound(_)) => {
            round.conflict = true;
            round.jobs_updated = 0;
            Ok(round)
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs rounds until `stop` turns true: after every change to the store (at most
/// one round per `min_gap`) and at least every `period`.
pub async fn run_loop(
    store: AnyStore,
    schedule: ScheduleFn,
    period: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let min_gap = Duration::from_millis(20);
    let mut wake = store.notifier();
    loop {
        wake.mark_unchanged();
        match run_once(&store, &schedule).await {
            Ok(r) if r.conflict => {
                tokio::time::sleep(min_gap).await;
                continue;
            }
            Ok(_) => {}
            Err(e) => eprintln!("scheduler round failed: {e}"),
        }
        tokio::select! {
            _ = wake.changed() => {}
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        tokio::time::sleep(min_gap).await;
    }
}
