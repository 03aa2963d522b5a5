//! What a micro-VM boots from, built on the host and cached by content:
//!
//! - a *kernel template* ([`build_kernel_template`]): a folder with the guest kernel
//!   (`vmlinuz`), the virtio modules it needs as an initramfs part
//!   (`modules.cpio.gz`: `tessera/modules/*.ko` and their load order) and
//!   `kernel.json`; made from Debian's kernel package (`linux-image-*-cloud-amd64`,
//!   the `.deb` or the folder `dpkg-deb -x` made of it) and registered like any
//!   template (`tessera template build --kernel …`);
//! - the *agent* initramfs part ([`agent_cpio`]): the init program (this crate's
//!   `tessera-sandbox-init`) as `/init` with the shared libraries it loads, made from
//!   the running build so that host and agent always speak the same protocol;
//! - a *root disk* per template ([`base_image`]): an ext4 image of the template's
//!   folder (`mkfs.ext4 -d`, no mount and no root needed), attached read-only.
//!
//! The initramfs the VM boots is the two parts concatenated (the kernel reads
//! concatenated cpio archives, each compressed on its own).

use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The modules a guest needs beyond what the kernel has built in: the virtio-mmio
/// transport, the root disk and the control port. Their dependencies are added.
pub const GUEST_MODULES: &[&str] = &["virtio_mmio", "virtio_blk", "virtio_console"];

/// Building an image failed; the message names the file or tool and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("{tool}: {message}")]
    Tool { tool: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

fn ferr(path: &Path) -> impl FnOnce(io::Error) -> ImageError + '_ {
    move |e| ImageError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// `kernel.json` of a kernel template.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelInfo {
    /// `uname -r` of the guest (`6.1.0-57-cloud-amd64`).
    pub version: String,
    /// Modules in load order.
    pub modules: Vec<String>,
    /// Where it was built from, for people.
    pub source: String,
}

/// A kernel template folder (`vmlinuz`, `modules.cpio.gz`, `kernel.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTemplate {
    pub dir: PathBuf,
    pub info: KernelInfo,
}

impl KernelTemplate {
    /// Reads the kernel template at `dir` (checks its three files are there).
    pub fn open(dir: &Path) -> Result<KernelTemplate, ImageError> {
        let j = dir.join("kernel.json");
        let text = fs::read(&j).map_err(|e| ImageError::File {
            path: j.display().to_string(),
            message: format!(
                "{e}: not a kernel template (build one with `tessera template build --kernel linux-image-….deb DIR`)"
            ),
        })?;
        let info: KernelInfo = serde_json::from_slice(&text).map_err(|e| ImageError::File {
            path: j.display().to_string(),
            message: e.to_string(),
        })?;
        for f in ["vmlinuz", "modules.cpio.gz"] {
            let p = dir.join(f);
            if !p.is_file() {
                return Err(ImageError::File {
                    path: p.display().to_string(),
                    message: "missing from the kernel template".into(),
                });
            }
        }
        Ok(KernelTemplate {
            dir: dir.to_path_buf(),
            info,
        })
    }
    pub fn vmlinuz(&self) -> PathBuf {
        self.dir.join("vmlinuz")
    }
    pub fn modules_cpio(&self) -> PathBuf {
        self.dir.join("modules.cpio.gz")
    }
}

// ------------------------------------------------------------------ cpio (newc)

/// Writes a `newc` cpio archive (what the kernel unpacks as initramfs).
pub struct Cpio {
    out: Vec<u8>,
    ino: u32,
    dirs: BTreeSet<String>,
}

impl Default for Cpio {
    fn default() -> Self {
        Self::new()
    }
}

impl Cpio {
    pub fn new() -> Self {
        Cpio {
            out: Vec::new(),
            ino: 1,
            dirs: BTreeSet::new(),
        }
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        let name = name.trim_start_matches('/');
        let hdr = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.ino += 1;
        self.out.extend_from_slice(hdr.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
        self.out.extend_from_slice(data);
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    /// Adds `dir` and its parents (once each).
    pub fn dir(&mut self, dir: &str) {
        let dir = dir.trim_matches('/');
        let mut at = String::new();
        for part in dir.split('/').filter(|p| !p.is_empty()) {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            if self.dirs.insert(at.clone()) {
                let a = at.clone();
                self.entry(&a, 0o040755, &[]);
            }
        }
    }

    fn parent(&mut self, path: &str) {
        if let Some((p, _)) = path.trim_start_matches('/').rsplit_once('/') {
            let p = p.to_string();
            self.dir(&p);
        }
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        self.parent(path);
        self.entry(path, 0o100000 | (mode & 0o7777), data);
    }

    pub fn symlink(&mut self, path: &str, target: &str) {
        self.parent(path);
        self.entry(path, 0o120777, target.as_bytes());
    }

    /// The archive, trailer included, gzip-compressed.
    pub fn finish_gz(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&self.out).expect("writing to memory");
        gz.finish().expect("writing to memory")
    }
}

// ------------------------------------------------------------------ kernel template

/// The `key=value` strings of a module file's `.modinfo` section.
fn modinfo(ko: &[u8], key: &str) -> Vec<String> {
    let pat = format!("{key}=");
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = find(&ko[i..], pat.as_bytes()) {
        let at = i + off;
        if at == 0 || ko[at - 1] == 0 {
            let start = at + pat.len();
            let end = ko[start..]
                .iter()
                .position(|&b| b == 0)
                .map(|e| start + e)
                .unwrap_or(ko.len());
            out.push(String::from_utf8_lossy(&ko[start..end]).into_owned());
        }
        i = at + pat.len();
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Runs `dpkg-deb -x` on a `.deb`, into `dest`.
fn extract_deb(deb: &Path, dest: &Path) -> Result<(), ImageError> {
    let out = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(dest)
        .output()
        .map_err(|e| ImageError::Tool {
            tool: "dpkg-deb".into(),
            message: format!(
                "{e}: install dpkg, or extract the package yourself (`dpkg-deb -x {} DIR`) and give DIR",
                deb.display()
            ),
        })?;
    if !out.status.success() {
        return Err(ImageError::Tool {
            tool: "dpkg-deb".into(),
            message: format!(
                "-x {}: {}",
                deb.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}

/// The kernel template of `src` (as [`build_kernel_template`] takes it) under
/// `cache/kernel`, built there the first time (into a folder of its own, then moved
/// into place, so a half-built template is never used): the test suites' shared one.
pub fn cached_kernel_template(src: &Path, cache: &Path) -> Result<PathBuf, ImageError> {
    let ktpl = cache.join("kernel");
    if !ktpl.join("kernel.json").exists() {
        fs::create_dir_all(cache).map_err(ferr(cache))?;
        let tmp = cache.join(format!("kernel-tmp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        build_kernel_template(src, &tmp)?;
        let _ = fs::remove_dir_all(&ktpl);
        fs::rename(&tmp, &ktpl).map_err(ferr(&ktpl))?;
    }
    Ok(ktpl)
}

/// Builds a kernel template into `out` (made; must not exist, or be empty) from `src`: a kernel
/// package (`.deb`, extracted with `dpkg-deb -x`) or a folder holding one extracted
/// (`boot/vmlinuz-*`, `lib/modules/<version>/`).
pub fn build_kernel_template(src: &Path, out: &Path) -> Result<KernelTemplate, ImageError> {
    if fs::read_dir(out).is_ok_and(|mut d| d.next().is_some()) {
        return Err(ImageError::File {
            path: out.display().to_string(),
            message: "already holds files: give a new (or empty) folder for the kernel template"
                .into(),
        });
    }
    let tmp;
    let root: PathBuf = if src.is_file() {
        tmp = tempdir_near(out)?;
        extract_deb(src, &tmp.0)?;
        tmp.0.clone()
    } else if src.is_dir() {
        src.to_path_buf()
    } else {
        return Err(ImageError::File {
            path: src.display().to_string(),
            message: "neither a kernel package (.deb) nor a folder extracted from one".into(),
        });
    };
    let boot = root.join("boot");
    let mut kernels: Vec<PathBuf> = fs::read_dir(&boot)
        .map_err(ferr(&boot))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .collect();
    kernels.sort();
    let vmlinuz = match kernels.as_slice() {
        [one] => one.clone(),
        [] => {
            return Err(ImageError::File {
                path: boot.display().to_string(),
                message: "no vmlinuz-* here: is this a linux-image package?".into(),
            });
        }
        many => {
            return Err(ImageError::File {
                path: boot.display().to_string(),
                message: format!("{} kernels here; give a package with one", many.len()),
            });
        }
    };
    let version = vmlinuz
        .file_name()
        .expect("has a name")
        .to_string_lossy()
        .trim_start_matches("vmlinuz-")
        .to_string();
    let mdir = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| root.join(d).join(&version))
        .find(|d| d.is_dir())
        .ok_or_else(|| ImageError::File {
            path: root
                .join("lib/modules")
                .join(&version)
                .display()
                .to_string(),
            message: "the kernel's modules are not in the package".into(),
        })?;
    // Every module file by name (`virtio-blk` and `virtio_blk` are one name).
    let mut by_name: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut stack = vec![mdir.join("kernel")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(ferr(&d))?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(n) = p.file_name().and_then(|n| n.to_str())
                && let Some(stem) = n.strip_suffix(".ko")
            {
                by_name.insert(stem.replace('-', "_"), p.clone());
            }
        }
    }
    let builtin: BTreeSet<String> = fs::read_to_string(mdir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next()?.strip_suffix(".ko"))
        .map(|s| s.replace('-', "_"))
        .collect();
    // Depth-first: dependencies before the modules that need them.
    let mut order: Vec<String> = Vec::new();
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    fn visit(
        name: &str,
        by_name: &BTreeMap<String, PathBuf>,
        builtin: &BTreeSet<String>,
        order: &mut Vec<String>,
        files: &mut BTreeMap<String, Vec<u8>>,
        depth: usize,
    ) -> Result<(), ImageError> {
        if order.iter().any(|o| o == name) || builtin.contains(name) {
            return Ok(());
        }
        if depth > 32 {
            return Err(ImageError::Invalid(format!(
                "module dependencies loop at {name}"
            )));
        }
        let p = by_name.get(name).ok_or_else(|| {
            ImageError::Invalid(format!(
                "the kernel has no module {name} and does not build it in: a micro-VM needs it (virtio)"
            ))
        })?;
        let data = fs::read(p).map_err(ferr(p))?;
        if p.extension().is_some_and(|e| e != "ko") {
            return Err(ImageError::File {
                path: p.display().to_string(),
                message: "compressed modules are not supported".into(),
            });
        }
        for deps in modinfo(&data, "depends") {
            for d in deps.split(',').filter(|d| !d.is_empty()) {
                visit(
                    &d.replace('-', "_"),
                    by_name,
                    builtin,
                    order,
                    files,
                    depth + 1,
                )?;
            }
        }
        order.push(name.to_string());
        files.insert(name.to_string(), data);
        Ok(())
    }
    for m in GUEST_MODULES {
        visit(m, &by_name, &builtin, &mut order, &mut files, 0)?;
    }
    let mut cpio = Cpio::new();
    for name in &order {
        cpio.file(&format!("tessera/modules/{name}.ko"), 0o644, &files[name]);
    }
    cpio.file("tessera/modules/order", 0o644, order.join("\n").as_bytes());
    fs::create_dir_all(out).map_err(ferr(out))?;
    fs::copy(&vmlinuz, out.join("vmlinuz")).map_err(ferr(&vmlinuz))?;
    fs::write(out.join("modules.cpio.gz"), cpio.finish_gz()).map_err(ferr(out))?;
    let info = KernelInfo {
        version,
        modules: order,
        source: src.display().to_string(),
    };
    let j = out.join("kernel.json");
    fs::write(
        &j,
        serde_json::to_vec_pretty(&info).expect("info serializes"),
    )
    .map_err(ferr(&j))?;
    for f in ["vmlinuz", "modules.cpio.gz", "kernel.json"] {
        let _ = fs::set_permissions(out.join(f), fs::Permissions::from_mode(0o644));
    }
    Ok(KernelTemplate {
        dir: out.to_path_buf(),
        info,
    })
}

/// A temporary folder beside `near` (removed on drop).
struct TmpDir(PathBuf);
impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn tempdir_near(near: &Path) -> Result<TmpDir, ImageError> {
    let parent = near
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(ferr(parent))?;
    let p = parent.join(format!(".tessera-tmp-{}", crate::registry::nonce()));
    fs::create_dir(&p).map_err(ferr(&p))?;
    Ok(TmpDir(p))
}

// ------------------------------------------------------------------ the agent

/// The shared libraries `bin` loads (`ldd`), with the program interpreter. Empty for a
/// static binary.
pub fn shared_libs(bin: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .map_err(|e| ImageError::Tool {
            tool: "ldd".into(),
            message: format!("{e} (Debian's libc-bin has it)"),
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for l in text.lines() {
        let l = l.trim();
        let path = match l.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => l.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// SHA-256 (hex) of a file.
pub fn file_sha256(p: &Path) -> Result<String, ImageError> {
    let data = fs::read(p).map_err(ferr(p))?;
    Ok(crate::identity::hex(&Sha256::digest(&data)))
}

/// The agent's initramfs part: `init` as `/init` with its shared libraries (at the
/// paths `ldd` names), and the folders the agent mounts on.
pub fn agent_cpio(init: &Path) -> Result<Vec<u8>, ImageError> {
    let mut c = Cpio::new();
    let data = fs::read(init).map_err(ferr(init))?;
    c.file("init", 0o755, &data);
    for lib in shared_libs(init)? {
        let real = fs::canonicalize(&lib).map_err(ferr(&lib))?;
        let bytes = fs::read(&real).map_err(ferr(&real))?;
        let s = lib.to_string_lossy().into_owned();
        c.file(&s, 0o755, &bytes);
        // The loader also searches the multiarch folders under /usr.
        if let Some(rest) = s.strip_prefix("/lib/") {
            c.file(&format!("/usr/lib/{rest}"), 0o755, &bytes);
        }
    }
    for d in ["proc", "sys", "dev", "tmp", "run", "mnt/root", "etc"] {
        c.dir(d);
    }
    Ok(c.finish_gz())
}

// ------------------------------------------------------------------ root disks

/// Bytes and entries under `dir` (not following links).
fn tree_size(dir: &Path) -> Result<(u64, u64), ImageError> {
    let (mut bytes, mut n) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(ferr(&d))?.flatten() {
            let md = fs::symlink_metadata(e.path()).map_err(ferr(&e.path()))?;
            n += 1;
            bytes += md.blocks() * 512;
            if md.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok((bytes, n))
}

/// Writes an ext4 image of the folder `dir` to `out` (`mkfs.ext4 -d`: owners, modes and
/// links as they are in the folder; no journal, since the guest mounts it read-only).
pub fn ext4_image(dir: &Path, out: &Path) -> Result<(), ImageError> {
    let (bytes, entries) = tree_size(dir)?;
    let size_kib = (bytes / 1024) * 5 / 4 + 32 * 1024;
    let inodes = entries + entries / 4 + 1024;
    let tmp = out.with_extension(format!("tmp-{}", crate::registry::nonce()));
    let o = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-t", "ext4", "-O", "^has_journal", "-b", "4096"])
        .args(["-E", "root_owner=0:0", "-L", "tessera-root"])
        .arg("-N")
        .arg(inodes.to_string())
        .arg("-d")
        .arg(dir)
        .arg(&tmp)
        .arg(format!("{size_kib}k"))
        .output()
        .map_err(|e| ImageError::Tool {
            tool: "mkfs.ext4".into(),
            message: format!("{e}: install e2fsprogs (1.43 or later)"),
        })?;
    if !o.status.success() {
        let _ = fs::remove_file(&tmp);
        return Err(ImageError::Tool {
            tool: "mkfs.ext4".into(),
            message: format!(
                "-d {}: {}",
                dir.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ),
        });
    }
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)).map_err(ferr(&tmp))?;
    fs::rename(&tmp, out).map_err(ferr(out))
}
