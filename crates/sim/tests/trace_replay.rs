//! The replay protocol on the repository's copy of the default trace.

use std::path::PathBuf;

use tessera_sched::gpu::Policy;
use tessera_sim::replay::{self, ReplayConfig, SplitMix64};
use tessera_sim::trace;

fn prepared() -> replay::Prepared {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/alibaba-gpu-v2023");
    let nodes = trace::load_nodes(&data.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = trace::load_pods(&data.join("openb_pod_list_default.csv")).unwrap();
    replay::prepare(&nodes, &pods, &ReplayConfig::default()).unwrap()
}

#[test]
fn inflation_reaches_the_target_and_keeps_every_original_pod() {
    let prep = prepared();
    assert_eq!(prep.total_milli, 6_212_000);
    let mut rng = SplitMix64::new(42);
    let order = replay::arrival_order(&prep, 1.3, &mut rng);
    let arrived: u64 = order.iter().map(|&i| prep.pods[i].total_milli()).sum();
    let target = 1.3 * 6_212_000.0;
    assert!(arrived as f64 <= target + 8000.0, "{arrived}");
    assert!(arrived as f64 > target - 1000.0, "{arrived}");
    // The original pods come first (shuffled), each exactly once.
    let mut first: Vec<usize> = order[..prep.pods.len()].to_vec();
    first.sort_unstable();
    assert!(first.iter().enumerate().all(|(k, &i)| k == i));
    // The typical workload: 35 shapes cover 95 % of the default trace.
    assert_eq!(prep.workload.pods().len(), 35);
    let total: f64 = prep.workload.pods().iter().map(|t| t.share).sum();
    assert!((total - 1.0).abs() < 1e-9);
}

#[test]
fn a_run_is_deterministic_and_measures_sensible_figures() {
    let prep = prepared();
    let cfg = ReplayConfig::default();
    let a = replay::run_one(&prep, Policy::Random, 7, &cfg);
    let b = replay::run_one(&prep, Policy::Random, 7, &cfg);
    assert_eq!(a.placed, b.placed);
    assert_eq!(a.alloc_at(100), b.alloc_at(100));
    let alloc = a.alloc_at(100).unwrap();
    // Random placement leaves roughly 13-14 % of GPUs unallocated at 100 % arrived.
    assert!((80.0..92.0).contains(&alloc), "{alloc}");
    assert!(a.alloc_at(130).unwrap() >= alloc - 0.5);
    assert!(a.frag_at(90).unwrap() > 0.0);
    // Allocation never exceeds what arrived.
    for (bin, v) in a.bins.iter().enumerate() {
        if v.2 > 0 {
            assert!(v.0 / f64::from(v.2) <= bin as f64 + 0.6, "bin {bin}");
        }
    }
}

#[test]
fn svg_plot_has_one_line_per_policy() {
    let prep = prepared();
    let cfg = ReplayConfig {
        inflate: 1.0,
        ..ReplayConfig::default()
    };
    let sums = replay::run_grid(
        &prep,
        &[Policy::Random, Policy::BestFit],
        &[1],
        &cfg,
        2,
        &|_| {},
    );
    let svg = replay::svg_plot("t <&>", &sums);
    assert!(svg.starts_with("<svg"));
    assert_eq!(svg.matches("<polyline").count(), 2);
    assert!(svg.contains("t &lt;&amp;&gt;"));
    assert!(svg.contains(">random (") && svg.contains(">bestfit ("));
}

#[test]
fn realtime_replay_queues_until_a_departure() {
    let nodes = trace::parse_nodes(
        "n.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,1000,1,T4\n".as_bytes(),
    )
    .unwrap();
    let header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";
    let body = "a,1000,10,1,1000,,LS,Running,0,100,0\n\
                b,1000,10,1,1000,,LS,Running,10,20,\n\
                c,1000,10,1,600,,LS,Running,30,40,\n\
                d,1000,10,2,1000,,LS,Running,5,6,\n";
    let pods = trace::parse_pods("p.csv", format!("{header}{body}").as_bytes()).unwrap();
    let prep = replay::prepare(&nodes, &pods, &ReplayConfig::default()).unwrap();
    for policy in [Policy::Fgd, Policy::BestFit, Policy::Random] {
        let r = replay::run_realtime(&prep, policy, 1).unwrap();
        // a at once; b and c wait for a (b first, then c after b leaves at 110);
        // d (2 GPUs) never fits.
        assert_eq!((r.pods, r.placed, r.immediate), (4, 3, 1), "{policy}");
        assert_eq!(r.delay_max, 90, "{policy}: b waits from 10 to 100");
        assert_eq!(r.delay_p50, 80, "{policy}: delays are [0, 80, 90]");
    }
    let five = trace::parse_pods(
        "m.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,1000\n".as_bytes(),
    )
    .unwrap();
    let prep = replay::prepare(&nodes, &five, &ReplayConfig::default()).unwrap();
    assert!(replay::run_realtime(&prep, Policy::Fgd, 1).is_err());
}

#[test]
fn the_floor_is_below_every_policy_and_tessera_beats_fgd() {
    let prep = prepared();
    let cfg = ReplayConfig::default();
    let seed = 42;
    let floor = replay::floor_at_100(&prep, seed, cfg.inflate);
    // The default trace's shares above half a GPU leave about 3 % that only
    // small shares can fill.
    assert!(floor > 2.0 && floor < 4.0, "{floor}");
    let fgd = 100.0
        - replay::run_one(&prep, Policy::Fgd, seed, &cfg)
            .alloc_at(100)
            .unwrap();
    let ours = 100.0
        - replay::run_one(&prep, Policy::Tessera, seed, &cfg)
            .alloc_at(100)
            .unwrap();
    // The bin at 100 % averages arrivals within half a percent of it.
    assert!(floor <= ours + 0.5, "floor {floor} above tessera {ours}");
    assert!(ours < fgd, "tessera {ours} is not below fgd {fgd}");
}
