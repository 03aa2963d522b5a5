//! Idle sessions to disk (issue 18): when a session's sandbox is released for being
//! idle, its writable folders (`/workspace`, `/home/user`, `/tmp`, `/dev/shm`) are
//! written to the node's disk as a namespace-tier snapshot (`ROOT/TENANT/SESSION`,
//! root's alone), and the next start of the session puts them into the sandbox it
//! claims before its agent starts. Memory and processes are not kept: the agent starts
//! again, as after any release (its state belongs in the session's memory and
//! checkpoints); the files it wrote are back. The snapshot goes once restored, and
//! when the session ends.

use std::path::{Path, PathBuf};

use tessera_sandbox::{NamespaceTier, Sandbox};

/// The session's snapshot folder under `root`; `None` for a tenant or session name that
/// is no plain file name (never a path out of `root`).
pub(super) fn dir_for(root: &Path, tenant: &str, session: &str) -> Option<PathBuf> {
    let plain = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.len() <= 200
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    (plain(tenant) && plain(session)).then(|| root.join(tenant).join(session))
}

/// Writes `sb`'s writable folders under `root` for the session's next start.
pub(super) fn keep(root: &Path, tenant: &str, session: &str, sb: &Sandbox) -> Result<(), String> {
    let dir = dir_for(root, tenant, session)
        .ok_or_else(|| format!("{tenant:?}/{session:?} is no plain folder name"))?;
    tessera_sandbox::snapshot::take(sb, &dir, sb.id(), Some(tenant.to_string()), sb.spec())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Puts the session's kept folders into `sb` (claimed for its start) and removes the
/// snapshot. `Ok(false)`: nothing was kept. On `Err` the snapshot stays (nothing is
/// lost) and the start fails with the reason.
pub(super) fn restore(
    root: &Path,
    tenant: &str,
    session: &str,
    sb: &Sandbox,
) -> Result<bool, String> {
    let Some(dir) = dir_for(root, tenant, session) else {
        return Ok(false);
    };
    if !dir.join("meta.json").exists() {
        return Ok(false);
    }
    let fail = |e: String| format!("restoring the session's files from {}: {e}", dir.display());
    let snap = tessera_sandbox::snapshot::open(&dir).map_err(|e| fail(e.to_string()))?;
    if snap.meta.tenant.as_deref() != Some(tenant) {
        return Err(fail(format!(
            "it belongs to tenant {:?}",
            snap.meta.tenant.unwrap_or_default()
        )));
    }
    NamespaceTier::restore_into(sb, &snap).map_err(|e| fail(e.to_string()))?;
    forget(root, tenant, session);
    Ok(true)
}

/// Removes the session's snapshot, if any (restored, or the session ended).
pub(super) fn forget(root: &Path, tenant: &str, session: &str) {
    if let Some(dir) = dir_for(root, tenant, session) {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_make_a_folder() {
        let root = Path::new("/d");
        assert_eq!(
            dir_for(root, "acme", "ses_1.a-b"),
            Some(PathBuf::from("/d/acme/ses_1.a-b"))
        );
        for (t, s) in [
            ("..", "x"),
            ("a", "../b"),
            ("a/b", "x"),
            ("", "x"),
            ("a", ".x"),
            ("a", "x y"),
        ] {
            assert_eq!(dir_for(root, t, s), None, "{t:?} {s:?}");
        }
    }
}
