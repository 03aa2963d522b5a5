//! Invariants of the batch scheduler, checked over generated clusters.
//!
//! - no plan over-commits a node (any resource, or any GPU's share);
//! - gangs are all or nothing: a group gets bindings only if it ends at or
//!   above `min_member`;
//! - a queue's capability is never exceeded by new bindings;
//! - bindings not marked `after_evictions` fit without the plan's evictions;
//! - the same input in any order gives the same plan;
//! - preemption never evicts a task of equal or higher priority.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tessera_model::{
    GpuDevice, GpuRequest, Node, Plan, PodGroup, Queue, Resources, Snapshot, Taint, TaintEffect,
    Task, Toleration, TolerationOperator,
};
use tessera_sched::{Config, schedule};

#[derive(Debug, Clone)]
struct GenTask {
    cpu: u64,
    mem: u64,
    gpu: u8, // 0: none, 1..=4 whole, 5: shared 300m, 6: shared 700m
    tolerate: bool,
    select_b: bool,
    run_on: Option<usize>,
}

fn gen_task() -> impl Strategy<Value = GenTask> {
    (
        0u64..8,
        0u64..16,
        0u8..7,
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::option::weighted(0.4, 0usize..6),
    )
        .prop_map(|(cpu, mem, gpu, tolerate, select_b, run_on)| GenTask {
            cpu: cpu * 1000,
            mem: mem << 30,
            gpu,
            tolerate,
            select_b,
            run_on,
        })
}

#[derive(Debug, Clone)]
struct GenGroup {
    queue: usize,
    priority: i32,
    min_member: usize,
    preemptable: bool,
    tasks: Vec<GenTask>,
}

fn gen_group() -> impl Strategy<Value = GenGroup> {
    (
        0usize..4,
        0i32..4,
        1usize..5,
        prop::bool::weighted(0.8),
        prop::collection::vec(gen_task(), 1..5),
    )
        .prop_map(
            |(queue, priority, min_member, preemptable, tasks)| GenGroup {
                queue,
                priority,
                min_member: min_member.min(tasks.len()),
                preemptable,
                tasks,
            },
        )
}

#[derive(Debug, Clone)]
struct GenNode {
    cpu: u64,
    mem: u64,
    gpus: u32,
    tainted: bool,
    zone_b: bool,
}

fn gen_node() -> impl Strategy<Value = GenNode> {
    (
        4u64..32,
        8u64..64,
        prop::sample::select(vec![0u32, 1, 2, 4, 8]),
        prop::bool::weighted(0.2),
        any::<bool>(),
    )
        .prop_map(|(cpu, mem, gpus, tainted, zone_b)| GenNode {
            cpu: cpu * 1000,
            mem: mem << 30,
            gpus,
            tainted,
            zone_b,
        })
}

fn gen_queues() -> impl Strategy<Value = Vec<(u32, Option<u64>, bool, bool)>> {
    // (weight, gpu capability, reclaimable, child of q0)
    prop::collection::vec(
        (
            1u32..4,
            prop::option::weighted(0.4, 0u64..12),
            prop::bool::weighted(0.8),
            prop::bool::weighted(0.2),
        ),
        4,
    )
}

/// Builds a consistent snapshot: tasks listed as running are kept only if they
/// fit on their node (whole GPUs included) and within their queue's capability.
fn build(
    nodes: &[GenNode],
    queues: &[(u32, Option<u64>, bool, bool)],
    groups: &[GenGroup],
) -> Snapshot {
    let mut snap = Snapshot::default();
    for (i, n) in nodes.iter().enumerate() {
        let mut node = Node::new(
            format!("n{i}"),
            Resources::new(n.cpu, n.mem)
                .with_gpu_milli(u64::from(n.gpus) * 1000)
                .with_pods(16),
        );
        node.allocatable.gpu_memory = u64::from(n.gpus) * (16 << 30);
        node.gpus = (0..n.gpus)
            .map(|g| GpuDevice::new(g, "T", 16 << 30))
            .collect();
        if n.tainted {
            node.taints.push(Taint {
                key: "k".into(),
                value: "v".into(),
                effect: TaintEffect::NoSchedule,
            });
        }
        node.labels
            .insert("zone".into(), if n.zone_b { "b" } else { "a" }.into());
        snap.nodes.push(node);
    }
    // Queue 0 may be the parent of others; queue names q0..q3.
    for (i, &(w, cap, reclaimable, child)) in queues.iter().enumerate() {
        let mut q = Queue::new(format!("q{i}"));
        q.weight = w;
        q.reclaimable = reclaimable;
        if let Some(c) = cap {
            let mut r = Resources::new(u64::MAX, u64::MAX).with_pods(u64::MAX);
            r.gpu_milli = c * 1000;
            r.gpu_memory = u64::MAX;
            q.capability = Some(r);
        }
        if i > 0 && child {
            q.parent = Some("q0".into());
        }
        snap.queues.push(q);
    }
    let parents: Vec<bool> = (0..queues.len())
        .map(|i| i == 0 && queues.iter().skip(1).any(|q| q.3))
        .collect();
    // Free capacity, to keep running tasks consistent.
    let mut free: Vec<Resources> = snap.nodes.iter().map(|n| n.allocatable.clone()).collect();
    let mut gpu_free: Vec<Vec<u32>> = snap
        .nodes
        .iter()
        .map(|n| vec![1000; n.gpus.len()])
        .collect();
    let mut queue_gpu: Vec<u64> = vec![0; queues.len()];
    for (gi, g) in groups.iter().enumerate() {
        // Groups go into leaf queues.
        let qi = if parents[g.queue] { 1 } else { g.queue };
        let mut pg = PodGroup::new(format!("g{gi}"), format!("q{qi}"), g.min_member as u32);
        pg.priority = g.priority;
        pg.preemptable = g.preemptable;
        pg.creation = gi as u64;
        for (ti, t) in g.tasks.iter().enumerate() {
            let gpu = match t.gpu {
                0 => GpuRequest::None,
                k @ 1..=4 => GpuRequest::Whole {
                    count: u32::from(k),
                    models: vec![],
                },
                5 => GpuRequest::Shared {
                    milli: 300,
                    memory: 4 << 30,
                    models: vec![],
                },
                _ => GpuRequest::Shared {
                    milli: 700,
                    memory: 8 << 30,
                    models: vec![],
                },
            };
            let mut task =
                Task::new(format!("t{ti}"), Resources::new(t.cpu, t.mem)).with_gpu(gpu.clone());
            if t.tolerate {
                task.tolerations.push(Toleration {
                    key: "k".into(),
                    operator: TolerationOperator::Exists,
                    value: String::new(),
                    effect: None,
                });
            }
            if t.select_b {
                task.node_selector.insert("zone".into(), "b".into());
            }
            if let Some(n) = t.run_on {
                if n < nodes.len() {
                    let req = task.request();
                    let cap_ok = queues[qi]
                        .1
                        .is_none_or(|c| queue_gpu[qi] + req.gpu_milli <= c * 1000)
                        && (qi == 0
                            || !queues[qi].3
                            || queues[0].1.is_none_or(|c| {
                                queue_gpu
                                    .iter()
                                    .enumerate()
                                    .filter(|(k, _)| *k == 0 || queues[*k].3)
                                    .map(|(_, v)| v)
                                    .sum::<u64>()
                                    + req.gpu_milli
                                    <= c * 1000
                            }));
                    let devices: Option<Vec<u32>> = match &gpu {
                        GpuRequest::None => Some(vec![]),
                        GpuRequest::Whole { count, .. } => {
                            let f: Vec<u32> = (0..gpu_free[n].len() as u32)
                                .filter(|&d| gpu_free[n][d as usize] == 1000)
                                .take(*count as usize)
                                .collect();
                            (f.len() == *count as usize).then_some(f)
                        }
                        GpuRequest::Shared { milli, .. } => (0..gpu_free[n].len() as u32)
                            .find(|&d| gpu_free[n][d as usize] >= *milli)
                            .map(|d| vec![d]),
                        // Not generated here; see tests/mig_session.rs.
                        GpuRequest::Mig { .. } => None,
                    };
                    if let (true, Some(devs), Some(left)) =
                        (cap_ok, devices, free[n].checked_sub(&req))
                    {
                        free[n] = left;
                        let per = match &gpu {
                            GpuRequest::Shared { milli, .. } => *milli,
                            _ => 1000,
                        };
                        for &d in &devs {
                            gpu_free[n][d as usize] -= per;
                        }
                        queue_gpu[qi] += req.gpu_milli;
                        task.node = Some(format!("n{n}"));
                        task.gpu_indices = devs;
                    }
                }
            }
            pg.tasks.push(task);
        }
        snap.groups.push(pg);
    }
    snap
}

fn cluster() -> impl Strategy<Value = Snapshot> {
    (
        prop::collection::vec(gen_node(), 1..6),
        gen_queues(),
        prop::collection::vec(gen_group(), 1..8),
    )
        .prop_map(|(n, q, g)| build(&n, &q, &g))
}

/// Final placement: task -> (node, gpus), after the plan's evictions and bindings.
fn apply(snap: &Snapshot, plan: &Plan) -> BTreeMap<(String, String), (String, Vec<u32>)> {
    let mut m = BTreeMap::new();
    for g in &snap.groups {
        for t in &g.tasks {
            if let Some(n) = &t.node {
                m.insert(
                    (g.name.clone(), t.name.clone()),
                    (n.clone(), t.gpu_indices.clone()),
                );
            }
        }
    }
    for e in &plan.evictions {
        m.remove(&(e.task.group.clone(), e.task.task.clone()));
    }
    for b in &plan.bindings {
        let prev = m.insert(
            (b.task.group.clone(), b.task.task.clone()),
            (b.node.clone(), b.gpus.clone()),
        );
        assert!(prev.is_none(), "{} bound while already placed", b.task);
    }
    m
}

fn task_of<'a>(snap: &'a Snapshot, g: &str, t: &str) -> (&'a PodGroup, &'a Task) {
    let pg = snap.groups.iter().find(|x| x.name == g).unwrap();
    (pg, pg.tasks.iter().find(|x| x.name == t).unwrap())
}

fn check_invariants(snap: &Snapshot, plan: &Plan) -> Result<(), TestCaseError> {
    let placed = apply(snap, plan);
    // 1. No node over-committed; no GPU over its share.
    for n in &snap.nodes {
        let mut used = Resources::default();
        let mut gpu_used: BTreeMap<u32, u32> = BTreeMap::new();
        for ((g, t), (node, gpus)) in &placed {
            if node != &n.name {
                continue;
            }
            let (_, task) = task_of(snap, g, t);
            used.add_assign_saturating(&task.request());
            let per = match &task.gpu {
                GpuRequest::Shared { milli, .. } => *milli,
                GpuRequest::Whole { .. } => 1000,
                GpuRequest::None => 0,
                // Not generated here; see tests/mig_session.rs.
                GpuRequest::Mig { .. } => continue,
            };
            prop_assert_eq!(
                gpus.len() as u64 * u64::from(per),
                task.gpu.milli(),
                "{}/{} holds the wrong number of GPUs",
                g,
                t
            );
            for d in gpus {
                *gpu_used.entry(*d).or_insert(0) += per;
            }
        }
        prop_assert!(
            used.fits_in(&n.allocatable),
            "node {} over-committed: {} > {}",
            n.name,
            used,
            n.allocatable
        );
        for (d, u) in gpu_used {
            prop_assert!(u <= 1000, "GPU {} on {} at {}m", d, n.name, u);
            prop_assert!(
                (d as usize) < n.gpus.len(),
                "GPU {} does not exist on {}",
                d,
                n.name
            );
        }
    }
    // 2. Gangs: a group with new bindings ends at or above min_member.
    for g in &snap.groups {
        let bound = plan
            .bindings
            .iter()
            .filter(|b| b.task.group == g.name)
            .count();
        let holding = placed.keys().filter(|(gn, _)| gn == &g.name).count();
        if bound > 0 {
            prop_assert!(
                holding >= g.min_member as usize,
                "gang {} got {} bindings but holds {}/{}",
                g.name,
                bound,
                holding,
                g.min_member
            );
        }
    }
    // 3. Capability: a queue subtree that got new bindings stays within capability.
    for q in &snap.queues {
        let Some(cap) = &q.capability else { continue };
        let in_subtree = |qn: &str| {
            qn == q.name
                || snap
                    .queues
                    .iter()
                    .any(|c| c.name == qn && c.parent.as_deref() == Some(q.name.as_str()))
        };
        let got_new = plan.bindings.iter().any(|b| {
            let (pg, _) = task_of(snap, &b.task.group, &b.task.task);
            in_subtree(&pg.queue)
        });
        if got_new {
            let mut used = Resources::default();
            for (g, t) in placed.keys() {
                let (pg, task) = task_of(snap, g, t);
                if in_subtree(&pg.queue) {
                    used.add_assign_saturating(&task.request());
                }
            }
            prop_assert!(
                used.fits_in(cap),
                "queue {} over capability: {} > {}",
                q.name,
                used,
                cap
            );
        }
    }
    // 4. Bindings that do not wait for evictions fit beside everything that ran
    //    before the plan, victims included: a binder may apply them at once.
    for n in &snap.nodes {
        let mut used = Resources::default();
        for g in &snap.groups {
            for t in &g.tasks {
                if t.node.as_deref() == Some(n.name.as_str()) {
                    used.add_assign_saturating(&t.request());
                }
            }
        }
        for b in plan
            .bindings
            .iter()
            .filter(|b| b.node == n.name && !b.after_evictions)
        {
            let (_, task) = task_of(snap, &b.task.group, &b.task.task);
            used.add_assign_saturating(&task.request());
        }
        prop_assert!(
            used.fits_in(&n.allocatable),
            "node {}: immediate bindings need the evictions: {} > {}",
            n.name,
            used,
            n.allocatable
        );
    }
    // 5. Preemption: only strictly lower priority.
    for e in &plan.evictions {
        let (vg, vt) = task_of(snap, &e.task.group, &e.task.task);
        let vp = vt.priority.unwrap_or(vg.priority);
        prop_assert!(
            vg.preemptable,
            "{} evicted but its group is not preemptable",
            e.task
        );
        if let Some(rest) = e.reason.strip_prefix("preempted by ") {
            let name = rest.split(' ').next().unwrap();
            let pg = snap.groups.iter().find(|g| g.name == name).unwrap();
            prop_assert!(
                pg.priority > vp,
                "{} (priority {}) preempted by {} (priority {})",
                e.task,
                vp,
                pg.name,
                pg.priority
            );
            prop_assert_eq!(&pg.queue, &vg.queue, "preemption across queues");
        } else {
            prop_assert!(
                e.reason.starts_with("reclaimed by queue "),
                "unknown eviction reason {}",
                e.reason
            );
            let frees = |node: &str| {
                plan.bindings
                    .iter()
                    .any(|b| b.after_evictions && b.node == node)
            };
            // A gang goes as a whole: a member evicted only because its gang fell
            // below min_member frees room on its own node for nobody, but some
            // eviction of that same gang must free room for someone.
            let ok = frees(&e.node)
                || (e.reason.contains("with its whole gang")
                    && plan
                        .evictions
                        .iter()
                        .any(|o| o.task.group == e.task.group && frees(&o.node)));
            prop_assert!(ok, "eviction on {} frees room for nobody", e.node);
        }
    }
    Ok(())
}

fn shuffle<T: Clone>(v: &[T], seed: u64) -> Vec<T> {
    let mut out = v.to_vec();
    let mut s = seed | 1;
    for i in (1..out.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.swap(i, (s % (i as u64 + 1)) as usize);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn plans_keep_the_invariants(snap in cluster()) {
        let plan = schedule(&snap, &Config::default());
        check_invariants(&snap, &plan)?;
    }

    #[test]
    fn spread_and_no_enqueue_keep_the_invariants(snap in cluster()) {
        let cfg = Config::from_names(&["allocate", "backfill", "reclaim", "preempt"], &[vec!["gang", "priority"], vec!["drf", "predicates", "proportion", "spread"]]).unwrap();
        let plan = schedule(&snap, &cfg);
        check_invariants(&snap, &plan)?;
    }

    #[test]
    fn order_of_input_does_not_matter(snap in cluster(), seed in any::<u64>()) {
        let plan = schedule(&snap, &Config::default());
        let mut shuffled = snap.clone();
        shuffled.nodes = shuffle(&snap.nodes, seed);
        shuffled.queues = shuffle(&snap.queues, seed.rotate_left(7));
        shuffled.groups = shuffle(&snap.groups, seed.rotate_left(13));
        for g in &mut shuffled.groups {
            g.tasks = shuffle(&g.tasks, seed.rotate_left(29));
        }
        prop_assert_eq!(plan, schedule(&shuffled, &Config::default()));
    }
}

/// Arbitrary, inconsistent snapshots: unknown queues and nodes, duplicate names,
/// devices out of range, over-full nodes, odd GPU requests, queue cycles. The
/// scheduler must still return a plan, not panic.
fn messy() -> impl Strategy<Value = Snapshot> {
    let name = prop::sample::select(vec!["a", "b", "c", "x"]);
    let gpu = prop_oneof![
        Just(GpuRequest::None),
        (0u32..10).prop_map(|count| GpuRequest::Whole {
            count,
            models: vec![]
        }),
        (0u32..2000, 0u64..(64 << 30)).prop_map(|(milli, memory)| GpuRequest::Shared {
            milli,
            memory,
            models: vec![]
        }),
    ];
    let task = (
        name.clone(),
        0u64..100_000,
        gpu,
        prop::option::of(name.clone()),
        prop::collection::vec(0u32..12, 0..3),
        prop::option::of(-5i32..5),
    )
        .prop_map(|(n, cpu, gpu, node, gpu_indices, priority)| {
            let mut t = Task::new(n, Resources::new(cpu, 0)).with_gpu(gpu);
            t.node = node.map(str::to_string);
            t.gpu_indices = gpu_indices;
            t.priority = priority;
            t
        });
    let group = (
        name.clone(),
        name.clone(),
        0u32..6,
        -3i32..3,
        prop::collection::vec(task, 0..5),
    )
        .prop_map(|(n, q, min, p, tasks)| {
            let mut g = PodGroup::new(n, q, min);
            g.priority = p;
            g.tasks = tasks;
            g
        });
    let node = (name.clone(), 0u64..64_000, 0u64..3, 0u32..9, any::<bool>()).prop_map(
        |(n, cpu, pods, gpus, cordon)| {
            let mut node = Node::new(
                n,
                Resources::new(cpu, 1 << 34)
                    .with_gpu_milli(u64::from(gpus) * 1000)
                    .with_pods(pods),
            );
            node.gpus = (0..gpus).map(|i| GpuDevice::new(i, "T", 1 << 34)).collect();
            node.unschedulable = cordon;
            node
        },
    );
    let queue = (
        name.clone(),
        prop::option::of(name),
        0u32..3,
        prop::option::of(0u64..8_000),
    )
        .prop_map(|(n, p, w, cap)| {
            let mut q = Queue::new(n);
            q.parent = p.map(str::to_string);
            q.weight = w;
            q.capability = cap.map(|c| Resources::new(c, u64::MAX));
            q
        });
    (
        prop::collection::vec(node, 0..4),
        prop::collection::vec(queue, 0..4),
        prop::collection::vec(group, 0..5),
    )
        .prop_map(|(nodes, queues, groups)| Snapshot {
            nodes,
            queues,
            groups,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    #[test]
    fn inconsistent_snapshots_still_plan(snap in messy()) {
        let plan = schedule(&snap, &Config::default());
        // And the same input still gives the same plan.
        prop_assert_eq!(&plan, &schedule(&snap, &Config::default()));
    }
}
