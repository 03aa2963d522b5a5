//! The template registry: root file systems an operator registered, kept under one
//! folder (the server's data folder), content-addressed by digest and named. Tenants
//! name a template (`name` or `name@sha256:<hex>`); they never give a host path, so no
//! tenant can make a sandbox of the host's `/` or `/etc`.
//!
//! Layout under the registry's folder (0700):
//! - `sha256/<hex>/`: one template's root, immutable once there;
//! - `names/<name>.json`: a name's record (its digest, where it came from, when);
//! - `manifests/<hex>`: the manifest the digest is taken over (what a signature signs);
//! - `signatures/<hex>/*.sigstore.json`: Sigstore bundles attached to that digest;
//! - `tmp/`: imports in progress (moved into `sha256/` with one `rename`).
//!
//! The digest is SHA-256 over a manifest of the tree in path order: for each entry its
//! relative path, kind, permission bits and content digest (files) or target (links).
//! Owners and times are not part of it. The same tree imported twice has one digest,
//! and is stored once.
//!
//! Every way to a template's root goes through [`TemplateRegistry::resolve`] (or
//! [`resolve_in`]), which takes the workload's [`Subject`] and applies the registry's
//! trust policy ([`crate::trust`]) when it has one: no caller can name a template
//! without the policy being asked.
//!
//! Importing copies (a folder) or unpacks ([`crate::template::unpack_oci_layout`]) into
//! `tmp/` first; device nodes, FIFOs and sockets are left out, setuid and setgid bits
//! dropped, symlinks kept as links (they are resolved inside the sandbox, after
//! `pivot_root`).

use crate::now_ms;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::spec::Template;
use crate::template::{OciOptions, TemplateError, check_dir, unpack_oci_layout};
use crate::trust::{
    Admitted, Candidate, SigningKey, StoredBundle, Subject, TrustError, TrustPolicy,
};
use std::sync::Arc;

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
    #[error(transparent)]
    Untrusted(Box<TrustError>),
    #[error("template {name}: {why}")]
    Signature { name: String, why: String },
}

impl From<Box<TrustError>> for RegistryError {
    fn from(e: Box<TrustError>) -> Self {
        RegistryError::Untrusted(e)
    }
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
    policy: Option<Arc<TrustPolicy>>,
}

fn mkdir_private(p: &Path) -> Result<(), RegistryError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
        .map_err(io_err("mkdir", p))?;
    fs::set_permissions(p, fs::Permissions::from_mode(0o700)).map_err(io_err("chmod", p))
}

impl TemplateRegistry {
    /// Opens (and makes, 0700) the registry under `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, RegistryError> {
        let root = root.into();
        for sub in ["", "sha256", "names", "tmp", "manifests", "signatures"] {
            mkdir_private(&root.join(sub))?;
        }
        Ok(TemplateRegistry { root, policy: None })
    }

    /// The registry with `policy` applied on every [`TemplateRegistry::resolve`].
    pub fn with_policy(mut self, policy: Option<Arc<TrustPolicy>>) -> Self {
        self.policy = policy;
        self
    }

    /// The trust policy every resolve applies, if any.
    pub fn policy(&self) -> Option<&TrustPolicy> {
        self.policy.as_deref()
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
            let (manifest, files, bytes) = manifest_tree(&tmp)?;
            let digest = digest_of(&manifest);
            self.write_manifest(&digest, &manifest)?;
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
            self.remember(&rec)?;
            Ok(rec)
        })();
        if res.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        res
    }

    fn write_record(&self, rec: &TemplateRecord) -> Result<(), RegistryError> {
        let path = self.name_file(&rec.name);
        let data = serde_json::to_vec_pretty(rec).expect("a record serializes");
        write_atomic(&path, &data)
    }

    /// Appends the digest a name now names to the name's history, so that a reference
    /// pinned to it (`NAME@sha256:…`, as a job's template is pinned when the job is
    /// admitted) keeps naming that content after the name moves on.
    fn remember(&self, rec: &TemplateRecord) -> Result<(), RegistryError> {
        let path = self.history_file(&rec.name);
        if self.history(&rec.name).iter().any(|d| d == &rec.digest) {
            return Ok(());
        }
        let mut f = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_err("open", &path))?;
        f.write_all(format!("{}\n", rec.digest).as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io_err("write", &path))
    }

    fn history_file(&self, name: &str) -> PathBuf {
        self.root.join("names").join(format!("{name}.digests"))
    }

    fn history(&self, name: &str) -> Vec<String> {
        fs::read_to_string(self.history_file(name))
            .unwrap_or_default()
            .lines()
            .filter(|l| crate::trust::is_digest(l))
            .map(str::to_string)
            .collect()
    }

    fn hex_of(digest: &str) -> &str {
        digest.strip_prefix("sha256:").unwrap_or(digest)
    }

    fn write_manifest(&self, digest: &str, manifest: &[u8]) -> Result<(), RegistryError> {
        let path = self.root.join("manifests").join(Self::hex_of(digest));
        if path.exists() {
            return Ok(());
        }
        write_atomic(&path, manifest)
    }

    /// The manifest `digest` is taken over: what a signature of the template signs
    /// (`tessera template manifest NAME`). Made again from the stored tree, and checked
    /// against the digest, for templates imported before manifests were kept.
    pub fn manifest(&self, digest: &str) -> Result<Vec<u8>, RegistryError> {
        let path = self.root.join("manifests").join(Self::hex_of(digest));
        let m = match fs::read(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (m, _, _) = manifest_tree(&self.content(digest))?;
                self.write_manifest(digest, &m)?;
                m
            }
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        let actual = digest_of(&m);
        if actual != digest {
            return Err(RegistryError::DigestMismatch {
                name: path.display().to_string(),
                wanted: digest.to_string(),
                actual,
            });
        }
        Ok(m)
    }

    /// Attaches a Sigstore bundle (JSON, as `cosign sign-blob --bundle` writes it) to the
    /// template `reference` names. The bundle must be a message signature over the
    /// template's manifest: a bundle for any other digest is refused. Returns the record
    /// and the bundle's file name. Nothing is verified here: the trust policy verifies
    /// on every resolve, against the keys it names.
    pub fn attach(
        &self,
        reference: &str,
        bundle_json: &str,
    ) -> Result<(TemplateRecord, String), RegistryError> {
        let rec = self.record(reference)?;
        let sig_err = |why: String| RegistryError::Signature {
            name: rec.name.clone(),
            why,
        };
        let bundle = sigstore_verify::types::Bundle::from_json(bundle_json)
            .map_err(|e| sig_err(format!("not a Sigstore bundle: {e}")))?;
        match crate::trust::signed_digest(&bundle) {
            Some(d) if d == rec.digest => {}
            Some(d) => {
                return Err(sig_err(format!(
                    "the bundle signs {d}, not this template's {}; sign the output of                      `tessera template manifest {}`",
                    rec.digest, rec.name
                )));
            }
            None => {
                return Err(sig_err(
                    "the bundle is not a message signature with a SHA2_256 digest (DSSE                      attestations are not accepted for templates)"
                        .into(),
                ));
            }
        }
        let dir = self.root.join("signatures").join(Self::hex_of(&rec.digest));
        mkdir_private(&dir)?;
        let id = hex(&Sha256::digest(bundle_json.as_bytes()));
        let file = format!("{}.sigstore.json", &id[..16]);
        write_atomic(&dir.join(&file), bundle_json.as_bytes())?;
        Ok((rec, file))
    }

    /// Signs the template `reference` names with `key` and attaches the bundle;
    /// returns the record, the bundle's file name and its JSON.
    pub fn sign(
        &self,
        reference: &str,
        key: &SigningKey,
    ) -> Result<(TemplateRecord, String, String), RegistryError> {
        let rec = self.record(reference)?;
        let manifest = self.manifest(&rec.digest)?;
        let bundle = key.sign(&manifest).map_err(|e| RegistryError::Signature {
            name: rec.name.clone(),
            why: e.to_string(),
        })?;
        let json = bundle.to_json_pretty().expect("a bundle serializes");
        let (rec, file) = self.attach(reference, &json)?;
        Ok((rec, file, json))
    }

    /// The bundles attached to `digest`, by file name.
    pub fn signatures(&self, digest: &str) -> Result<Vec<StoredBundle>, RegistryError> {
        let dir = self.root.join("signatures").join(Self::hex_of(digest));
        let mut out = Vec::new();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_err("read_dir", &dir)(e)),
        };
        for e in entries.flatten() {
            let file = e.file_name().to_string_lossy().to_string();
            if !file.ends_with(".sigstore.json") {
                continue;
            }
            let p = e.path();
            let text = fs::read_to_string(&p).map_err(io_err("read", &p))?;
            // A bundle that no longer parses is skipped, not fatal: it verifies nothing.
            if let Ok(bundle) = sigstore_verify::types::Bundle::from_json(&text) {
                out.push(StoredBundle { file, bundle });
            }
        }
        out.sort_by(|a, b| a.file.cmp(&b.file));
        Ok(out)
    }

    /// The record a reference (`NAME` or `NAME@sha256:<hex>`) names, without asking
    /// the trust policy (to sign, attach or print a template, never to run one).
    pub fn record(&self, reference: &str) -> Result<TemplateRecord, RegistryError> {
        let (name, pinned) = parse_reference(reference)?;
        let rec = self.get(name)?.ok_or_else(|| RegistryError::NotFound {
            reference: quote(reference),
        })?;
        if let Some(want) = pinned
            && want != rec.digest
        {
            // A digest the name named before, whose content is still here.
            if self.history(name).iter().any(|d| d == want) && self.content(want).is_dir() {
                return Ok(TemplateRecord {
                    digest: want.to_string(),
                    source: format!("{} (an earlier import of {name})", rec.source),
                    ..rec
                });
            }
            return Err(RegistryError::DigestMismatch {
                name: name.to_string(),
                wanted: want.to_string(),
                actual: rec.digest,
            });
        }
        Ok(rec)
    }

    /// Checks the template `reference` names against `policy` for `who` (what
    /// `tessera template verify` does with a policy file): the rules that applied and
    /// the signers that satisfied them.
    pub fn verify(
        &self,
        policy: &TrustPolicy,
        reference: &str,
        who: &Subject<'_>,
    ) -> Result<(TemplateRecord, Admitted), RegistryError> {
        let rec = self.record(reference)?;
        let ok = self.admit(policy, &rec, who)?;
        Ok((rec, ok))
    }

    /// Asks `policy` about the template `rec` records, with its stored manifest and
    /// the bundles attached to its digest.
    fn admit(
        &self,
        policy: &TrustPolicy,
        rec: &TemplateRecord,
        who: &Subject<'_>,
    ) -> Result<Admitted, RegistryError> {
        let manifest = self.manifest(&rec.digest)?;
        let bundles = self.signatures(&rec.digest)?;
        Ok(policy.check(
            &Candidate {
                name: &rec.name,
                digest: &rec.digest,
                manifest: Some(&manifest),
                bundles: &bundles,
            },
            who,
        )?)
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
    /// the sandbox template it names and its digest (`host` for the built-in one), after
    /// the trust policy admitted it for `who`.
    pub fn resolve(
        &self,
        reference: &str,
        who: &Subject<'_>,
    ) -> Result<(Template, String), RegistryError> {
        resolve_in(Some(self), reference, who)
    }
}

/// [`TemplateRegistry::resolve`] where there may be no registry (only `host` then, and
/// no trust policy: a server with a policy always has a registry).
pub fn resolve_in(
    registry: Option<&TemplateRegistry>,
    reference: &str,
    who: &Subject<'_>,
) -> Result<(Template, String), RegistryError> {
    let policy = registry.and_then(|r| r.policy());
    if reference == HOST_TEMPLATE || reference == "base" {
        if let Some(p) = policy
            && p.applies(HOST_TEMPLATE, who)
        {
            p.check(
                &Candidate {
                    name: HOST_TEMPLATE,
                    digest: HOST_TEMPLATE,
                    manifest: None,
                    bundles: &[],
                },
                who,
            )?;
        }
        return Ok((Template::Host, HOST_TEMPLATE.to_string()));
    }
    let not_found = || RegistryError::NotFound {
        reference: quote(reference),
    };
    parse_reference(reference)?;
    let reg = registry.ok_or_else(not_found)?;
    let rec = reg.record(reference)?;
    let dir = reg.content(&rec.digest);
    if !dir.is_dir() {
        return Err(not_found());
    }
    if let Some(p) = policy
        && p.applies(&rec.name, who)
    {
        reg.admit(p, &rec, who)?;
    }
    Ok((Template::Dir(dir), rec.digest))
}

/// Writes `data` to `path` through a private temporary file and one `rename`.
fn write_atomic(path: &Path, data: &[u8]) -> Result<(), RegistryError> {
    let tmp = path.with_extension(format!("tmp.{}", nonce()));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    let res = f
        .write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(io_err("write", &tmp))
        .and_then(|()| fs::rename(&tmp, path).map_err(io_err("rename", path)));
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

fn digest_of(manifest: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(manifest)))
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
    let (m, files, bytes) = manifest_tree(dir)?;
    Ok((digest_of(&m), files, bytes))
}

/// The manifest of the tree at `dir` (see the module docs), its file count and bytes.
pub fn manifest_tree(dir: &Path) -> Result<(Vec<u8>, u64, u64), RegistryError> {
    let mut manifest = Vec::new();
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
        manifest.extend_from_slice(line.as_bytes());
    }
    Ok((manifest, files, bytes))
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

use crate::identity::hex;

#[cfg(test)]
mod tests {
    use super::*;

    const WHO: Subject<'static> = Subject {
        tenant: "acme",
        runtime_class: "standard",
    };

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
        let (tpl, d) = reg.resolve("tools", &WHO).unwrap();
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
        assert!(reg.resolve(&format!("tools@{}", a.digest), &WHO).is_ok());
        let wrong = format!("tools@sha256:{}", "0".repeat(64));
        assert!(matches!(
            reg.resolve(&wrong, &WHO),
            Err(RegistryError::DigestMismatch { .. })
        ));
        // A change to the source changes the digest of a new import, not the old one.
        fs::write(src.join("etc/hostname"), b"u\n").unwrap();
        let c = reg.import_dir("tools", &src).unwrap();
        assert_ne!(c.digest, a.digest);
        // A reference pinned to the old digest still names the old content.
        let (_, d) = reg.resolve(&format!("tools@{}", a.digest), &WHO).unwrap();
        assert_eq!(d, a.digest);
        // A digest the name never named is refused, even if stored under another name.
        let other = reg.import_dir("other", &src).unwrap();
        assert!(
            reg.resolve(&format!("tools-copy@{}", other.digest), &WHO)
                .is_err()
        );
        assert!(reg.resolve("tools-copy", &WHO).is_ok());
    }

    #[test]
    fn the_policy_is_applied_on_every_resolve() {
        use crate::trust::{KeyKind, generate_key};
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        tree(&src);
        let (private, public) = generate_key(KeyKind::P256).unwrap();
        fs::write(t.path().join("release.pub"), &public).unwrap();
        let policy = TrustPolicy::parse(
            "trust.yaml",
            "signers: {release: {key: release.pub}}\n\
             rules: [{name: signed, runtime_classes: [standard], require_signed: true}]\n",
            t.path(),
        )
        .unwrap();
        let plain = TemplateRegistry::open(t.path().join("reg")).unwrap();
        let rec = plain.import_dir("tools", &src).unwrap();
        // The manifest is what the digest is over.
        let m = plain.manifest(&rec.digest).unwrap();
        assert_eq!(digest_of(&m), rec.digest);
        let reg = plain.clone().with_policy(Some(Arc::new(policy)));

        // Unsigned: refused, naming the template, its digest and the rule.
        let e = reg.resolve("tools", &WHO).unwrap_err().to_string();
        assert!(e.contains("\"tools\"") && e.contains(&rec.digest), "{e}");
        assert!(e.contains("\"signed\"") && e.contains("not signed"), "{e}");
        // The built-in host template cannot satisfy it either.
        let e = reg.resolve("host", &WHO).unwrap_err().to_string();
        assert!(e.contains("cannot be signed"), "{e}");
        // Another class: the rule does not apply.
        assert!(reg.resolve("tools", &Subject::new("acme", "gpu")).is_ok());
        // Without the policy the same registry resolves it.
        assert!(plain.resolve("tools", &WHO).is_ok());

        // A bundle for another digest is not attached.
        let key = SigningKey::from_pem(&private).unwrap();
        let other = key.sign(b"another tree").unwrap().to_json().unwrap();
        let e = reg.attach("tools", &other).unwrap_err().to_string();
        assert!(e.contains("not this template's"), "{e}");
        assert!(reg.attach("tools", "{}").is_err());

        // Signed: admitted.
        let (_, file, _) = reg.sign("tools", &key).unwrap();
        assert!(file.ends_with(".sigstore.json"));
        let (_, d) = reg.resolve("tools", &WHO).unwrap();
        assert_eq!(d, rec.digest);
        // Re-pointing the name at a changed tree loses the signature.
        fs::write(src.join("etc/hostname"), b"changed\n").unwrap();
        let changed = reg.import_dir("tools", &src).unwrap();
        let e = reg.resolve("tools", &WHO).unwrap_err();
        assert!(matches!(e, RegistryError::Untrusted(ref t) if t.digest == changed.digest));
        // ... while the signed digest, pinned, still names the signed content.
        let (Template::Dir(old), d) = reg.resolve(&format!("tools@{}", rec.digest), &WHO).unwrap()
        else {
            panic!()
        };
        assert_eq!(d, rec.digest);
        assert_ne!(fs::read(old.join("etc/hostname")).unwrap(), b"changed\n");

        // A manifest lost (a registry from before manifests were kept) is made again.
        fs::remove_file(reg.root().join("manifests").join(&changed.digest[7..])).unwrap();
        assert_eq!(
            digest_of(&reg.manifest(&changed.digest).unwrap()),
            changed.digest
        );
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
            match reg.resolve(bad, &WHO) {
                Err(RegistryError::BadReference { .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(matches!(
            reg.resolve("missing", &WHO),
            Err(RegistryError::NotFound { .. })
        ));
        let e = reg.resolve("/", &WHO).unwrap_err().to_string();
        assert!(e.contains("never a host path"), "{e}");
        assert_eq!(reg.resolve("host", &WHO).unwrap().0, Template::Host);
        assert_eq!(resolve_in(None, "base", &WHO).unwrap().0, Template::Host);
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
