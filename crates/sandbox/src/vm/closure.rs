//! The micro-VM tier's `host` template: the shell tools, coreutils and Python 3 of the
//! host, with the libraries they load, copied into a folder that becomes a disk image.

use crate::template::{TemplateError, io_err};
use sha2::{Digest, Sha256};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

// ------------------------------------------------------------------ host closure

/// The programs the micro-VM tier's `host` template carries: the shell tools,
/// coreutils and Python 3 that sandboxes of the namespace tier find in the host's
/// `/usr`. (A micro-VM cannot share the host's 6 GB `/usr`; it gets these, with the
/// libraries they load, as a disk image.)
pub const HOST_CLOSURE_PROGRAMS: &[&str] = &[
    "sh",
    "dash",
    "bash",
    "cat",
    "ls",
    "cp",
    "mv",
    "rm",
    "ln",
    "mkdir",
    "rmdir",
    "touch",
    "echo",
    "printf",
    "test",
    "[",
    "true",
    "false",
    "sleep",
    "kill",
    "env",
    "id",
    "uname",
    "head",
    "tail",
    "wc",
    "grep",
    "sed",
    "tr",
    "cut",
    "sort",
    "uniq",
    "stat",
    "dd",
    "readlink",
    "realpath",
    "basename",
    "dirname",
    "chmod",
    "find",
    "xargs",
    "setsid",
    "timeout",
    "nproc",
    "df",
    "du",
    "date",
    "tee",
    "mktemp",
    "sha256sum",
    "md5sum",
    "base64",
    "od",
    "seq",
    "expr",
    "ps",
    "python3",
];

/// Folders of Python's standard library left out of the host closure (tests, GUIs,
/// bytecode caches).
const PY_SKIP: &[&str] = &[
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "__pycache__",
    "unittest/test",
    "distutils/tests",
    "ctypes/test",
    "sqlite3/test",
];

/// Copies the host path `p` into `dest` at the same place, recreating every symlink on
/// the way (`/lib` -> `usr/lib`, `/usr/bin/sh` -> `dash`) and the file it ends at.
fn copy_host_path(p: &Path, dest: &Path, depth: usize) -> Result<(), TemplateError> {
    if depth > 40 {
        return Err(TemplateError::Unsupported(format!(
            "{}: too many symbolic links",
            p.display()
        )));
    }
    let mut at = PathBuf::from("/");
    let comps: Vec<_> = p.components().skip(1).collect();
    for (i, c) in comps.iter().enumerate() {
        at.push(c);
        let md = fs::symlink_metadata(&at).map_err(io_err("stat", &at))?;
        let here = dest.join(at.strip_prefix("/").expect("absolute"));
        if md.file_type().is_symlink() {
            let target = fs::read_link(&at).map_err(io_err("readlink", &at))?;
            if fs::symlink_metadata(&here).is_err() {
                if let Some(parent) = here.parent() {
                    fs::create_dir_all(parent).map_err(io_err("mkdir", parent))?;
                }
                std::os::unix::fs::symlink(&target, &here).map_err(io_err("symlink", &here))?;
            }
            let resolved = at.parent().expect("has a parent").join(&target);
            let rest: PathBuf = comps[i + 1..].iter().collect();
            let next = normalize(&resolved.join(rest));
            return copy_host_path(&next, dest, depth + 1);
        }
        if i + 1 == comps.len() {
            if md.is_file() && fs::symlink_metadata(&here).is_err() {
                if let Some(parent) = here.parent() {
                    fs::create_dir_all(parent).map_err(io_err("mkdir", parent))?;
                }
                fs::copy(&at, &here).map_err(io_err("copy", &at))?;
                fs::set_permissions(
                    &here,
                    fs::Permissions::from_mode(md.permissions().mode() & 0o777),
                )
                .map_err(io_err("chmod", &here))?;
            } else if md.is_dir() {
                fs::create_dir_all(&here).map_err(io_err("mkdir", &here))?;
            }
        }
    }
    Ok(())
}

/// `a/./b/../c` -> `a/c`, lexically.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

fn find_program(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

fn copy_with_libs(p: &Path, dest: &Path) -> Result<(), TemplateError> {
    copy_host_path(p, dest, 0)?;
    let libs = crate::vm::image::shared_libs(p).map_err(|e| TemplateError::Tool {
        tool: "ldd".into(),
        message: e.to_string(),
    })?;
    for l in libs {
        copy_host_path(&l, dest, 0)?;
    }
    Ok(())
}

/// Builds into `dest` (made) a root of the host's `programs` and every library they
/// load, with Python's standard library when `python3` is among them.
pub fn host_closure(dest: &Path, programs: &[&str]) -> Result<(), TemplateError> {
    fs::create_dir_all(dest).map_err(io_err("mkdir", dest))?;
    // A merged-/usr host's top-level links (`/bin -> usr/bin`): `/bin/sh` must resolve.
    for top in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let host = Path::new("/").join(top);
        let here = dest.join(top);
        if let Ok(target) = fs::read_link(&host)
            && fs::symlink_metadata(&here).is_err()
        {
            std::os::unix::fs::symlink(&target, &here).map_err(io_err("symlink", &here))?;
        }
    }
    for name in programs {
        let Some(p) = find_program(name) else {
            continue; // not installed here: the template has what the host has
        };
        copy_with_libs(&p, dest)?;
    }
    // Python: its standard library and the extension modules' libraries.
    if programs.contains(&"python3")
        && let Ok(real) = fs::canonicalize("/usr/bin/python3")
        && let Some(ver) = real.file_name().map(|n| n.to_string_lossy().into_owned())
    {
        let lib = Path::new("/usr/lib").join(&ver);
        let mut stack = vec![lib.clone()];
        while let Some(d) = stack.pop() {
            let rel = d
                .strip_prefix(&lib)
                .unwrap_or(Path::new(""))
                .to_string_lossy()
                .into_owned();
            if PY_SKIP
                .iter()
                .any(|s| rel == *s || rel.ends_with(&format!("/{s}")))
            {
                continue;
            }
            let Ok(rd) = fs::read_dir(&d) else { continue };
            for e in rd.flatten() {
                let p = e.path();
                let Ok(md) = fs::symlink_metadata(&p) else {
                    continue;
                };
                if md.is_dir() {
                    stack.push(p);
                } else if md.is_file() || md.file_type().is_symlink() {
                    if p.extension().is_some_and(|x| x == "so") {
                        copy_with_libs(&p, dest)?;
                    } else {
                        copy_host_path(&p, dest, 0)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The host closure of [`HOST_CLOSURE_PROGRAMS`] under `cache` (`host-<fingerprint>`),
/// built on first use; rebuilt when the host's programs change.
pub fn host_closure_cached(cache: &Path) -> Result<PathBuf, TemplateError> {
    let mut h = Sha256::new();
    // The layout's version: bump when `host_closure` changes what it makes.
    h.update(b"layout 2\n");
    for name in HOST_CLOSURE_PROGRAMS {
        if let Some(p) = find_program(name)
            && let Ok(real) = fs::canonicalize(&p)
            && let Ok(md) = fs::metadata(&real)
        {
            use std::os::unix::fs::MetadataExt;
            h.update(format!("{name} {} {} {}\n", real.display(), md.len(), md.mtime()).as_bytes());
        }
    }
    if let Ok(md) = fs::metadata("/var/lib/dpkg/status") {
        use std::os::unix::fs::MetadataExt;
        h.update(format!("dpkg {} {}\n", md.len(), md.mtime()).as_bytes());
    }
    let fp = crate::identity::hex(&h.finalize());
    let dir = cache.join(format!("host-{}", &fp[..16]));
    if dir.is_dir() {
        return Ok(dir);
    }
    let tmp = cache.join(format!(".host-tmp-{}", crate::registry::nonce()));
    let r = host_closure(&tmp, HOST_CLOSURE_PROGRAMS);
    if let Err(e) = r {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    match fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another process built it first.
        Err(_) if dir.is_dir() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(io_err("rename", &dir)(e))
        }
    }
}
