//! Checks of every `execve` inside a sandbox: the job process installs a seccomp filter
//! that turns `execve`/`execveat` into user notifications and hands the listener to its
//! runner, which reads the path and argv from the caller's memory, asks the supervisor
//! (the guard) over a socket, and lets the call continue or fails it with EPERM.
//!
//! Limits (see THREAT_MODEL.md): the arguments are read from memory that another thread
//! of the caller can change after the check (TOCTOU), so a verdict can deny but never
//! vouch; programs run without `execve` (interpreters reading scripts, `memfd` tricks
//! through `execveat` are still seen, but an interpreter loop is not) are not checked.

use crate::error::StepError;
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
    let (path_at, argv_at) = if data.nr == libc::SYS_execveat as i32 {
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

/// Answers one pending notification. The job process's own first `execve` (its
/// command, already checked before it was sent) is let through without asking.
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
    let allow = if !*first_seen && req.pid as i32 == job_pid {
        *first_seen = true;
        true
    } else {
        match read_args(req.pid, &req.data) {
            None => false,
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
                valid && ask(supervisor, path, argv)
            }
        }
    };
    let resp = libc::seccomp_notif_resp {
        id: req.id,
        val: 0,
        error: if allow { 0 } else { -libc::EPERM },
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

fn ask(supervisor: &OwnedFd, path: String, argv: Vec<String>) -> bool {
    if proto::send(supervisor.as_fd(), &ExecCheck { path, argv }, &[]).is_err() {
        return false;
    }
    matches!(
        proto::recv::<ExecVerdict>(supervisor.as_fd()),
        Ok(Some((ExecVerdict { allow: true }, _)))
    )
}
