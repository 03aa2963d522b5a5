//! The documents that describe the code stay true to it.

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .parent()
        .unwrap()
}

/// Every crate under `crates/` has a section in ARCHITECTURE.md.
#[test]
fn architecture_names_every_crate() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap() {
        let e = e.unwrap();
        if !e.path().join("Cargo.toml").exists() {
            continue;
        }
        let name = e.file_name().to_string_lossy().to_string();
        if !arch.contains(&format!("## `crates/{name}`")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md has no section for: {missing:?}"
    );
}

/// The README's quick start has the two commands, and CI runs the same test command.
#[test]
fn quick_start_matches_ci() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    let qs = readme
        .split("## Quick start")
        .nth(1)
        .expect("README has a Quick start section");
    let block = qs
        .split("```sh")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let cmds: Vec<&str> = block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        cmds.len(),
        2,
        "the quick start has exactly two commands: {cmds:?}"
    );
    assert!(
        ci.lines().any(|l| l.trim() == cmds[1]),
        "CI does not run the README's test command `{}`",
        cmds[1]
    );
}
