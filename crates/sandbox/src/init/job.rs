//! Jobs: the runner init forks for each request (a child subreaper that starts the job
//! process, answers its exec checks, kills what it leaves and reports its status).

use crate::error::StepError;
use crate::proto::{self, Job, JobStatus};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd, RawFd};

use super::confine::confine_and_run;
use super::{CTRL_FD, State, se};

pub(super) fn start_job(
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

pub(super) fn exit_now(code: i32) -> ! {
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
