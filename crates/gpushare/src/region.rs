//! The per-task accounting region: one small file per fractional task, mapped
//! shared by every process of the task (the interposer) and by the node runtime
//! (setup, the compute monitor, usage readers).
//!
//! Layout (native endianness, `repr(C)`, every field an atomic because other
//! processes write it): a [`Header`] with the task's configuration, per-device
//! [`DeviceSlot`]s (memory used against the cap; the compute tokens the monitor
//! publishes), then a table of [`ProcSlot`]s: the memory each live process of the
//! task holds, per device. The per-process table is the source of truth: when a
//! process dies holding memory (the driver frees it), its slot is found dead and
//! its bytes are given back ([`Region::reclaim_dead`]).
//!
//! Memory accounting takes a small spin lock in the region whose word is the
//! holder's pid; a holder that died is detected and the lock taken over, and the
//! totals are then recomputed from the per-process table, so no death at any
//! instruction leaves the totals wrong. Only processes of the task (one pid
//! namespace) take the lock; the node side only reads and writes atomics.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// `TSGPUSH\0`, little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSGPUSH\0");
/// Bumped on any layout change; a mismatch is refused by both sides.
pub const VERSION: u32 = 1;
/// Devices one task may hold a share of.
pub const MAX_DEVICES: usize = 8;
/// Processes of one task that may hold GPU memory at once.
pub const MAX_PROCS: usize = 1024;
/// Bytes kept for the task id (UTF-8, NUL-padded).
pub const TASK_ID_BYTES: usize = 64;

/// Compute policy of a task: work-conserving (a share under contention, the
/// whole device when alone) or fixed (never more than the share).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ComputePolicy {
    WorkConserving,
    Fixed,
}

impl ComputePolicy {
    fn code(self) -> u32 {
        match self {
            ComputePolicy::WorkConserving => 0,
            ComputePolicy::Fixed => 1,
        }
    }
    fn from_code(c: u32) -> Option<Self> {
        match c {
            0 => Some(ComputePolicy::WorkConserving),
            1 => Some(ComputePolicy::Fixed),
            _ => None,
        }
    }
}

/// What the node runtime writes into a region when it creates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionConfig {
    pub task: String,
    /// Per device the task sees, in CUDA ordinal order.
    pub devices: Vec<DeviceConfig>,
    /// How long an allocation over the cap waits for memory to be freed before
    /// it fails with `CUDA_ERROR_OUT_OF_MEMORY` (zero: fail at once).
    pub memory_wait: Duration,
    pub policy: ComputePolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    pub memory_limit: u64,
    /// 1..=1000; 1000 means no compute slicing on this device.
    pub compute_milli: u32,
}

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub size: AtomicU32,
    pub device_count: AtomicU32,
    pub policy: AtomicU32,
    pub memory_wait_ms: AtomicU32,
    /// Spin lock for memory accounting: 0 or the holder's pid.
    pub lock: AtomicU32,
    /// Futex word bumped on every free, so waiters for memory wake.
    pub free_seq: AtomicU32,
    /// Processes waiting on `free_seq` (a free makes the wake syscall only then).
    pub free_waiters: AtomicU32,
    /// Futex word bumped by the compute monitor on every tick.
    pub tick_seq: AtomicU32,
    pub _pad0: AtomicU32,
    /// When the monitor will tick next, and when it last did (its clock, ns).
    pub next_tick_ns: AtomicU64,
    pub heartbeat_ns: AtomicU64,
    /// Tick period the monitor runs at (ns); 0 until a monitor attaches.
    pub tick_ns: AtomicU64,
    pub task_id: [AtomicU64; TASK_ID_BYTES / 8],
    pub devices: [DeviceSlot; MAX_DEVICES],
}

#[repr(C)]
pub struct DeviceSlot {
    pub memory_limit: AtomicU64,
    pub compute_milli: AtomicU32,
    pub _pad: AtomicU32,
    pub memory_used: AtomicU64,
    pub memory_peak: AtomicU64,
    /// Allocations refused over the cap, and those that had to wait.
    pub oom_events: AtomicU64,
    pub wait_events: AtomicU64,
    /// Device time the task may still use (ns; negative: in debt, launches wait).
    /// Written by the monitor each tick.
    pub tokens_ns: AtomicI64,
    /// The task's current allowance and measured use, parts per million of the
    /// device (monitor).
    pub allowance_ppm: AtomicU32,
    pub rate_ppm: AtomicU32,
    /// Device time the task has used since it started (monitor), for metering.
    pub busy_ns: AtomicU64,
    /// Launches that had to wait for tokens (interposer).
    pub throttle_events: AtomicU64,
    /// Times the interposer could not enforce the share and said so (monitor
    /// gone stale, graph memory nodes).
    pub unenforced_events: AtomicU64,
    pub _reserved: [AtomicU64; 4],
}

#[repr(C)]
pub struct ProcSlot {
    pub pid: AtomicU32,
    pub _pad: AtomicU32,
    /// Start time of the process (clock ticks since boot, /proc/<pid>/stat field
    /// 22): tells a reused pid from the process that registered.
    pub start_time: AtomicU64,
    pub used: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
struct Layout {
    header: Header,
    procs: [ProcSlot; MAX_PROCS],
}

/// Bytes of a region file.
pub const REGION_BYTES: usize = std::mem::size_of::<Layout>();

#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("region {path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error(
        "region {path} is not a Tessera GPU-share region (magic {magic:#x}, version {version}, {size} bytes; expected version {VERSION}, {REGION_BYTES} bytes)"
    )]
    Invalid {
        path: PathBuf,
        magic: u64,
        version: u32,
        size: u64,
    },
    #[error("region {path}: {what}")]
    Config { path: PathBuf, what: String },
    #[error("region {path}: all {MAX_PROCS} process slots are held by live processes of this task")]
    ProcsFull { path: PathBuf },
}

struct Mapping {
    ptr: *mut Layout,
    path: PathBuf,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics; the
// pointer stays valid until `Drop`, which only runs when no reference is left.
unsafe impl Send for Mapping {}
// SAFETY: as above: every access goes through atomic operations.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from a successful mmap of REGION_BYTES and no borrow
        // of it outlives the last `Region` clone, which is being dropped.
        unsafe {
            libc::munmap(self.ptr.cast(), REGION_BYTES);
        }
    }
}

/// A mapped region. Cheap to clone (the mapping is shared).
#[derive(Clone)]
pub struct Region {
    map: Arc<Mapping>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.map.path)
            .finish()
    }
}

/// Outcome of a reservation against the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    Done,
    OverCap { used: u64, limit: u64 },
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> RegionError + 'a {
    move |source| RegionError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

fn map_file(file: &std::fs::File, path: &Path) -> Result<*mut Layout, RegionError> {
    // SAFETY: mapping a file we hold open, read-write and shared, of at least
    // REGION_BYTES (checked or set by the caller); the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            REGION_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io(path, "mmap")(std::io::Error::last_os_error()));
    }
    Ok(p.cast())
}

impl Region {
    /// Creates the region file (it must not exist) and writes the configuration.
    pub fn create(path: &Path, cfg: &RegionConfig) -> Result<Region, RegionError> {
        validate(path, cfg)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io(path, "create"))?;
        file.set_len(REGION_BYTES as u64)
            .map_err(io(path, "set length"))?;
        let ptr = map_file(&file, path)?;
        let r = Region {
            map: Arc::new(Mapping {
                ptr,
                path: path.to_path_buf(),
            }),
        };
        let h = r.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.size.store(REGION_BYTES as u32, Ordering::Relaxed);
        h.device_count
            .store(cfg.devices.len() as u32, Ordering::Relaxed);
        h.policy.store(cfg.policy.code(), Ordering::Relaxed);
        h.memory_wait_ms.store(
            cfg.memory_wait.as_millis().min(u32::MAX as u128) as u32,
            Ordering::Relaxed,
        );
        let mut id = [0u8; TASK_ID_BYTES];
        id[..cfg.task.len()].copy_from_slice(cfg.task.as_bytes());
        for (i, w) in h.task_id.iter().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&id[i * 8..i * 8 + 8]);
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        for (slot, d) in h.devices.iter().zip(&cfg.devices) {
            slot.memory_limit.store(d.memory_limit, Ordering::Relaxed);
            slot.compute_milli.store(d.compute_milli, Ordering::Relaxed);
            // Until a monitor ticks, a task has one tick's worth of nothing owed.
            slot.tokens_ns.store(i64::MAX / 4, Ordering::Relaxed);
            slot.allowance_ppm
                .store(d.compute_milli * 1000, Ordering::Relaxed);
        }
        // Magic last: a reader that sees it sees the rest.
        h.magic.store(MAGIC, Ordering::Release);
        Ok(r)
    }

    /// Maps an existing region and checks magic, version and size.
    pub fn open(path: &Path) -> Result<Region, RegionError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io(path, "open"))?;
        let len = file.metadata().map_err(io(path, "stat"))?.len();
        if len < REGION_BYTES as u64 {
            return Err(RegionError::Invalid {
                path: path.to_path_buf(),
                magic: 0,
                version: 0,
                size: len,
            });
        }
        let ptr = map_file(&file, path)?;
        let r = Region {
            map: Arc::new(Mapping {
                ptr,
                path: path.to_path_buf(),
            }),
        };
        let h = r.header();
        let (magic, version, size) = (
            h.magic.load(Ordering::Acquire),
            h.version.load(Ordering::Relaxed),
            h.size.load(Ordering::Relaxed),
        );
        if magic != MAGIC || version != VERSION || size as usize != REGION_BYTES {
            return Err(RegionError::Invalid {
                path: path.to_path_buf(),
                magic,
                version,
                size: len,
            });
        }
        let n = h.device_count.load(Ordering::Relaxed) as usize;
        if n == 0 || n > MAX_DEVICES {
            return Err(RegionError::Config {
                path: path.to_path_buf(),
                what: format!("device count {n} is not in 1..={MAX_DEVICES}"),
            });
        }
        Ok(r)
    }

    pub fn path(&self) -> &Path {
        &self.map.path
    }

    fn layout(&self) -> &Layout {
        // SAFETY: the mapping is REGION_BYTES long, aligned to a page, and lives
        // as long as `self.map`; every field is an atomic, so shared access from
        // other processes is not a data race.
        unsafe { &*self.map.ptr }
    }

    pub fn header(&self) -> &Header {
        &self.layout().header
    }

    pub fn procs(&self) -> &[ProcSlot; MAX_PROCS] {
        &self.layout().procs
    }

    pub fn device_count(&self) -> usize {
        (self.header().device_count.load(Ordering::Relaxed) as usize).clamp(1, MAX_DEVICES)
    }

    /// The slot of device `dev`, if the task has it.
    pub fn device(&self, dev: usize) -> Option<&DeviceSlot> {
        (dev < self.device_count()).then(|| &self.header().devices[dev])
    }

    /// Reads the configuration back (node side: usage reports, tests).
    pub fn config(&self) -> RegionConfig {
        let h = self.header();
        let mut id = Vec::with_capacity(TASK_ID_BYTES);
        for w in &h.task_id {
            id.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        while id.last() == Some(&0) {
            id.pop();
        }
        RegionConfig {
            task: String::from_utf8_lossy(&id).into_owned(),
            devices: (0..self.device_count())
                .map(|d| DeviceConfig {
                    memory_limit: h.devices[d].memory_limit.load(Ordering::Relaxed),
                    compute_milli: h.devices[d].compute_milli.load(Ordering::Relaxed),
                })
                .collect(),
            memory_wait: Duration::from_millis(h.memory_wait_ms.load(Ordering::Relaxed) as u64),
            policy: ComputePolicy::from_code(h.policy.load(Ordering::Relaxed))
                .unwrap_or(ComputePolicy::Fixed),
        }
    }

    // ---------------------------------------------------------------- memory

    fn lock(&self, me: u32) -> LockGuard<'_> {
        let word = &self.header().lock;
        let mut spins: u32 = 0;
        loop {
            match word.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return LockGuard { region: self },
                Err(owner) => {
                    spins = spins.wrapping_add(1);
                    if owner != 0 && spins.is_multiple_of(4096) && !pid_alive(owner) {
                        // The holder died inside the critical section: take over and
                        // rebuild the totals from the per-process table.
                        if word
                            .compare_exchange(owner, me, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                        {
                            self.recompute_locked();
                            return LockGuard { region: self };
                        }
                    }
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    fn recompute_locked(&self) {
        for d in 0..self.device_count() {
            let total: u64 = self
                .procs()
                .iter()
                .filter(|p| p.pid.load(Ordering::Relaxed) != 0)
                .map(|p| p.used[d].load(Ordering::Relaxed))
                .fold(0u64, u64::saturating_add);
            self.header().devices[d]
                .memory_used
                .store(total, Ordering::Relaxed);
        }
    }

    /// Registers process `pid` (started at `start_time`) and returns its slot.
    /// Dead processes' slots are reclaimed first, and so is a slot of `pid`
    /// itself: a process registers once per program image, so such a slot is
    /// the image it `exec`ed from, whose GPU memory the driver freed at `exec`.
    pub fn register_process(&self, pid: u32, start_time: u64) -> Result<usize, RegionError> {
        let _g = self.lock(pid);
        self.reclaim_locked(&|p, s| p != pid && proc_alive(p, s));
        for (i, p) in self.procs().iter().enumerate() {
            if p.pid.load(Ordering::Relaxed) == 0 {
                for u in &p.used {
                    u.store(0, Ordering::Relaxed);
                }
                p.start_time.store(start_time, Ordering::Relaxed);
                p.pid.store(pid, Ordering::Release);
                return Ok(i);
            }
        }
        Err(RegionError::ProcsFull {
            path: self.path().to_path_buf(),
        })
    }

    /// Gives back everything slot `slot` holds and frees the slot (a process
    /// that exits normally).
    pub fn release_process(&self, slot: usize, pid: u32) {
        let _g = self.lock(pid);
        self.free_slot_locked(slot);
        self.wake_waiters();
    }

    fn free_slot_locked(&self, slot: usize) -> u64 {
        let p = &self.procs()[slot];
        let mut freed = 0;
        for d in 0..self.device_count() {
            let u = p.used[d].swap(0, Ordering::Relaxed);
            let dev = &self.header().devices[d];
            let used = dev.memory_used.load(Ordering::Relaxed);
            dev.memory_used
                .store(used.saturating_sub(u), Ordering::Relaxed);
            freed += u;
        }
        p.pid.store(0, Ordering::Release);
        freed
    }

    /// Reserves `bytes` on `dev` for the process in `slot`, unless that would take
    /// the task over its cap.
    pub fn try_reserve(&self, slot: usize, pid: u32, dev: usize, bytes: u64) -> Reserve {
        let Some(d) = self.device(dev) else {
            return Reserve::OverCap { used: 0, limit: 0 };
        };
        let _g = self.lock(pid);
        let limit = d.memory_limit.load(Ordering::Relaxed);
        let used = d.memory_used.load(Ordering::Relaxed);
        match used.checked_add(bytes) {
            Some(n) if n <= limit => {
                d.memory_used.store(n, Ordering::Relaxed);
                self.procs()[slot].used[dev].fetch_add(bytes, Ordering::Relaxed);
                d.memory_peak.fetch_max(n, Ordering::Relaxed);
                Reserve::Done
            }
            _ => Reserve::OverCap { used, limit },
        }
    }

    /// Gives `bytes` on `dev` back (a free, or a reservation whose driver call
    /// failed), and wakes processes waiting for memory.
    pub fn release(&self, slot: usize, pid: u32, dev: usize, bytes: u64) {
        let Some(d) = self.device(dev) else { return };
        {
            let _g = self.lock(pid);
            let mine = &self.procs()[slot].used[dev];
            let held = mine.load(Ordering::Relaxed);
            let b = bytes.min(held);
            mine.store(held - b, Ordering::Relaxed);
            let used = d.memory_used.load(Ordering::Relaxed);
            d.memory_used
                .store(used.saturating_sub(b), Ordering::Relaxed);
        }
        self.wake_waiters();
    }

    /// Frees the slots of processes `alive` says are gone and returns the bytes
    /// given back (all devices).
    pub fn reclaim_dead(&self, me: u32, alive: &dyn Fn(u32, u64) -> bool) -> u64 {
        let freed = {
            let _g = self.lock(me);
            self.reclaim_locked(alive)
        };
        if freed > 0 {
            self.wake_waiters();
        }
        freed
    }

    fn reclaim_locked(&self, alive: &dyn Fn(u32, u64) -> bool) -> u64 {
        let mut freed = 0;
        for i in 0..MAX_PROCS {
            let p = &self.procs()[i];
            let pid = p.pid.load(Ordering::Relaxed);
            if pid != 0 && !alive(pid, p.start_time.load(Ordering::Relaxed)) {
                freed += self.free_slot_locked(i);
            }
        }
        freed
    }

    fn wake_waiters(&self) {
        let h = self.header();
        h.free_seq.fetch_add(1, Ordering::SeqCst);
        // A waiter counts itself before it reads the sequence (both SeqCst): if
        // it is not counted here, its wait sees the new sequence and returns.
        if h.free_waiters.load(Ordering::SeqCst) > 0 {
            futex_wake_all(&h.free_seq);
        }
    }

    /// Waits until memory is freed (the free sequence moves past `seq`) or
    /// `timeout` passes.
    pub fn wait_for_free(&self, seq: u32, timeout: Duration) {
        let h = self.header();
        h.free_waiters.fetch_add(1, Ordering::SeqCst);
        futex_wait(&h.free_seq, seq, timeout);
        h.free_waiters.fetch_sub(1, Ordering::SeqCst);
    }

    // ---------------------------------------------------------------- compute

    /// Publishes one device's compute state (the monitor, each tick).
    pub fn publish_compute(&self, dev: usize, p: &ComputePublish) {
        if let Some(d) = self.device(dev) {
            d.tokens_ns.store(p.tokens_ns, Ordering::Relaxed);
            d.allowance_ppm.store(p.allowance_ppm, Ordering::Relaxed);
            d.rate_ppm.store(p.rate_ppm, Ordering::Relaxed);
            d.busy_ns.store(p.busy_ns, Ordering::Relaxed);
        }
    }

    /// Marks a tick: what was published is now visible; wakes throttled launches.
    pub fn tick(&self, now_ns: u64, next_tick_ns: u64, tick_ns: u64) {
        let h = self.header();
        h.tick_ns.store(tick_ns, Ordering::Relaxed);
        h.heartbeat_ns.store(now_ns, Ordering::Relaxed);
        h.next_tick_ns.store(next_tick_ns, Ordering::Relaxed);
        h.tick_seq.fetch_add(1, Ordering::SeqCst);
        futex_wake_all(&h.tick_seq);
    }

    /// Waits for the next tick (real time): the tick sequence moves past `seq`
    /// or `timeout` passes.
    pub fn wait_for_tick(&self, seq: u32, timeout: Duration) {
        futex_wait(&self.header().tick_seq, seq, timeout);
    }
}

/// What the monitor writes for one device of one task per tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ComputePublish {
    pub tokens_ns: i64,
    pub allowance_ppm: u32,
    pub rate_ppm: u32,
    pub busy_ns: u64,
}

struct LockGuard<'a> {
    region: &'a Region,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.region.header().lock.store(0, Ordering::Release);
    }
}

fn validate(path: &Path, cfg: &RegionConfig) -> Result<(), RegionError> {
    let bad = |what: String| RegionError::Config {
        path: path.to_path_buf(),
        what,
    };
    if cfg.task.is_empty() || cfg.task.len() > TASK_ID_BYTES {
        return Err(bad(format!(
            "task id {:?} must be 1 to {TASK_ID_BYTES} bytes",
            cfg.task
        )));
    }
    if cfg.devices.is_empty() || cfg.devices.len() > MAX_DEVICES {
        return Err(bad(format!(
            "{} devices: a task shares 1 to {MAX_DEVICES}",
            cfg.devices.len()
        )));
    }
    for (i, d) in cfg.devices.iter().enumerate() {
        if d.memory_limit == 0 {
            return Err(bad(format!("device {i}: memory limit 0")));
        }
        if !(1..=1000).contains(&d.compute_milli) {
            return Err(bad(format!(
                "device {i}: compute share {} milli-GPU is not in 1..=1000",
                d.compute_milli
            )));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- processes

/// Start time of process `pid` (field 22 of /proc/<pid>/stat) and whether it is a
/// zombie; `None` when there is no such process.
pub fn proc_stat(pid: u32) -> Option<(u64, bool)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let mut it = rest.split_ascii_whitespace();
    let state = it.next()?;
    // Fields after the state start at field 4; field 22 is the 19th after it.
    let start = it.nth(18)?.parse().ok()?;
    Some((start, state == "Z" || state == "X"))
}

/// Whether `pid` is the live process that registered with `start_time` (0: any
/// process with that pid). Zombies are dead: the driver has released their GPU
/// memory by then.
pub fn proc_alive(pid: u32, start_time: u64) -> bool {
    match proc_stat(pid) {
        Some((start, zombie)) => !zombie && (start_time == 0 || start == start_time),
        None => pid_alive_by_signal(pid),
    }
}

fn pid_alive(pid: u32) -> bool {
    proc_alive(pid, 0)
}

fn pid_alive_by_signal(pid: u32) -> bool {
    if std::path::Path::new("/proc/self/stat").exists() {
        // /proc works and has no entry: the process is gone.
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

// ---------------------------------------------------------------- futex

/// Waits while `word` holds `expected`, at most `timeout` (shared futex: works
/// across processes mapping the same file).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word`, which lives as long
    // as the borrow; the timeout is a valid timespec. Errors (EAGAIN when the
    // value already changed, ETIMEDOUT, EINTR) all mean "look again".
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(limit: u64) -> RegionConfig {
        RegionConfig {
            task: "t1".into(),
            devices: vec![DeviceConfig {
                memory_limit: limit,
                compute_milli: 500,
            }],
            memory_wait: Duration::ZERO,
            policy: ComputePolicy::WorkConserving,
        }
    }

    #[test]
    fn create_open_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r");
        let r = Region::create(&p, &cfg(100)).unwrap();
        let o = Region::open(&p).unwrap();
        assert_eq!(o.config(), r.config());
        assert_eq!(o.config().task, "t1");
        assert!(
            Region::create(&p, &cfg(100)).is_err(),
            "create must not clobber"
        );
    }

    #[test]
    fn open_rejects_garbage_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("junk");
        std::fs::write(&p, vec![7u8; REGION_BYTES]).unwrap();
        let e = Region::open(&p).unwrap_err().to_string();
        assert!(e.contains("junk") && e.contains("not a Tessera"), "{e}");
        std::fs::write(&p, b"short").unwrap();
        assert!(Region::open(&p).is_err());
    }

    #[test]
    fn config_is_validated() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(100);
        c.devices[0].compute_milli = 0;
        let e = Region::create(&dir.path().join("a"), &c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("compute share 0"), "{e}");
        let mut c = cfg(0);
        c.task = "x".repeat(65);
        assert!(Region::create(&dir.path().join("b"), &c).is_err());
    }

    #[test]
    fn cap_holds_and_frees_return() {
        let dir = tempfile::tempdir().unwrap();
        let r = Region::create(&dir.path().join("r"), &cfg(100)).unwrap();
        let me = std::process::id();
        let s = r.register_process(me, 0).unwrap();
        assert_eq!(r.try_reserve(s, me, 0, 60), Reserve::Done);
        assert_eq!(
            r.try_reserve(s, me, 0, 41),
            Reserve::OverCap {
                used: 60,
                limit: 100
            }
        );
        assert_eq!(r.try_reserve(s, me, 0, 40), Reserve::Done);
        r.release(s, me, 0, 60);
        assert_eq!(r.try_reserve(s, me, 0, 60), Reserve::Done);
        assert_eq!(
            r.device(0).unwrap().memory_peak.load(Ordering::Relaxed),
            100
        );
        // Device 1 is not the task's.
        assert!(matches!(
            r.try_reserve(s, me, 1, 1),
            Reserve::OverCap { .. }
        ));
    }

    #[test]
    fn dead_process_memory_is_reclaimed() {
        let dir = tempfile::tempdir().unwrap();
        let r = Region::create(&dir.path().join("r"), &cfg(100)).unwrap();
        let me = std::process::id();
        let ghost = 4_000_000; // above pid_max: never alive
        let g = r.register_process(ghost, 1).unwrap();
        assert_eq!(r.try_reserve(g, ghost, 0, 90), Reserve::Done);
        let s = r.register_process(me, 0).unwrap();
        // Registering reclaims the ghost.
        assert_eq!(r.try_reserve(s, me, 0, 90), Reserve::Done);
        assert_eq!(r.device(0).unwrap().memory_used.load(Ordering::Relaxed), 90);
        // The same pid registering again is a new program image (exec): the old
        // image's memory is gone.
        let s2 = r.register_process(me, 0).unwrap();
        assert_eq!(r.device(0).unwrap().memory_used.load(Ordering::Relaxed), 0);
        assert_eq!(r.try_reserve(s2, me, 0, 100), Reserve::Done);
        // An explicit reclaim with a liveness rule.
        let freed = r.reclaim_dead(me, &|_, _| false);
        assert_eq!(freed, 100);
    }

    #[test]
    fn lock_held_by_a_dead_process_is_taken_over_and_totals_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let r = Region::create(&dir.path().join("r"), &cfg(100)).unwrap();
        let me = std::process::id();
        let s = r.register_process(me, 0).unwrap();
        assert_eq!(r.try_reserve(s, me, 0, 30), Reserve::Done);
        // A process died holding the lock, having bumped the total but not its slot.
        r.header().lock.store(4_000_001, Ordering::Relaxed);
        r.device(0)
            .unwrap()
            .memory_used
            .store(99, Ordering::Relaxed);
        assert_eq!(r.try_reserve(s, me, 0, 70), Reserve::Done);
        assert_eq!(
            r.device(0).unwrap().memory_used.load(Ordering::Relaxed),
            100
        );
    }

    #[test]
    fn proc_stat_reads_this_process() {
        let (start, zombie) = proc_stat(std::process::id()).unwrap();
        assert!(start > 0 && !zombie);
        assert!(proc_alive(std::process::id(), start));
        assert!(!proc_alive(std::process::id(), start + 1));
        assert!(!proc_alive(4_000_000, 0));
    }
}
