//! Scenario tests: every `tests/scenarios/*.yaml` is planned through one `check`
//! helper and compared with its snapshot in `tests/snapshots/`. A scenario's
//! name says what it shows; `*_no_act` scenarios show a case where an action
//! must *not* act.
//!
//! To accept new or changed output: `INSTA_UPDATE=always cargo test -p tessera-sim --test scenarios`
//! (then review the `.snap` diff).

use std::path::{Path, PathBuf};

use tessera_sim::scenario;

/// Loads, plans, checks the plan's invariants, and renders it.
fn check(path: &Path) -> String {
    let sc = scenario::load(path).unwrap_or_else(|e| panic!("{e}"));
    let plan = tessera_sched::schedule(&sc.snapshot, &sc.config);
    let again = tessera_sched::schedule(&sc.snapshot, &sc.config);
    assert_eq!(
        plan,
        again,
        "{}: the same input gave two plans",
        path.display()
    );
    let mut out = String::new();
    if let Some(d) = &sc.description {
        out.push_str("# ");
        out.push_str(&d.trim().replace('\n', "\n# "));
        out.push('\n');
    }
    out.push_str(&plan.to_string());
    out
}

fn scenario_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

#[test]
fn scenarios() {
    let files = scenario_files();
    assert!(
        files.len() >= 14,
        "expected the scenario corpus, found {}",
        files.len()
    );
    for f in files {
        let name = f.file_stem().unwrap().to_string_lossy().to_string();
        let out = check(&f);
        insta::with_settings!({ snapshot_path => "snapshots", prepend_module_to_snapshot => false, omit_expression => true }, {
            insta::assert_snapshot!(name, out);
        });
    }
}

/// Invalid scenarios: each file under `tests/invalid/` must be rejected with
/// the message in its first line (`# expect: …`).
#[test]
fn invalid_scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/invalid");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{}: first line must be `# expect: …`", p.display()))
            .to_string();
        let err =
            scenario::parse(&text, "f.yaml").expect_err(&format!("{} was accepted", p.display()));
        assert_eq!(err.to_string(), expect, "{}", p.display());
        n += 1;
    }
    assert!(n >= 8, "expected the invalid-scenario corpus, found {n}");
}

/// `tessera sched explain`: why a task went where it went, or did not go.
#[test]
fn explanations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut out = String::new();
    for (file, task) in [
        ("preempt_fewest_victims", "urgent/t"),
        ("taints_tolerations", "job/w-0"),
        ("taints_tolerations", "serve/r-0"),
        ("nvlink_hard_and_soft", "b/t"),
        ("share_policy_tessera", "tiny/t"),
    ] {
        let sc = scenario::load(&dir.join(format!("{file}.yaml"))).unwrap();
        let (group, name) = task.split_once('/').unwrap();
        let id = tessera_model::TaskId {
            group: group.into(),
            task: name.into(),
        };
        let e = tessera_sched::explain(&sc.snapshot, &sc.config, &id)
            .unwrap_or_else(|| panic!("{file}: no task {task}"));
        out.push_str(&format!("## {file}\n{e}\n"));
    }
    insta::with_settings!({ snapshot_path => "snapshots", prepend_module_to_snapshot => false, omit_expression => true }, {
        insta::assert_snapshot!("explanations", out);
    });
}
