//! Checks of every `execve` inside a sandbox: the job process installs a seccomp filter
//! that turns `execve`/`execveat` into user notifications and hands the listener to its
//! runner, which reads the path and argv from the caller's memory, asks the supervisor
//! (the guard) over a socket, and lets the call continue or fails it with EPERM.
//!
//! The check follows the binary, not its name: the runner opens the file the caller
//! names inside the sandbox's root and sends its device, inode and size (and, when the
//! supervisor asks, its content hash), so a copy of or a link to `rm` is judged as `rm`
//! (see `identity.rs`).
//!
//! Limits (see THREAT_MODEL.md): the arguments are read from memory that another thread
//! of the caller can change after the check, and the file can be replaced after it was
//! probed (TOCTOU), so a verdict can deny but never vouch; programs run without `execve`
//! (interpreters reading scripts, `memfd` tricks through `execveat` are still seen, but
//! an interpreter loop is not) are not checked.

use crate::error::StepError;
use crate::identity::{self, ExecTarget, FileId};
use crate::proto::{self, ExecCheck, ExecVerdict};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

const MAX_STR: usize = 4096;
const MAX_ARGS: usize = 256;

/// Installs the notification filter on the calling thread; returns the listener.
pub(crate) fn install_listener() -> Result<OwnedFd, StepError> {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    let prog = [
        sock_filter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: JEQ_K,
            jt: 2,
            jf: 0,
            k: libc::SYS_execve as u32,
        },
        sock_filter {
            code: JEQ_K,
            jt: 1,
            jf: 0,
            k: libc::SYS_execveat as u32,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_USER_NOTIF,
        },
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(StepError::new(
            "seccomp",
            "SECCOMP_FILTER_FLAG_NEW_LISTENER",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: the kernel just returned this new descriptor; we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn read_cstr(mem: &std::fs::File, mut addr: u64) -> Option<String> {
    let mut out = Vec::new();
    while out.len() < MAX_STR {
        // Never read across a page boundary in one go: the next page may be unmapped.
        let to_page_end = 4096 - (addr % 4096) as usize;
        let mut buf = vec![0u8; to_page_end.min(MAX_STR - out.len())];
        let n = mem.read_at(&mut buf, addr).ok()?;
        if n == 0 {
            return None;
        }
        if let Some(z) = buf[..n].iter().position(|b| *b == 0) {
            out.extend_from_slice(&buf[..z]);
            return Some(String::from_utf8_lossy(&out).into_owned());
        }
        out.extend_from_slice(&buf[..n]);
        addr += n as u64;
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

fn read_args(pid: u32, data: &libc::seccomp_data) -> Option<(String, Vec<String>)> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let (path_at, argv_at) = if is_execveat(data) {
        (data.args[1], data.args[2])
    } else {
        (data.args[0], data.args[1])
    };
    let path = read_cstr(&mem, path_at)?;
    let mut argv = Vec::new();
    if argv_at != 0 {
        for i in 0..MAX_ARGS as u64 {
            let mut p = [0u8; 8];
            if mem.read_at(&mut p, argv_at + i * 8).ok()? != 8 {
                return None;
            }
            let ptr = u64::from_ne_bytes(p);
            if ptr == 0 {
                break;
            }
            argv.push(read_cstr(&mem, ptr)?);
        }
    }
    Some((path, argv))
}

fn is_execveat(data: &libc::seccomp_data) -> bool {
    data.nr == libc::SYS_execveat as i32
}

/// The file the call would execute, identified inside the caller's root.
/// See [`identity::probe`]; run with the caller's filesystem ids.
fn probe(
    pid: u32,
    data: &libc::seccomp_data,
    path: &str,
) -> Result<Option<(FileId, OwnedFd)>, nix::errno::Errno> {
    let (dirfd, empty_path) = if is_execveat(data) {
        let d = data.args[0] as i32;
        (
            (d != libc::AT_FDCWD).then_some(d),
            data.args[4] & libc::AT_EMPTY_PATH as u64 != 0,
        )
    } else {
        (None, false)
    };
    let target = ExecTarget {
        pid,
        path,
        dirfd,
        empty_path,
    };
    identity::as_fs_ids_of(pid, || identity::probe(&target))?
}

/// Answers one pending notification. The job process's own first `execve` (its
/// command, already checked before it was sent) is asked about as `first`: the
/// supervisor judges it again only when the file is another program than its name.
pub(crate) fn handle(
    listener: &OwnedFd,
    supervisor: &OwnedFd,
    job_pid: i32,
    first_seen: &mut bool,
) {
    // SAFETY: seccomp_notif is plain old data; zeroed is the required initial state.
    let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: RECV fills `req`, a valid seccomp_notif that outlives the call.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut req,
        )
    };
    if r < 0 {
        return; // the caller died meanwhile
    }
    let first = !*first_seen && req.pid as i32 == job_pid;
    *first_seen |= first;
    // The errno a refused exec gets: EPERM for the guard's refusals; EACCES where the
    // file could not be looked at, so that a PATH search goes on to the next folder.
    let mut refusal = libc::EPERM;
    let allow = {
        match read_args(req.pid, &req.data) {
            // The first exec was checked as the command; unreadable later ones are not.
            None => first,
            Some((path, argv)) => {
                let mut id = req.id;
                // SAFETY: ID_VALID reads a u64 id; the pid's memory we read belonged
                // to the notifying task only if the id is still valid.
                let valid = unsafe {
                    libc::ioctl(
                        listener.as_raw_fd(),
                        libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
                        &mut id,
                    )
                } == 0;
                match probe(req.pid, &req.data, &path) {
                    Ok(file) => valid && ask(supervisor, path, argv, first, file),
                    // Something may be there that the probe cannot open: judging it by
                    // its name would let `/tmp/r -> /bin/rm` pass as `r`. Refused, first
                    // exec or not.
                    Err(_) => {
                        refusal = libc::EACCES;
                        false
                    }
                }
            }
        }
    };
    let resp = libc::seccomp_notif_resp {
        id: req.id,
        val: 0,
        error: if allow { 0 } else { -refusal },
        flags: if allow {
            libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32
        } else {
            0
        },
    };
    // SAFETY: SEND reads a valid seccomp_notif_resp that outlives the call.
    unsafe {
        libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &resp);
    }
}

fn ask(
    supervisor: &OwnedFd,
    path: String,
    argv: Vec<String>,
    first: bool,
    file: Option<(FileId, OwnedFd)>,
) -> bool {
    let mut check = ExecCheck {
        path,
        argv,
        first,
        file: file.as_ref().map(|(id, _)| *id),
        sha256: None,
    };
    loop {
        if proto::send(supervisor.as_fd(), &check, &[]).is_err() {
            return false;
        }
        match proto::recv::<ExecVerdict>(supervisor.as_fd()) {
            Ok(Some((v, _))) if v.want_hash && check.sha256.is_none() => {
                // Same size as a known program: send its content hash.
                let h = file
                    .as_ref()
                    .and_then(|(id, fd)| identity::hash_probed(fd, id.size));
                check.sha256 = Some(h.map(|h| identity::hex(&h)).unwrap_or_default());
            }
            Ok(Some((v, _))) => return v.allow && !v.want_hash,
            _ => return false,
        }
    }
}
