//! The `microvm` tier: each sandbox is a QEMU `microvm` guest with its own kernel.
//!
//! Host side ([`MicroVmTier`], [`VmSandbox`]): QEMU with a minimal machine (no PCI, no
//! network device, no firmware beyond qboot): the kernel and initramfs of a kernel
//! template, the template's root as a read-only virtio-blk disk, a virtio-serial port
//! for the control channel ([`wire`]) and a QMP monitor, both over socket pairs passed
//! in; KVM when QEMU can run a guest with it here, TCG otherwise (chosen once, when the
//! tier starts, and reported in [`TierInfo`]). QEMU runs jailed ([`qemu`]) in a cgroup
//! with the VM's limits.
//!
//! Guest side ([`guest`]): the init program as PID 1, running the namespace tier inside
//! the guest. The guard stays on the host: commands and file operations are checked
//! before they are sent, every `execve` in the guest is judged by the host's guard, and
//! output is redacted on the host. Egress ([`crate::Network::Proxy`]) has no network device
//! either: the guest relays its sandbox's proxy connections over the control channel
//! and the host's proxy serves them with the sandbox's policy ([`egress`]).
//!
//! Snapshots: the guest's memory and device state through QEMU's migration to a file
//! descriptor (`vm.state`), with hard links (or copies) of the kernel, initramfs and
//! root disk it ran from, so that a snapshot is whole on its own and restores on another
//! node. The writable folders live in the guest's memory, so they come back with it.

mod closure;
mod egress;
pub mod guest;
pub mod image;
pub mod qemu;
mod sandbox;
pub mod wire;

pub use closure::{HOST_CLOSURE_PROGRAMS, host_closure, host_closure_cached};
pub use sandbox::{BootTimes, VmSandbox};
use sandbox::{Machine, Shared, log_tail};

use crate::cgroup::CgroupManager;
use crate::error::{LifecycleError, SpawnError};
use crate::guard::{CommandCheck, PolicyGuard};
use crate::sandbox::InitProgram;
use crate::snapshot::Snapshot;
use crate::spec::{SandboxSpec, Template};
use crate::tier::{Isolated, Tier, TierInfo, TierKind};
use image::KernelTemplate;
use qemu::{Accel, JailConfig, Qmp};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};
use std::time::{Duration, Instant};
use wire::{Call, Msg};

/// Which accelerator to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccelChoice {
    /// KVM when QEMU can run a guest with it here, else TCG.
    #[default]
    Auto,
    Kvm,
    Tcg,
}

/// How a [`MicroVmTier`] is set up.
#[derive(Clone)]
pub struct MicroVmConfig {
    /// The QEMU binary; `None`: `qemu-system-x86_64` from `PATH`.
    pub qemu: Option<PathBuf>,
    /// A kernel template folder ([`image::build_kernel_template`]).
    pub kernel: PathBuf,
    /// Where root disks and initramfs images are kept (made 0711; images 0644, named
    /// by content).
    pub cache: PathBuf,
    /// The init program, which is also the guest's agent; `None`: [`InitProgram::locate`].
    pub init: Option<InitProgram>,
    pub accel: AccelChoice,
    /// The host's guard, as for [`crate::RuntimeConfig::guard`].
    pub guard: Arc<dyn CommandCheck>,
    pub tenant: Option<String>,
    /// Put each QEMU in a cgroup with the VM's limits (root only).
    pub cgroups: bool,
    /// The unprivileged uid and gid QEMU runs as (when the supervisor is root).
    pub jail_uid: u32,
    pub jail_gid: u32,
    /// Guest memory beyond the sandbox's memory limit (guest kernel, agent, page cache).
    pub guest_overhead_bytes: u64,
    /// How long a boot (or a restore) may take before it is given up.
    pub boot_timeout: Duration,
    pub vcpus: u32,
}

impl std::fmt::Debug for MicroVmConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicroVmConfig")
            .field("qemu", &self.qemu)
            .field("kernel", &self.kernel)
            .field("cache", &self.cache)
            .field("accel", &self.accel)
            .field("cgroups", &self.cgroups)
            .finish()
    }
}

/// Default uid and gid of QEMU processes: just below the sandboxes' id range, owning
/// no file.
pub const JAIL_ID: u32 = crate::sandbox::HOST_ID_BASE - 1;

impl MicroVmConfig {
    /// Defaults around a kernel template and a cache folder.
    pub fn new(kernel: impl Into<PathBuf>, cache: impl Into<PathBuf>) -> Self {
        MicroVmConfig {
            qemu: None,
            kernel: kernel.into(),
            cache: cache.into(),
            init: None,
            accel: AccelChoice::Auto,
            guard: Arc::new(PolicyGuard::default()),
            tenant: None,
            cgroups: true,
            jail_uid: JAIL_ID,
            jail_gid: JAIL_ID,
            guest_overhead_bytes: 192 << 20,
            boot_timeout: Duration::from_secs(180),
            vcpus: 1,
        }
    }
}

fn vm_err(e: impl std::fmt::Display) -> SpawnError {
    SpawnError::Vm(e.to_string())
}

/// A file of the cache, named by its content: path, SHA-256, bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Blob {
    path: PathBuf,
    sha256: String,
    bytes: u64,
}

/// The micro-VM tier.
pub struct MicroVmTier {
    me: std::sync::Weak<MicroVmTier>,
    cfg: MicroVmConfig,
    qemu: PathBuf,
    qemu_version: String,
    kernel: KernelTemplate,
    vmlinuz: Blob,
    initrd: Blob,
    accel: Accel,
    /// Why not KVM (when TCG).
    accel_note: String,
    cgroups: Option<Arc<dyn CgroupManager>>,
    root: bool,
    /// Root disks by template folder.
    images: Mutex<BTreeMap<PathBuf, Blob>>,
}

impl std::fmt::Debug for MicroVmTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicroVmTier")
            .field("qemu", &self.qemu_version)
            .field("kernel", &self.kernel.info.version)
            .field("accel", &self.accel)
            .finish()
    }
}

/// `qemu-system-x86_64` on `PATH`, the QEMU the tier runs when none is configured.
pub fn find_qemu() -> Option<PathBuf> {
    which("qemu-system-x86_64")
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|c| c.is_file())
    })
}

fn mkdir_cache(p: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(p)?;
    fs::set_permissions(p, fs::Permissions::from_mode(0o711))
}

/// Hard-links `src` to `dst`, or copies it where a link is not possible.
fn link_or_copy(src: &Path, dst: &Path) -> io::Result<()> {
    match fs::hard_link(src, dst) {
        Ok(()) => Ok(()),
        Err(_) => fs::copy(src, dst).map(drop),
    }
}

/// Moves a finished temporary file into the cache as `dst`, unless another build got
/// there first (a cached file never changes once there: snapshots name it).
fn publish(tmp: &Path, dst: &Path) -> io::Result<()> {
    let r = match fs::hard_link(tmp, dst) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    };
    let _ = fs::remove_file(tmp);
    r
}

fn blob_of(path: &Path) -> io::Result<Blob> {
    let md = fs::metadata(path)?;
    let sha = image::file_sha256(path).map_err(io::Error::other)?;
    Ok(Blob {
        path: path.to_path_buf(),
        sha256: sha,
        bytes: md.len(),
    })
}

impl MicroVmTier {
    /// Starts the tier: finds QEMU, reads the kernel template, builds (or finds in the
    /// cache) the initramfs with this build's agent, and chooses KVM or TCG.
    pub fn new(cfg: MicroVmConfig) -> Result<Arc<MicroVmTier>, SpawnError> {
        let qemu = match &cfg.qemu {
            Some(q) => q.clone(),
            None => find_qemu().ok_or_else(|| {
                vm_err(
                    "qemu-system-x86_64 is not installed (Debian: apt-get install qemu-system-x86)",
                )
            })?,
        };
        let qemu_version = qemu::version(&qemu).map_err(vm_err)?;
        let kernel = KernelTemplate::open(&cfg.kernel).map_err(vm_err)?;
        let init = cfg
            .init
            .clone()
            .or_else(InitProgram::locate)
            .ok_or_else(|| {
                vm_err(
                    "the init program (the guest's agent) was not found; set TESSERA_SANDBOX_INIT",
                )
            })?;
        if !init.args.is_empty() {
            return Err(vm_err(format!(
                "the guest's agent must be the tessera-sandbox-init program itself, not {} with arguments",
                init.path.display()
            )));
        }
        mkdir_cache(&cfg.cache).map_err(|e| vm_err(format!("{}: {e}", cfg.cache.display())))?;
        let cerr = |e: io::Error| vm_err(format!("cache {}: {e}", cfg.cache.display()));
        // The kernel, by content.
        let ksha = image::file_sha256(&kernel.vmlinuz()).map_err(vm_err)?;
        let kpath = cfg.cache.join(format!("vmlinuz-{}", &ksha[..16]));
        if !kpath.exists() {
            let tmp = kpath.with_extension(format!("tmp-{}", crate::registry::nonce()));
            fs::copy(kernel.vmlinuz(), &tmp).map_err(cerr)?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)).map_err(cerr)?;
            publish(&tmp, &kpath).map_err(cerr)?;
        }
        let vmlinuz = blob_of(&kpath).map_err(cerr)?;
        // The initramfs: the kernel template's modules, then this build's agent.
        let modules = fs::read(kernel.modules_cpio()).map_err(cerr)?;
        let agent = image::agent_cpio(&init.path).map_err(vm_err)?;
        let mut both = modules;
        both.extend_from_slice(&agent);
        let isha = crate::identity::hex(&<sha2::Sha256 as sha2::Digest>::digest(&both));
        let ipath = cfg.cache.join(format!("initrd-{}.img", &isha[..16]));
        if !ipath.exists() {
            let tmp = ipath.with_extension(format!("tmp-{}", crate::registry::nonce()));
            fs::write(&tmp, &both).map_err(cerr)?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)).map_err(cerr)?;
            publish(&tmp, &ipath).map_err(cerr)?;
        }
        let initrd = Blob {
            path: ipath,
            sha256: isha,
            bytes: both.len() as u64,
        };
        let (accel, accel_note) = match cfg.accel {
            AccelChoice::Tcg => (Accel::Tcg, "TCG chosen by configuration".to_string()),
            AccelChoice::Kvm => match qemu::probe_kvm(&qemu) {
                Ok(()) => (Accel::Kvm, String::new()),
                Err(e) => {
                    return Err(vm_err(format!(
                        "KVM was asked for but cannot run a guest here: {e}"
                    )));
                }
            },
            AccelChoice::Auto => match qemu::probe_kvm(&qemu) {
                Ok(()) => (Accel::Kvm, String::new()),
                Err(e) => (
                    Accel::Tcg,
                    format!("TCG because KVM cannot run a guest here ({e})"),
                ),
            },
        };
        let root = nix::unistd::geteuid().is_root();
        let cgroups: Option<Arc<dyn CgroupManager>> = if cfg.cgroups && root {
            crate::cgroup::detect().map(Arc::from)
        } else {
            None
        };
        if let Some(c) = &cgroups {
            c.remove_stale();
        }
        Ok(Arc::new_cyclic(|me| MicroVmTier {
            me: me.clone(),
            cfg,
            qemu,
            qemu_version,
            kernel,
            vmlinuz,
            initrd,
            accel,
            accel_note,
            cgroups,
            root,
            images: Mutex::new(BTreeMap::new()),
        }))
    }

    /// KVM or TCG, as chosen at start.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// The guest kernel's version.
    pub fn kernel_version(&self) -> &str {
        &self.kernel.info.version
    }

    /// The root disk of `template` (built into the cache on first use).
    fn root_disk(&self, template: &Template) -> Result<Blob, SpawnError> {
        let dir = match template {
            Template::Dir(p) => p.clone(),
            Template::Host => closure::host_closure_cached(&self.cfg.cache)
                .map_err(|e| vm_err(format!("the host template for micro-VMs: {e}")))?,
        };
        if let Some(b) = self
            .images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&dir)
        {
            return Ok(b.clone());
        }
        // A registered template's folder is named by its digest; anything else is
        // digested (once per process).
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let digest = if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            name
        } else {
            let (d, _, _) = crate::registry::digest_tree(&dir)
                .map_err(|e| vm_err(format!("template {}: {e}", dir.display())))?;
            d.trim_start_matches("sha256:").to_string()
        };
        let img = self.cfg.cache.join(format!("root-{}.ext4", &digest[..32]));
        if !img.exists() {
            let tmp = img.with_extension(format!("tmp-{}", crate::registry::nonce()));
            image::ext4_image(&dir, &tmp).map_err(vm_err)?;
            publish(&tmp, &img).map_err(|e| vm_err(format!("{}: {e}", img.display())))?;
        }
        let md = fs::metadata(&img).map_err(|e| vm_err(format!("{}: {e}", img.display())))?;
        let b = Blob {
            path: img,
            sha256: format!("tree:{digest}"),
            bytes: md.len(),
        };
        self.images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(dir, b.clone());
        Ok(b)
    }

    fn machine_for(&self, spec: &SandboxSpec, disk: Blob) -> Machine {
        let mem = spec.limits.memory_bytes.unwrap_or(512 << 20) + self.cfg.guest_overhead_bytes;
        Machine {
            memory_mib: mem.div_ceil(1 << 20),
            vcpus: self.cfg.vcpus.max(1),
            accel: self.accel,
            kernel: self.vmlinuz.clone(),
            initrd: self.initrd.clone(),
            disk,
            tsc_khz: qemu::host_tsc_khz(),
        }
    }

    /// A name no other VM of this process has, whichever tier made it: two tiers in
    /// one process (a server's classes, a test's guards) share the cgroup tree.
    fn next_id(&self) -> String {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        format!(
            "vm-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn jail(&self, m: &Machine, extra_read: &[PathBuf]) -> Option<JailConfig> {
        if !self.root {
            return None;
        }
        let mut read = vec![self.cfg.cache.clone(), self.cfg.kernel.clone()];
        for b in [&m.kernel, &m.initrd, &m.disk] {
            if let Some(p) = b.path.parent() {
                read.push(p.to_path_buf());
            }
        }
        read.extend(extra_read.iter().cloned());
        let (devices, groups) = if m.accel == Accel::Kvm {
            let gid = fs::metadata("/dev/kvm").map(|m| m.gid()).unwrap_or(0);
            (vec![PathBuf::from("/dev/kvm")], vec![gid])
        } else {
            (Vec::new(), Vec::new())
        };
        Some(JailConfig {
            uid: self.cfg.jail_uid,
            gid: self.cfg.jail_gid,
            read,
            devices,
            groups,
        })
    }

    /// Starts QEMU for `m` (fresh, or from `incoming`), waits for the agent, and
    /// returns the running VM.
    fn start(
        &self,
        id: String,
        spec: &SandboxSpec,
        m: Machine,
        incoming: Option<(fs::File, &Path)>,
    ) -> Result<VmSandbox, SpawnError> {
        if !spec.sealed.is_empty() {
            return Err(vm_err(
                "sealed folders (released model weights) are not built for the microvm tier yet; the guest would need its own memory-backed folder",
            ));
        }
        let tier = self.me.upgrade().ok_or_else(|| vm_err("tier dropped"))?;
        let run = self.cfg.cache.join("run");
        mkdir_cache(&run).map_err(|e| vm_err(format!("{}: {e}", run.display())))?;
        let log_path = run.join(format!("{id}.log"));
        let log = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&log_path)
            .map_err(|e| vm_err(format!("{}: {e}", log_path.display())))?;
        let log2 = log.try_clone().map_err(vm_err)?;
        let (ctl, ctl_q) = UnixStream::pair().map_err(vm_err)?;
        let (qmp, qmp_q) = UnixStream::pair().map_err(vm_err)?;
        let open = |b: &Blob| {
            fs::File::open(&b.path).map_err(|e| vm_err(format!("{}: {e}", b.path.display())))
        };
        let (k, i, d) = (open(&m.kernel)?, open(&m.initrd)?, open(&m.disk)?);
        let mut fds: Vec<(OwnedFd, i32)> = vec![
            (ctl_q.into(), 3),
            (qmp_q.into(), 4),
            (k.into(), 6),
            (i.into(), 7),
            (d.into(), 8),
            (log2.into(), 1),
        ];
        let extra: Vec<PathBuf> = match &incoming {
            Some((_, dir)) => vec![dir.to_path_buf()],
            None => Vec::new(),
        };
        let restoring = incoming.is_some();
        if let Some((f, _)) = incoming {
            fds.push((f.into(), 5));
        }
        let args = m.args(restoring);
        let jail = self.jail(&m, &extra);
        let started = Instant::now();
        let (mut child, _report) = qemu::spawn(&self.qemu, &args, fds, log, jail.as_ref())
            .map_err(|e| vm_err(format!("starting {}: {e}", self.qemu.display())))?;
        let pid = child.id() as i32;
        let fail = |child: &mut Child, what: String| {
            let _ = child.kill();
            let _ = child.wait();
            let tail = log_tail(&log_path);
            vm_err(format!("{what}{tail}"))
        };
        let limits = crate::spec::Limits {
            memory_bytes: Some(
                (m.memory_mib << 20)
                    + match m.accel {
                        Accel::Tcg => 384 << 20,
                        Accel::Kvm => 128 << 20,
                    },
            ),
            cpu_millis: spec.limits.cpu_millis.map(|c| c.max(1000 * m.vcpus)),
            pids: Some(256),
            disk_bytes: spec.limits.disk_bytes,
        };
        let cgroup = match &self.cgroups {
            Some(mgr) => match mgr.create(&format!("sb-{id}"), &limits) {
                Ok(c) => {
                    if let Err(e) = c.attach(pid) {
                        let _ = c.destroy();
                        return Err(fail(&mut child, format!("cgroup: {e}")));
                    }
                    Some(c)
                }
                Err(e) => return Err(fail(&mut child, format!("cgroup: {e}"))),
            },
            None => None,
        };
        let cleanup = |child: &mut Child, what: String| {
            let e = fail(child, what);
            if let Some(c) = &cgroup {
                let _ = c.destroy();
            }
            e
        };
        let mut q = match Qmp::connect(qmp, Duration::from_secs(60)) {
            Ok(q) => q,
            Err(e) => return Err(cleanup(&mut child, e)),
        };
        if restoring {
            // The state streams in before the machine may run.
            let deadline = Instant::now() + self.cfg.boot_timeout;
            loop {
                match q.status() {
                    Ok(s) if s == "inmigrate" => {}
                    Ok(s) if s == "paused" || s == "prelaunch" => break,
                    Ok(s) => {
                        return Err(cleanup(&mut child, format!("restoring: the VM is {s:?}")));
                    }
                    Err(e) => return Err(cleanup(&mut child, format!("restoring: {e}"))),
                }
                if Instant::now() > deadline {
                    return Err(cleanup(&mut child, "restoring: timed out".into()));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if let Err(e) = q.call("cont", Value::Null) {
            return Err(cleanup(&mut child, e));
        }
        let shared = Arc::new(Shared {
            tx: Mutex::new(ctl.try_clone().map_err(vm_err)?),
            calls: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            guard: self.cfg.guard.clone(),
            tenant: RwLock::new(self.cfg.tenant.clone()),
            quiet: Mutex::new(None),
            dead: AtomicBool::new(false),
            egress: egress::HostEgress::new(spec),
        });
        let mut rd = ctl;
        let _ = rd.set_read_timeout(Some(self.cfg.boot_timeout));
        let mut eff = spec.clone();
        eff.extra_rules
            .extend(self.cfg.guard.landlock_rules(self.cfg.tenant.as_deref()));
        let (kernel, guest_ms) = if restoring {
            // The agent is where the snapshot left it: one round trip proves it is.
            let (tx, rx) = mpsc::channel();
            shared
                .calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(0, tx);
            if let Err(e) = shared.send(
                &Msg::Call {
                    id: 0,
                    call: Call::Ping,
                },
                &[],
            ) {
                return Err(cleanup(&mut child, format!("restoring: {e}")));
            }
            match wire::read_msg(&mut rd) {
                Ok(Some((
                    Msg::Reply {
                        id: 0,
                        result: Ok(_),
                    },
                    _,
                ))) => {}
                other => {
                    return Err(cleanup(
                        &mut child,
                        format!("restoring: the agent did not answer ({other:?})"),
                    ));
                }
            }
            drop(rx);
            shared
                .calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&0);
            (String::new(), 0)
        } else {
            let hello = Msg::Hello {
                version: wire::VERSION,
                spec: eff,
                checks_exec: self.cfg.guard.checks_exec(),
            };
            if let Err(e) = shared.send(&hello, &[]) {
                return Err(cleanup(&mut child, format!("hello: {e}")));
            }
            match wire::read_msg(&mut rd) {
                Ok(Some((
                    Msg::Ready {
                        version,
                        kernel,
                        uptime_ms,
                    },
                    _,
                ))) if version == wire::VERSION => (kernel, uptime_ms),
                Ok(Some((Msg::SetupFailed { error }, _))) => {
                    return Err(cleanup(
                        &mut child,
                        format!("the guest could not make its sandbox: {error}"),
                    ));
                }
                other => {
                    let what = match other {
                        Err(e)
                            if e.kind() == io::ErrorKind::WouldBlock
                                || e.kind() == io::ErrorKind::TimedOut =>
                        {
                            format!(
                                "the guest did not come up within {:?}",
                                self.cfg.boot_timeout
                            )
                        }
                        Ok(None) => "QEMU exited during boot".to_string(),
                        other => format!("unexpected first message from the guest: {other:?}"),
                    };
                    return Err(cleanup(&mut child, what));
                }
            }
        };
        let _ = rd.set_read_timeout(None);
        q.set_timeout(Duration::from_secs(60));
        let reader = {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("vm-{id}"))
                .spawn(move || s.read_loop(rd))
                .map_err(vm_err)?
        };
        let kernel = if kernel.is_empty() {
            self.kernel.info.version.clone()
        } else {
            kernel
        };
        Ok(VmSandbox {
            id,
            spec: spec.clone(),
            tenant: self.cfg.tenant.clone(),
            tier,
            shared,
            child: Mutex::new(Some(child)),
            pid,
            qmp: Mutex::new(q),
            cgroup,
            frozen: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
            machine: m,
            kernel,
            boot: BootTimes {
                host_ms: started.elapsed().as_secs_f64() * 1000.0,
                guest_ms,
            },
            log: log_path,
            _reader: reader,
        })
    }

    /// Boots a VM of `spec` (the concrete type; [`Tier::spawn`] boxes it).
    pub fn spawn_vm(&self, spec: &SandboxSpec) -> Result<VmSandbox, SpawnError> {
        let disk = self.root_disk(&spec.template)?;
        let m = self.machine_for(spec, disk);
        self.start(self.next_id(), spec, m, None)
    }
}

impl Tier for MicroVmTier {
    fn kind(&self) -> TierKind {
        TierKind::Microvm
    }
    fn info(&self) -> TierInfo {
        let mut detail = format!(
            "{}; guest kernel {}; cgroups {}",
            self.qemu_version,
            self.kernel.info.version,
            self.cgroups.as_ref().map(|c| c.version()).unwrap_or("off")
        );
        if !self.accel_note.is_empty() {
            detail.push_str("; ");
            detail.push_str(&self.accel_note);
        }
        TierInfo {
            kind: TierKind::Microvm,
            accel: Some(self.accel.as_str().to_string()),
            detail,
        }
    }
    fn spawn(&self, spec: &SandboxSpec) -> Result<Box<dyn Isolated>, SpawnError> {
        Ok(Box::new(self.spawn_vm(spec)?))
    }
    fn restore(
        &self,
        snapshot: &Snapshot,
        spec: &SandboxSpec,
    ) -> Result<Box<dyn Isolated>, LifecycleError> {
        let dir = &snapshot.dir;
        let mut m: Machine = serde_json::from_value(snapshot.meta.tier_data["machine"].clone())
            .map_err(|e| LifecycleError::snapshot(dir, format!("machine: {e}")))?;
        if m.accel != self.accel {
            return Err(LifecycleError::snapshot(
                dir,
                format!(
                    "taken under {}, and this node runs guests under {}: a VM's CPU state does not move between them",
                    m.accel.as_str(),
                    self.accel.as_str()
                ),
            ));
        }
        // Its own copies of what it ran from, checked by size (the cache names them
        // by content; the memory state itself was checked against its SHA-256).
        for (b, name) in [
            (&mut m.kernel, "vmlinuz"),
            (&mut m.initrd, "initrd.img"),
            (&mut m.disk, "root.ext4"),
        ] {
            let p = dir.join(name);
            let len = fs::metadata(&p)
                .map(|md| md.len())
                .map_err(|e| LifecycleError::snapshot(&p, e))?;
            if len != b.bytes {
                return Err(LifecycleError::snapshot(
                    &p,
                    format!("{len} bytes, the snapshot ran from {} bytes", b.bytes),
                ));
            }
            b.path = p;
        }
        let state = dir.join("vm.state");
        let f = fs::File::open(&state).map_err(|e| LifecycleError::snapshot(&state, e))?;
        let vm = self.start(snapshot.meta.id.clone(), spec, m, Some((f, dir)))?;
        Ok(Box::new(vm))
    }
}
