//! What the console draws, as pure functions over nodes, jobs and the scheduler's
//! reservations: each node's GPUs (free, whole, a fraction filled to its share, MIG
//! instances as their memory slices, held by a reservation) with who holds them; the
//! per-model fragmentation summary; the queue tree with deserved, allocated and
//! pending resources and the pending jobs with their reasons. No I/O, no clock.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_model::{GpuRequest, Node, Queue, Reservation, Resources, Task};

/// A stored job as the console reads it: only the fields it draws, each with a
/// default, so that jobs written by an older or newer server still read.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct JobLite {
    pub spec: SpecLite,
    pub status: StatusLite,
    /// Milliseconds since the Unix epoch.
    pub created_at: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct SpecLite {
    pub queue: String,
    pub priority: i32,
    pub min_member: Option<u32>,
    pub tasks: Vec<TaskLite>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct TaskLite {
    pub name: String,
    pub resources: Resources,
    pub gpu: GpuRequest,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct StatusLite {
    pub phase: String,
    pub tasks: BTreeMap<String, TaskStatusLite>,
    pub pending_reason: Option<String>,
    pub admitted: bool,
    pub started_at: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct TaskStatusLite {
    pub node: String,
    pub gpus: Vec<u32>,
    pub state: Option<String>,
    pub mig: Option<MigLite>,
    pub started_at: Option<u64>,
}

/// The MIG instance of a binding: profile and first memory slice.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct MigLite {
    pub profile: String,
    pub start: u8,
}

impl JobLite {
    /// Succeeded, failed or cancelled: it holds nothing and waits for nothing.
    pub fn is_final(&self) -> bool {
        matches!(
            self.status.phase.as_str(),
            "succeeded" | "failed" | "cancelled"
        )
    }

    /// The bound tasks that hold their node's resources: those of a job that is not
    /// over, unless they ended or were evicted (a task being stopped or evicted still
    /// holds them until its tree is gone).
    pub fn holding(&self) -> impl Iterator<Item = (&TaskLite, &TaskStatusLite)> {
        let over = self.is_final();
        self.spec.tasks.iter().filter_map(move |t| {
            let st = self.status.tasks.get(&t.name)?;
            let ended = matches!(
                st.state.as_deref(),
                Some("succeeded" | "failed" | "evicted")
            );
            (!over && !ended && !st.node.is_empty()).then_some((t, st))
        })
    }

    /// The nodes it holds resources on.
    pub fn nodes(&self) -> BTreeSet<&str> {
        self.holding().map(|(_, s)| s.node.as_str()).collect()
    }

    /// What the job still asks for: the requests of its tasks not yet bound (none
    /// once it is over).
    pub fn pending(&self) -> Resources {
        let mut r = Resources::default();
        if self.is_final() {
            return r;
        }
        for t in &self.spec.tasks {
            let bound = self
                .status
                .tasks
                .get(&t.name)
                .is_some_and(|s| !s.node.is_empty() && s.state.as_deref() != Some("evicted"));
            if !bound {
                r.add_assign_saturating(&request(t));
            }
        }
        r
    }

    /// What the job holds: the requests of its holding tasks.
    pub fn allocated(&self) -> Resources {
        let mut r = Resources::default();
        for (t, _) in self.holding() {
            r.add_assign_saturating(&request(t));
        }
        r
    }
}

/// A task's full request, GPU included (as the scheduler counts it).
fn request(t: &TaskLite) -> Resources {
    Task::new(t.name.clone(), t.resources.clone())
        .with_gpu(t.gpu.clone())
        .request()
}

/// Who holds (part of) a node: one bound task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Holder {
    /// `None` when the viewer may not see it (another tenant's task).
    pub tenant: Option<String>,
    pub job: Option<String>,
    pub task: Option<String>,
    /// Milliseconds since the Unix epoch: since when it holds its part (its start,
    /// else its job's start, else the job's submission).
    pub since: u64,
    /// `whole`, `share`, `mig` or `cpu` (no GPU).
    pub kind: &'static str,
    /// The task's state as the node reports it (`running`, `terminating`,
    /// `evicting`, …; none: bound, not started yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Another tenant's task: drawn as such, without names.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub other: bool,
}

/// One MIG instance on a GPU, drawn as its run of memory slices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigSlot {
    pub profile: String,
    /// First memory slice and how many it covers.
    pub start: u8,
    pub size: u8,
    /// The holder (index into the node's `holders`); `None`: idle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<usize>,
    /// The node reports the instance in use but no task of the view holds it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub busy: bool,
}

/// One GPU as the console draws it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuView {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<u32>,
    /// Holders using it, each with its milli-GPU (1000: the whole GPU).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uses: Vec<(usize, u32)>,
    /// Memory slices of the GPU when MIG is on (8 on A100/H100/H200, 4 on A30).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slices: Option<u8>,
    /// Its MIG instances when MIG is on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigSlot>,
    /// Held back by a reservation (index into the node's `reservations`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<usize>,
}

impl GpuView {
    /// Free as a whole GPU: nothing uses it, no reservation holds it, MIG is off.
    pub fn is_free(&self) -> bool {
        self.uses.is_empty() && self.reserved.is_none() && self.slices.is_none()
    }
}

/// GPUs (or the whole node) the scheduler holds back for a queued gang.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeldFor {
    /// `None` when the gang is another tenant's.
    pub tenant: Option<String>,
    pub job: Option<String>,
    pub reason: Option<String>,
    /// The reservation holds the whole node (all its GPUs).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub whole_node: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub other: bool,
}

/// A node condition that is not as it should be (a device-view mismatch, a lost
/// GPU, disk pressure, a node that is not ready, …).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mark {
    pub kind: String,
    pub reason: String,
    pub message: String,
}

/// One node as the console draws it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    pub name: String,
    /// The GPU model (of its first GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Bytes of memory of one GPU.
    #[serde(skip_serializing_if = "is_zero")]
    pub gpu_memory: u64,
    /// Network-tier domains above the node, bottom up (rack, spine).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub net: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unschedulable: bool,
    /// Taints as `key=value:Effect`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Mark>,
    pub cpu_milli: u64,
    pub cpu_used: u64,
    pub gpus: Vec<GpuView>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<HeldFor>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// One task bound to a node, for [`node_view`].
#[derive(Debug, Clone)]
pub struct Bound<'a> {
    pub tenant: &'a str,
    pub job_name: &'a str,
    pub job: &'a JobLite,
    pub task: &'a TaskLite,
    pub status: &'a TaskStatusLite,
}

/// The node's conditions worth marking, from its heartbeat record (the node
/// runtime's `NodeStatus`: `{conditions: [{kind, status, reason, message}]}`): every
/// true condition but `Ready`, and `Ready` when false.
pub fn marks(status: Option<&Value>) -> Vec<Mark> {
    let Some(list) = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let text = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    list.iter()
        .filter_map(|c| {
            let kind = text(c, "kind");
            let on = c.get("status").and_then(Value::as_bool).unwrap_or(false);
            let mark = if kind == "Ready" { !on } else { on };
            mark.then(|| Mark {
                kind: if kind == "Ready" {
                    "NotReady".into()
                } else {
                    kind.clone()
                },
                reason: text(c, "reason"),
                message: text(c, "message"),
            })
        })
        .collect()
}

/// Draws one node: its GPUs with who uses them, its MIG instances, the
/// reservations on it, its conditions. `bound` are the tasks holding resources on
/// it (any order: the view sorts them), `reservations` the scheduler's latest.
pub fn node_view(
    node: &Node,
    status: Option<&Value>,
    bound: &[Bound<'_>],
    reservations: &[Reservation],
) -> NodeView {
    let mut bound: Vec<&Bound<'_>> = bound.iter().collect();
    bound.sort_by(|a, b| {
        (a.tenant, a.job_name, &a.task.name).cmp(&(b.tenant, b.job_name, &b.task.name))
    });
    let mut gpus: Vec<GpuView> = node
        .gpus
        .iter()
        .map(|g| {
            let geo = g
                .mig
                .as_ref()
                .and_then(|_| tessera_model::mig::geometry(&g.model));
            let mig = match (&g.mig, geo) {
                (Some(l), Some(geo)) => l
                    .instances
                    .iter()
                    .map(|i| MigSlot {
                        profile: i.profile.clone(),
                        start: i.start,
                        size: geo.profile(&i.profile).map_or(1, |p| p.slices),
                        holder: None,
                        busy: i.in_use,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            GpuView {
                index: g.index,
                nvlink: g.nvlink_domain,
                uses: Vec::new(),
                slices: g.mig.as_ref().map(|_| geo.map_or(8, |g| g.memory_slices)),
                mig,
                reserved: None,
            }
        })
        .collect();
    // A node that only counts its GPUs (no device list) is drawn with that many.
    if gpus.is_empty() && node.allocatable.gpu_milli >= 1000 {
        gpus = (0..(node.allocatable.gpu_milli / 1000) as u32)
            .map(|index| GpuView {
                index,
                nvlink: None,
                uses: Vec::new(),
                slices: None,
                mig: Vec::new(),
                reserved: None,
            })
            .collect();
    }
    let mut holders = Vec::with_capacity(bound.len());
    let mut cpu_used = 0u64;
    for b in bound {
        cpu_used = cpu_used.saturating_add(b.task.resources.cpu_milli);
        let kind = match &b.task.gpu {
            GpuRequest::None => "cpu",
            GpuRequest::Whole { .. } => "whole",
            GpuRequest::Shared { .. } => "share",
            GpuRequest::Mig { .. } => "mig",
        };
        let h = holders.len();
        holders.push(Holder {
            tenant: Some(b.tenant.to_string()),
            job: Some(b.job_name.to_string()),
            task: Some(b.task.name.clone()),
            since: b
                .status
                .started_at
                .or(b.job.status.started_at)
                .unwrap_or(b.job.created_at),
            kind,
            state: b.status.state.clone(),
            other: false,
        });
        for &i in &b.status.gpus {
            let Some(g) = gpus.iter_mut().find(|g| g.index == i) else {
                continue;
            };
            match &b.task.gpu {
                GpuRequest::None => {}
                GpuRequest::Whole { .. } => g.uses.push((h, 1000)),
                GpuRequest::Shared { milli, .. } => g.uses.push((h, (*milli).min(1000))),
                GpuRequest::Mig { profile, .. } => {
                    let milli = tessera_model::mig::profile_milli(profile, &[]) as u32;
                    g.uses.push((h, milli));
                    place_mig(g, node, i, h, profile, b.status.mig.as_ref());
                }
            }
            // A fraction or an instance sits on one GPU only.
            if !matches!(b.task.gpu, GpuRequest::Whole { .. }) {
                break;
            }
        }
    }
    let mut held = Vec::new();
    for r in reservations.iter().filter(|r| r.node == node.name) {
        let (tenant, job) = r.group.split_once('/').unwrap_or(("", r.group.as_str()));
        let k = held.len();
        held.push(HeldFor {
            tenant: Some(tenant.to_string()),
            job: Some(job.to_string()),
            reason: Some(r.reason.clone()),
            whole_node: r.gpus.is_empty(),
            other: false,
        });
        for g in gpus.iter_mut() {
            if (r.gpus.is_empty() || r.gpus.contains(&g.index)) && g.reserved.is_none() {
                g.reserved = Some(k);
            }
        }
    }
    NodeView {
        name: node.name.clone(),
        model: node.gpu_model().map(str::to_string),
        gpu_memory: node.gpus.first().map_or(0, |g| g.memory),
        net: node.network.clone(),
        labels: node.labels.clone(),
        unschedulable: node.unschedulable,
        taints: node
            .taints
            .iter()
            .map(|t| {
                if t.value.is_empty() {
                    format!("{}:{:?}", t.key, t.effect)
                } else {
                    format!("{}={}:{:?}", t.key, t.value, t.effect)
                }
            })
            .collect(),
        conditions: marks(status),
        cpu_milli: node.allocatable.cpu_milli,
        cpu_used,
        gpus,
        holders,
        reservations: held,
    }
}

/// Puts a MIG holder on its instance: the one its binding names (drawn even when the
/// node's layout does not list it yet: the instance is being created), else the
/// first instance of its profile that nobody holds, busy ones first.
fn place_mig(
    g: &mut GpuView,
    node: &Node,
    index: u32,
    h: usize,
    profile: &str,
    step: Option<&MigLite>,
) {
    if let Some(s) = step {
        if let Some(slot) = g
            .mig
            .iter_mut()
            .find(|m| m.start == s.start && m.profile == s.profile)
        {
            slot.holder = Some(h);
            return;
        }
        let size = node
            .gpus
            .iter()
            .find(|d| d.index == index)
            .and_then(|d| tessera_model::mig::geometry(&d.model))
            .and_then(|geo| geo.profile(&s.profile))
            .map_or(1, |p| p.slices);
        g.slices.get_or_insert(8);
        g.mig.push(MigSlot {
            profile: s.profile.clone(),
            start: s.start,
            size,
            holder: Some(h),
            busy: true,
        });
        g.mig.sort_by_key(|m| m.start);
        return;
    }
    let pick = g
        .mig
        .iter()
        .enumerate()
        .filter(|(_, m)| m.profile == profile && m.holder.is_none())
        .min_by_key(|(_, m)| (!m.busy, m.start))
        .map(|(i, _)| i);
    if let Some(i) = pick {
        g.mig[i].holder = Some(h);
    }
}

/// Whose eyes a view is rendered for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    pub tenant: String,
    /// Sees every tenant's names (a system admin not viewing as a tenant).
    pub all: bool,
}

impl NodeView {
    /// The view as `v` may see it: other tenants' tasks and reservations lose their
    /// names and reasons (a GPU is shown busy, not by whom).
    pub fn for_viewer(&self, v: &Viewer) -> Cow<'_, NodeView> {
        let foreign = |t: &Option<String>| !v.all && t.as_deref() != Some(v.tenant.as_str());
        if !self.holders.iter().any(|h| foreign(&h.tenant))
            && !self.reservations.iter().any(|r| foreign(&r.tenant))
        {
            return Cow::Borrowed(self);
        }
        let mut n = self.clone();
        for h in &mut n.holders {
            if foreign(&h.tenant) {
                h.tenant = None;
                h.job = None;
                h.task = None;
                h.other = true;
            }
        }
        for r in &mut n.reservations {
            if foreign(&r.tenant) {
                r.tenant = None;
                r.job = None;
                r.reason = None;
                r.other = true;
            }
        }
        Cow::Owned(n)
    }
}

/// Free whole GPUs by block size, for one GPU model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSummary {
    pub model: String,
    pub nodes: usize,
    pub gpus: usize,
    /// Whole GPUs free on schedulable nodes.
    pub free: usize,
    /// GPUs partly used by fractions (room left for more).
    pub shared: usize,
    /// GPUs with MIG on.
    pub mig: usize,
    /// GPUs a reservation holds.
    pub reserved: usize,
    /// `(free GPUs on a node, nodes with that many)`, ascending, for 1 free or more.
    pub blocks: Vec<(usize, usize)>,
    /// Schedulable nodes with no whole GPU free.
    pub full: usize,
    /// "12 nodes have 1 free, 2 have 4".
    pub text: String,
}

/// The fragmentation summary: per GPU model, how many nodes have how many whole
/// GPUs free (on schedulable nodes).
pub fn fragmentation<'a>(nodes: impl IntoIterator<Item = &'a NodeView>) -> Vec<ModelSummary> {
    let mut by: BTreeMap<&str, (ModelSummary, BTreeMap<usize, usize>)> = BTreeMap::new();
    for n in nodes {
        let Some(model) = n.model.as_deref() else {
            continue;
        };
        let (s, blocks) = by.entry(model).or_insert_with(|| {
            (
                ModelSummary {
                    model: model.to_string(),
                    nodes: 0,
                    gpus: 0,
                    free: 0,
                    shared: 0,
                    mig: 0,
                    reserved: 0,
                    blocks: Vec::new(),
                    full: 0,
                    text: String::new(),
                },
                BTreeMap::new(),
            )
        });
        s.nodes += 1;
        s.gpus += n.gpus.len();
        s.mig += n.gpus.iter().filter(|g| g.slices.is_some()).count();
        s.reserved += n.gpus.iter().filter(|g| g.reserved.is_some()).count();
        s.shared += n
            .gpus
            .iter()
            .filter(|g| {
                g.slices.is_none()
                    && !g.uses.is_empty()
                    && g.uses.iter().map(|u| u.1).sum::<u32>() < 1000
            })
            .count();
        if n.unschedulable {
            continue;
        }
        let free = n.gpus.iter().filter(|g| g.is_free()).count();
        s.free += free;
        if free == 0 {
            s.full += 1;
        } else {
            *blocks.entry(free).or_default() += 1;
        }
    }
    by.into_values()
        .map(|(mut s, blocks)| {
            s.blocks = blocks.into_iter().collect();
            s.text = block_text(&s.blocks);
            s
        })
        .collect()
}

/// "12 nodes have 1 free, 2 have 4"; "no node has a free GPU".
pub fn block_text(blocks: &[(usize, usize)]) -> String {
    if blocks.is_empty() {
        return "no node has a whole GPU free".into();
    }
    let mut out = String::new();
    for (i, (free, nodes)) in blocks.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let verb = if *nodes == 1 { "has" } else { "have" };
        if i == 0 {
            let noun = if *nodes == 1 { "node" } else { "nodes" };
            out.push_str(&format!("{nodes} {noun} {verb} {free} free"));
        } else {
            out.push_str(&format!("{nodes} {verb} {free}"));
        }
    }
    out
}

/// The resources the console shows in the queue view.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Shown {
    pub cpu_milli: u64,
    pub memory: u64,
    pub gpu_milli: u64,
}

impl From<&Resources> for Shown {
    fn from(r: &Resources) -> Self {
        Shown {
            cpu_milli: r.cpu_milli,
            memory: r.memory,
            gpu_milli: r.gpu_milli,
        }
    }
}

/// A pending job under its queue.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingJob {
    pub name: String,
    pub priority: i32,
    pub created_at: u64,
    /// Passed admission (quota, gang minimum) and only lacks room.
    pub admitted: bool,
    pub reason: Option<String>,
    pub asks: Shown,
}

/// One queue of the tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueRow {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub depth: usize,
    pub weight: u32,
    pub reclaimable: bool,
    pub guarantee: Shown,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capability: Option<Shown>,
    /// Its fair share, as the proportion plugin divides the cluster.
    pub deserved: Shown,
    /// What its jobs (and its children's) hold.
    pub allocated: Shown,
    /// What its jobs (and its children's) still ask for.
    pub pending: Shown,
    pub running_jobs: usize,
    pub pending_jobs: usize,
    /// Its own pending jobs, highest priority then oldest first (at most
    /// [`PENDING_SHOWN`]).
    pub waiting: Vec<PendingJob>,
}

/// Pending jobs listed under each queue.
pub const PENDING_SHOWN: usize = 50;

/// A job for the queue tree: its tenant, name and record.
pub type JobRef<'a> = (&'a str, &'a str, &'a JobLite);

/// The queue tree of `tenant`, parents before children, siblings by name. The
/// deserved shares are divided among *all* tenants' queues (they share the cluster:
/// `total`), by the proportion plugin's water-filling over weight, guarantee and
/// capability, each queue capped at its demand (what it holds plus what it asks).
pub fn queue_tree<'a>(
    queues: &[(&'a str, &'a Queue)],
    jobs: impl IntoIterator<Item = JobRef<'a>>,
    total: &Resources,
    tenant: &str,
) -> Vec<QueueRow> {
    queue_rows(queues, jobs, total, |t| t == tenant)
        .into_iter()
        .map(|(_, row)| row)
        .collect()
}

/// The queue trees of every tenant `keep` admits, in one pass (the shares are
/// divided once for all), each row with its tenant; see [`queue_tree`].
pub fn queue_rows<'a>(
    queues: &[(&'a str, &'a Queue)],
    jobs: impl IntoIterator<Item = JobRef<'a>>,
    total: &Resources,
    keep: impl Fn(&str) -> bool,
) -> Vec<(&'a str, QueueRow)> {
    // Index queues by (tenant, name).
    let key = |t: &str, n: &str| format!("{t}/{n}");
    let mut idx: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (t, q)) in queues.iter().enumerate() {
        idx.insert(key(t, &q.name), i);
    }
    let parent = |i: usize| -> Option<usize> {
        let (t, q) = queues[i];
        q.parent.as_ref().and_then(|p| idx.get(&key(t, p)).copied())
    };
    let n = queues.len();
    let mut alloc = vec![Resources::default(); n];
    let mut pend = vec![Resources::default(); n];
    let mut own_alloc_jobs = vec![0usize; n];
    let mut own_pend_jobs = vec![0usize; n];
    let mut waiting: Vec<Vec<PendingJob>> = vec![Vec::new(); n];
    for (t, name, j) in jobs {
        let Some(&qi) = idx.get(&key(t, &j.spec.queue)) else {
            continue;
        };
        if j.is_final() {
            continue;
        }
        let a = j.allocated();
        let p = j.pending();
        let running = j.status.phase == "running";
        if running {
            own_alloc_jobs[qi] += 1;
        } else {
            own_pend_jobs[qi] += 1;
            if keep(queues[qi].0) {
                waiting[qi].push(PendingJob {
                    name: name.to_string(),
                    priority: j.spec.priority,
                    created_at: j.created_at,
                    admitted: j.status.admitted,
                    reason: j.status.pending_reason.clone(),
                    asks: Shown::from(&p),
                });
            }
        }
        // Up the tree, guarding against a cycle in bad data.
        let mut cur = Some(qi);
        let mut hops = 0;
        while let Some(q) = cur {
            alloc[q].add_assign_saturating(&a);
            pend[q].add_assign_saturating(&p);
            hops += 1;
            if hops > n {
                break;
            }
            cur = parent(q);
        }
    }
    // Children lists and the top-down order.
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut roots = Vec::new();
    for i in 0..n {
        match parent(i) {
            Some(p) if p != i => children[p].push(i),
            _ => roots.push(i),
        }
    }
    let by_name = |v: &mut Vec<usize>| {
        v.sort_by(|&a, &b| (queues[a].0, &queues[a].1.name).cmp(&(queues[b].0, &queues[b].1.name)))
    };
    by_name(&mut roots);
    for c in &mut children {
        by_name(c);
    }
    let mut deserved = vec![Resources::default(); n];
    let fill = |total: &Resources, kids: &[usize], deserved: &mut Vec<Resources>| {
        let weights: Vec<u64> = kids
            .iter()
            .map(|&c| u64::from(queues[c].1.weight))
            .collect();
        let guarantees: Vec<Resources> = kids
            .iter()
            .map(|&c| queues[c].1.guarantee.clone())
            .collect();
        let caps: Vec<Resources> = kids
            .iter()
            .map(|&c| {
                let mut demand = alloc[c].clone();
                demand.add_assign_saturating(&pend[c]);
                match &queues[c].1.capability {
                    Some(cap) => demand.min(cap),
                    None => demand,
                }
            })
            .collect();
        let parts =
            tessera_sched::proportion::water_fill_resources(total, &weights, &guarantees, &caps);
        for (&c, d) in kids.iter().zip(parts) {
            deserved[c] = d.max(&queues[c].1.guarantee);
        }
    };
    fill(total, &roots, &mut deserved);
    // Top down (a visited set guards against cycles).
    let mut order = Vec::new();
    let mut seen = vec![false; n];
    let mut stack: Vec<(usize, usize)> = roots.iter().rev().map(|&r| (r, 0)).collect();
    while let Some((q, depth)) = stack.pop() {
        if std::mem::replace(&mut seen[q], true) {
            continue;
        }
        order.push((q, depth));
        if !children[q].is_empty() {
            let d = deserved[q].clone();
            fill(&d, &children[q], &mut deserved);
        }
        for &c in children[q].iter().rev() {
            stack.push((c, depth + 1));
        }
    }
    let mut running_jobs = own_alloc_jobs.clone();
    let mut pending_jobs = own_pend_jobs.clone();
    // Subtree job counts, bottom up (reverse of the top-down order).
    for &(q, _) in order.iter().rev() {
        if let Some(p) = parent(q)
            && p != q
        {
            running_jobs[p] += running_jobs[q];
            pending_jobs[p] += pending_jobs[q];
        }
    }
    order
        .into_iter()
        .filter(|&(q, _)| keep(queues[q].0))
        .map(|(q, depth)| {
            let (tenant, queue) = queues[q];
            let mut w = std::mem::take(&mut waiting[q]);
            w.sort_by(|a, b| {
                b.priority
                    .cmp(&a.priority)
                    .then(a.created_at.cmp(&b.created_at))
                    .then(a.name.cmp(&b.name))
            });
            w.truncate(PENDING_SHOWN);
            let row = QueueRow {
                name: queue.name.clone(),
                parent: queue.parent.clone(),
                depth,
                weight: queue.weight,
                reclaimable: queue.reclaimable,
                guarantee: Shown::from(&queue.guarantee),
                capability: queue.capability.as_ref().map(Shown::from),
                deserved: Shown::from(&deserved[q]),
                allocated: Shown::from(&alloc[q]),
                pending: Shown::from(&pend[q]),
                running_jobs: running_jobs[q],
                pending_jobs: pending_jobs[q],
                waiting: w,
            };
            (tenant, row)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tessera_model::mig::{MigInstance, MigLayout};
    use tessera_model::{GpuDevice, Resources};

    fn node(name: &str, gpus: u32, model: &str) -> Node {
        let mut n = Node::new(name, Resources::new(64_000, 256 << 30));
        n.gpus = (0..gpus)
            .map(|i| GpuDevice::new(i, model, 80 << 30))
            .collect();
        n.allocatable.gpu_milli = 1000 * u64::from(gpus);
        n
    }

    /// A task: its name, what it asks for, and where it is bound (node, GPUs).
    type TaskSpec<'a> = (&'a str, GpuRequest, Option<(&'a str, Vec<u32>)>);

    fn job(tasks: &[TaskSpec]) -> JobLite {
        let mut j = JobLite {
            created_at: 1000,
            ..JobLite::default()
        };
        j.spec.queue = "q".into();
        j.status.phase = "running".into();
        for (name, gpu, at) in tasks {
            j.spec.tasks.push(TaskLite {
                name: name.to_string(),
                resources: Resources::new(1000, 1 << 30),
                gpu: gpu.clone(),
            });
            if let Some((n, gpus)) = at {
                j.status.tasks.insert(
                    name.to_string(),
                    TaskStatusLite {
                        node: n.to_string(),
                        gpus: gpus.clone(),
                        state: Some("running".into()),
                        ..TaskStatusLite::default()
                    },
                );
            }
        }
        j
    }

    fn bound<'a>(tenant: &'a str, name: &'a str, j: &'a JobLite) -> Vec<Bound<'a>> {
        j.holding()
            .map(|(t, s)| Bound {
                tenant,
                job_name: name,
                job: j,
                task: t,
                status: s,
            })
            .collect()
    }

    #[test]
    fn whole_fraction_mig_and_reservation_land_in_their_cells() {
        let mut n = node("n0", 4, "H100-80GB");
        n.gpus[3].mig = Some(MigLayout {
            instances: vec![
                MigInstance {
                    profile: "3g.40gb".into(),
                    start: 0,
                    in_use: true,
                },
                MigInstance {
                    profile: "3g.40gb".into(),
                    start: 4,
                    in_use: false,
                },
            ],
        });
        let whole = job(&[(
            "w",
            GpuRequest::Whole {
                count: 1,
                models: vec![],
            },
            Some(("n0", vec![0])),
        )]);
        let share = job(&[(
            "s",
            GpuRequest::Shared {
                milli: 250,
                memory: 10 << 30,
                models: vec![],
            },
            Some(("n0", vec![1])),
        )]);
        let mut mig = job(&[(
            "m",
            GpuRequest::Mig {
                profile: "3g.40gb".into(),
                models: vec![],
            },
            Some(("n0", vec![3])),
        )]);
        mig.status.tasks.get_mut("m").unwrap().mig = Some(MigLite {
            profile: "3g.40gb".into(),
            start: 0,
        });
        let mut b = bound("alpha", "train", &whole);
        b.extend(bound("beta", "infer", &share));
        b.extend(bound("alpha", "mig", &mig));
        let r = vec![Reservation {
            group: "alpha/big".into(),
            node: "n0".into(),
            gpus: vec![2],
            reason: "held for a gang".into(),
        }];
        let v = node_view(&n, None, &b, &r);
        // Holders sorted: alpha/mig, alpha/train, beta/infer.
        let names: Vec<_> = v.holders.iter().map(|h| h.job.clone().unwrap()).collect();
        assert_eq!(names, ["mig", "train", "infer"]);
        assert_eq!(v.gpus[0].uses, vec![(1, 1000)]);
        assert_eq!(v.gpus[1].uses, vec![(2, 250)]);
        assert_eq!(v.gpus[2].reserved, Some(0));
        assert!(v.gpus[2].uses.is_empty());
        assert_eq!(v.gpus[3].slices, Some(8));
        assert_eq!(v.gpus[3].mig[0].holder, Some(0));
        assert_eq!((v.gpus[3].mig[0].start, v.gpus[3].mig[0].size), (0, 4));
        assert_eq!(v.gpus[3].mig[1].holder, None);
        assert_eq!(v.holders[0].kind, "mig");
        // Beta sees alpha's tasks and reservation without names.
        let beta = v.for_viewer(&Viewer {
            tenant: "beta".into(),
            all: false,
        });
        assert_eq!(beta.holders[0].job, None);
        assert!(beta.holders[0].other);
        assert_eq!(beta.holders[2].job.as_deref(), Some("infer"));
        assert_eq!(beta.reservations[0].reason, None);
        let admin = v.for_viewer(&Viewer {
            tenant: "admin".into(),
            all: true,
        });
        assert!(matches!(admin, Cow::Borrowed(_)));
        // Fragmentation: one free GPU out of four (0 whole, 1 shared, 2 reserved, 3 MIG).
        let f = fragmentation([&v]);
        assert_eq!(f[0].free, 0);
        assert_eq!(f[0].shared, 1);
        assert_eq!(f[0].mig, 1);
        assert_eq!(f[0].reserved, 1);
        assert_eq!(f[0].full, 1);
    }

    #[test]
    fn mig_without_a_step_takes_an_instance_of_its_profile_and_a_new_one_is_drawn() {
        let mut n = node("n0", 1, "A100-40GB");
        n.gpus[0].mig = Some(MigLayout {
            instances: vec![
                MigInstance {
                    profile: "1g.5gb".into(),
                    start: 0,
                    in_use: false,
                },
                MigInstance {
                    profile: "1g.5gb".into(),
                    start: 1,
                    in_use: true,
                },
            ],
        });
        let a = job(&[(
            "a",
            GpuRequest::Mig {
                profile: "1g.5gb".into(),
                models: vec![],
            },
            Some(("n0", vec![0])),
        )]);
        let mut c = job(&[(
            "c",
            GpuRequest::Mig {
                profile: "3g.20gb".into(),
                models: vec![],
            },
            Some(("n0", vec![0])),
        )]);
        c.status.tasks.get_mut("c").unwrap().mig = Some(MigLite {
            profile: "3g.20gb".into(),
            start: 4,
        });
        let mut b = bound("t", "a", &a);
        b.extend(bound("t", "c", &c));
        let v = node_view(&n, None, &b, &[]);
        let g = &v.gpus[0];
        // The busy instance is the one taken.
        assert_eq!(g.mig[1].holder, Some(0));
        assert_eq!(g.mig[0].holder, None);
        // The instance being created is drawn at its slices.
        assert_eq!(g.mig[2].start, 4);
        assert_eq!(g.mig[2].size, 4);
        assert_eq!(g.mig[2].holder, Some(1));
    }

    #[test]
    fn ended_evicted_and_final_tasks_hold_nothing() {
        let mut j = job(&[
            (
                "a",
                GpuRequest::Whole {
                    count: 1,
                    models: vec![],
                },
                Some(("n0", vec![0])),
            ),
            (
                "b",
                GpuRequest::Whole {
                    count: 1,
                    models: vec![],
                },
                Some(("n0", vec![1])),
            ),
            ("c", GpuRequest::None, None),
        ]);
        j.status.tasks.get_mut("b").unwrap().state = Some("evicted".into());
        assert_eq!(j.holding().count(), 1);
        // b (evicted) and c (unbound) are pending again.
        assert_eq!(j.pending().gpu_milli, 1000);
        assert_eq!(j.pending().cpu_milli, 2000);
        j.status.phase = "cancelled".into();
        assert_eq!(j.holding().count(), 0);
        assert!(j.pending().is_zero());
    }

    #[test]
    fn block_text_reads_like_a_sentence() {
        assert_eq!(
            block_text(&[(1, 12), (4, 2)]),
            "12 nodes have 1 free, 2 have 4"
        );
        assert_eq!(block_text(&[(8, 1)]), "1 node has 8 free");
        assert_eq!(block_text(&[]), "no node has a whole GPU free");
    }

    #[test]
    fn fragmentation_counts_nodes_by_free_block() {
        let nodes: Vec<Node> = (0..5)
            .map(|i| node(&format!("n{i}"), 8, "A100-80GB"))
            .collect();
        let jobs: Vec<JobLite> = (0..3)
            .map(|i| {
                job(&[(
                    "t",
                    GpuRequest::Whole {
                        count: 7,
                        models: vec![],
                    },
                    Some((
                        &*Box::leak(format!("n{i}").into_boxed_str()),
                        (0..7).collect(),
                    )),
                )])
            })
            .collect();
        let views: Vec<NodeView> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let b = jobs.get(i).map(|j| bound("t", "j", j)).unwrap_or_default();
                node_view(n, None, &b, &[])
            })
            .collect();
        let f = fragmentation(&views);
        assert_eq!(f[0].blocks, vec![(1, 3), (8, 2)]);
        assert_eq!(f[0].text, "3 nodes have 1 free, 2 have 8");
        assert_eq!(f[0].free, 19);
    }

    #[test]
    fn conditions_mark_what_is_wrong() {
        let s = json!({"conditions": [
            {"kind": "Ready", "status": true, "reason": "", "message": ""},
            {"kind": "DeviceViewMismatch", "status": true, "reason": "Mismatch", "message": "GPU 1 missing"},
            {"kind": "DiskPressure", "status": false, "reason": "", "message": ""},
        ]});
        let m = marks(Some(&s));
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].kind, "DeviceViewMismatch");
        let s = json!({"conditions": [{"kind": "Ready", "status": false, "reason": "NoSandboxes", "message": "x"}]});
        assert_eq!(marks(Some(&s))[0].kind, "NotReady");
        assert!(marks(Some(&json!({"weird": 1}))).is_empty());
    }

    #[test]
    fn queue_tree_divides_the_cluster_and_lists_pending_reasons() {
        let total = Resources::new(100_000, 1 << 40).with_gpu_milli(16_000);
        let mut root = Queue::new("org");
        root.weight = 1;
        let mut a = Queue::new("a");
        a.parent = Some("org".into());
        a.weight = 3;
        let mut b = Queue::new("b");
        b.parent = Some("org".into());
        b.weight = 1;
        let other = Queue::new("org");
        let queues = vec![("t", &root), ("t", &a), ("t", &b), ("u", &other)];
        let mut run = job(&[(
            "w",
            GpuRequest::Whole {
                count: 4,
                models: vec![],
            },
            Some(("n0", vec![0, 1, 2, 3])),
        )]);
        run.spec.queue = "a".into();
        let mut wait = job(&[(
            "w",
            GpuRequest::Whole {
                count: 8,
                models: vec![],
            },
            None,
        )]);
        wait.spec.queue = "b".into();
        wait.status.phase = "pending".into();
        wait.status.pending_reason = Some("0/5 nodes fit: 5 nodes lack 8 free GPUs".into());
        let mut theirs = job(&[(
            "w",
            GpuRequest::Whole {
                count: 16,
                models: vec![],
            },
            None,
        )]);
        theirs.spec.queue = "org".into();
        theirs.status.phase = "pending".into();
        let rows = queue_tree(
            &queues,
            [
                ("t", "run", &run),
                ("t", "wait", &wait),
                ("u", "theirs", &theirs),
            ],
            &total,
            "t",
        );
        let names: Vec<_> = rows.iter().map(|r| (r.name.as_str(), r.depth)).collect();
        assert_eq!(names, [("org", 0), ("a", 1), ("b", 1)]);
        // The two tenants' roots split 16 GPUs by weight, each capped at its demand
        // (t: 4 held + 8 asked = 12; u: 16 asked): 8 each.
        assert_eq!(rows[0].deserved.gpu_milli, 8000);
        assert_eq!(rows[0].allocated.gpu_milli, 4000);
        assert_eq!(rows[0].pending.gpu_milli, 8000);
        // a and b: 3:1 of 8, a capped at its demand of 4, the rest to b.
        assert_eq!(rows[1].deserved.gpu_milli, 4000);
        assert_eq!(rows[2].deserved.gpu_milli, 4000);
        assert_eq!(rows[2].waiting[0].name, "wait");
        assert!(
            rows[2].waiting[0]
                .reason
                .as_deref()
                .unwrap()
                .contains("lack 8 free GPUs")
        );
        assert_eq!((rows[0].running_jobs, rows[0].pending_jobs), (1, 1));
    }
}
