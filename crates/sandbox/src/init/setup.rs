//! Building the sandbox's root: the template's entries bound read-only, devices, the
//! private writable folders, `pivot_root`; sealed folders filled and sealed; loopback.

use crate::error::StepError;
use crate::spec::{SandboxSpec, Template};
use nix::fcntl::{OFlag, open};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::Mode;
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::confine::landlock_ruleset;
use super::{DEVICES, HOST_ENTRIES, RESERVED, STAGE, State, se};

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

pub(super) fn setup(spec: &SandboxSpec, uid: u32, gid: u32) -> Result<State, StepError> {
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
pub(super) fn fill(
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
pub(super) fn seal(st: &mut State, path: &str) -> Result<(), StepError> {
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
