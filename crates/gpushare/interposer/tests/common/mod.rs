//! Shared by the interposer's tests: the fake driver (built once per test
//! binary), the interposer's path, regions and probe runs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use tessera_gpushare::fake::{self, FakeBuild};
use tessera_gpushare::region::{ComputePolicy, DeviceConfig, Region, RegionConfig};

pub const MIB: u64 = 1 << 20;

fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("gpushare-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("scratch folder")
    })
    .path()
}

/// A fresh folder for one test.
pub fn workdir(name: &str) -> PathBuf {
    let d = scratch().join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The fake driver, or `None` (the test is skipped, said on stderr) when there
/// is no C compiler and `CI` is not set; with `CI` set a missing compiler fails.
pub fn fake_build() -> Option<&'static FakeBuild> {
    fake_variant("plain", &[])
}

pub fn fake_variant(name: &str, defines: &[&str]) -> Option<&'static FakeBuild> {
    static BUILDS: std::sync::Mutex<Vec<(String, &'static FakeBuild)>> =
        std::sync::Mutex::new(Vec::new());
    let mut b = BUILDS.lock().unwrap();
    if let Some((_, f)) = b.iter().find(|(n, _)| n == name) {
        return Some(f);
    }
    match fake::build(&scratch().join(format!("fake-{name}")), defines) {
        Ok(f) => {
            let f: &'static FakeBuild = Box::leak(Box::new(f));
            b.push((name.to_string(), f));
            Some(f)
        }
        Err(e @ fake::FakeError::NoCompiler(_)) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// `libtessera_cuda.so` as cargo built it for this test run.
pub fn interposer() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for p in [
        deps.join("libtessera_cuda.so"),
        deps.parent().unwrap().join("libtessera_cuda.so"),
    ] {
        if p.is_file() {
            return p;
        }
    }
    panic!("libtessera_cuda.so not found next to {}", exe.display());
}

pub fn region(dir: &Path, name: &str, limit: u64, milli: u32, wait: Duration) -> (PathBuf, Region) {
    let p = dir.join(format!("{name}.region"));
    let r = Region::create(
        &p,
        &RegionConfig {
            task: name.into(),
            devices: vec![DeviceConfig {
                memory_limit: limit,
                compute_milli: milli,
            }],
            memory_wait: wait,
            policy: ComputePolicy::WorkConserving,
        },
    )
    .unwrap();
    (p, r)
}

pub fn run(mut c: Command) -> Output {
    c.output().expect("probe runs")
}

pub fn stdout(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The lines starting with `prefix`.
pub fn lines<'a>(out: &'a [String], prefix: &str) -> Vec<&'a str> {
    out.iter()
        .filter(|l| l.starts_with(prefix))
        .map(String::as_str)
        .collect()
}

/// `rc=N` of a line.
pub fn rc(line: &str) -> i32 {
    line.rsplit("rc=")
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}
