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

/// The first `tessera: scheduler: …` line `tessera up` prints with `extra`, or its
/// exit code and stderr when it stops before listening.
fn up_scheduler_line(extra: &[&str]) -> Result<String, (i32, String)> {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["up", "--listen", "127.0.0.1:0", "--no-local-node", "--data"])
        .arg(dir.path().join("data"))
        .args(extra)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    let mut line = None;
    for l in BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        seen.push_str(&l);
        seen.push('\n');
        if let Some(s) = l.strip_prefix("tessera: scheduler: ") {
            line = Some(s.to_string());
            break;
        }
    }
    let _ = child.kill();
    let st = child.wait().unwrap();
    line.ok_or((st.code().unwrap_or(-1), seen))
}

/// `tessera up --scheduler-config FILE` runs the live scheduler with the file's
/// actions and plugins (the default has `reservation` on); a wrong file stops it
/// before it listens, exit 2, naming the file and the field.
#[test]
fn up_runs_the_scheduler_config_it_is_given() {
    let default = up_scheduler_line(&[]).unwrap();
    assert!(
        default.contains("reservation") && default.contains("fractions of a GPU by tessera"),
        "{default}"
    );
    let given = up_scheduler_line(&["--scheduler-config", "docs/examples/scheduler.yaml"]).unwrap();
    assert!(
        given.starts_with(
            "actions [enqueue, allocate, preempt, reclaim, backfill], \
             plugins [priority gang | drf predicates proportion binpack]"
        ),
        "{given}"
    );
    assert!(!given.contains("reservation"), "{given}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "actions: [allocate, backfil]\ntiers: []\n").unwrap();
    let (code, err) =
        up_scheduler_line(&["--scheduler-config", bad.to_str().unwrap()]).unwrap_err();
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--scheduler-config")
            && err.contains("bad.yaml: actions[1]: unknown action `backfil`"),
        "{err}"
    );
    // `tessera k8s run` takes the same file, checked before it looks for a cluster.
    let (code, _, err) = tessera(&[
        "k8s",
        "run",
        "--kubeconfig",
        "/nonexistent",
        "--scheduler-config",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--scheduler-config") && err.contains("unknown action `backfil`"),
        "{err}"
    );
}

/// `tessera k8s manifests --runtime-class NAME=HANDLER` prints a RuntimeClass with the
/// class's node selector (the apiserver scenario applies it); bad values are refused
/// naming them.
#[test]
fn manifests_print_runtime_classes() {
    let (code, out, err) = tessera(&["k8s", "manifests", "--runtime-class", "isolated=kata-qemu"]);
    assert_eq!(code, 0, "{err}");
    let rc = out
        .split("---\n")
        .find(|d| d.contains("kind: RuntimeClass"))
        .unwrap_or_else(|| panic!("no RuntimeClass in\n{out}"));
    for want in [
        "apiVersion: node.k8s.io/v1",
        "name: isolated",
        "handler: kata-qemu",
        "runtime-class.tessera.io/isolated: 'true'",
    ] {
        assert!(rc.contains(want), "{want:?} not in\n{rc}");
    }
    for (bad, says) in [
        ("Isolated=kata", "\"Isolated\""),
        ("isolated", "NAME=HANDLER"),
        ("isolated=Kata_QEMU", "handler \"Kata_QEMU\""),
    ] {
        let (code, _, err) = tessera(&["k8s", "manifests", "--runtime-class", bad]);
        assert!(code != 0 && err.contains(says), "{bad}: {code} {err}");
    }
}
