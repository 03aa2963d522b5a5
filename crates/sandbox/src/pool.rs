//! Warm pool: sandboxes created ahead of time for one spec (a template), so that a
//! claim is a hand-over, not a start. A claimed sandbox is never returned to the pool:
//! [`WarmPool::release`] destroys it in the background, and replacements are made in
//! the background. The pool's target size follows the claim rate: it keeps about
//! `horizon` worth of claims ready, between `min` and `max`.

use crate::error::SpawnError;
use crate::sandbox::{Runtime, Sandbox};
use crate::spec::SandboxSpec;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Sizing of a warm pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolConfig {
    /// Never fewer ready sandboxes than this (when the pool can keep up).
    pub min: usize,
    /// Never more than this, ready or being made.
    pub max: usize,
    /// Keep this much of the recent claim rate ready.
    pub horizon: Duration,
    /// Background threads that create and destroy sandboxes.
    pub workers: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            min: 2,
            max: 64,
            horizon: Duration::from_millis(500),
            workers: 2,
        }
    }
}

/// Counters, for benchmarks and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolStats {
    pub ready: usize,
    pub creating: usize,
    pub target: usize,
    pub claims: u64,
    /// Claims that found the pool empty and created a sandbox inline.
    pub misses: u64,
    pub created: u64,
    pub destroyed: u64,
    pub spawn_errors: u64,
    /// Estimated claims per second.
    pub claim_rate: f64,
}

struct State {
    ready: VecDeque<Sandbox>,
    to_destroy: Vec<Sandbox>,
    creating: usize,
    target: usize,
    stats: PoolStats,
    last_claim: Option<Instant>,
    shutdown: bool,
    /// No new sandboxes are made while set (destruction goes on).
    paused: bool,
    last_error: Option<String>,
}

struct Inner {
    rt: Arc<Runtime>,
    spec: SandboxSpec,
    cfg: PoolConfig,
    state: Mutex<State>,
    /// Wakes workers (work to do, or shutdown).
    work: Condvar,
    /// Wakes waiters for a ready sandbox.
    filled: Condvar,
}

/// A pool of pre-started sandboxes for one spec.
pub struct WarmPool {
    inner: Arc<Inner>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for WarmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmPool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Updates the claim-rate estimate (an exponentially weighted rate over the
    /// horizon) and the target size.
    fn on_claim(&self, st: &mut State, now: Instant) {
        let h = self.cfg.horizon.as_secs_f64().max(1e-3);
        let rate = match st.last_claim {
            None => 1.0 / h,
            Some(t) => {
                let dt = now.duration_since(t).as_secs_f64().max(1e-6);
                let w = (-dt / h).exp();
                st.stats.claim_rate * w + (1.0 - w) / dt
            }
        };
        st.stats.claim_rate = rate;
        st.last_claim = Some(now);
        st.target = target_for(rate, &self.cfg);
    }

    /// Lets the target fall back when claims stop.
    fn decay(&self, st: &mut State, now: Instant) {
        if let Some(t) = st.last_claim {
            let idle = now.duration_since(t).as_secs_f64();
            let h = self.cfg.horizon.as_secs_f64().max(1e-3);
            if idle > h {
                let rate = st.stats.claim_rate * (-(idle - h) / h).exp();
                st.target = target_for(rate, &self.cfg);
            }
        }
    }
}

/// Ready sandboxes wanted for a claim rate: the claims expected within the horizon,
/// plus one, within `min..=max`.
pub fn target_for(rate_per_s: f64, cfg: &PoolConfig) -> usize {
    let want = (rate_per_s * cfg.horizon.as_secs_f64()).ceil();
    let want = if want.is_finite() && want > 0.0 {
        want as usize + 1
    } else {
        0
    };
    want.clamp(cfg.min, cfg.max.max(cfg.min))
}

fn worker(inner: Arc<Inner>) {
    let mut st = inner.lock();
    loop {
        if let Some(sb) = st.to_destroy.pop() {
            drop(st);
            let _ = sb.destroy();
            drop(sb);
            st = inner.lock();
            st.stats.destroyed += 1;
            continue;
        }
        if st.shutdown {
            return;
        }
        inner.decay(&mut st, Instant::now());
        let have = st.ready.len() + st.creating;
        if have < st.target && !st.paused {
            st.creating += 1;
            drop(st);
            let r = inner.rt.spawn(&inner.spec);
            st = inner.lock();
            st.creating -= 1;
            match r {
                Ok(sb) => {
                    st.stats.created += 1;
                    if st.shutdown {
                        st.to_destroy.push(sb);
                    } else {
                        st.ready.push_back(sb);
                        inner.filled.notify_one();
                    }
                }
                Err(e) => {
                    st.stats.spawn_errors += 1;
                    st.last_error = Some(e.to_string());
                    // Back off instead of spinning on a persistent failure.
                    let (g, _) = inner
                        .work
                        .wait_timeout(st, Duration::from_millis(100))
                        .unwrap_or_else(|p| p.into_inner());
                    st = g;
                }
            }
            continue;
        }
        if st.ready.len() > st.target {
            // Shrink: the oldest ready sandbox goes first.
            if let Some(sb) = st.ready.pop_front() {
                st.to_destroy.push(sb);
                continue;
            }
        }
        let (g, _) = inner
            .work
            .wait_timeout(st, Duration::from_millis(50))
            .unwrap_or_else(|p| p.into_inner());
        st = g;
    }
}

impl WarmPool {
    /// Starts a pool that keeps sandboxes of `spec` ready, beginning with `cfg.min`.
    pub fn new(rt: Arc<Runtime>, spec: SandboxSpec, cfg: PoolConfig) -> WarmPool {
        let inner = Arc::new(Inner {
            rt,
            spec,
            cfg,
            state: Mutex::new(State {
                ready: VecDeque::new(),
                to_destroy: Vec::new(),
                creating: 0,
                target: cfg.min,
                stats: PoolStats::default(),
                last_claim: None,
                shutdown: false,
                paused: false,
                last_error: None,
            }),
            work: Condvar::new(),
            filled: Condvar::new(),
        });
        let workers = (0..cfg.workers.max(1))
            .map(|i| {
                let inner = inner.clone();
                std::thread::Builder::new()
                    .name(format!("tessera-pool-{i}"))
                    .spawn(move || worker(inner))
                    .expect("spawn pool worker thread")
            })
            .collect();
        WarmPool { inner, workers }
    }

    /// Takes a ready sandbox (a hand-over), or creates one inline when none is ready.
    pub fn claim(&self) -> Result<Sandbox, SpawnError> {
        let mut st = self.inner.lock();
        self.inner.on_claim(&mut st, Instant::now());
        st.stats.claims += 1;
        let got = st.ready.pop_front();
        if got.is_none() {
            st.stats.misses += 1;
        }
        drop(st);
        self.inner.work.notify_one();
        match got {
            Some(sb) => Ok(sb),
            None => self.inner.rt.spawn(&self.inner.spec),
        }
    }

    /// Takes a ready sandbox if there is one; never creates inline.
    pub fn try_claim(&self) -> Option<Sandbox> {
        let mut st = self.inner.lock();
        self.inner.on_claim(&mut st, Instant::now());
        st.stats.claims += 1;
        let got = st.ready.pop_front();
        if got.is_none() {
            st.stats.misses += 1;
        }
        drop(st);
        self.inner.work.notify_one();
        got
    }

    /// Gives a used sandbox back to be destroyed in the background (never reused).
    pub fn release(&self, sb: Sandbox) {
        self.inner.lock().to_destroy.push(sb);
        self.inner.work.notify_one();
    }

    /// Waits until at least `n` sandboxes are ready (or `timeout` passes); raises the
    /// target to `n` if it is lower. Returns how many are ready.
    pub fn fill(&self, n: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut st = self.inner.lock();
        st.target = st.target.max(n.min(self.inner.cfg.max));
        self.inner.work.notify_all();
        while st.ready.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let (g, _) = self
                .inner
                .filled
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner());
            st = g;
        }
        st.ready.len()
    }

    pub fn stats(&self) -> PoolStats {
        let st = self.inner.lock();
        PoolStats {
            ready: st.ready.len(),
            creating: st.creating,
            target: st.target,
            ..st.stats
        }
    }

    /// Stops (`true`) or restarts making new sandboxes in the background, for draining
    /// a host or measuring hand-overs without refills competing for the CPU.
    pub fn set_paused(&self, paused: bool) {
        self.inner.lock().paused = paused;
        self.inner.work.notify_all();
    }

    /// The last error a background creation hit, if any.
    pub fn last_error(&self) -> Option<String> {
        self.inner.lock().last_error.clone()
    }

    /// Destroys every ready sandbox and stops the workers (also done on drop).
    pub fn shutdown(&mut self) {
        {
            let mut st = self.inner.lock();
            st.shutdown = true;
            let ready: Vec<Sandbox> = st.ready.drain(..).collect();
            st.to_destroy.extend(ready);
        }
        self.inner.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        // Anything a worker did not get to.
        let rest: Vec<Sandbox> = std::mem::take(&mut self.inner.lock().to_destroy);
        for sb in rest {
            let _ = sb.destroy();
        }
    }
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_follows_rate_within_bounds() {
        let cfg = PoolConfig {
            min: 2,
            max: 10,
            horizon: Duration::from_secs(1),
            workers: 1,
        };
        assert_eq!(target_for(0.0, &cfg), 2);
        assert_eq!(target_for(3.0, &cfg), 4);
        assert_eq!(target_for(1e9, &cfg), 10);
        assert_eq!(target_for(f64::NAN, &cfg), 2);
    }

    proptest::proptest! {
        #[test]
        fn target_is_monotonic_and_bounded(a in 0.0f64..1e6, b in 0.0f64..1e6, min in 0usize..8, extra in 0usize..64) {
            let cfg = PoolConfig { min, max: min + extra, horizon: Duration::from_millis(250), workers: 1 };
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let (tl, th) = (target_for(lo, &cfg), target_for(hi, &cfg));
            proptest::prop_assert!(tl <= th);
            proptest::prop_assert!(tl >= min && th <= min + extra);
        }
    }
}
