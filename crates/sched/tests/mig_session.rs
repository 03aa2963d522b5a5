//! MIG through whole scheduling sessions: random MIG layouts (some instances
//! held by running tasks of random priority), random MIG, whole-GPU and
//! fractional tasks, the default configuration (preemption included). The plan,
//! applied step by step to the layouts (evictions free their instances; each
//! binding destroys only idle instances, creates only in free slices, or
//! reuses an idle instance), never gives a slice or an instance twice, never
//! hands a MIG GPU out as a whole or fractional GPU, and leaves every layout
//! legal.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tessera_model::mig::{self, MigInstance, MigLayout};
use tessera_model::{
    GpuDevice, GpuRequest, Node, PodGroup, Queue, Resources, Snapshot, Task, TaskId,
};

const MODEL: &str = "H100-80GB";

/// An instance while the plan is applied: (profile, start, in use).
type Inst = (String, u8, bool);

#[derive(Debug, Clone)]
struct GenGpu {
    mig: bool,
    layout: usize,
    busy: Vec<bool>,
}

fn gen_gpu() -> impl Strategy<Value = GenGpu> {
    (
        any::<bool>(),
        any::<usize>(),
        proptest::collection::vec(any::<bool>(), 8),
    )
        .prop_map(|(mig, layout, busy)| GenGpu { mig, layout, busy })
}

/// (kind 0..6 MIG profile / 6 whole / 7 shared, priority)
fn gen_task() -> impl Strategy<Value = (usize, i32)> {
    (0usize..8, 0i32..3)
}

fn build(nodes: Vec<Vec<GenGpu>>, tasks: Vec<(usize, i32)>) -> Snapshot {
    let geo = mig::geometry(MODEL).unwrap();
    let layouts = geo.all_layouts();
    let mut snap = Snapshot::default();
    snap.queues.push(Queue::new("q"));
    let mut running = PodGroup::new("running", "q", 1);
    for (ni, gpus) in nodes.iter().enumerate() {
        let name = format!("n{ni}");
        let mut n = Node::new(
            name.clone(),
            Resources::new(64_000, 1 << 40)
                .with_gpu_milli(1000 * gpus.len() as u64)
                .with_pods(110),
        );
        n.allocatable.gpu_memory = gpus.len() as u64 * (80 << 30);
        for (gi, g) in gpus.iter().enumerate() {
            let mut d = GpuDevice::new(gi as u32, MODEL, 80 << 30);
            if g.mig {
                let l = &layouts[g.layout % layouts.len()];
                let instances: Vec<MigInstance> = l
                    .iter()
                    .enumerate()
                    .map(|(k, (p, s))| MigInstance {
                        profile: p.to_string(),
                        start: *s,
                        in_use: g.busy[k % 8],
                    })
                    .collect();
                // Busy instances are held by running tasks of random priority.
                for (k, i) in instances.iter().enumerate().filter(|(_, i)| i.in_use) {
                    let mut t = Task::new(format!("{name}-{gi}-{k}"), Resources::new(100, 1 << 20))
                        .with_gpu(GpuRequest::Mig {
                            profile: i.profile.clone(),
                            models: vec![],
                        });
                    t.priority = Some((k % 3) as i32);
                    t.node = Some(name.clone());
                    t.gpu_indices = vec![gi as u32];
                    t.mig_start = Some(i.start);
                    running.tasks.push(t);
                }
                d.mig = Some(MigLayout { instances });
            }
            n.gpus.push(d);
        }
        snap.nodes.push(n);
    }
    if !running.tasks.is_empty() {
        snap.groups.push(running);
    }
    for (k, (kind, prio)) in tasks.into_iter().enumerate() {
        let gpu = match kind {
            0..6 => GpuRequest::Mig {
                profile: mig::geometry(MODEL).unwrap().profiles[kind]
                    .name
                    .to_string(),
                models: vec![],
            },
            6 => GpuRequest::Whole {
                count: 1,
                models: vec![],
            },
            _ => GpuRequest::Shared {
                milli: 300,
                memory: 10 << 30,
                models: vec![],
            },
        };
        let mut g = PodGroup::new(format!("g{k}"), "q", 1);
        g.priority = prio;
        g.creation = k as u64;
        g.tasks
            .push(Task::new("t", Resources::new(100, 1 << 20)).with_gpu(gpu));
        snap.groups.push(g);
    }
    snap
}

fn cluster() -> impl Strategy<Value = Snapshot> {
    (
        proptest::collection::vec(proptest::collection::vec(gen_gpu(), 1..4), 1..4),
        proptest::collection::vec(gen_task(), 1..24),
    )
        .prop_map(|(n, t)| build(n, t))
}

fn task<'a>(snap: &'a Snapshot, id: &TaskId) -> &'a Task {
    snap.groups
        .iter()
        .find(|g| g.name == id.group)
        .and_then(|g| g.tasks.iter().find(|t| t.name == id.task))
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn mig_plans_apply_legally(snap in cluster()) {
        let geo = mig::geometry(MODEL).unwrap();
        let plan = tessera_sched::schedule(&snap, &tessera_sched::Config::default());
        prop_assert_eq!(&plan, &tessera_sched::schedule(&snap, &tessera_sched::Config::default()));
        // (node, gpu) -> instances (profile, start, in use)
        let mut layouts: BTreeMap<(String, u32), Vec<Inst>> = BTreeMap::new();
        for n in &snap.nodes {
            for g in &n.gpus {
                if let Some(l) = &g.mig {
                    layouts.insert(
                        (n.name.clone(), g.index),
                        l.instances.iter().map(|i| (i.profile.clone(), i.start, i.in_use)).collect(),
                    );
                }
            }
        }
        for e in &plan.evictions {
            let t = task(&snap, &e.task);
            if let (GpuRequest::Mig { profile, .. }, Some(s)) = (&t.gpu, t.mig_start) {
                let l = layouts.get_mut(&(e.node.clone(), t.gpu_indices[0])).unwrap();
                let i = l.iter_mut().find(|i| &i.0 == profile && i.1 == s && i.2);
                prop_assert!(i.is_some(), "evicted {} holds no instance", e.task);
                i.unwrap().2 = false;
            }
        }
        for b in &plan.bindings {
            let t = task(&snap, &b.task);
            match (&t.gpu, &b.mig) {
                (GpuRequest::Mig { profile, .. }, Some(m)) => {
                    prop_assert_eq!(b.gpus.len(), 1);
                    prop_assert_eq!(&m.profile, profile);
                    let l = layouts.get_mut(&(b.node.clone(), b.gpus[0]));
                    prop_assert!(l.is_some(), "{} got MIG on a GPU without MIG", b.task);
                    let l = l.unwrap();
                    for d in &m.destroy {
                        let k = l.iter().position(|i| i.0 == d.profile && i.1 == d.start);
                        prop_assert!(k.is_some(), "{}: destroys a missing instance {}", b.task, d);
                        let k = k.unwrap();
                        prop_assert!(!l[k].2, "{}: destroys an instance in use", b.task);
                        l.remove(k);
                    }
                    if m.create {
                        let occ = l.iter().try_fold(Default::default(), |o, i| geo.add(o, &i.0, i.1));
                        prop_assert!(occ.is_ok());
                        prop_assert!(geo.add(occ.unwrap(), profile, m.start).is_ok(), "{}: creates on taken slices", b.task);
                        l.push((profile.clone(), m.start, true));
                    } else {
                        let i = l.iter_mut().find(|i| &i.0 == profile && i.1 == m.start && !i.2);
                        prop_assert!(i.is_some(), "{}: reuses an instance that is not idle", b.task);
                        i.unwrap().2 = true;
                    }
                }
                (GpuRequest::Mig { .. }, None) => prop_assert!(false, "{} MIG binding without its instance", b.task),
                (_, Some(_)) => prop_assert!(false, "{} non-MIG binding with a MIG step", b.task),
                (_, None) => {
                    for g in &b.gpus {
                        prop_assert!(
                            !layouts.contains_key(&(b.node.clone(), *g)),
                            "{} got MIG GPU {} as a GPU", b.task, g
                        );
                    }
                }
            }
        }
        for ((n, g), l) in &layouts {
            let layout = MigLayout {
                instances: l.iter().map(|(p, s, u)| MigInstance { profile: p.clone(), start: *s, in_use: *u }).collect(),
            };
            prop_assert!(geo.check(&layout).is_ok(), "{n} GPU {g}: illegal layout {:?}", l);
        }
    }
}
