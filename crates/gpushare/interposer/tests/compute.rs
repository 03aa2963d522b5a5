//! Compute time slicing through the interposer on the fake driver's simulated
//! device (fake clock), with this test process as the node's compute monitor.

mod common;

use std::time::Duration;

use common::*;
use tessera_gpushare::fake::{ShareScenario, run_share_scenario};
use tessera_gpushare::region::ComputePolicy;

fn within(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol
}

#[test]
fn saturating_tasks_converge_to_their_shares() {
    let Some(f) = fake_build() else { return };
    let o = run_share_scenario(
        f,
        &interposer(),
        &workdir("shares"),
        &ShareScenario::default(),
    )
    .unwrap();
    assert!(
        within(o.shares[0], 0.3, 0.05) && within(o.shares[1], 0.7, 0.05),
        "{o:?}"
    );
    assert!(o.utilization > 0.9, "work left undone: {o:?}");
    assert!(
        o.throttle_events[0] > 0,
        "the 30% task was never held back: {o:?}"
    );
    // The fake's exact accounting agrees with what NVML (fake) reported.
    let exact: u64 = o.exact_busy_ns.iter().sum();
    let a = o.exact_busy_ns[0] as f64 / exact as f64;
    assert!(within(a, 0.3, 0.05), "exact: {o:?}");
}

/// Three tasks, graph launches found through cuGetProcAddress_v2.
#[test]
fn three_tasks_with_graph_launches_through_get_proc_address() {
    let Some(f) = fake_build() else { return };
    let s = ShareScenario {
        weights: vec![200, 300, 500],
        kind: "graph".into(),
        mode: "p2".into(),
        ticks: 2000,
        ..ShareScenario::default()
    };
    let o = run_share_scenario(f, &interposer(), &workdir("three"), &s).unwrap();
    for (got, want) in o.shares.iter().zip([0.2, 0.3, 0.5]) {
        assert!(within(*got, want, 0.05), "{o:?}");
    }
    assert!(o.utilization > 0.9, "{o:?}");
}

/// Work-conserving: a task alone gets the whole device whatever its share; with
/// the fixed policy it gets its share and no more.
#[test]
fn alone_a_task_gets_the_device_unless_its_policy_is_fixed() {
    let Some(f) = fake_build() else { return };
    let alone = ShareScenario {
        weights: vec![300],
        ticks: 500,
        warmup_ticks: 50,
        ..ShareScenario::default()
    };
    let o = run_share_scenario(f, &interposer(), &workdir("alone"), &alone).unwrap();
    assert!(o.busy_fraction[0] > 0.95, "{o:?}");
    let fixed = ShareScenario {
        policy: ComputePolicy::Fixed,
        ..alone
    };
    let o = run_share_scenario(f, &interposer(), &workdir("fixed"), &fixed).unwrap();
    assert!(within(o.busy_fraction[0], 0.3, 0.05), "{o:?}");
}

/// Every launch entry point is gated, through every lookup path (a task held
/// to 30% by the fixed policy gets 30% whichever way it launches).
#[test]
fn every_launch_entry_point_is_gated() {
    let Some(f) = fake_build() else { return };
    for (kind, mode) in [
        ("kernel", "d"),
        ("kernel", "h"),
        ("kernel", "p"),
        ("kernel", "pt"),
        ("ex", "p2"),
        ("ex", "pt"),
        ("coop", "d"),
        ("coop", "pt"),
        ("graph", "d"),
        ("graph", "pt"),
        ("legacy", "d"),
    ] {
        let s = ShareScenario {
            weights: vec![300],
            policy: ComputePolicy::Fixed,
            kind: kind.into(),
            mode: mode.into(),
            ticks: 400,
            warmup_ticks: 50,
            ..ShareScenario::default()
        };
        let o = run_share_scenario(
            f,
            &interposer(),
            &workdir(&format!("gate-{kind}-{mode}")),
            &s,
        )
        .unwrap();
        assert!(
            within(o.busy_fraction[0], 0.3, 0.05),
            "{kind} via {mode}: {o:?}"
        );
    }
}

/// A task that crashes gives its share back: the survivor gets the device.
#[test]
fn a_crashing_task_releases_its_share() {
    let Some(f) = fake_build() else { return };
    let s = ShareScenario {
        kill: Some((1, 600)),
        ticks: 1200,
        ..ShareScenario::default()
    };
    let o = run_share_scenario(f, &interposer(), &workdir("crash"), &s).unwrap();
    assert!(within(o.shares[0], 0.3, 0.05), "before the crash: {o:?}");
    let after = o.after_kill.as_ref().unwrap();
    assert!(
        after[0] > 0.95,
        "the survivor did not get the device: {o:?}"
    );
}

/// No monitor ticking for a sliced task: launches go ahead, and the interposer
/// says the share is not enforced (and counts it) instead of silently running.
#[test]
fn without_a_monitor_the_share_is_reported_unenforced() {
    let Some(f) = fake_build() else { return };
    // 5000 kernels of 1 ms: 5 s of fake time, past the first tick's grace.
    let dir = workdir("nomonitor");
    let (rp, r) = region(&dir, "nm", 64 * MIB, 300, Duration::ZERO);
    let o = run(f.probe(
        Some(&interposer()),
        Some(&rp),
        None,
        &["init", "launch", "kernel", "5000", "1000000"],
    ));
    assert_eq!(rc(lines(&stdout(&o), "launch")[0]), 0);
    assert!(
        stderr(&o)
            .contains("compute share on device 0 is not enforced: no compute monitor has ticked"),
        "{}",
        stderr(&o)
    );
    assert!(r.usage().devices[0].unenforced_events >= 1);
}

/// A monitor that stops while the task is in debt: launches wait, then go ahead
/// once the monitor is stale, saying so.
#[test]
fn a_stopped_monitor_does_not_hang_the_task() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("stale");
    let (rp, r) = region(&dir, "st", 64 * MIB, 300, Duration::ZERO);
    // The monitor's last word: deep in debt, next tick at 2 ms (fake clock), then silence.
    r.publish_compute(
        0,
        &tessera_gpushare::region::ComputePublish {
            tokens_ns: -1_000_000_000_000,
            allowance_ppm: 300_000,
            rate_ppm: 0,
            busy_ns: 0,
        },
    );
    r.tick(1, 2_000_000, 2_000_000);
    let o = run(f.probe(
        Some(&interposer()),
        Some(&rp),
        None,
        &["init", "launch", "kernel", "10", "1000"],
    ));
    assert_eq!(rc(lines(&stdout(&o), "launch")[0]), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the compute monitor stopped ticking"),
        "{}",
        stderr(&o)
    );
    let u = &r.usage().devices[0];
    assert!(u.throttle_events >= 1 && u.unenforced_events >= 1, "{u:?}");
}
