//! File operations: sealed folders, files, directories and tar archives.

use crate::error::{ExecError, FileError, StepError};
use crate::guard::{CheckDecision, FileAccess};
use crate::proto::{self, Job, JobKind, Reply, Request};
use crate::spec::DirEntry;
use crate::tarball::{TarLimits, TarSummary};
use nix::fcntl::OFlag;
use nix::unistd::pipe2;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::time::Duration;

use super::{Sandbox, recv_timeout};

impl Sandbox {
    /// Writes `file` (exactly `bytes` bytes, from what `produce` writes) into the
    /// sealed folder `dir` (one of the spec's [`SandboxSpec::sealed`], not sealed yet).
    /// The bytes go over a pipe straight into the sandbox's memory-backed folder:
    /// nothing is staged on a disk, and a stream that ends early (a failed `produce`)
    /// leaves no file behind. Not a tenant's operation: no guard, no redaction.
    ///
    /// [`SandboxSpec::sealed`]: crate::spec::SandboxSpec::sealed
    pub fn fill_sealed(
        &self,
        dir: &str,
        file: &str,
        bytes: u64,
        produce: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
    ) -> Result<(), FileError> {
        if !self.spec.sealed.iter().any(|p| p == dir) {
            return Err(FileError::Op {
                path: dir.into(),
                source: StepError::new("fill", dir, "not a sealed folder of this sandbox"),
            });
        }
        self.check_alive()?;
        let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| ExecError::Syscall {
            syscall: "pipe2",
            source: e.into(),
        })?;
        // A 1 MiB pipe: one decrypted chunk per write (the default 64 KiB costs a
        // context switch every 64 KiB). Best effort: the default works too.
        let _ = nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
        let ctrl = self.ctrl.lock().unwrap_or_else(|p| p.into_inner());
        let req = Request::Fill {
            path: dir.into(),
            file: file.into(),
            bytes,
        };
        proto::send(ctrl.as_fd(), &req, &[r.as_raw_fd()]).map_err(ExecError::Protocol)?;
        drop(r);
        let mut pipe = fs::File::from(w);
        let produced = produce(&mut pipe);
        // EOF for init: it answers once it has all (or knows it is short).
        drop(pipe);
        let reply = recv_timeout::<Reply>(&ctrl, Duration::from_secs(60))
            .map_err(|e| ExecError::Protocol(e.to_string()))?;
        let at = format!("{dir}/{file}");
        match (reply, produced) {
            (Reply::Done, Ok(())) => Ok(()),
            (Reply::Done, Err(e)) => Err(FileError::Op {
                path: at.clone(),
                source: StepError::new("fill", &at, e.to_string()),
            }),
            (Reply::Failed(source), Err(e)) if e.kind() != io::ErrorKind::BrokenPipe => {
                Err(FileError::Op {
                    path: at.clone(),
                    source: StepError::new("fill", &at, format!("{e} ({source})")),
                })
            }
            (Reply::Failed(source), _) => Err(FileError::Op { path: at, source }),
            (r, _) => Err(ExecError::Protocol(format!("unexpected reply {r:?}")).into()),
        }
    }

    /// Opens the sealed folder `dir` to the sandbox's commands, read-only from now on.
    pub fn seal(&self, dir: &str) -> Result<(), FileError> {
        self.check_alive()?;
        match self.request(&Request::Seal { path: dir.into() }, &[])? {
            Reply::Done => Ok(()),
            Reply::Failed(source) => Err(FileError::Op {
                path: dir.into(),
                source,
            }),
            r => Err(ExecError::Protocol(format!("unexpected reply {r:?}")).into()),
        }
    }

    fn file_job(
        &self,
        kind: JobKind,
        path: &str,
        input: Option<&[u8]>,
    ) -> Result<Vec<u8>, FileError> {
        if !path.starts_with('/') || path.contains('\0') {
            return Err(FileError::BadPath(path.to_string()));
        }
        self.check_alive()?;
        let op = match &kind {
            JobKind::ReadFile { .. }
            | JobKind::List { .. }
            | JobKind::Exec { .. }
            | JobKind::Pack { .. } => FileAccess::Read,
            JobKind::WriteFile { .. }
            | JobKind::Mkdir { .. }
            | JobKind::Unpack { .. }
            | JobKind::Restore { .. } => FileAccess::Write,
            JobKind::Remove { .. } => FileAccess::Delete,
        };
        if let CheckDecision::Block(r) = self.rt.guard.check_file(self.tenant(), op, path) {
            return Err(FileError::Exec(ExecError::Blocked(r.join("; "))));
        }
        self.platform_job(kind, path, input)
    }

    /// A file job of the platform's own (a snapshot's pack or restore), not a tenant's
    /// request: the guard's file policy is not asked (the job still runs under the
    /// sandbox's confinement, as its user), and nothing it returns is redacted (it goes
    /// back into a sandbox, never out to a caller). `path` must be absolute.
    pub(crate) fn platform_job(
        &self,
        kind: JobKind,
        path: &str,
        input: Option<&[u8]>,
    ) -> Result<Vec<u8>, FileError> {
        if !path.starts_with('/') || path.contains('\0') {
            return Err(FileError::BadPath(path.to_string()));
        }
        self.check_alive()?;
        let job = Job {
            kind,
            env: Vec::new(),
            cwd: "/".into(),
            check_exec: false,
        };
        match self.run_job(
            job,
            Some(input.unwrap_or(b"")),
            Some(Duration::from_secs(60)),
            1 << 30,
            None,
        ) {
            Ok(r) if r.status.success() => Ok(r.stdout),
            Ok(r) => Err(FileError::Op {
                path: path.into(),
                source: StepError::new("file", path, format!("helper ended with {:?}", r.status)),
            }),
            Err(ExecError::Start(e)) => Err(FileError::Op {
                path: path.into(),
                source: e,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads a whole file, redacted by the guard like any output leaving the sandbox.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>, FileError> {
        let data = self.file_job(JobKind::ReadFile { path: path.into() }, path, None)?;
        let at = format!("sandbox {} file {path}", self.id);
        Ok(self
            .rt
            .guard
            .redact(self.tenant(), &at, &data)
            .unwrap_or(data))
    }
    /// Writes a file (mode 0644), creating parent directories.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<(), FileError> {
        self.file_job(
            JobKind::WriteFile {
                path: path.into(),
                mode: 0o644,
            },
            path,
            Some(data),
        )
        .map(drop)
    }
    /// Lists a directory, sorted by name.
    pub fn list(&self, path: &str) -> Result<Vec<DirEntry>, FileError> {
        let out = self.file_job(JobKind::List { path: path.into() }, path, None)?;
        serde_json::from_slice(&out).map_err(|e| FileError::Op {
            path: path.into(),
            source: StepError::new("list", path, e.to_string()),
        })
    }
    /// Removes a file, or a directory (with its contents when `recursive`).
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), FileError> {
        self.file_job(
            JobKind::Remove {
                path: path.into(),
                recursive,
            },
            path,
            None,
        )
        .map(drop)
    }
    /// Creates a directory and its parents.
    pub fn mkdir(&self, path: &str) -> Result<(), FileError> {
        self.file_job(JobKind::Mkdir { path: path.into() }, path, None)
            .map(drop)
    }

    /// Unpacks a tar archive into `dir` inside the sandbox (made if missing), with
    /// [`TarLimits::default`]. See [`Sandbox::upload_tar_with`].
    pub fn upload_tar(&self, dir: &str, archive: &[u8]) -> Result<TarSummary, FileError> {
        self.upload_tar_with(dir, archive, &TarLimits::default())
    }

    /// Unpacks a tar archive into `dir` inside the sandbox (made if missing). The archive
    /// is hostile input: it is checked here first ([`crate::tarball::check`]: no absolute
    /// paths, no `..`, no links out of `dir`, no device nodes, within `limits`), the guard
    /// checks a write of `dir` and of every entry, and then the sandbox's own job unpacks
    /// it (with the `tar` crate, checking again) under the same confinement as any
    /// command. Nothing is unpacked unless the whole archive passes.
    pub fn upload_tar_with(
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
            let full = full.to_string_lossy();
            if let CheckDecision::Block(r) =
                self.rt
                    .guard
                    .check_file(self.tenant(), FileAccess::Write, &full)
            {
                return Err(FileError::Exec(ExecError::Blocked(r.join("; "))));
            }
        }
        self.file_job(
            JobKind::Unpack {
                path: dir.into(),
                limits: *limits,
            },
            dir,
            Some(archive),
        )?;
        Ok(sum)
    }

    /// Packs `dir` inside the sandbox (its contents; or a single file under its own
    /// name) into a tar archive, with [`TarLimits::default`].
    pub fn download_tar(&self, dir: &str) -> Result<Vec<u8>, FileError> {
        self.download_tar_with(dir, &TarLimits::default())
    }

    /// Packs `dir` inside the sandbox into a tar archive of at most
    /// `limits.max_archive_bytes`. The sandbox's own job makes it, so the archive is as
    /// hostile as anything else from inside: unpack it with [`crate::tarball::unpack`],
    /// which refuses links that leave the destination.
    pub fn download_tar_with(&self, dir: &str, limits: &TarLimits) -> Result<Vec<u8>, FileError> {
        let archive = self.file_job(
            JobKind::Pack {
                path: dir.into(),
                limits: *limits,
            },
            dir,
            None,
        )?;
        // Every file in it is output leaving the sandbox: redacted like any other.
        let tenant = self.tenant();
        let guard = &self.rt.guard;
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
}
