//! Launches: a launch goes ahead while the task's compute bucket on its device
//! is not in debt; otherwise it waits for the monitor's next tick. The monitor
//! (node side) refills and debits the bucket from measured device time; here is
//! only the gate, one atomic load on the fast path.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use crate::cu::*;
use crate::driver::real;
use crate::log::{self, Once};
use crate::state::{Clock, State};

/// A monitor that has not ticked for this many tick periods is gone: the share
/// cannot be enforced; that is said (and counted) instead of blocking the task.
const STALE_TICKS: u64 = 100;
/// Launches between checks that a monitor is ticking at all.
const CHECK_EVERY: u32 = 4096;
/// How long a task may launch before its first tick without being told that
/// no monitor is there (its clock, ns).
const FIRST_TICK_GRACE_NS: u64 = 1_000_000_000;

thread_local! {
    static SINCE_CHECK: Cell<u32> = const { Cell::new(0) };
}

fn stale_after(tick_ns: u64) -> u64 {
    tick_ns.max(1_000_000).saturating_mul(STALE_TICKS)
}

fn unenforced(st: &State, dev: usize, why: &str) {
    if let Some(d) = st.region.device(dev) {
        d.unenforced_events.fetch_add(1, Ordering::Relaxed);
    }
    log::once(
        Once::MonitorStale,
        &format!("compute share on device {dev} is not enforced: {why}"),
    );
}

/// Lets a launch on the current device go ahead, waiting while the task is in
/// debt.
fn gate() -> Result<(), CUresult> {
    let st = crate::state::state()?;
    let dev = st.current_device()?;
    if !st.compute_on[dev] {
        return Ok(());
    }
    let h = st.region.header();
    let slot = &h.devices[dev];
    if slot.tokens_ns.load(Ordering::Relaxed) >= 0 {
        let n = SINCE_CHECK.with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n
        });
        if n.is_multiple_of(CHECK_EVERY) {
            let hb = h.heartbeat_ns.load(Ordering::Relaxed);
            let now = st.clock.now_ns();
            if hb == 0 {
                if now.saturating_sub(st.started_ns) > FIRST_TICK_GRACE_NS {
                    unenforced(st, dev, "no compute monitor has ticked for this task");
                }
            } else if now.saturating_sub(hb) > stale_after(h.tick_ns.load(Ordering::Relaxed)) {
                unenforced(st, dev, "the compute monitor stopped ticking");
            }
        }
        return Ok(());
    }
    slot.throttle_events.fetch_add(1, Ordering::Relaxed);
    loop {
        let seq = h.tick_seq.load(Ordering::Acquire);
        if slot.tokens_ns.load(Ordering::Acquire) >= 0 {
            return Ok(());
        }
        let now = st.clock.now_ns();
        let hb = h.heartbeat_ns.load(Ordering::Relaxed);
        let tick = h.tick_ns.load(Ordering::Relaxed);
        if now.saturating_sub(hb) > stale_after(tick) {
            unenforced(st, dev, "the compute monitor stopped ticking");
            return Ok(());
        }
        let next = h.next_tick_ns.load(Ordering::Relaxed);
        match st.clock {
            Clock::Monotonic => {
                let wait = next.saturating_sub(now).saturating_add(1_000_000);
                st.region.wait_for_tick(
                    seq,
                    std::time::Duration::from_nanos(wait.clamp(100_000, 100_000_000)),
                );
            }
            Clock::Fake {
                now: clock,
                sleep_until,
            } => {
                // Simulated time: sleep (letting the simulation advance) until the
                // tick, then yield until the monitor has published it; if it does
                // not, sleep a tick more, so a dead monitor is noticed above.
                // SAFETY: the fake driver's clock functions take plain integers.
                unsafe {
                    if next > now {
                        sleep_until(next);
                    }
                    let mut spins = 0;
                    while h.tick_seq.load(Ordering::Acquire) == seq {
                        spins += 1;
                        if spins > 20_000 {
                            sleep_until(clock().saturating_add(tick.max(1)));
                            break;
                        }
                        std::thread::yield_now();
                    }
                }
            }
        }
    }
}

macro_rules! gated {
    ($($body:tt)*) => {
        guarded!({
            if let Err(rc) = gate() {
                return rc;
            }
            $($body)*
        })
    };
}

type LaunchKernelFn = unsafe extern "C" fn(
    Handle,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    Handle,
    *mut *mut std::ffi::c_void,
    *mut *mut std::ffi::c_void,
) -> CUresult;
type LaunchExFn = unsafe extern "C" fn(
    *const std::ffi::c_void,
    Handle,
    *mut *mut std::ffi::c_void,
    *mut *mut std::ffi::c_void,
) -> CUresult;
type CoopFn = unsafe extern "C" fn(
    Handle,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    Handle,
    *mut *mut std::ffi::c_void,
) -> CUresult;
type GraphLaunchFn = unsafe extern "C" fn(Handle, Handle) -> CUresult;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shmem: u32,
    stream: Handle,
    params: *mut *mut std::ffi::c_void,
    extra: *mut *mut std::ffi::c_void,
) -> CUresult {
    gated! {
        let real = real!(cuLaunchKernel as LaunchKernelFn);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shmem: u32,
    stream: Handle,
    params: *mut *mut std::ffi::c_void,
    extra: *mut *mut std::ffi::c_void,
) -> CUresult {
    gated! {
        let real = real!(cuLaunchKernel_ptsz as LaunchKernelFn);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const std::ffi::c_void,
    f: Handle,
    params: *mut *mut std::ffi::c_void,
    extra: *mut *mut std::ffi::c_void,
) -> CUresult {
    gated! {
        let real = real!(cuLaunchKernelEx as LaunchExFn);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(config, f, params, extra) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const std::ffi::c_void,
    f: Handle,
    params: *mut *mut std::ffi::c_void,
    extra: *mut *mut std::ffi::c_void,
) -> CUresult {
    gated! {
        let real = real!(cuLaunchKernelEx_ptsz as LaunchExFn);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(config, f, params, extra) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shmem: u32,
    stream: Handle,
    params: *mut *mut std::ffi::c_void,
) -> CUresult {
    gated! {
        let real = real!(cuLaunchCooperativeKernel as CoopFn);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shmem: u32,
    stream: Handle,
    params: *mut *mut std::ffi::c_void,
) -> CUresult {
    gated! {
        let real = real!(cuLaunchCooperativeKernel_ptsz as CoopFn);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: Handle, stream: Handle) -> CUresult {
    gated! {
        let real = real!(cuGraphLaunch as GraphLaunchFn);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(exec, stream) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: Handle, stream: Handle) -> CUresult {
    gated! {
        let real = real!(cuGraphLaunch_ptsz as GraphLaunchFn);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(exec, stream) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunch(f: Handle) -> CUresult {
    gated! {
        let real = real!(cuLaunch as unsafe extern "C" fn(Handle) -> CUresult);
        // SAFETY: forwarding the caller's argument.
        unsafe { real(f) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchGrid(f: Handle, w: i32, h: i32) -> CUresult {
    gated! {
        let real = real!(cuLaunchGrid as unsafe extern "C" fn(Handle, i32, i32) -> CUresult);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(f, w, h) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchGridAsync(f: Handle, w: i32, h: i32, stream: Handle) -> CUresult {
    gated! {
        let real = real!(cuLaunchGridAsync as unsafe extern "C" fn(Handle, i32, i32, Handle) -> CUresult);
        // SAFETY: forwarding the caller's arguments.
        unsafe { real(f, w, h, stream) }
    }
}

/// Deprecated since CUDA 11.3: one call launching on several devices, each of
/// which would need its own gate. Refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    _params: *mut std::ffi::c_void,
    _n: u32,
    _flags: u32,
) -> CUresult {
    log::once(
        Once::MultiDevice,
        "cuLaunchCooperativeKernelMultiDevice (deprecated) is not supported under GPU sharing \
         (CUDA_ERROR_NOT_SUPPORTED); launch on each device with cuLaunchCooperativeKernel",
    );
    CUDA_ERROR_NOT_SUPPORTED
}
