//! The interposer never runs CUDA unenforced without saying so: no
//! configuration, an unknown driver version, a driver missing an entry point it
//! needs, legacy 32-bit entry points and unknown allocation entry points all
//! fail loudly. And it does not break what it does not wrap.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn no_region_means_no_cuda() {
    let Some(f) = fake_build() else { return };
    let o = run(f.probe(Some(&interposer()), None, None, &["init", "alloc", "1M"]));
    let out = stdout(&o);
    assert_eq!(rc(lines(&out, "init")[0]), 3, "{out:?}");
    assert_eq!(rc(lines(&out, "alloc")[0]), 3, "{out:?}");
    let e = stderr(&o);
    assert!(
        e.contains("tessera-cuda:") && e.contains("no task region"),
        "{e}"
    );
    assert_eq!(e.matches("tessera-cuda:").count(), 1, "said once: {e}");
}

#[test]
fn a_bad_region_file_is_named() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("badregion");
    let p = dir.join("junk.region");
    std::fs::write(&p, b"not a region").unwrap();
    let o = run(f.probe(Some(&interposer()), Some(&p), None, &["init"]));
    assert_eq!(rc(lines(&stdout(&o), "init")[0]), 3);
    assert!(stderr(&o).contains("junk.region"), "{}", stderr(&o));
}

#[test]
fn unknown_driver_versions_are_refused() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("version");
    let (rp, _r) = region(&dir, "v", 64 * MIB, 1000, Duration::ZERO);
    for (v, shown) in [("99000", "99.0"), ("10020", "10.2"), ("13060", "13.6")] {
        let mut c = f.probe(
            Some(&interposer()),
            Some(&rp),
            None,
            &["init", "alloc", "1M", "launch", "kernel", "1", "1000"],
        );
        c.env("FAKECUDA_DRIVER_VERSION", v);
        let o = run(c);
        let out = stdout(&o);
        assert_eq!(rc(lines(&out, "init")[0]), 801, "{v}: {out:?}");
        assert_eq!(rc(lines(&out, "alloc")[0]), 801, "{v}: {out:?}");
        assert_eq!(rc(lines(&out, "launch")[0]), 801, "{v}: {out:?}");
        let e = stderr(&o);
        assert!(
            e.contains(&format!("version {shown} is not one this interposer knows")),
            "{e}"
        );
    }
}

#[test]
fn a_driver_missing_a_needed_entry_point_is_refused() {
    let Some(f) = fake_variant("no-ctx-get-device", &["FAKECUDA_OMIT_CTX_GET_DEVICE"]) else {
        return;
    };
    let dir = workdir("missing");
    let (rp, _r) = region(&dir, "m", 64 * MIB, 1000, Duration::ZERO);
    let o = run(f.probe(
        Some(&interposer()),
        Some(&rp),
        None,
        &["init", "alloc", "1M"],
    ));
    let out = stdout(&o);
    assert_eq!(rc(lines(&out, "init")[0]), 500, "{out:?}");
    assert_eq!(rc(lines(&out, "alloc")[0]), 500, "{out:?}");
    assert!(stderr(&o).contains("no cuCtxGetDevice"), "{}", stderr(&o));
}

#[test]
fn legacy_32_bit_entry_points_are_refused() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("legacy");
    let (rp, r) = region(&dir, "l", 64 * MIB, 1000, Duration::ZERO);
    for mode in ["d", "h"] {
        let o = run(f.probe(
            Some(&interposer()),
            Some(&rp),
            None,
            &["mode", mode, "init", "legacy", "1M"],
        ));
        let out = stdout(&o);
        assert_eq!(rc(lines(&out, "legacy")[0]), 801, "{mode}: {out:?}");
        assert!(
            stderr(&o).contains("cuMemAlloc is a 32-bit entry point"),
            "{}",
            stderr(&o)
        );
    }
    // Without the interposer the fake would have allocated.
    let o = run(f.probe(None, None, None, &["mode", "h", "init", "legacy", "1M"]));
    assert_eq!(rc(lines(&stdout(&o), "legacy")[0]), 0);
    assert_eq!(r.usage().devices[0].memory_used_bytes, 0);
}

#[test]
fn unknown_allocation_entry_points_are_refused() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("unknown");
    let (rp, _r) = region(&dir, "u", 64 * MIB, 1000, Duration::ZERO);
    let steps = [
        "init",
        "gpa",
        "cuMemAllocFuture",
        "12040",
        "0",
        "dlsym",
        "cuMemAllocFuture",
        "gpa",
        "cuMemAllocHost",
        "12040",
        "0",
    ];
    let o = run(f.probe(Some(&interposer()), Some(&rp), None, &steps));
    let out = stdout(&o);
    assert!(
        out.contains(&"gpa cuMemAllocFuture rc=801 status=1 found=0".to_string()),
        "{out:?}"
    );
    assert!(
        out.contains(&"dlsym cuMemAllocFuture found=0".to_string()),
        "{out:?}"
    );
    // Host allocations are not device memory: not refused (the fake has none).
    assert!(
        out.iter()
            .any(|l| l.starts_with("gpa cuMemAllocHost rc=500")),
        "{out:?}"
    );
    assert!(stderr(&o).contains("cuMemAllocFuture"), "{}", stderr(&o));
    // The control: the fake does export it.
    let o = run(f.probe(None, None, None, &steps));
    let out = stdout(&o);
    assert!(
        out.contains(&"gpa cuMemAllocFuture rc=0 status=0 found=1".to_string()),
        "{out:?}"
    );
    assert!(
        out.contains(&"dlsym cuMemAllocFuture found=1".to_string()),
        "{out:?}"
    );
}

/// `dlsym(RTLD_NEXT, …)` is answered relative to its real caller (the
/// interposer's `dlsym` tail-jumps into glibc's): from the program, the next
/// `dlsym` after it is the interposer's own, which `RTLD_DEFAULT` finds too.
#[test]
fn dlsym_rtld_next_still_works_for_programs() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("rtldnext");
    let (rp, _r) = region(&dir, "n", 64 * MIB, 1000, Duration::ZERO);
    for ip in [Some(interposer()), None] {
        let o = run(f.probe(ip.as_deref(), Some(&rp), None, &["rtldnext"]));
        assert_eq!(stdout(&o), ["rtldnext same=1"], "{ip:?}: {}", stderr(&o));
    }
}

/// Graph memory nodes allocate inside the driver when the graph runs: they are
/// let through, said and counted as not enforced.
#[test]
fn graph_memory_nodes_are_reported_as_not_enforced() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("memnode");
    let (rp, r) = region(&dir, "g", 64 * MIB, 1000, Duration::ZERO);
    let o = run(f.probe(
        Some(&interposer()),
        Some(&rp),
        None,
        &["mode", "p2", "init", "memnode"],
    ));
    assert_eq!(rc(lines(&stdout(&o), "memnode")[0]), 0);
    assert!(
        stderr(&o).contains("not counted against the task's cap"),
        "{}",
        stderr(&o)
    );
    assert_eq!(r.usage().devices[0].unenforced_events, 1);
}

/// The versions it knows run: the first with cuGetProcAddress, 12.x, and the
/// 13.x the H200 machines here report (driver 580: 13.0).
#[test]
fn known_driver_versions_run() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("known");
    let (rp, _r) = region(&dir, "k", 64 * MIB, 1000, Duration::ZERO);
    for v in ["11030", "12090", "13000", "13050"] {
        let mut c = f.probe(
            Some(&interposer()),
            Some(&rp),
            None,
            &["init", "alloc", "1M"],
        );
        c.env("FAKECUDA_DRIVER_VERSION", v);
        let o = run(c);
        let out = stdout(&o);
        assert_eq!(rc(lines(&out, "init")[0]), 0, "{v}: {out:?} {}", stderr(&o));
        assert_eq!(rc(lines(&out, "alloc")[0]), 0, "{v}: {out:?}");
    }
}
