//! Snapshots on disk: one folder per snapshot, written so that a crash at any moment
//! leaves either the previous snapshot or the new one whole, never a mix.
//!
//! Layout of a snapshot folder (0700):
//! - the tier's files (`layer-workspace.tar`…, or `vm.state`…), each fsynced;
//! - `meta.json` ([`SnapshotMeta`]), written last: it names every file with its size
//!   and SHA-256, which a restore checks before it uses any of them.
//!
//! A snapshot is written into `DIR.tmp-<nonce>` and then moved into place: the old
//! `DIR` (if any) is renamed to `DIR.old-<nonce>`, the new one renamed to `DIR`, the old
//! one removed, the parent fsynced. [`open`] repairs what a crash between those renames
//! left (`DIR` missing, `DIR.old-*` present: the old one is put back) and removes
//! unfinished `DIR.tmp-*` folders.

use crate::error::LifecycleError;
use crate::now_ms;
use crate::spec::SandboxSpec;
use crate::tier::{Isolated, TierKind};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The version of [`SnapshotMeta`] this build writes and reads.
pub const SNAPSHOT_FORMAT: u32 = 1;
const META: &str = "meta.json";

/// A file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFile {
    pub name: String,
    pub bytes: u64,
    /// Hex SHA-256 of its content.
    pub sha256: String,
}

/// `meta.json` of a snapshot folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub format: u32,
    /// The sandbox's id (kept across pause and resume).
    pub id: String,
    pub tier: TierKind,
    pub spec: SandboxSpec,
    #[serde(default)]
    pub tenant: Option<String>,
    pub created_at_ms: u64,
    pub files: Vec<SnapshotFile>,
    /// The tier's own data (layers, the VM's machine and devices).
    #[serde(default)]
    pub tier_data: serde_json::Value,
}

impl SnapshotMeta {
    /// Bytes of all its files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// A snapshot folder whose files were checked against its `meta.json`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub meta: SnapshotMeta,
}

/// Writes `data` to `path` (0600, new) and fsyncs it.
pub fn write_durable(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

fn sha256_file(path: &Path) -> io::Result<(u64, String)> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((n, crate::identity::hex(&h.finalize())))
}

fn sibling(dir: &Path, tag: &str) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "snapshot".into());
    dir.with_file_name(format!("{name}.{tag}-{}", crate::registry::nonce()))
}

/// Siblings of `dir` named `DIR.<tag>-*`.
fn siblings(dir: &Path, tag: &str) -> Vec<PathBuf> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}.{tag}-", name.to_string_lossy());
    let Ok(rd) = fs::read_dir(if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    }) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| dir.with_file_name(e.file_name()))
        .collect();
    v.sort();
    v
}

/// Takes a snapshot of `sb` (drained by the caller) into `dir`, atomically.
pub fn take(
    sb: &dyn Isolated,
    dir: &Path,
    id: &str,
    tenant: Option<String>,
    spec: &SandboxSpec,
) -> Result<SnapshotMeta, LifecycleError> {
    let err = |e: io::Error| LifecycleError::snapshot(dir, e);
    if let Some(p) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(p)
            .map_err(err)?;
    }
    let tmp = sibling(dir, "tmp");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .map_err(err)?;
    let r = (|| {
        let parts = sb.snapshot(&tmp)?;
        let mut files = Vec::new();
        for name in &parts.files {
            let p = tmp.join(name);
            let (bytes, sha256) = sha256_file(&p).map_err(|e| LifecycleError::snapshot(&p, e))?;
            files.push(SnapshotFile {
                name: name.clone(),
                bytes,
                sha256,
            });
        }
        let meta = SnapshotMeta {
            format: SNAPSHOT_FORMAT,
            id: id.to_string(),
            tier: sb.kind(),
            spec: spec.clone(),
            tenant,
            created_at_ms: now_ms(),
            files,
            tier_data: parts.tier_data,
        };
        let json = serde_json::to_vec_pretty(&meta).expect("meta serializes");
        write_durable(&tmp.join(META), &json).map_err(err)?;
        fsync_dir(&tmp).map_err(err)?;
        Ok(meta)
    })();
    let meta = match r {
        Ok(m) => m,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    // Move into place: old aside, new in, old gone.
    let old = sibling(dir, "old");
    let had_old = match fs::rename(dir, &old) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            return Err(err(e));
        }
    };
    if let Err(e) = fs::rename(&tmp, dir) {
        if had_old {
            let _ = fs::rename(&old, dir);
        }
        let _ = fs::remove_dir_all(&tmp);
        return Err(err(e));
    }
    if let Some(p) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        let _ = fsync_dir(p);
    }
    if had_old {
        let _ = fs::remove_dir_all(&old);
    }
    Ok(meta)
}

/// Repairs what an interrupted [`take`] left around `dir` (see the module docs).
fn repair(dir: &Path) {
    if !dir.exists()
        && let Some(old) = siblings(dir, "old").pop()
    {
        let _ = fs::rename(&old, dir);
    }
    for t in siblings(dir, "tmp") {
        let _ = fs::remove_dir_all(t);
    }
    if dir.exists() {
        for o in siblings(dir, "old") {
            let _ = fs::remove_dir_all(o);
        }
    }
}

/// Reads `dir/meta.json` (after repairing an interrupted write) without checking files.
pub fn read_meta(dir: &Path) -> Result<SnapshotMeta, LifecycleError> {
    repair(dir);
    let p = dir.join(META);
    let text = fs::read(&p).map_err(|e| {
        LifecycleError::snapshot(
            dir,
            if e.kind() == io::ErrorKind::NotFound {
                "no snapshot here (no meta.json): was the sandbox paused to this folder?"
                    .to_string()
            } else {
                format!("reading meta.json: {e}")
            },
        )
    })?;
    let meta: SnapshotMeta = serde_json::from_slice(&text)
        .map_err(|e| LifecycleError::snapshot(&p, format!("not a snapshot's meta.json: {e}")))?;
    if meta.format != SNAPSHOT_FORMAT {
        return Err(LifecycleError::snapshot(
            &p,
            format!(
                "format {} (this build reads {SNAPSHOT_FORMAT}): resume it with the build that paused it",
                meta.format
            ),
        ));
    }
    Ok(meta)
}

/// Opens the snapshot at `dir`: its meta, and every file checked (size and SHA-256).
pub fn open(dir: &Path) -> Result<Snapshot, LifecycleError> {
    let meta = read_meta(dir)?;
    for f in &meta.files {
        if f.name.contains('/') || f.name == ".." {
            return Err(LifecycleError::snapshot(
                dir,
                format!("meta.json names the file {:?}", f.name),
            ));
        }
        let p = dir.join(&f.name);
        let (bytes, sha) = sha256_file(&p).map_err(|e| LifecycleError::snapshot(&p, e))?;
        if bytes != f.bytes || sha != f.sha256 {
            return Err(LifecycleError::snapshot(
                &p,
                format!(
                    "damaged: {bytes} bytes with SHA-256 {sha}, meta.json says {} bytes with {}",
                    f.bytes, f.sha256
                ),
            ));
        }
    }
    Ok(Snapshot {
        dir: dir.to_path_buf(),
        meta,
    })
}

/// Removes the snapshot at `dir` and anything an interrupted write left beside it.
pub fn remove(dir: &Path) {
    let _ = fs::remove_dir_all(dir);
    for t in siblings(dir, "tmp").into_iter().chain(siblings(dir, "old")) {
        let _ = fs::remove_dir_all(t);
    }
}
