//! The micro-VM tier: a QEMU `microvm` guest with its own kernel, its agent running the
//! namespace sandbox inside, the host's guard on every command, file and `execve`.
//!
//! Boots are slow under TCG (seconds), so the cases that only read share one VM; the
//! ones that change what they look at boot their own.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tessera_sandbox::tier::Isolated;
use tessera_sandbox::vm::VmSandbox;
use tessera_sandbox::{ExecOutput, ExecRequest, SandboxSpec};

const T: Duration = Duration::from_secs(60);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn sh(sb: &dyn Isolated, cmd: &str) -> ExecOutput {
    sb.exec(&ExecRequest::shell(cmd).timeout(T)).expect("exec")
}

/// One VM shared by the read-only cases.
fn shared(test: &str) -> Option<Arc<VmSandbox>> {
    static VM: OnceLock<Arc<VmSandbox>> = OnceLock::new();
    let tier = common::vm_tier(test)?;
    Some(
        VM.get_or_init(|| Arc::new(tier.spawn_vm(&SandboxSpec::default()).expect("boot")))
            .clone(),
    )
}

#[test]
fn exec_round_trip_and_files_in_and_out() {
    let Some(vm) = shared("exec_round_trip_and_files_in_and_out") else {
        return;
    };
    let out = sh(&*vm, "echo hi; echo err >&2; exit 3");
    assert_eq!(text(&out.stdout), "hi\n");
    assert_eq!(text(&out.stderr), "err\n");
    assert_eq!(out.status.code(), 3, "{out:?}");
    // stdin in, files in and out.
    let mut req = ExecRequest::shell("cat; id -u").timeout(T);
    req.stdin = Some(b"from stdin\n".to_vec());
    let out = vm.exec(&req).expect("exec");
    assert_eq!(text(&out.stdout), "from stdin\n1000\n");
    vm.write_file("/workspace/in.txt", b"payload")
        .expect("write");
    let out = sh(
        &*vm,
        "cat /workspace/in.txt; echo -n out > /workspace/out.txt",
    );
    assert_eq!(text(&out.stdout), "payload");
    assert_eq!(vm.read_file("/workspace/out.txt").expect("read"), b"out");
    let names: Vec<String> = vm
        .list("/workspace")
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&"in.txt".to_string()), "{names:?}");
}

// ------------------------------------------------------------------ escape cases

#[test]
fn the_guest_runs_its_own_kernel() {
    let Some(vm) = shared("the_guest_runs_its_own_kernel") else {
        return;
    };
    let host = nix::sys::utsname::uname().unwrap();
    let host = host.release().to_string_lossy().into_owned();
    let guest = text(&sh(&*vm, "uname -r").stdout).trim().to_string();
    assert_eq!(
        guest,
        vm.guest_kernel(),
        "the agent's report and uname disagree"
    );
    assert_ne!(guest, host, "the guest shares the host's kernel");
    // Not the host's boot either: the guest has been up for seconds, not hours.
    let up: f64 = text(&sh(&*vm, "cut -d' ' -f1 /proc/uptime").stdout)
        .trim()
        .parse()
        .unwrap();
    let host_up: f64 = std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(up < host_up, "guest uptime {up} s, host {host_up} s");
}

#[test]
fn host_processes_and_files_are_invisible() {
    let Some(vm) = shared("host_processes_and_files_are_invisible") else {
        return;
    };
    // A host process no guest process looks like (a unique argument), and a host
    // file beside the VM's own cache (which the guest's disk was made from).
    let uniq = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let marker = format!("600.{}{uniq}", std::process::id());
    let mut child = std::process::Command::new("sleep")
        .arg(&marker)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let secret = std::env::temp_dir().join(format!("tessera-host-file-{uniq}.txt"));
    std::fs::write(&secret, "host secret").unwrap();
    let out = sh(
        &*vm,
        &format!(
            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo; \
             cat {} 2>&1; ls /proc | grep -c '^[0-9]'",
            secret.display()
        ),
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&secret);
    let s = text(&out.stdout);
    assert!(!s.contains(&marker), "a host process is visible: {s}");
    assert!(!s.contains("host secret"), "a host file is readable: {s}");
    assert!(s.contains("No such file"), "{s}");
    // The guest's sandbox sees a handful of its own processes, not the host's hundreds.
    let n: usize = s.lines().last().unwrap().trim().parse().unwrap();
    assert!(n < 20, "{n} processes visible: {s}");
}

#[test]
fn the_guest_cannot_reach_the_hosts_loopback() {
    let Some(vm) = shared("the_guest_cannot_reach_the_hosts_loopback") else {
        return;
    };
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    l.set_nonblocking(true).unwrap();
    let out = sh(
        &*vm,
        &format!(
            "python3 -c 'import socket; s=socket.socket(); s.settimeout(3); \
             s.connect((\"127.0.0.1\", {port})); print(\"connected\")' 2>&1; \
             python3 -c 'import socket; s=socket.socket(); s.settimeout(3); \
             s.connect((\"10.0.2.2\", {port})); print(\"connected\")' 2>&1; \
             ls /sys/class/net"
        ),
    );
    let s = text(&out.stdout);
    assert!(!s.contains("connected\n"), "reached the host: {s}");
    assert!(
        l.accept().is_err(),
        "the host's listener saw a connection: {s}"
    );
    // Nothing answered: refused by the guest's own loopback, or no route at all.
    assert!(
        s.contains("Connection refused") || s.contains("unreachable") || s.contains("timed out"),
        "{s}"
    );
}

/// `Name:\tvalue` of /proc/PID/status.
fn status_field(pid: i32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn qemu_runs_confined() {
    let Some(vm) = shared("qemu_runs_confined") else {
        return;
    };
    let pid = vm.host_pid();
    // seccomp filter mode, no new privileges, no capabilities, not root.
    assert_eq!(
        status_field(pid, "Seccomp"),
        "2",
        "QEMU has no seccomp filter"
    );
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(status_field(pid, "CapPrm"), "0000000000000000");
    let uid = status_field(pid, "Uid");
    assert!(
        uid.split_whitespace().all(|u| u != "0"),
        "QEMU runs as root: {uid}"
    );
    // Its own network namespace: none of the host's interfaces.
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
    assert_ne!(
        ns(&pid.to_string()),
        ns("self"),
        "QEMU shares the host's network"
    );
    // No network device: the guest has no way out but the control port.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = text(&cmdline).replace('\0', " ");
    for dev in ["-netdev", "-nic", "virtio-net", "-net "] {
        assert!(!cmdline.contains(dev), "QEMU has {dev}: {cmdline}");
    }
    // In a cgroup with the VM's limits.
    let cg = vm.cgroup().expect("QEMU has a cgroup");
    assert!(cg.procs().contains(&pid), "QEMU is not in its cgroup");
    assert!(cg.memory_current().is_some());
}

// ------------------------------------------------------------------ the guard

#[test]
fn the_hosts_guard_judges_every_execve_in_the_guest() {
    let Some(vm) = shared("the_hosts_guard_judges_every_execve_in_the_guest") else {
        return;
    };
    assert!(
        sh(&*vm, "echo still here > /workspace/canary")
            .status
            .success()
    );
    // The command line says nothing; only the per-execve check sees `rm` inside.
    let out = sh(&*vm, "cp /bin/rm /tmp/del && echo made");
    assert_eq!(text(&out.stdout), "made\n", "{}", text(&out.stderr));
    vm.write_file(
        "/tmp/s.sh",
        b"/tmp/del -rf --no-preserve-root /; echo rc=$?\n",
    )
    .unwrap();
    let out = sh(&*vm, "sh /tmp/s.sh 2>&1");
    let s = text(&out.stdout);
    assert!(s.contains("rc=126"), "{s}");
    assert!(
        out.alerts
            .iter()
            .any(|a| a.contains("blocked") && a.contains("cmd.delete_root")),
        "{:?}",
        out.alerts
    );
    assert!(text(&sh(&*vm, "cat /workspace/canary").stdout).contains("still here"));
    // The command check on the host refuses before anything is sent.
    let r = vm.exec(&ExecRequest::shell("rm -rf --no-preserve-root /").timeout(T));
    assert!(
        matches!(r, Err(tessera_sandbox::ExecError::Blocked(_))),
        "{r:?}"
    );
}

#[test]
fn output_and_files_are_redacted_on_the_host() {
    let Some(vm) = shared("output_and_files_are_redacted_on_the_host") else {
        return;
    };
    let out = sh(&*vm, "echo key AKIAQWERTYUIOPASDFGH end");
    assert_eq!(text(&out.stdout), "key [REDACTED:aws_access_key] end\n");
    assert!(out.redacted);
    let mut chunks = Vec::new();
    let out = vm
        .exec_streaming(
            &ExecRequest::shell("printf 'key AKIAQWERTY'; sleep 0.3; printf 'UIOPASDFGH end\\n'")
                .timeout(T),
            &mut |_, d| chunks.push(text(d)),
        )
        .expect("exec");
    let streamed: String = chunks.concat();
    assert!(!streamed.contains("AKIA"), "{streamed:?}");
    assert_eq!(streamed, "key [REDACTED:aws_access_key] end\n");
    assert!(out.redacted);
    sh(&*vm, "echo 'mail bob@example.com' > /tmp/pii.txt");
    let data = vm.read_file("/tmp/pii.txt").expect("read");
    assert_eq!(text(&data), "mail [REDACTED:email]\n");
}
