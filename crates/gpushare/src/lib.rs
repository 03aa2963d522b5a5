//! GPU sharing enforced at run time (issue 21): the node side of fractional GPU
//! tasks. The interposer itself, `libtessera_cuda.so`, is the
//! `tessera-gpushare-cuda` package (`interposer/`); this crate is what both
//! sides share and what the node runtime calls.
//!
//! - [`setup`]: set a fractional task up — [`setup::prepare`] creates the task's
//!   accounting region and returns the sandbox plan (the library, an
//!   `/etc/ld.so.preload` line, the environment) as data; release it when the
//!   task ends.
//! - [`region`]: the region's layout and its memory accounting (per process,
//!   dead processes reclaimed), shared with the interposer.
//! - [`share`]: the pure compute-share controller (token buckets, weighted
//!   max-min fair, work-conserving) and a simulated device for its tests.
//! - [`monitor`] + [`nvml`]: the per-GPU loop that feeds the controller measured
//!   device time and publishes each task's bucket.
//! - [`usage`]: memory used against the cap and compute share used, per task,
//!   as data, Prometheus text and GPU-seconds for usage records.
//! - [`health`]: Xid and ECC events from NVML, and whether one means a task's
//!   own fault or a GPU to stop placing work on.
//! - [`fake`] + [`bench`]: the CI fake driver and `tessera bench gpushare`.
//!
//! Never knows: how sandboxes are built (the plan is data), HTTP, the store, the
//! scheduler. `unsafe` is allowed here for the shared-memory region, futexes and
//! loading the fake driver; each block says why it is sound.
#![allow(unsafe_code)]

pub mod bench;
pub mod fake;
pub mod health;
pub mod monitor;
pub mod nvml;
pub mod region;
pub mod setup;
pub mod share;
pub mod usage;

/// CLOCK_MONOTONIC in nanoseconds: the clock the interposer and the node's
/// compute monitor share (system-wide; the sandbox has no time namespace).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
