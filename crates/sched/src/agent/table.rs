//! The shared, versioned view of node state that workers read and the binder
//! writes. Nothing is copied per worker: there is one table, one slot per node.
//!
//! Each slot is a sequence lock. Its `version` is even while the slot is stable
//! and odd while a writer holds it; every change adds 2. A worker reads free
//! resources, shard phase and version without taking any lock (and retries if a
//! writer was active). The binder commits a placement with one compare-and-swap
//! from *the version the worker read* to that version plus one: if it succeeds,
//! nothing changed since the read, and it writes the new free resources and
//! publishes version + 2; if it fails, another placement, release or hand-over
//! touched the node, and the worker tries its next candidate. Before writing, the
//! binder also re-checks the fit and the node's shard phase, so a node that started
//! changing hands after the read is refused.
//!
//! Slots are aligned to 64 bytes so that two workers writing neighbouring nodes do
//! not fight over one cache line.

use super::shard::{Access, NodePhase, Owner, ShardMode};
use super::sync::{AtomicU32, AtomicU64, Ordering, fence, spin};
use super::task::Demand;

#[repr(align(64))]
#[derive(Debug)]
struct Slot {
    version: AtomicU64,
    cpu_milli: AtomicU64,
    memory: AtomicU64,
    gpu_milli: AtomicU64,
    pods: AtomicU64,
    phase: AtomicU32,
}

/// One consistent read of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRead {
    pub free: Demand,
    pub phase: NodePhase,
    /// Even; the version to hand to [`NodeTable::try_commit`].
    pub version: u64,
}

/// Why a commit did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitError {
    /// The node changed since it was read (or is being written right now).
    Stale,
    /// The task does not fit the node's free resources.
    NoFit,
    /// The node is not placeable by this scheduler (hand-over, other shard).
    Denied,
    /// No such node.
    NoNode,
}

/// A read source for candidate selection (the table, or a test double).
pub trait NodeSource {
    /// A consistent read, or `None` if the node is being written at this instant
    /// (callers skip it) or does not exist.
    fn peek(&self, node: u32) -> Option<NodeRead>;
}

/// The shared node table.
#[derive(Debug)]
pub struct NodeTable {
    slots: Box<[Slot]>,
    allocatable: Vec<Demand>,
}

impl NodeTable {
    /// A table of nodes with these allocatables, all free, in these phases.
    pub fn new(allocatable: Vec<Demand>, phases: &[NodePhase]) -> Self {
        let slots = allocatable
            .iter()
            .enumerate()
            .map(|(i, a)| Slot {
                version: AtomicU64::new(0),
                cpu_milli: AtomicU64::new(a.cpu_milli),
                memory: AtomicU64::new(a.memory),
                gpu_milli: AtomicU64::new(a.gpu_milli),
                pods: AtomicU64::new(a.pods),
                phase: AtomicU32::new(
                    phases
                        .get(i)
                        .copied()
                        .unwrap_or(NodePhase::InUse(Owner::Agent))
                        .encode(),
                ),
            })
            .collect();
        NodeTable { slots, allocatable }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn allocatable(&self, node: u32) -> Option<Demand> {
        self.allocatable.get(node as usize).copied()
    }

    /// A consistent read, waiting out a writer.
    pub fn read(&self, node: u32) -> Option<NodeRead> {
        let s = self.slots.get(node as usize)?;
        loop {
            if let Some(r) = Self::try_read(s) {
                return Some(r);
            }
            spin();
        }
    }

    #[inline]
    fn try_read(s: &Slot) -> Option<NodeRead> {
        let v1 = s.version.load(Ordering::Acquire);
        if v1 & 1 == 1 {
            return None;
        }
        let free = Demand {
            cpu_milli: s.cpu_milli.load(Ordering::Relaxed),
            memory: s.memory.load(Ordering::Relaxed),
            gpu_milli: s.gpu_milli.load(Ordering::Relaxed),
            pods: s.pods.load(Ordering::Relaxed),
        };
        let phase = NodePhase::decode(s.phase.load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        let v2 = s.version.load(Ordering::Relaxed);
        (v1 == v2).then_some(NodeRead {
            free,
            phase,
            version: v1,
        })
    }

    /// Takes the slot's write lock if its version is still `version`.
    #[inline]
    fn lock_at(s: &Slot, version: u64) -> bool {
        if s.version
            .compare_exchange(version, version + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            fence(Ordering::Release);
            true
        } else {
            false
        }
    }

    /// Takes the slot's write lock whatever its version; returns the version.
    fn lock(s: &Slot) -> u64 {
        loop {
            let v = s.version.load(Ordering::Relaxed);
            if v & 1 == 0 && Self::lock_at(s, v) {
                return v;
            }
            spin();
        }
    }

    #[inline]
    fn free_locked(s: &Slot) -> Demand {
        Demand {
            cpu_milli: s.cpu_milli.load(Ordering::Relaxed),
            memory: s.memory.load(Ordering::Relaxed),
            gpu_milli: s.gpu_milli.load(Ordering::Relaxed),
            pods: s.pods.load(Ordering::Relaxed),
        }
    }

    #[inline]
    fn store_free(s: &Slot, f: &Demand) {
        s.cpu_milli.store(f.cpu_milli, Ordering::Relaxed);
        s.memory.store(f.memory, Ordering::Relaxed);
        s.gpu_milli.store(f.gpu_milli, Ordering::Relaxed);
        s.pods.store(f.pods, Ordering::Relaxed);
    }

    /// Under the lock: checks access and fit, writes, publishes. On refusal the
    /// version goes back to `v` (nothing changed, so readers' copies stay valid).
    #[inline]
    fn place_locked(
        s: &Slot,
        v: u64,
        d: &Demand,
        by: Owner,
        mode: ShardMode,
    ) -> Result<u64, CommitError> {
        let phase = NodePhase::decode(s.phase.load(Ordering::Relaxed));
        if phase.access(by, mode) == Access::Denied {
            s.version.store(v, Ordering::Release);
            return Err(CommitError::Denied);
        }
        match Self::free_locked(s).checked_sub(d) {
            Some(f) => {
                Self::store_free(s, &f);
                s.version.store(v + 2, Ordering::Release);
                Ok(v + 2)
            }
            None => {
                s.version.store(v, Ordering::Release);
                Err(CommitError::NoFit)
            }
        }
    }

    /// The binder's commit: place `d` on `node` only if the node's version is
    /// still `version` (the one the worker read), the node is placeable by `by` in
    /// `mode`, and `d` fits. Returns the new version.
    #[inline]
    pub fn try_commit(
        &self,
        node: u32,
        version: u64,
        d: &Demand,
        by: Owner,
        mode: ShardMode,
    ) -> Result<u64, CommitError> {
        let s = self.slots.get(node as usize).ok_or(CommitError::NoNode)?;
        if !Self::lock_at(s, version) {
            return Err(CommitError::Stale);
        }
        Self::place_locked(s, version, d, by, mode)
    }

    /// Places `d` on `node` whatever its version (for a caller that holds no read,
    /// such as a batch plan applied to the shared table); still checks fit and phase.
    pub fn commit(
        &self,
        node: u32,
        d: &Demand,
        by: Owner,
        mode: ShardMode,
    ) -> Result<u64, CommitError> {
        let s = self.slots.get(node as usize).ok_or(CommitError::NoNode)?;
        let v = Self::lock(s);
        Self::place_locked(s, v, d, by, mode)
    }

    /// Gives `d` back to `node` (a task ended). Capped at the node's allocatable.
    pub fn release(&self, node: u32, d: &Demand) {
        let (Some(s), Some(cap)) = (
            self.slots.get(node as usize),
            self.allocatable.get(node as usize),
        ) else {
            return;
        };
        let v = Self::lock(s);
        let f = Self::free_locked(s).saturating_add(d);
        let f = Demand {
            cpu_milli: f.cpu_milli.min(cap.cpu_milli),
            memory: f.memory.min(cap.memory),
            gpu_milli: f.gpu_milli.min(cap.gpu_milli),
            pods: f.pods.min(cap.pods),
        };
        Self::store_free(s, &f);
        s.version.store(v + 2, Ordering::Release);
    }

    /// Sets a node's shard phase (a hand-over step). Once this returns, no commit
    /// that the new phase denies can succeed on the node: commits check the phase
    /// under the same lock, and the version moved.
    pub fn set_phase(&self, node: u32, phase: NodePhase) {
        let Some(s) = self.slots.get(node as usize) else {
            return;
        };
        let v = Self::lock(s);
        s.phase.store(phase.encode(), Ordering::Relaxed);
        s.version.store(v + 2, Ordering::Release);
    }
}

impl NodeSource for NodeTable {
    #[inline]
    fn peek(&self, node: u32) -> Option<NodeRead> {
        Self::try_read(self.slots.get(node as usize)?)
    }
}
