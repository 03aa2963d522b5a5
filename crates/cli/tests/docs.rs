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

/// The code map's dependency block (ARCHITECTURE.md) names each crate's direct
/// dependencies on other Tessera crates exactly as its `Cargo.toml` does.
#[test]
fn code_map_matches_the_manifests() {
    use std::collections::{BTreeMap, BTreeSet};
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let block = arch
        .split("Dependency direction")
        .nth(1)
        .and_then(|r| r.split("```").nth(1))
        .expect("ARCHITECTURE.md has the dependency block");
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (from, to) = line
            .split_once("->")
            .unwrap_or_else(|| panic!("ARCHITECTURE.md: {line:?} is not `crate -> {{deps}}`"));
        let deps: BTreeSet<String> = to
            .trim()
            .trim_start_matches('{')
            .trim_end_matches('}')
            .split(',')
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty())
            .collect();
        assert!(
            map.insert(from.trim().to_string(), deps).is_none(),
            "ARCHITECTURE.md names {from:?} twice"
        );
    }
    // Every manifest under crates/ (one level, and one more for nested packages).
    let mut actual: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut folder_of: BTreeMap<String, String> = BTreeMap::new();
    let mut manifests = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let dir = e.path();
        if dir.join("Cargo.toml").exists() {
            manifests.push((e.file_name().to_string_lossy().to_string(), dir.clone()));
        }
        for sub in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if sub.path().join("Cargo.toml").exists() && sub.file_name() != "target" {
                manifests.push((
                    format!(
                        "{}/{}",
                        e.file_name().to_string_lossy(),
                        sub.file_name().to_string_lossy()
                    ),
                    sub.path(),
                ));
            }
        }
    }
    let mut deps_of = BTreeMap::new();
    for (folder, dir) in &manifests {
        let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let package = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .map(|n| n.trim_matches('"').to_string())
            .unwrap_or_default();
        folder_of.insert(package, folder.clone());
        let deps: Vec<String> = text
            .split("[dependencies]")
            .nth(1)
            .map(|d| d.split("\n[").next().unwrap_or(""))
            .unwrap_or("")
            .lines()
            .filter_map(|l| l.trim().split(['.', ' ', '=']).next())
            .filter(|n| n.starts_with("tessera-"))
            .map(str::to_string)
            .collect();
        deps_of.insert(folder.clone(), deps);
    }
    for (folder, deps) in deps_of {
        let names = deps
            .iter()
            .map(|d| folder_of.get(d).cloned().unwrap_or_else(|| d.clone()))
            .collect();
        actual.insert(folder, names);
    }
    assert_eq!(
        map, actual,
        "ARCHITECTURE.md's dependency block (left) differs from the Cargo.toml files (right)"
    );
}

/// No file of the crates' own code is over 1,000 lines, counting up to its first
/// `#[cfg(test)]` (unit tests at the end of a file do not count).
#[test]
fn no_source_file_over_a_thousand_lines() {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() && name != "target" && name != "tests" && name != "benches" {
                walk(&p, out);
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join("crates"), &mut files);
    let mut long: Vec<(usize, String)> = files
        .iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "src"))
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).ok()?;
            let n = text
                .lines()
                .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
                .count();
            let rel = p.strip_prefix(root()).unwrap().display().to_string();
            (n > 1000).then_some((n, rel))
        })
        .collect();
    long.sort();
    // The last of the files that were over it were split along their seams (issue 24).
    assert!(
        long.is_empty(),
        "source files over 1,000 lines (split them along their seams): {long:?}"
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
