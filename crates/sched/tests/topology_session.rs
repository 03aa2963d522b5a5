//! Topology constraints through whole scheduling sessions: random 8-GPU nodes
//! (NVLink domains of 8, 4 or 2 GPUs or none; PCIe roots by pairs or none; two
//! racks under one spine), running tasks on recorded GPUs, and pending groups
//! with random GPU counts, GPU topology (NVLink / PCIe, hard or soft), network
//! tiers (node, rack, spine; hard or soft) and priorities, under the default
//! configuration and with the `reservation` plugin. In every plan: no GPU is
//! given twice, hard GPU constraints hold for every binding, a gang with a hard
//! network tier sits in one domain of that tier, and no lower-priority task of
//! another group is bound on GPUs a reservation holds.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tessera_model::{
    GpuDevice, GpuRequest, GpuScope, GpuTopology, NetworkTier, Node, PodGroup, Queue, Resources,
    Snapshot, Strength, Task,
};
use tessera_sched::{Config, PluginName};

#[derive(Debug, Clone)]
struct GenNode {
    nvlink: u32,
    pcie: bool,
    busy: Vec<bool>,
}

#[derive(Debug, Clone)]
struct GenGroup {
    tasks: Vec<(u32, u8)>,
    tier: u8,
    prio: i32,
    training: bool,
}

fn gen_node() -> impl Strategy<Value = GenNode> {
    (
        prop::sample::select(vec![0u32, 2, 4, 8]),
        any::<bool>(),
        proptest::collection::vec(prop::bool::weighted(0.3), 8),
    )
        .prop_map(|(nvlink, pcie, busy)| GenNode { nvlink, pcie, busy })
}

fn gen_group() -> impl Strategy<Value = GenGroup> {
    (
        proptest::collection::vec((1u32..=8, 0u8..5), 1..4),
        0u8..7,
        0i32..3,
        any::<bool>(),
    )
        .prop_map(|(tasks, tier, prio, training)| GenGroup {
            tasks,
            tier,
            prio,
            training,
        })
}

fn topo(code: u8) -> Option<GpuTopology> {
    let (scope, strength) = match code {
        1 => (GpuScope::NvlinkDomain, Strength::Hard),
        2 => (GpuScope::NvlinkDomain, Strength::Soft),
        3 => (GpuScope::PcieRoot, Strength::Hard),
        4 => (GpuScope::PcieRoot, Strength::Soft),
        _ => return None,
    };
    Some(GpuTopology { scope, strength })
}

fn tier(code: u8) -> Option<NetworkTier> {
    let (tier, strength) = match code {
        1 => (0, Strength::Hard),
        2 => (1, Strength::Hard),
        3 => (1, Strength::Soft),
        4 => (2, Strength::Hard),
        _ => return None,
    };
    Some(NetworkTier { tier, strength })
}

fn build(nodes: Vec<GenNode>, groups: Vec<GenGroup>) -> Snapshot {
    let mut snap = Snapshot::default();
    snap.queues.push(Queue::new("q"));
    let mut running = PodGroup::new("running", "q", 1);
    running.preemptable = false;
    for (ni, g) in nodes.iter().enumerate() {
        let name = format!("n{ni}");
        let mut n = Node::new(
            name.clone(),
            Resources::new(64_000, 1 << 40)
                .with_gpu_milli(8000)
                .with_pods(110),
        );
        n.network = vec![format!("rack-{}", ni % 2), "spine-0".into()];
        n.gpus = (0..8)
            .map(|i| {
                let mut d = GpuDevice::new(i, "H100-80GB", 80 << 30);
                d.nvlink_domain = i.checked_div(g.nvlink);
                if g.pcie {
                    d.pcie_root = Some(format!("p{}", i / 2));
                }
                d
            })
            .collect();
        for (i, b) in g.busy.iter().enumerate() {
            if *b {
                let mut t = Task::new(format!("{name}-{i}"), Resources::new(100, 1 << 20))
                    .with_gpu(GpuRequest::Whole {
                        count: 1,
                        models: vec![],
                    });
                t.node = Some(name.clone());
                t.gpu_indices = vec![i as u32];
                running.tasks.push(t);
            }
        }
        snap.nodes.push(n);
    }
    if !running.tasks.is_empty() {
        snap.groups.push(running);
    }
    for (k, g) in groups.into_iter().enumerate() {
        let mut pg = PodGroup::new(format!("g{k}"), "q", g.tasks.len() as u32);
        pg.priority = g.prio;
        pg.creation = k as u64;
        pg.network_topology = tier(g.tier);
        if g.training {
            pg.kind = tessera_model::GroupKind::Training;
        }
        for (i, (count, t)) in g.tasks.into_iter().enumerate() {
            let mut task = Task::new(format!("t{i}"), Resources::new(100, 1 << 20)).with_gpu(
                GpuRequest::Whole {
                    count,
                    models: vec![],
                },
            );
            task.topology = topo(t);
            pg.tasks.push(task);
        }
        snap.groups.push(pg);
    }
    snap
}

fn cluster() -> impl Strategy<Value = Snapshot> {
    (
        proptest::collection::vec(gen_node(), 1..5),
        proptest::collection::vec(gen_group(), 1..8),
    )
        .prop_map(|(n, g)| build(n, g))
}

fn check(snap: &Snapshot, cfg: &Config) -> Result<(), TestCaseError> {
    let plan = tessera_sched::schedule(snap, cfg);
    prop_assert_eq!(&plan, &tessera_sched::schedule(snap, cfg));
    let node = |n: &str| snap.nodes.iter().find(|x| x.name == n).unwrap();
    let group = |g: &str| snap.groups.iter().find(|x| x.name == g).unwrap();
    // GPUs held: running tasks (none is evicted: not preemptable), then bindings.
    let mut held: BTreeSet<(String, u32)> = BTreeSet::new();
    for g in &snap.groups {
        for t in &g.tasks {
            if let Some(n) = &t.node {
                for i in &t.gpu_indices {
                    held.insert((n.clone(), *i));
                }
            }
        }
    }
    prop_assert!(plan.evictions.is_empty());
    let mut gang_domains: BTreeMap<String, BTreeSet<Option<String>>> = BTreeMap::new();
    for b in &plan.bindings {
        let pg = group(&b.task.group);
        let t = pg.tasks.iter().find(|t| t.name == b.task.task).unwrap();
        prop_assert_eq!(b.gpus.len() as u32, t.gpu.whole());
        for i in &b.gpus {
            prop_assert!(
                held.insert((b.node.clone(), *i)),
                "GPU {} on {} given twice",
                i,
                b.node
            );
        }
        let n = node(&b.node);
        if let Some(GpuTopology {
            scope,
            strength: Strength::Hard,
        }) = t.topology
        {
            let keys: BTreeSet<Option<String>> = b
                .gpus
                .iter()
                .map(|i| {
                    let d = &n.gpus[*i as usize];
                    match scope {
                        GpuScope::NvlinkDomain => d.nvlink_domain.map(|x| x.to_string()),
                        GpuScope::PcieRoot => d.pcie_root.clone(),
                        GpuScope::Numa => d.numa.map(|x| x.to_string()),
                    }
                    .or(Some(format!("alone-{i}")))
                })
                .collect();
            prop_assert_eq!(
                keys.len(),
                1,
                "{} spans {:?} under a hard {:?} constraint",
                b.task,
                keys,
                scope
            );
        }
        if let Some(nt) = pg.network_topology {
            gang_domains
                .entry(pg.name.clone())
                .or_default()
                .insert(nt.domain_of(&n.name, &n.network).map(str::to_string));
        }
        for r in &plan.reservations {
            if r.node != b.node || r.group == pg.name {
                continue;
            }
            let holder = group(&r.group);
            if t.priority.unwrap_or(pg.priority) >= holder.priority {
                continue;
            }
            prop_assert!(
                !r.gpus.is_empty() && b.gpus.iter().all(|i| !r.gpus.contains(i)),
                "{} (priority {}) bound on GPUs {:?} of {} held for {}",
                b.task,
                pg.priority,
                b.gpus,
                b.node,
                r.group
            );
        }
    }
    for (g, doms) in gang_domains {
        let nt = group(&g).network_topology.unwrap();
        if nt.strength == Strength::Hard {
            prop_assert!(
                doms.len() == 1 && !doms.contains(&None),
                "gang {} spans {:?} at tier {}",
                g,
                doms,
                nt.tier
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn topology_constraints_hold(snap in cluster()) {
        check(&snap, &Config::default())?;
        let mut cfg = Config::default();
        cfg.tiers[1].push(PluginName::Reservation);
        check(&snap, &cfg)?;
    }
}
