//! Running a command: the guard's check, the job's pipes, streaming output, and the
//! answers to the job's `execve` checks.

use crate::error::ExecError;
use crate::guard::CheckDecision;
use crate::proto::{self, Job, JobKind, JobStatus, Reply, Request};
use crate::spec::{ExecOutput, ExecRequest, ExitStatus, Network};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::unistd::pipe2;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{JobResult, OutputSink, Sandbox, Stream, recv_timeout};

fn set_nonblocking(fd: &OwnedFd) {
    let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
}

impl Sandbox {
    fn base_env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = [
            (
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ),
            ("HOME", "/home/user"),
            ("USER", "user"),
            ("LANG", "C.UTF-8"),
            ("TERM", "dumb"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Network::Proxy(_) = &self.spec.network {
            let url = format!("http://{}", crate::spec::PROXY_ADDR);
            for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.push((k.to_string(), url.clone()));
            }
            env.push(("NO_PROXY".into(), "localhost,127.0.0.1".into()));
        }
        env.extend(self.spec.env.iter().cloned());
        env
    }

    /// Runs a command and waits for it (and everything it started) to finish. The guard
    /// checks it first; a blocked command is an `Err`, a failing one an `Ok` with its
    /// status. On timeout the whole tree is killed.
    pub fn exec(&self, req: &ExecRequest) -> Result<ExecOutput, ExecError> {
        self.exec_inner(req, None)
    }

    /// Like [`Sandbox::exec`], and calls `on_output` with stdout and stderr as they
    /// arrive, redacted by the guard's stream redactor: a secret split across chunks is
    /// held back until it is whole, so the stream says what the final output says, and
    /// `redacted` is true when either redacted anything.
    pub fn exec_streaming(
        &self,
        req: &ExecRequest,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecOutput, ExecError> {
        let guard = &self.rt.guard;
        let tenant = self.tenant();
        let (out_at, err_at) = (
            format!("sandbox {} stdout", self.id),
            format!("sandbox {} stderr", self.id),
        );
        // One redactor per stream, holding back a secret split across chunks until it
        // is whole: what the caller sees is what the final output says.
        let mut rs = [
            guard.stream_redactor(tenant, &out_at),
            guard.stream_redactor(tenant, &err_at),
        ];
        let idx = |st: Stream| usize::from(st == Stream::Stderr);
        let mut f = |st: Stream, data: &[u8]| {
            let r = rs[idx(st)].push(data);
            if !r.is_empty() {
                on_output(st, &r);
            }
        };
        let res = self.exec_inner(req, Some(&mut f));
        for st in [Stream::Stdout, Stream::Stderr] {
            let r = rs[idx(st)].finish();
            if !r.is_empty() {
                on_output(st, &r);
            }
        }
        let streamed_redacted = rs.iter().any(|r| r.redacted());
        res.map(|mut out| {
            out.redacted |= streamed_redacted;
            out
        })
    }

    fn exec_inner(
        &self,
        req: &ExecRequest,
        on_chunk: Option<&mut OutputSink<'_>>,
    ) -> Result<ExecOutput, ExecError> {
        self.check_alive()?;
        let argv = req.command.argv();
        if argv.is_empty() || argv[0].is_empty() {
            return Err(ExecError::EmptyCommand);
        }
        let mut alerts = Vec::new();
        match self.rt.guard.check(self.tenant(), &req.command) {
            CheckDecision::Allow => {}
            CheckDecision::Alert(a) => alerts = a,
            CheckDecision::Block(r) => return Err(ExecError::Blocked(r.join("; "))),
        }
        let mut env = self.base_env();
        env.extend(req.env.iter().cloned());
        let job = Job {
            kind: JobKind::Exec { argv },
            env,
            cwd: req.cwd.clone().unwrap_or_else(|| "/workspace".into()),
            check_exec: self.rt.guard.checks_exec(),
        };
        let r = match self.run_job(
            job,
            req.stdin.as_deref(),
            req.timeout,
            req.max_output,
            on_chunk,
        ) {
            Ok(r) => r,
            // Destroyed under the command (killed, timed out, deleted): say so, not
            // whatever the broken pipe looked like.
            Err(_) if self.destroyed.load(Ordering::Acquire) => {
                return Err(ExecError::Destroyed(self.id.clone()));
            }
            Err(e) => return Err(e),
        };
        let mut out = ExecOutput {
            status: r.status,
            stdout: r.stdout,
            stderr: r.stderr,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            timed_out: r.timed_out,
            oom_killed: r.oom_killed,
            alerts: {
                let mut a = alerts;
                a.extend(r.exec_alerts);
                a
            },
            redacted: false,
        };
        let g = &self.rt.guard;
        let at = |s: &str| format!("sandbox {} {s}", self.id);
        if let Some(s) = g.redact(self.tenant(), &at("stdout"), &out.stdout) {
            out.stdout = s;
            out.redacted = true;
        }
        if let Some(s) = g.redact(self.tenant(), &at("stderr"), &out.stderr) {
            out.stderr = s;
            out.redacted = true;
        }
        Ok(out)
    }

    pub(super) fn run_job(
        &self,
        job: Job,
        stdin: Option<&[u8]>,
        timeout: Option<Duration>,
        max_output: usize,
        mut on_chunk: Option<&mut OutputSink<'_>>,
    ) -> Result<JobResult, ExecError> {
        let sys = |syscall: &'static str| {
            move |e: Errno| ExecError::Syscall {
                syscall,
                source: e.into(),
            }
        };
        let (in_r, in_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        let (st_r, st_w) = pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
        let oom_before = self.cgroup.as_ref().map(|c| c.oom_kills()).unwrap_or(0);
        let check_exec = job.check_exec;
        let (exec_sup, exec_run) = if check_exec {
            let (a, b) = socketpair(
                AddressFamily::Unix,
                SockType::SeqPacket,
                None,
                SockFlag::SOCK_CLOEXEC,
            )
            .map_err(sys("socketpair"))?;
            (Some(a), Some(b))
        } else {
            (None, None)
        };
        let mut job_fds = vec![
            in_r.as_raw_fd(),
            out_w.as_raw_fd(),
            err_w.as_raw_fd(),
            st_w.as_raw_fd(),
        ];
        if let Some(x) = &exec_run {
            job_fds.push(x.as_raw_fd());
        }
        let reply = self.request(&Request::Job(job), &job_fds)?;
        drop((in_r, out_w, err_w, st_w, exec_run));
        let mut exec_sup = exec_sup;
        let mut exec_alerts = Vec::new();
        let runner = match reply {
            Reply::Started { pid } => pid,
            Reply::Failed(e) => return Err(ExecError::Start(e)),
            r => return Err(ExecError::Protocol(format!("unexpected reply {r:?}"))),
        };
        let mut stdin_w = match stdin {
            Some(d) if !d.is_empty() => {
                set_nonblocking(&in_w);
                Some((in_w, d, 0usize))
            }
            _ => {
                drop(in_w);
                None
            }
        };
        let mut bufs: [Vec<u8>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        let mut trunc = [false; 3];
        let mut open = [Some(out_r), Some(err_r), Some(st_r)];
        let start = Instant::now();
        let mut deadline = timeout.map(|t| start + t);
        let mut timed_out = false;
        let mut chunk = vec![0u8; 64 * 1024];
        while open.iter().any(Option::is_some) {
            let now = Instant::now();
            if let Some(d) = deadline
                && now >= d
            {
                if timed_out {
                    return Err(ExecError::Protocol(format!(
                        "job {runner} in sandbox {} did not die after kill",
                        self.id
                    )));
                }
                timed_out = true;
                let _ = self.request(&Request::Kill { pid: runner }, &[])?;
                stdin_w = None;
                deadline = Some(Instant::now() + Duration::from_secs(10));
                continue;
            }
            let wait_ms = deadline
                .map(|d| d.saturating_duration_since(now).as_millis().min(10_000) as i32 + 1)
                .unwrap_or(-1);
            let mut pfds: Vec<PollFd> = Vec::with_capacity(4);
            let mut which: Vec<usize> = Vec::with_capacity(4);
            for (i, o) in open.iter().enumerate() {
                if let Some(fd) = o {
                    pfds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    which.push(i);
                }
            }
            if let Some((fd, _, _)) = &stdin_w {
                pfds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
                which.push(3);
            }
            if let Some(x) = &exec_sup {
                pfds.push(PollFd::new(x.as_fd(), PollFlags::POLLIN));
                which.push(4);
            }
            let timeout = PollTimeout::try_from(wait_ms).unwrap_or(PollTimeout::NONE);
            match poll(&mut pfds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(sys("poll")(e)),
            }
            let ready: Vec<(usize, bool)> = pfds
                .iter()
                .zip(&which)
                .map(|(p, &i)| (i, p.revents().is_some_and(|r| !r.is_empty())))
                .collect();
            drop(pfds);
            for (i, is_ready) in ready {
                if !is_ready {
                    continue;
                }
                if i == 4 {
                    if let Some(x) = &exec_sup
                        && !self.answer_exec_check(x, &mut exec_alerts)
                    {
                        exec_sup = None;
                    }
                    continue;
                }
                if i == 3 {
                    let mut done = false;
                    if let Some((fd, data, off)) = &mut stdin_w {
                        match nix::unistd::write(&*fd, &data[*off..]) {
                            Ok(n) => {
                                *off += n;
                                done = *off >= data.len();
                            }
                            Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                            Err(_) => done = true,
                        }
                    }
                    if done {
                        stdin_w = None;
                    }
                    continue;
                }
                let Some(fd) = &open[i] else { continue };
                match nix::unistd::read(fd, &mut chunk) {
                    Ok(0) => open[i] = None,
                    Ok(n) => {
                        let cap = if i == 2 { 1 << 20 } else { max_output };
                        let room = cap.saturating_sub(bufs[i].len());
                        if n > room {
                            trunc[i] = true;
                        }
                        bufs[i].extend_from_slice(&chunk[..n.min(room)]);
                        if i < 2
                            && let Some(f) = on_chunk.as_mut()
                        {
                            let stream = if i == 0 {
                                Stream::Stdout
                            } else {
                                Stream::Stderr
                            };
                            f(stream, &chunk[..n]);
                        }
                    }
                    Err(Errno::EINTR) | Err(Errno::EAGAIN) => {}
                    Err(_) => open[i] = None,
                }
            }
        }
        let [stdout, stderr, status] = bufs;
        let status: JobStatus = serde_json::from_slice(&status)
            .map_err(|e| ExecError::Protocol(format!("job status: {e}")))?;
        let status = match status {
            JobStatus::Exited(c) => ExitStatus::Exited(c),
            JobStatus::Signaled(s) => ExitStatus::Signaled(s),
            JobStatus::Failed(e) => return Err(ExecError::Start(e)),
        };
        let oom_killed = self.cgroup.as_ref().map(|c| c.oom_kills()).unwrap_or(0) > oom_before;
        Ok(JobResult {
            status,
            stdout,
            stderr,
            stdout_truncated: trunc[0],
            stderr_truncated: trunc[1],
            timed_out,
            oom_killed,
            exec_alerts,
        })
    }

    /// Answers one exec check from a job's runner with the guard's verdict, judging
    /// the file as the program it is (a copy of or a link to a program of the template
    /// is judged as that program; see `identity.rs`). Returns false when the runner's
    /// socket is closed.
    fn answer_exec_check(&self, sock: &OwnedFd, alerts: &mut Vec<String>) -> bool {
        use crate::identity::{self, Identity};
        let Ok(Some((mut check, _))) = proto::recv::<proto::ExecCheck>(sock.as_fd()) else {
            return false;
        };
        let table = identity::table_for(&identity::template_root(&self.spec.template));
        let mut ident = match &check.file {
            Some(f) => table.identify(f, None),
            None => Identity::Unknown,
        };
        if ident == Identity::NeedHash {
            // Same size as a program of the template: its content decides.
            let ask = proto::ExecVerdict {
                allow: false,
                want_hash: true,
            };
            if proto::send(sock.as_fd(), &ask, &[]).is_err() {
                return false;
            }
            match recv_timeout::<proto::ExecCheck>(sock, Duration::from_secs(30)) {
                Ok(c) => check = c,
                Err(_) => return false,
            }
            let hash = check.sha256.as_deref().and_then(identity::unhex);
            ident = match (&check.file, hash) {
                (Some(f), Some(h)) => table.identify(f, Some(&h)),
                _ => Identity::Unknown,
            };
        }
        let mut argv = check.argv.clone();
        if argv.is_empty() {
            argv.push(check.path.clone());
        }
        let called = argv[0].rsplit('/').next().unwrap_or("").to_string();
        // Judged as the program it is, when that is not the name it was called by.
        let program = match ident {
            Identity::Known { program, names } if !names.contains(&called) => Some(program),
            _ => None,
        };
        if check.first && program.is_none() {
            // The job's command itself, checked before it was sent.
            let v = proto::ExecVerdict {
                allow: true,
                want_hash: false,
            };
            return proto::send(sock.as_fd(), &v, &[]).is_ok();
        }
        let shown = match &program {
            Some(p) => format!(
                "{}` (the file is `{p}`)",
                crate::Command::Argv(argv.clone()).display()
            ),
            None => format!("{}`", crate::Command::Argv(argv.clone()).display()),
        };
        let mut note = |msg: String| {
            // A PATH search tries the same argv in several directories: report it once.
            if !alerts.contains(&msg) {
                alerts.push(msg);
            }
        };
        let allow = match self
            .rt
            .guard
            .check_exec(self.tenant(), &argv, program.as_deref())
        {
            CheckDecision::Allow => true,
            CheckDecision::Alert(r) => {
                note(format!("execve `{shown}: {}", r.join("; ")));
                true
            }
            CheckDecision::Block(r) => {
                note(format!("execve `{shown} blocked: {}", r.join("; ")));
                false
            }
        };
        let v = proto::ExecVerdict {
            allow,
            want_hash: false,
        };
        proto::send(sock.as_fd(), &v, &[]).is_ok()
    }
}
