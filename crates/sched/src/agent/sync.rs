//! `std` or `loom` synchronisation types: built with `--cfg loom`, the concurrent
//! parts of the agent scheduler run on loom's model checker.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, RwLock};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, RwLock};

/// Called inside a wait loop: a CPU hint normally, a yield under loom (so the model
/// checker lets the other thread make progress).
#[inline]
pub(crate) fn spin() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Locks a mutex, taking the data even if another thread panicked holding it
/// (the queue stays consistent: every mutation is complete before it returns).
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> crate::agent::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

#[cfg(loom)]
pub(crate) use loom::sync::MutexGuard;
#[cfg(not(loom))]
pub(crate) use std::sync::MutexGuard;
