//! Tar archives into and out of sandboxes. Every archive is hostile input: one made by a
//! client (upload) and, above all, one made inside a sandbox (download, unpacked on the
//! host by `tessera sandbox cp -r`).
//!
//! [`check`] refuses, naming the entry: absolute paths, `..`, paths that go through a
//! symbolic link made earlier in the same archive, symbolic links whose target is
//! absolute or climbs above the root, hard links to anything but a regular file made
//! earlier in the same archive, device nodes, fifos and sparse or unknown entry types,
//! and archives over [`TarLimits`] (archive bytes, unpacked bytes, entries).
//! [`unpack`] checks first and unpacks nothing unless the whole archive passes; then it
//! unpacks with the `tar` crate's own guards too (each entry's parent must canonicalize
//! inside the destination), without owners, set-uid bits or extended attributes.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use thiserror::Error;

/// Bounds on one archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TarLimits {
    /// Size of the archive itself.
    pub max_archive_bytes: u64,
    /// Sum of the sizes of the files in it.
    pub max_unpacked_bytes: u64,
    /// Number of entries.
    pub max_entries: u64,
}

impl Default for TarLimits {
    fn default() -> Self {
        TarLimits {
            max_archive_bytes: 256 << 20,
            max_unpacked_bytes: 1 << 30,
            max_entries: 100_000,
        }
    }
}

/// Why an archive was refused, or packing or unpacking failed.
#[derive(Debug, Error, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TarError {
    #[error("the archive's {what} exceeds the limit of {limit}; send a smaller archive")]
    TooLarge { what: String, limit: u64 },
    #[error("entry {entry:?} has an absolute path; archive paths must be relative")]
    Absolute { entry: String },
    #[error("entry {entry:?} contains `..`; archive paths must stay inside the destination")]
    ParentDir { entry: String },
    #[error("entry {entry:?} goes through the symbolic link {link:?} made earlier in the archive")]
    ThroughLink { entry: String, link: String },
    #[error(
        "symbolic link {entry:?} -> {target:?} points outside the destination (absolute, `..` above it, or a loop)"
    )]
    SymlinkEscapes { entry: String, target: String },
    #[error(
        "hard link {entry:?} -> {target:?}: the target must be a regular file earlier in the same archive"
    )]
    HardlinkTarget { entry: String, target: String },
    #[error("entry {entry:?} is a {kind}, which is not allowed (files, folders and links only)")]
    Special { entry: String, kind: String },
    #[error("malformed archive: {0}")]
    Malformed(String),
    #[error("{op} {path}: {message}")]
    Io {
        op: String,
        path: String,
        message: String,
    },
}

fn malformed(e: io::Error) -> TarError {
    TarError::Malformed(e.to_string())
}

fn io_err(op: &str, path: &Path) -> impl FnOnce(io::Error) -> TarError {
    let (op, path) = (op.to_string(), path.display().to_string());
    move |e| {
        // The tar crate wraps the cause ("failed to unpack X") around the OS error.
        let mut message = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            message = format!("{message}: {c}");
            cause = c.source();
        }
        TarError::Io { op, path, message }
    }
}

/// The path of an entry, normalized (no `.`), relative, or why it is refused.
fn clean(raw: &Path) -> Result<PathBuf, TarError> {
    let entry = || raw.to_string_lossy().into_owned();
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(TarError::ParentDir { entry: entry() }),
            Component::RootDir | Component::Prefix(_) => {
                return Err(TarError::Absolute { entry: entry() });
            }
        }
    }
    Ok(out)
}

/// Does the symbolic link at `entry` (relative to the root) with `target` stay inside the
/// root, resolving lexically? Every intermediate step must stay inside too.
fn symlink_stays_inside(entry: &Path, target: &Path) -> bool {
    let mut depth = entry.components().count().saturating_sub(1) as i64;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    !target.as_os_str().is_empty()
}

/// Resolves the symbolic link `entry` as the kernel would in a tree where the archive's
/// `links` are the only symbolic links, following them (at most 40 hops, like Linux),
/// and says whether resolution stays inside the root at every step.
fn resolves_inside(links: &std::collections::BTreeMap<PathBuf, PathBuf>, entry: &Path) -> bool {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    let Some(target) = links.get(entry) else {
        return true;
    };
    let mut cur: Vec<OsString> = entry
        .parent()
        .map(|p| p.iter().map(OsString::from).collect())
        .unwrap_or_default();
    let mut pending: VecDeque<Component<'_>> = target.components().collect();
    let mut hops = 0;
    while let Some(c) = pending.pop_front() {
        match c {
            Component::Normal(n) => {
                cur.push(n.to_os_string());
                let here: PathBuf = cur.iter().collect();
                if let Some(t) = links.get(&here) {
                    hops += 1;
                    if hops > 40 {
                        return false;
                    }
                    cur.pop();
                    for c in t.components().rev() {
                        pending.push_front(c);
                    }
                }
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if cur.pop().is_none() {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// What [`check`] found in an archive that passed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TarSummary {
    pub entries: u64,
    pub files: u64,
    pub dirs: u64,
    pub links: u64,
    /// Sum of the sizes of the files.
    pub bytes: u64,
    /// Every entry's normalized path (relative to the destination).
    pub paths: Vec<PathBuf>,
}

/// Checks a whole archive against the rules in the module documentation; reads no data
/// beyond the headers.
pub fn check(archive: &[u8], limits: &TarLimits) -> Result<TarSummary, TarError> {
    if archive.len() as u64 > limits.max_archive_bytes {
        return Err(TarError::TooLarge {
            what: format!("size ({} bytes)", archive.len()),
            limit: limits.max_archive_bytes,
        });
    }
    let mut ar = tar::Archive::new(archive);
    let mut sum = TarSummary::default();
    let mut symlinks: Vec<PathBuf> = Vec::new();
    let mut targets = std::collections::BTreeMap::new();
    let mut files: BTreeSet<PathBuf> = BTreeSet::new();
    for e in ar.entries().map_err(malformed)? {
        let e = e.map_err(malformed)?;
        sum.entries += 1;
        if sum.entries > limits.max_entries {
            return Err(TarError::TooLarge {
                what: "number of entries".into(),
                limit: limits.max_entries,
            });
        }
        let raw = e.path().map_err(malformed)?.into_owned();
        let name = || raw.to_string_lossy().into_owned();
        let path = clean(&raw)?;
        if let Some(l) = symlinks.iter().find(|l| path.starts_with(l)) {
            return Err(TarError::ThroughLink {
                entry: name(),
                link: l.to_string_lossy().into_owned(),
            });
        }
        let kind = e.header().entry_type();
        use tar::EntryType as T;
        match kind {
            T::Regular | T::Continuous => {
                sum.files += 1;
                sum.bytes = sum.bytes.saturating_add(e.size());
                if sum.bytes > limits.max_unpacked_bytes {
                    return Err(TarError::TooLarge {
                        what: "unpacked size".into(),
                        limit: limits.max_unpacked_bytes,
                    });
                }
                files.insert(path.clone());
            }
            T::Directory => sum.dirs += 1,
            T::Symlink => {
                let target = e
                    .link_name()
                    .map_err(malformed)?
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if path.as_os_str().is_empty() || !symlink_stays_inside(&path, &target) {
                    return Err(TarError::SymlinkEscapes {
                        entry: name(),
                        target: target.to_string_lossy().into_owned(),
                    });
                }
                sum.links += 1;
                symlinks.push(path.clone());
                targets.insert(path.clone(), target);
                files.remove(&path);
            }
            T::Link => {
                let target = e
                    .link_name()
                    .map_err(malformed)?
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let bad = || TarError::HardlinkTarget {
                    entry: name(),
                    target: target.to_string_lossy().into_owned(),
                };
                let t = clean(&target).map_err(|_| bad())?;
                if !files.contains(&t) || path.as_os_str().is_empty() {
                    return Err(bad());
                }
                sum.links += 1;
                files.insert(path.clone());
            }
            other => {
                let kind = match other {
                    T::Char => "character device",
                    T::Block => "block device",
                    T::Fifo => "fifo",
                    T::GNUSparse => "sparse file",
                    _ => "entry of an unknown type",
                };
                return Err(TarError::Special {
                    entry: name(),
                    kind: kind.into(),
                });
            }
        }
        sum.paths.push(path);
    }
    // A link's target may go through another link of the archive (`b -> ..`, then
    // `x -> a/b/..`): resolve each through all of them.
    for l in &symlinks {
        if !resolves_inside(&targets, l) {
            return Err(TarError::SymlinkEscapes {
                entry: l.to_string_lossy().into_owned(),
                target: targets[l].to_string_lossy().into_owned(),
            });
        }
    }
    Ok(sum)
}

/// Checks `archive` and, if it passes, unpacks it into `dst` (made if missing). Owners,
/// set-uid/set-gid bits and extended attributes are not restored; modification times are.
pub fn unpack(archive: &[u8], dst: &Path, limits: &TarLimits) -> Result<TarSummary, TarError> {
    let sum = check(archive, limits)?;
    fs::create_dir_all(dst).map_err(io_err("mkdir", dst))?;
    let mut ar = tar::Archive::new(archive);
    ar.set_preserve_permissions(false);
    ar.set_preserve_ownerships(false);
    ar.set_unpack_xattrs(false);
    ar.set_overwrite(true);
    for e in ar.entries().map_err(malformed)? {
        let mut e = e.map_err(malformed)?;
        let raw = e.path().map_err(malformed)?.into_owned();
        if clean(&raw)?.as_os_str().is_empty() {
            continue; // the root itself (`./`)
        }
        // Refuses (Ok(false)) or fails on anything that would land outside `dst`.
        match e.unpack_in(dst) {
            Ok(true) => {}
            Ok(false) => {
                return Err(TarError::ParentDir {
                    entry: raw.to_string_lossy().into_owned(),
                });
            }
            Err(err) => return Err(io_err("unpack", &dst.join(&raw))(err)),
        }
    }
    Ok(sum)
}

/// Unpacks a snapshot's layer (made by [`pack`] of the same sandbox's own folder) into
/// `dst`, keeping what a snapshot must bring back unchanged: symbolic links as they were
/// (absolute targets included: they resolve inside the sandbox that reads them),
/// permission bits and modification times. Unlike [`unpack`] it does not refuse links
/// out of `dst`, so it runs only inside a sandbox, under the same confinement as any
/// command (as the sandbox's user, under Landlock): the archive can do there no more
/// than the sandbox's own code could. Nothing is written outside `dst` (the `tar`
/// crate refuses entries that climb out or go through a link), owners and set-uid
/// bits are not restored, and an archive over `max_bytes` is refused.
pub fn unpack_snapshot(archive: &[u8], dst: &Path, max_bytes: u64) -> Result<u64, TarError> {
    if archive.len() as u64 > max_bytes {
        return Err(TarError::TooLarge {
            what: format!("size ({} bytes)", archive.len()),
            limit: max_bytes,
        });
    }
    fs::create_dir_all(dst).map_err(io_err("mkdir", dst))?;
    let mut ar = tar::Archive::new(archive);
    ar.set_preserve_permissions(true);
    ar.set_preserve_mtime(true);
    ar.set_preserve_ownerships(false);
    ar.set_unpack_xattrs(false);
    ar.set_overwrite(true);
    let mut n = 0;
    // Directories' times and modes are set after their contents (a read-only folder
    // must still be filled).
    let mut dirs = Vec::new();
    for e in ar.entries().map_err(malformed)? {
        let mut e = e.map_err(malformed)?;
        let raw = e.path().map_err(malformed)?.into_owned();
        let path = clean(&raw)?;
        if path.as_os_str().is_empty() {
            continue;
        }
        if e.header().entry_type() == tar::EntryType::Directory {
            let full = dst.join(&path);
            fs::create_dir_all(&full).map_err(io_err("mkdir", &full))?;
            dirs.push((
                full,
                e.header().mode().unwrap_or(0o755) & 0o1777,
                e.header().mtime().unwrap_or(0),
            ));
            n += 1;
            continue;
        }
        match e.unpack_in(dst) {
            Ok(true) => n += 1,
            Ok(false) => {
                return Err(TarError::ParentDir {
                    entry: raw.to_string_lossy().into_owned(),
                });
            }
            Err(err) => return Err(io_err("unpack", &dst.join(&raw))(err)),
        }
    }
    for (d, mode, mtime) in dirs.into_iter().rev() {
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions(&d, fs::Permissions::from_mode(mode));
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
        if let Ok(f) = fs::File::open(&d) {
            let _ = f.set_modified(t);
        }
    }
    Ok(n)
}

/// A writer that fails once more than `limit` bytes went through it.
struct Capped<W> {
    inner: W,
    written: u64,
    limit: u64,
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written + buf.len() as u64 > self.limit {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, "archive limit"));
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Packs `src` (a folder: its contents; a file: that file under its own name) into a tar
/// archive written to `out`. Symbolic links are stored as links, never followed; sockets,
/// fifos and devices are left out. Entries are in sorted order. Fails once the archive
/// would exceed `limits.max_archive_bytes`.
pub fn pack<W: Write>(src: &Path, out: W, limits: &TarLimits) -> Result<(), TarError> {
    let md = fs::symlink_metadata(src).map_err(io_err("stat", src))?;
    let mut b = tar::Builder::new(Capped {
        inner: out,
        written: 0,
        limit: limits.max_archive_bytes,
    });
    b.follow_symlinks(false);
    let too_large = |e: io::Error, path: &Path| {
        if e.kind() == io::ErrorKind::FileTooLarge {
            TarError::TooLarge {
                what: "size".into(),
                limit: limits.max_archive_bytes,
            }
        } else {
            io_err("pack", path)(e)
        }
    };
    if md.is_dir() {
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let dir = src.join(&rel);
            let mut names: Vec<_> = fs::read_dir(&dir)
                .map_err(io_err("read_dir", &dir))?
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .collect();
            names.sort();
            let mut subdirs = Vec::new();
            for n in names {
                let r = rel.join(&n);
                let full = src.join(&r);
                let Ok(m) = fs::symlink_metadata(&full) else {
                    continue; // gone meanwhile
                };
                let t = m.file_type();
                if !(t.is_dir() || t.is_file() || t.is_symlink()) {
                    continue;
                }
                b.append_path_with_name(&full, &r)
                    .map_err(|e| too_large(e, &full))?;
                if t.is_dir() {
                    subdirs.push(r);
                }
            }
            // Depth first, in name order.
            stack.extend(subdirs.into_iter().rev());
        }
    } else {
        let name = src.file_name().ok_or_else(|| TarError::Io {
            op: "pack".into(),
            path: src.display().to_string(),
            message: "has no file name".into(),
        })?;
        b.append_path_with_name(src, name)
            .map_err(|e| too_large(e, src))?;
    }
    b.into_inner()
        .map_err(|e| too_large(e, src))?
        .flush()
        .map_err(io_err("write", src))?;
    Ok(())
}

/// Reads at most `limit` bytes (plus one, to tell that there was more) from `r`.
/// The archive with each regular file's contents passed through `redact` (which gets
/// the entry's path and contents and returns the new contents, or `None` to keep
/// them); headers are rewritten for the new sizes, everything else kept as it was.
/// Returns the archive unchanged (`None`) when nothing was redacted.
pub fn redact_files(
    archive: &[u8],
    mut redact: impl FnMut(&str, &[u8]) -> Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, TarError> {
    let mut changed = false;
    let mut out = tar::Builder::new(Vec::with_capacity(archive.len()));
    let mut ar = tar::Archive::new(archive);
    for e in ar.entries().map_err(malformed)? {
        let mut e = e.map_err(malformed)?;
        let mut header = e.header().clone();
        let path = e.path().map_err(malformed)?.to_string_lossy().into_owned();
        let mut data = Vec::new();
        e.read_to_end(&mut data).map_err(malformed)?;
        if header.entry_type().is_file()
            && let Some(new) = redact(&path, &data)
        {
            data = new;
            header.set_size(data.len() as u64);
            header.set_cksum();
            changed = true;
        }
        out.append(&header, data.as_slice()).map_err(malformed)?;
    }
    if !changed {
        return Ok(None);
    }
    out.into_inner().map(Some).map_err(malformed)
}

pub fn read_capped(r: impl Read, limit: u64) -> Result<Vec<u8>, TarError> {
    let mut v = Vec::new();
    r.take(limit.saturating_add(1))
        .read_to_end(&mut v)
        .map_err(|e| TarError::Malformed(e.to_string()))?;
    if v.len() as u64 > limit {
        return Err(TarError::TooLarge {
            what: format!("size (over {limit} bytes)"),
            limit,
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds an archive from raw headers so that hostile names can be written (the
    /// `tar` crate's own setters refuse `..` and absolute paths).
    pub(crate) fn raw_entry(
        b: &mut tar::Builder<Vec<u8>>,
        kind: tar::EntryType,
        path: &str,
        link: &str,
        data: &[u8],
    ) {
        let mut h = tar::Header::new_gnu();
        {
            let name = &mut h.as_old_mut().name;
            name.fill(0);
            name[..path.len()].copy_from_slice(path.as_bytes());
        }
        if !link.is_empty() {
            let l = &mut h.as_old_mut().linkname;
            l.fill(0);
            l[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn archive(entries: &[(tar::EntryType, &str, &str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (k, p, l, d) in entries {
            raw_entry(&mut b, *k, p, l, d);
        }
        b.into_inner().unwrap()
    }

    use tar::EntryType as T;

    #[test]
    fn a_plain_archive_passes_and_round_trips() {
        let a = archive(&[
            (T::Directory, "./", "", b""),
            (T::Directory, "src/", "", b""),
            (T::Regular, "src/main.rs", "", b"fn main() {}\n"),
            (T::Symlink, "src/lib.rs", "main.rs", b""),
            (T::Symlink, "up", "src/../src", b""),
            (T::Link, "copy.rs", "src/main.rs", b""),
        ]);
        let s = check(&a, &TarLimits::default()).unwrap();
        assert_eq!((s.files, s.dirs, s.links, s.bytes), (1, 2, 3, 13));
        let d = tempfile::tempdir().unwrap();
        unpack(&a, d.path(), &TarLimits::default()).unwrap();
        assert_eq!(
            fs::read(d.path().join("src/lib.rs")).unwrap(),
            b"fn main() {}\n"
        );
        assert_eq!(
            fs::read(d.path().join("copy.rs")).unwrap(),
            b"fn main() {}\n"
        );
        let mut again = Vec::new();
        pack(d.path(), &mut again, &TarLimits::default()).unwrap();
        let s2 = check(&again, &TarLimits::default()).unwrap();
        assert_eq!(s2.files, 2, "a hard link packs as a second file: {s2:?}");
        assert_eq!(s2.links, 2);
    }

    /// Each hostile archive is refused, with the error naming the entry, and nothing
    /// is unpacked.
    #[test]
    fn hostile_archives_are_refused_before_anything_is_written() {
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "absolute path",
                archive(&[(T::Regular, "/etc/evil", "", b"x")]),
                "absolute",
            ),
            (
                "parent dir",
                archive(&[(T::Regular, "a/../../evil", "", b"x")]),
                "`..`",
            ),
            (
                "symlink to an absolute path",
                archive(&[(T::Symlink, "etc", "/etc", b"")]),
                "outside",
            ),
            (
                "symlink climbing out",
                archive(&[(T::Symlink, "a/b", "../../x", b"")]),
                "outside",
            ),
            (
                "symlink climbing out and back",
                archive(&[(T::Symlink, "a", "../dst/a", b"")]),
                "outside",
            ),
            (
                "write through an archive symlink",
                archive(&[(T::Symlink, "d", "sub", b""), (T::Regular, "d/f", "", b"x")]),
                "goes through",
            ),
            (
                "replace an archive symlink",
                archive(&[(T::Symlink, "d", "sub", b""), (T::Regular, "d", "", b"x")]),
                "goes through",
            ),
            (
                "hard link to a host file",
                archive(&[(T::Link, "shadow", "/etc/shadow", b"")]),
                "hard link",
            ),
            (
                "hard link up",
                archive(&[(T::Link, "shadow", "../../etc/shadow", b"")]),
                "hard link",
            ),
            (
                "hard link to a file not in the archive",
                archive(&[(T::Link, "x", "existing", b"")]),
                "hard link",
            ),
            (
                "hard link through a symlink",
                archive(&[
                    (T::Symlink, "l", "f", b""),
                    (T::Regular, "f", "", b"x"),
                    (T::Link, "x", "l", b""),
                ]),
                "hard link",
            ),
            (
                "character device",
                archive(&[(T::Char, "null", "", b"")]),
                "character device",
            ),
            (
                "block device",
                archive(&[(T::Block, "sda", "", b"")]),
                "block device",
            ),
            ("fifo", archive(&[(T::Fifo, "p", "", b"")]), "fifo"),
            (
                "symlink out through another symlink",
                archive(&[
                    (T::Directory, "a/", "", b""),
                    (T::Symlink, "x", "a/b/..", b""),
                    (T::Symlink, "a/b", "..", b""),
                ]),
                "outside",
            ),
            (
                "symlink loop",
                archive(&[(T::Symlink, "x", "y", b""), (T::Symlink, "y", "x", b"")]),
                "outside",
            ),
        ];
        for (what, a, want) in cases {
            let d = tempfile::tempdir().unwrap();
            let dst = d.path().join("dst");
            let e = unpack(&a, &dst, &TarLimits::default()).unwrap_err();
            assert!(e.to_string().contains(want), "{what}: {e}");
            assert!(!dst.exists(), "{what}: something was unpacked");
        }
    }

    #[test]
    fn oversized_archives_are_refused() {
        let a = archive(&[(T::Regular, "big", "", &[7u8; 4096])]);
        let small = TarLimits {
            max_archive_bytes: 1024,
            ..TarLimits::default()
        };
        assert!(matches!(check(&a, &small), Err(TarError::TooLarge { .. })));
        let unpacked = TarLimits {
            max_unpacked_bytes: 4095,
            ..TarLimits::default()
        };
        let e = check(&a, &unpacked).unwrap_err();
        assert!(e.to_string().contains("unpacked size"), "{e}");
        let many = archive(&[
            (T::Regular, "a", "", b""),
            (T::Regular, "b", "", b""),
            (T::Regular, "c", "", b""),
        ]);
        let few = TarLimits {
            max_entries: 2,
            ..TarLimits::default()
        };
        let e = check(&many, &few).unwrap_err();
        assert!(e.to_string().contains("number of entries"), "{e}");
        // A header that claims more data than the archive holds.
        let mut lying = archive(&[(T::Regular, "x", "", &[1u8; 2048])]);
        lying.truncate(1024);
        assert!(
            unpack(
                &lying,
                tempfile::tempdir().unwrap().path(),
                &TarLimits::default()
            )
            .is_err()
        );
        // Packing stops at the limit.
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("f"), vec![0u8; 8192]).unwrap();
        let e = pack(d.path(), Vec::new(), &small).unwrap_err();
        assert!(matches!(e, TarError::TooLarge { .. }), "{e}");
        assert!(read_capped(&[0u8; 10][..], 9).is_err());
        assert_eq!(read_capped(&[0u8; 10][..], 10).unwrap().len(), 10);
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        for junk in [&b"not a tar archive at all"[..], &[0xffu8; 1024][..]] {
            let r = check(junk, &TarLimits::default());
            assert!(r.is_err() || r.unwrap().entries == 0);
        }
    }

    #[test]
    fn packing_keeps_symlinks_as_links_and_skips_fifos() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("f"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("l")).unwrap();
        nix::unistd::mkfifo(&d.path().join("p"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let mut a = Vec::new();
        pack(d.path(), &mut a, &TarLimits::default()).unwrap();
        // A sandbox can make such a link; the archive carries it and check refuses it.
        let e = check(&a, &TarLimits::default()).unwrap_err();
        assert!(matches!(e, TarError::SymlinkEscapes { .. }), "{e}");
        let mut names = Vec::new();
        for e in tar::Archive::new(&a[..]).entries().unwrap() {
            names.push(e.unwrap().path().unwrap().display().to_string());
        }
        assert_eq!(names, ["f", "l"]);
    }

    proptest::proptest! {
        /// Whatever the names, an archive that passes `check` unpacks only inside `dst`.
        #[test]
        fn accepted_archives_stay_inside(
            names in proptest::collection::vec("[a./]{1,12}", 1..6),
            kinds in proptest::collection::vec(0u8..3, 6),
            targets in proptest::collection::vec("[a./]{1,12}", 6),
        ) {
            let mut b = tar::Builder::new(Vec::new());
            for (i, n) in names.iter().enumerate() {
                let k = match kinds[i] { 0 => T::Regular, 1 => T::Directory, _ => T::Symlink };
                let l = if k == T::Symlink { targets[i].as_str() } else { "" };
                raw_entry(&mut b, k, n, l, b"x");
            }
            let a = b.into_inner().unwrap();
            let root = tempfile::tempdir().unwrap();
            let dst = root.path().join("d");
            if unpack(&a, &dst, &TarLimits::default()).is_ok() {
                // Nothing next to dst.
                let beside: Vec<_> = fs::read_dir(root.path()).unwrap().flatten().map(|e| e.file_name()).collect();
                proptest::prop_assert_eq!(beside.len(), 1, "{:?}", beside);
                // Every symlink in dst resolves inside it (or dangles).
                let canon = dst.canonicalize().unwrap();
                let mut stack = vec![dst.clone()];
                while let Some(d) = stack.pop() {
                    for e in fs::read_dir(&d).unwrap().flatten() {
                        let p = e.path();
                        let m = fs::symlink_metadata(&p).unwrap();
                        if m.is_dir() { stack.push(p.clone()); }
                        if let Ok(c) = p.canonicalize() {
                            proptest::prop_assert!(c.starts_with(&canon), "{:?} -> {:?}", p, c);
                        }
                    }
                }
            }
        }
    }
}
