//! Operations and lifecycle: exec features, files, pause/resume, guard, and
//! create/destroy cycles that must leave nothing behind.

mod common;

use common::{root_or_skip, runtime, sandbox};
use std::sync::Arc;
use std::time::Duration;
use tessera_sandbox::{
    CheckDecision, Command, CommandCheck, ExecError, ExecRequest, ExitStatus, FileKind,
    InitProgram, Runtime, RuntimeConfig, SandboxSpec, TarLimits,
};

const T: Duration = Duration::from_secs(20);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn exec_passes_env_cwd_stdin_and_reports_status() {
    if !root_or_skip("exec_passes_env_cwd_stdin_and_reports_status") {
        return;
    }
    let sb = sandbox();
    let out = sb
        .exec(
            &ExecRequest::shell("echo \"$GREETING $(pwd)\"; tr a-z A-Z; echo err >&2; exit 7")
                .env("GREETING", "hello")
                .cwd("/tmp")
                .stdin("from stdin\n")
                .timeout(T),
        )
        .unwrap();
    assert_eq!(text(&out.stdout), "hello /tmp\nFROM STDIN\n");
    assert_eq!(text(&out.stderr), "err\n");
    assert_eq!(out.status, ExitStatus::Exited(7));
    assert!(!out.timed_out && !out.oom_killed);
    // argv form, PATH lookup, a missing program, a big stdin, a big output.
    let out = sb
        .exec(&ExecRequest::argv(["printf", "%s|", "a b", "c"]).timeout(T))
        .unwrap();
    assert_eq!(text(&out.stdout), "a b|c|");
    match sb.exec(&ExecRequest::argv(["no-such-program"])) {
        Err(ExecError::Start(e)) => assert_eq!(e.step, "execve"),
        other => panic!("{other:?}"),
    }
    let big = vec![b'x'; 3 << 20];
    let out = sb
        .exec(&ExecRequest::argv(["wc", "-c"]).stdin(big).timeout(T))
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), (3u64 << 20).to_string());
    let mut req = ExecRequest::shell("head -c 100000 /dev/zero").timeout(T);
    req.max_output = 1000;
    let out = sb.exec(&req).unwrap();
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout_truncated);
    assert!(matches!(
        sb.exec(&ExecRequest::argv(Vec::<String>::new())),
        Err(ExecError::EmptyCommand)
    ));
    // Templates: bash, python3 and coreutils work out of the box.
    let out = sb
        .exec(&ExecRequest::argv(["bash", "-c", "python3 -c 'print(6*7)' | cat"]).timeout(T))
        .unwrap();
    assert_eq!(text(&out.stdout), "42\n", "{}", text(&out.stderr));
}

#[test]
fn files_write_read_list_remove() {
    if !root_or_skip("files_write_read_list_remove") {
        return;
    }
    let sb = sandbox();
    sb.write_file("/workspace/dir/a.txt", b"alpha").unwrap();
    sb.write_file("/workspace/dir/b.bin", &[0u8, 255, 1])
        .unwrap();
    assert_eq!(sb.read_file("/workspace/dir/a.txt").unwrap(), b"alpha");
    let ls = sb.list("/workspace/dir").unwrap();
    let names: Vec<_> = ls
        .iter()
        .map(|e| (e.name.as_str(), e.kind, e.size))
        .collect();
    assert_eq!(
        names,
        vec![("a.txt", FileKind::File, 5), ("b.bin", FileKind::File, 3)]
    );
    let out = sb
        .exec(&ExecRequest::shell("cat /workspace/dir/a.txt").timeout(T))
        .unwrap();
    assert_eq!(text(&out.stdout), "alpha");
    sb.remove("/workspace/dir/a.txt", false).unwrap();
    assert!(sb.read_file("/workspace/dir/a.txt").is_err());
    assert!(
        sb.remove("/workspace/dir", false).is_err(),
        "non-empty dir needs recursive"
    );
    sb.remove("/workspace/dir", true).unwrap();
    assert!(sb.list("/workspace").unwrap().is_empty());
    sb.mkdir("/tmp/x/y").unwrap();
    assert_eq!(sb.list("/tmp/x").unwrap()[0].kind, FileKind::Dir);
    // Confined like commands: no writes to the base, no relative paths.
    let e = sb.write_file("/usr/evil", b"x").unwrap_err().to_string();
    assert!(e.contains("/usr/evil"), "{e}");
    assert!(sb.write_file("relative", b"x").is_err());
    assert!(
        sb.read_file("/nonexistent")
            .unwrap_err()
            .to_string()
            .contains("/nonexistent")
    );
}

#[test]
fn pause_and_resume() {
    if !root_or_skip("pause_and_resume") {
        return;
    }
    let sb = Arc::new(sandbox());
    let sb2 = sb.clone();
    // A command that counts while we pause it.
    let t = std::thread::spawn(move || {
        sb2.exec(
            &ExecRequest::shell("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo $i")
                .timeout(T),
        )
    });
    std::thread::sleep(Duration::from_millis(100));
    sb.pause().unwrap();
    assert!(
        sb.exec(&ExecRequest::shell("true")).is_err(),
        "exec while paused"
    );
    let frozen = sb.cgroup().unwrap().procs();
    assert!(!frozen.is_empty());
    std::thread::sleep(Duration::from_millis(100));
    sb.resume().unwrap();
    let out = t.join().unwrap().unwrap();
    assert_eq!(text(&out.stdout), "200000\n");
    // Destroy while paused works too.
    sb.pause().unwrap();
    sb.destroy().unwrap();
}

struct TestGuard;
impl CommandCheck for TestGuard {
    fn check(&self, _tenant: Option<&str>, command: &Command) -> CheckDecision {
        let s = command.display();
        if s.contains("rm -rf /") {
            CheckDecision::Block(vec!["recursive delete of /".into()])
        } else if s.contains("curl") {
            CheckDecision::Alert(vec!["network tool".into()])
        } else {
            CheckDecision::Allow
        }
    }
    fn redact(&self, _tenant: Option<&str>, _at: &str, output: &[u8]) -> Option<Vec<u8>> {
        let s = String::from_utf8_lossy(output);
        s.contains("AKIA")
            .then(|| s.replace("AKIAEXAMPLE", "[REDACTED]").into_bytes())
    }
}

#[test]
fn guard_checks_every_command_and_redacts_output() {
    if !root_or_skip("guard_checks_every_command_and_redacts_output") {
        return;
    }
    let rt = Runtime::new(RuntimeConfig {
        init: Some(InitProgram {
            path: env!("CARGO_BIN_EXE_tessera-sandbox-init").into(),
            args: vec![],
        }),
        cgroups: true,
        guard: Arc::new(TestGuard),
        tenant: Some("t1".into()),
        cgroup_backend: None,
        egress: None,
    })
    .unwrap();
    let sb = rt.spawn(&SandboxSpec::default()).unwrap();
    match sb.exec(&ExecRequest::shell("rm -rf / --no-preserve-root")) {
        Err(ExecError::Blocked(r)) => assert!(r.contains("recursive delete")),
        other => panic!("{other:?}"),
    }
    let out = sb
        .exec(&ExecRequest::shell("echo key=AKIAEXAMPLE; echo curl").timeout(T))
        .unwrap();
    assert_eq!(text(&out.stdout), "key=[REDACTED]\ncurl\n");
    assert!(out.redacted);
    assert_eq!(out.alerts, vec!["network tool".to_string()]);
    // The command line hides the program; the check of the inner execve still sees it.
    let out = sb
        .exec(
            &ExecRequest::shell(
                "X=rm; $X -rf / 2>&1; echo rc=$?; ls /usr >/dev/null && echo ls-ok",
            )
            .timeout(T),
        )
        .unwrap();
    let s = text(&out.stdout);
    assert!(s.contains("rc=126"), "{s}");
    assert!(s.contains("ls-ok"), "other execs are allowed: {s}");
    assert!(
        out.alerts.iter().any(|a| a.contains("execve")
            && a.contains("blocked")
            && a.contains("recursive delete")),
        "{:?}",
        out.alerts
    );
    // Many execs in a tree (each one checked) still work.
    let out = sb
        .exec(
            &ExecRequest::shell("for i in 1 2 3 4 5 6 7 8; do /bin/echo $i | cat; done | wc -l")
                .timeout(T),
        )
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), "8");
}

fn children_of_us() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        let ppid: i32 = rest.split_whitespace().nth(1).unwrap().parse().unwrap();
        if ppid == me {
            out.push(pid);
        }
    }
    out
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn mount_count() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .count()
}

/// `TESSERA_SANDBOX_CYCLES` (default 1000) create/destroy cycles, half of them running a
/// command, leave no process, mount, cgroup, descriptor (hence namespace) behind.
#[test]
fn create_destroy_cycles_leave_nothing_behind() {
    if !root_or_skip("create_destroy_cycles_leave_nothing_behind") {
        return;
    }
    let cycles: usize = std::env::var("TESSERA_SANDBOX_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    // Its own runtime, so other tests' sandboxes running in parallel do not count.
    let rt = Runtime::new(RuntimeConfig {
        init: Some(InitProgram {
            path: env!("CARGO_BIN_EXE_tessera-sandbox-init").into(),
            args: vec![],
        }),
        cgroups: true,
        ..Default::default()
    })
    .unwrap();
    let _ = runtime();
    // Let the pools of pre-made network namespaces fill, so that their descriptors are
    // counted before, not as a leak.
    for r in [&rt, &runtime()] {
        if let Some(p) = r.netns_pool() {
            p.fill(
                tessera_sandbox::netns::DEFAULT_READY,
                Duration::from_secs(30),
            );
        }
    }
    let mounts = mount_count();
    assert!(rt.cgroups().is_some(), "cgroups expected as root");
    let mut ids = Vec::new();
    let (fds_before, kids_before) = (fd_count(), children_of_us().len());
    let mut seen_pids = Vec::new();
    for i in 0..cycles {
        let sb = rt.spawn(&SandboxSpec::default()).unwrap();
        if i % 2 == 0 {
            let out = sb.exec(&ExecRequest::argv(["true"]).timeout(T)).unwrap();
            assert!(out.status.success());
        }
        ids.push(sb.id().to_string());
        seen_pids.push(sb.pid());
        sb.destroy().unwrap();
    }
    // Other tests in this binary may hold sandboxes, but none of ours remains.
    let live_kids = children_of_us();
    for p in &seen_pids {
        assert!(!live_kids.contains(p), "sandbox init {p} still running");
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists() || {
                let s = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
                !s.contains("tessera-sandbox")
            },
            "init {p} left behind"
        );
    }
    let left: Vec<String> = rt
        .cgroups()
        .unwrap()
        .list()
        .into_iter()
        .filter(|c| ids.iter().any(|id| c.ends_with(id.as_str())))
        .collect();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
    assert_eq!(mount_count(), mounts, "host mount table changed");
    // Other tests open descriptors concurrently; allow slack for them but not a leak per cycle.
    assert!(
        fd_count() <= fds_before + 16,
        "descriptors leaked: {} -> {}",
        fds_before,
        fd_count()
    );
    assert!(children_of_us().len() <= kids_before + 8);
}

#[test]
fn warm_pool_hands_over_ready_sandboxes_and_replaces_them() {
    if !root_or_skip("warm_pool_hands_over_ready_sandboxes_and_replaces_them") {
        return;
    }
    use tessera_sandbox::{PoolConfig, WarmPool};
    let mut pool = WarmPool::new(
        runtime(),
        SandboxSpec::default(),
        PoolConfig {
            min: 3,
            max: 6,
            horizon: Duration::from_millis(200),
            workers: 2,
        },
    );
    assert_eq!(
        pool.fill(3, Duration::from_secs(30)),
        3,
        "{:?}",
        pool.last_error()
    );
    let sb = pool.claim().unwrap();
    let out = sb
        .exec(&ExecRequest::argv(["echo", "warm"]).timeout(T))
        .unwrap();
    assert_eq!(text(&out.stdout), "warm\n");
    let used_id = sb.id().to_string();
    pool.release(sb);
    // Refilled in the background; the used one is never handed out again.
    assert_eq!(pool.fill(3, Duration::from_secs(30)), 3);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let sb = pool.try_claim().expect("ready");
        assert_ne!(sb.id(), used_id);
        seen.push(sb);
    }
    let st = pool.stats();
    assert_eq!(st.claims, 4);
    assert_eq!(st.misses, 0);
    assert!(st.target >= 3);
    for sb in seen {
        pool.release(sb);
    }
    pool.shutdown();
    let st = pool.stats();
    assert_eq!(st.ready, 0);
    assert_eq!(st.created, st.destroyed, "{st:?}");
}

struct NoEtc;
impl CommandCheck for NoEtc {
    fn check(&self, _t: Option<&str>, _c: &Command) -> CheckDecision {
        CheckDecision::Allow
    }
    fn check_file(
        &self,
        _t: Option<&str>,
        op: tessera_sandbox::FileAccess,
        path: &str,
    ) -> CheckDecision {
        if path.starts_with("/workspace/secret") && op != tessera_sandbox::FileAccess::Read {
            CheckDecision::Block(vec!["protected".into()])
        } else {
            CheckDecision::Allow
        }
    }
}

#[test]
fn guard_checks_file_operations() {
    if !root_or_skip("guard_checks_file_operations") {
        return;
    }
    let rt = Runtime::new(RuntimeConfig {
        init: Some(InitProgram {
            path: env!("CARGO_BIN_EXE_tessera-sandbox-init").into(),
            args: vec![],
        }),
        cgroups: false,
        guard: Arc::new(NoEtc),
        tenant: None,
        cgroup_backend: None,
        egress: None,
    })
    .unwrap();
    let sb = rt.spawn(&SandboxSpec::default()).unwrap();
    let e = sb
        .write_file("/workspace/secret/x", b"1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("protected"), "{e}");
    sb.write_file("/workspace/ok", b"1").unwrap();
    assert!(
        sb.read_file("/workspace/secret/x").is_err(),
        "was never written"
    );
}

#[test]
fn stale_cgroups_of_dead_supervisors_are_removed() {
    if !root_or_skip("stale_cgroups_of_dead_supervisors_are_removed") {
        return;
    }
    let rt = runtime();
    let m = rt.cgroups().expect("cgroups");
    // A cgroup named after a pid that cannot exist (above pid_max).
    let limits = tessera_sandbox::Limits::default();
    let cg = m.create("sb-99999999-1", &limits).unwrap();
    assert!(m.list().iter().any(|p| p.ends_with("sb-99999999-1")));
    assert!(
        m.remove_stale() >= 3,
        "memory, pids, freezer (and cpu) dirs"
    );
    assert!(!m.list().iter().any(|p| p.ends_with("sb-99999999-1")));
    // Our own live sandboxes are untouched.
    let sb = sandbox();
    m.remove_stale();
    assert!(m.list().iter().any(|p| p.ends_with(sb.id())));
    drop(cg);
}

#[test]
fn exec_streams_output_as_it_arrives() {
    if !root_or_skip("exec_streams_output_as_it_arrives") {
        return;
    }
    let sb = sandbox();
    // The command waits (up to ~10 s) for a file that the output callback creates when
    // it sees the first line: it can only finish early if output is streamed.
    let cmd = "echo one; echo err >&2; i=0; while [ ! -e /tmp/go ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; \
               [ -e /tmp/go ] && echo three";
    let mut seen_one = false;
    let mut stderr_chunks = Vec::new();
    let out = sb
        .exec_streaming(&ExecRequest::shell(cmd).timeout(T), |s, d| match s {
            tessera_sandbox::Stream::Stdout => {
                if !seen_one && d.starts_with(b"one") {
                    seen_one = true;
                    sb.write_file("/tmp/go", b"").unwrap();
                }
            }
            tessera_sandbox::Stream::Stderr => stderr_chunks.extend_from_slice(d),
        })
        .unwrap();
    assert!(seen_one);
    assert_eq!(
        text(&out.stdout),
        "one\nthree\n",
        "the callback did not run while the command ran"
    );
    assert_eq!(text(&stderr_chunks), "err\n");
    assert_eq!(text(&out.stderr), "err\n");
}

#[test]
fn directory_templates_are_bound_read_only() {
    if !root_or_skip("directory_templates_are_bound_read_only") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("tessera-tpl-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/hello.txt"), b"from template").unwrap();
    std::fs::create_dir(dir.path().join("tmp")).unwrap(); // reserved: replaced by the sandbox's own
    std::fs::write(dir.path().join("tmp/hidden"), b"x").unwrap();
    // Every real root file system has /root (a debootstrap template failed on it): the
    // sandbox owns it too.
    std::fs::create_dir(dir.path().join("root")).unwrap();
    std::fs::write(dir.path().join("root/secret"), b"x").unwrap();
    // Readable by the sandbox user (uid 101000 on the host).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let spec = SandboxSpec {
        template: tessera_sandbox::Template::Dir(dir.path().to_path_buf()),
        ..SandboxSpec::default()
    };
    let sb = common::spawn(&spec);
    // No /usr in this template, so no programs: the files API still works (it runs no
    // program), confined the same way.
    assert_eq!(sb.read_file("/data/hello.txt").unwrap(), b"from template");
    assert!(sb.read_file("/root/secret").is_err());
    assert!(
        sb.write_file("/data/new.txt", b"x").is_err(),
        "template must be read-only"
    );
    assert!(
        sb.read_file("/tmp/hidden").is_err(),
        "reserved entries come from the sandbox"
    );
    sb.write_file("/tmp/mine", b"ok").unwrap();
    assert!(
        sb.exec(&ExecRequest::argv(["/usr/bin/true"])).is_err(),
        "no /usr in this template"
    );
    assert!(!dir.path().join("data/new.txt").exists());
}

#[test]
fn tar_upload_and_download_round_trip() {
    if !root_or_skip("tar_upload_and_download_round_trip") {
        return;
    }
    // An archive made on the host.
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("pkg")).unwrap();
    std::fs::write(src.path().join("pkg/a.py"), b"print('a')\n").unwrap();
    std::fs::write(src.path().join("b.txt"), b"bee").unwrap();
    let archive = std::process::Command::new("tar")
        .args(["-c", "-f", "-", "-C"])
        .arg(src.path())
        .arg(".")
        .output()
        .unwrap();
    assert!(archive.status.success());
    let sb = sandbox();
    sb.upload_tar("/workspace/proj", &archive.stdout)
        .map(|_| ())
        .unwrap_or_else(|e| {
            // The directory must exist first: tar -C does not create it.
            panic!("{e}")
        });
    let out = sb
        .exec(&ExecRequest::shell("cd /workspace/proj && python3 pkg/a.py && cat b.txt").timeout(T))
        .unwrap();
    assert_eq!(text(&out.stdout), "a\nbee");
    sb.write_file("/workspace/proj/c.txt", b"sea").unwrap();
    let back = sb.download_tar("/workspace/proj").unwrap();
    let dst = tempfile::tempdir().unwrap();
    tessera_sandbox::tarball::unpack(&back, dst.path(), &TarLimits::default()).unwrap();
    assert_eq!(std::fs::read(dst.path().join("c.txt")).unwrap(), b"sea");
    assert_eq!(
        std::fs::read(dst.path().join("pkg/a.py")).unwrap(),
        b"print('a')\n"
    );
    // Into the read-only base: refused.
    assert!(sb.upload_tar("/usr", &archive.stdout).is_err());
    assert!(sb.download_tar("relative").is_err());
    // A single file packs under its own name.
    let one = sb.download_tar("/workspace/proj/b.txt").unwrap();
    let sum = tessera_sandbox::tarball::check(&one, &TarLimits::default()).unwrap();
    assert_eq!(sum.paths, [std::path::PathBuf::from("b.txt")]);
}

/// Builds an archive from raw headers, so that hostile names can be written.
fn raw_archive(entries: &[(tar::EntryType, &str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (kind, path, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(1);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
    }
    b.into_inner().unwrap()
}

/// Hostile uploads are refused before the sandbox sees them, with the entry named, and
/// nothing is unpacked; the limits apply.
#[test]
fn hostile_tar_uploads_are_refused() {
    if !root_or_skip("hostile_tar_uploads_are_refused") {
        return;
    }
    use tar::EntryType as E;
    let sb = sandbox();
    let cases = [
        (
            "absolute",
            raw_archive(&[(E::Regular, "/workspace/abs", "")]),
        ),
        ("`..`", raw_archive(&[(E::Regular, "../escape", "")])),
        ("outside", raw_archive(&[(E::Symlink, "l", "/etc")])),
        (
            "goes through",
            raw_archive(&[(E::Symlink, "l", "."), (E::Regular, "l/f", "")]),
        ),
        ("hard link", raw_archive(&[(E::Link, "h", "/etc/passwd")])),
        ("character device", raw_archive(&[(E::Char, "null", "")])),
        ("fifo", raw_archive(&[(E::Fifo, "p", "")])),
    ];
    for (want, a) in &cases {
        let e = sb.upload_tar("/workspace/up", a).unwrap_err();
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
    let ok = raw_archive(&[(E::Regular, "f", "")]);
    let tiny = TarLimits {
        max_archive_bytes: 512,
        ..TarLimits::default()
    };
    let e = sb.upload_tar_with("/workspace/up", &ok, &tiny).unwrap_err();
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
    let out = sb
        .exec(&ExecRequest::shell("ls -A /workspace").timeout(T))
        .unwrap();
    assert_eq!(
        text(&out.stdout).trim(),
        "",
        "nothing unpacked: {}",
        text(&out.stdout)
    );
    sb.upload_tar("/workspace/up", &ok).unwrap();
    assert_eq!(sb.read_file("/workspace/up/f").unwrap(), b"x");
}

/// A sandbox controls what it packs: links it made to host-looking paths travel in the
/// archive, and unpacking that archive on the host refuses them.
#[test]
fn downloaded_archives_cannot_write_outside_the_destination() {
    if !root_or_skip("downloaded_archives_cannot_write_outside_the_destination") {
        return;
    }
    let sb = sandbox();
    let out = sb
        .exec(
            &ExecRequest::shell(
                "mkdir -p /workspace/d && cd /workspace/d && echo hi > f && ln -s /etc/passwd pw && ln -s ../../.. up",
            )
            .timeout(T),
        )
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let a = sb.download_tar("/workspace/d").unwrap();
    let host = tempfile::tempdir().unwrap();
    let dst = host.path().join("dst");
    let e = tessera_sandbox::tarball::unpack(&a, &dst, &TarLimits::default()).unwrap_err();
    assert!(e.to_string().contains("outside the destination"), "{e}");
    assert!(!dst.exists());
    // The size limit holds inside the sandbox too.
    sb.exec(&ExecRequest::shell("head -c 100000 /dev/zero > /workspace/d/big").timeout(T))
        .unwrap();
    let tiny = TarLimits {
        max_archive_bytes: 50_000,
        ..TarLimits::default()
    };
    let e = sb.download_tar_with("/workspace/d", &tiny).unwrap_err();
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
}

/// Network namespaces made ahead of time are used once each: every sandbox has its own,
/// none is the host's, and loopback works inside.
#[test]
fn premade_network_namespaces_are_used_once() {
    if !root_or_skip("premade_network_namespaces_are_used_once") {
        return;
    }
    let rt = runtime();
    let pool = rt.netns_pool().expect("netns pool as root");
    pool.fill(2, Duration::from_secs(30));
    let taken = pool.stats().taken;
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    let a = sandbox();
    let b = sandbox();
    assert!(pool.stats().taken > taken, "{:?}", pool.stats());
    let na = std::fs::read_link(format!("/proc/{}/ns/net", a.pid())).unwrap();
    let nb = std::fs::read_link(format!("/proc/{}/ns/net", b.pid())).unwrap();
    assert_ne!(na, host);
    assert_ne!(nb, host);
    assert_ne!(na, nb);
    // The calling thread is back in the host's namespace.
    assert_eq!(
        std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
        host
    );
    let out = a
        .exec(
            &ExecRequest::argv([
                "python3",
                "-c",
                "import socket\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\nc=socket.create_connection(s.getsockname())\nprint('ok')",
            ])
            .timeout(T),
        )
        .unwrap();
    assert_eq!(text(&out.stdout), "ok\n", "{}", text(&out.stderr));
}
