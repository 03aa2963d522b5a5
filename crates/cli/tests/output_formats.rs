//! `-o table|json|yaml` on the local commands that list objects (`template list`,
//! `sandbox ls`), with `--json` kept as another way to write `-o json`; tables
//! pinned with insta snapshots of the real binary's output.

mod common;

use std::process::Command;

use common::BIN;

fn tessera(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn local_lists_print_tables_json_and_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("templates");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (reg, state) = (reg.to_str().unwrap(), state.to_str().unwrap());

    let (code, out, err) = tessera(&["template", "list", "--templates", reg]);
    assert_eq!(code, 0, "{err}");
    insta::assert_snapshot!(out, @r"
    NAME                     DIGEST                                                                       FILES        BYTES  SOURCE
    host                     host                                                                             -            -  built in: the host's /usr
    ");
    let (code, out, err) = tessera(&["sandbox", "ls", "--state", state]);
    assert_eq!(code, 0, "{err}");
    insta::assert_snapshot!(out, @"name                          pid   memory   cpus   pids  status");
    for (cmd, at) in [
        (["template", "list", "--templates"], reg),
        (["sandbox", "ls", "--state"], state),
    ] {
        let base: Vec<&str> = cmd.iter().copied().chain([at]).collect();
        let run = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
            let (code, out, err) = tessera(&args);
            assert_eq!(code, 0, "{args:?}: {err}");
            out
        };
        let json: serde_json::Value = serde_json::from_str(&run(&["-o", "json"])).unwrap();
        let alias: serde_json::Value = serde_json::from_str(&run(&["--json"])).unwrap();
        let yaml: serde_json::Value = serde_norway::from_str(&run(&["-o", "yaml"])).unwrap();
        assert_eq!(json, serde_json::json!([]), "{cmd:?}");
        assert_eq!((&alias, &yaml), (&json, &json), "{cmd:?}");
    }
}
