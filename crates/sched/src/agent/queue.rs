//! The agent scheduler's queues: an active queue that is fair between tenants and
//! ordered by priority, a back-off queue for tasks that found no room, and an
//! unschedulable pool for tasks that failed too often.
//!
//! Pure: time is a value the caller passes in, and the same calls give the same
//! order. Order of the active queue:
//!
//! 1. tasks re-queued *at the head* after losing every candidate to a conflict
//!    (they already waited their turn);
//! 2. then by priority, higher first;
//! 3. within one priority, round-robin between tenants (one task per tenant per
//!    turn), so a tenant that floods the queue cannot starve another one;
//! 4. within one tenant, first in, first out.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::task::{AgentTask, TenantId};

/// Back-off and give-up settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Back-off after the first failed attempt; doubles with each further one.
    pub backoff_base_ns: u64,
    /// The longest back-off.
    pub backoff_max_ns: u64,
    /// After this many failed attempts a task moves to the unschedulable pool,
    /// where it waits for a cluster event (capacity freed, shard grown).
    pub max_attempts: u32,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            backoff_base_ns: 1_000_000,
            backoff_max_ns: 100_000_000,
            max_attempts: 8,
        }
    }
}

#[derive(Debug, Default)]
struct Band {
    /// Tenants with queued tasks, in round-robin order.
    ring: VecDeque<TenantId>,
    tenants: HashMap<TenantId, VecDeque<AgentTask>>,
    len: usize,
}

#[derive(Debug)]
struct Waiting {
    ready_ns: u64,
    seq: u64,
    task: AgentTask,
}
impl PartialEq for Waiting {
    fn eq(&self, o: &Self) -> bool {
        (self.ready_ns, self.seq) == (o.ready_ns, o.seq)
    }
}
impl Eq for Waiting {}
impl PartialOrd for Waiting {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Waiting {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.ready_ns, self.seq).cmp(&(o.ready_ns, o.seq))
    }
}

/// Where a task went after [`AgentQueue::back_off`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackedOff {
    /// Into the back-off queue until this time.
    Until(u64),
    /// Into the unschedulable pool.
    Unschedulable,
}

/// Lengths of the three queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueLens {
    pub active: usize,
    pub backoff: usize,
    pub unschedulable: usize,
}

/// Active queue, back-off queue and unschedulable pool.
#[derive(Debug, Default)]
pub struct AgentQueue {
    cfg: QueueConfig,
    head: VecDeque<AgentTask>,
    bands: BTreeMap<Reverse<i32>, Band>,
    active_len: usize,
    backoff: BinaryHeap<Reverse<Waiting>>,
    unschedulable: Vec<AgentTask>,
    seq: u64,
}

impl AgentQueue {
    pub fn new(cfg: QueueConfig) -> Self {
        AgentQueue {
            cfg,
            ..Default::default()
        }
    }

    pub fn config(&self) -> &QueueConfig {
        &self.cfg
    }

    /// Adds a task at the tail of its tenant's line.
    pub fn push(&mut self, task: AgentTask) {
        let band = self.bands.entry(Reverse(task.priority)).or_default();
        let q = band.tenants.entry(task.tenant).or_default();
        if q.is_empty() {
            band.ring.push_back(task.tenant);
        }
        q.push_back(task);
        band.len += 1;
        self.active_len += 1;
    }

    /// Puts a task back at the head of the active queue (it lost its candidates to
    /// other workers and keeps its place).
    pub fn push_head(&mut self, task: AgentTask) {
        self.head.push_front(task);
        self.active_len += 1;
    }

    /// Puts several tasks back at the head, keeping their order.
    pub fn push_head_many(&mut self, tasks: &[AgentTask]) {
        for t in tasks.iter().rev() {
            self.push_head(*t);
        }
    }

    /// Takes the next task of the active queue.
    pub fn pop(&mut self) -> Option<AgentTask> {
        if let Some(t) = self.head.pop_front() {
            self.active_len -= 1;
            return Some(t);
        }
        let band = self.bands.values_mut().find(|b| b.len > 0)?;
        let tenant = band.ring.pop_front()?;
        let q = band.tenants.get_mut(&tenant)?;
        let task = q.pop_front()?;
        if !q.is_empty() {
            band.ring.push_back(tenant);
        }
        band.len -= 1;
        self.active_len -= 1;
        Some(task)
    }

    /// Takes up to `n` tasks into `out` (in queue order); returns how many.
    pub fn pop_batch(&mut self, n: usize, out: &mut Vec<AgentTask>) -> usize {
        let mut k = 0;
        while k < n {
            match self.pop() {
                Some(t) => out.push(t),
                None => break,
            }
            k += 1;
        }
        k
    }

    /// A task found no node with room: count the attempt and park it in the
    /// back-off queue (exponential, capped), or in the unschedulable pool once it
    /// has failed `max_attempts` times.
    pub fn back_off(&mut self, mut task: AgentTask, now_ns: u64) -> BackedOff {
        task.attempts = task.attempts.saturating_add(1);
        if task.attempts >= self.cfg.max_attempts {
            self.unschedulable.push(task);
            return BackedOff::Unschedulable;
        }
        let shift = (task.attempts - 1).min(40);
        let wait = self
            .cfg
            .backoff_base_ns
            .saturating_mul(1u64 << shift)
            .min(self.cfg.backoff_max_ns);
        let ready_ns = now_ns.saturating_add(wait);
        self.seq += 1;
        self.backoff.push(Reverse(Waiting {
            ready_ns,
            seq: self.seq,
            task,
        }));
        BackedOff::Until(ready_ns)
    }

    /// Moves every task whose back-off is over into the active queue; returns how many.
    pub fn flush_backoff(&mut self, now_ns: u64) -> usize {
        let mut n = 0;
        while self.backoff.peek().is_some_and(|w| w.0.ready_ns <= now_ns) {
            if let Some(Reverse(w)) = self.backoff.pop() {
                self.push(w.task);
                n += 1;
            }
        }
        n
    }

    /// When the next back-off ends, if any task waits.
    pub fn next_backoff_ready(&self) -> Option<u64> {
        self.backoff.peek().map(|w| w.0.ready_ns)
    }

    /// A cluster event (capacity freed, shard grown): every unschedulable task goes
    /// back to the active queue with its attempts reset. Returns how many.
    pub fn requeue_unschedulable(&mut self) -> usize {
        let tasks = std::mem::take(&mut self.unschedulable);
        let n = tasks.len();
        for mut t in tasks {
            t.attempts = 0;
            self.push(t);
        }
        n
    }

    pub fn lens(&self) -> QueueLens {
        QueueLens {
            active: self.active_len,
            backoff: self.backoff.len(),
            unschedulable: self.unschedulable.len(),
        }
    }

    /// Tasks in all three queues.
    pub fn len(&self) -> usize {
        self.active_len + self.backoff.len() + self.unschedulable.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the active queue has nothing to hand out right now.
    pub fn active_is_empty(&self) -> bool {
        self.active_len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::task::Demand;

    fn t(id: u64, tenant: u32, prio: i32) -> AgentTask {
        let mut t = AgentTask::new(id, TenantId(tenant), Demand::new(100, 1));
        t.priority = prio;
        t
    }

    #[test]
    fn tenants_take_turns_within_a_priority() {
        let mut q = AgentQueue::default();
        for i in 0..4 {
            q.push(t(i, 1, 0));
        }
        q.push(t(10, 2, 0));
        q.push(t(11, 2, 0));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|t| t.id).collect();
        assert_eq!(order, vec![0, 10, 1, 11, 2, 3]);
    }

    #[test]
    fn priority_then_head() {
        let mut q = AgentQueue::default();
        q.push(t(1, 1, 0));
        q.push(t(2, 1, 5));
        q.push_head(t(3, 1, -1));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|t| t.id).collect();
        assert_eq!(order, vec![3, 2, 1]);
    }

    #[test]
    fn backoff_doubles_then_gives_up() {
        let cfg = QueueConfig {
            backoff_base_ns: 10,
            backoff_max_ns: 35,
            max_attempts: 4,
        };
        let mut q = AgentQueue::new(cfg);
        let mut task = t(1, 1, 0);
        assert_eq!(q.back_off(task, 0), BackedOff::Until(10));
        assert_eq!(q.flush_backoff(9), 0);
        assert_eq!(q.flush_backoff(10), 1);
        task = q.pop().unwrap();
        assert_eq!(q.back_off(task, 100), BackedOff::Until(120));
        q.flush_backoff(120);
        task = q.pop().unwrap();
        assert_eq!(q.back_off(task, 200), BackedOff::Until(235));
        q.flush_backoff(235);
        task = q.pop().unwrap();
        assert_eq!(q.back_off(task, 300), BackedOff::Unschedulable);
        assert_eq!(q.lens().unschedulable, 1);
        assert_eq!(q.requeue_unschedulable(), 1);
        assert_eq!(q.pop().unwrap().attempts, 0);
        assert!(q.is_empty());
    }
}
