//! Durable pause and resume, on both tiers: the failure classes users report against
//! E2B's pause/resume — a second resume, files after repeated pause/resume, a pause
//! during writes, resume after the process that paused it is gone. None may lose a
//! file or fail.
//!
//! The namespace tier keeps its writable folders (memory is not kept: processes are
//! restarted); the micro-VM tier keeps the guest's memory and device state.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tessera_sandbox::tier::{AnySandbox, NamespaceTier, PauseOptions, Phase, Tier};
use tessera_sandbox::{ExecError, ExecRequest, FileError, SandboxSpec};

const T: Duration = Duration::from_secs(60);
const CHILD_ENV: &str = "TESSERA_SNAPSHOT_CHILD_DIR";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn namespace_tier(test: &str) -> Option<Arc<dyn Tier>> {
    common::root_or_skip(test)
        .then(|| Arc::new(NamespaceTier::new(common::guarded_runtime())) as Arc<dyn Tier>)
}

fn microvm_tier(test: &str) -> Option<Arc<dyn Tier>> {
    common::vm_tier(test).map(|t| t as Arc<dyn Tier>)
}

fn snap_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tessera-snap-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn quick() -> PauseOptions {
    PauseOptions {
        drain: Duration::from_millis(200),
    }
}

/// Repeated pause/resume keeps every file, a second resume (and a second pause) is a
/// no-op, and calls while paused say so.
fn repeated(tier: Arc<dyn Tier>, name: &str) {
    let dir = snap_dir(name);
    let sb = AnySandbox::spawn(tier, &SandboxSpec::default()).expect("spawn");
    for round in 0..3 {
        sb.write_file(
            &format!("/workspace/f{round}.txt"),
            format!("round {round}").as_bytes(),
        )
        .expect("write");
        sb.exec(
            &ExecRequest::shell(format!(
                "mkdir -p /tmp/d{round} && echo x > /tmp/d{round}/y"
            ))
            .timeout(T),
        )
        .expect("exec");
        sb.pause_to_disk(&dir, &quick()).expect("pause");
        assert_eq!(sb.phase(), Phase::Paused);
        // A second pause is a no-op; calls while paused say "paused".
        sb.pause_to_disk(&dir, &quick()).expect("second pause");
        assert!(matches!(
            sb.read_file("/workspace/f0.txt"),
            Err(FileError::Exec(ExecError::Paused(_)))
        ));
        sb.resume().expect("resume");
        sb.resume().expect("a second resume is a no-op");
        assert_eq!(sb.phase(), Phase::Running);
        for r in 0..=round {
            let got = sb
                .read_file(&format!("/workspace/f{r}.txt"))
                .expect("read after resume");
            assert_eq!(text(&got), format!("round {r}"), "{name}: round {round}");
            let out = sb
                .exec(&ExecRequest::shell(format!("cat /tmp/d{r}/y")).timeout(T))
                .expect("exec after resume");
            assert_eq!(text(&out.stdout), "x\n", "{name}: round {round}");
        }
    }
    sb.destroy().expect("destroy");
    assert!(!dir.exists(), "destroy leaves the snapshot behind");
}

/// Writes in flight when the pause starts finish or answer `Paused`; every write that
/// answered Ok is there after the resume, whole.
fn during_writes(tier: Arc<dyn Tier>, name: &str) {
    let dir = snap_dir(name);
    let sb = Arc::new(AnySandbox::spawn(tier, &SandboxSpec::default()).expect("spawn"));
    let writer = {
        let sb = sb.clone();
        std::thread::spawn(move || {
            let mut acked = Vec::new();
            let body = vec![b'z'; 256 << 10];
            for i in 0..10_000 {
                match sb.write_file(&format!("/workspace/w{i}"), &body) {
                    Ok(()) => acked.push(i),
                    Err(FileError::Exec(ExecError::Paused(_))) => break,
                    Err(e) => panic!("write {i}: {e}"),
                }
            }
            acked
        })
    };
    // A command still writing when the pause comes is ended, and says `Paused`.
    let cmd = {
        let sb = sb.clone();
        std::thread::spawn(move || {
            sb.exec(&ExecRequest::shell("while :; do echo line >> /tmp/log; done").timeout(T))
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    sb.pause_to_disk(&dir, &quick()).expect("pause");
    let acked = writer.join().unwrap();
    let r = cmd.join().unwrap();
    assert!(matches!(r, Err(ExecError::Paused(_))), "{name}: {r:?}");
    assert!(
        !acked.is_empty(),
        "{name}: no write finished before the pause"
    );
    sb.resume().expect("resume");
    for i in &acked {
        let got = sb
            .read_file(&format!("/workspace/w{i}"))
            .expect("acked write is there");
        assert_eq!(got.len(), 256 << 10, "{name}: w{i} is torn");
    }
    let out = sb
        .exec(&ExecRequest::shell("sort -u /tmp/log").timeout(T))
        .expect("exec");
    assert_eq!(text(&out.stdout), "line\n", "{name}: the log is torn");
    sb.destroy().unwrap();
}

/// Resume by a process that did not pause it: a child process of this test makes the
/// sandbox, writes, pauses to `dir` and exits; this one opens the snapshot and resumes.
fn after_restart(tier: Arc<dyn Tier>, test: &str, name: &str) {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        // The child's part.
        let sb = AnySandbox::spawn(tier, &SandboxSpec::default()).expect("spawn");
        sb.write_file("/workspace/kept.txt", b"from the first process")
            .unwrap();
        sb.pause_to_disk(Path::new(&dir), &quick()).expect("pause");
        return;
    }
    let dir = snap_dir(name);
    let st = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &dir)
        .status()
        .unwrap();
    assert!(st.success(), "the first process failed: {st}");
    assert!(dir.join("meta.json").exists(), "no snapshot written");
    let sb = AnySandbox::open_paused(tier, &dir).expect("open paused");
    assert_eq!(sb.phase(), Phase::Paused);
    sb.resume().expect("resume in the second process");
    assert_eq!(
        sb.read_file("/workspace/kept.txt").unwrap(),
        b"from the first process"
    );
    let out = sb
        .exec(&ExecRequest::shell("echo alive").timeout(T))
        .unwrap();
    assert_eq!(text(&out.stdout), "alive\n");
    sb.destroy().unwrap();
}

/// Egress works again after a resume (open tunnels end at the pause; a new one goes
/// through): for the micro-VM, the relay's host end is made anew with the VM.
fn egress_after_resume(tier: Arc<dyn Tier>, name: &str) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            use std::io::Write;
            let _ = (&c).write_all(b"pong\n");
        }
    });
    let spec = SandboxSpec {
        network: tessera_sandbox::Network::Proxy(tessera_sandbox::EgressPolicy {
            allow_domains: vec!["localhost".into()],
            allow_private: true,
        }),
        ..SandboxSpec::default()
    };
    let sb = AnySandbox::spawn(tier, &spec).expect("spawn");
    let script = format!(
        "import socket\n\
         s = socket.create_connection(('127.0.0.1', 3128), timeout=20)\n\
         s.sendall(b'CONNECT localhost:{port} HTTP/1.1\\r\\n\\r\\n')\n\
         got = b''\n\
         while b'pong' not in got:\n\
         \x20   d = s.recv(200)\n\
         \x20   if not d: break\n\
         \x20   got += d\n\
         print(got.decode().split()[1], got.endswith(b'pong\\n'))\n"
    );
    let tunnel = || {
        let out = sb
            .exec(&ExecRequest::argv(["python3", "-c", &script]).timeout(T))
            .expect("exec");
        (text(&out.stdout), text(&out.stderr))
    };
    assert_eq!(tunnel().0, "200 True\n");
    let dir = snap_dir(name);
    sb.pause_to_disk(&dir, &quick()).expect("pause");
    sb.resume().expect("resume");
    let (out, err) = tunnel();
    assert_eq!(out, "200 True\n", "{err}");
    sb.destroy().unwrap();
}

#[test]
fn namespace_egress_works_after_a_resume() {
    if let Some(t) = namespace_tier("namespace_egress_works_after_a_resume") {
        egress_after_resume(t, "ns-egress");
    }
}

#[test]
fn microvm_egress_works_after_a_resume() {
    if let Some(t) = microvm_tier("microvm_egress_works_after_a_resume") {
        egress_after_resume(t, "vm-egress");
    }
}

#[test]
fn namespace_repeated_pause_resume_keeps_files() {
    if let Some(t) = namespace_tier("namespace_repeated_pause_resume_keeps_files") {
        repeated(t, "ns-repeated");
    }
}

#[test]
fn namespace_pause_during_writes_loses_nothing() {
    if let Some(t) = namespace_tier("namespace_pause_during_writes_loses_nothing") {
        during_writes(t, "ns-writes");
    }
}

#[test]
fn namespace_resume_after_the_owning_process_restarted() {
    let test = "namespace_resume_after_the_owning_process_restarted";
    if let Some(t) = namespace_tier(test) {
        after_restart(t, test, "ns-restart");
    }
}

#[test]
fn microvm_repeated_pause_resume_keeps_files() {
    if let Some(t) = microvm_tier("microvm_repeated_pause_resume_keeps_files") {
        repeated(t, "vm-repeated");
    }
}

#[test]
fn microvm_pause_during_writes_loses_nothing() {
    if let Some(t) = microvm_tier("microvm_pause_during_writes_loses_nothing") {
        during_writes(t, "vm-writes");
    }
}

#[test]
fn microvm_resume_after_the_owning_process_restarted() {
    let test = "microvm_resume_after_the_owning_process_restarted";
    if let Some(t) = microvm_tier(test) {
        after_restart(t, test, "vm-restart");
    }
}
