//! The agent scheduler proper: a shared queue, workers, and the binder.
//!
//! A worker's step: take a batch of tasks from the active queue (one short lock),
//! and for each task select up to K candidates from the shared [`NodeTable`]
//! (lock-free reads, no copy), then let the binder commit the first candidate
//! whose version is unchanged ([`NodeTable::try_commit`]). A task that loses all
//! its candidates to other workers goes back to the *head* of the active queue; a
//! task with no candidate at all goes to the back-off queue. The binder is a
//! protocol, not a thread: the worker that found a placement runs the
//! compare-version-then-commit itself, which saves a hand-off per task.
//!
//! Time comes from a [`Clock`] the caller passes in (a real clock in the
//! benchmark, simulated time in the simulator); this module never reads one.

use super::queue::{AgentQueue, QueueConfig, QueueLens};
use super::select::{Candidate, Cursor, SelectConfig, select};
use super::shard::{Access, Owner, ShardMode};
use super::sync::{Arc, Mutex, RwLock, lock};
use super::table::{CommitError, NodeTable};
use super::task::AgentTask;

#[cfg(not(loom))]
fn lock_std<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where time comes from.
pub trait Clock: Sync {
    fn now_ns(&self) -> u64;
}

/// A clock stopped at one instant (simulations, tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FixedClock(pub u64);

impl Clock for FixedClock {
    fn now_ns(&self) -> u64 {
        self.0
    }
}

/// Agent scheduler settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentConfig {
    pub select: SelectConfig,
    pub queue: QueueConfig,
    /// Tasks a worker takes from the queue per lock (default 32).
    pub batch: usize,
}

impl AgentConfig {
    pub fn new() -> Self {
        AgentConfig {
            batch: 32,
            ..Default::default()
        }
    }
}

/// A placement the binder committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bound {
    pub task: AgentTask,
    pub node: u32,
    /// When the commit happened, by the caller's clock.
    pub bound_ns: u64,
    /// Candidates lost to conflicts before this one succeeded.
    pub conflicts: u32,
}

/// What one worker did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    pub placed: u64,
    /// Commits refused because the node's version had moved.
    pub conflicts: u64,
    /// Commits refused on re-check (no fit, or the node started changing hands).
    pub refused: u64,
    /// Tasks put back at the head after losing all candidates.
    pub requeued: u64,
    /// Tasks sent to back-off for lack of room.
    pub backed_off: u64,
}

impl WorkerStats {
    pub fn add(&mut self, o: &WorkerStats) {
        self.placed += o.placed;
        self.conflicts += o.conflicts;
        self.refused += o.refused;
        self.requeued += o.requeued;
        self.backed_off += o.backed_off;
    }
}

/// One worker's private state: its cursor and scratch buffers.
#[derive(Debug, Default)]
pub struct Worker {
    pub id: usize,
    cursor: Cursor,
    found: Vec<(bool, u64, Candidate)>,
    cands: Vec<Candidate>,
    buf: Vec<AgentTask>,
    retry: Vec<AgentTask>,
    no_room: Vec<AgentTask>,
    pub stats: WorkerStats,
}

#[derive(Debug, Default)]
struct ShardLists {
    own: Vec<u32>,
    borrow: Vec<u32>,
}

/// The agent scheduler over a shared node table.
#[derive(Debug)]
pub struct AgentScheduler<'t> {
    table: &'t NodeTable,
    queue: Mutex<AgentQueue>,
    shards: RwLock<Arc<ShardLists>>,
    cfg: AgentConfig,
    /// Idle workers of [`AgentScheduler::run_threads`] sleep here (a sleeping thread
    /// is woken ahead of busy ones by the OS, which keeps the tail short on a
    /// loaded machine; spinning would compete with the work).
    #[cfg(not(loom))]
    idle: Idle,
}

#[cfg(not(loom))]
#[derive(Debug, Default)]
struct Idle {
    lock: std::sync::Mutex<()>,
    cv: std::sync::Condvar,
    sleepers: std::sync::atomic::AtomicUsize,
}

impl<'t> AgentScheduler<'t> {
    /// A scheduler placing on `own` (its shard) and, in soft mode, borrowing from
    /// `borrow`. The lists only steer the search: the binder checks each node's
    /// shard phase under its lock, so a stale list never causes a wrong placement.
    pub fn new(table: &'t NodeTable, cfg: AgentConfig, own: Vec<u32>, borrow: Vec<u32>) -> Self {
        AgentScheduler {
            table,
            queue: Mutex::new(AgentQueue::new(cfg.queue)),
            shards: RwLock::new(Arc::new(ShardLists { own, borrow })),
            cfg,
            #[cfg(not(loom))]
            idle: Idle::default(),
        }
    }

    pub fn table(&self) -> &NodeTable {
        self.table
    }

    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    /// Replaces the shard lists (after a hand-over step).
    pub fn set_shard(&self, own: Vec<u32>, borrow: Vec<u32>) {
        let lists = Arc::new(ShardLists { own, borrow });
        match self.shards.write() {
            Ok(mut g) => *g = lists,
            Err(p) => *p.into_inner() = lists,
        }
    }

    fn lists(&self) -> Arc<ShardLists> {
        match self.shards.read() {
            Ok(g) => Arc::clone(&g),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    /// Enqueues tasks (their `enqueued_ns` is the caller's to set).
    pub fn submit(&self, tasks: &[AgentTask]) {
        {
            let mut q = lock(&self.queue);
            for t in tasks {
                q.push(*t);
            }
        }
        #[cfg(not(loom))]
        if self.idle.sleepers.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            let _g = lock_std(&self.idle.lock);
            self.idle.cv.notify_all();
        }
    }

    /// Runs `f` on the queue under its lock (inspection, cluster events).
    pub fn with_queue<R>(&self, f: impl FnOnce(&mut AgentQueue) -> R) -> R {
        f(&mut lock(&self.queue))
    }

    pub fn queue_lens(&self) -> QueueLens {
        lock(&self.queue).lens()
    }

    /// A worker, its cursor spread evenly over the shard by its index among `of`.
    pub fn worker(&self, id: usize, of: usize) -> Worker {
        let n = self.lists().own.len();
        let start = n * id / of.max(1);
        Worker {
            id,
            cursor: Cursor {
                own: start,
                borrow: start,
            },
            ..Default::default()
        }
    }

    /// One worker step: takes up to `batch` tasks and tries to bind each. Bindings
    /// are appended to `out`. Returns how many tasks it took from the queue.
    pub fn step<C: Clock + ?Sized>(
        &self,
        w: &mut Worker,
        clock: &C,
        out: &mut Vec<Bound>,
    ) -> usize {
        let now = clock.now_ns();
        w.buf.clear();
        {
            let mut q = lock(&self.queue);
            if q.next_backoff_ready().is_some_and(|r| r <= now) {
                q.flush_backoff(now);
            }
            q.pop_batch(self.cfg.batch.max(1), &mut w.buf);
        }
        let taken = w.buf.len();
        if taken == 0 {
            return 0;
        }
        let lists = self.lists();
        let mode = self.cfg.select.mode;
        for i in 0..taken {
            let task = w.buf[i];
            select(
                self.table,
                &lists.own,
                &lists.borrow,
                &mut w.cursor,
                &task.demand,
                Owner::Agent,
                &self.cfg.select,
                &mut w.found,
                &mut w.cands,
            );
            let mut lost = 0u32;
            let mut bound = false;
            for c in &w.cands {
                match self
                    .table
                    .try_commit(c.node, c.version, &task.demand, Owner::Agent, mode)
                {
                    Ok(_) => {
                        out.push(Bound {
                            task,
                            node: c.node,
                            bound_ns: clock.now_ns(),
                            conflicts: lost,
                        });
                        w.stats.placed += 1;
                        bound = true;
                        break;
                    }
                    Err(CommitError::Stale) => {
                        w.stats.conflicts += 1;
                        lost += 1;
                    }
                    Err(_) => {
                        w.stats.refused += 1;
                        lost += 1;
                    }
                }
            }
            if !bound {
                if w.cands.is_empty() && !self.may_fit(&lists, &task) {
                    w.no_room.push(task);
                } else {
                    w.retry.push(task);
                }
            }
        }
        if !w.retry.is_empty() || !w.no_room.is_empty() {
            let mut q = lock(&self.queue);
            q.push_head_many(&w.retry);
            w.stats.requeued += w.retry.len() as u64;
            for t in w.no_room.drain(..) {
                q.back_off(t, now);
                w.stats.backed_off += 1;
            }
            w.retry.clear();
        }
        taken
    }

    /// Whether `task` fits on a node of the lists, read consistently (waiting
    /// out writers). `select` skips a node that another worker is writing at
    /// that instant; when every node with room was being written, finding no
    /// candidate is contention, not a lack of room, and must not count as a
    /// failed attempt (enough of those make a task unschedulable). The slow
    /// path only: `select` already scanned every node to find nothing.
    fn may_fit(&self, lists: &ShardLists, task: &AgentTask) -> bool {
        let mode = self.cfg.select.mode;
        let fits = |n: &u32, want: Access| {
            self.table.read(*n).is_some_and(|r| {
                r.phase.access(Owner::Agent, mode) == want && task.demand.fits_in(&r.free)
            })
        };
        lists.own.iter().any(|n| fits(n, Access::Own))
            || (mode == ShardMode::Soft && lists.borrow.iter().any(|n| fits(n, Access::Borrow)))
    }

    /// Runs `workers` threads until `stop` returns true while the active queue is
    /// empty. Returns each worker with the bindings it made. `expect` is how many
    /// bindings to make room for in advance, in all (growing a large vector on the
    /// hot path costs page faults, which serialise threads in the kernel).
    #[cfg(not(loom))]
    pub fn run_threads<C: Clock>(
        &self,
        workers: usize,
        clock: &C,
        stop: &(dyn Fn() -> bool + Sync),
        expect: usize,
    ) -> Vec<(Worker, Vec<Bound>)> {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers.max(1))
                .map(|id| {
                    s.spawn(move || {
                        let mut w = self.worker(id, workers.max(1));
                        let mut out: Vec<Bound> =
                            Vec::with_capacity(expect / workers.max(1) + expect / 8);
                        // Touch the pages now, not while binding.
                        out.resize(out.capacity(), Bound::default());
                        out.clear();
                        let mut spins = 0u32;
                        loop {
                            if self.step(&mut w, clock, &mut out) > 0 {
                                spins = 0;
                                continue;
                            }
                            let idle = {
                                let q = lock(&self.queue);
                                q.active_is_empty()
                                    && q.next_backoff_ready().is_none_or(|r| r > clock.now_ns())
                            };
                            if !idle {
                                continue;
                            }
                            if stop() && self.queue_lens().backoff == 0 {
                                break;
                            }
                            spins += 1;
                            if spins < 32 {
                                std::thread::yield_now();
                                continue;
                            }
                            // Sleep until a submit (or 1 ms, for back-off and stop).
                            let idl = &self.idle;
                            idl.sleepers
                                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let g = lock_std(&idl.lock);
                            if lock(&self.queue).active_is_empty() {
                                let _ = idl.cv.wait_timeout(g, std::time::Duration::from_millis(1));
                            }
                            idl.sleepers
                                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                            spins = 0;
                        }
                        (w, out)
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        })
    }
}
