//! Isolation tiers behind one trait.
//!
//! A *tier* ([`Tier`]) makes sandboxes from a [`SandboxSpec`] and brings them back from
//! snapshots; a sandbox of any tier is an [`Isolated`]: exec with the guard, the files
//! API, freeze and thaw, snapshot, destroy, stats. Two tiers exist:
//!
//! - `namespace` ([`NamespaceTier`] over [`Runtime`], whose sandboxes are [`Sandbox`]):
//!   Linux namespaces, a cgroup, seccomp and Landlock on the host's kernel. Runs on every
//!   Linux host; starts in about a millisecond.
//! - `microvm` ([`crate::vm::MicroVmTier`]): a QEMU `microvm` guest with its own kernel,
//!   whose agent runs the same namespace sandbox inside the guest. A kernel boundary
//!   between tenant code and the host; slower to start.
//!
//! Whatever the tier, the guard is the host's: every command and file operation is
//! checked on the host before it reaches the sandbox, every `execve` inside is judged
//! by the host's guard (the micro-VM's agent asks over its control channel), and every
//! output is redacted on the host on its way out.
//!
//! [`AnySandbox`] is the tier-neutral handle callers hold: it counts operations in
//! flight, so that a pause to disk drains them first ([`AnySandbox::pause_to_disk`]),
//! and it can resume from a snapshot after the process that paused it is gone.

use crate::error::{ExecError, FileError, LifecycleError, SpawnError};
use crate::sandbox::{Runtime, Sandbox, Stream};
use crate::snapshot::{Snapshot, SnapshotMeta};
use crate::spec::{DirEntry, ExecOutput, ExecRequest, SandboxSpec};
use crate::tarball::{TarLimits, TarSummary};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Which isolation a sandbox has. Ordered by strength: `Namespace < Microvm`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum TierKind {
    /// Namespaces, cgroup, seccomp, Landlock on the host's kernel.
    #[default]
    Namespace,
    /// A micro-VM with its own kernel (QEMU `microvm`, KVM or TCG).
    Microvm,
}

impl TierKind {
    pub const ALL: [TierKind; 2] = [TierKind::Namespace, TierKind::Microvm];

    pub fn as_str(self) -> &'static str {
        match self {
            TierKind::Namespace => "namespace",
            TierKind::Microvm => "microvm",
        }
    }
}

impl std::fmt::Display for TierKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TierKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "namespace" => Ok(TierKind::Namespace),
            "microvm" => Ok(TierKind::Microvm),
            other => Err(format!(
                "unknown isolation tier {other:?}: the tiers are `namespace` and `microvm`"
            )),
        }
    }
}

/// What a tier says about itself (reported at start and by benchmarks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierInfo {
    pub kind: TierKind,
    /// How guests are run: `kvm` or `tcg` for the micro-VM tier; `None` otherwise.
    pub accel: Option<String>,
    /// One line for people (cgroup version, QEMU and kernel versions, why TCG).
    pub detail: String,
}

/// Resource use of one sandbox, as the host sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Memory charged to the sandbox's cgroup on the host (the QEMU process's, for a
    /// micro-VM: guest memory it touched plus QEMU's own).
    pub memory_bytes: Option<u64>,
    /// Resident memory of the sandbox's host process that is not the tenant's code:
    /// the init of a namespace sandbox, the QEMU process of a micro-VM.
    pub host_rss_bytes: Option<u64>,
    /// Processes in the sandbox's cgroup on the host.
    pub processes: Option<u32>,
}

/// The tier's own part of a snapshot: the files it wrote into the snapshot folder and
/// whatever it needs to read them back.
#[derive(Debug, Clone, Default)]
pub struct SnapshotParts {
    /// Names of the files written (relative to the folder).
    pub files: Vec<String>,
    pub tier_data: serde_json::Value,
}

/// An isolation tier: makes sandboxes and restores them from snapshots.
pub trait Tier: Send + Sync {
    fn kind(&self) -> TierKind;
    fn info(&self) -> TierInfo;
    /// Creates a sandbox from `spec`.
    fn spawn(&self, spec: &SandboxSpec) -> Result<Box<dyn Isolated>, SpawnError>;
    /// Creates a sandbox from a snapshot this tier wrote, with `spec` (the snapshot's,
    /// or the caller's where a template lives under another path on this node).
    fn restore(
        &self,
        snapshot: &Snapshot,
        spec: &SandboxSpec,
    ) -> Result<Box<dyn Isolated>, LifecycleError>;
}

/// One sandbox of some tier.
pub trait Isolated: Send + Sync + std::fmt::Debug {
    fn id(&self) -> &str;
    fn kind(&self) -> TierKind;
    fn spec(&self) -> &SandboxSpec;
    /// The host process that holds the sandbox: a namespace sandbox's init, a
    /// micro-VM's QEMU.
    fn host_pid(&self) -> i32;
    /// Checks this sandbox's commands and files as `tenant`'s.
    fn set_tenant(&mut self, tenant: Option<String>);
    fn tenant(&self) -> Option<&str>;
    /// Round trip to the sandbox's init (or the guest's agent).
    fn ping(&self) -> Result<(), ExecError>;
    /// Runs a command; the guard checks it first (see [`Sandbox::exec`]).
    fn exec(&self, req: &ExecRequest) -> Result<ExecOutput, ExecError>;
    /// Like `exec`, with output as it arrives, redacted as a stream.
    fn exec_streaming(
        &self,
        req: &ExecRequest,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<ExecOutput, ExecError>;
    fn read_file(&self, path: &str) -> Result<Vec<u8>, FileError>;
    fn write_file(&self, path: &str, data: &[u8]) -> Result<(), FileError>;
    fn list(&self, path: &str) -> Result<Vec<DirEntry>, FileError>;
    fn remove(&self, path: &str, recursive: bool) -> Result<(), FileError>;
    fn mkdir(&self, path: &str) -> Result<(), FileError>;
    fn upload_tar_with(
        &self,
        dir: &str,
        archive: &[u8],
        limits: &TarLimits,
    ) -> Result<TarSummary, FileError>;
    fn download_tar_with(&self, dir: &str, limits: &TarLimits) -> Result<Vec<u8>, FileError>;
    /// Stops every process where it is, in memory (cgroup freezer; a micro-VM's vCPUs).
    fn freeze(&self) -> Result<(), LifecycleError>;
    fn thaw(&self) -> Result<(), LifecycleError>;
    fn is_frozen(&self) -> bool;
    /// Ends every command running now (their calls return an error); the sandbox and
    /// its files stay.
    fn end_commands(&self);
    /// Sends `signal` to every process of the running commands (not to the sandbox's
    /// init); how many it reached, or 1 where the tier does not count them (a
    /// micro-VM's guest does the sending).
    fn signal_workload(&self, signal: nix::sys::signal::Signal) -> usize;
    /// Writes this sandbox's state into the empty folder `dir`. The caller has drained
    /// it (no operation in flight; [`AnySandbox`] does that); the sandbox goes on
    /// running afterwards.
    fn snapshot(&self, dir: &Path) -> Result<SnapshotParts, LifecycleError>;
    /// Kills everything and frees what the sandbox held. Idempotent.
    fn destroy(&self) -> Result<(), LifecycleError>;
    fn is_destroyed(&self) -> bool;
    fn stats(&self) -> Stats;
}

// ------------------------------------------------------------------ namespace tier

/// The namespace tier: [`Runtime`]'s sandboxes.
#[derive(Debug, Clone)]
pub struct NamespaceTier {
    rt: Arc<Runtime>,
}

impl NamespaceTier {
    pub fn new(rt: Arc<Runtime>) -> Self {
        NamespaceTier { rt }
    }
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }
}

/// The writable folders of a namespace sandbox, each its own tmpfs: what a snapshot of
/// this tier keeps.
pub const WRITABLE_DIRS: &[&str] = &["/tmp", "/home/user", "/workspace", "/dev/shm"];

fn layer_file(dir: &str) -> String {
    format!("layer{}.tar", dir.replace('/', "-").trim_end_matches('-'))
}

#[derive(Debug, Serialize, Deserialize)]
struct NamespaceLayer {
    dir: String,
    file: String,
}

impl Tier for NamespaceTier {
    fn kind(&self) -> TierKind {
        TierKind::Namespace
    }
    fn info(&self) -> TierInfo {
        TierInfo {
            kind: TierKind::Namespace,
            accel: None,
            detail: format!(
                "namespaces + seccomp + Landlock on the host kernel; cgroups {}",
                self.rt.cgroups().map(|c| c.version()).unwrap_or("off")
            ),
        }
    }
    fn spawn(&self, spec: &SandboxSpec) -> Result<Box<dyn Isolated>, SpawnError> {
        Ok(Box::new(self.rt.spawn(spec)?))
    }
    fn restore(
        &self,
        snapshot: &Snapshot,
        spec: &SandboxSpec,
    ) -> Result<Box<dyn Isolated>, LifecycleError> {
        let sb = self.rt.spawn(spec)?;
        NamespaceTier::restore_into(&sb, snapshot)?;
        Ok(Box::new(sb))
    }
}

impl NamespaceTier {
    /// Puts a namespace snapshot's writable folders into `sb`, a sandbox made
    /// elsewhere (claimed from a warm pool): what [`Tier::restore`] does after its
    /// spawn. Memory is not kept in this tier; the folders are.
    pub fn restore_into(sb: &Sandbox, snapshot: &Snapshot) -> Result<(), LifecycleError> {
        if snapshot.meta.tier != TierKind::Namespace {
            return Err(LifecycleError::snapshot(
                &snapshot.dir,
                format!(
                    "was taken by the {} tier, not namespace",
                    snapshot.meta.tier
                ),
            ));
        }
        let layers: Vec<NamespaceLayer> =
            serde_json::from_value(snapshot.meta.tier_data["layers"].clone())
                .map_err(|e| LifecycleError::snapshot(&snapshot.dir, format!("layers: {e}")))?;
        for l in &layers {
            let path = snapshot.dir.join(&l.file);
            let data = std::fs::read(&path).map_err(|e| LifecycleError::snapshot(&path, e))?;
            sb.platform_job(
                crate::proto::JobKind::Restore {
                    path: l.dir.clone(),
                    max_bytes: (data.len() as u64).max(1 << 20) * 2,
                },
                &l.dir,
                Some(&data),
            )?;
        }
        Ok(())
    }
}

impl Isolated for Sandbox {
    fn id(&self) -> &str {
        Sandbox::id(self)
    }
    fn kind(&self) -> TierKind {
        TierKind::Namespace
    }
    fn spec(&self) -> &SandboxSpec {
        Sandbox::spec(self)
    }
    fn host_pid(&self) -> i32 {
        self.pid()
    }
    fn set_tenant(&mut self, tenant: Option<String>) {
        Sandbox::set_tenant(self, tenant)
    }
    fn tenant(&self) -> Option<&str> {
        Sandbox::tenant(self)
    }
    fn ping(&self) -> Result<(), ExecError> {
        Sandbox::ping(self)
    }
    fn exec(&self, req: &ExecRequest) -> Result<ExecOutput, ExecError> {
        Sandbox::exec(self, req)
    }
    fn exec_streaming(
        &self,
        req: &ExecRequest,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<ExecOutput, ExecError> {
        Sandbox::exec_streaming(self, req, on_output)
    }
    fn read_file(&self, path: &str) -> Result<Vec<u8>, FileError> {
        Sandbox::read_file(self, path)
    }
    fn write_file(&self, path: &str, data: &[u8]) -> Result<(), FileError> {
        Sandbox::write_file(self, path, data)
    }
    fn list(&self, path: &str) -> Result<Vec<DirEntry>, FileError> {
        Sandbox::list(self, path)
    }
    fn remove(&self, path: &str, recursive: bool) -> Result<(), FileError> {
        Sandbox::remove(self, path, recursive)
    }
    fn mkdir(&self, path: &str) -> Result<(), FileError> {
        Sandbox::mkdir(self, path)
    }
    fn upload_tar_with(
        &self,
        dir: &str,
        archive: &[u8],
        limits: &TarLimits,
    ) -> Result<TarSummary, FileError> {
        Sandbox::upload_tar_with(self, dir, archive, limits)
    }
    fn download_tar_with(&self, dir: &str, limits: &TarLimits) -> Result<Vec<u8>, FileError> {
        Sandbox::download_tar_with(self, dir, limits)
    }
    fn freeze(&self) -> Result<(), LifecycleError> {
        Ok(self.pause()?)
    }
    fn thaw(&self) -> Result<(), LifecycleError> {
        Ok(self.resume()?)
    }
    fn is_frozen(&self) -> bool {
        self.is_paused()
    }
    fn end_commands(&self) {
        // Every process of the sandbox but its init (ours) descends from it: runners,
        // jobs, whatever they started. The host sees them all.
        crate::init::kill_tree(self.pid(), false);
    }
    fn signal_workload(&self, signal: nix::sys::signal::Signal) -> usize {
        Sandbox::signal_workload(self, signal)
    }
    fn snapshot(&self, dir: &Path) -> Result<SnapshotParts, LifecycleError> {
        // Each writable folder, packed by a job inside the sandbox (as its user, under
        // its Landlock rules: a hostile tree cannot make us read host files), kept
        // unredacted: it goes back into a sandbox, never out.
        let limits = TarLimits {
            max_archive_bytes: self.spec().limits.disk_bytes.saturating_mul(2) + (64 << 20),
            max_unpacked_bytes: u64::MAX,
            max_entries: u64::MAX,
        };
        let mut files = Vec::new();
        let mut layers = Vec::new();
        for d in WRITABLE_DIRS {
            let data = self.platform_job(
                crate::proto::JobKind::Pack {
                    path: d.to_string(),
                    limits,
                },
                d,
                None,
            )?;
            let name = layer_file(d);
            let path = dir.join(&name);
            crate::snapshot::write_durable(&path, &data)
                .map_err(|e| LifecycleError::snapshot(&path, e))?;
            files.push(name.clone());
            layers.push(NamespaceLayer {
                dir: d.to_string(),
                file: name,
            });
        }
        Ok(SnapshotParts {
            files,
            tier_data: serde_json::json!({
                "layers": layers,
                "memory": "not kept: processes are restarted, only the writable folders come back",
            }),
        })
    }
    fn destroy(&self) -> Result<(), LifecycleError> {
        Ok(Sandbox::destroy(self)?)
    }
    fn is_destroyed(&self) -> bool {
        Sandbox::is_destroyed(self)
    }
    fn stats(&self) -> Stats {
        Stats {
            memory_bytes: self.cgroup().and_then(|c| c.memory_current()),
            host_rss_bytes: self.init_rss_kib().map(|k| k * 1024),
            processes: self.cgroup().map(|c| c.procs().len() as u32),
        }
    }
}

// ------------------------------------------------------------------ the handle

/// Where an [`AnySandbox`] is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Running,
    /// Draining and writing its snapshot.
    Pausing,
    /// On disk only: no process, no memory held.
    Paused,
    /// Coming back from its snapshot.
    Resuming,
    Destroyed,
}

/// What a timeout does to an [`AnySandbox`] (E2B's `autoPause`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnTimeout {
    Destroy,
    /// Pause to this folder (see [`AnySandbox::pause_to_disk`]).
    PauseTo(PathBuf),
}

/// How a pause to disk treats work in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PauseOptions {
    /// File operations in flight always finish first. Commands still running after
    /// this long are ended (in every tier: a command's output does not survive a pause),
    /// and their calls answer [`ExecError::Paused`].
    pub drain: Duration,
}

impl Default for PauseOptions {
    fn default() -> Self {
        PauseOptions {
            drain: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Command,
    File,
}

struct St {
    phase: Phase,
    inner: Option<Arc<dyn Isolated>>,
    tenant: Option<String>,
    commands: usize,
    files: usize,
    /// Bumped whenever a pause ends running commands: a call that fails across a bump
    /// was ended by the pause.
    epoch: u64,
    /// Where the last snapshot is (while paused: where to resume from).
    snapshot: Option<PathBuf>,
    spec: SandboxSpec,
    /// Bumped on every `set_timeout`: an older timer does nothing.
    timer: u64,
}

/// A sandbox of any tier, with durable pause and resume. Operations in flight are
/// counted: a pause to disk lets file operations finish and commands drain (ending
/// those that outlive [`PauseOptions::drain`]), then writes the snapshot and frees the
/// sandbox. Resume brings it back from that snapshot, in this process or in another
/// one after a restart ([`AnySandbox::open_paused`]). A second pause or resume is a
/// no-op; an operation on a paused sandbox answers [`ExecError::Paused`].
pub struct AnySandbox {
    tier: Arc<dyn Tier>,
    id: String,
    kind: TierKind,
    st: Mutex<St>,
    cv: Condvar,
}

impl std::fmt::Debug for AnySandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnySandbox")
            .field("id", &self.id)
            .field("tier", &self.kind)
            .field("phase", &self.phase())
            .finish()
    }
}

/// Counts one operation in flight for as long as it lives.
struct InFlight<'a> {
    sb: &'a AnySandbox,
    op: Op,
    epoch: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut st = self.sb.lock();
        match self.op {
            Op::Command => st.commands -= 1,
            Op::File => st.files -= 1,
        }
        drop(st);
        self.sb.cv.notify_all();
    }
}

impl AnySandbox {
    /// Creates a sandbox of `tier` from `spec`.
    pub fn spawn(tier: Arc<dyn Tier>, spec: &SandboxSpec) -> Result<AnySandbox, SpawnError> {
        let inner = tier.spawn(spec)?;
        Ok(Self::wrap(tier, inner))
    }

    /// Wraps a sandbox the tier made; its id becomes the handle's for life (a resumed
    /// sandbox keeps it).
    pub fn wrap(tier: Arc<dyn Tier>, inner: Box<dyn Isolated>) -> AnySandbox {
        let id = inner.id().to_string();
        let kind = inner.kind();
        let spec = inner.spec().clone();
        let tenant = inner.tenant().map(str::to_string);
        AnySandbox {
            tier,
            id,
            kind,
            st: Mutex::new(St {
                phase: Phase::Running,
                inner: Some(Arc::from(inner)),
                tenant,
                commands: 0,
                files: 0,
                epoch: 0,
                snapshot: None,
                spec,
                timer: 0,
            }),
            cv: Condvar::new(),
        }
    }

    /// A paused sandbox from the snapshot at `dir` (after a restart, or on another
    /// node): nothing runs until [`AnySandbox::resume`]. `tier` must be the snapshot's.
    pub fn open_paused(tier: Arc<dyn Tier>, dir: &Path) -> Result<AnySandbox, LifecycleError> {
        let meta = crate::snapshot::read_meta(dir)?;
        if meta.tier != tier.kind() {
            return Err(LifecycleError::snapshot(
                dir,
                format!(
                    "was taken by the {} tier, not {}; open it with that tier",
                    meta.tier,
                    tier.kind()
                ),
            ));
        }
        Ok(AnySandbox {
            kind: meta.tier,
            id: meta.id.clone(),
            tier,
            st: Mutex::new(St {
                phase: Phase::Paused,
                inner: None,
                tenant: meta.tenant.clone(),
                commands: 0,
                files: 0,
                epoch: 0,
                snapshot: Some(dir.to_path_buf()),
                spec: meta.spec,
                timer: 0,
            }),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn id(&self) -> &str {
        &self.id
    }
    pub fn tier(&self) -> TierKind {
        self.kind
    }
    pub fn phase(&self) -> Phase {
        self.lock().phase
    }
    pub fn is_paused(&self) -> bool {
        matches!(self.phase(), Phase::Paused | Phase::Pausing)
    }
    pub fn spec(&self) -> SandboxSpec {
        self.lock().spec.clone()
    }
    /// The folder of the last snapshot written (the one a resume reads while paused).
    pub fn snapshot_dir(&self) -> Option<PathBuf> {
        self.lock().snapshot.clone()
    }
    /// The sandbox of the current run (`None` while paused or destroyed).
    pub fn current(&self) -> Option<Arc<dyn Isolated>> {
        self.lock().inner.clone()
    }
    pub fn tenant(&self) -> Option<String> {
        self.lock().tenant.clone()
    }

    /// Checks this sandbox's commands and files as `tenant`'s, now and after resumes.
    pub fn set_tenant(&mut self, tenant: Option<String>) {
        let st = self.st.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(inner) = st.inner.as_mut().and_then(Arc::get_mut) {
            inner.set_tenant(tenant.clone());
        }
        st.tenant = tenant;
    }

    fn enter(&self, op: Op) -> Result<(Arc<dyn Isolated>, InFlight<'_>), ExecError> {
        let mut st = self.lock();
        match st.phase {
            Phase::Running => {}
            Phase::Destroyed => return Err(ExecError::Destroyed(self.id.clone())),
            _ => return Err(ExecError::Paused(self.id.clone())),
        }
        let inner = st.inner.clone().expect("running has a sandbox");
        match op {
            Op::Command => st.commands += 1,
            Op::File => st.files += 1,
        }
        let epoch = st.epoch;
        drop(st);
        Ok((
            inner,
            InFlight {
                sb: self,
                op,
                epoch,
            },
        ))
    }

    /// An error of a call the pause ended is [`ExecError::Paused`], whatever it looked
    /// like from inside.
    fn why(&self, f: &InFlight<'_>, e: ExecError) -> ExecError {
        let st = self.lock();
        if st.epoch != f.epoch {
            ExecError::Paused(self.id.clone())
        } else {
            e
        }
    }

    fn file<T>(
        &self,
        f: impl FnOnce(&dyn Isolated) -> Result<T, FileError>,
    ) -> Result<T, FileError> {
        let (inner, g) = self.enter(Op::File)?;
        f(&*inner).map_err(|e| match e {
            FileError::Exec(x) => FileError::Exec(self.why(&g, x)),
            other => other,
        })
    }

    pub fn ping(&self) -> Result<(), ExecError> {
        let (inner, g) = self.enter(Op::File)?;
        inner.ping().map_err(|e| self.why(&g, e))
    }
    pub fn exec(&self, req: &ExecRequest) -> Result<ExecOutput, ExecError> {
        let (inner, g) = self.enter(Op::Command)?;
        inner.exec(req).map_err(|e| self.why(&g, e))
    }
    pub fn exec_streaming(
        &self,
        req: &ExecRequest,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecOutput, ExecError> {
        let (inner, g) = self.enter(Op::Command)?;
        inner
            .exec_streaming(req, &mut on_output)
            .map_err(|e| self.why(&g, e))
    }
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>, FileError> {
        self.file(|s| s.read_file(path))
    }
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<(), FileError> {
        self.file(|s| s.write_file(path, data))
    }
    pub fn list(&self, path: &str) -> Result<Vec<DirEntry>, FileError> {
        self.file(|s| s.list(path))
    }
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), FileError> {
        self.file(|s| s.remove(path, recursive))
    }
    pub fn mkdir(&self, path: &str) -> Result<(), FileError> {
        self.file(|s| s.mkdir(path))
    }
    pub fn upload_tar_with(
        &self,
        dir: &str,
        archive: &[u8],
        limits: &TarLimits,
    ) -> Result<TarSummary, FileError> {
        self.file(|s| s.upload_tar_with(dir, archive, limits))
    }
    pub fn download_tar_with(&self, dir: &str, limits: &TarLimits) -> Result<Vec<u8>, FileError> {
        self.file(|s| s.download_tar_with(dir, limits))
    }
    pub fn stats(&self) -> Stats {
        self.current().map(|s| s.stats()).unwrap_or_default()
    }

    /// Waits while another pause or resume is under way; returns the guard.
    fn settle(&self) -> MutexGuard<'_, St> {
        let mut st = self.lock();
        while matches!(st.phase, Phase::Pausing | Phase::Resuming) {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st
    }

    /// Pauses to disk: lets file operations in flight finish, waits up to
    /// `opts.drain` for commands and ends the rest, writes a snapshot into `dir`
    /// (atomically: the previous snapshot there stays whole until the new one is), and
    /// frees the sandbox. Pausing a paused sandbox is a no-op. On failure the sandbox
    /// goes on running and nothing is lost.
    pub fn pause_to_disk(
        &self,
        dir: &Path,
        opts: &PauseOptions,
    ) -> Result<SnapshotMeta, LifecycleError> {
        let mut st = self.settle();
        match st.phase {
            Phase::Paused => {
                let at = st.snapshot.clone().expect("paused has a snapshot");
                drop(st);
                return crate::snapshot::read_meta(&at);
            }
            Phase::Destroyed => {
                return Err(LifecycleError::State {
                    id: self.id.clone(),
                    op: "pause",
                    why: "it is destroyed".into(),
                });
            }
            _ => {}
        }
        st.phase = Phase::Pausing;
        // File operations always finish (each has its own bound inside).
        while st.files > 0 {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let deadline = Instant::now() + opts.drain;
        while st.commands > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let inner = st.inner.clone().expect("running has a sandbox");
        if st.commands > 0 {
            st.epoch += 1;
            drop(st);
            inner.end_commands();
            st = self.lock();
            while st.commands > 0 {
                st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
        let tenant = st.tenant.clone();
        let spec = st.spec.clone();
        drop(st);
        let taken = crate::snapshot::take(&*inner, dir, &self.id, tenant, &spec);
        let mut st = self.lock();
        match taken {
            Ok(meta) => {
                drop(st);
                let _ = inner.destroy();
                drop(inner);
                let mut st = self.lock();
                st.inner = None;
                st.phase = Phase::Paused;
                st.snapshot = Some(dir.to_path_buf());
                drop(st);
                self.cv.notify_all();
                Ok(meta)
            }
            Err(e) => {
                st.phase = Phase::Running;
                drop(st);
                self.cv.notify_all();
                Err(e)
            }
        }
    }

    /// Resumes from the snapshot written by the last pause, with the spec it was taken
    /// with. Resuming a running sandbox is a no-op. On failure it stays paused and its
    /// snapshot stays.
    pub fn resume(&self) -> Result<(), LifecycleError> {
        self.resume_with(None)
    }

    /// Like [`AnySandbox::resume`], with `spec` instead of the snapshot's (a template
    /// registered under another folder on this node).
    pub fn resume_with(&self, spec: Option<SandboxSpec>) -> Result<(), LifecycleError> {
        let mut st = self.settle();
        match st.phase {
            Phase::Running => return Ok(()),
            Phase::Destroyed => {
                return Err(LifecycleError::State {
                    id: self.id.clone(),
                    op: "resume",
                    why: "it is destroyed".into(),
                });
            }
            _ => {}
        }
        st.phase = Phase::Resuming;
        let dir = st.snapshot.clone().expect("paused has a snapshot");
        let tenant = st.tenant.clone();
        let spec = spec.unwrap_or_else(|| st.spec.clone());
        drop(st);
        let r = crate::snapshot::open(&dir).and_then(|snap| {
            let mut sb = self.tier.restore(&snap, &spec)?;
            sb.set_tenant(tenant);
            Ok(sb)
        });
        let mut st = self.lock();
        let out = match r {
            Ok(sb) => {
                st.inner = Some(Arc::from(sb));
                st.spec = spec;
                st.phase = Phase::Running;
                Ok(())
            }
            Err(e) => {
                st.phase = Phase::Paused;
                Err(e)
            }
        };
        drop(st);
        self.cv.notify_all();
        out
    }

    /// Freezes in place (memory kept, nothing written; not durable).
    pub fn freeze(&self) -> Result<(), LifecycleError> {
        match self.current() {
            Some(s) => s.freeze(),
            None => Err(self.not_running("freeze")),
        }
    }
    pub fn thaw(&self) -> Result<(), LifecycleError> {
        match self.current() {
            Some(s) => s.thaw(),
            None => Err(self.not_running("thaw")),
        }
    }

    fn not_running(&self, op: &'static str) -> LifecycleError {
        LifecycleError::State {
            id: self.id.clone(),
            op,
            why: format!("it is {:?}", self.phase()).to_lowercase(),
        }
    }

    /// Destroys the sandbox (and its snapshot, which nothing can resume any more).
    /// Idempotent.
    pub fn destroy(&self) -> Result<(), LifecycleError> {
        let mut st = self.settle();
        if st.phase == Phase::Destroyed {
            return Ok(());
        }
        st.phase = Phase::Destroyed;
        st.timer += 1;
        let inner = st.inner.take();
        let snap = st.snapshot.take();
        drop(st);
        self.cv.notify_all();
        let r = match inner {
            Some(s) => s.destroy(),
            None => Ok(()),
        };
        if let Some(d) = snap {
            crate::snapshot::remove(&d);
        }
        r
    }

    /// After `after`, pause to disk or destroy (E2B's `setTimeout` with or without
    /// `autoPause`). A later call replaces the earlier timer; a destroyed sandbox's
    /// timer does nothing.
    pub fn set_timeout(self: &Arc<Self>, after: Duration, on: OnTimeout) {
        let mut st = self.lock();
        st.timer += 1;
        let me = st.timer;
        drop(st);
        self.cv.notify_all();
        let weak: Weak<AnySandbox> = Arc::downgrade(self);
        let deadline = Instant::now() + after;
        std::thread::Builder::new()
            .name(format!("timeout-{}", self.id))
            .spawn(move || {
                loop {
                    let Some(sb) = weak.upgrade() else { return };
                    let st = sb.lock();
                    if st.timer != me || st.phase == Phase::Destroyed {
                        return;
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        drop(st);
                        let _ = match &on {
                            OnTimeout::Destroy => sb.destroy(),
                            OnTimeout::PauseTo(dir) => {
                                sb.pause_to_disk(dir, &PauseOptions::default()).map(drop)
                            }
                        };
                        return;
                    }
                    // Woken early by any change; re-checked above.
                    let wait = left.min(Duration::from_millis(500));
                    drop(sb.cv.wait_timeout(st, wait));
                }
            })
            .expect("spawn timeout thread");
    }
}

impl Drop for AnySandbox {
    fn drop(&mut self) {
        // A paused sandbox's snapshot outlives the handle (it is how a restarted
        // process resumes); a running one is destroyed with it, like a [`Sandbox`].
        let st = self.st.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = st.inner.take() {
            let _ = s.destroy();
        }
    }
}
