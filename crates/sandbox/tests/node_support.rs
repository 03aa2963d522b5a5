//! What the node runtime (`tessera-node`) needs of a sandbox: host paths bound in
//! (device nodes), masked paths, the device cgroup, a signal to the workload only
//! (the first half of a graceful stop), CPU and peak-memory accounting, and an init
//! program run from memory. Root only (cgroups, the uid range).

mod common;

use std::os::unix::fs::FileTypeExt;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tessera_sandbox::{
    Bind, DeviceRule, ExecRequest, InitProgram, Runtime, RuntimeConfig, SandboxSpec, Stream,
    pids_in_namespace,
};

#[test]
fn binds_and_masks() {
    if !common::root_or_skip("binds_and_masks") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let fake = d.path().join("nvidia0");
    std::fs::write(&fake, b"fake gpu\n").unwrap();
    let ro = d.path().join("ro.txt");
    std::fs::write(&ro, b"read only\n").unwrap();
    let spec = SandboxSpec {
        binds: vec![
            Bind {
                host: fake.clone(),
                path: "/dev/nvidia0".into(),
                writable: true,
            },
            Bind {
                host: ro.clone(),
                path: "/run/tessera/ro.txt".into(),
                writable: false,
            },
        ],
        // /usr/share/doc is in the host template: hidden by a mask.
        masked_paths: vec!["/usr/share/doc".into(), "/usr/bin/sha1sum".into()],
        ..SandboxSpec::default()
    };
    let sb = common::spawn(&spec);
    let out = sb
        .exec(&ExecRequest::shell(
            "cat /dev/nvidia0; ls /dev; ls -A /usr/share/doc | wc -l; cat /usr/bin/sha1sum | wc -c",
        ))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    assert!(text.starts_with("fake gpu\n"), "{text}");
    assert!(text.contains("nvidia0"), "{text}");
    // The masked folder is empty, the masked file reads as /dev/null.
    assert!(text.ends_with("0\n0\n"), "{text}");
    // The read-only bind cannot be written; the host file is unchanged.
    let out = sb
        .exec(&ExecRequest::shell(
            "cat /run/tessera/ro.txt; echo x > /run/tessera/ro.txt",
        ))
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"read only\n");
    assert_eq!(std::fs::read(&ro).unwrap(), b"read only\n");
    sb.destroy().unwrap();

    // A bind path outside the rules is refused, naming it.
    let bad = SandboxSpec {
        binds: vec![Bind {
            host: fake,
            path: "/usr/../etc/x".into(),
            writable: false,
        }],
        ..SandboxSpec::default()
    };
    let e = common::runtime().spawn(&bad).unwrap_err().to_string();
    assert!(e.contains("/usr/../etc/x"), "{e}");
}

/// With a device list, the devices cgroup lets the sandbox open only those devices
/// (and the base set): a real character device node bound in but not listed cannot
/// be opened (EPERM from the cgroup), the same node listed can.
#[test]
fn device_cgroup_allows_only_listed_devices() {
    if !common::root_or_skip("device_cgroup_allows_only_listed_devices") {
        return;
    }
    let rt = common::runtime();
    if !rt.fences_devices() {
        eprintln!("SKIPPED device_cgroup_allows_only_listed_devices: no v1 devices controller");
        return;
    }
    // A node of the kernel log's device (1:11: any user may open it for writing when
    // the node's mode allows), not in the base list, under a name of our own.
    let d = tempfile::tempdir().unwrap();
    let dev = d.path().join("fake-gpu");
    nix::sys::stat::mknod(
        &dev,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 11),
    )
    .unwrap();
    // mknod honours the umask: open it to the sandbox's user as the driver does.
    std::fs::set_permissions(&dev, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    assert!(
        std::fs::metadata(&dev)
            .unwrap()
            .file_type()
            .is_char_device()
    );
    let bind = Bind {
        host: dev.clone(),
        path: "/dev/fake-gpu".into(),
        writable: true,
    };
    let open = "if (exec 3>/dev/fake-gpu); then echo opened; else echo refused; fi; head -c1 /dev/zero | wc -c";
    let run = |allow: Option<Vec<DeviceRule>>| {
        let sb = rt
            .spawn(&SandboxSpec {
                binds: vec![bind.clone()],
                device_allow: allow,
                ..SandboxSpec::default()
            })
            .unwrap();
        let out = sb.exec(&ExecRequest::shell(open)).unwrap();
        sb.destroy().unwrap();
        (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // Without a device cgroup the node opens; with an empty list it does not; with
    // it listed it does again. /dev/zero (base) opens in every case.
    let (out, err) = run(None);
    assert_eq!(out, "opened\n1\n", "{err}");
    let (out, err) = run(Some(vec![]));
    assert_eq!(out, "refused\n1\n", "{err}");
    assert!(err.contains("not permitted"), "{err}");
    assert_eq!(
        run(Some(vec![DeviceRule {
            major: 1,
            minor: 11
        }]))
        .0,
        "opened\n1\n"
    );
}

/// SIGTERM to the workload reaches every process of the command's tree (a shell's
/// children included) and leaves init: the command ends with the status its trap
/// chose, and the sandbox still runs commands afterwards.
#[test]
fn signal_workload_reaches_the_tree_not_init() {
    if !common::root_or_skip("signal_workload_reaches_the_tree_not_init") {
        return;
    }
    let sb = std::sync::Arc::new(common::sandbox());
    let sb2 = sb.clone();
    let t = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let out = sb2
            .exec_streaming(
                &ExecRequest::shell(
                    "(trap 'echo child-term; exit 0' TERM; while :; do sleep 0.05; done) & \
                     trap 'echo parent-term; wait; exit 7' TERM; echo ready; while :; do sleep 0.05; done",
                ),
                |s, d| {
                    if s == Stream::Stdout {
                        seen.extend_from_slice(d)
                    }
                },
            )
            .unwrap();
        (out, seen)
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while sb.workload_pids().len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sb.workload_pids().len() >= 3, "{:?}", sb.workload_pids());
    assert!(!sb.workload_pids().contains(&sb.pid()));
    assert!(sb.signal_workload(Signal::SIGTERM) >= 2);
    let (out, seen) = t.join().unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert_eq!(out.status.code(), 7, "{out:?} {text}");
    assert!(
        text.contains("parent-term") && text.contains("child-term"),
        "{text}"
    );
    assert!(sb.workload_pids().is_empty());
    assert!(
        sb.exec(&ExecRequest::shell("true"))
            .unwrap()
            .status
            .success()
    );
    let ns = sb.pid_namespace().unwrap();
    assert!(!pids_in_namespace(ns).is_empty());
    sb.destroy().unwrap();
    assert!(pids_in_namespace(ns).is_empty());
}

#[test]
fn cpu_and_peak_memory_are_accounted() {
    if !common::root_or_skip("cpu_and_peak_memory_are_accounted") {
        return;
    }
    let sb = common::sandbox();
    let cg = sb.cgroup().unwrap();
    let before = cg.cpu_usage_ns().expect("cpu accounting");
    let out = sb
        .exec(&ExecRequest::shell(
            "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; head -c 40000000 /dev/zero | tail -c 1 >/dev/null",
        ))
        .unwrap();
    assert!(out.status.success());
    let after = cg.cpu_usage_ns().unwrap();
    assert!(after > before + 10_000_000, "{before} -> {after}");
    let peak = cg.memory_peak().expect("peak memory");
    assert!(peak >= 1 << 20, "{peak}");
    sb.destroy().unwrap();
}

#[test]
fn init_program_from_memory() {
    if !common::root_or_skip("init_program_from_memory") {
        return;
    }
    let bytes = std::fs::read(env!("CARGO_BIN_EXE_tessera-sandbox-init")).unwrap();
    let init = InitProgram::from_bytes("tessera-sandbox-init", &bytes).unwrap();
    assert!(init.path.starts_with("/proc/self/fd/"));
    let rt = Runtime::new(RuntimeConfig {
        init: Some(init),
        cgroups: true,
        guard: std::sync::Arc::new(tessera_sandbox::AllowAll),
        ..Default::default()
    })
    .unwrap();
    let sb = rt.spawn(&SandboxSpec::default()).unwrap();
    let out = sb.exec(&ExecRequest::shell("echo from-memfd")).unwrap();
    assert_eq!(out.stdout, b"from-memfd\n");
    sb.destroy().unwrap();
}

/// A memory limit too small for even the init program must fail the spawn (or OOM
/// the sandbox), never the supervisor: the child joins its cgroup only after it
/// exec'd, when it no longer shares the supervisor's memory. (Before, the OOM
/// killer killed the cloned child and with it this whole test process.)
#[test]
fn a_tiny_memory_limit_cannot_kill_the_supervisor() {
    if !common::root_or_skip("a_tiny_memory_limit_cannot_kill_the_supervisor") {
        return;
    }
    for bytes in [1000, 4096, 64 << 10, 1 << 20, 4 << 20] {
        let spec = SandboxSpec {
            limits: tessera_sandbox::Limits {
                memory_bytes: Some(bytes),
                ..Default::default()
            },
            ..SandboxSpec::default()
        };
        // Either outcome is fine; this process must be alive to see it.
        if let Ok(sb) = common::runtime().spawn(&spec) {
            let _ = sb.exec(&ExecRequest::shell("true"));
            sb.destroy().unwrap();
        }
    }
    let sb = common::sandbox();
    assert!(
        sb.exec(&ExecRequest::shell("true"))
            .unwrap()
            .status
            .success()
    );
}

/// Sealed folders (where the node runtime puts released weights): closed to the
/// commands until sealed, filled only through the pipe with exactly the announced
/// bytes (a short stream leaves no file), read-only and noexec once sealed, and
/// never filled again.
#[test]
fn sealed_folders() {
    if !common::root_or_skip("sealed_folders") {
        return;
    }
    let spec = SandboxSpec {
        sealed: vec!["/weights/m".into()],
        ..SandboxSpec::default()
    };
    let sb = common::spawn(&spec);
    let sh = |c: &str| {
        let o = sb.exec(&ExecRequest::shell(c)).unwrap();
        String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
    };
    // Before the seal the commands cannot even list it.
    assert!(sh("ls /weights/m || echo closed").contains("closed"));
    // Only a sealed folder of the spec can be filled.
    assert!(
        sb.fill_sealed("/tmp", "f", 1, |w| w.write_all(b"x"))
            .is_err()
    );
    // A short stream, or a producer that fails midway: no file is left.
    let e = sb
        .fill_sealed("/weights/m", "a.bin", 10, |w| w.write_all(b"12345"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("5 of 10"), "{e}");
    let e = sb
        .fill_sealed("/weights/m", "a.bin", 10, |w| {
            w.write_all(b"123")?;
            Err(std::io::Error::other("decrypt failed"))
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("decrypt failed"), "{e}");
    // A long one neither.
    assert!(
        sb.fill_sealed("/weights/m", "a.bin", 2, |w| w.write_all(b"123"))
            .is_err()
    );
    // A name with a slash is refused.
    assert!(
        sb.fill_sealed("/weights/m", "../x", 1, |w| w.write_all(b"1"))
            .is_err()
    );
    let big: Vec<u8> = (0..(3 << 20)).map(|i| (i % 253) as u8).collect();
    sb.fill_sealed("/weights/m", "a.bin", big.len() as u64, |w| {
        w.write_all(&big)
    })
    .unwrap();
    sb.seal("/weights/m").unwrap();
    let out = sh("ls /weights/m; wc -c < /weights/m/a.bin; \
        (echo x > /weights/m/a.bin) 2>/dev/null || echo write-refused; \
        (touch /weights/m/b) 2>/dev/null || echo create-refused; \
        grep ' /weights/m ' /proc/self/mountinfo");
    assert!(out.starts_with("a.bin\n3145728\n"), "{out}");
    assert!(
        out.contains("write-refused") && out.contains("create-refused"),
        "{out}"
    );
    assert!(
        out.contains(" ro,") && out.contains("noexec") && out.contains("ramfs"),
        "{out}"
    );
    assert_eq!(
        sb.read_file("/weights/m/a.bin").unwrap().len(),
        big.len(),
        "readable by the sandbox's own file operations"
    );
    // Sealed for good.
    assert!(
        sb.fill_sealed("/weights/m", "c.bin", 1, |w| w.write_all(b"1"))
            .is_err()
    );
    assert!(sb.seal("/weights/m").is_err());
    sb.destroy().unwrap();
}
