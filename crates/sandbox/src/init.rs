//! The sandbox's init: PID 1 of the sandbox's pid namespace, root of its user
//! namespace. It builds the root file system, then serves the supervisor's requests
//! over fd 3 until that socket closes, when it exits and the kernel kills everything
//! left in the namespace.
//!
//! Every request runs as a *job*: init forks a runner (a child subreaper, so nothing the
//! job starts can slip out of its tree), the runner forks the job process, which drops
//! into the confinement (rlimits, uid 1000, no capabilities, Landlock, no_new_privs,
//! seccomp) and then runs the command or the file operation.

use crate::error::StepError;
use crate::proto::{self, Job, JobKind, JobStatus, Reply, Request};
use crate::spec::{DirEntry, FileKind, SandboxSpec, Template};
use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope,
};
use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::stat::Mode;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Pid, Uid, fork};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The control socket's fd number in the init.
pub const CTRL_FD: RawFd = 3;

/// Where the new root is assembled before `pivot_root`. It covers the host's `/tmp`
/// only inside this private mount namespace; the host never sees it.
const STAGE: &str = "/tmp";

/// Entries of the host's root used by the default template.
const HOST_ENTRIES: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Entries of a template directory the sandbox owns instead.
const RESERVED: &[&str] = &[
    "tmp",
    "home",
    "workspace",
    "proc",
    "dev",
    "sys",
    "run",
    "root",
];
/// Device nodes bound from the host.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Set in the environment of the init program to make it a supervisor's reaper
/// instead (its value: the supervisor's pid).
pub const REAPER_ENV: &str = "TESSERA_SANDBOX_REAPER";

/// Entry point of the init binary (and of `tessera sandbox __init`). Never returns.
pub fn main() -> ! {
    if let Ok(v) = std::env::var(REAPER_ENV) {
        reaper(&v)
    }
    // The guest kernel starts its init with the command line's `TESSERA_GUEST=1`.
    if std::process::id() == 1 && std::env::var_os(crate::vm::guest::GUEST_ENV).is_some() {
        crate::vm::guest::main()
    }
    let code = match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tessera-sandbox-init: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// The reaper: waits for the supervisor `pid` to exit, then kills whatever is left in
/// its sandboxes' cgroups (frozen sandboxes included, which cannot notice on their own
/// that their control socket closed) and removes those cgroups.
fn reaper(v: &str) -> ! {
    let Ok(pid) = v.trim().parse::<u32>() else {
        eprintln!("tessera-sandbox-init: {REAPER_ENV}={v:?} is not a pid");
        std::process::exit(2)
    };
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    if raw >= 0 {
        // SAFETY: pidfd_open just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
        loop {
            let mut p = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut p, PollTimeout::NONE) {
                Ok(n) if n > 0 => break,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
    } else {
        // Kernels without pidfd_open (before 5.3): watch for being orphaned.
        while nix::unistd::getppid().as_raw() as u32 == pid {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    if let Some(cg) = crate::cgroup::detect() {
        cg.reap_supervisor(pid);
    }
    std::process::exit(0)
}

struct State {
    uid: u32,
    gid: u32,
    seccomp: Vec<seccompiler::BpfProgram>,
    landlock: Option<RulesetCreated>,
    rlimits: crate::spec::Rlimits,
    /// Sealed folders not sealed yet (see [`SandboxSpec::sealed`]).
    unsealed: BTreeSet<String>,
}

fn close_from(first: u32) {
    // SAFETY: close_range only closes descriptors; none of those >= `first` is owned by
    // a live Rust object at the points where this is called (start of init).
    unsafe {
        libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32);
    }
}

fn run() -> Result<(), String> {
    // SAFETY: the supervisor placed our end of the control socket at fd 3 before
    // execve; nothing else in this process owns it.
    let ctrl = unsafe { OwnedFd::from_raw_fd(CTRL_FD) };
    // Nothing of the supervisor's but fds 0-3 may reach the sandbox.
    close_from(4);
    let ctrl_fd = ctrl.as_fd();
    let Some((req, _)) = proto::recv::<Request>(ctrl_fd)? else {
        return Ok(());
    };
    let Request::Setup { spec, uid, gid } = req else {
        return Err("first request was not Setup".into());
    };
    let mut st = match setup(&spec, uid, gid) {
        Ok(st) => st,
        Err(e) => {
            let _ = proto::send(ctrl_fd, &Reply::Failed(e), &[]);
            return Ok(());
        }
    };
    // Block SIGCHLD and read it from a signalfd in the poll loop.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).map_err(|e| e.to_string())?;
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("signalfd: {e}"))?;
    // The egress proxy's listening socket lives in our network namespace; the
    // supervisor serves it from outside.
    let proxy = match &spec.network {
        crate::spec::Network::Proxy(_) => {
            match std::net::TcpListener::bind(crate::spec::PROXY_ADDR) {
                Ok(l) => Some(l),
                Err(e) => {
                    let e = StepError::new("bind", crate::spec::PROXY_ADDR, e);
                    let _ = proto::send(ctrl_fd, &Reply::Failed(e), &[]);
                    return Ok(());
                }
            }
        }
        crate::spec::Network::None => None,
    };
    let proxy_fds: Vec<RawFd> = proxy.iter().map(|l| l.as_raw_fd()).collect();
    proto::send(
        ctrl_fd,
        &Reply::Ready {
            init_pid_in_ns: nix::unistd::getpid().as_raw(),
        },
        &proxy_fds,
    )?;
    drop(proxy);
    serve(&ctrl, &sfd, &mut st)
}

fn serve(ctrl: &OwnedFd, sfd: &SignalFd, st: &mut State) -> Result<(), String> {
    let mut runners: BTreeSet<i32> = BTreeSet::new();
    loop {
        let (ctrl_ready, sig_ready) = {
            let mut fds = [
                PollFd::new(ctrl.as_fd(), PollFlags::POLLIN),
                PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(format!("poll: {e}")),
            }
            let r = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (r(&fds[0]), r(&fds[1]))
        };
        if sig_ready {
            while let Ok(Some(_)) = sfd.read_signal() {}
            reap(&mut runners);
        }
        if !ctrl_ready {
            continue;
        }
        let Some((req, fds)) = proto::recv::<Request>(ctrl.as_fd())? else {
            // The supervisor is gone: exiting kills the whole namespace.
            return Ok(());
        };
        let reply = match req {
            Request::Ping => Reply::Pong,
            Request::Setup { .. } => Reply::Failed(StepError::new("setup", "", "already set up")),
            Request::Kill { pid } => {
                if runners.contains(&pid) {
                    kill_tree(pid, false);
                }
                Reply::Done
            }
            Request::Fill { path, file, bytes } => match fill(st, &path, &file, bytes, fds) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::Failed(e),
            },
            Request::Seal { path } => match seal(st, &path) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::Failed(e),
            },
            Request::Job(job) => match start_job(ctrl, st, job, fds) {
                Ok(pid) => {
                    runners.insert(pid);
                    Reply::Started { pid }
                }
                Err(e) => Reply::Failed(e),
            },
        };
        proto::send(ctrl.as_fd(), &reply, &[])?;
    }
}

fn reap(runners: &mut BTreeSet<i32>) {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(s) => {
                if let Some(p) = s.pid() {
                    runners.remove(&p.as_raw());
                }
            }
        }
    }
}

// ------------------------------------------------------------------ setup

fn se<E: Into<crate::error::ErrnoLike>>(
    step: &'static str,
    target: impl AsRef<Path>,
) -> impl FnOnce(E) -> StepError {
    move |e| StepError::new(step, &target.as_ref().display().to_string(), e)
}

fn mnt(
    src: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), StepError> {
    mount(src, target, fstype, flags, data).map_err(se("mount", target))
}

/// Flags of an existing mount that a user namespace may not clear on remount.
fn locked_flags(path: &str) -> MsFlags {
    use nix::sys::statvfs::{FsFlags, statvfs};
    let mut f = MsFlags::empty();
    if let Ok(s) = statvfs(path) {
        let fl = s.flags();
        for (a, b) in [
            (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
            (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ] {
            if fl.contains(a) {
                f |= b;
            }
        }
    }
    f
}

fn bind_ro(src_fd: &OwnedFd, target: &str) -> Result<(), StepError> {
    let src = format!("/proc/self/fd/{}", src_fd.as_raw_fd());
    mnt(
        Some(&src),
        target,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )?;
    let flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | locked_flags(target);
    mnt(None, target, None, flags, None)
}

enum Entry {
    Link(String, std::path::PathBuf),
    Dir(String, OwnedFd),
    File(String, OwnedFd),
}

fn open_path(p: &Path) -> Result<OwnedFd, StepError> {
    open(
        p,
        OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(se("open", p))
}

fn template_entries(t: &Template) -> Result<Vec<Entry>, StepError> {
    let (root, names): (std::path::PathBuf, Vec<String>) = match t {
        Template::Host => (
            "/".into(),
            HOST_ENTRIES.iter().map(|s| s.to_string()).collect(),
        ),
        Template::Dir(p) => {
            let rd = fs::read_dir(p).map_err(se("read_dir", p))?;
            let mut names: Vec<String> = rd
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !RESERVED.contains(&n.as_str()))
                .collect();
            names.sort();
            (p.clone(), names)
        }
    };
    let mut out = Vec::new();
    for n in names {
        let p = root.join(&n);
        let Ok(md) = fs::symlink_metadata(&p) else {
            continue;
        };
        if md.file_type().is_symlink() {
            out.push(Entry::Link(
                n,
                fs::read_link(&p).map_err(se("readlink", &p))?,
            ));
        } else if md.is_dir() {
            out.push(Entry::Dir(n, open_path(&p)?));
        } else if md.is_file() {
            out.push(Entry::File(n, open_path(&p)?));
        }
    }
    Ok(out)
}

/// A path inside the sandbox that a bind or a mask may name: absolute, no `..`, not
/// the root, not under `/proc`.
fn check_inner_path(step: &'static str, p: &str) -> Result<(), StepError> {
    let ok = p.starts_with('/')
        && p.len() > 1
        && !p.split('/').any(|c| c == ".." || c == ".")
        && !(p == "/proc" || p.starts_with("/proc/"));
    if ok {
        Ok(())
    } else {
        Err(StepError::new(
            step,
            p,
            "give an absolute path without `.` or `..`, not `/` and not under /proc",
        ))
    }
}

fn write_file(path: &str, content: &str) -> Result<(), StepError> {
    fs::write(path, content).map_err(se("write", path))
}

fn setup(spec: &SandboxSpec, uid: u32, gid: u32) -> Result<State, StepError> {
    // The cgroup namespace is made now, after the supervisor moved us into our cgroup,
    // so that cgroup is the namespace's root.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .map_err(se("unshare", "CLONE_NEWCGROUP"))?;
    nix::unistd::sethostname(&spec.hostname).map_err(se("sethostname", &spec.hostname))?;
    mnt(None, "/", None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)?;

    // Open every source before the stage covers anything.
    let entries = template_entries(&spec.template)?;
    let devs: Vec<(&str, OwnedFd)> = DEVICES
        .iter()
        .filter_map(|d| {
            open_path(Path::new(&format!("/dev/{d}")))
                .ok()
                .map(|fd| (*d, fd))
        })
        .collect();
    let binds: Vec<(&crate::spec::Bind, OwnedFd, bool)> = spec
        .binds
        .iter()
        .map(|b| {
            check_inner_path("bind", &b.path)?;
            let fd = open_path(&b.host)?;
            let dir = fs::metadata(&b.host).map_err(se("stat", &b.host))?.is_dir();
            Ok((b, fd, dir))
        })
        .collect::<Result<_, StepError>>()?;
    for m in &spec.masked_paths {
        check_inner_path("mask", m)?;
    }
    for m in &spec.sealed {
        check_inner_path("sealed", m)?;
    }

    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mnt(
        Some("tmpfs"),
        STAGE,
        Some("tmpfs"),
        nosuid_nodev,
        Some("size=4m,mode=0755"),
    )?;
    let s = |p: &str| format!("{STAGE}/{p}");
    let mut has_etc = false;
    for e in &entries {
        match e {
            Entry::Link(n, target) => {
                std::os::unix::fs::symlink(target, s(n)).map_err(se("symlink", s(n)))?;
            }
            Entry::Dir(n, fd) => {
                has_etc |= n == "etc";
                fs::create_dir(s(n)).map_err(se("mkdir", s(n)))?;
                bind_ro(fd, &s(n))?;
            }
            Entry::File(n, fd) => {
                fs::write(s(n), b"").map_err(se("create", s(n)))?;
                bind_ro(fd, &s(n))?;
            }
        }
    }
    if !has_etc {
        fs::create_dir(s("etc")).map_err(se("mkdir", s("etc")))?;
        write_file(
            &s("etc/passwd"),
            &format!(
                "root:x:0:0:root:/root:/bin/sh\nuser:x:{uid}:{gid}:user:/home/user:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        )?;
        write_file(
            &s("etc/group"),
            &format!("root:x:0:\nuser:x:{gid}:\nnogroup:x:65534:\n"),
        )?;
        write_file(
            &s("etc/hosts"),
            &format!(
                "127.0.0.1 localhost\n::1 localhost\n127.0.1.1 {}\n",
                spec.hostname
            ),
        )?;
        write_file(&s("etc/hostname"), &format!("{}\n", spec.hostname))?;
        write_file(&s("etc/resolv.conf"), "")?;
        write_file(
            &s("etc/nsswitch.conf"),
            "passwd: files\ngroup: files\nhosts: files dns\n",
        )?;
    }
    for d in [
        "tmp",
        "home",
        "home/user",
        "workspace",
        "proc",
        "dev",
        "root",
    ] {
        fs::create_dir(s(d)).map_err(se("mkdir", s(d)))?;
    }
    let disk = spec.limits.disk_bytes.max(4096);
    mnt(
        Some("tmpfs"),
        &s("tmp"),
        Some("tmpfs"),
        nosuid_nodev,
        Some(&format!("size={disk},mode=1777")),
    )?;
    for d in ["home/user", "workspace"] {
        mnt(
            Some("tmpfs"),
            &s(d),
            Some("tmpfs"),
            nosuid_nodev,
            Some(&format!("size={disk},mode=0755,uid={uid},gid={gid}")),
        )?;
    }
    mnt(
        Some("proc"),
        &s("proc"),
        Some("proc"),
        nosuid_nodev | MsFlags::MS_NOEXEC,
        None,
    )?;
    mnt(
        Some("tmpfs"),
        &s("dev"),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("size=64k,mode=0755"),
    )?;
    for (d, fd) in &devs {
        let t = s(&format!("dev/{d}"));
        fs::write(&t, b"").map_err(se("create", &t))?;
        let src = format!("/proc/self/fd/{}", fd.as_raw_fd());
        mnt(Some(&src), &t, None, MsFlags::MS_BIND, None)?;
    }
    for (l, t) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(t, s(&format!("dev/{l}")))
            .map_err(se("symlink", s(&format!("dev/{l}"))))?;
    }
    fs::create_dir(s("dev/shm")).map_err(se("mkdir", s("dev/shm")))?;
    mnt(
        Some("tmpfs"),
        &s("dev/shm"),
        Some("tmpfs"),
        nosuid_nodev,
        Some(&format!("size={disk},mode=1777")),
    )?;
    for (b, fd, dir) in &binds {
        let t = s(b.path.trim_start_matches('/'));
        if let Some(parent) = Path::new(&t).parent() {
            fs::create_dir_all(parent).map_err(se("mkdir", parent))?;
        }
        if *dir {
            fs::create_dir_all(&t).map_err(se("mkdir", &t))?;
        } else if fs::symlink_metadata(&t).is_err() {
            fs::write(&t, b"").map_err(se("create", &t))?;
        }
        let src = format!("/proc/self/fd/{}", fd.as_raw_fd());
        mnt(
            Some(&src),
            &t,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )?;
        if !b.writable {
            let flags = MsFlags::MS_REMOUNT
                | MsFlags::MS_BIND
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | locked_flags(&t);
            mnt(None, &t, None, flags, None)?;
        }
    }
    // Masked paths: an empty read-only tmpfs over a folder, /dev/null over a file.
    for m in &spec.masked_paths {
        let t = s(m.trim_start_matches('/'));
        match fs::symlink_metadata(&t) {
            Ok(md) if md.is_dir() => mnt(
                Some("tmpfs"),
                &t,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | nosuid_nodev | MsFlags::MS_NOEXEC,
                Some("size=4k,mode=0000"),
            )?,
            Ok(_) => {
                let null = devs
                    .iter()
                    .find(|(d, _)| *d == "null")
                    .ok_or_else(|| StepError::new("mask", m, "no /dev/null to mask a file with"))?;
                let src = format!("/proc/self/fd/{}", null.1.as_raw_fd());
                mnt(Some(&src), &t, None, MsFlags::MS_BIND, None)?;
            }
            // Not in this sandbox's tree: nothing to hide.
            Err(_) => {}
        }
    }
    // Sealed folders: ramfs (its pages are never swapped out), closed to the
    // commands (root's, 0700) until filled and sealed.
    for m in &spec.sealed {
        let t = s(m.trim_start_matches('/'));
        if !Path::new(&t).is_dir() {
            fs::create_dir_all(&t).map_err(se("mkdir", &t))?;
        }
        mnt(
            Some("tessera-sealed"),
            &t,
            Some("ramfs"),
            nosuid_nodev | MsFlags::MS_NOEXEC,
            Some("mode=0700"),
        )?;
    }
    mnt(
        None,
        &s("dev"),
        None,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NOEXEC,
        None,
    )?;
    drop(entries);
    drop(devs);
    drop(binds);

    // pivot_root(".", ".") stacks the old root under the new one; detaching it leaves
    // no path back to the host's file systems.
    nix::unistd::chdir(STAGE).map_err(se("chdir", STAGE))?;
    nix::unistd::pivot_root(".", ".").map_err(se("pivot_root", STAGE))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(se("umount2", "old root"))?;
    nix::unistd::chdir("/").map_err(se("chdir", "/"))?;
    mnt(
        None,
        "/",
        None,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | nosuid_nodev,
        None,
    )?;

    loopback_up()?;

    let landlock = landlock_ruleset(spec)?;
    let seccomp = crate::seccomp::compile(&crate::seccomp::default_rules())
        .map_err(|e| StepError::new("seccomp", "compile", e))?;
    // Keep sandboxed processes (another uid) out of our memory and fds.
    nix::sys::prctl::set_dumpable(false).map_err(se("prctl", "PR_SET_DUMPABLE"))?;
    Ok(State {
        uid,
        gid,
        seccomp,
        landlock,
        rlimits: spec.rlimits,
        unsealed: spec.sealed.iter().cloned().collect(),
    })
}

/// Writes one file of an unsealed folder from the pipe in `fds` (exactly `bytes`
/// bytes, or the file is removed again).
fn fill(
    st: &State,
    path: &str,
    file: &str,
    bytes: u64,
    fds: Vec<OwnedFd>,
) -> Result<(), StepError> {
    if !st.unsealed.contains(path) {
        return Err(StepError::new(
            "fill",
            path,
            "not an unsealed folder of this sandbox",
        ));
    }
    if file.is_empty() || file == "." || file == ".." || file.contains(['/', '\0']) {
        return Err(StepError::new("fill", file, "not a plain file name"));
    }
    let Some(src) = fds.into_iter().next() else {
        return Err(StepError::new("fill", path, "no data pipe was passed"));
    };
    let target = format!("{path}/{file}");
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(&target)
        .map_err(se("create", &target))?;
    let mut src = std::io::Read::take(fs::File::from(src), bytes + 1);
    let r = std::io::copy(&mut src, &mut out);
    drop(src);
    let fail = |m: String| {
        drop(fs::remove_file(&target));
        Err(StepError::new("fill", &target, m))
    };
    match r {
        Ok(n) if n == bytes => {}
        Ok(n) if n > bytes => return fail(format!("more than the {bytes} bytes announced")),
        Ok(n) => return fail(format!("the stream ended after {n} of {bytes} bytes")),
        Err(e) => return fail(e.to_string()),
    }
    out.set_permissions(fs::Permissions::from_mode(0o444))
        .map_err(se("chmod", &target))?;
    Ok(())
}

/// Opens a filled folder to the commands, read-only for good.
fn seal(st: &mut State, path: &str) -> Result<(), StepError> {
    if !st.unsealed.remove(path) {
        return Err(StepError::new(
            "seal",
            path,
            "not an unsealed folder of this sandbox",
        ));
    }
    fs::set_permissions(path, fs::Permissions::from_mode(0o555)).map_err(se("chmod", path))?;
    mnt(
        None,
        path,
        None,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None,
    )
}

/// Brings loopback up in the calling thread's network namespace (nothing to do when a
/// pre-made namespace already has it up).
pub(crate) fn loopback_up() -> Result<(), StepError> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(se("socket", "AF_INET"))?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: `sock` is a valid socket and `ifr` a valid ifreq that outlives the call.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) };
    if r < 0 {
        return Err(StepError::new(
            "ioctl",
            "SIOCGIFFLAGS lo",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe {
        if ifr.ifr_ifru.ifru_flags & libc::IFF_UP as libc::c_short != 0 {
            return Ok(());
        }
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
    }
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) };
    if r < 0 {
        return Err(StepError::new(
            "ioctl",
            "SIOCSIFFLAGS lo",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn landlock_ruleset(spec: &SandboxSpec) -> Result<Option<RulesetCreated>, StepError> {
    let abi = ABI::V6;
    let lerr = |what: &str| {
        let what = what.to_string();
        move |e: landlock::RulesetError| StepError::new("landlock", &what, e.to_string())
    };
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(lerr("handle_access"))?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(lerr("scope"))?
        .create()
        .map_err(lerr("create"))?;
    let rule = |rs: RulesetCreated,
                path: &str,
                access: landlock::BitFlags<AccessFs>|
     -> Result<RulesetCreated, StepError> {
        match PathFd::new(path) {
            Ok(fd) => rs
                .add_rule(PathBeneath::new(fd, access))
                .map_err(lerr(path)),
            Err(_) => Ok(rs), // absent in this template
        }
    };
    rs = rule(rs, "/", AccessFs::ReadDir.into())?;
    let mut ro: Vec<String> = vec!["/usr".into(), "/etc".into(), "/proc".into()];
    if let Template::Dir(p) = &spec.template
        && let Ok(rd) = fs::read_dir("/")
    {
        let _ = p;
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if !RESERVED.contains(&n.as_str()) && n != "root" {
                ro.push(format!("/{n}"));
            }
        }
    }
    for p in &ro {
        rs = rule(rs, p, read)?;
    }
    // Sealed folders: read, never execute (and read-only once sealed).
    for p in &spec.sealed {
        rs = rule(rs, p, AccessFs::ReadFile | AccessFs::ReadDir)?;
    }
    rs = rule(
        rs,
        "/dev",
        read | AccessFs::WriteFile | landlock::make_bitflags!(AccessFs::{IoctlDev}),
    )?;
    for p in ["/tmp", "/home/user", "/workspace", "/dev/shm"] {
        rs = rule(rs, p, all)?;
    }
    // What the runtime bound in is reachable as bound: read, and written when writable.
    for b in &spec.binds {
        let mut a = AccessFs::ReadFile | AccessFs::ReadDir;
        if b.writable {
            a |= AccessFs::WriteFile;
        }
        rs = rule(rs, &b.path, a)?;
    }
    for r in &spec.extra_rules {
        let mut a = landlock::BitFlags::<AccessFs>::empty();
        if r.read {
            a |= AccessFs::ReadFile | AccessFs::ReadDir;
        }
        if r.execute {
            a |= AccessFs::Execute;
        }
        if r.write {
            a |= all & !read;
        }
        if !a.is_empty() {
            rs = rule(rs, &r.path, a)?;
        }
    }
    Ok(Some(rs))
}

// ------------------------------------------------------------------ jobs

fn start_job(
    ctrl: &OwnedFd,
    st: &mut State,
    job: Job,
    fds: Vec<OwnedFd>,
) -> Result<i32, StepError> {
    let want = if job.check_exec { 5 } else { 4 };
    if fds.len() != want {
        return Err(StepError::new(
            "job",
            "fds",
            format!("want {want} descriptors"),
        ));
    }
    let mut it = fds.into_iter();
    let mut next = || it.next().expect("length checked");
    let (stdin, stdout, stderr, status) = (next(), next(), next(), next());
    let exec_sock = job.check_exec.then(&mut next);
    // SAFETY: init is single-threaded, so the child may run any code after fork.
    match unsafe { fork() }.map_err(se("fork", "job runner"))? {
        ForkResult::Parent { child } => Ok(child.as_raw()),
        ForkResult::Child => {
            let _ = ctrl;
            close_from_except(&[]);
            runner(st, job, [stdin, stdout, stderr, status], exec_sock)
        }
    }
}

/// Marks every fd >= 3 close-on-exec, and closes the control socket and signalfd (the
/// runner must not hold them).
fn close_from_except(keep: &[RawFd]) {
    // SAFETY: closing fd 3 (control socket) in the forked runner: the Rust object owning
    // it lives in the parent's stack frame copy and is never used or dropped here,
    // because the runner only leaves through _exit.
    unsafe {
        libc::close(CTRL_FD);
        libc::syscall(
            libc::SYS_close_range,
            4u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
    let _ = keep;
}

fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process at once; skipping destructors and atexit handlers
    // is what a forked child must do.
    unsafe { libc::_exit(code) }
}

/// The job's runner: a child subreaper that starts the job process, reaps everything
/// the job leaves, kills stragglers, answers exec checks, and reports on the status pipe.
fn runner(st: &mut State, job: Job, fds: [OwnedFd; 4], exec_sock: Option<OwnedFd>) -> ! {
    let [stdin, stdout, stderr, status] = fds;
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let Ok((err_r, err_w)) = nix::unistd::pipe2(OFlag::O_CLOEXEC) else {
        exit_now(1)
    };
    // The job process hands its seccomp listener to us over this pair before execve.
    let pair = if exec_sock.is_some() {
        match nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        ) {
            Ok(p) => Some(p),
            Err(_) => exit_now(1),
        }
    } else {
        None
    };
    // SAFETY: the runner is single-threaded (forked from the single-threaded init).
    let child = match unsafe { fork() } {
        Err(_) => exit_now(1),
        Ok(ForkResult::Child) => {
            drop(err_r);
            drop(exec_sock);
            let give = pair.map(|(a, b)| {
                drop(a);
                b
            });
            let e = confine_and_run(st, &job, stdin, stdout, stderr, give);
            let mut f = fs::File::from(err_w);
            let _ = f.write_all(&serde_json::to_vec(&e).unwrap_or_default());
            exit_now(127)
        }
        Ok(ForkResult::Parent { child }) => child,
    };
    drop((stdin, stdout, stderr, err_w));
    // The listener, if the job got as far as installing it (else the job failed and
    // its error arrives on err_r).
    let listener: Option<OwnedFd> = pair.and_then(|(mine, theirs)| {
        drop(theirs);
        match proto::recv::<u8>(mine.as_fd()) {
            Ok(Some((_, mut fds))) if fds.len() == 1 => fds.pop(),
            _ => None,
        }
    });
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    let Ok(sfd) = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    else {
        exit_now(1)
    };
    let me = nix::unistd::getpid().as_raw();
    let mut err = Vec::new();
    let mut err_r = Some(err_r);
    let mut job_status = None;
    let mut first_exec_seen = false;
    let mut chunk = [0u8; 4096];
    loop {
        // Reap first: the job may already be gone. Only this loop calls waitpid, so no
        // status is ever reaped and dropped.
        let mut no_children = false;
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(p, c)) if p == child => {
                    job_status = Some(JobStatus::Exited(c));
                    kill_tree(me, true);
                }
                Ok(WaitStatus::Signaled(p, sig, _)) if p == child => {
                    job_status = Some(JobStatus::Signaled(sig as i32));
                    kill_tree(me, true);
                }
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => {
                    no_children = true;
                    break;
                }
            }
        }
        if no_children && err_r.is_none() {
            // Everything is reaped and the error pipe is closed: done (a missing
            // status is reported below).
            break;
        }
        let mut pfds = vec![PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
        if let Some(r) = &err_r {
            pfds.push(PollFd::new(r.as_fd(), PollFlags::POLLIN));
        }
        if let Some(l) = &listener {
            pfds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut pfds, PollTimeout::from(100u16)) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => exit_now(1),
        }
        let ready: Vec<bool> = pfds
            .iter()
            .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(pfds);
        if ready[0] {
            while let Ok(Some(_)) = sfd.read_signal() {}
        }
        let mut k = 1;
        if err_r.is_some() {
            if ready[k] {
                match nix::unistd::read(err_r.as_ref().expect("checked"), &mut chunk) {
                    Ok(0) | Err(_) => err_r = None,
                    Ok(n) => err.extend_from_slice(&chunk[..n]),
                }
            }
            k += 1;
        }
        if let (Some(l), Some(x)) = (&listener, &exec_sock)
            && ready[k]
        {
            crate::execcheck::handle(l, x, child.as_raw(), &mut first_exec_seen);
        }
    }
    let out = if !err.is_empty() {
        match serde_json::from_slice::<StepError>(&err) {
            Ok(e) => JobStatus::Failed(e),
            Err(_) => JobStatus::Failed(StepError::new("job", "", "bad error report")),
        }
    } else {
        job_status.unwrap_or(JobStatus::Failed(StepError::new(
            "wait",
            "job",
            "no status",
        )))
    };
    let mut f = fs::File::from(status);
    let _ = f.write_all(&serde_json::to_vec(&out).unwrap_or_default());
    exit_now(0)
}

/// Kills every live descendant of `root` (not `root` itself) until none is left. With
/// `reap`, the caller is `root` (a child subreaper) and reaps as it goes.
pub(crate) fn kill_tree(root: i32, reap: bool) {
    // A subreaper with no children has no descendants at all: skip the /proc scan.
    if reap && waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) == Err(Errno::ECHILD) {
        return;
    }
    for _ in 0..10_000 {
        let d = descendants(root);
        if d.is_empty() {
            return;
        }
        for p in d {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        if reap {
            while let Ok(s) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                if s == WaitStatus::StillAlive {
                    break;
                }
            }
        } else {
            std::thread::yield_now();
        }
    }
}

/// Live (non-zombie) descendants of `root`, from `/proc`.
fn descendants(root: i32) -> Vec<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    let mut live = BTreeSet::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            let mut it = rest.split_whitespace();
            let state = it.next().unwrap_or("");
            let ppid: i32 = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            children.entry(ppid).or_default().push(pid);
            if state != "Z" && state != "X" {
                live.insert(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        if let Some(cs) = children.get(&p) {
            for &c in cs {
                if live.contains(&c) {
                    out.push(c);
                }
                todo.push(c);
            }
        }
    }
    out
}

fn cstr(s: &str, what: &str) -> Result<CString, StepError> {
    CString::new(s).map_err(|_| StepError::new("argument", what, "contains NUL"))
}

/// Drops into the confinement, then runs the job. Returns only on failure.
fn confine_and_run(
    st: &mut State,
    job: &Job,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    give_listener: Option<OwnedFd>,
) -> StepError {
    match confine(st, job, stdin, stdout, stderr) {
        Err(e) => e,
        Ok(()) => match run_job(st, job, give_listener) {
            Ok(()) => exit_now(0),
            Err(e) => e,
        },
    }
}

fn confine(
    st: &mut State,
    job: &Job,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
) -> Result<(), StepError> {
    nix::unistd::dup2_stdin(&stdin).map_err(se("dup2", "stdin"))?;
    nix::unistd::dup2_stdout(&stdout).map_err(se("dup2", "stdout"))?;
    nix::unistd::dup2_stderr(&stderr).map_err(se("dup2", "stderr"))?;
    drop((stdin, stdout, stderr));
    // Signals: nothing blocked, nothing ignored (init's Rust runtime ignores SIGPIPE).
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(se("sigprocmask", ""))?;
    for sig in [
        Signal::SIGPIPE,
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        // SAFETY: restoring the default disposition installs no Rust handler.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
    }
    nix::unistd::setsid().map_err(se("setsid", ""))?;
    // Prefer the job's processes over init when the OOM killer picks a victim.
    let _ = fs::write("/proc/self/oom_score_adj", "500");
    let rl = &st.rlimits;
    use nix::sys::resource::{Resource, setrlimit};
    for (r, v, name) in [
        (Resource::RLIMIT_NOFILE, rl.nofile, "RLIMIT_NOFILE"),
        (Resource::RLIMIT_CORE, rl.core, "RLIMIT_CORE"),
        (Resource::RLIMIT_STACK, rl.stack, "RLIMIT_STACK"),
    ] {
        setrlimit(r, v, v).map_err(se("setrlimit", name))?;
    }
    if let Some(f) = rl.fsize {
        setrlimit(Resource::RLIMIT_FSIZE, f, f).map_err(se("setrlimit", "RLIMIT_FSIZE"))?;
    }
    // Capabilities: empty the bounding set, then become the unprivileged user (which
    // clears the permitted and effective sets), then clear whatever is left.
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if r < 0 && Errno::last() == Errno::EINVAL {
            break;
        }
    }
    let _ = nix::unistd::setgroups(&[]);
    let (u, g) = (Uid::from_raw(st.uid), Gid::from_raw(st.gid));
    nix::unistd::setresgid(g, g, g).map_err(se("setresgid", st.gid.to_string()))?;
    nix::unistd::setresuid(u, u, u).map_err(se("setresuid", st.uid.to_string()))?;
    clear_caps()?;
    nix::sys::prctl::set_no_new_privs().map_err(se("prctl", "PR_SET_NO_NEW_PRIVS"))?;
    if let Some(rs) = st.landlock.take() {
        rs.restrict_self()
            .map_err(|e| StepError::new("landlock_restrict_self", "", e.to_string()))?;
    }
    nix::unistd::chdir(job.cwd.as_str()).map_err(se("chdir", &job.cwd))?;
    Ok(())
}

fn clear_caps() -> Result<(), StepError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522,
        pid: 0,
    }; // _LINUX_CAPABILITY_VERSION_3
    let d = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads a v3 header and two data structs, which we pass.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut Header, d.as_ptr()) };
    if r < 0 {
        return Err(StepError::new(
            "capset",
            "empty",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
    }
    Ok(())
}

fn env_path(env: &[(String, String)]) -> &str {
    env.iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/local/bin:/usr/bin:/bin")
}

fn resolve(argv0: &str, env: &[(String, String)]) -> Result<String, StepError> {
    if argv0.contains('/') {
        return Ok(argv0.to_string());
    }
    for dir in env_path(env).split(':').filter(|d| !d.is_empty()) {
        let cand = format!("{dir}/{argv0}");
        if let Ok(md) = fs::metadata(&cand)
            && md.is_file()
            && nix::unistd::access(cand.as_str(), nix::unistd::AccessFlags::X_OK).is_ok()
        {
            return Ok(cand);
        }
    }
    Err(StepError::new("execve", argv0, "command not found in PATH"))
}

fn run_job(st: &mut State, job: &Job, give_listener: Option<OwnedFd>) -> Result<(), StepError> {
    match &job.kind {
        JobKind::Exec { argv } => {
            let first = argv
                .first()
                .ok_or_else(|| StepError::new("execve", "", "empty argv"))?;
            let path = resolve(first, &job.env)?;
            let cpath = cstr(&path, "path")?;
            let args = argv
                .iter()
                .map(|a| cstr(a, "argv"))
                .collect::<Result<Vec<_>, _>>()?;
            let envs = job
                .env
                .iter()
                .map(|(k, v)| cstr(&format!("{k}={v}"), "env"))
                .collect::<Result<Vec<_>, _>>()?;
            crate::seccomp::apply(&st.seccomp)
                .map_err(|e| StepError::new("seccomp", "apply", e))?;
            if let Some(sock) = give_listener {
                // Install the execve listener and hand it to the runner; we must not
                // keep it (a job holding it could approve its own execs).
                let l = crate::execcheck::install_listener()?;
                proto::send(sock.as_fd(), &0u8, &[l.as_raw_fd()])
                    .map_err(|e| StepError::new("sendmsg", "seccomp listener", e))?;
                drop(l);
                drop(sock);
            }
            let e = nix::unistd::execve(&cpath, &args, &envs).unwrap_err();
            Err(StepError::new("execve", &path, e))
        }
        kind => {
            drop(give_listener);
            crate::seccomp::apply(&st.seccomp)
                .map_err(|e| StepError::new("seccomp", "apply", e))?;
            file_op(kind)
        }
    }
}

fn file_op(kind: &JobKind) -> Result<(), StepError> {
    let mut out = std::io::stdout().lock();
    match kind {
        JobKind::Exec { .. } => unreachable!("handled by run_job"),
        JobKind::ReadFile { path } => {
            let mut f = fs::File::open(path).map_err(se("open", path))?;
            std::io::copy(&mut f, &mut out).map_err(se("read", path))?;
        }
        JobKind::WriteFile { path, mode } => {
            if let Some(parent) = Path::new(path).parent() {
                fs::create_dir_all(parent).map_err(se("mkdir", parent))?;
            }
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(*mode)
                .open(path)
                .map_err(se("open", path))?;
            std::io::copy(&mut std::io::stdin().lock(), &mut f).map_err(se("write", path))?;
            f.set_permissions(fs::Permissions::from_mode(*mode))
                .map_err(se("chmod", path))?;
        }
        JobKind::List { path } => {
            let mut v = Vec::new();
            for e in fs::read_dir(path).map_err(se("read_dir", path))?.flatten() {
                let md = e.path().symlink_metadata().ok();
                let kind = match md.as_ref().map(|m| m.file_type()) {
                    Some(t) if t.is_symlink() => FileKind::Symlink,
                    Some(t) if t.is_dir() => FileKind::Dir,
                    Some(t) if t.is_file() => FileKind::File,
                    _ => FileKind::Other,
                };
                v.push(DirEntry {
                    name: e.file_name().to_string_lossy().into_owned(),
                    kind,
                    size: md.map(|m| m.len()).unwrap_or(0),
                });
            }
            v.sort_by(|a, b| a.name.cmp(&b.name));
            serde_json::to_writer(&mut out, &v)
                .map_err(|e| StepError::new("write", "stdout", e.to_string()))?;
        }
        JobKind::Remove { path, recursive } => {
            let md = fs::symlink_metadata(path).map_err(se("stat", path))?;
            if md.is_dir() {
                if *recursive {
                    fs::remove_dir_all(path).map_err(se("rmdir", path))?;
                } else {
                    fs::remove_dir(path).map_err(se("rmdir", path))?;
                }
            } else {
                fs::remove_file(path).map_err(se("unlink", path))?;
            }
        }
        JobKind::Mkdir { path } => {
            fs::create_dir_all(path).map_err(se("mkdir", path))?;
        }
        JobKind::Unpack { path, limits } => {
            let tar_err =
                |e: crate::tarball::TarError| StepError::new("untar", path, e.to_string());
            let archive =
                crate::tarball::read_capped(std::io::stdin().lock(), limits.max_archive_bytes)
                    .map_err(tar_err)?;
            crate::tarball::unpack(&archive, Path::new(path), limits).map_err(tar_err)?;
        }
        JobKind::Pack { path, limits } => {
            crate::tarball::pack(Path::new(path), &mut out, limits)
                .map_err(|e| StepError::new("tar", path, e.to_string()))?;
        }
        JobKind::Restore { path, max_bytes } => {
            let tar_err =
                |e: crate::tarball::TarError| StepError::new("restore", path, e.to_string());
            let archive = crate::tarball::read_capped(std::io::stdin().lock(), *max_bytes)
                .map_err(tar_err)?;
            crate::tarball::unpack_snapshot(&archive, Path::new(path), *max_bytes)
                .map_err(tar_err)?;
        }
    }
    out.flush().map_err(se("write", "stdout"))?;
    Ok(())
}
