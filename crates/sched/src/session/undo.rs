//! The statement: an undo log that makes gang placement all-or-nothing.

use std::collections::BTreeMap;

use tessera_model::Resources;

use crate::gpu::Pick;
use crate::state::{JobId, NodeId, QueueId, TaskStatus};

use super::Session;
use super::shares::over;

/// An undo log for gang placement: either the whole group lands, or nothing does.
#[derive(Debug, Default)]
pub(super) struct Stmt {
    pub(super) ops: Vec<Op>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Op {
    Placed(u32),
    Evicted(u32),
}

impl Session<'_, '_, '_> {
    fn commit(&mut self, stmt: Stmt) {
        self.generation += 1;
        for op in stmt.ops {
            if let Op::Placed(t) = op {
                self.placed.push(t);
            }
        }
        self.evicted.append(&mut self.pending_evictions);
    }

    pub(super) fn rollback(&mut self, stmt: Stmt) {
        for op in stmt.ops.into_iter().rev() {
            match op {
                Op::Placed(t) => {
                    self.st.unplace(t, TaskStatus::Pending);
                    self.st.set_choice(t, 0);
                }
                Op::Evicted(t) => self.unevict(t),
            }
        }
        self.pending_evictions.clear();
    }

    /// Puts an evicted task back where it ran, on the devices it had. A task that
    /// ran on no known node (an inconsistent snapshot) held nothing here: evicting
    /// it changed only its status, and so does this.
    fn unevict(&mut self, t: u32) {
        let Some(n) = self.st.tasks[t as usize].node else {
            self.st.tasks[t as usize].status = TaskStatus::Running;
            return;
        };
        self.releasing[n as usize] -= 1;
        let gpus = std::mem::take(&mut self.st.tasks[t as usize].gpus);
        let mig = self.st.tasks[t as usize].mig.take();
        self.st.place(t, n, Pick { gpus, mig }, TaskStatus::Running);
    }

    /// Before a kept attempt is committed, puts back the victims that free room
    /// for nobody: those on nodes where no task of the attempt was placed. The
    /// victim search picks a set with which the task (or the whole gang) fits,
    /// but the tasks take free room first, and free room elsewhere may turn out
    /// to be enough (a gang searched jointly is placed from scratch after each
    /// candidate set); a task whose search found victims may also fail to fit
    /// in the end, in an attempt that is kept for its other tasks. Such
    /// evictions would cost their tasks for nothing. A victim gang comes back
    /// whole unless what stays evicted leaves it at or above `min_member`, and
    /// a victim comes back only within the capability of every queue it shares
    /// with the attempt's job (whose placements may have used the room).
    fn drop_idle_evictions(&mut self, stmt: &mut Stmt) {
        let mut used: Vec<NodeId> = Vec::new();
        let mut placed_queue = None;
        let mut idle: BTreeMap<JobId, (Vec<u32>, bool)> = BTreeMap::new();
        for op in &stmt.ops {
            if let Op::Placed(t) = *op {
                let ts = &self.st.tasks[t as usize];
                used.extend(ts.node);
                placed_queue = placed_queue.or(self.st.jobs[ts.job as usize].queue);
            }
        }
        for op in &stmt.ops {
            if let Op::Evicted(v) = *op {
                let vt = &self.st.tasks[v as usize];
                let e = idle.entry(vt.job).or_insert((Vec::new(), true));
                if vt.node.is_some_and(|n| used.contains(&n)) {
                    e.1 = false;
                } else {
                    e.0.push(v);
                }
            }
        }
        let mut shared: Vec<QueueId> = Vec::new();
        let mut cur = placed_queue;
        while let Some(c) = cur {
            shared.push(c);
            cur = self.st.queues[c as usize].parent;
        }
        let mut back: Vec<u32> = Vec::new();
        for (vj, (vs, all)) in idle {
            if vs.is_empty() {
                continue;
            }
            let job = &self.st.jobs[vj as usize];
            if !all && self.gang && job.occupied + (vs.len() as u32) < job.src.min_member {
                continue;
            }
            let mut req = Resources::default();
            for &v in &vs {
                req.add_assign_saturating(&self.st.tasks[v as usize].request);
            }
            let mut cur = job.queue;
            let mut fits = true;
            while let Some(c) = cur {
                let qs = &self.st.queues[c as usize];
                if shared.contains(&c)
                    && qs
                        .capability
                        .as_ref()
                        .is_some_and(|cap| over(&qs.allocated, &req, cap).is_some())
                {
                    fits = false;
                    break;
                }
                cur = qs.parent;
            }
            if !fits {
                continue;
            }
            for &v in &vs {
                self.unevict(v);
            }
            back.extend(vs);
        }
        if back.is_empty() {
            return;
        }
        stmt.ops
            .retain(|op| !matches!(op, Op::Evicted(v) if back.contains(v)));
        self.pending_evictions.retain(|(v, _)| !back.contains(v));
    }

    /// Ends a job's attempt: keeps it if the gang is satisfied, else undoes it.
    pub(super) fn settle(&mut self, j: JobId, mut stmt: Stmt) -> bool {
        let job = &self.st.jobs[j as usize];
        if !self.gang || job.ready() {
            self.drop_idle_evictions(&mut stmt);
            self.commit(stmt);
            true
        } else {
            let job = &mut self.st.jobs[j as usize];
            job.placeable = job.placeable.max(job.occupied);
            self.rollback(stmt);
            false
        }
    }
}
