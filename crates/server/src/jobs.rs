//! The job lifecycle, in Kubernetes Job words: what a task's end, an eviction, a
//! cancel, a deadline or a deletion does to a job. Pure functions over a
//! [`JobBody`] (time is an input); the executor and the job controller apply them
//! with compare-and-swap, so every decision is made once, on the version it read.
//!
//! States of a bound task (`TaskStatus.state`): none (bound, to start), `running`,
//! `terminating` / `evicting` (its tree is being stopped; it still holds its
//! resources), `evicted` (back to pending), `succeeded`, `failed`.
//!
//! - A task that fails: with `restart_policy: OnFailure` and restarts left
//!   (`backoff_limit`, all tasks together) it starts again in place after
//!   `base × 2^(restarts-1)` (capped); else the job fails (`BackoffLimitExceeded`)
//!   and every other live task of the gang is stopped: no sibling stays `running`.
//! - An eviction marks the task `evicting`; the node stops its tree (SIGTERM,
//!   grace, SIGKILL) and records it `evicted`; it is placed again later. A gang
//!   left below `min_member` by an eviction is stopped whole.
//! - `active_deadline_seconds` counts from the job's first start; past it the job
//!   fails (`DeadlineExceeded`) and its trees are stopped.
//! - `ttl_seconds_after_finished`: a finished job whose trees are gone is deleted.

use std::time::Duration;

use tessera_node::{Outcome, Usage};

use crate::wire::{JobBody, Phase, RestartPolicy, TaskState, TaskStatus};

/// Timing of restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    /// The first restart's delay (Kubernetes: 10 s); each next one doubles.
    pub backoff_base: Duration,
    /// The longest delay (Kubernetes: 6 min).
    pub backoff_cap: Duration,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            backoff_base: Duration::from_secs(10),
            backoff_cap: Duration::from_secs(360),
        }
    }
}

/// The delay before restart number `n` (1 for the first).
pub fn backoff(n: u32, l: &Lifecycle) -> Duration {
    let shift = n.saturating_sub(1).min(30);
    l.backoff_base
        .saturating_mul(1u32 << shift)
        .min(l.backoff_cap)
}

/// Tasks that count toward the gang: bound and not evicted, failed or stopping.
pub fn members(job: &JobBody) -> usize {
    job.status
        .tasks
        .values()
        .filter(|t| {
            matches!(
                t.state,
                None | Some(TaskState::Running) | Some(TaskState::Succeeded)
            )
        })
        .count()
}

/// The phase of a job that is not final, from its members.
pub fn phase(job: &JobBody) -> Phase {
    if job.status.phase.is_final() {
        return job.status.phase;
    }
    if members(job) >= job.spec.min_member() {
        Phase::Running
    } else {
        Phase::Pending
    }
}

/// Whether any task of the job may still have a process.
pub fn has_live(job: &JobBody) -> bool {
    job.status
        .tasks
        .values()
        .any(|t| t.state.is_some_and(TaskState::live))
}

/// The job fails: its live tasks are stopped, those not started are marked failed.
pub fn fail(job: &mut JobBody, reason: &str, message: String, now: u64) {
    if job.status.phase.is_final() {
        return;
    }
    job.status.phase = Phase::Failed;
    job.status.reason = Some(reason.to_string());
    job.status.message = Some(message.clone());
    job.status.finished_at = Some(now);
    for t in job.status.tasks.values_mut() {
        match t.state {
            Some(TaskState::Running) => {
                t.state = Some(TaskState::Terminating);
                t.reason = Some(reason.to_string());
                t.message = Some(format!("stopping: {message}"));
            }
            None | Some(TaskState::Evicted) => {
                t.state = Some(TaskState::Failed);
                t.reason = Some(reason.to_string());
                t.message = Some(format!("not started: {message}"));
                t.not_before = None;
            }
            _ => {}
        }
    }
}

/// Cancels a job: live tasks are stopped; the others are released at once.
pub fn cancel(job: &mut JobBody, by: &str, now: u64) {
    if job.status.phase.is_final() {
        return;
    }
    job.status.phase = Phase::Cancelled;
    job.status.reason = Some("Cancelled".into());
    job.status.message = Some(format!("cancelled by {by}"));
    job.status.finished_at = Some(now);
    job.status.pending_reason = None;
    job.status
        .tasks
        .retain(|_, t| t.state.is_some_and(TaskState::live));
    for t in job.status.tasks.values_mut() {
        if t.state == Some(TaskState::Running) {
            t.state = Some(TaskState::Terminating);
            t.reason = Some("Cancelled".into());
            t.message = Some(format!("stopping: cancelled by {by}"));
        }
    }
}

/// Fails the job with `DeadlineExceeded` when `active_deadline_seconds` has passed
/// since it started. Returns whether it did.
pub fn check_deadline(job: &mut JobBody, now: u64) -> bool {
    let (Some(d), Some(start)) = (job.spec.active_deadline_seconds, job.status.started_at) else {
        return false;
    };
    if job.status.phase.is_final() || now < start.saturating_add(d.saturating_mul(1000)) {
        return false;
    }
    fail(
        job,
        "DeadlineExceeded",
        format!("the job ran longer than its active_deadline_seconds ({d} s)"),
        now,
    );
    true
}

/// When the job next needs a look, in ms since the epoch: the deadline, a task's
/// back-off, the TTL.
pub fn next_due(job: &JobBody) -> Option<u64> {
    let mut due: Vec<u64> = Vec::new();
    if !job.status.phase.is_final()
        && let (Some(d), Some(s)) = (job.spec.active_deadline_seconds, job.status.started_at)
    {
        due.push(s.saturating_add(d.saturating_mul(1000)));
    }
    due.extend(job.status.tasks.values().filter_map(|t| t.not_before));
    if let Some(at) = ttl_at(job) {
        due.push(at);
    }
    due.into_iter().min()
}

/// When a finished job's TTL runs out (its trees gone).
pub fn ttl_at(job: &JobBody) -> Option<u64> {
    let ttl = job.spec.ttl_seconds_after_finished?;
    if !job.status.phase.is_final() || has_live(job) {
        return None;
    }
    Some(
        job.status
            .finished_at
            .unwrap_or(job.created_at)
            .saturating_add(ttl.saturating_mul(1000)),
    )
}

/// Should the object be deleted now (TTL out, or a delete waited for its trees)?
pub fn delete_due(job: &JobBody, now: u64) -> bool {
    if has_live(job) {
        return false;
    }
    job.status.deleting || ttl_at(job).is_some_and(|at| now >= at)
}

/// Marks `task` evicted by the scheduler (it still runs until its node stops its
/// tree), and stops the whole gang when this leaves it below `min_member`. Returns
/// the tasks marked. A task without a process is evicted at once.
pub fn evict(
    job: &mut JobBody,
    task: &str,
    preemptor: Option<String>,
    reason: &str,
    now: u64,
) -> Vec<String> {
    let mut marked = Vec::new();
    let was_running = phase(job) == Phase::Running;
    let mark = |t: &mut TaskStatus, reason: &str| {
        t.preemptor = preemptor.clone();
        t.reason = Some("Evicted".into());
        t.message = Some(reason.to_string());
        t.not_before = None;
        if t.state == Some(TaskState::Running) {
            t.state = Some(TaskState::Evicting);
        } else {
            t.state = Some(TaskState::Evicted);
            t.evictions += 1;
            t.finished_at = Some(now);
        }
    };
    match job.status.tasks.get_mut(task) {
        Some(t) if matches!(t.state, None | Some(TaskState::Running)) => {
            mark(t, reason);
            marked.push(task.to_string());
        }
        _ => return marked,
    }
    if was_running && !job.status.phase.is_final() && members(job) < job.spec.min_member() {
        let why = format!(
            "gang below min_member ({}): {task} was evicted ({reason})",
            job.spec.min_member()
        );
        let names: Vec<String> = job
            .status
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t.state, None | Some(TaskState::Running)))
            .map(|(n, _)| n.clone())
            .collect();
        for n in names {
            if let Some(t) = job.status.tasks.get_mut(&n) {
                mark(t, &why);
                marked.push(n);
            }
        }
    }
    job.status.phase = phase(job);
    marked
}

/// A run's end, as the node saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct End {
    pub outcome: Outcome,
    pub usage: Option<Usage>,
    /// The GPUs it saw (UUIDs), when it started.
    pub devices: Vec<String>,
    /// Said instead of the outcome's own message (a simulated run says how long).
    pub note: Option<String>,
}

/// What [`record_end`] decided, for events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// `TaskSucceeded`, `TaskFailed`, `TaskRestarting`, `TaskEvicted`, `TaskStopped`.
    pub event: &'static str,
    pub message: String,
}

/// Records how run `attempt` of `task` ended. `None` when that run is not the
/// task's current one (a stale report: the task was placed again since).
pub fn record_end(
    job: &mut JobBody,
    task: &str,
    attempt: u32,
    end: &End,
    now: u64,
    l: &Lifecycle,
) -> Option<Recorded> {
    let restart = job.spec.restart_policy == RestartPolicy::OnFailure;
    let limit = job.spec.backoff_limit();
    let total_restarts: u32 = job.status.tasks.values().map(|t| t.restarts).sum();
    let cancelled = job.status.phase == Phase::Cancelled;
    let t = job.status.tasks.get_mut(task)?;
    if !t.state.is_some_and(TaskState::live) || t.attempt != attempt + 1 {
        return None;
    }
    t.usage = end.usage;
    t.finished_at = Some(now);
    if !end.devices.is_empty() {
        t.devices = end.devices.clone();
    }
    t.exit_code = end.outcome.code();
    let said = end.note.clone().unwrap_or_else(|| end.outcome.message());
    let out = match t.state {
        Some(TaskState::Evicting) => {
            t.state = Some(TaskState::Evicted);
            t.evictions += 1;
            let m = format!("evicted: {}; {said}", t.message.clone().unwrap_or_default());
            t.message = Some(m.clone());
            Recorded {
                event: "TaskEvicted",
                message: format!("{task}: {m}"),
            }
        }
        Some(TaskState::Terminating) => {
            let m = format!("stopped ({}): {said}", t.reason.clone().unwrap_or_default());
            t.message = Some(m.clone());
            t.state = Some(TaskState::Failed);
            let rec = Recorded {
                event: "TaskStopped",
                message: format!("{task}: {m}"),
            };
            if cancelled {
                // A cancelled job's tasks are released once their trees are gone.
                job.status.tasks.remove(task);
            }
            job.status.phase = phase(job);
            return Some(rec);
        }
        _ if end.outcome.success() => {
            t.state = Some(TaskState::Succeeded);
            t.reason = Some("Completed".into());
            t.message = Some(said.clone());
            Recorded {
                event: "TaskSucceeded",
                message: format!("{task}: {said}"),
            }
        }
        _ => {
            let reason = match &end.outcome {
                Outcome::OomKilled(_) => "OOMKilled",
                Outcome::Failed(m) if m.starts_with("device view mismatch") => "DeviceViewMismatch",
                Outcome::Failed(m) if m.starts_with("lost:") => "Lost",
                Outcome::Failed(_) => "StartError",
                _ => "Error",
            };
            t.reason = Some(reason.into());
            if restart && total_restarts < limit {
                t.restarts += 1;
                let wait = backoff(t.restarts, l);
                t.state = None;
                t.not_before = Some(now + wait.as_millis() as u64);
                let m = format!(
                    "{said}; restart {} of {limit} in {:.1} s",
                    t.restarts,
                    wait.as_secs_f64()
                );
                t.message = Some(m.clone());
                job.status.phase = phase(job);
                return Some(Recorded {
                    event: "TaskRestarting",
                    message: format!("{task}: {m}"),
                });
            }
            t.state = Some(TaskState::Failed);
            t.message = Some(said.clone());
            let why = if restart {
                format!("{task} failed ({said}) and the job used its {limit} restarts")
            } else {
                format!("{task} failed: {said}")
            };
            fail(job, "BackoffLimitExceeded", why.clone(), now);
            return Some(Recorded {
                event: "TaskFailed",
                message: why,
            });
        }
    };
    if !job.status.phase.is_final() {
        let all = job.spec.tasks.len();
        let ok = job
            .status
            .tasks
            .values()
            .filter(|t| t.state == Some(TaskState::Succeeded))
            .count();
        if ok == all {
            job.status.phase = Phase::Succeeded;
            job.status.reason = Some("Completed".into());
            job.status.finished_at = Some(now);
        } else {
            job.status.phase = phase(job);
        }
    }
    Some(out)
}

/// How long a node may stay silent before its live tasks count as lost
/// (Kubernetes' node-monitor grace period).
pub const NODE_LOST_AFTER: Duration = Duration::from_secs(40);

/// The job controller: deadlines, TTLs, deletions that waited for their trees, and
/// tasks of nodes that stopped reporting. Every change is a compare-and-swap on the
/// version it read, so several replicas may run it.
pub async fn run_controller(
    store: tessera_store::AnyStore,
    lifecycle: Lifecycle,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use tessera_store::{ChangeOp, Store, StoreError, WatchFilter};
    let mut jobs: std::collections::BTreeMap<(String, String), (u64, JobBody)> = Default::default();
    let mut last_node_check = 0u64;
    'outer: loop {
        let rev = match store.revision().await {
            Ok(r) => r,
            Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        jobs.clear();
        match store.list(crate::plane::kind::JOB, None).await {
            Ok(l) => {
                for o in l.objects {
                    if let Ok(j) = serde_json::from_value::<JobBody>(o.body.clone()) {
                        jobs.insert((o.tenant.clone(), o.name.clone()), (o.version, j));
                    }
                }
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        }
        let mut w = store.watch(
            rev,
            WatchFilter {
                kind: Some(crate::plane::kind::JOB.into()),
                tenant: None,
            },
        );
        loop {
            let now = crate::plane::now_ms();
            let due: Vec<(String, String)> = jobs
                .iter()
                .filter(|(_, (_, j))| next_due(j).is_some_and(|d| d <= now) || delete_due(j, now))
                .map(|(k, _)| k.clone())
                .collect();
            for k in due {
                act(&store, &k, &lifecycle).await;
            }
            if now >= last_node_check + 5000 {
                last_node_check = now;
                lost_nodes(&store, &lifecycle).await;
            }
            let next = jobs
                .values()
                .filter_map(|(_, j)| next_due(j))
                .min()
                .unwrap_or(now + 1000)
                .clamp(now + 10, now + 1000);
            tokio::select! {
                r = w.next() => match r {
                    Ok(changes) => {
                        for c in changes {
                            let key = (c.object.tenant.clone(), c.object.name.clone());
                            if c.op == ChangeOp::Deleted {
                                jobs.remove(&key);
                            } else if let Ok(j) = serde_json::from_value::<JobBody>(c.object.body.clone()) {
                                jobs.insert(key, (c.object.version, j));
                            }
                        }
                    }
                    Err(StoreError::Compacted { .. }) => continue 'outer,
                    Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                },
                _ = tokio::time::sleep(Duration::from_millis(next - now)) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// Applies what is due for one job (read afresh; compare-and-swap).
async fn act(store: &tessera_store::AnyStore, key: &(String, String), _l: &Lifecycle) {
    use tessera_store::{Key, Op, Store};
    let k = Key::new(crate::plane::kind::JOB, &key.0, &key.1);
    let Ok(Some(o)) = store.get(&k).await else {
        return;
    };
    let Ok(mut job) = serde_json::from_value::<JobBody>(o.body.clone()) else {
        return;
    };
    let now = crate::plane::now_ms();
    let object = format!("job/{}", key.1);
    let ops = if delete_due(&job, now) {
        let why = if job.status.deleting {
            "deleted once its trees were gone".to_string()
        } else {
            format!(
                "deleted {} s after it finished (ttl_seconds_after_finished)",
                job.spec.ttl_seconds_after_finished.unwrap_or(0)
            )
        };
        let mut ops = vec![Op::Delete {
            key: k,
            expected: Some(o.version),
        }];
        ops.extend(crate::plane::event_op(&key.0, object, "Deleted", why, now));
        ops
    } else if check_deadline(&mut job, now) {
        let msg = job.status.message.clone().unwrap_or_default();
        let Ok(body) = serde_json::to_value(&job) else {
            return;
        };
        let mut ops = vec![Op::Update {
            key: k,
            expected: Some(o.version),
            body,
        }];
        ops.extend(crate::plane::event_op(
            &key.0,
            object,
            "DeadlineExceeded",
            msg,
            now,
        ));
        ops
    } else {
        return;
    };
    // A conflict means the job changed: the watch brings it back for another look.
    let _ = store.commit(ops).await;
}

/// Live tasks of nodes whose heartbeat stopped more than [`NODE_LOST_AFTER`] ago
/// are recorded as lost (the restart policy decides what follows). Nodes that never
/// reported (simulated ones, nodes registered by hand) are left alone.
async fn lost_nodes(store: &tessera_store::AnyStore, l: &Lifecycle) {
    use tessera_store::{Key, Op, Store};
    let Ok(st) = store.list(crate::exec::NODESTATUS, Some("")).await else {
        return;
    };
    let now = crate::plane::now_ms();
    let silent: Vec<String> = st
        .objects
        .iter()
        .filter(|o| {
            o.body["heartbeat_ms"]
                .as_u64()
                .is_some_and(|h| h + (NODE_LOST_AFTER.as_millis() as u64) < now)
        })
        .map(|o| o.name.clone())
        .collect();
    if silent.is_empty() {
        return;
    }
    // Nothing new is placed on a silent node until it reports again (its
    // heartbeat takes the taint off).
    for name in &silent {
        taint_unreachable(store, name).await;
    }
    let Ok(all) = store.list(crate::plane::kind::JOB, None).await else {
        return;
    };
    for o in all.objects {
        let Ok(mut job) = serde_json::from_value::<JobBody>(o.body.clone()) else {
            continue;
        };
        let lost: Vec<(String, u32, TaskState, String)> = job
            .status
            .tasks
            .iter()
            .filter(|(_, t)| silent.contains(&t.node) && t.state.is_some_and(TaskState::live))
            .map(|(n, t)| {
                (
                    n.clone(),
                    t.attempt,
                    t.state.unwrap_or(TaskState::Running),
                    t.node.clone(),
                )
            })
            .collect();
        if lost.is_empty() {
            continue;
        }
        let mut events = Vec::new();
        for (n, attempt, state, node) in lost {
            let outcome = if state == TaskState::Running {
                Outcome::Failed(format!("lost: node {node} stopped reporting"))
            } else {
                Outcome::Stopped {
                    reason: format!("node {node} stopped reporting"),
                    forced: true,
                }
            };
            let end = End {
                outcome,
                usage: None,
                devices: vec![],
                note: None,
            };
            if let Some(r) = record_end(&mut job, &n, attempt.saturating_sub(1), &end, now, l) {
                events.push(r);
            }
            // A task its restart policy restarts cannot restart in place: the node is
            // gone. It waits to be placed again, elsewhere (the node is tainted
            // unreachable below), with its restarts counted.
            if let Some(t) = job.status.tasks.get_mut(&n)
                && t.state.is_none()
            {
                t.state = Some(TaskState::Evicted);
                t.not_before = None;
                t.finished_at = Some(now);
                t.message = Some(format!(
                    "lost: node {node} stopped reporting; restart {} placed on another node",
                    t.restarts
                ));
            }
        }
        job.status.phase = phase(&job);
        let Ok(body) = serde_json::to_value(&job) else {
            continue;
        };
        let mut ops = vec![Op::Update {
            key: Key::new(crate::plane::kind::JOB, &o.tenant, &o.name),
            expected: Some(o.version),
            body,
        }];
        for r in events {
            ops.extend(crate::plane::event_op(
                &o.tenant,
                format!("job/{}", o.name),
                r.event,
                r.message,
                now,
            ));
        }
        let _ = store.commit(ops).await;
    }
}

/// Puts [`UNREACHABLE_TAINT`](crate::heartbeat::UNREACHABLE_TAINT) on the node
/// record of `name` (a node registered with no record is left alone).
async fn taint_unreachable(store: &tessera_store::AnyStore, name: &str) {
    use tessera_store::{Key, Store};
    let key = Key::new(crate::plane::kind::NODE, "", name);
    let Ok(Some(o)) = store.get(&key).await else {
        return;
    };
    let Ok(mut rec) = serde_json::from_value::<tessera_model::Node>(o.body) else {
        return;
    };
    if rec
        .taints
        .iter()
        .any(|t| t.key == crate::heartbeat::UNREACHABLE_TAINT)
    {
        return;
    }
    rec.taints.push(tessera_model::Taint {
        key: crate::heartbeat::UNREACHABLE_TAINT.into(),
        value: "true".into(),
        effect: tessera_model::TaintEffect::NoSchedule,
    });
    if let Ok(b) = serde_json::to_value(&rec) {
        // A conflict: the next sweep looks again.
        let _ = store.update(key, Some(o.version), b).await;
    }
}

/// Evicts the live tasks on `node` whose node selector asks for `label` (the node lost
/// the property they need, e.g. its attestation): each is stopped there (SIGTERM, the
/// grace period, SIGKILL) and waits to be placed again where the label holds.
/// Retried on a conflicting write, job by job.
pub async fn evict_on_node(store: &tessera_store::AnyStore, node: &str, label: &str, reason: &str) {
    use tessera_store::{Key, Op, Store};
    let Ok(all) = store.list(crate::plane::kind::JOB, None).await else {
        return;
    };
    for o in all.objects {
        let (mut o, mut tries) = (o, 0);
        while let Ok(mut job) = serde_json::from_value::<JobBody>(o.body.clone()) {
            let now = crate::plane::now_ms();
            let hit: Vec<String> =
                job.spec
                    .tasks
                    .iter()
                    .filter(|t| t.node_selector.contains_key(label))
                    .filter(|t| {
                        job.status.tasks.get(&t.name).is_some_and(|st| {
                            st.node == node && st.state.is_some_and(TaskState::live)
                        })
                    })
                    .map(|t| t.name.clone())
                    .collect();
            if hit.is_empty() {
                break;
            }
            let mut marked = Vec::new();
            for t in &hit {
                marked.extend(evict(&mut job, t, None, reason, now));
            }
            let Ok(body) = serde_json::to_value(&job) else {
                break;
            };
            let mut ops = vec![Op::Update {
                key: Key::new(crate::plane::kind::JOB, &o.tenant, &o.name),
                expected: Some(o.version),
                body,
            }];
            ops.extend(crate::plane::event_op(
                &o.tenant,
                format!("job/{}", o.name),
                "Evicted",
                format!("{}: {reason}", marked.join(", ")),
                now,
            ));
            if store.commit(ops).await.is_ok() || tries >= 3 {
                break;
            }
            tries += 1;
            match store
                .get(&Key::new(crate::plane::kind::JOB, &o.tenant, &o.name))
                .await
            {
                Ok(Some(n)) => o = n,
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{JobSpec, JobStatus};
    use proptest::prelude::*;

    fn job(n: usize, policy: RestartPolicy, limit: u32) -> JobBody {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "j", "queue": "q",
            "tasks": (0..n).map(|i| serde_json::json!({"name": format!("t{i}"), "command": ["x"]})).collect::<Vec<_>>(),
        }))
        .unwrap();
        let mut b = JobBody {
            spec: JobSpec {
                restart_policy: policy,
                backoff_limit: Some(limit),
                ..spec
            },
            status: JobStatus::default(),
            created_at: 0,
        };
        for i in 0..n {
            b.status.tasks.insert(
                format!("t{i}"),
                TaskStatus {
                    node: "n".into(),
                    state: Some(TaskState::Running),
                    attempt: 1,
                    ..TaskStatus::default()
                },
            );
        }
        b.status.phase = Phase::Running;
        b
    }

    fn end(o: Outcome) -> End {
        End {
            outcome: o,
            usage: None,
            devices: vec![],
            note: None,
        }
    }

    const L: Lifecycle = Lifecycle {
        backoff_base: Duration::from_secs(10),
        backoff_cap: Duration::from_secs(360),
    };

    #[test]
    fn backoff_doubles_to_its_cap() {
        let s: Vec<u64> = (1..=8).map(|n| backoff(n, &L).as_secs()).collect();
        assert_eq!(s, [10, 20, 40, 80, 160, 320, 360, 360]);
    }

    #[test]
    fn never_fails_the_gang_and_stops_siblings() {
        let mut j = job(3, RestartPolicy::Never, 6);
        let r = record_end(&mut j, "t1", 0, &end(Outcome::Exited(3)), 5, &L).unwrap();
        assert_eq!(r.event, "TaskFailed");
        assert_eq!(j.status.phase, Phase::Failed);
        assert_eq!(j.status.reason.as_deref(), Some("BackoffLimitExceeded"));
        assert_eq!(j.status.tasks["t1"].state, Some(TaskState::Failed));
        for s in ["t0", "t2"] {
            assert_eq!(j.status.tasks[s].state, Some(TaskState::Terminating));
        }
        // The siblings' ends: failed, none left running.
        for s in ["t0", "t2"] {
            record_end(
                &mut j,
                s,
                0,
                &end(Outcome::Stopped {
                    reason: "x".into(),
                    forced: false,
                }),
                6,
                &L,
            )
            .unwrap();
        }
        assert!(
            j.status
                .tasks
                .values()
                .all(|t| t.state == Some(TaskState::Failed))
        );
        assert!(!has_live(&j));
    }

    #[test]
    fn on_failure_restarts_with_backoff_until_the_limit() {
        let mut j = job(1, RestartPolicy::OnFailure, 2);
        let r = record_end(&mut j, "t0", 0, &end(Outcome::OomKilled(137)), 1000, &L).unwrap();
        assert_eq!(r.event, "TaskRestarting");
        let t = &j.status.tasks["t0"];
        assert_eq!((t.state, t.restarts, t.not_before), (None, 1, Some(11_000)));
        assert_eq!(t.reason.as_deref(), Some("OOMKilled"));
        // Started again (the executor's claim), fails again: 20 s.
        let t = j.status.tasks.get_mut("t0").unwrap();
        t.state = Some(TaskState::Running);
        t.attempt = 2;
        record_end(&mut j, "t0", 1, &end(Outcome::Exited(1)), 20_000, &L).unwrap();
        assert_eq!(j.status.tasks["t0"].not_before, Some(40_000));
        let t = j.status.tasks.get_mut("t0").unwrap();
        t.state = Some(TaskState::Running);
        t.attempt = 3;
        let r = record_end(&mut j, "t0", 2, &end(Outcome::Exited(1)), 50_000, &L).unwrap();
        assert_eq!(r.event, "TaskFailed");
        assert_eq!(j.status.phase, Phase::Failed);
    }

    #[test]
    fn stale_reports_are_ignored() {
        let mut j = job(1, RestartPolicy::Never, 0);
        // The task was evicted and placed again (attempt 2 runs); attempt 0's kill
        // arrives late.
        j.status.tasks.get_mut("t0").unwrap().attempt = 2;
        assert!(record_end(&mut j, "t0", 0, &end(Outcome::Signaled(9)), 1, &L).is_none());
        assert_eq!(j.status.phase, Phase::Running);
    }

    #[test]
    fn evicting_a_gang_member_below_min_stops_the_gang() {
        let mut j = job(3, RestartPolicy::Never, 0);
        let m = evict(
            &mut j,
            "t0",
            Some("urgent".into()),
            "preempted by urgent",
            1,
        );
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(
            j.status
                .tasks
                .values()
                .all(|t| t.state == Some(TaskState::Evicting))
        );
        assert_eq!(j.status.phase, Phase::Pending);
        for s in ["t0", "t1", "t2"] {
            let r = record_end(
                &mut j,
                s,
                0,
                &end(Outcome::Stopped {
                    reason: "Evicted".into(),
                    forced: false,
                }),
                2,
                &L,
            )
            .unwrap();
            assert_eq!(r.event, "TaskEvicted");
        }
        assert!(
            j.status
                .tasks
                .values()
                .all(|t| t.state == Some(TaskState::Evicted) && t.evictions == 1)
        );
        assert_eq!(j.status.tasks["t0"].preemptor.as_deref(), Some("urgent"));
        assert!(!has_live(&j));
        // With min_member 1, one eviction leaves the rest running.
        let mut j = job(3, RestartPolicy::Never, 0);
        j.spec.min_member = Some(1);
        assert_eq!(evict(&mut j, "t0", None, "r", 1), ["t0"]);
        assert_eq!(j.status.phase, Phase::Running);
    }

    #[test]
    fn deadline_and_ttl() {
        let mut j = job(2, RestartPolicy::Never, 0);
        j.spec.active_deadline_seconds = Some(5);
        j.spec.ttl_seconds_after_finished = Some(2);
        j.status.started_at = Some(1000);
        assert_eq!(next_due(&j), Some(6000));
        assert!(!check_deadline(&mut j, 5999));
        assert!(check_deadline(&mut j, 6000));
        assert_eq!(j.status.reason.as_deref(), Some("DeadlineExceeded"));
        assert!(has_live(&j) && ttl_at(&j).is_none() && !delete_due(&j, 1 << 40));
        for s in ["t0", "t1"] {
            record_end(
                &mut j,
                s,
                0,
                &end(Outcome::Stopped {
                    reason: "x".into(),
                    forced: true,
                }),
                6100,
                &L,
            )
            .unwrap();
        }
        assert_eq!(ttl_at(&j), Some(8000));
        assert!(!delete_due(&j, 7999) && delete_due(&j, 8000));
    }

    #[test]
    fn cancel_keeps_only_live_tasks_until_they_end() {
        let mut j = job(2, RestartPolicy::Never, 0);
        j.status.tasks.get_mut("t1").unwrap().state = None;
        cancel(&mut j, "dev", 3);
        assert_eq!(j.status.phase, Phase::Cancelled);
        assert_eq!(j.status.tasks.len(), 1);
        assert_eq!(j.status.tasks["t0"].state, Some(TaskState::Terminating));
        record_end(
            &mut j,
            "t0",
            0,
            &end(Outcome::Stopped {
                reason: "c".into(),
                forced: false,
            }),
            4,
            &L,
        )
        .unwrap();
        assert!(j.status.tasks.is_empty());
    }

    proptest! {
        /// Whatever sequence of ends and evictions, a final job has no task that is
        /// running or waiting to start: every sibling is stopped or stopping.
        #[test]
        fn a_final_job_has_no_running_sibling(ops in proptest::collection::vec((0usize..4, 0u8..5), 1..20),
                                              restart in any::<bool>(), limit in 0u32..3) {
            let policy = if restart { RestartPolicy::OnFailure } else { RestartPolicy::Never };
            let mut j = job(4, policy, limit);
            let mut now = 0;
            for (t, op) in ops {
                now += 1000;
                let name = format!("t{t}");
                let attempt = j.status.tasks[&name].attempt.saturating_sub(1);
                match op {
                    0 => { record_end(&mut j, &name, attempt, &end(Outcome::Exited(0)), now, &L); }
                    1 => { record_end(&mut j, &name, attempt, &end(Outcome::Exited(1)), now, &L); }
                    2 => { evict(&mut j, &name, None, "r", now); }
                    3 => { record_end(&mut j, &name, attempt, &end(Outcome::Stopped { reason: "s".into(), forced: false }), now, &L); }
                    _ => {
                        // The executor starts what waits.
                        let t = j.status.tasks.get_mut(&name).unwrap();
                        if t.state.is_none() || t.state == Some(TaskState::Evicted) {
                            if !j.status.phase.is_final() {
                                t.state = Some(TaskState::Running);
                                t.attempt += 1;
                            }
                        }
                    }
                }
                if j.status.phase.is_final() {
                    prop_assert!(j.status.tasks.values().all(|t| !matches!(t.state, None | Some(TaskState::Running))),
                        "{:?}", j.status);
                }
            }
        }
    }
}
