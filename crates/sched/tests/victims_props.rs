//! Minimal victim sets, checked against brute force on small random clusters.
//!
//! Every subset of the running tasks is tried: a subset is a valid victim set
//! when it leaves every gang at or above its `min_member` or takes all of its
//! running members; it makes room when the preemptor (the whole gang) is
//! placed by `allocate` on the cluster without those tasks. The plan's
//! evictions must be a valid set that makes room, with the smallest key among
//! all of them: fewest tasks, then the lowest priorities (highest first), then
//! the least resources beyond what the preemptor asks for.

use std::collections::BTreeSet;

use proptest::prelude::*;
use tessera_model::{GpuDevice, GpuRequest, Node, PodGroup, Queue, Resources, Snapshot, Task};
use tessera_sched::Config;

#[derive(Debug, Clone)]
struct Running {
    priority: i32,
    min_member: u32,
    preemptable: bool,
    /// (gpus, cpu cores, node) per task.
    tasks: Vec<(u32, u64, usize)>,
}

#[derive(Debug, Clone)]
struct Case {
    nodes: usize,
    gpus_per_node: u32,
    running: Vec<Running>,
    /// (gpus, cpu cores) per task of the preemptor.
    preemptor: Vec<(u32, u64)>,
}

fn gpu(count: u32) -> GpuRequest {
    GpuRequest::Whole {
        count,
        models: Vec::new(),
    }
}

fn case() -> impl Strategy<Value = Case> {
    let group = (
        0i32..4,
        any::<bool>(),
        prop::collection::vec((1u32..3, 1u64..9, 0usize..3), 1..4),
        1u32..4,
    );
    (
        1usize..4,
        prop::sample::select(vec![2u32, 4]),
        prop::collection::vec(group, 1..6),
        prop::collection::vec((1u32..5, 1u64..9), 1..3),
    )
        .prop_map(|(nodes, gpn, groups, preemptor)| {
            // Keep only tasks that fit where they are said to run, and at
            // most ten running tasks in all (the brute force is 2^n).
            let mut left_gpu = vec![gpn; nodes];
            let mut left_cpu = vec![16u64; nodes];
            let mut total = 0;
            let mut running = Vec::new();
            for (priority, unpreemptable, tasks, min) in groups {
                let mut kept = Vec::new();
                for (g, c, n) in tasks {
                    let n = n % nodes;
                    if total < 10 && left_gpu[n] >= g && left_cpu[n] >= c {
                        left_gpu[n] -= g;
                        left_cpu[n] -= c;
                        total += 1;
                        kept.push((g, c, n));
                    }
                }
                if kept.is_empty() {
                    continue;
                }
                let min_member = min.min(kept.len() as u32);
                running.push(Running {
                    priority,
                    min_member,
                    // One group in four cannot be preempted.
                    preemptable: !(unpreemptable && priority == 3),
                    tasks: kept,
                });
            }
            let preemptor = preemptor
                .into_iter()
                .map(|(g, c)| (g.min(gpn), c))
                .collect();
            Case {
                nodes,
                gpus_per_node: gpn,
                running,
                preemptor,
            }
        })
}

/// The snapshot, leaving out the running tasks in `gone` (by (group, task)).
fn snapshot(c: &Case, gone: &BTreeSet<(usize, usize)>) -> Snapshot {
    let mut snap = Snapshot::default();
    for i in 0..c.nodes {
        let mut n = Node::new(
            format!("n{i}"),
            Resources::new(16_000, 64 << 30)
                .with_gpu_milli(u64::from(c.gpus_per_node) * 1000)
                .with_pods(110),
        );
        n.gpus = (0..c.gpus_per_node)
            .map(|g| GpuDevice::new(g, "gpu", 16 << 30))
            .collect();
        snap.nodes.push(n);
    }
    snap.queues.push(Queue::new("q"));
    for (gi, r) in c.running.iter().enumerate() {
        let mut g = PodGroup::new(format!("run{gi}"), "q", r.min_member);
        g.priority = r.priority;
        g.creation = gi as u64;
        g.preemptable = r.preemptable;
        for (ti, &(gpus, cpu, node)) in r.tasks.iter().enumerate() {
            if gone.contains(&(gi, ti)) {
                continue;
            }
            let mut t = Task::new(format!("t{ti}"), Resources::new(cpu * 1000, 1 << 30))
                .with_gpu(gpu(gpus));
            t.node = Some(format!("n{node}"));
            g.tasks.push(t);
        }
        if !g.tasks.is_empty() {
            g.min_member = g.min_member.min(g.tasks.len() as u32);
            snap.groups.push(g);
        }
    }
    let mut p = PodGroup::new("preemptor", "q", c.preemptor.len() as u32);
    p.priority = 10;
    p.creation = 100;
    for (ti, &(gpus, cpu)) in c.preemptor.iter().enumerate() {
        p.tasks.push(
            Task::new(format!("p{ti}"), Resources::new(cpu * 1000, 1 << 30)).with_gpu(gpu(gpus)),
        );
    }
    snap.groups.push(p);
    snap
}

fn config(actions: &[&str]) -> Config {
    Config::from_names(actions, &[vec!["priority", "gang"], vec!["predicates"]]).unwrap()
}

/// (count, priorities highest first, excess) of evicting `set`.
fn key(c: &Case, set: &BTreeSet<(usize, usize)>) -> (usize, Vec<i32>, u64) {
    let mut prios: Vec<i32> = set.iter().map(|&(g, _)| c.running[g].priority).collect();
    prios.sort_unstable_by(|a, b| b.cmp(a));
    // Freed beyond the preemptor's request, in millionths of the cluster.
    let (mut fg, mut fc, mut fm) = (0u64, 0u64, 0u64);
    for &(g, t) in set {
        let (gpus, cpu, _) = c.running[g].tasks[t];
        fg += u64::from(gpus) * 1000;
        fc += cpu * 1000;
        fm += 1 << 30;
    }
    let (ng, nc, nm) = c.preemptor.iter().fold((0u64, 0u64, 0u64), |a, &(g, cpu)| {
        (a.0 + u64::from(g) * 1000, a.1 + cpu * 1000, a.2 + (1 << 30))
    });
    let n = c.nodes as u64;
    let part = |f: u64, need: u64, total: u64| {
        (f.saturating_sub(need) as u128 * 1_000_000 / total as u128) as u64
    };
    let excess = part(fc, nc, 16_000 * n)
        + part(fm, nm, (64u64 << 30) * n)
        + part(fg, ng, u64::from(c.gpus_per_node) * 1000 * n);
    (set.len(), prios, excess)
}

/// Whether `set` respects the gang rule: each group keeps at least
/// `min_member` running tasks, or loses all of them.
fn valid(c: &Case, set: &BTreeSet<(usize, usize)>) -> bool {
    c.running.iter().enumerate().all(|(g, r)| {
        let k = set.iter().filter(|x| x.0 == g).count();
        k == 0
            || (r.preemptable && (r.tasks.len() - k >= r.min_member as usize || k == r.tasks.len()))
    })
}

fn makes_room(c: &Case, set: &BTreeSet<(usize, usize)>) -> bool {
    let plan = tessera_sched::schedule(&snapshot(c, set), &config(&["allocate"]));
    plan.bindings
        .iter()
        .filter(|b| b.task.group == "preemptor")
        .count()
        == c.preemptor.len()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn victim_sets_are_minimal(c in case()) {
        let all: Vec<(usize, usize)> = c
            .running
            .iter()
            .enumerate()
            .flat_map(|(g, r)| (0..r.tasks.len()).map(move |t| (g, t)))
            .collect();
        let mut best: Option<(usize, Vec<i32>, u64)> = None;
        for mask in 0u32..(1 << all.len()) {
            let set: BTreeSet<(usize, usize)> = (0..all.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| all[i])
                .collect();
            if !valid(&c, &set) || !makes_room(&c, &set) {
                continue;
            }
            let k = key(&c, &set);
            if best.as_ref().is_none_or(|b| k < *b) {
                best = Some(k);
            }
        }
        let plan = tessera_sched::schedule(&snapshot(&c, &BTreeSet::new()), &config(&["allocate", "preempt"]));
        let evicted: BTreeSet<(usize, usize)> = plan
            .evictions
            .iter()
            .map(|e| {
                let g: usize = e.task.group.trim_start_matches("run").parse().unwrap();
                let t: usize = e.task.task.trim_start_matches('t').parse().unwrap();
                (g, t)
            })
            .collect();
        let bound = plan.bindings.iter().filter(|b| b.task.group == "preemptor").count();
        match best {
            None => {
                prop_assert!(evicted.is_empty(), "no set makes room, yet the plan evicts {evicted:?}");
                prop_assert_eq!(bound, 0);
            }
            Some(best) => {
                prop_assert_eq!(bound, c.preemptor.len(), "a set makes room ({:?}) but the preemptor was not placed; plan:\n{}", best, plan);
                prop_assert!(valid(&c, &evicted), "the plan breaks a gang: {evicted:?}");
                prop_assert_eq!(key(&c, &evicted), best, "plan:\n{}", plan);
            }
        }
    }
}
