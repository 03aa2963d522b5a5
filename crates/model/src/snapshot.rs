//! The state the scheduler reads: nodes, queues, and groups with their tasks.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::group::{GpuRequest, PodGroup};
use crate::node::Node;
use crate::queue::Queue;

/// A consistent view of the cluster at one moment. The scheduler derives free
/// capacity from `nodes` minus the tasks in `groups` that have a `node`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    #[serde(default)]
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub queues: Vec<Queue>,
    #[serde(default)]
    pub groups: Vec<PodGroup>,
}

/// What is inconsistent about a running task in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IssueKind {
    /// The task names a node the snapshot does not have.
    UnknownNode,
    /// A GPU index the node does not have.
    GpuOutOfRange,
    /// The task lists the same GPU index twice.
    GpuListedTwice,
    /// More or fewer GPU indices than the request holds.
    GpuCount,
    /// The GPU is already held by another running task on the node (a whole
    /// GPU held twice, or shares adding up to more than the GPU), or it is
    /// MIG-enabled and the task is not a MIG task (or the other way round).
    GpuTaken,
}

/// One inconsistency, naming the task by its position in the snapshot and in
/// words; after [`Snapshot::repair`], also what was done about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotIssue {
    /// Index into [`Snapshot::groups`].
    pub group: usize,
    /// Index into that group's `tasks`.
    pub task: usize,
    pub kind: IssueKind,
    /// For GPU issues: the position in the task's `gpu_indices` at fault.
    pub index: Option<usize>,
    /// What is wrong, naming the task, the node and the GPU.
    pub message: String,
}

impl fmt::Display for SnapshotIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// How full one GPU is, as the running tasks say.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    milli: u32,
    memory: u64,
}

/// What a node offers, per GPU index: (device memory, MIG-enabled).
fn devices(n: &Node) -> Vec<(u32, u64, bool)> {
    if !n.gpus.is_empty() {
        return n
            .gpus
            .iter()
            .map(|g| (g.index, g.memory, g.mig.is_some()))
            .collect();
    }
    // Only a count is known: anonymous devices 0..count, as the scheduler makes.
    let count = u32::try_from(n.allocatable.gpu_milli / 1000).unwrap_or(u32::MAX);
    let mem = n
        .allocatable
        .gpu_memory
        .checked_div(u64::from(count))
        .unwrap_or(0);
    (0..count.min(1024)).map(|i| (i, mem, false)).collect()
}

impl Snapshot {
    /// Inconsistencies of running tasks: a node the snapshot does not have;
    /// GPU indices out of range, listed twice, of the wrong number, or held by
    /// two tasks at once. Tasks are visited in (group name, task name) order,
    /// so of two tasks that claim one GPU, the later in that order is named.
    /// Empty when the snapshot is consistent.
    pub fn validate(&self) -> Vec<SnapshotIssue> {
        let nodes: BTreeMap<&str, &Node> =
            self.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let mut devs: BTreeMap<&str, BTreeMap<u32, (u64, bool)>> = BTreeMap::new();
        let mut held: BTreeMap<(&str, u32), Held> = BTreeMap::new();
        let mut order: Vec<(usize, usize)> = self
            .groups
            .iter()
            .enumerate()
            .flat_map(|(g, pg)| {
                pg.tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.node.is_some())
                    .map(move |(t, _)| (g, t))
            })
            .collect();
        order.sort_by(|a, b| {
            let ta = (&self.groups[a.0].name, &self.groups[a.0].tasks[a.1].name);
            let tb = (&self.groups[b.0].name, &self.groups[b.0].tasks[b.1].name);
            ta.cmp(&tb).then(a.cmp(b))
        });
        let mut out = Vec::new();
        for (g, t) in order {
            let pg = &self.groups[g];
            let task = &pg.tasks[t];
            let Some(node_name) = task.node.as_deref() else {
                continue;
            };
            let who = TaskName(&pg.name, &task.name);
            let issue = |kind, index, message: String| SnapshotIssue {
                group: g,
                task: t,
                kind,
                index,
                message,
            };
            let Some(node) = nodes.get(node_name) else {
                out.push(issue(
                    IssueKind::UnknownNode,
                    None,
                    format!("{who} runs on node {node_name}, which the snapshot does not have"),
                ));
                continue;
            };
            if task.gpu_indices.is_empty() {
                // Nothing recorded: the scheduler charges a fresh selection.
                continue;
            }
            let want = task.gpu.devices() as usize;
            if task.gpu_indices.len() != want {
                out.push(issue(
                    IssueKind::GpuCount,
                    None,
                    format!(
                        "{who} on node {node_name} lists {} GPU indices; its request holds {want}",
                        task.gpu_indices.len()
                    ),
                ));
                continue;
            }
            let dev = devs.entry(node_name).or_insert_with(|| {
                devices(node)
                    .into_iter()
                    .map(|(i, m, mig)| (i, (m, mig)))
                    .collect()
            });
            let mut bad = None;
            for (k, &i) in task.gpu_indices.iter().enumerate() {
                if task.gpu_indices[..k].contains(&i) {
                    bad = Some(issue(
                        IssueKind::GpuListedTwice,
                        Some(k),
                        format!("{who} on node {node_name} lists GPU {i} twice"),
                    ));
                    break;
                }
                let Some(&(memory, mig)) = dev.get(&i) else {
                    bad = Some(issue(
                        IssueKind::GpuOutOfRange,
                        Some(k),
                        format!(
                            "{who} holds GPU {i} on node {node_name}, which has {} GPUs ({})",
                            dev.len(),
                            index_range(dev)
                        ),
                    ));
                    break;
                };
                let is_mig = matches!(task.gpu, GpuRequest::Mig { .. });
                if mig != is_mig {
                    bad = Some(issue(
                        IssueKind::GpuTaken,
                        Some(k),
                        if mig {
                            format!(
                                "{who} holds GPU {i} on node {node_name}, which is MIG-enabled; only MIG tasks run on it"
                            )
                        } else {
                            format!(
                                "{who} is a MIG task on GPU {i} of node {node_name}, which is not MIG-enabled"
                            )
                        },
                    ));
                    break;
                }
                if is_mig {
                    continue;
                }
                let (milli, mem) = match &task.gpu {
                    GpuRequest::Shared { milli, memory, .. } => (*milli, *memory),
                    _ => (1000, 0),
                };
                let h = held.get(&(node_name, i)).copied().unwrap_or_default();
                if h.milli + milli > 1000 || (mem > 0 && h.memory + mem > memory) {
                    bad = Some(issue(
                        IssueKind::GpuTaken,
                        Some(k),
                        format!(
                            "{who} holds GPU {i} on node {node_name}, which other running tasks already hold ({} of 1000 milli-GPU{})",
                            h.milli,
                            if h.memory > 0 {
                                format!(", {} of {} bytes", h.memory, memory)
                            } else {
                                String::new()
                            }
                        ),
                    ));
                    break;
                }
            }
            match bad {
                Some(b) => out.push(b),
                None => {
                    // Charge the task's GPUs, for the tasks after it.
                    let (milli, mem) = match &task.gpu {
                        GpuRequest::Shared { milli, memory, .. } => (*milli, *memory),
                        GpuRequest::Mig { .. } => (0, 0),
                        _ => (1000, 0),
                    };
                    for &i in &task.gpu_indices {
                        let h = held.entry((node_name, i)).or_default();
                        h.milli += milli;
                        h.memory += mem;
                    }
                }
            }
        }
        out
    }

    /// [`Snapshot::validate`], then repairs what it can: a task with a GPU
    /// issue loses its recorded `gpu_indices` (and `mig_start`), so the
    /// scheduler charges it what a fresh selection picks on its node. A task on
    /// an unknown node is left as it is (the scheduler counts it as running and
    /// charges no node). Returns the issues, each message saying what was done.
    pub fn repair(&mut self) -> Vec<SnapshotIssue> {
        let mut issues = self.validate();
        for i in &mut issues {
            if i.kind == IssueKind::UnknownNode {
                i.message
                    .push_str("; left as it is: counted as running, on no node");
                continue;
            }
            let task = &mut self.groups[i.group].tasks[i.task];
            task.gpu_indices.clear();
            task.mig_start = None;
            i.message.push_str(
                "; its GPU indices were dropped: it is charged what a fresh selection picks",
            );
        }
        issues
    }
}

/// `task group/name`, formatted only when an issue is written.
struct TaskName<'a>(&'a str, &'a str);

impl fmt::Display for TaskName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {}/{}", self.0, self.1)
    }
}

fn index_range(dev: &BTreeMap<u32, (u64, bool)>) -> String {
    match (dev.keys().next(), dev.keys().next_back()) {
        (Some(a), Some(b)) if dev.len() as u64 == u64::from(*b - *a) + 1 => {
            format!("{a}..{}", b + 1)
        }
        (Some(_), Some(_)) => {
            let v: Vec<String> = dev.keys().map(u32::to_string).collect();
            v.join(", ")
        }
        _ => "none".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::Task;
    use crate::node::GpuDevice;
    use crate::resources::Resources;

    fn snap(tasks: Vec<(&str, GpuRequest, Vec<u32>)>) -> Snapshot {
        let mut n = Node::new("n", Resources::new(8000, 1 << 30).with_gpu_milli(4000));
        n.gpus = (0..4).map(|i| GpuDevice::new(i, "g", 16 << 30)).collect();
        let mut g = PodGroup::new("g", "q", 1);
        for (name, gpu, idx) in tasks {
            let mut t = Task::new(name, Resources::default()).with_gpu(gpu);
            t.node = Some("n".into());
            t.gpu_indices = idx;
            g.tasks.push(t);
        }
        Snapshot {
            nodes: vec![n],
            queues: vec![Queue::new("q")],
            groups: vec![g],
        }
    }

    fn whole(n: u32) -> GpuRequest {
        GpuRequest::Whole {
            count: n,
            models: Vec::new(),
        }
    }

    fn shared(m: u32) -> GpuRequest {
        GpuRequest::Shared {
            milli: m,
            memory: 0,
            models: Vec::new(),
        }
    }

    #[test]
    fn finds_and_repairs_gpu_issues() {
        let s = snap(vec![
            ("a", whole(2), vec![0, 1]),
            ("b", whole(1), vec![1]),
            ("c", whole(1), vec![7]),
            ("d", whole(2), vec![2, 2]),
            ("e", whole(2), vec![3]),
            ("f", shared(600), vec![3]),
            ("h", shared(600), vec![3]),
        ]);
        let issues = s.validate();
        let kinds: Vec<(usize, IssueKind)> = issues.iter().map(|i| (i.task, i.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (1, IssueKind::GpuTaken),
                (2, IssueKind::GpuOutOfRange),
                (3, IssueKind::GpuListedTwice),
                (4, IssueKind::GpuCount),
                (6, IssueKind::GpuTaken),
            ]
        );
        assert_eq!(
            issues[1].message,
            "task g/c holds GPU 7 on node n, which has 4 GPUs (0..4)"
        );
        let mut r = s.clone();
        let fixed = r.repair();
        assert_eq!(fixed.len(), 5);
        assert!(r.validate().is_empty());
        assert_eq!(r.groups[0].tasks[0].gpu_indices, vec![0, 1]);
        assert!(r.groups[0].tasks[1].gpu_indices.is_empty());
    }

    #[test]
    fn consistent_snapshot_has_no_issues() {
        let s = snap(vec![
            ("a", whole(2), vec![0, 1]),
            ("f", shared(400), vec![3]),
            ("h", shared(600), vec![3]),
            ("i", whole(1), vec![]),
        ]);
        assert!(s.validate().is_empty());
    }
}
