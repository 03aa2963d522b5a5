//! Paused sandboxes outlive the server (E2B's "resume after the server was killed").
//!
//! A pause writes the server's record of the sandbox beside its snapshot
//! (`sandbox-snapshots/ID.json`: tenant, template, class, start, timeout, `auto_pause`,
//! metadata; atomically, root's alone); a resume or a kill removes it. At start the
//! records whose snapshots open are listed again, paused and on no node, until resumed
//! or killed; whatever else is in the folder (a snapshot without a record: a sandbox
//! that was running when the server stopped, or a pause cut short) goes. A micro-VM
//! snapshot on a server started without a micro-VM tier stays on disk, unlisted, and
//! the start says so.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tessera_sandbox::{AnySandbox, Tier, TierKind};

use super::Entry;

/// The record's layout; bump on a change that older servers cannot read.
const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct Record {
    format: u32,
    id: String,
    tenant: String,
    template: String,
    class: String,
    started_unix_ms: u64,
    timeout_s: u64,
    auto_pause: bool,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

fn record_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

/// Writes `e`'s record (after its snapshot is whole).
pub(super) fn write(dir: &Path, e: &Entry) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let r = Record {
        format: FORMAT,
        id: e.id.clone(),
        tenant: e.tenant.clone(),
        template: e.template.clone(),
        class: e.class.clone(),
        started_unix_ms: e
            .started
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        timeout_s: e
            .end_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .2
            .as_secs(),
        auto_pause: e.auto_pause,
        metadata: e.metadata.clone(),
    };
    let path = record_path(dir, &e.id);
    let tmp = dir.join(format!(".{}.json.tmp", e.id));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(&r).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)
}

/// Removes `id`'s record (it resumed, or goes).
pub(super) fn forget(dir: &Path, id: &str) {
    let _ = std::fs::remove_file(record_path(dir, id));
}

/// Lists the paused sandboxes of an earlier run again, and says on stderr what was
/// dropped or kept unlisted.
pub(super) fn relist(inner: &super::Inner) {
    let vm = inner.microvm.clone().map(|v| v as Arc<dyn Tier>);
    let (paused, notes) = load(&inner.snapshots, &inner.namespace, vm.as_ref());
    for n in notes {
        tracing::warn!("sandboxes: {n}");
    }
    if !paused.is_empty() {
        tracing::info!(
            "sandboxes: {} paused sandbox(es) of an earlier run listed again, resumable",
            paused.len()
        );
    }
    let mut all = inner.lock();
    for e in paused {
        all.insert(Arc::new(e));
    }
}

/// The paused sandboxes recorded in `dir`, each opened with its snapshot's tier; lines
/// for the operator about what was dropped or kept unlisted. Anything else in `dir`
/// goes.
pub(super) fn load(
    dir: &Path,
    namespace: &Arc<dyn Tier>,
    microvm: Option<&Arc<dyn Tier>>,
) -> (Vec<Entry>, Vec<String>) {
    let mut entries = Vec::new();
    let mut notes = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (entries, notes);
    };
    let names: Vec<String> = rd
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    // Snapshot folders kept: those a record names and that opened (or wait for a tier).
    let mut kept: Vec<String> = Vec::new();
    for name in &names {
        let Some(id) = name
            .strip_suffix(".json")
            .filter(|_| !name.starts_with('.'))
        else {
            continue;
        };
        let path = dir.join(name);
        let record = match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Record>(&b).map_err(|e| e.to_string()))
        {
            Ok(r) if r.format == FORMAT && r.id == id => r,
            Ok(r) => {
                notes.push(format!(
                    "{}: a record of format {} for {:?}, not this server's {FORMAT} for {id:?}; dropped with its snapshot",
                    path.display(),
                    r.format,
                    r.id
                ));
                let _ = std::fs::remove_file(&path);
                continue;
            }
            Err(e) => {
                notes.push(format!(
                    "{}: unreadable ({e}); dropped with its snapshot",
                    path.display()
                ));
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        let snap = dir.join(id);
        let tier = match tessera_sandbox::snapshot::read_meta(&snap).map(|m| m.tier) {
            Ok(TierKind::Namespace) => namespace.clone(),
            Ok(TierKind::Microvm) => match microvm {
                Some(t) => t.clone(),
                None => {
                    notes.push(format!(
                        "paused sandbox {id} (tenant {:?}) is a micro-VM and this server has no micro-VM tier: kept on disk, not listed; start with --vm-kernel DIR to resume it",
                        record.tenant
                    ));
                    kept.push(id.to_string());
                    continue;
                }
            },
            Err(e) => {
                notes.push(format!(
                    "paused sandbox {id} (tenant {:?}): its snapshot does not open ({e}); dropped",
                    record.tenant
                ));
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        let sandbox = match AnySandbox::open_paused(tier, &snap) {
            Ok(s) if s.tenant().as_deref() == Some(record.tenant.as_str()) => s,
            Ok(_) => {
                notes.push(format!(
                    "paused sandbox {id}: its snapshot names another tenant than its record ({:?}); dropped",
                    record.tenant
                ));
                let _ = std::fs::remove_file(&path);
                continue;
            }
            Err(e) => {
                notes.push(format!(
                    "paused sandbox {id} (tenant {:?}): {e}; dropped",
                    record.tenant
                ));
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        let started = UNIX_EPOCH + Duration::from_millis(record.started_unix_ms);
        let t = Duration::from_secs(record.timeout_s.max(1));
        kept.push(id.to_string());
        entries.push(Entry {
            id: record.id,
            tenant: record.tenant,
            template: record.template,
            class: record.class,
            sandbox: Arc::new(sandbox),
            started,
            // A paused sandbox has no end; the length counts again from its resume.
            end_at: Mutex::new((
                Instant::now() + Duration::from_secs(super::MAX_TIMEOUT_S),
                SystemTime::now(),
                t,
            )),
            auto_pause: record.auto_pause,
            metadata: record.metadata,
            placed: Mutex::new(None),
            version: Default::default(),
            lifecycle: tokio::sync::Mutex::new(()),
        });
    }
    for name in &names {
        let id = name.strip_suffix(".json").unwrap_or(name);
        if kept.iter().any(|k| k == id) {
            continue;
        }
        let p = dir.join(name);
        if p.is_dir() {
            let _ = std::fs::remove_dir_all(&p);
        } else {
            let _ = std::fs::remove_file(&p);
        }
    }
    (entries, notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_sandbox::{Isolated, LifecycleError, SandboxSpec, Snapshot, SpawnError, TierInfo};

    /// A tier that makes nothing: the cases below never get as far as a snapshot.
    struct NoTier;
    impl Tier for NoTier {
        fn kind(&self) -> TierKind {
            TierKind::Namespace
        }
        fn info(&self) -> TierInfo {
            TierInfo {
                kind: TierKind::Namespace,
                accel: None,
                detail: String::new(),
            }
        }
        fn spawn(&self, _: &SandboxSpec) -> Result<Box<dyn Isolated>, SpawnError> {
            Err(SpawnError::Protocol("no tier".into()))
        }
        fn restore(
            &self,
            s: &Snapshot,
            _: &SandboxSpec,
        ) -> Result<Box<dyn Isolated>, LifecycleError> {
            Err(LifecycleError::Snapshot {
                path: s.dir.display().to_string(),
                message: "no tier".into(),
            })
        }
    }

    /// Garbage in the folder never panics: each bad record is named and dropped with
    /// its snapshot, and what no record names goes.
    #[test]
    fn a_folder_of_garbage_is_emptied_and_each_bad_record_named() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        std::fs::write(dir.join("sbx_a.json"), b"{not json").unwrap();
        std::fs::create_dir(dir.join("sbx_a")).unwrap();
        let other = Record {
            format: FORMAT,
            id: "sbx_other".into(),
            tenant: "t".into(),
            template: "base".into(),
            class: "standard".into(),
            started_unix_ms: 0,
            timeout_s: 60,
            auto_pause: false,
            metadata: BTreeMap::new(),
        };
        std::fs::write(dir.join("sbx_b.json"), serde_json::to_vec(&other).unwrap()).unwrap();
        let fine = Record {
            id: "sbx_c".into(),
            ..other
        };
        // A record whose snapshot is missing.
        std::fs::write(dir.join("sbx_c.json"), serde_json::to_vec(&fine).unwrap()).unwrap();
        // A snapshot no record names, and a record write cut short.
        std::fs::create_dir(dir.join("sbx_d")).unwrap();
        std::fs::write(dir.join(".sbx_e.json.tmp"), b"{").unwrap();
        let ns: Arc<dyn Tier> = Arc::new(NoTier);
        let (entries, notes) = load(dir, &ns, None);
        assert!(entries.is_empty());
        let all = notes.join("\n");
        for want in [
            "sbx_a.json: unreadable",
            "sbx_b.json: a record",
            "sbx_c (tenant \"t\"): its snapshot does not open",
        ] {
            assert!(all.contains(want), "{want:?} not in\n{all}");
        }
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
