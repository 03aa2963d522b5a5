//! The template registry: root file systems an operator registered, kept under one
//! folder (the server's data folder), content-addressed by digest and named. Tenants
//! name a template (`name` or `name@sha256:<hex>`); they never give a host path, so no
//! tenant can make a sandbox of the host's `/` or `/etc`.
//!
//! Layout under the registry's folder (0700):
//! - `sha256/<hex>/`: one template's root, immutable once there;
//! - `names/<name>.json`: a name's record (its digest, where it came from, when);
//! - `tmp/`: imports in progress (moved into `sha256/` with one `rename`).
//!
//! The digest is SHA-256 over a manifest of the tree in path order: for each entry its
//! relative path, kind, permission bits and content digest (files) or target (links).
//! Owners and times are not part of it. The same tree imported twice has one digest,
//! and is stored once.
//!
//! Importing copies (a folder) or unpacks ([`crate::template::unpack_oci_layout`]) into
//! `tmp/` first; device nodes, FIFOs and sockets are left out, setuid and setgid bits
//! dropped, symlinks kept as links (they are resolved inside the sandbox, after
//! `pivot_root`).

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::spec::Template;
use crate::template::{OciOptions, TemplateError, check_dir, unpack_oci_layout};

/// The built-in template: the host's `/usr` (and `/bin`, `/lib*` links) read-only with
/// a generated `/etc` ([`Template::Host`]). `base` is accepted as another name for it.
pub const HOST_TEMPLATE: &str = "host";

/// A registered template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateRecord {
    pub name: String,
    /// `sha256:<64 hex>`.
    pub digest: String,
    /// Where it came from (`dir:/path`, `oci:/layout`), for people.
    pub source: String,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Regular files and their bytes.
    pub files: u64,
    pub bytes: u64,
}

/// What the registry refused or failed to do.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "template {reference}: not registered here; an operator registers one with \
         `tessera template import --name NAME DIR` (or `--oci LAYOUT`); `tessera template \
         list` shows what is there"
    )]
    NotFound { reference: String },
    #[error(
        "template {reference}: a template is named (`NAME` or `NAME@sha256:<hex>`, \
         from `GET /v1/templates`), never a host path ({why}); an operator registers a \
         root folder with `tessera template import --name NAME DIR`"
    )]
    BadReference { reference: String, why: String },
    #[error("template {name}: registered as {actual}, not {wanted}")]
    DigestMismatch {
        name: String,
        wanted: String,
        actual: String,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: io::Error,
    },
    #[error(transparent)]
    Template(#[from] TemplateError),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RegistryError + 'a {
    move |source| RegistryError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

/// A template's name: 1 to 63 of `a-z 0-9 . _ -`, starting with a letter or digit.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(
            "a name is 1 to 63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
                .into(),
        )
    }
}

/// A reference split into its name and, when pinned, its digest.
pub fn parse_reference(reference: &str) -> Result<(&str, Option<&str>), RegistryError> {
    let bad = |why: &str| RegistryError::BadReference {
        reference: quote(reference),
        why: why.to_string(),
    };
    if reference.contains('/') {
        return Err(bad("it contains '/'"));
    }
    let (name, digest) = match reference.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (reference, None),
    };
    check_name(name).map_err(|e| bad(&e))?;
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        {
            return Err(bad(
                "a pinned digest reads sha256:<64 lowercase hex digits>",
            ));
        }
    }
    Ok((name, digest))
}

fn quote(s: &str) -> String {
    match s.char_indices().nth(64) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &s[..cut], s.len()),
    }
}

/// The registry over one folder.
#[derive(Debug, Clone)]
pub struct TemplateRegistry {
    root: PathBuf,
}

fn mkdir_private(p: &Path) -> Result<(), RegistryError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
        .map_err(io_err("mkdir", p))?;
    fs::set_permissions(p, fs::Permissions::from_mode(0o700)).map_err(io_err("chmod", p))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl TemplateRegistry {
    /// Opens (and makes, 0700) the registry under `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, RegistryError> {
        let root = root.into();
        for sub in ["", "sha256", "names", "tmp"] {
            mkdir_private(&root.join(sub))?;
        }
        Ok(TemplateRegistry { root })
    }

    /// The registry's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn content(&self, digest: &str) -> PathBuf {
        self.root
            .join("sha256")
            .join(digest.strip_prefix("sha256:").unwrap_or(digest))
    }

    fn name_file(&self, name: &str) -> PathBuf {
        self.root.join("names").join(format!("{name}.json"))
    }

    /// Registers the root folder `src` as `name` (a copy: later changes to `src` do not
    /// reach it). A name registered before now points at the new content.
    pub fn import_dir(&self, name: &str, src: &Path) -> Result<TemplateRecord, RegistryError> {
        self.import(name, format!("dir:{}", src.display()), |dest| {
            check_dir(src)?;
            copy_tree(src, dest).map(|_| ())
        })
    }

    /// Registers the image of an OCI image layout as `name`.
    pub fn import_oci(
        &self,
        name: &str,
        layout: &Path,
        opts: &OciOptions,
    ) -> Result<TemplateRecord, RegistryError> {
        self.import(name, format!("oci:{}", layout.display()), |dest| {
            unpack_oci_layout(layout, dest, opts)?;
            check_dir(dest)?;
            Ok(())
        })
    }

    fn import(
        &self,
        name: &str,
        source: String,
        fill: impl FnOnce(&Path) -> Result<(), RegistryError>,
    ) -> Result<TemplateRecord, RegistryError> {
        check_name(name).map_err(|why| RegistryError::BadReference {
            reference: quote(name),
            why,
        })?;
        let tmp = self.root.join("tmp").join(format!(
            "{}-{}-{}",
            name,
            std::process::id(),
            crate::registry::nonce()
        ));
        let res = (|| {
            fill(&tmp)?;
            let (digest, files, bytes) = digest_tree(&tmp)?;
            let dest = self.content(&digest);
            if dest.exists() {
                let _ = fs::remove_dir_all(&tmp);
            } else {
                fs::rename(&tmp, &dest).map_err(io_err("rename", &dest))?;
            }
            let rec = TemplateRecord {
                name: name.to_string(),
                digest,
                source,
                created_at_ms: now_ms(),
                files,
                bytes,
            };
            self.write_record(&rec)?;
            Ok(rec)
        })();
        if res.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        res
    }

    fn write_record(&self, rec: &TemplateRecord) -> Result<(), RegistryError> {
        let path = self.name_file(&rec.name);
        let tmp = path.with_extension(format!("json.{}", nonce()));
        let data = serde_json::to_vec_pretty(rec).expect("a record serializes");
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        f.write_all(&data).map_err(io_err("write", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        fs::rename(&tmp, &path).map_err(io_err("rename", &path))
    }

    /// A registered template by name, if any.
    pub fn get(&self, name: &str) -> Result<Option<TemplateRecord>, RegistryError> {
        if check_name(name).is_err() {
            return Ok(None);
        }
        let path = self.name_file(name);
        match fs::read(&path) {
            Ok(d) => serde_json::from_slice(&d)
                .map(Some)
                .map_err(|e| RegistryError::Io {
                    op: "parse",
                    path: path.display().to_string(),
                    source: io::Error::new(io::ErrorKind::InvalidData, e),
                }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read", &path)(e)),
        }
    }

    /// Every registered template, by name.
    pub fn list(&self) -> Result<Vec<TemplateRecord>, RegistryError> {
        let dir = self.root.join("names");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir)
            .map_err(io_err("read_dir", &dir))?
            .flatten()
        {
            let n = e.file_name().to_string_lossy().to_string();
            if let Some(name) = n.strip_suffix(".json")
                && let Some(r) = self.get(name)?
            {
                out.push(r);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Drops a name (its content stays until no name points at it and it is pruned).
    pub fn remove(&self, name: &str) -> Result<bool, RegistryError> {
        if check_name(name).is_err() {
            return Ok(false);
        }
        let path = self.name_file(name);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("remove", &path)(e)),
        }
    }

    /// Resolves a tenant's reference (`host`/`base`, `NAME` or `NAME@sha256:<hex>`) to
    /// the sandbox template it names and its digest (`host` for the built-in one).
    pub fn resolve(&self, reference: &str) -> Result<(Template, String), RegistryError> {
        resolve_in(Some(self), reference)
    }
}

/// [`TemplateRegistry::resolve`] where there may be no registry (only `host` then).
pub fn resolve_in(
    registry: Option<&TemplateRegistry>,
    reference: &str,
) -> Result<(Template, String), RegistryError> {
    if reference == HOST_TEMPLATE || reference == "base" {
        return Ok((Template::Host, HOST_TEMPLATE.to_string()));
    }
    let (name, pinned) = parse_reference(reference)?;
    let not_found = || RegistryError::NotFound {
        reference: quote(reference),
    };
    let reg = registry.ok_or_else(not_found)?;
    let rec = reg.get(name)?.ok_or_else(not_found)?;
    if let Some(want) = pinned
        && want != rec.digest
    {
        return Err(RegistryError::DigestMismatch {
            name: name.to_string(),
            wanted: want.to_string(),
            actual: rec.digest,
        });
    }
    let dir = reg.content(&rec.digest);
    if !dir.is_dir() {
        return Err(not_found());
    }
    Ok((Template::Dir(dir), rec.digest))
}

pub(crate) fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("{t:x}{:x}", N.fetch_add(1, Ordering::Relaxed))
}

/// Copies the tree at `src` to `dest` (made): directories, regular files and symlinks;
/// device nodes, FIFOs and sockets are left out; setuid/setgid bits dropped. Owners are
/// kept when running as root. Returns the files copied.
fn copy_tree(src: &Path, dest: &Path) -> Result<u64, RegistryError> {
    let root = nix::unistd::geteuid().is_root();
    let mut files = 0;
    let mut stack = vec![(src.to_path_buf(), dest.to_path_buf())];
    while let Some((from, to)) = stack.pop() {
        let md = fs::symlink_metadata(&from).map_err(io_err("stat", &from))?;
        let ft = md.file_type();
        let mode = md.mode() & 0o1777;
        if ft.is_symlink() {
            let target = fs::read_link(&from).map_err(io_err("readlink", &from))?;
            std::os::unix::fs::symlink(&target, &to).map_err(io_err("symlink", &to))?;
        } else if ft.is_dir() {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&to)
                .map_err(io_err("mkdir", &to))?;
            for e in fs::read_dir(&from).map_err(io_err("read_dir", &from))? {
                let e = e.map_err(io_err("read_dir", &from))?;
                stack.push((e.path(), to.join(e.file_name())));
            }
            // Permissions last would be cleaner for read-only dirs; 0700 while filling,
            // the real bits set below (directories are filled before they are set: the
            // children were pushed, so set the mode now and keep owner-write for root).
            fs::set_permissions(&to, fs::Permissions::from_mode(mode | 0o700))
                .map_err(io_err("chmod", &to))?;
        } else if ft.is_file() {
            let mut r = fs::File::open(&from).map_err(io_err("open", &from))?;
            let mut w = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&to)
                .map_err(io_err("create", &to))?;
            io::copy(&mut r, &mut w).map_err(io_err("copy", &from))?;
            fs::set_permissions(&to, fs::Permissions::from_mode(mode))
                .map_err(io_err("chmod", &to))?;
            files += 1;
        } else {
            continue; // devices, FIFOs, sockets: a sandbox has its own /dev
        }
        if root {
            let _ = std::os::unix::fs::lchown(&to, Some(md.uid()), Some(md.gid()));
        }
    }
    Ok(files)
}

/// The digest of the tree at `dir` (see the module docs), its file count and bytes.
pub fn digest_tree(dir: &Path) -> Result<(String, u64, u64), RegistryError> {
    let mut manifest = Sha256::new();
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut entries = Vec::new();
    collect(dir, Path::new(""), &mut entries)?;
    entries.sort();
    for rel in entries {
        let p = dir.join(&rel);
        let md = fs::symlink_metadata(&p).map_err(io_err("stat", &p))?;
        let ft = md.file_type();
        let mode = md.mode() & 0o7777;
        let rel = rel.to_string_lossy();
        let line = if ft.is_symlink() {
            let t = fs::read_link(&p).map_err(io_err("readlink", &p))?;
            format!("l {rel:?} {:?}\n", t.to_string_lossy())
        } else if ft.is_dir() {
            format!("d {rel:?} {mode:o}\n")
        } else if ft.is_file() {
            let mut h = Sha256::new();
            let mut f = fs::File::open(&p).map_err(io_err("open", &p))?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = f.read(&mut buf).map_err(io_err("read", &p))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                bytes += n as u64;
            }
            files += 1;
            format!("f {rel:?} {mode:o} {}\n", hex(&h.finalize()))
        } else {
            continue;
        };
        manifest.update(line.as_bytes());
    }
    Ok((
        format!("sha256:{}", hex(&manifest.finalize())),
        files,
        bytes,
    ))
}

fn collect(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), RegistryError> {
    let dir = root.join(rel);
    for e in fs::read_dir(&dir).map_err(io_err("read_dir", &dir))? {
        let e = e.map_err(io_err("read_dir", &dir))?;
        let r = rel.join(e.file_name());
        let ft = e.file_type().map_err(io_err("stat", &e.path()))?;
        out.push(r.clone());
        if ft.is_dir() {
            collect(root, &r, out)?;
        }
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(dir: &Path) {
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::write(dir.join("bin/sh"), b"#!fake").unwrap();
        fs::set_permissions(dir.join("bin/sh"), fs::Permissions::from_mode(0o4755)).unwrap();
        fs::create_dir_all(dir.join("etc")).unwrap();
        fs::write(dir.join("etc/hostname"), b"t\n").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("etc/link")).unwrap();
    }

    #[test]
    fn imports_are_content_addressed_and_named() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        tree(&src);
        let reg = TemplateRegistry::open(t.path().join("reg")).unwrap();
        let a = reg.import_dir("tools", &src).unwrap();
        let b = reg.import_dir("tools-copy", &src).unwrap();
        assert_eq!(a.digest, b.digest, "same tree, same digest");
        assert_eq!(a.files, 2);
        assert_eq!(reg.list().unwrap().len(), 2);
        let (tpl, d) = reg.resolve("tools").unwrap();
        assert_eq!(d, a.digest);
        let Template::Dir(p) = tpl else { panic!() };
        // setuid dropped, link kept as a link.
        let m = fs::metadata(p.join("bin/sh")).unwrap().mode();
        assert_eq!(m & 0o7777, 0o755);
        assert!(
            fs::symlink_metadata(p.join("etc/link"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        // Pinned references.
        assert!(reg.resolve(&format!("tools@{}", a.digest)).is_ok());
        let wrong = format!("tools@sha256:{}", "0".repeat(64));
        assert!(matches!(
            reg.resolve(&wrong),
            Err(RegistryError::DigestMismatch { .. })
        ));
        // A change to the source changes the digest of a new import, not the old one.
        fs::write(src.join("etc/hostname"), b"u\n").unwrap();
        let c = reg.import_dir("tools", &src).unwrap();
        assert_ne!(c.digest, a.digest);
        assert!(reg.resolve(&format!("tools@{}", a.digest)).is_err());
        assert!(reg.resolve("tools-copy").is_ok());
    }

    #[test]
    fn host_paths_and_tricks_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let reg = TemplateRegistry::open(t.path()).unwrap();
        for bad in [
            "/",
            "//",
            "/./",
            "/etc",
            "/usr/..",
            "../x",
            "a/b",
            "",
            ".hidden",
            "UPPER",
            "x@sha256:abc",
            "x@md5:00",
        ] {
            match reg.resolve(bad) {
                Err(RegistryError::BadReference { .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(matches!(
            reg.resolve("missing"),
            Err(RegistryError::NotFound { .. })
        ));
        let e = reg.resolve("/").unwrap_err().to_string();
        assert!(e.contains("never a host path"), "{e}");
        assert_eq!(reg.resolve("host").unwrap().0, Template::Host);
        assert_eq!(resolve_in(None, "base").unwrap().0, Template::Host);
    }

    #[test]
    fn the_registry_folder_is_private() {
        let t = tempfile::tempdir().unwrap();
        let reg = TemplateRegistry::open(t.path().join("r")).unwrap();
        for sub in ["", "sha256", "names", "tmp"] {
            let m = fs::metadata(reg.root().join(sub)).unwrap().mode();
            assert_eq!(m & 0o777, 0o700, "{sub}");
        }
    }
}
