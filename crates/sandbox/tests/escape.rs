//! Escape tests: what code inside a sandbox must not be able to do, every case run
//! against both isolation tiers (`namespace::CASE` and `microvm::CASE`, made by
//! [`both_tiers!`] at the end). They need root (CI runs as root) and say so plainly when
//! they cannot run; the micro-VM cases need QEMU and a guest kernel too
//! (`.ci/vm-kernel.sh`). With `CI` set, a missing one fails the test instead.
//!
//! Where a tier answers differently the case says so next to the assertion (the
//! micro-VM tier's host process is QEMU; its egress is relayed to the host). What only the
//! micro-VM tier adds (its own kernel, QEMU's jail, the host's loopback out of reach
//! from the guest's network stack) is in `microvm.rs`.

mod common;

use common::{guarded_runtime, root_or_skip, runtime, vm_tier, vm_tier_walls_only};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;
use tessera_sandbox::tier::{Isolated, Tier, TierKind};
use tessera_sandbox::{ExecOutput, ExecRequest, ExitStatus, Limits, SandboxSpec, SpawnError};

/// A ceiling per command; the micro-VM tier runs under TCG here (seconds for Python).
const T: Duration = Duration::from_secs(60);

fn sh(sb: &dyn Isolated, cmd: &str) -> ExecOutput {
    sb.exec(&ExecRequest::shell(cmd).timeout(T)).expect("exec")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn py(sb: &dyn Isolated, script: &str) -> ExecOutput {
    sb.exec(&ExecRequest::argv(["python3", "-c", script]).timeout(T))
        .expect("exec python3")
}

/// Which guard the sandbox's tier has.
#[derive(Clone, Copy, PartialEq)]
enum Guard {
    /// [`tessera_sandbox::AllowAll`]: the case proves the kernel's walls hold on their
    /// own, so the guard must not stop its attempts first.
    WallsOnly,
    /// The shipped policy, as every caller gets it.
    Shipped,
}

/// A sandbox of `tier` made from `spec`, or `None` (with a line saying why) where the
/// tier cannot run here.
fn boot(tier: TierKind, test: &str, spec: &SandboxSpec, guard: Guard) -> Option<Box<dyn Isolated>> {
    Some(try_boot(tier, test, spec, guard)?.unwrap_or_else(|e| panic!("{test}: spawn: {e}")))
}

fn try_boot(
    tier: TierKind,
    test: &str,
    spec: &SandboxSpec,
    guard: Guard,
) -> Option<Result<Box<dyn Isolated>, SpawnError>> {
    match tier {
        TierKind::Namespace => {
            if !root_or_skip_ci(test) {
                return None;
            }
            let rt = match guard {
                Guard::WallsOnly => runtime(),
                Guard::Shipped => guarded_runtime(),
            };
            Some(rt.spawn(spec).map(|s| Box::new(s) as Box<dyn Isolated>))
        }
        TierKind::Microvm => {
            let t = match guard {
                Guard::WallsOnly => vm_tier_walls_only(test)?,
                Guard::Shipped => vm_tier(test)?,
            };
            Some(Tier::spawn(&*t, spec))
        }
    }
}

fn sandbox(tier: TierKind, test: &str) -> Option<Box<dyn Isolated>> {
    boot(tier, test, &SandboxSpec::default(), Guard::WallsOnly)
}

fn host_processes_are_invisible(tier: TierKind) {
    let Some(sb) = sandbox(tier, "host_processes_are_invisible") else {
        return;
    };
    // A host process of ours that the sandbox must not see.
    let mut host = std::process::Command::new("sleep")
        .arg("31.5")
        .spawn()
        .unwrap();
    let out = sh(
        &*sb,
        "for p in /proc/[0-9]*; do echo \"${p#/proc/} $(tr '\\0' ' ' < $p/cmdline)\"; done",
    );
    let _ = host.kill();
    let _ = host.wait();
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s} {}", text(&out.stderr));
    assert!(!s.contains("31.5"), "host process visible:\n{s}");
    let pids: Vec<i32> = s
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    assert!(pids.contains(&1), "{s}");
    assert!(
        pids.len() <= 5,
        "only init, the job's runner and the job expected:\n{s}"
    );
    assert!(
        s.lines().any(|l| l.starts_with("1 tessera-sandbox-init")),
        "{s}"
    );
}

fn host_files_outside_the_template_are_unreadable(tier: TierKind) {
    // A host file standing in for the store's data folder.
    let dir = tempfile::Builder::new()
        .prefix("tessera-escape-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let secret = dir.path().join("secret");
    std::fs::File::create(&secret)
        .unwrap()
        .write_all(b"TOPSECRET")
        .unwrap();
    let Some(sb) = sandbox(tier, "host_files_outside_the_template_are_unreadable") else {
        return;
    };
    for path in [
        "/etc/shadow".to_string(),
        "/root/.bashrc".to_string(),
        secret.display().to_string(),
        "/proc/1/root/etc/shadow".to_string(),
        "/sys/kernel/notes".to_string(),
    ] {
        let out = sb
            .exec(&ExecRequest::argv(["cat", path.as_str()]).timeout(T))
            .unwrap();
        assert!(
            !out.status.success(),
            "{path} readable: {}",
            text(&out.stdout)
        );
        assert!(!text(&out.stdout).contains("TOPSECRET"));
    }
    let out = sh(&*sb, "ls -A /root | wc -l; cat /etc/passwd");
    let s = text(&out.stdout);
    assert!(s.starts_with("0\n"), "/root must be empty: {s}");
    assert!(
        !s.contains("root:x:0:0:root:/root:/bin/bash"),
        "host /etc/passwd leaked: {s}"
    );
    // The file API is confined the same way.
    assert!(sb.read_file("/etc/shadow").is_err());
    assert!(sb.read_file(&secret.display().to_string()).is_err());
}

fn base_is_read_only_and_private_layers_are_writable(tier: TierKind) {
    let Some(sb) = sandbox(tier, "base_is_read_only_and_private_layers_are_writable") else {
        return;
    };
    for target in ["/usr/x", "/usr/bin/x", "/etc/x", "/x", "/dev/x", "/lib/x"] {
        let out = sb
            .exec(&ExecRequest::argv(["touch", target]).timeout(T))
            .unwrap();
        assert!(!out.status.success(), "could write {target}");
    }
    let out = sh(&*sb, "echo a > /bin/ls");
    assert!(!out.status.success(), "could overwrite /bin/ls");
    for target in ["/tmp/x", "/home/user/x", "/workspace/x", "/dev/shm/x"] {
        let out = sb
            .exec(&ExecRequest::argv(["touch", target]).timeout(T))
            .unwrap();
        assert!(
            out.status.success(),
            "could not write {target}: {}",
            text(&out.stderr)
        );
    }
}

/// Every denied family fails with the errno the policy says.
fn dangerous_syscalls_fail(tier: TierKind) {
    let Some(sb) = sandbox(tier, "dangerous_syscalls_fail") else {
        return;
    };
    let script = r#"
import ctypes, os, socket, errno
libc = ctypes.CDLL(None, use_errno=True)
def sc(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    print(name, r, ctypes.get_errno())
libc.mount.argtypes = [ctypes.c_char_p]*3 + [ctypes.c_ulong, ctypes.c_void_p]
ctypes.set_errno(0); r = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None); print("mount", r, ctypes.get_errno())
sc("umount2", 166, 0, 0)
sc("ptrace", 101, 0, 0, 0, 0)
sc("bpf", 321, 0, 0, 0)
sc("init_module", 175, 0, 0, 0)
sc("finit_module", 313, 0, 0, 0)
sc("delete_module", 176, 0, 0)
sc("kexec_load", 246, 0, 0, 0, 0)
sc("kexec_file_load", 320, 0, 0, 0, 0, 0)
sc("unshare_user", 272, 0x10000000)
sc("unshare_net", 272, 0x40000000)
sc("clone_newuser", 56, 0x10000000 | 17, 0, 0, 0, 0)
sc("setns", 308, 0, 0)
sc("keyctl", 250, 0, 0, 0, 0, 0)
sc("pivot_root", 155, 0, 0)
sc("chroot", 161, 0)
sc("open_by_handle_at", 304, 0, 0, 0)
sc("perf_event_open", 298, 0, 0, 0, 0, 0)
sc("userfaultfd", 323, 0)
sc("io_uring_setup", 425, 1, 0)
sc("reboot", 169, 0, 0, 0, 0)
sc("clone3", 435, 0, 0)
for name, fam, typ, proto in [("packet", 17, 3, 0), ("raw_icmp", 2, 3, 1), ("raw_nonblock", 2, 3 | 0o4000, 255)]:
    try:
        socket.socket(fam, typ, proto); print("socket_" + name, 0, 0)
    except OSError as e:
        print("socket_" + name, -1, e.errno)
try:
    os.setuid(0); print("setuid0", 0, 0)
except OSError as e:
    print("setuid0", -1, e.errno)
"#;
    let out = py(&*sb, script);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}\n{}", text(&out.stderr));
    let got: BTreeMap<String, (i64, i32)> = s
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((
                it.next()?.to_string(),
                (it.next()?.parse().ok()?, it.next()?.parse().ok()?),
            ))
        })
        .collect();
    let eperm = libc::EPERM;
    for name in [
        "mount",
        "umount2",
        "ptrace",
        "bpf",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "unshare_user",
        "unshare_net",
        "clone_newuser",
        "setns",
        "keyctl",
        "pivot_root",
        "chroot",
        "open_by_handle_at",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "reboot",
        "socket_packet",
        "socket_raw_icmp",
        "socket_raw_nonblock",
        "setuid0",
    ] {
        assert_eq!(got.get(name), Some(&(-1, eperm)), "{name}: {s}");
    }
    assert_eq!(got.get("clone3"), Some(&(-1, libc::ENOSYS)), "{s}");
    // Ordinary sockets still work (loopback inside the sandbox).
    let out = py(
        &*sb,
        "import socket\ns=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\nc=socket.create_connection(s.getsockname()); print('ok')",
    );
    assert_eq!(text(&out.stdout), "ok\n", "{}", text(&out.stderr));
}

fn network_none_reaches_neither_host_loopback_nor_dns(tier: TierKind) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let Some(sb) = sandbox(tier, "network_none_reaches_neither_host_loopback_nor_dns") else {
        return;
    };
    let script = format!(
        r#"
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2); print("connect ok")
except OSError as e:
    print("connect failed", e.errno)
try:
    socket.getaddrinfo("example.com", 80); print("dns ok")
except OSError as e:
    print("dns failed")
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2); print("egress ok")
except OSError as e:
    print("egress failed", e.errno)
print(open("/proc/net/dev").read().count(":"))
"#
    );
    let out = py(&*sb, &script);
    let s = text(&out.stdout);
    assert!(
        s.contains(&format!("connect failed {}", libc::ECONNREFUSED)),
        "{s}"
    );
    assert!(s.contains("dns failed"), "{s}");
    assert!(s.contains("egress failed"), "{s}");
    assert!(s.ends_with("1\n"), "only lo expected: {s}");
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
}

fn fork_bomb_stops_at_the_pids_limit(tier: TierKind) {
    let spec = SandboxSpec {
        limits: Limits {
            pids: Some(32),
            ..Limits::default()
        },
        ..SandboxSpec::default()
    };
    let Some(sb) = boot(
        tier,
        "fork_bomb_stops_at_the_pids_limit",
        &spec,
        Guard::WallsOnly,
    ) else {
        return;
    };
    // Count how many processes can be made: fork must fail with EAGAIN before 32.
    let script = r#"
import os, errno, time
n = 0
kids = []
while n < 1000:
    try:
        pid = os.fork()
    except OSError as e:
        print("stopped", n, e.errno); break
    if pid == 0:
        time.sleep(30); os._exit(0)
    kids.append(pid); n += 1
"#;
    let out = py(&*sb, script);
    let s = text(&out.stdout);
    let mut it = s.split_whitespace();
    assert_eq!(it.next(), Some("stopped"), "{s} {}", text(&out.stderr));
    let n: u32 = it.next().unwrap().parse().unwrap();
    assert!(n < 32, "{s}");
    assert_eq!(it.next().unwrap().parse::<i32>().unwrap(), libc::EAGAIN);
    // A real shell fork bomb: stopped by the limit, ended by the timeout, and the
    // sandbox still works afterwards.
    let out = sb
        .exec(
            &ExecRequest::shell("bomb() { bomb | bomb & }; bomb; sleep 5")
                .timeout(Duration::from_secs(2)),
        )
        .unwrap();
    assert!(out.timed_out || !out.status.success());
    let out = sh(&*sb, "echo alive; ls -d /proc/[0-9]* | wc -l");
    assert_eq!(text(&out.stdout).lines().next(), Some("alive"));
    let n: u32 = text(&out.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(n <= 5, "fork bomb left {n} processes");
}

fn memory_hog_is_oom_killed_and_reported(tier: TierKind) {
    let spec = SandboxSpec {
        limits: Limits {
            memory_bytes: Some(64 << 20),
            ..Limits::default()
        },
        ..SandboxSpec::default()
    };
    let Some(sb) = boot(
        tier,
        "memory_hog_is_oom_killed_and_reported",
        &spec,
        Guard::WallsOnly,
    ) else {
        return;
    };
    let out = py(
        &*sb,
        "x = []\nfor i in range(64):\n    x.append(bytearray(16 << 20))\nprint('survived')",
    );
    assert!(!text(&out.stdout).contains("survived"));
    assert_eq!(
        out.status,
        ExitStatus::Signaled(libc::SIGKILL),
        "{}",
        text(&out.stderr)
    );
    assert!(out.oom_killed, "OOM kill not reported");
    // The sandbox's init survived and the next command runs.
    let out = sh(&*sb, "echo fine");
    assert_eq!(text(&out.stdout), "fine\n");
    assert!(!out.oom_killed);
}

fn disk_writes_stop_at_the_limit(tier: TierKind) {
    let spec = SandboxSpec {
        limits: Limits {
            disk_bytes: 1 << 20,
            ..Limits::default()
        },
        ..SandboxSpec::default()
    };
    let Some(sb) = boot(
        tier,
        "disk_writes_stop_at_the_limit",
        &spec,
        Guard::WallsOnly,
    ) else {
        return;
    };
    for dir in ["/workspace", "/tmp", "/home/user"] {
        let out = sh(
            &*sb,
            &format!("dd if=/dev/zero of={dir}/big bs=64k count=64 2>&1; stat -c %s {dir}/big"),
        );
        let s = text(&out.stdout);
        assert!(s.contains("No space left on device"), "{dir}: {s}");
        let size: u64 = s.lines().last().unwrap().trim().parse().unwrap();
        assert!(size <= 1 << 20, "{dir}: wrote {size}");
    }
}

fn timeout_kills_the_whole_tree(tier: TierKind) {
    let Some(sb) = sandbox(tier, "timeout_kills_the_whole_tree") else {
        return;
    };
    let out = sb
        .exec(
            &ExecRequest::shell("sleep 100 & (sleep 101 &) ; setsid sleep 102 & sh -c 'sleep 103' & echo started; wait")
                // Long enough for the micro-VM's guest under TCG to start the four.
                .timeout(Duration::from_secs(3)),
        )
        .unwrap();
    assert!(out.timed_out);
    assert_eq!(text(&out.stdout), "started\n");
    assert_eq!(out.status, ExitStatus::Signaled(libc::SIGKILL));
    let out = sh(&*sb, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '");
    let s = text(&out.stdout);
    assert!(!s.contains("sleep 10"), "survivors: {s}");
    // Background processes of a command that finished are gone too.
    let out = sh(&*sb, "setsid sleep 104 & sleep 105 & echo bg");
    assert_eq!(text(&out.stdout), "bg\n");
    let s = text(&sh(&*sb, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout);
    assert!(!s.contains("sleep 10"), "survivors: {s}");
}

fn capabilities_are_dropped_and_no_new_privs_is_set(tier: TierKind) {
    let Some(sb) = sandbox(tier, "capabilities_are_dropped_and_no_new_privs_is_set") else {
        return;
    };
    let s = text(
        &sh(
            &*sb,
            "grep -E '^(Uid|CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
        )
        .stdout,
    );
    for want in [
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapAmb:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "Uid:\t1000\t1000\t1000\t1000",
    ] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }
    // On the host, the sandbox's process is an unprivileged uid: root inside a
    // namespace sandbox maps to one of the sandboxes' range; a micro-VM's QEMU runs as
    // the jail's uid, just below it.
    let status = std::fs::read_to_string(format!("/proc/{}/status", sb.host_pid())).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let host_uid: u32 = uid_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let floor = match tier {
        TierKind::Namespace => 100_000,
        TierKind::Microvm => tessera_sandbox::vm::JAIL_ID,
    };
    assert!(host_uid >= floor, "{uid_line}");
}

fn signals_cannot_reach_init(tier: TierKind) {
    let Some(sb) = sandbox(tier, "signals_cannot_reach_init") else {
        return;
    };
    let out = sh(&*sb, "kill -9 1; echo $?");
    assert_ne!(text(&out.stdout).trim(), "0");
    sb.ping().unwrap();
}

/// Egress through the proxy: allowed domains only, non-public addresses refused unless
/// the policy allows them, and still no direct route out.
fn egress_proxy_enforces_the_allow_list(tier: TierKind) {
    // A host service standing in for "the internet": echoes one line.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::{BufRead, BufReader};
                let mut line = String::new();
                let _ = BufReader::new(&c).read_line(&mut line);
                let _ = (&c).write_all(format!("echo:{line}").as_bytes());
            });
        }
    });
    let script = format!(
        r#"
import socket, os
def tunnel(host):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(f"CONNECT {{host}}:{port} HTTP/1.1\r\nHost: {{host}}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(1)
        if not d: break
        head += d
    status = head.split(b" ")[1].decode() if head else "none"
    if status != "200":
        return status
    s.sendall(b"ping\n")
    return status + " " + s.recv(100).decode().strip()
print("allowed", tunnel("localhost"))
print("denied", tunnel("example.org"))
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2); print("direct ok")
except OSError as e:
    print("direct failed")
print("env", os.environ.get("https_proxy"))
"#
    );
    let spec = |allow_private| SandboxSpec {
        network: tessera_sandbox::Network::Proxy(tessera_sandbox::EgressPolicy {
            allow_domains: vec!["localhost".into()],
            allow_private,
        }),
        ..SandboxSpec::default()
    };
    // The micro-VM tier has no network device: its guest relays the proxy socket's
    // connections to the host, whose proxy applies the same policy.
    let Some(sb) = boot(
        tier,
        "egress_proxy_enforces_the_allow_list",
        &spec(true),
        Guard::WallsOnly,
    ) else {
        return;
    };
    let out = py(&*sb, &script);
    let s = text(&out.stdout);
    assert!(
        s.contains("allowed 200 echo:ping"),
        "{s}\n{}",
        text(&out.stderr)
    );
    assert!(s.contains("denied 403"), "{s}");
    assert!(s.contains("direct failed"), "{s}");
    assert!(s.contains("env http://127.0.0.1:3128"), "{s}");
    sb.destroy().unwrap();
    // Default: an allowed name that resolves to loopback is still refused.
    let sb = boot(
        tier,
        "egress_proxy_enforces_the_allow_list",
        &spec(false),
        Guard::WallsOnly,
    )
    .expect("the tier ran a moment ago");
    let s = text(&py(&*sb, &script).stdout);
    assert!(s.contains("allowed 403"), "{s}");
}

// ------------------------------------------------------------ issue 16: the execve
// check follows the binary, not its name

/// Root, or a clear skip; with `CI` set a missing root is a failure, not a skip.
fn root_or_skip_ci(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test} needs root (user namespaces, cgroups) and CI is set: run the tests as root"
    );
    root_or_skip(test)
}

/// Writes `script` to `path` inside the sandbox through the files API, so the command
/// line that runs it (`sh PATH`) shows nothing of what it does: only the per-`execve`
/// check sees the programs inside.
fn put_script(sb: &dyn Isolated, path: &str, script: &str) {
    sb.write_file(path, script.as_bytes())
        .expect("write script");
}

fn guarded(tier: TierKind, test: &str) -> Option<Box<dyn Isolated>> {
    boot(tier, test, &SandboxSpec::default(), Guard::Shipped)
}

fn canary_alive(sb: &dyn Isolated) -> bool {
    text(&sh(sb, "cat /workspace/canary 2>&1").stdout).contains("still here")
}

fn a_linked_or_copied_rm_is_judged_as_rm(tier: TierKind) {
    let Some(sb) = guarded(tier, "a_linked_or_copied_rm_is_judged_as_rm") else {
        return;
    };
    assert!(
        sh(&*sb, "echo still here > /workspace/canary")
            .status
            .success()
    );
    if tier == TierKind::Microvm {
        // The guest's kernel protects symlinks (`fs.protected_symlinks`, on in most
        // distributions; this host may have it off), so `/tmp/r` is a link that the
        // sandbox's init, as root, may not follow: the probe must follow it as the
        // caller, or refuse (before, it judged `r` by its name and the rm ran).
        let on = sh(&*sb, "cat /proc/sys/fs/protected_symlinks");
        assert_eq!(text(&on.stdout).trim(), "1", "{}", text(&on.stderr));
    }
    // Made in one command, used in another: the line check of the second cannot know.
    let out = sh(
        &*sb,
        "ln -s /bin/rm /tmp/r && cp /bin/rm /tmp/del && echo made",
    );
    assert_eq!(text(&out.stdout), "made\n", "{}", text(&out.stderr));
    for prog in ["/tmp/r", "/tmp/del"] {
        // The command itself (the job's first execve).
        let r = sb.exec(&ExecRequest::argv([prog, "-rf", "--no-preserve-root", "/"]).timeout(T));
        assert!(
            !matches!(&r, Ok(o) if o.status.success()),
            "{prog} -rf / ran: {r:?}"
        );
        assert!(canary_alive(&*sb), "{prog} deleted the canary");
        // Inside a script: a later execve of the job's tree.
        put_script(
            &*sb,
            "/tmp/s.sh",
            &format!("{prog} -rf --no-preserve-root /; echo rc=$?\n"),
        );
        let out = sh(&*sb, "sh /tmp/s.sh 2>&1");
        let s = text(&out.stdout);
        assert!(s.contains("rc=126"), "{prog}: {s}");
        assert!(canary_alive(&*sb), "{prog} deleted the canary: {s}");
        assert!(
            out.alerts.iter().any(|a| a.contains("blocked")
                && a.contains("the file is `rm`")
                && a.contains("cmd.delete_root")),
            "{prog}: {:?}",
            out.alerts
        );
    }
    // The same programs on harmless paths still run.
    put_script(
        &*sb,
        "/tmp/ok.sh",
        "touch /tmp/junk; /tmp/del -f /tmp/junk; echo rc=$?\n",
    );
    let s = text(&sh(&*sb, "sh /tmp/ok.sh 2>&1").stdout);
    assert!(s.contains("rc=0"), "{s}");
    let _ = sb.destroy();
}

fn copies_of_disk_tools_shells_and_interpreters_are_judged_as_the_original(tier: TierKind) {
    let Some(sb) = guarded(
        tier,
        "copies_of_disk_tools_shells_and_interpreters_are_judged_as_the_original",
    ) else {
        return;
    };
    assert!(
        sh(&*sb, "echo still here > /workspace/canary")
            .status
            .success()
    );
    let out = sh(
        &*sb,
        "cp /bin/dd /tmp/copy && cp /bin/bash /tmp/b2 && cp \"$(readlink -f /usr/bin/python3)\" /tmp/p && echo made",
    );
    assert_eq!(text(&out.stdout), "made\n", "{}", text(&out.stderr));
    put_script(
        &*sb,
        "/tmp/s.sh",
        concat!(
            "/tmp/copy if=/dev/zero of=/dev/sda bs=1M count=1; echo dd=$?\n",
            "/tmp/b2 -c 'rm -rf --no-preserve-root /'; echo bash=$?\n",
            "/tmp/p -c 'import shutil; shutil.rmtree(\"/\")'; echo py=$?\n",
        ),
    );
    let out = sh(&*sb, "sh /tmp/s.sh 2>&1");
    let s = text(&out.stdout);
    for want in ["dd=126", "bash=126", "py=126"] {
        assert!(s.contains(want), "{want}: {s}\n{:?}", out.alerts);
    }
    assert!(canary_alive(&*sb), "{s}");
    for (prog, rule) in [
        ("dd", "cmd.disk_destroy"),
        ("bash", "cmd.delete_root"),
        ("python3", "cmd.delete_root"),
    ] {
        assert!(
            out.alerts
                .iter()
                .any(|a| a.contains(&format!("the file is `{prog}")) && a.contains(rule)),
            "{prog}: {:?}",
            out.alerts
        );
    }
    let _ = sb.destroy();
}

fn an_rm_executed_from_memory_is_judged_as_rm(tier: TierKind) {
    let Some(sb) = guarded(tier, "an_rm_executed_from_memory_is_judged_as_rm") else {
        return;
    };
    assert!(
        sh(&*sb, "echo still here > /workspace/canary")
            .status
            .success()
    );
    put_script(
        &*sb,
        "/tmp/m.py",
        concat!(
            "import os\n",
            "fd = os.memfd_create('x')\n",
            "os.write(fd, open('/bin/rm', 'rb').read())\n",
            "try:\n",
            "    os.execv(f'/proc/self/fd/{fd}', ['x', '-rf', '--no-preserve-root', '/'])\n",
            "except PermissionError:\n",
            "    print('refused')\n",
        ),
    );
    let out = sh(&*sb, "python3 /tmp/m.py 2>&1");
    let s = text(&out.stdout);
    assert!(s.contains("refused"), "{s} {:?}", out.alerts);
    assert!(canary_alive(&*sb), "{s}");
    let _ = sb.destroy();
}

fn harmless_look_alikes_still_run(tier: TierKind) {
    let Some(sb) = guarded(tier, "harmless_look_alikes_still_run") else {
        return;
    };
    assert!(
        sh(&*sb, "echo still here > /workspace/canary")
            .status
            .success()
    );
    let out = sh(
        &*sb,
        "cp /bin/ls /tmp/rm && cp /bin/cat /tmp/x && echo made",
    );
    assert_eq!(text(&out.stdout), "made\n", "{}", text(&out.stderr));
    // A copy of ls named rm is ls, whatever its arguments look like to rm.
    put_script(
        &*sb,
        "/tmp/s.sh",
        "/tmp/rm -rf / >/dev/null; echo ls=$?; /tmp/rm /workspace; /tmp/x /workspace/canary; echo cat=$?\n",
    );
    let out = sh(&*sb, "sh /tmp/s.sh 2>&1");
    let s = text(&out.stdout);
    assert!(
        s.contains("canary") && s.contains("ls=0"),
        "{s} {:?}",
        out.alerts
    );
    assert!(s.contains("still here") && s.contains("cat=0"), "{s}");
    assert!(
        !out.alerts.iter().any(|a| a.contains("blocked")),
        "{:?}",
        out.alerts
    );
    assert!(canary_alive(&*sb));
    // And the job's own command, by argv.
    let out = sb
        .exec(&ExecRequest::argv(["/tmp/x", "/workspace/canary"]).timeout(T))
        .expect("exec");
    assert_eq!(text(&out.stdout), "still here\n");
    let _ = sb.destroy();
}

// ------------------------------------------------------------ issue 16: streaming
// redaction holds across chunks

fn a_secret_split_across_stream_chunks_never_leaves_the_sandbox(tier: TierKind) {
    let Some(sb) = guarded(
        tier,
        "a_secret_split_across_stream_chunks_never_leaves_the_sandbox",
    ) else {
        return;
    };
    // Two writes a third of a second apart: two chunks, the key split between them.
    let cmd = "printf 'start\\nkey AKIAQWERTY'; sleep 0.3; printf 'UIOPASDFGH end\\n'; \
               printf 'mail bob@exam' >&2; sleep 0.3; printf 'ple.com\\n' >&2";
    let mut chunks: Vec<(tessera_sandbox::Stream, Vec<u8>)> = Vec::new();
    let out = sb
        .exec_streaming(&ExecRequest::shell(cmd).timeout(T), &mut |st, d| {
            chunks.push((st, d.to_vec()))
        })
        .expect("exec");
    let streamed = |want: tessera_sandbox::Stream| -> String {
        chunks
            .iter()
            .filter(|(st, _)| *st == want)
            .map(|(_, d)| text(d))
            .collect()
    };
    let so = streamed(tessera_sandbox::Stream::Stdout);
    let se = streamed(tessera_sandbox::Stream::Stderr);
    assert!(chunks.len() >= 2, "{chunks:?}");
    for piece in ["AKIA", "UIOPASDFGH", "bob@", "exam"] {
        assert!(
            !so.contains(piece) && !se.contains(piece),
            "{piece} leaked: {so:?} {se:?}"
        );
    }
    assert_eq!(so, "start\nkey [REDACTED:aws_access_key] end\n");
    assert_eq!(se, "mail [REDACTED:email]\n");
    // The stream says what the final output says, and `redacted` is true.
    assert_eq!(text(&out.stdout), so);
    assert_eq!(text(&out.stderr), se);
    assert!(out.redacted);
    // Clean output streams as it comes, and is not marked redacted.
    let mut n = 0;
    let out = sb
        .exec_streaming(
            &ExecRequest::shell("echo one; sleep 0.3; echo two").timeout(T),
            &mut |_, d| {
                n += 1;
                assert!(!d.is_empty());
            },
        )
        .expect("exec");
    assert!(n >= 2, "clean lines were held back");
    assert!(!out.redacted);
    let _ = sb.destroy();
}

// ------------------------------------------------------------------ both tiers

/// Makes `namespace::CASE` and `microvm::CASE` for each case.
macro_rules! both_tiers {
    ($($case:ident),* $(,)?) => {
        mod namespace {
            $( #[test] fn $case() { super::$case(super::TierKind::Namespace) } )*
        }
        mod microvm {
            $( #[test] fn $case() { super::$case(super::TierKind::Microvm) } )*
        }
    };
}

both_tiers!(
    host_processes_are_invisible,
    host_files_outside_the_template_are_unreadable,
    base_is_read_only_and_private_layers_are_writable,
    dangerous_syscalls_fail,
    network_none_reaches_neither_host_loopback_nor_dns,
    fork_bomb_stops_at_the_pids_limit,
    memory_hog_is_oom_killed_and_reported,
    disk_writes_stop_at_the_limit,
    timeout_kills_the_whole_tree,
    capabilities_are_dropped_and_no_new_privs_is_set,
    signals_cannot_reach_init,
    egress_proxy_enforces_the_allow_list,
    a_linked_or_copied_rm_is_judged_as_rm,
    copies_of_disk_tools_shells_and_interpreters_are_judged_as_the_original,
    an_rm_executed_from_memory_is_judged_as_rm,
    harmless_look_alikes_still_run,
    a_secret_split_across_stream_chunks_never_leaves_the_sandbox,
);
