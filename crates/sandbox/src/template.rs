//! Templates: root file systems for [`crate::Template::Dir`], made from an OCI image
//! layout (`index.json` → manifest → layers, each a tar, gzip-compressed or not, with
//! whiteouts) or by `debootstrap`.
//!
//! Unpacking runs on the host, as the supervisor, so a layer is hostile input: every
//! entry is checked before anything is written, and nothing is ever written, removed or
//! linked through a symlink. Rejected, with the layer and entry named:
//! - paths with `..` (climbing out of the root);
//! - symlinks whose target climbs above the image's root (relative or absolute:
//!   `../../../etc/shadow`, `/../../host`); absolute targets that stay inside are fine,
//!   since they are resolved inside the sandbox after `pivot_root`;
//! - hard links to anything but a regular file already in the image;
//! - device nodes and FIFOs (a sandbox gets its own minimal `/dev`);
//! - blobs whose size or sha256 digest differs from their descriptor, and digests that
//!   are not `sha256:<64 hex>` (a digest names a file under `blobs/`);
//! - more than `max_bytes` unpacked in total (a decompression bomb).
//!
//! setuid and setgid bits are dropped (sandboxes mount everything `nosuid` anyway).
//! When unpacking as root, owners are mapped into the sandboxes' id range
//! ([`crate::sandbox::HOST_ID_BASE`] + id), so that the image's root owns its files
//! inside a sandbox and nothing is owned by the host's root.

use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Unpacking or building a template failed.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: io::Error,
    },
    #[error("{path}: {message}")]
    Format { path: String, message: String },
    #[error("blob {digest}: {message}")]
    Blob { digest: String, message: String },
    #[error("layer {layer}, entry {entry:?}: {why}; the layer is rejected")]
    Rejected {
        layer: String,
        entry: String,
        why: String,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("{tool}: {message}")]
    Tool { tool: String, message: String },
}

pub(crate) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> TemplateError + 'a {
    move |source| TemplateError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

/// How to unpack an OCI layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciOptions {
    /// Which image of the layout: matched against the `org.opencontainers.image.ref.name`
    /// annotation (a tag such as `latest`). `None`: the only image, or the one for this
    /// machine's platform.
    pub reference: Option<String>,
    /// Most bytes the layers may unpack to, in total.
    pub max_bytes: u64,
    /// Map file owners to this base (`Some(HOST_ID_BASE)` when root); `None` keeps the
    /// unpacking user as owner.
    pub owner_base: Option<u32>,
}

impl Default for OciOptions {
    fn default() -> Self {
        let root = nix::unistd::geteuid().is_root();
        OciOptions {
            reference: None,
            max_bytes: 16 << 30,
            owner_base: root.then_some(crate::sandbox::HOST_ID_BASE),
        }
    }
}

/// What was unpacked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OciImage {
    pub manifest_digest: String,
    pub layers: usize,
    /// Bytes of file content written.
    pub bytes: u64,
    /// The image config's `Env` (`KEY=VALUE`), for the sandbox spec's env.
    pub env: Vec<String>,
    /// The image config's `WorkingDir`, if any.
    pub working_dir: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Debug, Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Debug, Deserialize, Default)]
struct ImageConfig {
    #[serde(default)]
    config: Option<RunConfig>,
}

#[derive(Debug, Deserialize, Default)]
struct RunConfig {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
}

const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// The path of a blob, after checking its digest is `sha256:<64 lowercase hex>`.
fn blob_path(layout: &Path, digest: &str) -> Result<PathBuf, TemplateError> {
    let bad = |m: &str| TemplateError::Blob {
        digest: digest.to_string(),
        message: m.to_string(),
    };
    let (alg, hex) = digest
        .split_once(':')
        .ok_or_else(|| bad("not ALGORITHM:HEX"))?;
    if alg != "sha256" {
        return Err(bad("only sha256 digests are supported"));
    }
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(bad("the digest is not 64 lowercase hex digits"));
    }
    Ok(layout.join("blobs").join(alg).join(hex))
}

/// Reads a whole blob (small JSON ones), checking size and digest.
fn read_blob(layout: &Path, d: &Descriptor) -> Result<Vec<u8>, TemplateError> {
    let p = blob_path(layout, &d.digest)?;
    if d.size > 64 << 20 {
        return Err(TemplateError::Blob {
            digest: d.digest.clone(),
            message: format!("{} bytes is too large for a JSON document", d.size),
        });
    }
    let data = fs::read(&p).map_err(io_err("read", &p))?;
    check_blob(d, data.len() as u64, &Sha256::digest(&data))?;
    Ok(data)
}

fn check_blob(d: &Descriptor, size: u64, sum: &[u8]) -> Result<(), TemplateError> {
    if size != d.size {
        return Err(TemplateError::Blob {
            digest: d.digest.clone(),
            message: format!("size {size}, descriptor says {}", d.size),
        });
    }
    let got: String = sum.iter().map(|b| format!("{b:02x}")).collect();
    if d.digest != format!("sha256:{got}") {
        return Err(TemplateError::Blob {
            digest: d.digest.clone(),
            message: format!("content has digest sha256:{got}"),
        });
    }
    Ok(())
}

fn parse_json<T: for<'de> Deserialize<'de>>(what: &str, data: &[u8]) -> Result<T, TemplateError> {
    serde_json::from_slice(data).map_err(|e| TemplateError::Format {
        path: what.to_string(),
        message: e.to_string(),
    })
}

fn this_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Picks the image from an index: by reference, else the only one, else this platform's.
fn pick<'a>(
    list: &'a [Descriptor],
    reference: Option<&str>,
    where_: &str,
) -> Result<&'a Descriptor, TemplateError> {
    if let Some(r) = reference {
        let hit = list.iter().find(|d| {
            d.annotations
                .get("org.opencontainers.image.ref.name")
                .is_some_and(|n| n == r)
        });
        if let Some(d) = hit {
            return Ok(d);
        }
        if list.iter().all(|d| d.platform.is_some()) {
            // A nested platform index: the reference was matched one level up.
        } else {
            let names: Vec<&str> = list
                .iter()
                .filter_map(|d| d.annotations.get("org.opencontainers.image.ref.name"))
                .map(String::as_str)
                .collect();
            return Err(TemplateError::Format {
                path: where_.to_string(),
                message: format!("no image named {r:?}; the layout has {names:?}"),
            });
        }
    }
    if list.len() == 1 {
        return Ok(&list[0]);
    }
    list.iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == this_arch())
        })
        .ok_or_else(|| TemplateError::Format {
            path: where_.to_string(),
            message: format!(
                "{} images and none for linux/{}; name one with a reference",
                list.len(),
                this_arch()
            ),
        })
}

/// Unpacks the image of an OCI image layout directory into `dest` (created; must be
/// empty if it exists), ready for [`crate::Template::Dir`].
pub fn unpack_oci_layout(
    layout: &Path,
    dest: &Path,
    opts: &OciOptions,
) -> Result<OciImage, TemplateError> {
    let index_path = layout.join("index.json");
    let data = fs::read(&index_path).map_err(io_err("read", &index_path))?;
    let mut index: Index = parse_json(&index_path.display().to_string(), &data)?;
    let mut reference = opts.reference.as_deref();
    let manifest_desc = loop {
        let d = pick(&index.manifests, reference, "index.json")?;
        if INDEX_TYPES.contains(&d.media_type.as_str()) {
            let data = read_blob(layout, d)?;
            index = parse_json(&d.digest, &data)?;
            reference = None;
            continue;
        }
        break Descriptor {
            media_type: d.media_type.clone(),
            digest: d.digest.clone(),
            size: d.size,
            annotations: BTreeMap::new(),
            platform: None,
        };
    };
    let manifest: Manifest =
        parse_json(&manifest_desc.digest, &read_blob(layout, &manifest_desc)?)?;
    let config: ImageConfig = match read_blob(layout, &manifest.config) {
        Ok(d) => serde_json::from_slice(&d).unwrap_or_default(),
        Err(e) => return Err(e),
    };
    prepare_dest(dest)?;
    let mut out = OciImage {
        manifest_digest: manifest_desc.digest.clone(),
        layers: manifest.layers.len(),
        ..Default::default()
    };
    for layer in &manifest.layers {
        let gz = match layer.media_type.as_str() {
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip" => true,
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar" => false,
            other => {
                return Err(TemplateError::Unsupported(format!(
                    "layer {}: media type {other:?} (tar and tar+gzip are supported; \
                     re-export the image without zstd)",
                    layer.digest
                )));
            }
        };
        let path = blob_path(layout, &layer.digest)?;
        // Check the whole blob before trusting a byte of it.
        let mut f = fs::File::open(&path).map_err(io_err("open", &path))?;
        let mut h = Sha256::new();
        let n = io::copy(&mut f, &mut h).map_err(io_err("read", &path))?;
        check_blob(layer, n, &h.finalize())?;
        let open = || -> Result<Box<dyn Read>, TemplateError> {
            let f = fs::File::open(&path).map_err(io_err("open", &path))?;
            let r = io::BufReader::new(f);
            Ok(if gz {
                Box::new(flate2::read::GzDecoder::new(r))
            } else {
                Box::new(r)
            })
        };
        let budget = opts.max_bytes.saturating_sub(out.bytes);
        out.bytes += apply_layer(&layer.digest, open, dest, opts.owner_base, budget)?;
    }
    if let Some(c) = config.config {
        out.env = c.env.unwrap_or_default();
        out.working_dir = c.working_dir.filter(|w| !w.is_empty());
    }
    Ok(out)
}

fn prepare_dest(dest: &Path) -> Result<(), TemplateError> {
    match fs::read_dir(dest) {
        Ok(mut rd) => {
            if rd.next().is_some() {
                return Err(TemplateError::Format {
                    path: dest.display().to_string(),
                    message: "the destination is not empty; give a new directory".into(),
                });
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dest).map_err(io_err("mkdir", dest))?;
        }
        Err(e) => return Err(io_err("read_dir", dest)(e)),
    }
    fs::set_permissions(dest, fs::Permissions::from_mode(0o755)).map_err(io_err("chmod", dest))
}

/// An entry's path inside the image as clean components; `Err` for `..` and the like.
fn clean(p: &Path) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => match n.to_str() {
                Some(s) => out.push(s.to_string()),
                None => return Err("the path is not UTF-8".into()),
            },
            Component::ParentDir => return Err("the path contains `..`".into()),
            Component::Prefix(_) => return Err("the path has a prefix".into()),
        }
    }
    Ok(out)
}

/// Does a symlink at `at` (components) with `target` stay inside the root, resolved
/// lexically (absolute targets from the root, relative ones from the link's folder)?
fn symlink_stays_inside(at: &[String], target: &Path) -> bool {
    let mut cur: Vec<&str> = if target.is_absolute() {
        Vec::new()
    } else {
        at[..at.len().saturating_sub(1)]
            .iter()
            .map(String::as_str)
            .collect()
    };
    for c in target.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => cur.push(n.to_str().unwrap_or("?")),
            Component::ParentDir => {
                if cur.pop().is_none() {
                    return false;
                }
            }
            Component::Prefix(_) => return false,
        }
    }
    true
}

/// The real directory `dest/comps...`, never passing through a symlink; with
/// `create`, missing directories are made (mode 0755).
fn real_dir(dest: &Path, comps: &[String], create: bool) -> Result<Option<PathBuf>, String> {
    let mut p = dest.to_path_buf();
    for c in comps {
        p.push(c);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "{} is a symlink; nothing is written through one",
                    comps.join("/")
                ));
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{c} is in the path but not a directory")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Ok(None);
                }
                fs::create_dir(&p).map_err(|e| format!("mkdir {}: {e}", p.display()))?;
                let _ = fs::set_permissions(&p, fs::Permissions::from_mode(0o755));
            }
            Err(e) => return Err(format!("lstat {}: {e}", p.display())),
        }
    }
    Ok(Some(p))
}

/// Removes `p` (not following a symlink; a directory with its contents).
fn remove_any(p: &Path) -> io::Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(p),
        Ok(_) => fs::remove_file(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Applies one layer: its whiteouts first (they hide what lower layers made), then its
/// entries. Returns the bytes of file content written.
fn apply_layer(
    layer: &str,
    open: impl Fn() -> Result<Box<dyn Read>, TemplateError>,
    dest: &Path,
    owner_base: Option<u32>,
    budget: u64,
) -> Result<u64, TemplateError> {
    let reject = |entry: &str, why: String| TemplateError::Rejected {
        layer: layer.to_string(),
        entry: entry.to_string(),
        why,
    };
    let tar_err = |e: io::Error| TemplateError::Format {
        path: format!("layer {layer}"),
        message: format!("not a valid tar archive: {e}"),
    };
    // Pass 1: whiteouts.
    let mut a = tar::Archive::new(open()?);
    for e in a.entries().map_err(tar_err)? {
        let e = e.map_err(tar_err)?;
        let raw = e.path().map_err(tar_err)?.into_owned();
        let name = raw.display().to_string();
        let comps = clean(&raw).map_err(|w| reject(&name, w))?;
        let Some(base) = comps.last() else { continue };
        let Some(hidden) = base.strip_prefix(".wh.") else {
            continue;
        };
        let parent = &comps[..comps.len() - 1];
        let Some(dir) = real_dir(dest, parent, false).map_err(|w| reject(&name, w))? else {
            continue;
        };
        if hidden == ".wh..opq" {
            // Opaque: nothing of the lower layers stays in this folder.
            for c in fs::read_dir(&dir)
                .map_err(io_err("read_dir", &dir))?
                .flatten()
            {
                remove_any(&c.path()).map_err(io_err("remove", &c.path()))?;
            }
        } else {
            if hidden.is_empty() || hidden.starts_with(".wh.") {
                return Err(reject(&name, "malformed whiteout".into()));
            }
            let p = dir.join(hidden);
            remove_any(&p).map_err(io_err("remove", &p))?;
        }
    }
    // Pass 2: entries.
    let mut written = 0u64;
    let mut a = tar::Archive::new(open()?);
    for e in a.entries().map_err(tar_err)? {
        let mut e = e.map_err(tar_err)?;
        let raw = e.path().map_err(tar_err)?.into_owned();
        let name = raw.display().to_string();
        let comps = clean(&raw).map_err(|w| reject(&name, w))?;
        let Some(base) = comps.last().cloned() else {
            continue; // the root itself
        };
        if base.starts_with(".wh.") {
            continue;
        }
        let h = e.header();
        let kind = h.entry_type();
        let mode = h.mode().map_err(tar_err)? & 0o1777; // no setuid/setgid
        let (uid, gid) = (h.uid().unwrap_or(0), h.gid().unwrap_or(0));
        let parent = real_dir(dest, &comps[..comps.len() - 1], true)
            .map_err(|w| reject(&name, w))?
            .expect("created");
        let target = parent.join(&base);
        use tar::EntryType as T;
        let existing = fs::symlink_metadata(&target).ok();
        match kind {
            T::Directory => {
                match &existing {
                    Some(m) if m.is_dir() => {}
                    Some(_) => {
                        remove_any(&target).map_err(io_err("remove", &target))?;
                        fs::create_dir(&target).map_err(io_err("mkdir", &target))?;
                    }
                    None => fs::create_dir(&target).map_err(io_err("mkdir", &target))?,
                }
                fs::set_permissions(&target, fs::Permissions::from_mode(mode))
                    .map_err(io_err("chmod", &target))?;
            }
            T::Regular | T::Continuous => {
                if existing.is_some() {
                    remove_any(&target).map_err(io_err("remove", &target))?;
                }
                let size = h.size().map_err(tar_err)?;
                if written.saturating_add(size) > budget {
                    return Err(reject(
                        &name,
                        format!("the image unpacks to more than {budget} bytes"),
                    ));
                }
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&target)
                    .map_err(io_err("create", &target))?;
                written +=
                    io::copy(&mut (&mut e).take(size), &mut f).map_err(io_err("write", &target))?;
                fs::set_permissions(&target, fs::Permissions::from_mode(mode))
                    .map_err(io_err("chmod", &target))?;
            }
            T::Symlink => {
                let link = e
                    .link_name()
                    .map_err(tar_err)?
                    .ok_or_else(|| reject(&name, "symlink without a target".into()))?
                    .into_owned();
                if !symlink_stays_inside(&comps, &link) {
                    return Err(reject(
                        &name,
                        format!(
                            "symlink to {} climbs out of the image's root",
                            link.display()
                        ),
                    ));
                }
                if existing.is_some() {
                    remove_any(&target).map_err(io_err("remove", &target))?;
                }
                std::os::unix::fs::symlink(&link, &target).map_err(io_err("symlink", &target))?;
            }
            T::Link => {
                let link = e
                    .link_name()
                    .map_err(tar_err)?
                    .ok_or_else(|| reject(&name, "hard link without a target".into()))?
                    .into_owned();
                let lc = clean(&link).map_err(|w| reject(&name, format!("hard link: {w}")))?;
                let Some(lbase) = lc.last() else {
                    return Err(reject(&name, "hard link to the root".into()));
                };
                let src = real_dir(dest, &lc[..lc.len() - 1], false)
                    .map_err(|w| reject(&name, w))?
                    .map(|d| d.join(lbase));
                let ok = src
                    .as_ref()
                    .and_then(|s| fs::symlink_metadata(s).ok())
                    .is_some_and(|m| m.file_type().is_file());
                let Some(src) = src.filter(|_| ok) else {
                    return Err(reject(
                        &name,
                        format!(
                            "hard link to {}, which is not a regular file of the image",
                            link.display()
                        ),
                    ));
                };
                if existing.is_some() {
                    remove_any(&target).map_err(io_err("remove", &target))?;
                }
                fs::hard_link(&src, &target).map_err(io_err("link", &target))?;
                continue; // owner and mode are the source's
            }
            T::Char | T::Block | T::Fifo => {
                return Err(reject(
                    &name,
                    "device nodes and FIFOs are not allowed in templates".into(),
                ));
            }
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink => continue,
            other => {
                return Err(reject(&name, format!("unsupported entry type {other:?}")));
            }
        }
        if let Some(b) = owner_base {
            let map = |id: u64| {
                u32::try_from(id)
                    .ok()
                    .filter(|i| *i < crate::sandbox::HOST_ID_COUNT)
                    .map(|i| b + i)
            };
            if let (Some(u), Some(g)) = (map(uid), map(gid)) {
                std::os::unix::fs::lchown(&target, Some(u), Some(g))
                    .map_err(io_err("chown", &target))?;
                if kind != T::Symlink {
                    // chown clears setuid bits, not the mode; set it again anyway.
                    let _ = fs::set_permissions(&target, fs::Permissions::from_mode(mode));
                }
            }
        }
    }
    Ok(written)
}

/// Checks that `dir` can serve as a [`crate::Template::Dir`]: a directory with a
/// shell at `bin/sh` (possibly through the usual `bin -> usr/bin` link).
pub fn check_dir(dir: &Path) -> Result<(), TemplateError> {
    let m = fs::metadata(dir).map_err(io_err("stat", dir))?;
    if !m.is_dir() {
        return Err(TemplateError::Format {
            path: dir.display().to_string(),
            message: "not a directory".into(),
        });
    }
    let sh = ["bin/sh", "usr/bin/sh"]
        .iter()
        .any(|p| fs::symlink_metadata(dir.join(p)).is_ok());
    if !sh {
        return Err(TemplateError::Format {
            path: dir.display().to_string(),
            message: "has no bin/sh; commands and shell strings need one".into(),
        });
    }
    Ok(())
}

/// Builds a Debian-family root file system with `debootstrap --variant=minbase` into
/// `dest` (which must not exist or be empty). Needs root and the `debootstrap` tool.
pub fn debootstrap(suite: &str, dest: &Path, mirror: Option<&str>) -> Result<(), TemplateError> {
    if suite.is_empty()
        || !suite
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(TemplateError::Format {
            path: suite.to_string(),
            message: "a suite is a name like bookworm or trixie".into(),
        });
    }
    prepare_dest(dest)?;
    let mut cmd = std::process::Command::new("debootstrap");
    cmd.args(["--variant=minbase", suite]).arg(dest);
    if let Some(m) = mirror {
        cmd.arg(m);
    }
    let out = cmd.output().map_err(|e| TemplateError::Tool {
        tool: "debootstrap".into(),
        message: if e.kind() == io::ErrorKind::NotFound {
            "not installed (apt-get install debootstrap)".into()
        } else {
            e.to_string()
        },
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(TemplateError::Tool {
            tool: "debootstrap".into(),
            message: format!(
                "{}: {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ),
        });
    }
    check_dir(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_rejects_parent_components() {
        assert_eq!(
            clean(Path::new("./usr/bin/../x")),
            Err("the path contains `..`".into())
        );
        assert_eq!(clean(Path::new("/usr//bin/")).unwrap(), vec!["usr", "bin"]);
    }

    #[test]
    fn symlink_targets_are_resolved_lexically() {
        let at: Vec<String> = ["usr", "lib", "link"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(symlink_stays_inside(&at, Path::new("../../bin/sh")));
        assert!(!symlink_stays_inside(&at, Path::new("../../../etc/shadow")));
        assert!(symlink_stays_inside(&at, Path::new("/usr/bin/python3")));
        assert!(!symlink_stays_inside(&at, Path::new("/../../host")));
    }

    #[test]
    fn blob_digests_cannot_name_other_files() {
        let l = Path::new("/layout");
        assert!(blob_path(l, "sha256:../../etc/passwd").is_err());
        assert!(blob_path(l, "md5:abcd").is_err());
        assert!(blob_path(l, &format!("sha256:{}", "a".repeat(64))).is_ok());
    }

    proptest::proptest! {
        /// Whatever a lexically accepted symlink is, following it from its folder never
        /// climbs above the root.
        #[test]
        fn accepted_symlinks_stay_inside(depth in 0usize..4, ups in 0usize..6, abs in proptest::bool::ANY) {
            let at: Vec<String> = (0..=depth).map(|i| format!("d{i}")).collect();
            let mut t = String::from(if abs { "/" } else { "" });
            for _ in 0..ups { t.push_str("../"); }
            t.push('x');
            let ok = symlink_stays_inside(&at, Path::new(&t));
            let room = if abs { 0 } else { depth };
            proptest::prop_assert_eq!(ok, ups <= room);
        }
    }
}
