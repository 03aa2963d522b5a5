//! The scaling signal's properties (`route::recommend_replicas`), over
//! generated pool states.

use proptest::prelude::*;
use tessera_gateway::route::{SCALE_TARGET_PERMILLE, ScaleInput, recommend_replicas};

fn input() -> impl Strategy<Value = ScaleInput> {
    (
        0u32..64,
        0u64..5000,
        0u64..5000,
        0u64..500,
        1u32..256,
        0u64..64_000,
    )
        .prop_map(
            |(replicas, in_flight, queued, engine_waiting, per_replica, kv)| ScaleInput {
                replicas,
                in_flight,
                queued,
                engine_waiting,
                per_replica,
                kv_used_permille: kv.min(u64::from(replicas) * 1000),
            },
        )
}

proptest! {
    #[test]
    fn never_below_one(x in input()) {
        prop_assert!(recommend_replicas(&x).replicas >= 1);
    }

    #[test]
    fn never_lower_when_load_grows(x in input(), dq in 0u64..1000, df in 0u64..1000, dk in 0u64..4000) {
        let base = recommend_replicas(&x).replicas;
        for y in [
            ScaleInput { queued: x.queued + dq, ..x },
            ScaleInput { in_flight: x.in_flight + df, ..x },
            ScaleInput { engine_waiting: x.engine_waiting + dq, ..x },
            ScaleInput { kv_used_permille: x.kv_used_permille + dk, ..x },
        ] {
            prop_assert!(recommend_replicas(&y).replicas >= base, "{x:?} -> {y:?}");
        }
    }

    #[test]
    fn above_the_current_count_while_anything_waits(x in input()) {
        prop_assume!(x.queued + x.engine_waiting > 0);
        prop_assert!(recommend_replicas(&x).replicas > x.replicas);
    }

    #[test]
    fn no_growth_when_nothing_waits_and_use_is_under_target(x in input()) {
        prop_assume!(x.replicas >= 1);
        let cap = u64::from(x.replicas) * u64::from(x.per_replica) * SCALE_TARGET_PERMILLE / 1000;
        let x = ScaleInput {
            queued: 0,
            engine_waiting: 0,
            in_flight: x.in_flight.min(cap),
            kv_used_permille: x.kv_used_permille.min(u64::from(x.replicas) * SCALE_TARGET_PERMILLE),
            ..x
        };
        prop_assert!(recommend_replicas(&x).replicas <= x.replicas, "{x:?}");
    }

    #[test]
    fn enough_for_the_load_at_the_target(x in input()) {
        let a = recommend_replicas(&x);
        let demand = x.in_flight + x.queued + x.engine_waiting;
        // a.replicas replicas at 80 % of max_in_flight hold the demand.
        prop_assert!(
            u64::from(a.replicas) * u64::from(x.per_replica) * SCALE_TARGET_PERMILLE >= demand * 1000,
            "{x:?} -> {a:?}"
        );
        prop_assert!(u64::from(a.replicas) * SCALE_TARGET_PERMILLE >= x.kv_used_permille);
    }
}

#[test]
fn examples() {
    // 2 replicas of 32: 40 in flight, nothing waiting: 40 / 25.6 -> 2.
    let x = ScaleInput {
        replicas: 2,
        in_flight: 40,
        per_replica: 32,
        ..ScaleInput::default()
    };
    assert_eq!(recommend_replicas(&x).replicas, 2);
    // 64 in flight and 30 waiting at the gateway: 94 / 25.6 -> 4.
    let y = ScaleInput {
        in_flight: 64,
        queued: 30,
        ..x
    };
    let a = recommend_replicas(&y);
    assert_eq!((a.replicas, a.by_load, a.waiting), (4, 4, 30));
    // Idle pool of 4 with caches 90 % full: the KV cache asks for 5.
    let z = ScaleInput {
        replicas: 4,
        per_replica: 32,
        kv_used_permille: 3600,
        ..ScaleInput::default()
    };
    let a = recommend_replicas(&z);
    assert_eq!((a.replicas, a.by_kv_cache), (5, 5));
}
