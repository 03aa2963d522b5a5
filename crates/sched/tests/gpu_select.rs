//! Device selection on a node: NVLink / PCIe / NUMA constraints (a case table),
//! and properties: no GPU is over its compute share or memory, no MIG slice is
//! given twice, hard topology constraints always hold.

use proptest::prelude::*;
use tessera_model::mig::{self, MigInstance, MigLayout};
use tessera_model::topology::{GpuScope, GpuTopology, MigRequest, Strength};
use tessera_model::{GpuDevice, GpuRequest, Node, Resources};
use tessera_sched::gpu::NodeGpus;

/// An 8-GPU node: NVLink domains {0-3} and {4-7}, PCIe roots pairwise, NUMA by half.
fn dgx_like() -> Node {
    let mut n = Node::new("n", Resources::new(64_000, 1 << 40).with_gpu_milli(8000));
    n.gpus = (0..8)
        .map(|i| {
            let mut g = GpuDevice::new(i, "H100-80GB", 80 << 30);
            g.nvlink_domain = Some(i / 4);
            g.pcie_root = Some(format!("pci-{}", i / 2));
            g.numa = Some(i / 4);
            g
        })
        .collect();
    n
}

fn whole(count: u32) -> GpuRequest {
    GpuRequest::Whole {
        count,
        models: vec![],
    }
}

fn hard(scope: GpuScope) -> Option<GpuTopology> {
    Some(GpuTopology {
        scope,
        strength: Strength::Hard,
    })
}

fn soft(scope: GpuScope) -> Option<GpuTopology> {
    Some(GpuTopology {
        scope,
        strength: Strength::Soft,
    })
}

/// (taken GPUs before, request count, constraint, expected GPUs or None)
type Case = (
    &'static [u32],
    u32,
    Option<GpuTopology>,
    Option<&'static [u32]>,
);

#[test]
fn topology_cases() {
    use GpuScope::*;
    let cases: &[Case] = &[
        // Empty node: 4 GPUs fill one NVLink domain.
        (&[], 4, hard(NvlinkDomain), Some(&[0, 1, 2, 3])),
        // GPU 0 taken: the first domain has 3 left, so 4 go to the second.
        (&[0], 4, hard(NvlinkDomain), Some(&[4, 5, 6, 7])),
        // Best fit: 2 GPUs go to the domain with 3 left, keeping 4-7 whole.
        (&[0], 2, hard(NvlinkDomain), Some(&[1, 2])),
        // One GPU taken in each domain: no domain has 4 free.
        (&[0, 4], 4, hard(NvlinkDomain), None),
        // ... soft takes 3 + 1 over two domains.
        (&[0, 4], 4, soft(NvlinkDomain), Some(&[1, 2, 3, 5])),
        // 8 GPUs cannot be in one NVLink domain here, even on an empty node.
        (&[], 8, hard(NvlinkDomain), None),
        (&[], 8, soft(NvlinkDomain), Some(&[0, 1, 2, 3, 4, 5, 6, 7])),
        // PCIe roots hold 2 GPUs each: a pair, the emptiest-fitting root first.
        (&[0, 2], 2, hard(PcieRoot), Some(&[4, 5])),
        (&[0, 2], 1, hard(PcieRoot), Some(&[1])),
        (&[0, 2, 4, 6], 2, hard(PcieRoot), None),
        // NUMA halves.
        (&[0, 1, 2], 2, hard(Numa), Some(&[4, 5])),
        // Not enough GPUs at all.
        (&[0, 1, 2, 3, 4, 5, 6], 2, soft(NvlinkDomain), None),
    ];
    for (k, (taken, count, topo, want)) in cases.iter().enumerate() {
        let mut g = NodeGpus::from_node(&dgx_like());
        assert!(g.assign(&whole(taken.len() as u32), taken), "case {k}");
        let got = g.select_with(&whole(*count), *topo);
        assert_eq!(
            got.as_deref(),
            *want,
            "case {k}: {taken:?} {count} {topo:?}"
        );
    }
}

#[test]
fn default_select_prefers_one_nvlink_domain() {
    let mut g = NodeGpus::from_node(&dgx_like());
    assert!(g.assign(&whole(1), &[0]));
    // Lowest indices would be 1,2,3,4 (two domains); the default keeps one domain.
    let got = g.select(&whole(4)).unwrap();
    assert_eq!(g.domains_spanned(&got, GpuScope::NvlinkDomain), 1);
}

#[test]
fn mig_gpus_serve_only_mig_requests_and_repartition_idle_instances() {
    let mut n = dgx_like();
    n.gpus.truncate(2);
    n.allocatable.gpu_milli = 2000;
    n.gpus[1].mig = Some(MigLayout {
        instances: vec![MigInstance {
            profile: "3g.40gb".into(),
            start: 4,
            in_use: false,
        }],
    });
    let mut g = NodeGpus::from_node(&n);
    assert_eq!(g.whole_free(), 1);
    assert_eq!(g.select(&whole(2)), None);
    let req = |p: &str| MigRequest {
        profile: p.into(),
        models: vec![],
    };
    // 4g.40gb fits at slice 0 next to the idle 3g.
    let c = g.select_mig(&req("4g.40gb")).unwrap();
    assert_eq!((c.gpu, c.start, c.remove_idle.len()), (1, 0, 0));
    assert!(g.assign_mig("4g.40gb", &c));
    // 7g needs the idle 3g destroyed too, but the 4g is in use: no.
    assert_eq!(g.select_mig(&req("7g.80gb")), None);
    // 3g.40gb: the idle 3g at 4 is reused as it is.
    let c = g.select_mig(&req("3g.40gb")).unwrap();
    assert_eq!((c.gpu, c.start, c.create), (1, 4, false));
    assert!(c.remove_idle.is_empty());
    assert!(g.assign_mig("3g.40gb", &c));
    assert!(!g.assign_mig("3g.40gb", &c), "the same instance twice");
    // Once it is idle again, a 2g.20gb has no free start; re-partitioning the
    // idle 3g at 4 gives one.
    g.release_mig(1, "3g.40gb", 4);
    let c = g.select_mig(&req("2g.20gb")).unwrap();
    assert_eq!((c.gpu, c.start, c.create), (1, 4, true));
    assert_eq!(c.remove_idle, vec![("3g.40gb".to_string(), 4)]);
    assert!(g.assign_mig("2g.20gb", &c));
    assert!(!g.assign_mig("2g.20gb", &c), "the same slices twice");
    // Undoing it brings the idle 3g back.
    g.unassign_mig("2g.20gb", &c);
    let c = g.select_mig(&req("3g.40gb")).unwrap();
    assert_eq!((c.gpu, c.start, c.create), (1, 4, false));
    // Unknown profiles and models never get anything.
    assert_eq!(g.select_mig(&req("9g.99gb")), None);
    let t4 = MigRequest {
        profile: "1g.10gb".into(),
        models: vec!["T4".into()],
    };
    assert_eq!(g.select_mig(&t4), None);
}

#[derive(Debug, Clone)]
enum Op {
    Whole(u32, Option<(GpuScope, bool)>),
    Shared(u32, u64),
    Mig(usize),
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let scope = prop_oneof![
        Just(GpuScope::NvlinkDomain),
        Just(GpuScope::PcieRoot),
        Just(GpuScope::Numa)
    ];
    prop_oneof![
        (1u32..=8, proptest::option::of((scope, any::<bool>()))).prop_map(|(c, t)| Op::Whole(c, t)),
        (1u32..1000, 0u64..(90u64 << 30)).prop_map(|(m, b)| Op::Shared(m, b)),
        (0usize..6).prop_map(Op::Mig),
        (0usize..64).prop_map(Op::Release),
    ]
}

enum Held {
    Gpus(GpuRequest, Vec<u32>),
    Mig(u32, String, u8),
}

proptest! {
    #[test]
    fn no_gpu_is_overcommitted_and_no_mig_slice_is_given_twice(
        mig_gpus in proptest::collection::vec(any::<bool>(), 8),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut n = dgx_like();
        for (g, on) in n.gpus.iter_mut().zip(&mig_gpus) {
            if *on {
                g.mig = Some(MigLayout::default());
            }
        }
        let mut g = NodeGpus::from_node(&n);
        let h100 = mig::geometry("H100-80GB").unwrap();
        let mut held: Vec<Held> = Vec::new();
        for o in ops {
            match o {
                Op::Whole(c, t) => {
                    let topo = t.map(|(scope, h)| GpuTopology {
                        scope,
                        strength: if h { Strength::Hard } else { Strength::Soft },
                    });
                    let req = whole(c);
                    if let Some(idx) = g.select_with(&req, topo) {
                        prop_assert_eq!(idx.len(), c as usize);
                        if let Some(GpuTopology { scope, strength: Strength::Hard }) = topo {
                            prop_assert_eq!(g.domains_spanned(&idx, scope), 1);
                        }
                        prop_assert!(g.assign(&req, &idx));
                        held.push(Held::Gpus(req, idx));
                    }
                }
                Op::Shared(milli, memory) => {
                    let req = GpuRequest::Shared { milli, memory, models: vec![] };
                    if let Some(idx) = g.select(&req) {
                        prop_assert!(g.assign(&req, &idx));
                        held.push(Held::Gpus(req, idx));
                    }
                }
                Op::Mig(p) => {
                    let profile = h100.profiles[p].name;
                    let req = MigRequest { profile: profile.into(), models: vec![] };
                    if let Some(c) = g.select_mig(&req) {
                        prop_assert!(g.assign_mig(profile, &c));
                        held.push(Held::Mig(c.gpu, profile.to_string(), c.start));
                    }
                }
                Op::Release(k) => {
                    if !held.is_empty() {
                        match held.remove(k % held.len()) {
                            Held::Gpus(req, idx) => g.release(&req, &idx),
                            Held::Mig(gpu, p, s) => g.release_mig(gpu, &p, s),
                        }
                    }
                }
            }
            // Invariants, recomputed from what is held.
            let mut milli = [0u32; 8];
            let mut mem = [0u64; 8];
            let mut slices = [0u16; 8];
            for h in &held {
                match h {
                    Held::Gpus(req, idx) => {
                        for &i in idx {
                            let (m, b) = match req {
                                GpuRequest::Shared { milli, memory, .. } => (*milli, *memory),
                                _ => (1000, 0),
                            };
                            milli[i as usize] += m;
                            mem[i as usize] += b;
                        }
                    }
                    Held::Mig(gpu, p, s) => {
                        let mask = h100.profile(p).unwrap().mask(*s);
                        prop_assert_eq!(slices[*gpu as usize] & mask, 0, "MIG slice given twice");
                        slices[*gpu as usize] |= mask;
                    }
                }
            }
            for (i, s) in g.slots.iter().enumerate() {
                prop_assert!(milli[i] <= 1000, "GPU {} over its compute share: {}", i, milli[i]);
                prop_assert!(mem[i] <= s.memory, "GPU {} over its memory", i);
                if s.mig.is_some() {
                    prop_assert_eq!(milli[i], 0, "MIG GPU {} handed out as a GPU", i);
                    let occ = h100
                        .check(&MigLayout {
                            instances: s.mig.as_ref().unwrap().instances.iter().map(|(p, st, u)| MigInstance {
                                profile: p.clone(),
                                start: *st,
                                in_use: *u,
                            }).collect(),
                        });
                    prop_assert!(occ.is_ok(), "illegal layout on GPU {}", i);
                } else {
                    prop_assert_eq!(s.free_milli, 1000 - milli[i]);
                    prop_assert_eq!(slices[i], 0);
                }
            }
        }
    }
}

/// A task holds a GPU once: a recorded binding naming one device twice (an
/// inconsistent snapshot) is refused and changes nothing, instead of charging the
/// device twice (which underflowed its free share).
#[test]
fn one_gpu_named_twice_is_not_assigned() {
    use tessera_model::{GpuDevice, GpuRequest, Node, Resources};
    let mut n = Node::new("n", Resources::new(8_000, 1 << 36).with_gpu_milli(4000));
    n.gpus = (0..4).map(|i| GpuDevice::new(i, "T4", 16 << 30)).collect();
    let mut g = tessera_sched::gpu::NodeGpus::from_node(&n);
    let two = GpuRequest::Whole {
        count: 2,
        models: vec![],
    };
    assert!(!g.assign(&two, &[2, 2]));
    assert_eq!(g.whole_free(), 4);
    assert!(g.assign(&two, &[1, 2]));
    assert_eq!(g.whole_free(), 2);
}
