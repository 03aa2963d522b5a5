//! Messages between the supervisor and a sandbox's init: JSON over a SOCK_SEQPACKET
//! socket pair, with file descriptors passed as SCM_RIGHTS.

use crate::error::StepError;
use crate::spec::SandboxSpec;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The largest message either side sends.
pub const MAX_MSG: usize = 64 * 1024;

/// Supervisor -> init.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// First message: build the root, then answer `Ready`.
    Setup {
        spec: SandboxSpec,
        uid: u32,
        gid: u32,
    },
    /// Run a job. Fds: stdin (read end), stdout, stderr, status (write ends).
    Job(Job),
    /// Kill the process tree of the job whose runner has this pid.
    Kill {
        pid: i32,
    },
    Ping,
    /// Writes `file` in the unsealed folder `path` (one of the spec's `sealed`) from the
    /// pipe passed as the one fd, which must carry exactly `bytes` bytes; a short or
    /// long stream removes the file again. Answered once the pipe is closed.
    Fill {
        path: String,
        file: String,
        bytes: u64,
    },
    /// Makes the sealed folder `path` readable to the sandbox's commands and
    /// read-only for good (no further `Fill`).
    Seal {
        path: String,
    },
}

/// A job: a command, or a file operation run with the same confinement as commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub kind: JobKind,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// Every `execve` of the job's tree is held (seccomp user notification) and sent on
    /// a fifth fd, a SOCK_SEQPACKET socket, as [`ExecCheck`] for a verdict.
    #[serde(default)]
    pub check_exec: bool,
}

/// Runner -> supervisor: a process of the job wants to execute this.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecCheck {
    pub path: String,
    pub argv: Vec<String>,
    /// The job's own first `execve` (its command, checked before it was sent): judged
    /// again only when the file is a different program than its name says.
    #[serde(default)]
    pub first: bool,
    /// The file it would run, as found inside the sandbox (`None`: not found, not a
    /// regular file).
    #[serde(default)]
    pub file: Option<crate::identity::FileId>,
    /// The file's SHA-256 (hex), sent when the supervisor asked for it; `Some("")` when
    /// it could not be read.
    #[serde(default)]
    pub sha256: Option<String>,
}

/// Supervisor -> runner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecVerdict {
    pub allow: bool,
    /// No verdict yet: send the same check again with the file's content hash.
    #[serde(default)]
    pub want_hash: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum JobKind {
    Exec {
        argv: Vec<String>,
    },
    ReadFile {
        path: String,
    },
    WriteFile {
        path: String,
        mode: u32,
    },
    List {
        path: String,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    Mkdir {
        path: String,
    },
    /// Unpacks the tar archive on stdin into `path` (see [`crate::tarball::unpack`]).
    Unpack {
        path: String,
        limits: crate::tarball::TarLimits,
    },
    /// Packs `path` into a tar archive on stdout (see [`crate::tarball::pack`]).
    Pack {
        path: String,
        limits: crate::tarball::TarLimits,
    },
    /// Unpacks a snapshot layer on stdin into `path`, links and modes as they were (see
    /// [`crate::tarball::unpack_snapshot`]).
    Restore {
        path: String,
        max_bytes: u64,
    },
}

/// Init -> supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    Ready { init_pid_in_ns: i32 },
    Started { pid: i32 },
    Done,
    Pong,
    Failed(StepError),
}

/// What a job's runner writes on the status pipe once everything it started is gone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum JobStatus {
    Exited(i32),
    Signaled(i32),
    /// The job failed before running the program (confinement or execve).
    Failed(StepError),
}

/// Sends one message with optional fds.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[RawFd]) -> Result<(), String> {
    let buf = serde_json::to_vec(msg).map_err(|e| e.to_string())?;
    if buf.len() > MAX_MSG {
        return Err(format!("message of {} bytes exceeds {MAX_MSG}", buf.len()));
    }
    let iov = [IoSlice::new(&buf)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("sendmsg: {e}")),
        }
    }
}

/// Receives one message and its fds. `Ok(None)` on end of stream.
pub fn recv<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> Result<Option<(T, Vec<OwnedFd>)>, String> {
    // One receive buffer per thread: a fresh zeroed 64 KiB per message cost page
    // faults (and heap trims) on every create and every command.
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; MAX_MSG]);
    }
    BUF.with(|b| match b.try_borrow_mut() {
        Ok(mut buf) => recv_into(sock, &mut buf),
        // Re-entered (never, today): fall back to a buffer of its own.
        Err(_) => recv_into(sock, &mut vec![0u8; MAX_MSG]),
    })
}

fn recv_into<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> Result<Option<(T, Vec<OwnedFd>)>, String> {
    let mut cmsg_space = nix::cmsg_space!([RawFd; 8]);
    let (n, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut *buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => {
                let mut fds = Vec::new();
                for c in m.cmsgs().map_err(|e| format!("cmsgs: {e}"))? {
                    if let ControlMessageOwned::ScmRights(v) = c {
                        for fd in v {
                            // SAFETY: the kernel just installed this fd in our table for us;
                            // nothing else owns it.
                            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                        }
                    }
                }
                break (m.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("recvmsg: {e}")),
        }
    };
    if n == 0 {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[..n]).map_err(|e| format!("bad message: {e}"))?;
    Ok(Some((msg, fds)))
}
