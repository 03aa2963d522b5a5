//! The cgroup v2 backend on a real cgroup2 hierarchy, mounted privately (a mount
//! namespace of this test's own thread). On a cgroup v1 host such as the development
//! machine the hierarchy offers none of the memory, cpu and pids controllers (they are
//! bound to v1), so what runs is the v2 file protocol — mkdir, `cgroup.procs`,
//! `cgroup.freeze` + `cgroup.events`, `cgroup.kill`, rmdir — on a process and on a whole
//! sandbox, and the rule that a limit whose controller is missing fails instead of being
//! dropped. Where a controller is offered (a v2 host), its limit file is checked too.

mod common;

use common::root_or_skip;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::Arc;
use tessera_sandbox::cgroup::{CgroupManager, CgroupV2};
use tessera_sandbox::{ExecRequest, InitProgram, Limits, Runtime, RuntimeConfig, SandboxSpec};

fn no_limits() -> Limits {
    Limits {
        memory_bytes: None,
        cpu_millis: None,
        pids: None,
        ..Limits::default()
    }
}

#[test]
fn v2_backend_on_a_private_cgroup2_mount() {
    if !root_or_skip("v2_backend_on_a_private_cgroup2_mount") {
        return;
    }
    // A thread of its own: the mount namespace is unshared for this thread only.
    std::thread::spawn(|| {
        unshare(CloneFlags::CLONE_NEWNS).expect("unshare(CLONE_NEWNS)");
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .expect("make / private");
        let mnt = tempfile::tempdir().unwrap();
        mount(
            Some("cgroup2"),
            mnt.path(),
            Some("cgroup2"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .expect("mount cgroup2 (the kernel must support cgroup v2)");
        let r = std::panic::catch_unwind(|| exercise(mnt.path()));
        let _ = umount2(mnt.path(), MntFlags::MNT_DETACH);
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
    })
    .join()
    .unwrap();
}

fn exercise(mnt: &Path) {
    let offered = fs::read_to_string(mnt.join("cgroup.controllers")).unwrap_or_default();
    eprintln!("cgroup2 controllers offered at the root here: {offered:?}");
    let has = |c: &str| offered.split_whitespace().any(|o| o == c);
    let base = mnt.join(format!("tessera-v2-test-{}", std::process::id()));
    let m = Arc::new(CgroupV2::at(base.clone()).expect("v2 base"));
    assert_eq!(m.version(), "v2");
    let me = std::process::id();

    // 1. One process: attach, list, freeze and thaw, kill, remove.
    let mut child = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let id = format!("sb-{me}-900001");
    let cg = m.create(&id, &no_limits()).expect("create a v2 cgroup");
    cg.attach(child.id() as i32).expect("write cgroup.procs");
    assert_eq!(cg.procs(), [child.id() as i32]);
    cg.set_frozen(true)
        .expect("cgroup.freeze, confirmed by cgroup.events");
    let state = fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
    eprintln!(
        "frozen task's /proc stat state: {:?}",
        state.split(' ').nth(2)
    );
    cg.set_frozen(false).expect("thaw");
    assert_eq!(m.list(), [base.join(&id).display().to_string()]);

    // 2. Limits: written where the controller is offered, refused where it is not (and
    //    the half-made cgroup is removed).
    for (what, limits, file, want) in [
        (
            "memory",
            Limits {
                memory_bytes: Some(64 << 20),
                ..no_limits()
            },
            "memory.max",
            (64u64 << 20).to_string(),
        ),
        (
            "pids",
            Limits {
                pids: Some(32),
                ..no_limits()
            },
            "pids.max",
            "32".to_string(),
        ),
    ] {
        let lid = format!("sb-{me}-90001{}", what.len());
        match m.create(&lid, &limits) {
            Ok(c) => {
                assert!(has(what), "{what} limit written without the controller");
                let got = fs::read_to_string(base.join(&lid).join(file)).unwrap();
                assert_eq!(got.trim(), want);
                c.destroy().unwrap();
                eprintln!("ran: {file} written and read back");
            }
            Err(e) => {
                assert!(!has(what), "{what} is offered but create failed: {e}");
                assert!(e.to_string().contains(file), "{e}");
                assert!(!base.join(&lid).exists(), "half-made cgroup left: {lid}");
                eprintln!(
                    "did not run: {file} ({what} controller bound to v1 here); create refused: {e}"
                );
            }
        }
    }

    // 3. Kill through cgroup.kill (the reaper's path) and remove.
    assert_eq!(m.reap_supervisor(me), 1);
    let st = child.wait().unwrap();
    assert_eq!(st.signal(), Some(9), "{st:?}");
    assert!(m.list().is_empty(), "{:?}", m.list());

    // 4. A whole sandbox through the v2 backend: create (attach of its init), exec,
    //    pause and resume (freezer), destroy (rmdir).
    let rt = Runtime::new(RuntimeConfig {
        init: Some(InitProgram {
            path: env!("CARGO_BIN_EXE_tessera-sandbox-init").into(),
            args: vec![],
        }),
        cgroups: true,
        cgroup_backend: Some(m.clone()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(rt.cgroups().unwrap().version(), "v2");
    let spec = SandboxSpec {
        limits: no_limits(),
        ..SandboxSpec::default()
    };
    let sb = rt.spawn(&spec).expect("a sandbox on the v2 backend");
    assert!(sb.cgroup().unwrap().procs().contains(&sb.pid()));
    let out = sb.exec(&ExecRequest::shell("echo v2")).unwrap();
    assert_eq!(out.stdout, b"v2\n");
    sb.pause().expect("pause via cgroup.freeze");
    assert!(sb.exec(&ExecRequest::shell("true")).is_err());
    sb.resume().expect("resume");
    assert!(
        sb.exec(&ExecRequest::shell("true"))
            .unwrap()
            .status
            .success()
    );
    sb.destroy().expect("destroy: rmdir of the v2 cgroup");
    assert!(m.list().is_empty(), "{:?}", m.list());
    drop(rt);
    fs::remove_dir(&base).unwrap();
}
