//! Memory caps through the interposer on the fake driver: across processes,
//! children, shells and re-execs, through every lookup path; over the cap fails
//! or waits; memory of dead processes and replaced images comes back.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const CAP: u64 = 64 * MIB;

/// The control: without the interposer the same program takes what it asks for.
#[test]
fn without_the_interposer_nothing_is_capped() {
    let Some(f) = fake_build() else { return };
    let o = run(f.probe(
        None,
        None,
        None,
        &["init", "alloc", "40M", "alloc", "40M", "info"],
    ));
    let out = stdout(&o);
    assert_eq!(
        lines(&out, "alloc")
            .iter()
            .map(|l| rc(l))
            .collect::<Vec<_>>(),
        [0, 0],
        "{out:?}"
    );
    assert!(
        out.iter().any(|l| l.contains("total=1073741824")),
        "{out:?}"
    );
}

#[test]
fn over_the_cap_fails_and_recovers_after_a_free() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("recover");
    let (rp, r) = region(&dir, "recover", CAP, 1000, Duration::ZERO);
    let o = run(f.probe(
        Some(&interposer()),
        Some(&rp),
        None,
        &[
            "init", "alloc", "40M", "alloc", "40M", "info", "totalmem", "free", "0", "alloc",
            "40M", "info",
        ],
    ));
    let out = stdout(&o);
    let allocs: Vec<i32> = lines(&out, "alloc").iter().map(|l| rc(l)).collect();
    assert_eq!(allocs, [0, 2, 0], "{out:?}");
    // cuMemGetInfo and cuDeviceTotalMem report the cap, not the device.
    let info = lines(&out, "info");
    assert!(info[0].contains("free=25165824 total=67108864"), "{out:?}");
    assert!(
        lines(&out, "totalmem")[0].starts_with("totalmem 67108864"),
        "{out:?}"
    );
    assert!(
        stderr(&o).contains("refused: the task's cap is 67108864 bytes"),
        "{}",
        stderr(&o)
    );
    let u = r.usage().devices[0].clone();
    assert_eq!(u.oom_events, 1);
    assert_eq!(u.memory_peak_bytes, 40 * MIB);
    // The process exited: what it held is given back.
    assert_eq!(u.memory_used_bytes, 0);
}

/// A forked child shares the task's cap; a child that dies holding memory gives
/// it back to the next allocation that needs it.
#[test]
fn the_cap_holds_across_forked_children_and_dead_ones_give_memory_back() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("fork");
    let (rp, _r) = region(&dir, "fork", CAP, 1000, Duration::ZERO);
    let state = dir.join("dev.state");
    let o = run(f.probe(
        Some(&interposer()),
        Some(&rp),
        Some(&state),
        &[
            "init", "alloc", "24M", //
            "fork", "init", "alloc", "24M", "alloc", "24M", "info", "endfork", //
            "alloc", "24M", "info", "peak",
        ],
    ));
    let out = stdout(&o);
    let allocs: Vec<i32> = lines(&out, "alloc").iter().map(|l| rc(l)).collect();
    // parent 24, child 24 (48), child 24 more: over; after the child is gone,
    // the parent's 24 fits because the dead child's 24 is reclaimed.
    assert_eq!(allocs, [0, 0, 2, 0], "{out:?}");
    let info = lines(&out, "info");
    assert!(
        info[0].contains("free=16777216"),
        "child sees the task's use: {out:?}"
    );
    assert!(
        info[1].contains("free=16777216"),
        "parent after reclaim: {out:?}"
    );
    // Ground truth from the fake device: never more than the cap in use.
    let peak: u64 = lines(&out, "peak")[0]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(peak <= CAP, "device peak {peak} over the cap");
}

/// A child started through a shell (`sh -c`), which re-executes the program,
/// is under the same cap; the image it replaced gives its memory back.
#[test]
fn the_cap_holds_through_shells_and_re_execs() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("exec");
    let (rp, _r) = region(&dir, "exec", CAP, 1000, Duration::ZERO);
    let state = dir.join("dev.state");
    let o = run(f.probe(
        Some(&interposer()),
        Some(&rp),
        Some(&state),
        &[
            "init", "alloc", "40M", //
            "fork", "exec", "init", "alloc", "40M", "alloc", "20M", "info", "endfork", //
            "exec", "init", "alloc", "60M", "info", "peak",
        ],
    ));
    let out = stdout(&o);
    let allocs: Vec<i32> = lines(&out, "alloc").iter().map(|l| rc(l)).collect();
    // parent 40; shell-started child: 40 over (80), 20 fits (60); then the parent
    // re-execs itself through sh: the new image's 60 fits, the old image's 40 is gone.
    assert_eq!(allocs, [0, 2, 0, 0], "{out:?}\n{}", stderr(&o));
    let info = lines(&out, "info");
    assert!(info[0].contains("free=4194304"), "{out:?}");
    assert!(info[1].contains("free=4194304"), "{out:?}");
    let peak: u64 = lines(&out, "peak")[0]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(peak <= CAP, "device peak {peak} over the cap");
}

/// Every lookup path hands out the interposer: linked symbols, dlopen + dlsym,
/// cuGetProcAddress, cuGetProcAddress_v2, per-thread-stream (_ptsz) variants,
/// and a driver whose cuGetProcAddress returns other addresses than dlsym.
#[test]
fn every_lookup_path_is_capped() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("paths");
    for (mode, kind, trampoline) in [
        ("d", "alloc", false),
        ("h", "alloc", false),
        ("p", "alloc", false),
        ("p2", "alloc", false),
        ("p2", "alloc", true),
        ("pt", "async", false),
        ("pt", "pool", false),
        ("h", "managed", false),
        ("p2", "vmm", false),
    ] {
        let name = format!("{mode}-{kind}-{trampoline}");
        let (rp, _r) = region(&dir, &name, CAP, 1000, Duration::ZERO);
        let mut c = f.probe(
            Some(&interposer()),
            Some(&rp),
            None,
            &["mode", mode, "init", kind, "40M", kind, "40M", "info"],
        );
        if trampoline {
            c.env("FAKECUDA_GPA_TRAMPOLINE", "1");
        }
        let o = run(c);
        let out = stdout(&o);
        let rcs: Vec<i32> = lines(&out, kind).iter().map(|l| rc(l)).collect();
        assert_eq!(rcs, [0, 2], "{name}: {out:?}\n{}", stderr(&o));
        assert!(
            lines(&out, "info")[0].contains("total=67108864"),
            "{name}: {out:?}"
        );
    }
}

/// Pitched memory, managed memory, stream-ordered and pool allocations, arrays,
/// mipmapped arrays and VMM handles all count, and all come back when freed.
#[test]
fn every_allocation_kind_counts_and_comes_back() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("kinds");
    let (rp, _r) = region(&dir, "kinds", CAP, 1000, Duration::ZERO);
    let o = run(f.probe(
        Some(&interposer()),
        Some(&rp),
        None,
        &[
            "init", //
            "pitch", "1000", "1024", "info", // 1024-byte pitch x 1024 rows = 1 MiB
            "managed", "3M", "info", //
            "async", "5M", "info", //
            "pool", "6M", "info", //
            "array", "1024", "1024", "info", // float: 4 MiB
            "array3d", "64", "64", "64", "info", // float: 1 MiB
            "mipmap", "256", "256", "3", "info", // (256² + 128² + 64²) x 4 = 344064
            "vmm", "2M", "info", //
            "array", "8192", "4096", // 128 MiB: over
            "freeall", "info",
        ],
    ));
    let out = stdout(&o);
    let free: Vec<u64> = lines(&out, "info")
        .iter()
        .map(|l| {
            l.split("free=")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let used: Vec<u64> = free.iter().map(|f| CAP - f).collect();
    let m = MIB;
    assert_eq!(
        used,
        [
            m,
            4 * m,
            9 * m,
            15 * m,
            19 * m,
            20 * m,
            20 * m + 344_064,
            22 * m + 344_064,
            0
        ],
        "{out:?}\n{}",
        stderr(&o)
    );
    let arrays: Vec<i32> = lines(&out, "array rc").iter().map(|l| rc(l)).collect();
    assert_eq!(arrays, [0, 2], "{out:?}");
    assert_eq!(rc(lines(&out, "freeall")[0]), 0);
}

/// Over the cap with a wait configured: the allocation waits until another
/// process of the task frees memory, then succeeds.
#[test]
fn over_the_cap_waits_for_memory_another_process_frees() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("wait");
    let (rp, r) = region(&dir, "wait", CAP, 1000, Duration::from_secs(30));
    let ip = interposer();
    let mut holder = f
        .probe(
            Some(&ip),
            Some(&rp),
            None,
            &["init", "alloc", "40M", "hold", "free", "0"],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut hout = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("holding") {
        line.clear();
        assert!(hout.read_line(&mut line).unwrap() > 0, "holder ended early");
    }
    let mut waiter = f
        .probe(Some(&ip), Some(&rp), None, &["init", "alloc", "40M"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The waiter is waiting once the region says so.
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.usage().devices[0].memory_wait_events == 0 {
        assert!(
            Instant::now() < deadline,
            "the second allocation never waited"
        );
        assert!(
            waiter.try_wait().unwrap().is_none(),
            "the second allocation did not wait"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(holder.stdin.take()); // the holder frees and exits
    let o = waiter.wait_with_output().unwrap();
    holder.wait().unwrap();
    let out = stdout(&o);
    assert_eq!(rc(lines(&out, "alloc")[0]), 0, "{out:?}");
    assert_eq!(r.usage().devices[0].oom_events, 0);
}

/// A wait that runs out fails with CUDA_ERROR_OUT_OF_MEMORY.
#[test]
fn a_wait_that_runs_out_fails() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("waitout");
    let (rp, r) = region(&dir, "waitout", CAP, 1000, Duration::from_millis(200));
    let o = run(f.probe(
        Some(&interposer()),
        Some(&rp),
        None,
        &["init", "alloc", "40M", "alloc", "40M"],
    ));
    let out = stdout(&o);
    assert_eq!(
        lines(&out, "alloc")
            .iter()
            .map(|l| rc(l))
            .collect::<Vec<_>>(),
        [0, 2]
    );
    let u = &r.usage().devices[0];
    assert_eq!((u.memory_wait_events, u.oom_events), (1, 1));
    assert!(
        stderr(&o).contains("after waiting 200 ms"),
        "{}",
        stderr(&o)
    );
}

/// A task process killed while holding memory: the next allocation reclaims
/// it (the driver freed it when the process died).
#[test]
fn a_crashed_process_releases_its_memory() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("crash");
    let (rp, r) = region(&dir, "crash", CAP, 1000, Duration::ZERO);
    let state = dir.join("dev.state");
    let ip = interposer();
    let o = run(f.probe(
        Some(&ip),
        Some(&rp),
        Some(&state),
        &["init", "alloc", "50M", "crash"],
    ));
    assert_eq!(o.status.code(), None, "the probe was killed");
    assert_eq!(
        r.usage().devices[0].memory_used_bytes,
        50 * MIB,
        "still booked to the dead process"
    );
    let o = run(f.probe(
        Some(&ip),
        Some(&rp),
        Some(&state),
        &["init", "alloc", "50M", "peak"],
    ));
    let out = stdout(&o);
    assert_eq!(rc(lines(&out, "alloc")[0]), 0, "{out:?}\n{}", stderr(&o));
    let peak: u64 = lines(&out, "peak")[0]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(peak <= CAP, "device peak {peak}");
}

/// Processes of one task racing past the cap: the fake device's own peak never
/// exceeds it.
#[test]
fn racing_processes_never_exceed_the_cap() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("race");
    let c = tessera_gpushare::fake::run_cap_scenario(f, &interposer(), &dir, 4, 8, 4 * MIB, CAP)
        .unwrap();
    assert_eq!(c.attempted, 128 * MIB);
    assert_eq!(c.granted, CAP, "{c:?}");
    assert!(c.peak <= CAP && c.peak == c.granted, "{c:?}");
    assert_eq!(c.refused, 16, "{c:?}");
}
