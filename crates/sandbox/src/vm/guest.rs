//! The guest agent: PID 1 of a micro-VM. It is the sandbox's init program started by
//! the guest kernel from the initramfs (the kernel passes `TESSERA_GUEST=1` from its
//! command line into the environment), and it runs the namespace tier *inside* the
//! guest: it builds a real root, loads the virtio modules, mounts the template's disk
//! read-only, makes one namespace sandbox from it (user, pid, mount, net… namespaces,
//! a cgroup, seccomp, Landlock, uid 1000, the same init), and then serves the host's
//! calls over the control channel. Every `execve` inside is sent to the host's guard
//! for a verdict ([`RemoteGuard`]); the host checks commands and files before it sends
//! them and redacts what comes back, so no policy and no secret rule lives in the guest.

use super::wire::{self, Answer, Call, Msg, Verdict, WireError, WireOutput};
use crate::error::{ExecError, FileError};
use crate::guard::{CheckDecision, CommandCheck, StreamRedactor};
use crate::sandbox::{InitProgram, Runtime, RuntimeConfig, Sandbox, Stream};
use crate::spec::{Command, ExecRequest, Template};
use nix::mount::{MsFlags, mount};
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Set (to `1`) on the guest kernel's command line: the init program is the agent.
pub const GUEST_ENV: &str = "TESSERA_GUEST";
/// The virtio-serial port's name.
pub const PORT_NAME: &str = "tessera.ctl";
/// Where the initramfs keeps the kernel template's modules and their order.
pub const MODULES_DIR: &str = "/tessera/modules";
/// Where the template's disk is mounted in the guest.
pub const ROOT_MOUNT: &str = "/mnt/root";

fn log(msg: &str) {
    // The serial console (seen with TESSERA_SANDBOX_DEBUG=1 on the host).
    if let Ok(mut f) = fs::OpenOptions::new().write(true).open("/dev/console") {
        let _ = writeln!(f, "tessera-guest: {msg}");
    } else {
        eprintln!("tessera-guest: {msg}");
    }
}

fn power_off() -> ! {
    // SAFETY: sync and reboot take no pointers; PID 1 powering the machine off is what
    // ends the VM (QEMU runs with -no-reboot).
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    std::process::exit(1)
}

/// Entry point of the agent (from [`crate::init::main`]). Never returns: the VM powers
/// off when the agent ends.
pub fn main() -> ! {
    match run() {
        Ok(()) => log("control channel closed; powering off"),
        Err(e) => log(&format!("fatal: {e}")),
    }
    power_off()
}

fn mnt(
    src: &str,
    target: &str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), String> {
    let _ = fs::create_dir_all(target);
    mount(Some(src), target, Some(fstype), flags, data)
        .map_err(|e| format!("mount {fstype} on {target}: {e}"))
}

/// Loads the modules listed in `MODULES_DIR/order` with the parameters the kernel
/// command line gives them (`name.param=value`), as modprobe would.
fn load_modules() -> Result<(), String> {
    let order = fs::read_to_string(format!("{MODULES_DIR}/order")).unwrap_or_default();
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    for name in order.split_whitespace() {
        let params: Vec<&str> = cmdline
            .split_whitespace()
            .filter_map(|a| a.strip_prefix(name)?.strip_prefix('.'))
            .collect();
        let params = std::ffi::CString::new(params.join(" ")).map_err(|e| e.to_string())?;
        let path = format!("{MODULES_DIR}/{name}.ko");
        let f = fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: finit_module reads the module from the open fd and the NUL-terminated
        // parameter string, which outlive the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_finit_module,
                f.as_raw_fd(),
                params.as_ptr(),
                0 as libc::c_int,
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(format!("loading {name}: {e}"));
            }
        }
    }
    Ok(())
}

/// Copies the tree at `from` into `to` (files, folders, symlinks), skipping `skip`.
fn copy_tree(from: &Path, to: &Path, skip: &[&str]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let name = e.file_name();
        if skip.contains(&name.to_string_lossy().as_ref()) {
            continue;
        }
        let (src, dst) = (e.path(), to.join(&name));
        let md = fs::symlink_metadata(&src)?;
        if md.file_type().is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&src)?, &dst)?;
        } else if md.is_dir() {
            copy_tree(&src, &dst, &[])?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(md.permissions().mode()))?;
        } else if md.is_file() {
            fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// The initramfs is `rootfs`, which `pivot_root` (the namespace sandbox's) cannot
/// leave: move everything the agent needs onto a tmpfs and make that the root, as
/// `switch_root` does, freeing the initramfs.
fn switch_root() -> Result<(), String> {
    let new = "/newroot";
    mnt(
        "tmpfs",
        new,
        "tmpfs",
        MsFlags::empty(),
        Some("mode=0755,size=256m"),
    )?;
    let skip = ["newroot", "proc", "sys", "dev", "tessera"];
    copy_tree(Path::new("/"), Path::new(new), &skip)
        .map_err(|e| format!("copying the agent: {e}"))?;
    for d in ["proc", "sys", "dev", "tmp", "run", "mnt/root", "etc"] {
        fs::create_dir_all(format!("{new}/{d}")).map_err(|e| format!("mkdir {d}: {e}"))?;
    }
    // Free the initramfs (its files are copies now).
    for e in fs::read_dir("/").map_err(|e| e.to_string())?.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if skip.contains(&n.as_str()) && n != "tessera" {
            continue;
        }
        let p = e.path();
        let _ = if p.is_dir() && !p.is_symlink() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        };
    }
    nix::unistd::chdir(new).map_err(|e| format!("chdir {new}: {e}"))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(|e| format!("move {new} to /: {e}"))?;
    nix::unistd::chroot(".").map_err(|e| format!("chroot: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

/// Waits for a device the kernel is still probing.
fn wait_for(
    what: &str,
    timeout: Duration,
    mut found: impl FnMut() -> Option<String>,
) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(p) = found() {
            return Ok(p);
        }
        if Instant::now() > deadline {
            return Err(format!("{what} did not appear within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn find_port() -> Option<String> {
    for e in fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let name = fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if name.trim() == PORT_NAME {
            let dev = format!("/dev/{}", e.file_name().to_string_lossy());
            if Path::new(&dev).exists() {
                return Some(dev);
            }
        }
    }
    None
}

fn boot() -> Result<fs::File, String> {
    mnt("proc", "/proc", "proc", MsFlags::empty(), None)?;
    mnt("sysfs", "/sys", "sysfs", MsFlags::empty(), None)?;
    mnt("devtmpfs", "/dev", "devtmpfs", MsFlags::empty(), None)?;
    load_modules()?;
    nix::mount::umount2("/proc", nix::mount::MntFlags::MNT_DETACH).ok();
    nix::mount::umount2("/sys", nix::mount::MntFlags::MNT_DETACH).ok();
    nix::mount::umount2("/dev", nix::mount::MntFlags::MNT_DETACH).ok();
    switch_root()?;
    let nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mnt("proc", "/proc", "proc", nodev | MsFlags::MS_NOEXEC, None)?;
    mnt("sysfs", "/sys", "sysfs", nodev | MsFlags::MS_NOEXEC, None)?;
    mnt("devtmpfs", "/dev", "devtmpfs", MsFlags::MS_NOSUID, None)?;
    mnt("tmpfs", "/run", "tmpfs", nodev, Some("mode=0755"))?;
    mnt(
        "cgroup2",
        "/sys/fs/cgroup",
        "cgroup2",
        nodev | MsFlags::MS_NOEXEC,
        None,
    )?;
    // Guest /etc for the agent itself (the sandbox builds its own).
    let _ = fs::write("/etc/passwd", "root:x:0:0:root:/:/bin/sh\n");
    let disk = wait_for(
        "the template disk /dev/vda",
        Duration::from_secs(30),
        || {
            Path::new("/dev/vda")
                .exists()
                .then(|| "/dev/vda".to_string())
        },
    )?;
    mnt(
        &disk,
        ROOT_MOUNT,
        "ext4",
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("noload"),
    )?;
    let port = wait_for("the control port", Duration::from_secs(30), find_port)?;
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port)
        .map_err(|e| format!("{port}: {e}"))
}

/// Sends messages to the host; one message (all its frames) at a time.
#[derive(Clone)]
struct Tx(Arc<Mutex<fs::File>>);

impl Tx {
    fn send(&self, msg: &Msg, body: &[u8]) {
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = wire::write_msg(&mut *f, msg, body) {
            log(&format!("writing to the host: {e}"));
        }
    }
}

/// The guest's guard: every `execve` goes to the host's guard, which decides. Commands
/// and file operations were checked on the host before they were sent, and output is
/// redacted there, so those pass here.
struct RemoteGuard {
    tx: Tx,
    checks_exec: bool,
    next: AtomicU64,
    pending: Mutex<HashMap<u64, mpsc::Sender<Verdict>>>,
}

/// A redactor that releases everything at once: the host redacts.
struct PassThrough;
impl StreamRedactor for PassThrough {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        chunk.to_vec()
    }
    fn finish(&mut self) -> Vec<u8> {
        Vec::new()
    }
    fn redacted(&self) -> bool {
        false
    }
}

impl CommandCheck for RemoteGuard {
    fn check(&self, _tenant: Option<&str>, _command: &Command) -> CheckDecision {
        CheckDecision::Allow
    }
    fn checks_exec(&self) -> bool {
        self.checks_exec
    }
    fn check_exec(
        &self,
        _tenant: Option<&str>,
        argv: &[String],
        program: Option<&str>,
    ) -> CheckDecision {
        let q = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(q, tx);
        self.tx.send(
            &Msg::ExecCheck {
                id: 0,
                q,
                argv: argv.to_vec(),
                program: program.map(str::to_string),
            },
            &[],
        );
        // No answer (the host is gone or broken): refuse, never run unchecked.
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Verdict::Allow) => CheckDecision::Allow,
            Ok(Verdict::Alert(r)) => CheckDecision::Alert(r),
            Ok(Verdict::Block(r)) => CheckDecision::Block(r),
            Err(_) => CheckDecision::Block(vec!["the host's guard did not answer".into()]),
        }
    }
    fn stream_redactor<'a>(
        &'a self,
        _tenant: Option<&'a str>,
        _location: &'a str,
    ) -> Box<dyn StreamRedactor + 'a> {
        Box::new(PassThrough)
    }
}

fn exec_error(e: ExecError) -> WireError {
    match e {
        ExecError::Blocked(r) => WireError::Blocked(r),
        ExecError::EmptyCommand => WireError::EmptyCommand,
        ExecError::Start(s) => WireError::Start(s),
        ExecError::Destroyed(_) => WireError::Destroyed,
        ExecError::Paused(_) => WireError::Paused,
        other => WireError::Other(other.to_string()),
    }
}

fn file_error(e: FileError) -> WireError {
    match e {
        FileError::BadPath(p) => WireError::BadPath(p),
        FileError::Op { path, source } => WireError::Op { path, source },
        FileError::Exec(x) => exec_error(x),
        FileError::Archive { path, source } => WireError::Archive { path, source },
    }
}

/// Calls in flight, for `Quiesce`.
struct Busy {
    n: Mutex<usize>,
    cv: Condvar,
}

fn serve_call(sb: &Sandbox, tx: &Tx, id: u64, call: Call, body: Vec<u8>) {
    let (result, out): (Result<Answer, WireError>, Vec<u8>) = match call {
        Call::Ping => (
            sb.ping().map(|_| Answer::Done).map_err(exec_error),
            Vec::new(),
        ),
        Call::Exec {
            argv,
            env,
            cwd,
            timeout_ms,
            max_output,
            stream,
        } => {
            let mut req = ExecRequest::new(Command::Argv(argv));
            req.env = env;
            req.cwd = cwd;
            req.timeout = timeout_ms.map(Duration::from_millis);
            req.max_output = max_output;
            if !body.is_empty() {
                req.stdin = Some(body);
            }
            let r = if stream {
                sb.exec_streaming(&req, |st, chunk| {
                    tx.send(
                        &Msg::Output {
                            id,
                            stderr: st == Stream::Stderr,
                        },
                        chunk,
                    )
                })
            } else {
                sb.exec(&req)
            };
            match r {
                Ok(o) => {
                    let w = WireOutput {
                        status: o.status,
                        stdout_len: if stream { 0 } else { o.stdout.len() as u64 },
                        stdout_truncated: o.stdout_truncated,
                        stderr_truncated: o.stderr_truncated,
                        timed_out: o.timed_out,
                        oom_killed: o.oom_killed,
                        alerts: o.alerts,
                    };
                    let mut b = Vec::new();
                    if !stream {
                        b = o.stdout;
                        b.extend_from_slice(&o.stderr);
                    }
                    (Ok(Answer::Exec(w)), b)
                }
                Err(e) => (Err(exec_error(e)), Vec::new()),
            }
        }
        Call::ReadFile { path } => match sb.read_file(&path) {
            Ok(d) => (Ok(Answer::Done), d),
            Err(e) => (Err(file_error(e)), Vec::new()),
        },
        Call::WriteFile { path } => (
            sb.write_file(&path, &body)
                .map(|_| Answer::Done)
                .map_err(file_error),
            Vec::new(),
        ),
        Call::List { path } => (
            sb.list(&path).map(Answer::List).map_err(file_error),
            Vec::new(),
        ),
        Call::Remove { path, recursive } => (
            sb.remove(&path, recursive)
                .map(|_| Answer::Done)
                .map_err(file_error),
            Vec::new(),
        ),
        Call::Mkdir { path } => (
            sb.mkdir(&path).map(|_| Answer::Done).map_err(file_error),
            Vec::new(),
        ),
        Call::UploadTar { dir, limits } => (
            sb.upload_tar_with(&dir, &body, &limits)
                .map(Answer::Tar)
                .map_err(file_error),
            Vec::new(),
        ),
        Call::DownloadTar { dir, limits } => match sb.download_tar_with(&dir, &limits) {
            Ok(d) => (Ok(Answer::Done), d),
            Err(e) => (Err(file_error(e)), Vec::new()),
        },
    };
    tx.send(&Msg::Reply { id, result }, &out);
}

fn uptime_ms() -> u64 {
    fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map(|s| (s * 1000.0) as u64)
        .unwrap_or(0)
}

fn run() -> Result<(), String> {
    let port = boot()?;
    let mut rx = port.try_clone().map_err(|e| format!("dup port: {e}"))?;
    let tx = Tx(Arc::new(Mutex::new(port)));
    let (msg, _) = wire::read_msg(&mut rx)
        .map_err(|e| format!("reading Hello: {e}"))?
        .ok_or("the host closed the channel before Hello")?;
    let Msg::Hello {
        version,
        mut spec,
        checks_exec,
    } = msg
    else {
        return Err(format!("first message was not Hello: {msg:?}"));
    };
    if version != wire::VERSION {
        let error = format!(
            "protocol version {version} from the host, {} here",
            wire::VERSION
        );
        tx.send(
            &Msg::SetupFailed {
                error: error.clone(),
            },
            &[],
        );
        return Err(error);
    }
    // SAFETY: still single-threaded here; nothing reads the environment concurrently.
    unsafe { std::env::set_var("TESSERA_SANDBOX_NETNS_POOL", "0") };
    let guard = Arc::new(RemoteGuard {
        tx: tx.clone(),
        checks_exec,
        next: AtomicU64::new(1),
        pending: Mutex::new(HashMap::new()),
    });
    // The sandbox's proxy connections go to the host (the guest has no network).
    let egress = {
        let t = tx.clone();
        super::egress::GuestEgress::new(Arc::new(move |m: &Msg, b: &[u8]| t.send(m, b)))
    };
    let relay = egress.clone();
    let made = Runtime::new(RuntimeConfig {
        init: Some(InitProgram {
            path: "/init".into(),
            args: vec![],
        }),
        cgroups: true,
        guard: guard.clone(),
        tenant: None,
        cgroup_backend: None,
        egress: Some(Arc::new(move |c| relay.relay(c))),
    })
    .map_err(|e| e.to_string())
    .and_then(|rt| {
        spec.template = Template::Dir(ROOT_MOUNT.into());
        rt.spawn(&spec).map_err(|e| e.to_string())
    });
    let sb = match made {
        Ok(sb) => Arc::new(sb),
        Err(error) => {
            tx.send(
                &Msg::SetupFailed {
                    error: error.clone(),
                },
                &[],
            );
            return Err(error);
        }
    };
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    tx.send(
        &Msg::Ready {
            version: wire::VERSION,
            kernel,
            uptime_ms: uptime_ms(),
        },
        &[],
    );
    let busy = Arc::new(Busy {
        n: Mutex::new(0),
        cv: Condvar::new(),
    });
    loop {
        let Some((msg, body)) = wire::read_msg(&mut rx).map_err(|e| format!("reading: {e}"))?
        else {
            return Ok(());
        };
        match msg {
            Msg::Call { id, call } => {
                *busy.n.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                let (sb, tx, busy) = (sb.clone(), tx.clone(), busy.clone());
                std::thread::spawn(move || {
                    serve_call(&sb, &tx, id, call, body);
                    *busy.n.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
                    busy.cv.notify_all();
                });
            }
            Msg::Verdict { q, verdict } => {
                if let Some(s) = guard
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&q)
                {
                    let _ = s.send(verdict);
                }
            }
            Msg::EndCommands => crate::init::kill_tree(sb.pid(), false),
            Msg::SignalCommands { signal } => match nix::sys::signal::Signal::try_from(signal) {
                Ok(sig) => {
                    sb.signal_workload(sig);
                }
                Err(_) => log(&format!("no such signal {signal}")),
            },
            Msg::EgressData { conn } => egress.data(conn, &body),
            Msg::EgressClose { conn } => egress.close(conn),
            Msg::Quiesce => {
                let mut n = busy.n.lock().unwrap_or_else(|p| p.into_inner());
                while *n > 0 {
                    n = busy.cv.wait(n).unwrap_or_else(|p| p.into_inner());
                }
                drop(n);
                // SAFETY: sync takes no arguments.
                unsafe { libc::sync() };
                tx.send(&Msg::Quiet, &[]);
            }
            other => log(&format!("unexpected message {other:?}")),
        }
    }
}
