//! QEMU: its command line, its confinement on the host (the jail), its QMP monitor,
//! and the choice between KVM and TCG.
//!
//! The jail does for QEMU what Firecracker's jailer does for Firecracker, with what a
//! stock QEMU offers: before `execve` the child dies with its supervisor
//! (`PR_SET_PDEATHSIG`), leaves the host's network, IPC, UTS and mount namespaces,
//! drops to an unprivileged uid and gid with no supplementary groups (but `/dev/kvm`'s,
//! when KVM is used), sets no_new_privs, and installs Landlock (read-only: the system's
//! programs and libraries, QEMU's firmware, the VM cache; `/dev/kvm` read-write) and a
//! seccomp deny-list (`policy/qemu.policy`). QEMU then adds its own filter
//! (`-sandbox on,…`: no fork or exec, no privilege changes, no obsolete syscalls) once
//! it is set up. The supervisor puts it in a cgroup with the VM's limits.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// The reviewed seccomp deny-list for QEMU, compiled into the binary.
pub const QEMU_POLICY: &str = include_str!("../../policy/qemu.policy");

/// How guests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// A QMP connection over a socket QEMU holds the other end of.
pub struct Qmp {
    w: UnixStream,
    r: BufReader<UnixStream>,
}

impl Qmp {
    /// Reads the greeting and leaves capabilities negotiation mode.
    pub fn connect(sock: UnixStream, timeout: Duration) -> Result<Qmp, String> {
        sock.set_read_timeout(Some(timeout))
            .map_err(|e| format!("qmp: {e}"))?;
        let r = BufReader::new(sock.try_clone().map_err(|e| format!("qmp: {e}"))?);
        let mut q = Qmp { w: sock, r };
        let greet = q.line()?;
        if greet.get("QMP").is_none() {
            return Err(format!("qmp: no greeting, got {greet}"));
        }
        q.call("qmp_capabilities", Value::Null)?;
        Ok(q)
    }

    fn line(&mut self) -> Result<Value, String> {
        let mut s = String::new();
        match self.r.read_line(&mut s) {
            Ok(0) => Err("qmp: QEMU closed the monitor (it exited)".into()),
            Ok(_) => serde_json::from_str(&s).map_err(|e| format!("qmp: bad reply {s:?}: {e}")),
            Err(e) => Err(format!("qmp: {e}")),
        }
    }

    /// Sets how long a reply may take.
    pub fn set_timeout(&self, t: Duration) {
        let _ = self.r.get_ref().set_read_timeout(Some(t));
    }

    fn send(&mut self, cmd: &str, args: Value, fd: Option<RawFd>) -> Result<Value, String> {
        let mut m = json!({ "execute": cmd });
        if !args.is_null() {
            m["arguments"] = args;
        }
        let mut text = m.to_string();
        text.push('\n');
        match fd {
            None => self
                .w
                .write_all(text.as_bytes())
                .map_err(|e| format!("qmp {cmd}: {e}"))?,
            Some(fd) => {
                use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
                let iov = [io::IoSlice::new(text.as_bytes())];
                let fds = [fd];
                let cm = [ControlMessage::ScmRights(&fds)];
                sendmsg::<()>(self.w.as_raw_fd(), &iov, &cm, MsgFlags::empty(), None)
                    .map_err(|e| format!("qmp {cmd}: sendmsg: {e}"))?;
            }
        }
        loop {
            let v = self.line()?;
            if v.get("event").is_some() {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Err(format!(
                    "qmp {cmd}: {}",
                    e.get("desc").and_then(Value::as_str).unwrap_or("error")
                ));
            }
            return Ok(v.get("return").cloned().unwrap_or(Value::Null));
        }
    }

    pub fn call(&mut self, cmd: &str, args: Value) -> Result<Value, String> {
        self.send(cmd, args, None)
    }

    /// `cmd` with a file descriptor passed alongside (for `getfd`).
    pub fn call_with_fd(&mut self, cmd: &str, args: Value, fd: RawFd) -> Result<Value, String> {
        self.send(cmd, args, Some(fd))
    }

    /// `query-status`'s `status`.
    pub fn status(&mut self) -> Result<String, String> {
        Ok(self
            .call("query-status", Value::Null)?
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string())
    }
}

/// Who QEMU runs as, and what it may touch.
#[derive(Debug, Clone)]
pub struct JailConfig {
    /// uid and gid QEMU drops to (root supervisors only).
    pub uid: u32,
    pub gid: u32,
    /// Folders QEMU may read (besides the system's programs and libraries).
    pub read: Vec<PathBuf>,
    /// Device nodes QEMU may read and write (`/dev/kvm`).
    pub devices: Vec<PathBuf>,
    /// Supplementary groups kept (`/dev/kvm`'s group).
    pub groups: Vec<u32>,
}

/// What the jail did, for tests and reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailReport {
    pub own_uid: bool,
    pub namespaces: bool,
    pub landlock: bool,
    pub seccomp: bool,
}

fn landlock_for(jail: &JailConfig) -> Option<landlock::RulesetCreated> {
    use landlock::{
        ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr,
    };
    let abi = ABI::V6;
    let read = AccessFs::from_read(abi);
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .ok()?
        .create()
        .ok()?;
    let mut paths: Vec<(PathBuf, landlock::BitFlags<AccessFs>)> = Vec::new();
    for p in ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"] {
        paths.push((p.into(), read));
    }
    for p in &jail.read {
        paths.push((p.clone(), read));
    }
    for p in ["/dev/null", "/dev/urandom", "/dev/random", "/dev/zero"] {
        paths.push((p.into(), read | AccessFs::WriteFile));
    }
    for p in &jail.devices {
        paths.push((p.clone(), AccessFs::from_all(abi) & !AccessFs::Execute));
    }
    for (p, a) in paths {
        if let Ok(fd) = PathFd::new(&p) {
            rs = rs.add_rule(PathBeneath::new(fd, a)).ok()?;
        }
    }
    Some(rs)
}

/// Starts QEMU with `args`, `fds` placed at the given numbers (3, 4, …) and stderr to
/// `stderr`, jailed (see the module docs) when `jail` is given.
pub fn spawn(
    qemu: &Path,
    args: &[OsString],
    fds: Vec<(OwnedFd, RawFd)>,
    stderr: std::fs::File,
    jail: Option<&JailConfig>,
) -> io::Result<(Child, JailReport)> {
    let rules = crate::seccomp::parse(QEMU_POLICY).map_err(io::Error::other)?;
    let progs = crate::seccomp::compile(&rules).map_err(io::Error::other)?;
    let ruleset = landlock_for(jail.unwrap_or(&JailConfig {
        uid: 0,
        gid: 0,
        read: Vec::new(),
        devices: Vec::new(),
        groups: Vec::new(),
    }));
    // Above every fd target (and 100): what the child moves there cannot land on a
    // target, nor close one when it is closed again.
    let above = fds.iter().map(|(_, to)| *to).max().unwrap_or(2).max(99) + 1;
    // The ruleset's fd, moved above every fd target: placing the fds at 3, 4, … in the
    // child would otherwise close a ruleset that happened to sit there, and the
    // restriction would fail with EBADFD (it did, now and then, in CI). `None` where the
    // kernel has no Landlock.
    let landlock = ruleset
        .and_then(Option::<OwnedFd>::from)
        .map(|fd| -> io::Result<OwnedFd> {
            // SAFETY: F_DUPFD_CLOEXEC on an fd we own returns a new fd that we then own.
            let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, above) };
            if high < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(unsafe { OwnedFd::from_raw_fd(high) })
        })
        .transpose()?;
    let report = JailReport {
        own_uid: jail.is_some(),
        namespaces: jail.is_some(),
        landlock: landlock.is_some(),
        seccomp: true,
    };
    let ids = jail.map(|j| (j.uid, j.gid, j.groups.clone()));
    let moves: Vec<(RawFd, RawFd)> = fds.iter().map(|(f, to)| (f.as_raw_fd(), *to)).collect();
    let mut cmd = std::process::Command::new(qemu);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr))
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    // SAFETY: the closure runs in the forked child before execve and makes only raw
    // syscalls (no allocation: the seccomp programs, Landlock ruleset and fd lists are
    // built above, in the parent).
    unsafe {
        cmd.pre_exec(move || {
            let fail = || Err(io::Error::last_os_error());
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return fail();
            }
            // Place the fds: first above every target, then at the targets.
            let mut high = [0 as RawFd; 8];
            for (i, (from, _)) in moves.iter().enumerate().take(8) {
                let h = libc::fcntl(*from, libc::F_DUPFD, above);
                if h < 0 {
                    return fail();
                }
                high[i] = h;
            }
            for (i, (_, to)) in moves.iter().enumerate().take(8) {
                if libc::dup2(high[i], *to) < 0 {
                    return fail();
                }
                libc::close(high[i]);
            }
            if let Some((uid, gid, groups)) = &ids {
                let flags = libc::CLONE_NEWNET
                    | libc::CLONE_NEWIPC
                    | libc::CLONE_NEWUTS
                    | libc::CLONE_NEWNS;
                if libc::unshare(flags) != 0 {
                    return fail();
                }
                if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0
                    || libc::syscall(libc::SYS_setresgid, *gid, *gid, *gid) != 0
                    || libc::syscall(libc::SYS_setresuid, *uid, *uid, *uid) != 0
                {
                    return fail();
                }
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return fail();
            }
            if let Some(fd) = &landlock
                && libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) != 0
            {
                return fail();
            }
            for p in &progs {
                let prog = libc::sock_fprog {
                    len: p.len() as u16,
                    filter: p.as_ptr() as *mut libc::sock_filter,
                };
                if libc::syscall(
                    libc::SYS_seccomp,
                    1u32, /* SECCOMP_SET_MODE_FILTER */
                    0u32,
                    &prog as *const libc::sock_fprog,
                ) != 0
                {
                    return fail();
                }
            }
            Ok(())
        });
    }
    let child = spawn_from_keeper(cmd)?;
    drop(fds);
    Ok((child, report))
}

/// Forks `cmd` from one thread that lives as long as the process: `PR_SET_PDEATHSIG`
/// fires when the *thread* that forked the child ends, not the process, so forking
/// from a caller's thread (a test's, a pool's worker) would kill QEMU with it.
fn spawn_from_keeper(cmd: std::process::Command) -> io::Result<Child> {
    use std::sync::mpsc;
    type Job = (std::process::Command, mpsc::Sender<io::Result<Child>>);
    static KEEPER: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let tx = KEEPER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("qemu-keeper".into())
                .spawn(move || {
                    for (mut cmd, back) in rx {
                        let _ = back.send(cmd.spawn());
                    }
                })
                .expect("spawn the qemu-keeper thread");
            std::sync::Mutex::new(tx)
        })
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let (back, rx) = mpsc::channel();
    tx.send((cmd, back))
        .map_err(|_| io::Error::other("the qemu-keeper thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the qemu-keeper thread is gone"))?
}

/// Whether QEMU can run a guest with KVM here: `/dev/kvm` opens, and a QEMU started with
/// `-accel kvm` survives its vCPU's reset and runs for a moment. `Err` says why not
/// (then guests run under TCG).
pub fn probe_kvm(qemu: &Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(|e| format!("/dev/kvm: {e}"))?;
    let (mine, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir();
    let log = dir.join(format!(
        "tessera-kvm-probe-{}.log",
        crate::registry::nonce()
    ));
    let errf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let args: Vec<OsString> = [
        "-M",
        "microvm,x-option-roms=off",
        "-accel",
        "kvm",
        "-cpu",
        "host",
        "-m",
        "32",
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-serial",
        "none",
        "-S",
        "-chardev",
        "socket,id=qmp,fd=3",
        "-mon",
        "chardev=qmp,mode=control",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let (mut child, _) = spawn(qemu, &args, vec![(theirs.into(), 3)], errf, None)
        .map_err(|e| format!("starting {}: {e}", qemu.display()))?;
    let r = (|| {
        let mut q = Qmp::connect(mine, Duration::from_secs(10))?;
        q.call("cont", Value::Null)?;
        std::thread::sleep(Duration::from_millis(300));
        let s = q.status()?;
        let _ = q.call("quit", Value::Null);
        if s == "running" || s == "shutdown" {
            Ok(())
        } else {
            Err(format!("the probe guest is {s:?}"))
        }
    })();
    let _ = child.kill();
    let _ = child.wait();
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    r.map_err(|e| {
        let tail: Vec<&str> = stderr.lines().filter(|l| !l.contains("warning:")).collect();
        if tail.is_empty() {
            e
        } else {
            format!("{e}: {}", tail.join("; "))
        }
    })
}

/// `qemu-system-x86_64 --version`'s first line.
pub fn version(qemu: &Path) -> Result<String, String> {
    let o = std::process::Command::new(qemu)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", qemu.display()))?;
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string())
}

/// The machine every guest of the tier runs on.
pub const MACHINE: &str = "microvm,x-option-roms=off,isa-serial=on";

/// `-accel …` and `-cpu …` for guests under `accel`.
pub fn accel_args(accel: Accel) -> [&'static str; 4] {
    match accel {
        Accel::Tcg => ["-accel", "tcg,tb-size=128", "-cpu", "max"],
        Accel::Kvm => ["-accel", "kvm", "-cpu", "host"],
    }
}

/// The kernel command line's timing options under `accel` (with a leading space, or
/// empty): under TCG the TSC rate `tsc_khz` ([`host_tsc_khz`]) and a fixed `lpj`,
/// since without a calibration source a loaded host stalls the guest's boot.
pub fn timing_append(accel: Accel, tsc_khz: u64) -> String {
    match accel {
        Accel::Kvm => String::new(),
        Accel::Tcg => format!(
            " tsc_early_khz={tsc_khz} lpj={} no_timer_check",
            tsc_khz * 1000 / 250
        ),
    }
}

/// The TSC frequency the guest is told under TCG (QEMU's TCG counts at the host's
/// rate), in kHz; without it a loaded host fails the guest's PIT calibration and the
/// kernel stalls at boot.
pub fn host_tsc_khz() -> u64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map(|mhz| (mhz * 1000.0) as u64)
        .unwrap_or(2_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fd targets are the lowest free fds of this process, so the Landlock ruleset
    /// that `spawn` creates lands on one of them: placing the fds must not close it.
    /// (Before the ruleset moved above the targets this failed with EBADFD.)
    #[test]
    fn placing_fds_does_not_close_the_landlock_ruleset() {
        let (a, _a) = UnixStream::pair().unwrap();
        let (b, _b) = UnixStream::pair().unwrap();
        let stderr = std::fs::File::create("/dev/null").unwrap();
        // The lowest free fd: the probe takes it and gives it back, and the ruleset
        // `spawn` creates takes it next.
        let first = std::fs::File::open("/dev/null").unwrap().as_raw_fd();
        let fds = vec![(OwnedFd::from(a), first), (OwnedFd::from(b), first + 1)];
        let (mut child, _) = spawn(Path::new("/bin/true"), &[], fds, stderr, None)
            .expect("spawn /bin/true with its fds placed and Landlock on");
        assert!(child.wait().unwrap().success());
    }
}
