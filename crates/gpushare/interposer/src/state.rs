//! This process's view of its task: the accounting region, the clock, its own
//! process slot and the allocations it holds.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tessera_gpushare::region::{MAX_DEVICES, Region, Reserve, proc_alive, proc_stat};

use crate::cu::*;
use crate::driver::driver;
use crate::log::{self, Once};

/// Where the node runtime mounts the region inside the sandbox; the environment
/// variable below overrides it (tests, and runs without a sandbox).
pub const DEFAULT_REGION: &str = "/run/tessera/gpushare/region";
pub const REGION_ENV: &str = "TESSERA_GPUSHARE_REGION";

/// Driver versions (`cuDriverGetVersion`) whose entry points this build knows:
/// CUDA 11.3 (the first with `cuGetProcAddress`) to 13.5. The wrapped entry
/// points and their versioned variants were checked against `cuda.h` and
/// `cudaTypedefs.h` of CUDA 12.9 and 13.5 (from the `nvidia-cuda-runtime-cu12`
/// 12.9.79 and `nvidia-cuda-runtime` 13.5.37 wheels): no allocation or launch
/// entry point gained a variant up to 13.5. A newer driver is refused until
/// its headers are checked the same way and this bound is moved.
pub const MIN_DRIVER: i32 = 11030;
pub const MAX_DRIVER_EXCLUSIVE: i32 = 13060;

pub enum Clock {
    Monotonic,
    /// The CI fake driver's simulated clock (only a fake driver exports these).
    Fake {
        now: unsafe extern "C" fn() -> u64,
        sleep_until: unsafe extern "C" fn(u64),
    },
}

impl Clock {
    pub fn now_ns(&self) -> u64 {
        match self {
            Clock::Monotonic => tessera_gpushare::monotonic_ns(),
            // SAFETY: the fake driver's clock takes no arguments.
            Clock::Fake { now, .. } => unsafe { now() },
        }
    }
}

pub struct State {
    /// When this process set up (its clock): a monitor gets a grace period.
    pub started_ns: u64,
    pub region: Region,
    pub devices: usize,
    pub compute_on: [bool; MAX_DEVICES],
    pub clock: Clock,
    pub memory_wait: Duration,
    pub allocs: AllocMap,
}

static STATE: OnceLock<Result<State, (CUresult, String)>> = OnceLock::new();

/// The task's state, initialised at the first driver call; an error is said
/// once and returned as the CUDA error every wrapped call fails with.
pub fn state() -> Result<&'static State, CUresult> {
    match STATE.get_or_init(init) {
        Ok(s) => Ok(s),
        Err((rc, msg)) => {
            log::once(Once::Init, msg);
            Err(*rc)
        }
    }
}

fn init() -> Result<State, (CUresult, String)> {
    let d = driver().map_err(|e| (CUDA_ERROR_NOT_INITIALIZED, e.to_string()))?;
    for s in [crate::Sym::cuDriverGetVersion, crate::Sym::cuCtxGetDevice] {
        if d.addr(s).is_null() {
            return Err((
                CUDA_ERROR_NOT_FOUND,
                format!(
                    "the CUDA driver has no {} (which GPU sharing needs); refusing to run CUDA unenforced",
                    crate::sym_name(s)
                ),
            ));
        }
    }
    let version = driver_version()?;
    if !(MIN_DRIVER..MAX_DRIVER_EXCLUSIVE).contains(&version) {
        return Err((
            CUDA_ERROR_NOT_SUPPORTED,
            format!(
                "CUDA driver version {} is not one this interposer knows ({} up to, not including, {}); \
                 its entry points may allocate memory or launch work unseen, so CUDA is refused. \
                 Run the pool without GPU sharing, or update Tessera",
                dotted(version),
                dotted(MIN_DRIVER),
                dotted(MAX_DRIVER_EXCLUSIVE)
            ),
        ));
    }
    let (path, from_env) = match std::env::var_os(REGION_ENV) {
        Some(p) if !p.is_empty() => (std::path::PathBuf::from(p), true),
        _ => (std::path::PathBuf::from(DEFAULT_REGION), false),
    };
    if !from_env && !path.exists() {
        return Err((
            CUDA_ERROR_NOT_INITIALIZED,
            format!(
                "this process has the GPU-sharing interposer loaded but no task region \
                 ({REGION_ENV} is unset and {DEFAULT_REGION} does not exist); refusing to run CUDA unenforced"
            ),
        ));
    }
    let region = Region::open(&path).map_err(|e| {
        (
            CUDA_ERROR_NOT_INITIALIZED,
            format!("{e}; refusing to run CUDA unenforced"),
        )
    })?;
    let cfg = region.config();
    let mut compute_on = [false; MAX_DEVICES];
    for (i, dc) in cfg.devices.iter().enumerate() {
        compute_on[i] = dc.compute_milli < 1000;
    }
    let clock = match (
        d.addr(crate::Sym::tesseraFakeClockNs),
        d.addr(crate::Sym::tesseraFakeSleepUntilNs),
    ) {
        (n, s) if !n.is_null() && !s.is_null() => Clock::Fake {
            // SAFETY: the fake driver exports these with these signatures.
            now: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> u64>(n) },
            // SAFETY: as above.
            sleep_until: unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(u64)>(s)
            },
        },
        _ => Clock::Monotonic,
    };
    // SAFETY: registering plain extern "C" handlers; they only touch this
    // module's atomics and the allocation map's lock.
    unsafe {
        libc::pthread_atfork(
            Some(atfork_prepare),
            Some(atfork_parent),
            Some(atfork_child),
        );
        libc::atexit(at_exit);
    }
    Ok(State {
        started_ns: clock.now_ns(),
        devices: region.device_count(),
        region,
        compute_on,
        clock,
        memory_wait: cfg.memory_wait,
        allocs: AllocMap::new(),
    })
}

/// `12040` → `12.4`.
fn dotted(v: i32) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

fn driver_version() -> Result<i32, (CUresult, String)> {
    let f = match driver().map(|d| d.addr(crate::Sym::cuDriverGetVersion)) {
        Ok(p) if !p.is_null() => {
            // SAFETY: cuDriverGetVersion(int*) per cuda.h.
            unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut i32) -> CUresult>(p)
            }
        }
        _ => return Err((CUDA_ERROR_NOT_FOUND, "no cuDriverGetVersion".into())),
    };
    let mut v = 0;
    // SAFETY: writes one int.
    let rc = unsafe { f(&mut v) };
    if rc != CUDA_SUCCESS {
        return Err((
            rc,
            format!("cuDriverGetVersion failed ({rc}); refusing to run CUDA unenforced"),
        ));
    }
    Ok(v)
}

// ---------------------------------------------------------------- this process

static PROC_PID: AtomicU32 = AtomicU32::new(0);
static PROC_SLOT: AtomicUsize = AtomicUsize::new(0);
static REGISTERING: AtomicBool = AtomicBool::new(false);

impl State {
    /// This process's pid and slot in the region, registering on first use (and
    /// again in the child of a fork).
    pub fn proc_slot(&self) -> Result<(u32, usize), CUresult> {
        let pid = PROC_PID.load(Ordering::Acquire);
        if pid != 0 {
            return Ok((pid, PROC_SLOT.load(Ordering::Relaxed)));
        }
        while REGISTERING
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        let r = (|| {
            let pid = PROC_PID.load(Ordering::Acquire);
            if pid != 0 {
                return Ok((pid, PROC_SLOT.load(Ordering::Relaxed)));
            }
            let pid = std::process::id();
            let start = proc_stat(pid).map(|s| s.0).unwrap_or(0);
            match self.region.register_process(pid, start) {
                Ok(slot) => {
                    PROC_SLOT.store(slot, Ordering::Relaxed);
                    PROC_PID.store(pid, Ordering::Release);
                    Ok((pid, slot))
                }
                Err(e) => {
                    log::once(Once::ProcsFull, &format!("{e}; allocations fail"));
                    Err(CUDA_ERROR_OUT_OF_MEMORY)
                }
            }
        })();
        REGISTERING.store(false, Ordering::Release);
        r
    }

    /// The device the current context is on, as an index into the region.
    pub fn current_device(&self) -> Result<usize, CUresult> {
        if self.devices == 1 {
            return Ok(0);
        }
        let p = driver()
            .map(|d| d.addr(crate::Sym::cuCtxGetDevice))
            .unwrap_or(std::ptr::null_mut());
        if p.is_null() {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        // SAFETY: cuCtxGetDevice(CUdevice*) per cuda.h.
        let f = unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut CUdevice) -> CUresult>(p)
        };
        let mut d: CUdevice = 0;
        // SAFETY: writes one CUdevice.
        let rc = unsafe { f(&mut d) };
        if rc != CUDA_SUCCESS {
            return Err(rc);
        }
        self.device_index(d)
    }

    pub fn device_index(&self, d: CUdevice) -> Result<usize, CUresult> {
        if d >= 0 && (d as usize) < self.devices {
            Ok(d as usize)
        } else {
            log::once(
                Once::WrongDevice,
                &format!(
                    "device {d} is not one of this task's {} GPU(s); the call fails (CUDA_ERROR_INVALID_DEVICE)",
                    self.devices
                ),
            );
            Err(CUDA_ERROR_INVALID_DEVICE)
        }
    }

    /// Reserves `bytes` on `dev` for this process: at once when the task is under
    /// its cap; otherwise after reclaiming memory of dead processes, or after
    /// waiting (as configured) for the task's other processes to free some.
    pub fn reserve(&self, pid: u32, slot: usize, dev: usize, bytes: u64) -> Result<(), CUresult> {
        let r = &self.region;
        if r.try_reserve(slot, pid, dev, bytes) == Reserve::Done {
            return Ok(());
        }
        r.reclaim_dead(pid, &proc_alive);
        let deadline = Instant::now() + self.memory_wait;
        let counters = r.device(dev).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        let mut waited = false;
        let mut last_reclaim = Instant::now();
        loop {
            let seq = r.header().free_seq.load(Ordering::Acquire);
            match r.try_reserve(slot, pid, dev, bytes) {
                Reserve::Done => return Ok(()),
                Reserve::OverCap { used, limit } => {
                    let now = Instant::now();
                    if now >= deadline {
                        counters.oom_events.fetch_add(1, Ordering::Relaxed);
                        log::once(
                            Once::OverCap,
                            &format!(
                                "allocation of {bytes} bytes on device {dev} refused: the task's cap is {limit} bytes \
                                 and {used} are in use{} (CUDA_ERROR_OUT_OF_MEMORY)",
                                if waited {
                                    format!(" after waiting {} ms", self.memory_wait.as_millis())
                                } else {
                                    String::new()
                                }
                            ),
                        );
                        return Err(CUDA_ERROR_OUT_OF_MEMORY);
                    }
                    if !waited {
                        waited = true;
                        counters.wait_events.fetch_add(1, Ordering::Relaxed);
                    }
                    r.wait_for_free(seq, (deadline - now).min(Duration::from_millis(50)));
                    if last_reclaim.elapsed() > Duration::from_millis(50) {
                        r.reclaim_dead(pid, &proc_alive);
                        last_reclaim = Instant::now();
                    }
                }
            }
        }
    }
}

extern "C" fn at_exit() {
    let pid = PROC_PID.load(Ordering::Acquire);
    if pid == 0 || pid != std::process::id() {
        return;
    }
    if let Some(Ok(s)) = STATE.get() {
        s.region
            .release_process(PROC_SLOT.load(Ordering::Relaxed), pid);
    }
}

extern "C" fn atfork_prepare() {
    if let Some(Ok(s)) = STATE.get() {
        s.allocs.lock();
    }
}

extern "C" fn atfork_parent() {
    if let Some(Ok(s)) = STATE.get() {
        s.allocs.unlock();
    }
}

extern "C" fn atfork_child() {
    // The child owns none of the parent's allocations and registers itself.
    PROC_PID.store(0, Ordering::Release);
    REGISTERING.store(false, Ordering::Release);
    log::reset();
    if let Some(Ok(s)) = STATE.get() {
        s.allocs.reset_in_child();
    }
}

// ---------------------------------------------------------------- allocations

/// What a handle is (device pointers, arrays and VMM handles live in different
/// name spaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AllocKind {
    Ptr,
    Array,
    Mipmap,
    Vmm,
}

/// This process's live allocations: handle → (device, bytes). A spin lock (not a
/// std mutex) so that the child of a fork can reset it.
pub struct AllocMap {
    locked: AtomicBool,
    map: UnsafeCell<HashMap<(AllocKind, u64), (usize, u64)>>,
}

// SAFETY: the map is only touched while `locked` is held.
unsafe impl Sync for AllocMap {}

impl AllocMap {
    fn new() -> Self {
        AllocMap {
            locked: AtomicBool::new(false),
            map: UnsafeCell::new(HashMap::new()),
        }
    }

    fn lock(&self) {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
    }

    fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<(AllocKind, u64), (usize, u64)>) -> R) -> R {
        self.lock();
        // SAFETY: the lock is held, so this is the only reference.
        let r = f(unsafe { &mut *self.map.get() });
        self.unlock();
        r
    }

    pub fn insert(&self, kind: AllocKind, handle: u64, dev: usize, bytes: u64) {
        self.with(|m| m.insert((kind, handle), (dev, bytes)));
    }

    pub fn remove(&self, kind: AllocKind, handle: u64) -> Option<(usize, u64)> {
        self.with(|m| m.remove(&(kind, handle)))
    }

    fn reset_in_child(&self) {
        // SAFETY: only the forking thread exists in the child, and prepare took
        // the lock, so nothing else holds a reference.
        unsafe { (*self.map.get()).clear() };
        self.unlock();
    }
}
