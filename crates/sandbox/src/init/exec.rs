//! What the confined job process runs: the command (`execve`, after the seccomp filter
//! and the execve listener) or a file operation.

use crate::error::StepError;
use crate::proto::{self, Job, JobKind};
use crate::spec::{DirEntry, FileKind};
use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::{State, se};

fn cstr(s: &str, what: &str) -> Result<CString, StepError> {
    CString::new(s).map_err(|_| StepError::new("argument", what, "contains NUL"))
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

pub(super) fn run_job(
    st: &mut State,
    job: &Job,
    give_listener: Option<OwnedFd>,
) -> Result<(), StepError> {
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
