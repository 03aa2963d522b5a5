//! The scheduler loop: build a snapshot from the store, run the batch scheduler,
//! write the plan back in one transaction (compare-and-swap on every job it
//! touches, so a concurrent change makes the round retry instead of overwriting).
//! It runs on a short period and whenever the store changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_model::{Node, PodGroup, Queue, Snapshot, Task};
use tessera_sched::PluginName;
use tessera_store::{AnyStore, ChangeOp, Key, Object, Op, Store, StoreError};

use crate::plane::{event_op, kind, now_ms};
use crate::problem::ApiError;
use crate::wire::{JobBody, TaskState, TaskStatus};

/// A scheduling function: snapshot in, plan out.
pub type ScheduleFn = Arc<dyn Fn(&Snapshot) -> tessera_model::Plan + Send + Sync>;

/// The live scheduler's default configuration: Volcano's usual one with the
/// `reservation` plugin on, so that a queued high-priority training gang holds the
/// NVLink domains or nodes it waits for instead of being nibbled by small jobs.
pub fn default_config() -> tessera_sched::Config {
    // Fractions of a GPU by Tessera's fragmentation-aware policy (issue 20: fewer GPUs
    // left unallocated than FGD on every trace variant), not only in `tessera sim`.
    let mut cfg = tessera_sched::Config {
        share_policy: tessera_sched::SharePolicy::Tessera,
        ..Default::default()
    };
    if !cfg
        .tiers
        .iter()
        .flatten()
        .any(|p| *p == PluginName::Reservation)
    {
        if let Some(t) = cfg.tiers.last_mut() {
            t.push(PluginName::Reservation);
        }
    }
    cfg
}

/// How the live scheduler places work: the `tessera sched plan` configuration
/// (`tessera up --scheduler-config FILE`), and the placement policy for fractions
/// of a GPU.
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    pub config: tessera_sched::Config,
    /// The fractional-GPU placement policy asked for with `tessera up
    /// --gpu-share-policy`, over the configuration's own (`share_policy`: `tessera` by
    /// default here, what a `--scheduler-config` file says otherwise).
    pub gpu_share_policy: Option<tessera_sched::SharePolicy>,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        SchedulerSettings {
            config: default_config(),
            gpu_share_policy: None,
        }
    }
}

impl SchedulerSettings {
    /// One line for a start-up log: the actions, the plugins tier by tier, and the
    /// fractional-GPU policy in use.
    pub fn describe(&self) -> String {
        let c = &self.config;
        let actions: Vec<&str> = c.actions.iter().map(|a| a.name()).collect();
        let tiers: Vec<String> = c
            .tiers
            .iter()
            .map(|t| t.iter().map(|p| p.name()).collect::<Vec<_>>().join(" "))
            .collect();
        let share = match self.gpu_share_policy.unwrap_or(c.share_policy) {
            tessera_sched::SharePolicy::Tessera => "tessera",
            tessera_sched::SharePolicy::Profile => "profile",
        };
        format!(
            "actions [{}], plugins [{}], fractions of a GPU by {share}",
            actions.join(", "),
            tiers.join(" | ")
        )
    }
}

/// The live scheduler's fractional-GPU policy by name: `tessera` or `profile`; the
/// simulator's baselines are named as such.
pub fn check_gpu_share_policy(name: &str) -> Result<tessera_sched::SharePolicy, String> {
    match name.parse::<tessera_sched::SharePolicy>() {
        Ok(p) => Ok(p),
        Err(_)
            if tessera_sched::gpu::Policy::ALL
                .iter()
                .any(|p| p.name() == name) =>
        {
            Err(format!(
                "{name:?} is one of the simulator's baselines (compare them with `tessera sim --policy all`); the live scheduler places fractions with `tessera` (the default) or `profile` (best fit by the workload kind's binpack/spread)"
            ))
        }
        Err(_) => Err(format!(
            "unknown fractional-GPU policy {name:?}: use `tessera` (the default) or `profile`"
        )),
    }
}

/// The live scheduler for `settings`.
pub fn live_scheduler(settings: SchedulerSettings) -> ScheduleFn {
    let mut cfg = settings.config;
    if let Some(p) = settings.gpu_share_policy {
        cfg.share_policy = p;
    }
    Arc::new(move |s| tessera_sched::schedule(s, &cfg))
}

/// The batch scheduler with its default configuration ([`default_config`]).
pub fn batch_scheduler() -> ScheduleFn {
    live_scheduler(SchedulerSettings::default())
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
    /// From the plan's decision to its bindings committed to the store, for a round
    /// that bound a task and committed.
    pub bind_write: Option<std::time::Duration>,
}

/// Scoped names in the snapshot: `tenant/name`.
fn scoped(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

/// The loop's view of the store: nodes, queues and jobs, parsed once and kept up
/// to date from the change log (so a round costs the changes since the last round,
/// not a full read of the store).
#[derive(Debug, Default)]
pub struct Cache {
    rev: u64,
    nodes: BTreeMap<String, Node>,
    queues: BTreeMap<(String, String), Queue>,
    jobs: BTreeMap<(String, String), (u64, JobBody)>,
}

impl Cache {
    /// Reads everything once.
    pub async fn load(store: &AnyStore) -> Result<Cache, ApiError> {
        let mut c = Cache {
            rev: store.revision().await?,
            ..Cache::default()
        };
        // Lists may run ahead of `rev`; replaying those changes later is harmless
        // because an entry is only replaced by a newer version.
        for k in [kind::NODE, kind::QUEUE, kind::JOB] {
            for o in store.list(k, None).await?.objects {
                c.put(&o);
            }
        }
        Ok(c)
    }

    fn put(&mut self, o: &Object) {
        match o.kind.as_str() {
            kind::NODE if o.tenant.is_empty() => {
                if let Ok(n) = serde_json::from_value::<Node>(o.body.clone()) {
                    self.nodes.insert(o.name.clone(), n);
                }
            }
            kind::QUEUE => {
                if let Ok(q) = serde_json::from_value::<Queue>(o.body.clone()) {
                    self.queues.insert((o.tenant.clone(), o.name.clone()), q);
                }
            }
            kind::JOB => {
                let key = (o.tenant.clone(), o.name.clone());
                if self.jobs.get(&key).is_some_and(|(v, _)| *v > o.version) {
                    return;
                }
                if let Ok(j) = serde_json::from_value::<JobBody>(o.body.clone()) {
                    self.jobs.insert(key, (o.version, j));
                }
            }
            _ => {}
        }
    }

    fn remove(&mut self, o: &Object) {
        let key = (o.tenant.clone(), o.name.clone());
        match o.kind.as_str() {
            kind::NODE => {
                self.nodes.remove(&o.name);
            }
            kind::QUEUE => {
                self.queues.remove(&key);
            }
            kind::JOB => {
                self.jobs.remove(&key);
            }
            _ => {}
        }
    }

    /// Applies the changes since the last sync; reads everything again when the
    /// change log was compacted past this cache.
    pub async fn sync(&mut self, store: &AnyStore) -> Result<(), ApiError> {
        loop {
            let changes = match store.changes(self.rev, 10_000).await {
                Ok(c) => c,
                Err(StoreError::Compacted { .. }) => {
                    *self = Cache::load(store).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let Some(last) = changes.last() else {
                return Ok(());
            };
            self.rev = last.version();
            for c in &changes {
                match c.op {
                    ChangeOp::Deleted => self.remove(&c.object),
                    _ => self.put(&c.object),
                }
            }
        }
    }

    /// Builds the scheduler's snapshot. Queue and job names become `tenant/name`;
    /// cancelled jobs are left out.
    pub fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot {
            nodes: self.nodes.values().cloned().collect(),
            ..Snapshot::default()
        };
        for ((tenant, _), q) in &self.queues {
            let mut q = q.clone();
            q.name = scoped(tenant, &q.name);
            q.parent = q.parent.map(|p| scoped(tenant, &p));
            snap.queues.push(q);
        }
        for ((tenant, name), (_, job)) in &self.jobs {
            if job.status.phase.is_final() {
                // A finished job whose trees are still being stopped holds their
                // resources until they are gone.
                if crate::jobs::has_live(job) {
                    snap.groups.push(stopping_group(tenant, name, job));
                }
                continue;
            }
            snap.groups.push(group(tenant, name, job));
        }
        // GPU indices that do not add up (out of range, held twice) are
        // dropped so accounting stays whole; say so.
        for i in snap.repair() {
            tracing::warn!("scheduler: snapshot repaired: {i}");
        }
        snap
    }
}

/// The tasks of a finished job that still have processes, as a bound group that
/// cannot be preempted.
fn stopping_group(tenant: &str, name: &str, job: &JobBody) -> PodGroup {
    let mut g = group(tenant, name, job);
    g.tasks.retain(|t| {
        job.status
            .tasks
            .get(&t.name)
            .is_some_and(|s| s.state.is_some_and(TaskState::live))
    });
    g.min_member = g.tasks.len() as u32;
    g.min_resources = None;
    g.preemptable = false;
    g
}

/// Prefixes a scoped name (`tenant/name`) for the victim's eyes: its own tenant's
/// names lose the prefix, another tenant's are not shown.
fn scrub(text: &str, tenant: &str) -> String {
    text.split(' ')
        .map(|w| match w.split_once('/') {
            Some((t, rest)) if t == tenant => rest.to_string(),
            Some(_) => "(another tenant)".to_string(),
            None => w.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn group(tenant: &str, name: &str, job: &JobBody) -> PodGroup {
    let spec = &job.spec;
    let mut g = PodGroup::new(
        scoped(tenant, name),
        scoped(tenant, &spec.queue),
        spec.min_member.unwrap_or(spec.tasks.len() as u32),
    );
    g.min_resources = spec.min_resources.clone();
    g.priority = spec.priority;
    g.kind = spec.kind;
    g.creation = job.created_at;
    g.preemptable = spec.preemptable;
    g.network_topology = spec.network_topology;
    for t in &spec.tasks {
        let mut task = Task::new(t.name.clone(), t.resources.clone()).with_gpu(t.gpu.clone());
        task.node_selector = t.node_selector.clone();
        if let Some((k, v)) = crate::classes::selector(t.runtime_class.as_deref()) {
            task.node_selector.insert(k, v);
        }
        task.tolerations = t.tolerations.clone();
        task.priority = t.priority;
        task.topology = t.topology;
        // Bound unless evicted (then it waits to be placed again).
        if let Some(st) = job.status.tasks.get(&t.name)
            && st.state != Some(TaskState::Evicted)
        {
            task.node = Some(st.node.clone());
            task.gpu_indices = st.gpus.clone();
            task.mig_start = st.mig.as_ref().map(|m| m.start);
        }
        g.tasks.push(task);
    }
    g
}

/// Runs one round: sync the cache, snapshot, schedule, write back.
pub async fn run_once(
    store: &AnyStore,
    schedule: &ScheduleFn,
    cache: &mut Cache,
) -> Result<Round, ApiError> {
    cache.sync(store).await?;
    let mut round = Round::default();
    // Snapshot and session run off the async workers: they are CPU work that grows
    // with the cluster, and must not stall API requests.
    let f = schedule.clone();
    let taken = std::mem::take(cache);
    let (back, plan) = tokio::task::spawn_blocking(move || {
        let snap = taken.snapshot();
        let plan = if snap.groups.is_empty() {
            None
        } else {
            Some((snap.groups.len(), f(&snap)))
        };
        (taken, plan)
    })
    .await
    .map_err(ApiError::internal)?;
    *cache = back;
    let Some((considered, plan)) = plan else {
        return Ok(round);
    };
    let decided = std::time::Instant::now();
    round.jobs_considered = considered;
    round.bindings = plan.bindings.len();
    round.evictions = plan.evictions.len();

    // Only jobs the plan names, or that carry a pending reason to clear, can change.
    let mut touched: std::collections::BTreeSet<&str> = plan
        .bindings
        .iter()
        .map(|b| b.task.group.as_str())
        .chain(plan.evictions.iter().map(|e| e.task.group.as_str()))
        .chain(plan.pending.iter().map(|p| p.group.as_str()))
        .collect();
    let with_reason: Vec<String> = cache
        .jobs
        .iter()
        .filter(|(_, (_, j))| !j.status.phase.is_final() && j.status.pending_reason.is_some())
        .map(|((t, n), _)| scoped(t, n))
        .collect();
    touched.extend(with_reason.iter().map(String::as_str));
    let mut index: BTreeMap<String, (Key, u64, JobBody)> = BTreeMap::new();
    for g in touched {
        let Some((t, n)) = g.split_once('/') else {
            continue;
        };
        if let Some((v, j)) = cache.jobs.get(&(t.to_string(), n.to_string()))
            && !j.status.phase.is_final()
        {
            index.insert(g.to_string(), (Key::new(kind::JOB, t, n), *v, j.clone()));
        }
    }
    let old: BTreeMap<String, JobBody> = index
        .iter()
        .map(|(k, (_, _, j))| (k.clone(), j.clone()))
        .collect();
    let mut bound: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut evicted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Who takes the victims' room: the groups bound "after evictions" on each node.
    let mut preemptors: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for b in plan.bindings.iter().filter(|b| b.after_evictions) {
        let v = preemptors.entry(b.node.as_str()).or_default();
        if !v.contains(&b.task.group.as_str()) {
            v.push(b.task.group.as_str());
        }
    }
    for e in &plan.evictions {
        if let Some((key, _, job)) = index.get_mut(&e.task.group) {
            let tenant = key.tenant.clone();
            let by = preemptors.get(e.node.as_str()).map(|g| {
                g.iter()
                    .map(|g| scrub(g, &tenant))
                    .collect::<Vec<_>>()
                    .join(", ")
            });
            let reason = scrub(&e.reason, &tenant);
            let marked = crate::jobs::evict(job, &e.task.task, by, &reason, now_ms());
            if !marked.is_empty() {
                evicted
                    .entry(e.task.group.clone())
                    .or_default()
                    .push(format!("{} from {}: {reason}", marked.join(", "), e.node));
            }
        }
    }
    for b in &plan.bindings {
        if let Some((_, _, job)) = index.get_mut(&b.task.group) {
            // Counters survive a new placement; the rest starts afresh.
            let old = job.status.tasks.get(&b.task.task);
            if old.is_some_and(|o| o.state.is_some_and(TaskState::live)) {
                // Its old tree is still being stopped: it cannot be placed twice.
                continue;
            }
            let (attempt, restarts, evictions) = old
                .map(|o| (o.attempt, o.restarts, o.evictions))
                .unwrap_or_default();
            job.status.tasks.insert(
                b.task.task.clone(),
                TaskStatus {
                    node: b.node.clone(),
                    gpus: b.gpus.clone(),
                    mig: b.mig.clone(),
                    after_evictions: b.after_evictions,
                    attempt,
                    restarts,
                    evictions,
                    ..TaskStatus::default()
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
    for (name, (key, version, job)) in &mut index {
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
        job.status.phase = crate::jobs::phase(job);
        if old.get(name) == Some(job) {
            continue;
        }
        let prev = &old[name];
        ops.push(Op::Update {
            key: key.clone(),
            expected: Some(*version),
            body: serde_json::to_value(&*job).map_err(ApiError::internal)?,
        });
        let object = format!("job/{}", key.name);
        if let Some(b) = bound.get(name) {
            ops.push(event_op(
                &key.tenant,
                object.clone(),
                "Scheduled",
                b.join(", "),
                now,
            )?);
        }
        if let Some(e) = evicted.get(name) {
            ops.push(event_op(
                &key.tenant,
                object.clone(),
                "Evicted",
                e.join(", "),
                now,
            )?);
        }
        if job.status.pending_reason != prev.status.pending_reason
            && let Some(r) = &job.status.pending_reason
        {
            ops.push(event_op(&key.tenant, object, "Pending", r.clone(), now)?);
        }
        round.jobs_updated += 1;
    }
    if ops.is_empty() {
        return Ok(round);
    }
    match store.commit(ops).await {
        Ok(_) => {
            if !bound.is_empty() {
                round.bind_write = Some(decided.elapsed());
            }
            Ok(round)
        }
        Err(StoreError::Conflict { .. } | StoreError::NotFound(_)) => {
            round.conflict = true;
            round.jobs_updated = 0;
            Ok(round)
        }
        Err(e) => Err(e.into()),
    }
}

/// The advisory lock that elects the scheduling replica.
pub const SCHEDULER_LOCK: i64 = 0x7e55_5c4e;

/// Runs rounds until `stop` turns true: after every change to the store (at most
/// one round per `min_gap`) and at least every `period`.
pub async fn run_loop(
    store: AnyStore,
    schedule: ScheduleFn,
    period: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let min_gap = Duration::from_millis(20);
    // Of several replicas on one database, exactly one schedules.
    let _leadership = tokio::select! {
        l = store.lead(SCHEDULER_LOCK) => match l {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("scheduler: cannot take the scheduler lock: {e}");
                return;
            }
        },
        _ = stop.changed() => return,
    };
    let mut wake = store.notifier();
    let mut cache = None;
    loop {
        wake.mark_unchanged();
        if cache.is_none() {
            match Cache::load(&store).await {
                Ok(c) => cache = Some(c),
                Err(e) => tracing::warn!("scheduler: reading the store failed: {e}"),
            }
        }
        let started = std::time::Instant::now();
        let result = match cache.as_mut() {
            Some(c) => run_once(&store, &schedule, c).await,
            None => Ok(Round::default()),
        };
        if let Ok(r) = &result {
            metrics
                .scheduler_cycle
                .observe(started.elapsed().as_secs_f64());
            if let Some(d) = r.bind_write {
                metrics.scheduler_bind.observe(d.as_secs_f64());
            }
            metrics.scheduler_rounds.fetch_add(1, Relaxed);
            if r.conflict {
                metrics.scheduler_conflicts.fetch_add(1, Relaxed);
            } else {
                metrics
                    .scheduler_bindings
                    .fetch_add(r.bindings as u64, Relaxed);
                metrics
                    .scheduler_evictions
                    .fetch_add(r.evictions as u64, Relaxed);
            }
        }
        match result {
            Ok(r) if r.conflict => {
                tokio::time::sleep(min_gap).await;
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("scheduler round failed: {e}");
                cache = None;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_sched::SharePolicy;

    #[test]
    fn the_live_scheduler_places_fractions_by_tessera_unless_told_otherwise() {
        assert_eq!(default_config().share_policy, SharePolicy::Tessera);
        assert_eq!(check_gpu_share_policy("tessera"), Ok(SharePolicy::Tessera));
        assert_eq!(check_gpu_share_policy("profile"), Ok(SharePolicy::Profile));
        let e = check_gpu_share_policy("fgd").unwrap_err();
        assert!(e.contains("simulator") && e.contains("tessera sim"), "{e}");
        let e = check_gpu_share_policy("nope").unwrap_err();
        assert!(e.contains("`tessera`") && e.contains("`profile`"), "{e}");
    }
}
