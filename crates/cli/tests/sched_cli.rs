//! `tessera sched plan` and `tessera bench sched`, run as a user would run them.

use std::path::Path;
use std::process::Command;

fn tessera(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .expect("run tessera");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn plan_prints_the_plan() {
    let (code, out, _) = tessera(&[
        "sched",
        "plan",
        "crates/sim/tests/scenarios/preempt_lowest_priority.yaml",
    ]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "evict   low-big/t on n-0: preempted by urgent (priority 100 > 1)\n\
         bind    urgent/t -> n-0 gpus [0,1,2,3] (after evictions)\n"
    );
}

#[test]
fn plan_json_is_one_object() {
    let (code, out, _) = tessera(&[
        "sched",
        "plan",
        "--json",
        "crates/sim/tests/scenarios/gang_all_or_nothing.yaml",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["bindings"].as_array().unwrap().len(), 2);
    assert_eq!(v["pending"][0]["group"], "big");
    assert_eq!(v["pending"][0]["admitted"], true);
}

#[test]
fn bad_file_exits_2_and_names_the_field() {
    let (code, out, err) = tessera(&["sched", "plan", "crates/sim/tests/invalid/queue_cycle.yaml"]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert_eq!(
        err,
        "error: crates/sim/tests/invalid/queue_cycle.yaml: queues[0].parent: queue hierarchy has a cycle: a -> c -> b -> a\n"
    );
    let (code, _, err) = tessera(&["sched", "plan", "no/such/file.yaml"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: no/such/file.yaml: cannot read the file:"),
        "{err}"
    );
}

#[test]
fn config_file_overrides_and_is_checked() {
    // The shipped default config turns the spread scenario into binpack.
    let (code, out, _) = tessera(&[
        "sched",
        "plan",
        "crates/sim/tests/scenarios/spread_inference.yaml",
        "--config",
        "docs/examples/scheduler.yaml",
    ]);
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().filter(|l| l.contains("-> n-0")).count(),
        4,
        "{out}"
    );
    let dir = std::env::temp_dir().join(format!("tessera-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "actions: \"allocate, backfil\"\ntiers: []\n").unwrap();
    let (code, _, err) = tessera(&[
        "sched",
        "plan",
        "crates/sim/tests/scenarios/spread_inference.yaml",
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("bad.yaml: actions[1]: unknown action `backfil`"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_json_has_the_fields() {
    let (code, out, err) = tessera(&[
        "bench", "sched", "--nodes", "50", "--tasks", "300", "--repeat", "1", "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for f in [
        "nodes",
        "tasks",
        "placed",
        "wall_ms",
        "pods_per_sec",
        "decision_p50_us",
        "decision_p99_us",
    ] {
        assert!(v.get(f).is_some(), "missing {f} in {out}");
    }
    assert_eq!(v["nodes"], 50);
    assert_eq!(v["tasks"], 300);
    assert!(v["placed"].as_u64().unwrap() > 0);
}
