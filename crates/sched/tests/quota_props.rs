//! Quota is charged for what is placed: a group that the quota admits but that
//! no node can hold does not hold quota against groups that can be placed.
//!
//! The property: take a plan, apply its bindings, and remove every group the
//! plan left waiting that could not be placed on the cluster as the plan
//! leaves it even with no quota at all. Planning that again must not place a
//! group the plan left waiting: if it does, that group waited on quota that
//! only unplaceable groups "used".

use proptest::prelude::*;
use tessera_model::{GpuDevice, GpuRequest, Node, PodGroup, Queue, Resources, Snapshot, Task};
use tessera_sched::Config;

#[derive(Debug, Clone)]
struct Case {
    nodes: usize,
    gpus_per_node: u32,
    /// GPU capability per queue (None: unbounded); queue i's parent is
    /// `parent` when set.
    queues: Vec<Option<u32>>,
    parent_cap: Option<u32>,
    /// (queue, priority, GPUs per task, tasks) per group.
    groups: Vec<(usize, i32, u32, u32)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..4,
        prop::sample::select(vec![2u32, 4]),
        prop::collection::vec(prop::option::of(1u32..9), 1..3),
        prop::option::of(2u32..12),
        prop::collection::vec((0usize..2, 0i32..3, 1u32..7, 1u32..3), 1..6),
    )
        .prop_map(|(nodes, gpus_per_node, queues, parent_cap, groups)| {
            let nq = queues.len();
            Case {
                nodes,
                gpus_per_node,
                queues,
                parent_cap,
                groups: groups
                    .into_iter()
                    .map(|(q, p, g, t)| (q % nq, p, g, t))
                    .collect(),
            }
        })
}

fn gpus(n: u32) -> Resources {
    Resources {
        gpu_milli: u64::from(n) * 1000,
        ..Resources::default()
    }
}

fn unbounded() -> Resources {
    Resources {
        cpu_milli: u64::MAX,
        memory: u64::MAX,
        gpu_milli: u64::MAX,
        gpu_memory: u64::MAX,
        pods: u64::MAX,
        ..Resources::default()
    }
}

fn snapshot(c: &Case) -> Snapshot {
    let mut snap = Snapshot::default();
    for i in 0..c.nodes {
        let mut n = Node::new(
            format!("n{i}"),
            Resources::new(64_000, 256 << 30)
                .with_gpu_milli(u64::from(c.gpus_per_node) * 1000)
                .with_pods(110),
        );
        n.gpus = (0..c.gpus_per_node)
            .map(|g| GpuDevice::new(g, "gpu", 16 << 30))
            .collect();
        snap.nodes.push(n);
    }
    let mut root = Queue::new("org");
    if let Some(cap) = c.parent_cap {
        root.capability = Some(Resources {
            gpu_milli: u64::from(cap) * 1000,
            ..unbounded()
        });
    }
    snap.queues.push(root);
    for (i, cap) in c.queues.iter().enumerate() {
        let mut q = Queue::new(format!("q{i}"));
        q.parent = Some("org".into());
        q.capability = cap.map(|g| Resources {
            gpu_milli: gpus(g).gpu_milli,
            ..unbounded()
        });
        snap.queues.push(q);
    }
    for (gi, &(q, prio, g, tasks)) in c.groups.iter().enumerate() {
        let mut pg = PodGroup::new(format!("g{gi}"), format!("q{q}"), tasks);
        pg.priority = prio;
        pg.creation = gi as u64;
        for t in 0..tasks {
            pg.tasks.push(
                Task::new(format!("t{t}"), Resources::new(1000, 1 << 30)).with_gpu(
                    GpuRequest::Whole {
                        count: g,
                        models: Vec::new(),
                    },
                ),
            );
        }
        snap.groups.push(pg);
    }
    snap
}

fn config(proportion: bool) -> Config {
    let mut t2 = vec!["drf", "predicates"];
    if proportion {
        t2.push("proportion");
    }
    Config::from_names(&["enqueue", "allocate"], &[vec!["priority", "gang"], t2]).unwrap()
}

/// Groups with a task the plan did not bind.
fn waiting(snap: &Snapshot, plan: &tessera_model::Plan) -> Vec<String> {
    snap.groups
        .iter()
        .filter(|g| {
            g.tasks.iter().any(|t| {
                t.node.is_none()
                    && !plan
                        .bindings
                        .iter()
                        .any(|b| b.task.group == g.name && b.task.task == t.name)
            })
        })
        .map(|g| g.name.clone())
        .collect()
}

/// `snap` with the plan's bindings applied.
fn applied(snap: &Snapshot, plan: &tessera_model::Plan) -> Snapshot {
    let mut s = snap.clone();
    for b in &plan.bindings {
        let g = s
            .groups
            .iter_mut()
            .find(|g| g.name == b.task.group)
            .unwrap();
        let t = g.tasks.iter_mut().find(|t| t.name == b.task.task).unwrap();
        t.node = Some(b.node.clone());
        t.gpu_indices = b.gpus.clone();
    }
    s
}

fn check(c: &Case, proportion: bool) -> Result<(), TestCaseError> {
    let snap = snapshot(c);
    let cfg = config(proportion);
    let plan = tessera_sched::schedule(&snap, &cfg);
    let after = applied(&snap, &plan);
    let left = waiting(&snap, &plan);
    // Which waiting groups no node can hold, even with no quota at all.
    let mut free = after.clone();
    for q in &mut free.queues {
        q.capability = None;
    }
    let unplaceable: Vec<&String> = left
        .iter()
        .filter(|g| {
            let mut s = free.clone();
            s.groups
                .retain(|x| x.name == **g || !left.contains(&x.name));
            let p = tessera_sched::schedule(&s, &config(false));
            waiting(&s, &p).contains(g)
        })
        .collect();
    let mut without = after.clone();
    without.groups.retain(|g| !unplaceable.contains(&&g.name));
    let again = tessera_sched::schedule(&without, &cfg);
    let still = waiting(&without, &again);
    for g in &left {
        if unplaceable.contains(&g) {
            continue;
        }
        prop_assert!(
            still.contains(g),
            "{g} waited in the plan, but is placed once the unplaceable groups {unplaceable:?} are gone.\nplan:\n{plan}\nagain:\n{again}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn unplaceable_groups_hold_no_capability(c in case()) {
        check(&c, false)?;
    }

    #[test]
    fn unplaceable_groups_hold_no_share(c in case()) {
        check(&c, true)?;
    }
}
