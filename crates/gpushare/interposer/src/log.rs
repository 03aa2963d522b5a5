//! One line on stderr per kind of problem and process: loud, not a flood.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Clone, Copy)]
#[repr(usize)]
pub enum Once {
    Init,
    MissingEntryPoint,
    Legacy,
    UnknownAllocator,
    OverCap,
    WrongDevice,
    MonitorStale,
    GraphMemNode,
    ProcsFull,
    MultiDevice,
}

const KINDS: usize = 10;
static SAID: [AtomicBool; KINDS] = [const { AtomicBool::new(false) }; KINDS];

/// Writes `tessera-cuda: {msg}` to stderr the first time `kind` happens in this
/// process (a raw write: no allocation-free guarantee needed, no std lock held).
pub fn once(kind: Once, msg: &str) {
    if SAID[kind as usize].swap(true, Ordering::Relaxed) {
        return;
    }
    say(msg);
}

pub fn say(msg: &str) {
    let line = format!("tessera-cuda: {msg}\n");
    // SAFETY: writing a buffer we own to fd 2; a failed write is ignored.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
    }
}

/// Forgets what was said (the child of a fork speaks for itself).
pub fn reset() {
    for s in &SAID {
        s.store(false, Ordering::Relaxed);
    }
}
