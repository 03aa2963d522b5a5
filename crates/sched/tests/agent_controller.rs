//! The shard controller's policy chain, case by case: one line per case, read as
//! data, each with the chain's expected proposal after every policy.

use tessera_sched::agent::{ControllerState, Demand, ShardLoad, decide, default_policies};

/// `name | agent nodes | allocated cores | pending cores | now s | last change s |
/// proposals after allocation_rate, node_count, warm_up, max_step`
/// Node: 16 cores. Default chain for 100 nodes: rate 0.5..0.85 -> 0.7, 1..100
/// nodes, 5 s warm-up, 8 nodes per round.
const CASES: &str = "
in range, no change        | 10 | 100 |   0 | 60 | 0  | 10 10 10 10
over range, grow to target | 10 | 150 |  10 | 60 | 0  | 15 15 15 15
far over, step-limited     | 10 | 150 | 500 | 60 | 0  | 59 59 59 18
under range, shrink        | 10 |  20 |   0 | 60 | 0  |  2  2  2  2
shrink held by warm-up     | 10 |  20 |   0 | 60 | 58 |  2  2 10 10
grow allowed in warm-up    | 10 | 150 |  10 | 60 | 58 | 15 15 15 15
idle clamps to min 1       |  3 |   0 |   0 | 60 | 0  |  0  1  1  1
empty shard, demand        |  0 |   0 |  20 | 60 | 0  |  2  2  2  2
above max clamps           | 99 |2000 |   0 | 60 | 0  |179 100 100 100
";

#[test]
fn controller_cases() {
    let pols = default_policies(100);
    let mut failures = Vec::new();
    for line in CASES.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(f.len(), 7, "malformed case: {line}");
        let num = |i: usize| {
            f[i].parse::<u64>()
                .unwrap_or_else(|_| panic!("case {:?}: field {i} {:?}", f[0], f[i]))
        };
        let load = ShardLoad {
            agent_nodes: num(1) as usize,
            node_capacity: Demand {
                cpu_milli: 16_000,
                memory: 0,
                gpu_milli: 0,
                pods: 0,
            },
            agent_allocated: Demand::new(num(2) * 1000, 0),
            agent_pending: Demand::new(num(3) * 1000, 0),
        };
        let last = num(5);
        let st = ControllerState {
            started_ns: 0,
            last_change_ns: (last > 0).then_some(last * 1_000_000_000),
        };
        let d = decide(&pols, &load, &st, num(4) * 1_000_000_000);
        let got: Vec<usize> = d.steps.iter().map(|s| s.proposal).collect();
        let want: Vec<usize> = f[6]
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        if got != want {
            failures.push(format!("{}: want {want:?}, got {got:?}", f[0]));
        }
        assert_eq!(d.desired, *got.last().unwrap());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
