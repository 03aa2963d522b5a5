//! Placement policies: the fast fragmentation formula agrees with the textbook
//! one; no policy places a task where it does not fit; ties follow the rank order.

use proptest::prelude::*;
use tessera_sched::gpu::frag::frag_reference;
use tessera_sched::gpu::{
    GpuCluster, NodeState, PodShape, Policy, RandomSource, TypicalPod, Workload,
};

struct Lcg(u64);
impl RandomSource for Lcg {
    fn below(&mut self, n: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % u64::from(n)) as u32
    }
}

fn shape() -> impl Strategy<Value = PodShape> {
    (
        0i64..40_000,
        0i64..200_000,
        prop_oneof![Just(0u32), Just(1), Just(2), Just(4), Just(8)],
        1u32..=1000,
        0u64..4,
    )
        .prop_map(|(cpu, mem, num, milli, models)| {
            let milli = if num == 0 {
                0
            } else if num > 1 {
                1000
            } else {
                milli
            };
            PodShape {
                cpu: cpu.max(100),
                cpu_req: cpu,
                mem,
                num_gpu: num,
                milli,
                models,
            }
        })
}

fn node() -> impl Strategy<Value = NodeState> {
    (
        8_000i64..128_000,
        10_000i64..1_000_000,
        prop_oneof![Just(0u32), Just(1), Just(2), Just(4), Just(8)],
        0u16..2,
    )
        .prop_map(|(cpu, mem, gpus, model)| NodeState::new(cpu, mem, gpus, model))
}

proptest! {
    #[test]
    fn fast_frag_matches_the_definition(
        pods in proptest::collection::vec((shape(), 1u32..100), 1..20),
        n in node(),
        used in proptest::collection::vec(0u32..=1000, 8),
        cpu_used in 0i64..100_000,
    ) {
        let total: f64 = pods.iter().map(|p| f64::from(p.1)).sum();
        let typical: Vec<TypicalPod> = pods.iter().map(|(s, c)| TypicalPod { shape: s.clone(), share: f64::from(*c) / total }).collect();
        let w = Workload::new(typical.clone());
        let mut n = n;
        for (g, u) in n.gpu_left.iter_mut().zip(&used) { *g -= u; }
        n.cpu_left = (n.cpu_left - cpu_used).max(0);
        let fast = w.frag(&n);
        let slow = frag_reference(&typical, &n);
        prop_assert!((fast - slow).abs() < 1e-6 * (1.0 + slow.abs()), "{} vs {}", fast, slow);
    }

    #[test]
    fn no_policy_overcommits_a_node(
        nodes in proptest::collection::vec(node(), 1..12),
        pods in proptest::collection::vec(shape(), 1..80),
        policy in 0usize..Policy::ALL.len(),
        seed in any::<u64>(),
    ) {
        let policy = Policy::ALL[policy];
        let typical: Vec<TypicalPod> = pods.iter().take(10).map(|s| TypicalPod { shape: s.clone(), share: 0.1 }).collect();
        let caps: Vec<(i64, i64, usize)> = nodes.iter().map(|n| (n.cpu_cap, n.mem_left, n.gpu_left.len())).collect();
        let mut c = GpuCluster::new(nodes, Workload::new(typical));
        let mut rng = Lcg(seed);
        let mut placed: Vec<(PodShape, usize, Vec<u32>)> = Vec::new();
        for p in &pods {
            if let Some(pl) = c.schedule(policy, p, &mut rng) {
                prop_assert_eq!(pl.gpus.len(), if p.wants_gpu() { p.num_gpu as usize } else { 0 });
                placed.push((p.clone(), pl.node, pl.gpus));
            } else {
                // Nothing fits: every node must really refuse it.
                prop_assert!(c.nodes().iter().all(|n| !n.fits(p)));
            }
        }
        for (i, (cpu, mem, gpus)) in caps.iter().enumerate() {
            let mine: Vec<&(PodShape, usize, Vec<u32>)> = placed.iter().filter(|x| x.1 == i).collect();
            let cpu_used: i64 = mine.iter().map(|x| x.0.cpu_req).sum();
            let mem_used: i64 = mine.iter().map(|x| x.0.mem).sum();
            prop_assert!(cpu_used <= *cpu && mem_used <= *mem);
            for g in 0..*gpus {
                let milli: u32 = mine.iter().filter(|x| x.2.contains(&(g as u32))).map(|x| x.0.milli).sum();
                prop_assert!(milli <= 1000, "node {} gpu {} has {}", i, g, milli);
                prop_assert_eq!(c.nodes()[i].gpu_left[g], 1000 - milli);
            }
        }
        let used: u64 = placed.iter().map(|x| x.0.total_milli()).sum();
        prop_assert_eq!(c.used_milli(), used);
    }
}

#[test]
fn ties_go_to_the_lowest_rank() {
    let nodes = vec![NodeState::new(64_000, 1 << 20, 8, 0); 4];
    let pod = PodShape {
        cpu: 1000,
        cpu_req: 1000,
        mem: 1,
        num_gpu: 1,
        milli: 1000,
        models: 0,
    };
    let mut c = GpuCluster::new(nodes, Workload::default());
    c.set_tie_order(vec![3, 1, 0, 2]);
    let mut rng = Lcg(1);
    for policy in [
        Policy::BestFit,
        Policy::Packing,
        Policy::DotProd,
        Policy::Fgd,
    ] {
        let p = c.choose(policy, &pod, &mut rng).unwrap();
        assert_eq!(p.node, 2, "{policy}");
    }
    // Packing then keeps filling node 2, where a GPU is now in use... for sharing pods.
    let share = PodShape {
        milli: 300,
        ..pod.clone()
    };
    let p = c.schedule(Policy::Packing, &share, &mut rng).unwrap();
    assert_eq!(p.node, 2);
    let p2 = c.choose(Policy::Packing, &share, &mut rng).unwrap();
    assert_eq!(
        (p2.node, p2.gpus.clone()),
        (2, p.gpus.clone()),
        "same shared GPU"
    );
    assert_eq!("fgd-mem".parse::<Policy>(), Ok(Policy::FgdMem));
    assert!(
        "nope"
            .parse::<Policy>()
            .unwrap_err()
            .contains("known: random")
    );
}
