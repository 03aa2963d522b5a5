//! 32-byte keys kept in the data folder (`DATA/keys/NAME`, 0600): made on the
//! first start, read on every later one. The weights' key-encryption key and the
//! token signing key live there.

use std::path::Path;

/// The key in `dir/keys/name`, made (from the operating system's random source)
/// if there is none. `if_lost` says what a damaged file costs, for its error.
pub fn seed(dir: &Path, name: &str, if_lost: &str) -> Result<[u8; 32], String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let keys = dir.join("keys");
    let path = keys.join(name);
    std::fs::create_dir_all(&keys).map_err(|e| format!("{}: {e}", keys.display()))?;
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut k = [0u8; 32];
            getrandom::fill(&mut k)
                .map_err(|e| format!("{}: no random bytes for a new key: {e}", path.display()))?;
            let tmp = keys.join(format!(".{name}.{}", std::process::id()));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| format!("{}: {e}", tmp.display()))?;
            f.write_all(&k)
                .and_then(|()| f.sync_all())
                .map_err(|e| format!("{}: {e}", tmp.display()))?;
            // Another start may have made one meanwhile: the first one stays.
            if std::fs::hard_link(&tmp, &path).is_err() && !path.exists() {
                return Err(format!("{}: cannot be created", path.display()));
            }
            let _ = std::fs::remove_file(&tmp);
            std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    bytes.as_slice().try_into().map_err(|_| {
        format!(
            "{} holds {} bytes, not a 32-byte key: restore it from a backup ({if_lost})",
            path.display(),
            bytes.len()
        )
    })
}
