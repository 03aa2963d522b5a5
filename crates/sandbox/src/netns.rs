//! Network namespaces made ahead of time, off the hot path of a create.
//!
//! Making a network namespace is the costliest single step of a create (about 1 ms of
//! wall time on the reference machine, much of it under the kernel's `rtnl` and
//! `pernet` locks). A background thread keeps a few fresh namespaces ready, each with
//! loopback up, held by an open `/proc/thread-self/ns/net` descriptor. A create takes
//! one, enters it on the calling thread (`setns`), clones the sandbox's init (which
//! inherits it instead of making one), and returns the thread to where it was.
//!
//! A namespace is used once: the pool closes its descriptor when handing it over, and
//! the namespace dies with the sandbox's last process. Namespaces made by the pool are
//! owned by the host's user namespace, so root inside a sandbox has no capability over
//! its own network (it cannot add addresses, routes, raw sockets or firewall rules);
//! only loopback, which the pool brought up, is there.
//!
//! Needs `CAP_SYS_ADMIN` in the host's user namespace (the supervisor runs as root);
//! without it the pool stays empty and every create makes its own namespace inline.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Default number of namespaces kept ready.
pub const DEFAULT_READY: usize = 8;

struct State {
    ready: Vec<OwnedFd>,
    target: usize,
    shutdown: bool,
    /// Set after the first failure to make a namespace: stop trying.
    broken: Option<String>,
}

struct Inner {
    state: Mutex<State>,
    wake: Condvar,
    made: AtomicU64,
    taken: AtomicU64,
    misses: AtomicU64,
}

/// Counters of a [`NetnsPool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetnsStats {
    pub ready: usize,
    pub target: usize,
    pub made: u64,
    pub taken: u64,
    /// Creates that found the pool empty and made their namespace inline.
    pub misses: u64,
}

/// A pool of ready network namespaces, refilled by one background thread.
pub struct NetnsPool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NetnsPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetnsPool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl NetnsPool {
    /// Starts the pool's thread, which keeps `target` namespaces ready.
    pub fn start(target: usize) -> std::io::Result<NetnsPool> {
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                ready: Vec::with_capacity(target),
                target,
                shutdown: false,
                broken: None,
            }),
            wake: Condvar::new(),
            made: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        });
        let i = inner.clone();
        std::thread::Builder::new()
            .name("tessera-netns".into())
            .spawn(move || filler(i))?;
        Ok(NetnsPool { inner })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a ready namespace, if there is one, and wakes the filler.
    pub fn take(&self) -> Option<OwnedFd> {
        let got = self.lock().ready.pop();
        self.inner.wake.notify_one();
        match got {
            Some(_) => self.inner.taken.fetch_add(1, Ordering::Relaxed),
            None => self.inner.misses.fetch_add(1, Ordering::Relaxed),
        };
        got
    }

    /// Why the pool stopped making namespaces, if it did.
    pub fn error(&self) -> Option<String> {
        self.lock().broken.clone()
    }

    pub fn stats(&self) -> NetnsStats {
        let st = self.lock();
        NetnsStats {
            ready: st.ready.len(),
            target: st.target,
            made: self.inner.made.load(Ordering::Relaxed),
            taken: self.inner.taken.load(Ordering::Relaxed),
            misses: self.inner.misses.load(Ordering::Relaxed),
        }
    }

    /// Changes how many namespaces are kept ready (0 empties the pool).
    pub fn set_target(&self, target: usize) {
        let mut st = self.lock();
        st.target = target;
        st.ready.truncate(target);
        drop(st);
        self.inner.wake.notify_one();
    }

    /// Waits until `n` namespaces are ready (at most `timeout`); returns how many are.
    pub fn fill(&self, n: usize, timeout: Duration) -> usize {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let have = self.lock().ready.len();
            if have >= n || std::time::Instant::now() >= deadline || self.error().is_some() {
                return have;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for NetnsPool {
    fn drop(&mut self) {
        let mut st = self.lock();
        st.shutdown = true;
        st.ready.clear();
        drop(st);
        self.inner.wake.notify_all();
    }
}

fn filler(inner: Arc<Inner>) {
    loop {
        {
            let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
            while !st.shutdown && st.ready.len() >= st.target {
                st = inner.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.shutdown {
                return;
            }
        }
        match make() {
            Ok(fd) => {
                inner.made.fetch_add(1, Ordering::Relaxed);
                let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.shutdown {
                    return;
                }
                st.ready.push(fd);
            }
            Err(e) => {
                let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
                st.broken = Some(e);
                st.target = 0;
                return;
            }
        }
    }
}

/// Makes a namespace on this thread (which stays in it: the filler thread never uses
/// the network), brings loopback up, and returns a descriptor holding it.
fn make() -> Result<OwnedFd, String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("unshare(CLONE_NEWNET): {e}"))?;
    crate::init::loopback_up().map_err(|e| e.to_string())?;
    open_own_netns()
}

/// A descriptor of the calling thread's network namespace.
pub(crate) fn open_own_netns() -> Result<OwnedFd, String> {
    let fd = nix::fcntl::open(
        "/proc/thread-self/ns/net",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("open /proc/thread-self/ns/net: {e}"))?;
    Ok(fd)
}

/// The calling thread's own network namespace, opened on the thread's first create and
/// kept for its lifetime (a create enters a pre-made namespace around `clone` and comes
/// back here; opening `/proc/thread-self/ns/net` each time was a path walk per create).
pub(crate) fn home_netns() -> Result<std::os::fd::RawFd, String> {
    thread_local! {
        static HOME: std::cell::OnceCell<OwnedFd> = const { std::cell::OnceCell::new() };
    }
    HOME.with(|h| {
        if let Some(fd) = h.get() {
            return Ok(fd.as_raw_fd());
        }
        let fd = open_own_netns()?;
        let raw = fd.as_raw_fd();
        let _ = h.set(fd);
        Ok(raw)
    })
}

/// Enters the namespace `fd` on the calling thread.
pub(crate) fn enter(fd: &OwnedFd) -> Result<(), nix::errno::Errno> {
    enter_raw(fd.as_raw_fd())
}

/// Enters the namespace of the descriptor `fd` (open for the duration of the call).
pub(crate) fn enter_raw(fd: std::os::fd::RawFd) -> Result<(), nix::errno::Errno> {
    // SAFETY: setns on a descriptor the caller keeps open; it changes only this thread's
    // network namespace.
    let r = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
    if r < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(())
    }
}
