//! Reclaim keeps only evictions that free room for a task placed on the freed
//! node: the shrunk case of a `properties` counterexample (see
//! `properties.proptest-regressions`, `cc 94b85547...`).

use tessera_model::{GpuDevice, GpuRequest, Node, PodGroup, Queue, Resources, Snapshot, Task};
use tessera_sched::{Config, schedule};

fn node(name: &str, cpu: u64, mem_gib: u64, gpus: u32) -> Node {
    let mut n = Node::new(
        name,
        Resources::new(cpu, mem_gib << 30)
            .with_gpu_milli(u64::from(gpus) * 1000)
            .with_pods(16),
    );
    n.allocatable.gpu_memory = u64::from(gpus) * (16 << 30);
    n.gpus = (0..gpus)
        .map(|g| GpuDevice::new(g, "T", 16 << 30))
        .collect();
    n.labels.insert("zone".into(), "a".into());
    n
}

fn whole(count: u32) -> GpuRequest {
    GpuRequest::Whole {
        count,
        models: vec![],
    }
}

fn shared(milli: u32) -> GpuRequest {
    GpuRequest::Shared {
        milli,
        memory: if milli == 300 { 4 << 30 } else { 8 << 30 },
        models: vec![],
    }
}

fn task(name: &str, cpu: u64, gpu: GpuRequest, on: Option<(&str, &[u32])>) -> Task {
    let mut t = Task::new(name, Resources::new(cpu, 0)).with_gpu(gpu);
    if let Some((n, gpus)) = on {
        t.node = Some(n.into());
        t.gpu_indices = gpus.to_vec();
    }
    t
}

fn group(
    name: &str,
    queue: &str,
    min: u32,
    creation: u64,
    preemptable: bool,
    tasks: Vec<Task>,
) -> PodGroup {
    let mut g = PodGroup::new(name, queue, min);
    g.creation = creation;
    g.preemptable = preemptable;
    g.tasks = tasks;
    g
}

fn snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    // n0: 13 GiB = 13958643712; n1: 25 GiB; n2: 10 GiB.
    snap.nodes.push(node("n0", 23000, 13, 4));
    snap.nodes.push(node("n1", 4000, 25, 2));
    snap.nodes.push(node("n2", 12000, 10, 2));
    for (i, (reclaimable, parent, weight)) in [
        (false, None, 1),
        (true, None, 1),
        (false, Some("q0"), 1),
        (false, None, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let mut q = Queue::new(format!("q{i}"));
        q.reclaimable = reclaimable;
        q.parent = parent.map(Into::into);
        q.weight = weight;
        snap.queues.push(q);
    }
    snap.groups = vec![
        group(
            "g0",
            "q1",
            1,
            0,
            true,
            vec![task("t0", 0, whole(2), Some(("n0", &[0, 1])))],
        ),
        group(
            "g1",
            "q1",
            1,
            1,
            false,
            vec![
                task("t0", 0, shared(700), None),
                task("t1", 0, shared(300), None),
                task("t2", 0, shared(700), Some(("n0", &[2]))),
            ],
        ),
        group("g2", "q3", 1, 2, false, vec![task("t0", 0, whole(3), None)]),
        group(
            "g3",
            "q1",
            1,
            3,
            false,
            vec![task("t0", 0, whole(1), Some(("n0", &[3])))],
        ),
        group(
            "g4",
            "q2",
            3,
            4,
            false,
            vec![
                task("t0", 5000, shared(700), None),
                task("t1", 0, whole(1), None),
                task("t2", 5000, shared(700), None),
            ],
        ),
    ];
    snap
}

/// Allocate fails the gang g4 (its members are tried before g1 takes its
/// shared GPUs, and the third member finds no room); after allocate, free room
/// on n1 and n2 holds the whole gang. Reclaim's joint search evicted g0 on n0
/// (the cheapest victim set), then placed the gang on free room elsewhere and
/// kept the eviction: a "reclaimed by queue q2" eviction that freed room for
/// nobody.
#[test]
fn reclaim_evicts_only_for_tasks_placed_on_the_freed_node() {
    let snap = snapshot();
    let plan = schedule(&snap, &Config::default());
    for e in &plan.evictions {
        assert!(
            plan.bindings
                .iter()
                .any(|b| b.after_evictions && b.node == e.node),
            "eviction of {} on {} frees room for nobody: {plan:#?}",
            e.task,
            e.node
        );
    }
    assert!(plan.evictions.is_empty(), "{plan:#?}");
    let g4: Vec<_> = plan
        .bindings
        .iter()
        .filter(|b| b.task.group == "g4")
        .collect();
    assert_eq!(g4.len(), 3, "{plan:#?}");
    assert!(
        g4.iter().all(|b| !b.after_evictions && b.node != "n0"),
        "{plan:#?}"
    );
}
