//! What a program about to be executed *is*, not what it is called: the per-`execve`
//! check (`execcheck.rs`) identifies the file by its device and inode and, for copies,
//! by its content, against a table of the programs in the sandbox's template (every
//! executable in its bin directories: the ones the guard has rules for —
//! [`tessera_guard::followed_program`]: `rm`, `dd`, `mkfs.*`, `shred`, shells,
//! interpreters, `busybox`, … — and the harmless ones, so a copy of `ls` named `rm` is
//! `ls`). The guard then judges the exec as that program ([`tessera_guard::exec_argv`]),
//! so `ln -s /bin/rm /tmp/r; /tmp/r -rf /` and `cp /bin/rm /tmp/del; /tmp/del -rf /` are
//! `rm -rf /`.
//!
//! Two halves:
//! * the **table** ([`ProgramTable`], supervisor side): built once per template root from
//!   the template's bin directories, resolving symlinks inside that root (never out of
//!   it), cached per root and rebuilt when a bin directory changes. Hashes are computed
//!   lazily, only for a size some executed file has (the prefilter), and cached.
//! * the **probe** ([`probe`], runner side, inside the sandbox): opens what the caller's
//!   path names through `/proc/<pid>/root` with `RESOLVE_IN_ROOT` (so an absolute
//!   symlink or `..` cannot leave the sandbox's root), `fstat`s it, and hashes it when
//!   the supervisor asks.
//!
//! Limits (see THREAT_MODEL.md): the file can be swapped between the check and the
//! kernel's exec (TOCTOU), as the argv can; a program that is not in the table (a
//! modified `rm`, a static build of one) is judged by its name, as before.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::spec::Template;

/// The file an `execve` would run, as the runner saw it inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

/// Directories of a template searched for programs, relative to its root.
const BIN_DIRS: &[&str] = &[
    "usr/local/sbin",
    "usr/local/bin",
    "usr/sbin",
    "usr/bin",
    "sbin",
    "bin",
];

/// Files larger than this are never hashed (no program in the table is this big).
pub const MAX_HASH_BYTES: u64 = 512 << 20;

/// What the table says about one executed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// It is this program (`names`: every name it has in the template's bin dirs).
    Known { program: String, names: Vec<String> },
    /// Its size is a known program's: the content hash decides.
    NeedHash,
    /// Not a program the guard follows (or not one of this template's).
    Unknown,
}

struct Entry {
    program: String,
    names: Vec<String>,
    /// Host path of the file, for hashing.
    path: PathBuf,
    id: FileId,
    hash: OnceLock<Option<[u8; 32]>>,
}

impl Entry {
    fn hash(&self) -> Option<[u8; 32]> {
        *self.hash.get_or_init(|| {
            let f = File::open(&self.path).ok()?;
            let md = f.metadata().ok()?;
            // Changed since the table was built: no longer this entry.
            (md.dev() == self.id.dev && md.ino() == self.id.ino && md.len() == self.id.size)
                .then(|| sha256(f, self.id.size))
                .flatten()
        })
    }
}

/// A directory's identity and last change, to notice a template that changed.
type Stamp = (u64, u64, i64, i64);

fn stamp(md: &std::fs::Metadata) -> Stamp {
    (md.dev(), md.ino(), md.mtime(), md.mtime_nsec())
}

/// The programs of one template root, by inode and by size.
pub struct ProgramTable {
    by_inode: BTreeMap<(u64, u64), Arc<Entry>>,
    by_size: BTreeMap<u64, Vec<Arc<Entry>>>,
    dirs: Vec<(PathBuf, Stamp)>,
}

impl std::fmt::Debug for ProgramTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgramTable")
            .field("programs", &self.by_inode.len())
            .finish()
    }
}

/// Opens `rel` under the directory `root`, resolving every symlink and `..` as if
/// `root` were `/` (so nothing resolves outside it).
fn open_in_root(root: &OwnedFd, rel: &str, flags: OFlag) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root, rel, how)
}

/// The host path an open descriptor names.
fn fd_path(fd: &OwnedFd) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()
}

impl ProgramTable {
    /// Reads the template at `root` (a host directory laid out as the sandbox's `/`):
    /// every executable regular file in its bin directories.
    pub fn build(root: &Path) -> ProgramTable {
        let mut t = ProgramTable {
            by_inode: BTreeMap::new(),
            by_size: BTreeMap::new(),
            dirs: Vec::new(),
        };
        let Ok(rootfd) = open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            return t;
        };
        // (dev, ino) -> (resolved host path, names, id)
        let mut found: BTreeMap<(u64, u64), (PathBuf, Vec<String>, FileId)> = BTreeMap::new();
        let mut seen_dirs = Vec::new();
        for d in BIN_DIRS {
            let Ok(dfd) = open_in_root(&rootfd, d, OFlag::O_PATH | OFlag::O_DIRECTORY) else {
                continue;
            };
            let Some(host_dir) = fd_path(&dfd) else {
                continue;
            };
            let Ok(md) = std::fs::metadata(&host_dir) else {
                continue;
            };
            let st = stamp(&md);
            t.dirs.push((host_dir.clone(), st));
            if seen_dirs.contains(&(st.0, st.1)) {
                continue; // /bin -> usr/bin
            }
            seen_dirs.push((st.0, st.1));
            let Ok(rd) = std::fs::read_dir(&host_dir) else {
                continue;
            };
            for e in rd.flatten() {
                let Ok(name) = e.file_name().into_string() else {
                    continue;
                };
                let Ok(fd) = open_in_root(&rootfd, &format!("{d}/{name}"), OFlag::O_PATH) else {
                    continue; // dangling inside the template
                };
                let Ok(md) = nix::sys::stat::fstat(&fd) else {
                    continue;
                };
                if md.st_mode & libc::S_IFMT != libc::S_IFREG
                    || md.st_mode & 0o111 == 0
                    || md.st_size as u64 > MAX_HASH_BYTES
                {
                    continue;
                }
                let Some(path) = fd_path(&fd) else { continue };
                let id = FileId {
                    dev: md.st_dev,
                    ino: md.st_ino,
                    size: md.st_size as u64,
                };
                let slot = found
                    .entry((id.dev, id.ino))
                    .or_insert_with(|| (path, Vec::new(), id));
                if !slot.1.contains(&name) {
                    slot.1.push(name);
                }
            }
        }
        for (key, (path, mut names, id)) in found {
            names.sort();
            // The file's own name (`sh` is `dash`, `python3` is `python3.12`), unless
            // the guard follows only one of its other names (a file called `x` in
            // some template whose link is `rm`).
            let own = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string();
            let followed = |n: &str| tessera_guard::followed_program(n);
            let program = if followed(&own) || !names.iter().any(|n| followed(n)) {
                if own.is_empty() {
                    names[0].clone()
                } else {
                    own
                }
            } else {
                names
                    .iter()
                    .find(|n| followed(n))
                    .cloned()
                    .unwrap_or_default()
            };
            let e = Arc::new(Entry {
                program,
                names,
                path,
                id,
                hash: OnceLock::new(),
            });
            t.by_size.entry(id.size).or_default().push(e.clone());
            t.by_inode.insert(key, e);
        }
        t
    }

    /// Whether the bin directories are still the ones the table was built from.
    fn fresh(&self) -> bool {
        self.dirs
            .iter()
            .all(|(p, st)| std::fs::metadata(p).is_ok_and(|md| stamp(&md) == *st))
    }

    /// How many programs the table holds.
    pub fn len(&self) -> usize {
        self.by_inode.len()
    }

    /// Whether the table holds no program.
    pub fn is_empty(&self) -> bool {
        self.by_inode.is_empty()
    }

    /// Identifies the file `id` (with its content hash, when the caller has it).
    pub fn identify(&self, id: &FileId, hash: Option<&[u8; 32]>) -> Identity {
        let known = |e: &Entry| Identity::Known {
            program: e.program.clone(),
            names: e.names.clone(),
        };
        if let Some(e) = self.by_inode.get(&(id.dev, id.ino))
            && e.id.size == id.size
        {
            return known(e);
        }
        let Some(same_size) = self.by_size.get(&id.size) else {
            return Identity::Unknown;
        };
        let Some(h) = hash else {
            return Identity::NeedHash;
        };
        same_size
            .iter()
            .find(|e| e.hash().as_ref() == Some(h))
            .map(|e| known(e))
            .unwrap_or(Identity::Unknown)
    }
}

/// The host directory a template's root is.
pub fn template_root(t: &Template) -> PathBuf {
    match t {
        Template::Host => PathBuf::from("/"),
        Template::Dir(p) => p.clone(),
    }
}

/// The table of the template at `root`, built on first use and rebuilt when its bin
/// directories change.
pub fn table_for(root: &Path) -> Arc<ProgramTable> {
    static CACHE: OnceLock<Mutex<BTreeMap<PathBuf, Arc<ProgramTable>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(BTreeMap::new()));
    if let Some(t) = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(root)
        .filter(|t| t.fresh())
    {
        return t.clone();
    }
    // Built outside the lock: reading a template takes milliseconds.
    let t = Arc::new(ProgramTable::build(root));
    let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
    if c.len() > 256 {
        c.clear();
    }
    c.insert(root.to_path_buf(), t.clone());
    t
}

/// SHA-256 of the first `size` bytes of `f` (its whole content); `None` when it cannot
/// be read or is larger than [`MAX_HASH_BYTES`].
pub fn sha256(mut f: File, size: u64) -> Option<[u8; 32]> {
    if size > MAX_HASH_BYTES {
        return None;
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
    let mut left = size;
    while left > 0 {
        let n = f.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        let n = n.min(left as usize);
        h.update(&buf[..n]);
        left -= n as u64;
    }
    Some(h.finalize().into())
}

/// Lower-case hex of `b` (a hash's wire form between runner and supervisor, digests
/// in the registry, TPM structures in attestation).
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

/// Parses [`hex`]'s output.
pub fn unhex(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        let d = |c: u8| (c as char).to_digit(16);
        *o = (d(b[2 * i])? * 16 + d(b[2 * i + 1])?) as u8;
    }
    Some(out)
}

// ------------------------------------------------------------------ runner side

/// How the caller named the file to execute.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExecTarget<'a> {
    pub pid: u32,
    pub path: &'a str,
    /// `execveat`'s directory descriptor (`None`: `execve`, or `AT_FDCWD`).
    pub dirfd: Option<i32>,
    /// `execveat` with `AT_EMPTY_PATH`: the descriptor itself is the file.
    pub empty_path: bool,
}

/// Opens (`O_PATH`) the file the caller `pid` would execute, resolved inside its root,
/// and identifies it.
///
/// `Ok(None)`: there is nothing to run there (no such file, a path through a
/// non-folder, not a regular file): the exec fails on its own. `Err`: something may be
/// there that the probe could not open; the caller must refuse the exec rather than
/// judge it by its name (a file named `r` that is `rm`). Run it with the caller's
/// filesystem ids ([`as_fs_ids_of`]) so that the kernel follows the symlinks on the way
/// as it does for the caller.
pub(crate) fn probe(t: &ExecTarget<'_>) -> Result<Option<(FileId, OwnedFd)>, Errno> {
    let pid = t.pid;
    let opened = if t.empty_path || t.path.is_empty() {
        // fexecve / execveat(fd, "", AT_EMPTY_PATH): the caller's descriptor.
        let d = t.dirfd.ok_or(Errno::EBADF)?;
        open(
            format!("/proc/{pid}/fd/{d}").as_str(),
            OFlag::O_PATH | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    } else {
        let path = caller_path(t).ok_or(Errno::EACCES)?;
        if let Some(fdpath) = proc_fd_path(&path, pid) {
            // `/proc/<pid>/fd/N` and `/dev/fd/N`: the caller's open file (a memfd, a
            // deleted file), reached through the magic link on purpose.
            open(
                fdpath.as_str(),
                OFlag::O_PATH | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
        } else {
            let root = open(
                format!("/proc/{pid}/root").as_str(),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            open_in_root(&root, &path, OFlag::O_PATH)
        }
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(None),
        Err(e) => return Err(e),
    };
    let md = nix::sys::stat::fstat(&fd)?;
    if md.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(None);
    }
    Ok(Some((
        FileId {
            dev: md.st_dev,
            ino: md.st_ino,
            size: md.st_size as u64,
        },
        fd,
    )))
}

/// Runs `f` with this thread's filesystem uid and gid set to those of process `pid`
/// (its `Uid:` and `Gid:` lines' fourth fields), then restores them. Path walks and
/// permission checks in `f` are then the caller's: in particular
/// `fs.protected_symlinks` (on in most distributions, and in the micro-VM's guest),
/// which lets only a symlink's owner follow it in a sticky world-writable folder such
/// as `/tmp`, refuses the probe what it allows the caller, and the reverse. `Err` when
/// the ids cannot be read or taken: the caller refuses the exec.
pub(crate) fn as_fs_ids_of<T>(pid: u32, f: impl FnOnce() -> T) -> Result<T, Errno> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| Errno::ESRCH)?;
    let field = |name: &str| -> Option<u32> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(4)?.parse().ok()
    };
    let (uid, gid) = match (field("Uid:"), field("Gid:")) {
        (Some(u), Some(g)) => (u, g),
        _ => return Err(Errno::EACCES),
    };
    // SAFETY: setfsuid/setfsgid change only this thread's filesystem ids; calling one
    // with -1 (never a valid id) changes nothing and returns the current value.
    let (old_uid, old_gid) = unsafe {
        (
            libc::setfsuid(u32::MAX) as u32,
            libc::setfsgid(u32::MAX) as u32,
        )
    };
    // SAFETY: as above; the result is checked by reading the ids back.
    let taken = unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        libc::setfsuid(u32::MAX) as u32 == uid && libc::setfsgid(u32::MAX) as u32 == gid
    };
    let out = taken.then(f);
    // SAFETY: as above: back to the ids this thread had.
    unsafe {
        libc::setfsuid(old_uid);
        libc::setfsgid(old_gid);
    }
    out.ok_or(Errno::EPERM)
}

/// The absolute path (inside the caller's root) the caller's `path` names, with
/// `/proc/self` and `/dev/fd` spelled as the caller's.
fn caller_path(t: &ExecTarget<'_>) -> Option<String> {
    let pid = t.pid;
    let p = t.path;
    let p = if let Some(r) = p.strip_prefix("/proc/self/") {
        format!("/proc/{pid}/{r}")
    } else if let Some(r) = p.strip_prefix("/proc/thread-self/") {
        format!("/proc/{pid}/{r}")
    } else if let Some(r) = p.strip_prefix("/dev/fd/") {
        format!("/proc/{pid}/fd/{r}")
    } else {
        p.to_string()
    };
    if p.starts_with('/') {
        return Some(p);
    }
    let base = match t.dirfd {
        Some(d) => std::fs::read_link(format!("/proc/{pid}/fd/{d}")).ok()?,
        None => std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?,
    };
    let base = base.to_str()?;
    Some(format!("{}/{p}", base.trim_end_matches('/')))
}

/// `/proc/<pid>/fd/N` (or `/proc/<pid>/exe`) when `path` is one: a magic link the
/// probe follows deliberately, for the caller only.
fn proc_fd_path(path: &str, pid: u32) -> Option<String> {
    let rest = path.strip_prefix(&format!("/proc/{pid}/"))?;
    let ok = rest == "exe"
        || rest
            .strip_prefix("fd/")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    ok.then(|| format!("/proc/{pid}/{rest}"))
}

/// The content hash of a probed file (reopened for reading through its `O_PATH`
/// descriptor).
pub(crate) fn hash_probed(fd: &OwnedFd, size: u64) -> Option<[u8; 32]> {
    let f = File::open(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    sha256(f, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let h = [7u8; 32];
        assert_eq!(unhex(&hex(&h)), Some(h));
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex(&"g".repeat(64)), None);
    }

    #[test]
    fn table_follows_links_inside_the_root_and_copies_by_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/bin")).expect("mkdir");
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).expect("symlink");
        std::fs::write(root.join("usr/bin/rm"), b"pretend rm binary").expect("write");
        std::fs::write(root.join("usr/bin/dash"), b"pretend dash binary").expect("write");
        // An absolute link: resolved inside the template, not on the host.
        std::os::unix::fs::symlink("/usr/bin/dash", root.join("usr/bin/sh")).expect("symlink");
        std::fs::write(root.join("usr/bin/ls"), b"pretend ls binary").expect("write");
        std::fs::write(root.join("usr/bin/notes"), b"not a program").expect("write");
        for p in ["rm", "dash", "ls"] {
            std::fs::set_permissions(
                root.join("usr/bin").join(p),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .expect("chmod");
        }
        let t = ProgramTable::build(root);
        assert_eq!(
            t.len(),
            3,
            "rm, dash (sh is dash) and ls; notes is not executable"
        );
        let id_of = |p: &Path| {
            let md = std::fs::metadata(p).expect("stat");
            FileId {
                dev: md.dev(),
                ino: md.ino(),
                size: md.len(),
            }
        };
        assert_eq!(
            t.identify(&id_of(&root.join("usr/bin/dash")), None),
            Identity::Known {
                program: "dash".into(),
                names: vec!["dash".into(), "sh".into()]
            }
        );
        // On the host, the template's absolute link leads out of it; the table did not
        // follow it there.
        if let Ok(host) = std::fs::canonicalize(root.join("usr/bin/sh")) {
            assert!(!host.starts_with(root));
            assert!(!matches!(
                t.identify(&id_of(&host), None),
                Identity::Known { .. }
            ));
        }
        // A copy: same size, another inode; the hash decides.
        let copy = root.join("copy");
        std::fs::write(&copy, b"pretend rm binary").expect("write");
        let md = std::fs::metadata(&copy).expect("stat");
        let id = FileId {
            dev: md.dev(),
            ino: md.ino(),
            size: md.len(),
        };
        assert_eq!(t.identify(&id, None), Identity::NeedHash);
        let h = sha256(File::open(&copy).expect("open"), id.size).expect("hash");
        assert!(
            matches!(t.identify(&id, Some(&h)), Identity::Known { program, .. } if program == "rm")
        );
        // Same size, other content: not rm.
        std::fs::write(&copy, b"pretend xx binary").expect("write");
        let h = sha256(File::open(&copy).expect("open"), id.size).expect("hash");
        assert_eq!(t.identify(&id, Some(&h)), Identity::Unknown);
        // Another size: unknown without hashing.
        let other = FileId { size: 3, ..id };
        assert_eq!(t.identify(&other, None), Identity::Unknown);
        // The cache notices a changed bin directory.
        let a = table_for(root);
        assert!(Arc::ptr_eq(&a, &table_for(root)));
        let shred = root.join("usr/bin/shred");
        std::fs::write(&shred, b"pretend shred").expect("write");
        std::fs::set_permissions(&shred, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let b = table_for(root);
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(b.len(), 4);
    }
}
