//! One micro-VM sandbox on the host side: the control channel's reader, calls and their
//! replies, the guard's checks and redaction, freeze, snapshot (QEMU migration to a
//! file) and destroy; and the QEMU command line of a [`Machine`].

use super::qemu::{Accel, Qmp};
use super::wire::{self, Answer, Call, Msg, Verdict, WireError};
use super::{Blob, MicroVmTier, guest, link_or_copy};
use crate::cgroup::SandboxCgroup;
use crate::error::{ExecError, FileError, LifecycleError, StepError};
use crate::guard::{CheckDecision, CommandCheck, FileAccess};
use crate::sandbox::Stream;
use crate::spec::{DirEntry, ExecOutput, ExecRequest, SandboxSpec};
use crate::tarball::{TarLimits, TarSummary};
use crate::tier::{Isolated, SnapshotParts, Stats, TierKind};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};
use std::time::{Duration, Instant};

pub(super) fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let from = lines.len().saturating_sub(8);
    format!(" (QEMU and console: {})", lines[from..].join(" | "))
}

/// The machine a VM runs on: what a restore must give QEMU again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Machine {
    pub(super) memory_mib: u64,
    pub(super) vcpus: u32,
    pub(super) accel: Accel,
    pub(super) kernel: Blob,
    pub(super) initrd: Blob,
    pub(super) disk: Blob,
    pub(super) tsc_khz: u64,
}

impl Machine {
    pub(super) fn args(&self, incoming: bool) -> Vec<OsString> {
        let mut append = String::from(
            "console=ttyS0 quiet panic=-1 random.trust_cpu=on 8250.nr_uarts=1 TESSERA_GUEST=1",
        );
        append.push_str(&super::qemu::timing_append(self.accel, self.tsc_khz));
        let mut a: Vec<String> = vec![
            "-name".into(),
            "tessera-vm".into(),
            "-M".into(),
            super::qemu::MACHINE.into(),
        ];
        a.extend(super::qemu::accel_args(self.accel).map(String::from));
        a.extend([
            "-m".into(),
            self.memory_mib.to_string(),
            "-smp".into(),
            self.vcpus.to_string(),
            "-nodefaults".into(),
            "-no-user-config".into(),
            "-nographic".into(),
            "-no-reboot".into(),
            "-serial".into(),
            "stdio".into(),
            "-kernel".into(),
            "/proc/self/fd/6".into(),
            "-initrd".into(),
            "/proc/self/fd/7".into(),
            "-append".into(),
            append,
            "-drive".into(),
            "file=/proc/self/fd/8,if=none,id=root,format=raw,readonly=on".into(),
            "-device".into(),
            "virtio-blk-device,drive=root".into(),
            "-device".into(),
            "virtio-serial-device".into(),
            "-chardev".into(),
            "socket,id=ctl,fd=3".into(),
            "-device".into(),
            format!("virtserialport,chardev=ctl,name={}", guest::PORT_NAME),
            "-chardev".into(),
            "socket,id=qmp,fd=4".into(),
            "-mon".into(),
            "chardev=qmp,mode=control".into(),
            "-sandbox".into(),
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
            "-S".into(),
        ]);
        if incoming {
            a.extend(["-incoming".into(), "fd:5".into()]);
        }
        a.into_iter().map(OsString::from).collect()
    }
}

/// Boot times of one VM.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BootTimes {
    /// From starting QEMU to the agent's `Ready` (or, restoring, its first answer).
    pub host_ms: f64,
    /// The guest's uptime at `Ready` (0 for a restore).
    pub guest_ms: u64,
}

pub(super) type Inbox = mpsc::Sender<(Msg, Vec<u8>)>;
/// Where a call's messages arrive.
type Outbox = mpsc::Receiver<(Msg, Vec<u8>)>;
/// A caller's output callback.
type OnChunk<'a> = &'a mut dyn FnMut(Stream, &[u8]);

/// What the reader thread and the callers share.
pub(super) struct Shared {
    pub(super) tx: Mutex<UnixStream>,
    pub(super) calls: Mutex<HashMap<u64, Inbox>>,
    pub(super) next: AtomicU64,
    pub(super) guard: Arc<dyn CommandCheck>,
    pub(super) tenant: RwLock<Option<String>>,
    pub(super) quiet: Mutex<Option<mpsc::Sender<()>>>,
    pub(super) dead: AtomicBool,
    /// The guest's proxy connections, served here ([`super::egress`]).
    pub(super) egress: Arc<super::egress::HostEgress>,
}

impl Shared {
    pub(super) fn send(&self, msg: &Msg, body: &[u8]) -> io::Result<()> {
        let mut s = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        wire::write_msg(&mut *s, msg, body)
    }

    pub(super) fn read_loop(self: Arc<Self>, mut rd: UnixStream) {
        // Until the end or garbage: the VM is gone (or broken, which is the same to us).
        while let Ok(Some(m)) = wire::read_msg(&mut rd) {
            match m {
                (Msg::Output { id, .. }, _) | (Msg::Reply { id, .. }, _) => {
                    let last = matches!(m.0, Msg::Reply { .. });
                    let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(tx) = calls.get(&id) {
                        let _ = tx.send(m);
                    }
                    if last {
                        calls.remove(&id);
                    }
                }
                (
                    Msg::ExecCheck {
                        q, argv, program, ..
                    },
                    _,
                ) => {
                    let tenant = self
                        .tenant
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    let verdict =
                        match self
                            .guard
                            .check_exec(tenant.as_deref(), &argv, program.as_deref())
                        {
                            CheckDecision::Allow => Verdict::Allow,
                            CheckDecision::Alert(r) => Verdict::Alert(r),
                            CheckDecision::Block(r) => Verdict::Block(r),
                        };
                    if self.send(&Msg::Verdict { q, verdict }, &[]).is_err() {
                        break;
                    }
                }
                (
                    msg @ (Msg::EgressOpen { .. }
                    | Msg::EgressData { .. }
                    | Msg::EgressClose { .. }),
                    body,
                ) => {
                    let e = self.egress.clone();
                    e.handle(&self, msg, &body);
                }
                (Msg::Quiet, _) => {
                    if let Some(t) = self.quiet.lock().unwrap_or_else(|p| p.into_inner()).take() {
                        let _ = t.send(());
                    }
                }
                _ => {}
            }
        }
        self.dead.store(true, Ordering::Release);
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.quiet.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// One micro-VM sandbox.
pub struct VmSandbox {
    pub(super) id: String,
    pub(super) spec: SandboxSpec,
    pub(super) tenant: Option<String>,
    pub(super) tier: Arc<MicroVmTier>,
    pub(super) shared: Arc<Shared>,
    pub(super) child: Mutex<Option<Child>>,
    pub(super) pid: i32,
    pub(super) qmp: Mutex<Qmp>,
    pub(super) cgroup: Option<Box<dyn SandboxCgroup>>,
    pub(super) frozen: AtomicBool,
    pub(super) destroyed: AtomicBool,
    pub(super) machine: Machine,
    pub(super) kernel: String,
    pub(super) boot: BootTimes,
    pub(super) log: PathBuf,
    pub(super) _reader: std::thread::JoinHandle<()>,
}

impl std::fmt::Debug for VmSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmSandbox")
            .field("id", &self.id)
            .field("qemu_pid", &self.pid)
            .field("accel", &self.machine.accel)
            .finish()
    }
}

pub(super) fn from_wire_exec(id: &str, e: WireError) -> ExecError {
    match e {
        WireError::Blocked(r) => ExecError::Blocked(r),
        WireError::EmptyCommand => ExecError::EmptyCommand,
        WireError::Start(s) => ExecError::Start(s),
        WireError::Destroyed => ExecError::Destroyed(id.to_string()),
        WireError::Paused => ExecError::Paused(id.to_string()),
        other => ExecError::Protocol(format!("guest: {other:?}")),
    }
}

pub(super) fn from_wire_file(id: &str, e: WireError) -> FileError {
    match e {
        WireError::BadPath(p) => FileError::BadPath(p),
        WireError::Op { path, source } => FileError::Op { path, source },
        WireError::Archive { path, source } => FileError::Archive { path, source },
        other => FileError::Exec(from_wire_exec(id, other)),
    }
}

impl VmSandbox {
    /// The guest kernel's `uname -r`.
    pub fn guest_kernel(&self) -> &str {
        &self.kernel
    }
    /// KVM or TCG.
    pub fn accel(&self) -> Accel {
        self.machine.accel
    }
    pub fn boot_times(&self) -> BootTimes {
        self.boot
    }
    /// QEMU's stderr and the guest's console.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
    /// The cgroup QEMU runs in.
    pub fn cgroup(&self) -> Option<&dyn SandboxCgroup> {
        self.cgroup.as_deref()
    }

    fn check_alive(&self) -> Result<(), ExecError> {
        if self.destroyed.load(Ordering::Acquire) {
            return Err(ExecError::Destroyed(self.id.clone()));
        }
        if self.frozen.load(Ordering::Acquire) {
            return Err(ExecError::Paused(self.id.clone()));
        }
        if self.shared.dead.load(Ordering::Acquire) {
            return Err(ExecError::Protocol(format!(
                "micro-VM {} is gone (QEMU or its agent exited){}",
                self.id,
                log_tail(&self.log)
            )));
        }
        Ok(())
    }

    /// Sends `call` and returns the inbox its output and reply arrive in.
    fn call(&self, call: Call, body: &[u8]) -> Result<(u64, Outbox), ExecError> {
        self.check_alive()?;
        let id = self.shared.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        self.shared
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        if let Err(e) = self.shared.send(&Msg::Call { id, call }, body) {
            self.shared
                .calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return Err(ExecError::Protocol(format!(
                "sending to micro-VM {}: {e}",
                self.id
            )));
        }
        Ok((id, rx))
    }

    fn gone(&self) -> ExecError {
        if self.destroyed.load(Ordering::Acquire) {
            ExecError::Destroyed(self.id.clone())
        } else {
            ExecError::Protocol(format!(
                "micro-VM {} ended during the call{}",
                self.id,
                log_tail(&self.log)
            ))
        }
    }

    /// Waits for the reply of a call with no output stream.
    fn reply(
        &self,
        call: Call,
        body: &[u8],
        limit: Duration,
    ) -> Result<(Result<Answer, WireError>, Vec<u8>), ExecError> {
        let (_, rx) = self.call(call, body)?;
        loop {
            match rx.recv_timeout(limit) {
                Ok((Msg::Reply { result, .. }, b)) => return Ok((result, b)),
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(ExecError::Protocol(format!(
                        "micro-VM {} did not answer within {limit:?}",
                        self.id
                    )));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(self.gone()),
            }
        }
    }

    fn file_call(
        &self,
        op: FileAccess,
        path: &str,
        call: Call,
        body: &[u8],
    ) -> Result<(Answer, Vec<u8>), FileError> {
        if !path.starts_with('/') || path.contains('\0') {
            return Err(FileError::BadPath(path.to_string()));
        }
        self.check_alive()?;
        if let CheckDecision::Block(r) =
            self.tier
                .cfg
                .guard
                .check_file(self.tenant.as_deref(), op, path)
        {
            return Err(FileError::Exec(ExecError::Blocked(r.join("; "))));
        }
        let (r, b) = self.reply(call, body, Duration::from_secs(600))?;
        match r {
            Ok(a) => Ok((a, b)),
            Err(e) => Err(from_wire_file(&self.id, e)),
        }
    }

    fn guard(&self) -> &Arc<dyn CommandCheck> {
        &self.tier.cfg.guard
    }

    fn exec_inner(
        &self,
        req: &ExecRequest,
        mut on_chunk: Option<OnChunk<'_>>,
    ) -> Result<ExecOutput, ExecError> {
        self.check_alive()?;
        let argv = req.command.argv();
        if argv.is_empty() || argv[0].is_empty() {
            return Err(ExecError::EmptyCommand);
        }
        let mut alerts = Vec::new();
        match self.guard().check(self.tenant.as_deref(), &req.command) {
            CheckDecision::Allow => {}
            CheckDecision::Alert(a) => alerts = a,
            CheckDecision::Block(r) => return Err(ExecError::Blocked(r.join("; "))),
        }
        let stream = on_chunk.is_some();
        let call = Call::Exec {
            argv,
            env: req.env.clone(),
            cwd: req.cwd.clone(),
            timeout_ms: req.timeout.map(|t| t.as_millis() as u64),
            max_output: req.max_output,
            stream,
        };
        let (_, rx) = self.call(call, req.stdin.as_deref().unwrap_or(b""))?;
        // The guest ends the command at its timeout; this bound only catches a guest
        // that stopped answering.
        let limit =
            req.timeout.unwrap_or(Duration::from_secs(24 * 3600)) + Duration::from_secs(120);
        let deadline = Instant::now() + limit;
        let mut bufs = [Vec::new(), Vec::new()];
        let mut trunc = [false, false];
        let (w, body) = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok((Msg::Output { stderr, .. }, data)) => {
                    let i = usize::from(stderr);
                    let room = req.max_output.saturating_sub(bufs[i].len());
                    if data.len() > room {
                        trunc[i] = true;
                    }
                    bufs[i].extend_from_slice(&data[..data.len().min(room)]);
                    if let Some(f) = on_chunk.as_mut() {
                        f(
                            if stderr {
                                Stream::Stderr
                            } else {
                                Stream::Stdout
                            },
                            &data,
                        );
                    }
                }
                Ok((Msg::Reply { result, .. }, body)) => match result {
                    Ok(Answer::Exec(w)) => break (w, body),
                    Ok(other) => {
                        return Err(ExecError::Protocol(format!(
                            "guest answered an exec with {other:?}"
                        )));
                    }
                    Err(e) => return Err(from_wire_exec(&self.id, e)),
                },
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(ExecError::Protocol(format!(
                        "micro-VM {} did not finish the command within {limit:?}",
                        self.id
                    )));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(self.gone()),
            }
        };
        let (stdout, stderr) = if stream {
            let [o, e] = bufs;
            (o, e)
        } else {
            let n = (w.stdout_len as usize).min(body.len());
            (body[..n].to_vec(), body[n..].to_vec())
        };
        alerts.extend(w.alerts);
        let mut out = ExecOutput {
            status: w.status,
            stdout,
            stderr,
            stdout_truncated: w.stdout_truncated || trunc[0],
            stderr_truncated: w.stderr_truncated || trunc[1],
            timed_out: w.timed_out,
            oom_killed: w.oom_killed,
            alerts,
            redacted: false,
        };
        let at = |s: &str| format!("sandbox {} {s}", self.id);
        let t = self.tenant.as_deref();
        if let Some(s) = self.guard().redact(t, &at("stdout"), &out.stdout) {
            out.stdout = s;
            out.redacted = true;
        }
        if let Some(s) = self.guard().redact(t, &at("stderr"), &out.stderr) {
            out.stderr = s;
            out.redacted = true;
        }
        Ok(out)
    }

    fn qmp(&self) -> std::sync::MutexGuard<'_, Qmp> {
        self.qmp.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn vmm(&self, op: &'static str) -> impl FnOnce(String) -> LifecycleError + '_ {
        move |message| LifecycleError::Vmm {
            id: self.id.clone(),
            op,
            message,
        }
    }
}

impl Isolated for VmSandbox {
    fn id(&self) -> &str {
        &self.id
    }
    fn kind(&self) -> TierKind {
        TierKind::Microvm
    }
    fn spec(&self) -> &SandboxSpec {
        &self.spec
    }
    fn host_pid(&self) -> i32 {
        self.pid
    }
    fn set_tenant(&mut self, tenant: Option<String>) {
        *self
            .shared
            .tenant
            .write()
            .unwrap_or_else(|p| p.into_inner()) = tenant.clone();
        self.tenant = tenant;
    }
    fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }
    fn ping(&self) -> Result<(), ExecError> {
        match self.reply(Call::Ping, &[], Duration::from_secs(60))?.0 {
            Ok(_) => Ok(()),
            Err(e) => Err(from_wire_exec(&self.id, e)),
        }
    }
    fn exec(&self, req: &ExecRequest) -> Result<ExecOutput, ExecError> {
        self.exec_inner(req, None)
    }
    fn exec_streaming(
        &self,
        req: &ExecRequest,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<ExecOutput, ExecError> {
        let guard = self.guard().clone();
        let tenant = self.tenant.as_deref();
        let (out_at, err_at) = (
            format!("sandbox {} stdout", self.id),
            format!("sandbox {} stderr", self.id),
        );
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
        let streamed = rs.iter().any(|r| r.redacted());
        res.map(|mut o| {
            o.redacted |= streamed;
            o
        })
    }
    fn read_file(&self, path: &str) -> Result<Vec<u8>, FileError> {
        let (_, data) = self.file_call(
            FileAccess::Read,
            path,
            Call::ReadFile { path: path.into() },
            &[],
        )?;
        let at = format!("sandbox {} file {path}", self.id);
        Ok(self
            .guard()
            .redact(self.tenant.as_deref(), &at, &data)
            .unwrap_or(data))
    }
    fn write_file(&self, path: &str, data: &[u8]) -> Result<(), FileError> {
        self.file_call(
            FileAccess::Write,
            path,
            Call::WriteFile { path: path.into() },
            data,
        )
        .map(drop)
    }
    fn list(&self, path: &str) -> Result<Vec<DirEntry>, FileError> {
        match self.file_call(
            FileAccess::Read,
            path,
            Call::List { path: path.into() },
            &[],
        )? {
            (Answer::List(v), _) => Ok(v),
            (other, _) => Err(FileError::Op {
                path: path.into(),
                source: StepError::new("list", path, format!("guest answered {other:?}")),
            }),
        }
    }
    fn remove(&self, path: &str, recursive: bool) -> Result<(), FileError> {
        self.file_call(
            FileAccess::Delete,
            path,
            Call::Remove {
                path: path.into(),
                recursive,
            },
            &[],
        )
        .map(drop)
    }
    fn mkdir(&self, path: &str) -> Result<(), FileError> {
        self.file_call(
            FileAccess::Write,
            path,
            Call::Mkdir { path: path.into() },
            &[],
        )
        .map(drop)
    }
    fn upload_tar_with(
        &self,
        dir: &str,
        archive: &[u8],
        limits: &TarLimits,
    ) -> Result<TarSummary, FileError> {
        if !dir.starts_with('/') || dir.contains('\0') {
            return Err(FileError::BadPath(dir.to_string()));
        }
        let sum = crate::tarball::check(archive, limits).map_err(|source| FileError::Archive {
            path: dir.to_string(),
            source,
        })?;
        for p in &sum.paths {
            let full = Path::new(dir).join(p);
            if let CheckDecision::Block(r) = self.guard().check_file(
                self.tenant.as_deref(),
                FileAccess::Write,
                &full.to_string_lossy(),
            ) {
                return Err(FileError::Exec(ExecError::Blocked(r.join("; "))));
            }
        }
        self.file_call(
            FileAccess::Write,
            dir,
            Call::UploadTar {
                dir: dir.into(),
                limits: *limits,
            },
            archive,
        )?;
        Ok(sum)
    }
    fn download_tar_with(&self, dir: &str, limits: &TarLimits) -> Result<Vec<u8>, FileError> {
        let (_, archive) = self.file_call(
            FileAccess::Read,
            dir,
            Call::DownloadTar {
                dir: dir.into(),
                limits: *limits,
            },
            &[],
        )?;
        let tenant = self.tenant.as_deref();
        let guard = self.guard();
        let redacted = crate::tarball::redact_files(&archive, |p, data| {
            let at = format!(
                "sandbox {} file {}",
                self.id,
                Path::new(dir).join(p).display()
            );
            guard.redact(tenant, &at, data)
        })
        .map_err(|source| FileError::Archive {
            path: dir.to_string(),
            source,
        })?;
        Ok(redacted.unwrap_or(archive))
    }
    fn freeze(&self) -> Result<(), LifecycleError> {
        self.qmp()
            .call("stop", Value::Null)
            .map_err(self.vmm("freeze"))?;
        self.frozen.store(true, Ordering::Release);
        Ok(())
    }
    fn thaw(&self) -> Result<(), LifecycleError> {
        self.qmp()
            .call("cont", Value::Null)
            .map_err(self.vmm("thaw"))?;
        self.frozen.store(false, Ordering::Release);
        Ok(())
    }
    fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::Acquire)
    }
    fn end_commands(&self) {
        let _ = self.shared.send(&Msg::EndCommands, &[]);
    }
    fn signal_workload(&self, signal: nix::sys::signal::Signal) -> usize {
        // The guest's agent signals its sandbox's workload; how many it reached is not
        // reported back: 1 when the message went.
        usize::from(
            self.shared
                .send(
                    &Msg::SignalCommands {
                        signal: signal as i32,
                    },
                    &[],
                )
                .is_ok(),
        )
    }
    fn snapshot(&self, dir: &Path) -> Result<SnapshotParts, LifecycleError> {
        if self.frozen.load(Ordering::Acquire) {
            return Err(self.vmm("snapshot")(
                "the VM is frozen; thaw it first".into(),
            ));
        }
        // The agent idle and its channel empty, then the vCPUs stopped.
        let (tx, rx) = mpsc::channel();
        *self.shared.quiet.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        self.shared
            .send(&Msg::Quiesce, &[])
            .map_err(|e| self.vmm("snapshot")(e.to_string()))?;
        rx.recv_timeout(Duration::from_secs(60))
            .map_err(|_| self.vmm("snapshot")("the guest's agent did not quiesce".into()))?;
        let state = dir.join("vm.state");
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&state)
            .map_err(|e| LifecycleError::snapshot(&state, e))?;
        let mut q = self.qmp();
        let r = (|| -> Result<(), String> {
            q.call("stop", Value::Null)?;
            q.call_with_fd("getfd", json!({"fdname": "snap"}), f.as_raw_fd())?;
            q.call("migrate", json!({"uri": "fd:snap"}))?;
            let deadline = Instant::now() + Duration::from_secs(600);
            loop {
                let m = q.call("query-migrate", Value::Null)?;
                match m.get("status").and_then(Value::as_str).unwrap_or("") {
                    "completed" => return Ok(()),
                    "failed" | "cancelled" => {
                        return Err(format!(
                            "migration {}",
                            m.get("error-desc")
                                .and_then(Value::as_str)
                                .unwrap_or("failed")
                        ));
                    }
                    _ => {}
                }
                if Instant::now() > deadline {
                    let _ = q.call("migrate_cancel", Value::Null);
                    return Err("migration did not finish within 600 s".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })();
        // Running again, whatever happened.
        let resumed = q.call("cont", Value::Null);
        drop(q);
        r.map_err(self.vmm("snapshot"))?;
        resumed.map_err(self.vmm("snapshot: continuing"))?;
        f.sync_all()
            .map_err(|e| LifecycleError::snapshot(&state, e))?;
        // What it ran from, so the snapshot restores on its own (anywhere).
        for (b, name) in [
            (&self.machine.kernel, "vmlinuz"),
            (&self.machine.initrd, "initrd.img"),
            (&self.machine.disk, "root.ext4"),
        ] {
            link_or_copy(&b.path, &dir.join(name))
                .map_err(|e| LifecycleError::snapshot(&dir.join(name), e))?;
        }
        Ok(SnapshotParts {
            files: vec!["vm.state".into()],
            tier_data: json!({
                "machine": self.machine,
                "memory": "kept: guest memory and device state (QEMU migration to a file)",
                "guest_kernel": self.kernel,
            }),
        })
    }
    fn destroy(&self) -> Result<(), LifecycleError> {
        if self.destroyed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(mut c) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The reader sees the channel close and drops every waiting call.
        let _ = self
            .shared
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shutdown(std::net::Shutdown::Both);
        if let Some(cg) = &self.cgroup {
            cg.destroy()?;
        }
        let _ = fs::remove_file(&self.log);
        Ok(())
    }
    fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }
    fn stats(&self) -> Stats {
        let rss = fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            })
            .map(|k| k * 1024);
        Stats {
            memory_bytes: self.cgroup.as_ref().and_then(|c| c.memory_current()),
            host_rss_bytes: rss,
            processes: self.cgroup.as_ref().map(|c| c.procs().len() as u32),
        }
    }
}

impl Drop for VmSandbox {
    fn drop(&mut self) {
        let _ = Isolated::destroy(self);
    }
}
