//! The per-tenant fair queue at the gateway.

use std::collections::{BTreeMap, VecDeque};

use tokio::sync::oneshot;

#[derive(Debug)]
pub(super) struct Ticket {
    pub(super) id: u64,
    pub(super) priority: i32,
    pub(super) tx: oneshot::Sender<()>,
}

#[derive(Debug, Default)]
pub(super) struct FairQueue {
    /// Per tenant, waiting tickets (FIFO within a tenant).
    by_tenant: BTreeMap<String, VecDeque<Ticket>>,
    /// Tenant served last (round-robin across tenants).
    last: Option<String>,
    pub(super) len: usize,
}

impl FairQueue {
    pub(super) fn push(&mut self, tenant: &str, t: Ticket) {
        self.by_tenant
            .entry(tenant.to_string())
            .or_default()
            .push_back(t);
        self.len += 1;
    }

    /// Next ticket: highest priority first; among equals, the next tenant after
    /// the one served last.
    pub(super) fn pop(&mut self) -> Option<Ticket> {
        let top = self
            .by_tenant
            .values()
            .filter_map(|q| q.front().map(|t| t.priority))
            .max()?;
        let names: Vec<String> = self
            .by_tenant
            .iter()
            .filter(|(_, q)| q.front().is_some_and(|t| t.priority == top))
            .map(|(k, _)| k.clone())
            .collect();
        let next = match &self.last {
            Some(l) => names
                .iter()
                .find(|n| n.as_str() > l.as_str())
                .unwrap_or(&names[0])
                .clone(),
            None => names[0].clone(),
        };
        let q = self.by_tenant.get_mut(&next)?;
        let t = q.pop_front();
        if q.is_empty() {
            self.by_tenant.remove(&next);
        }
        self.len -= 1;
        self.last = Some(next);
        t
    }

    pub(super) fn remove(&mut self, tenant: &str, id: u64) -> bool {
        let Some(q) = self.by_tenant.get_mut(tenant) else {
            return false;
        };
        let before = q.len();
        q.retain(|t| t.id != id);
        let gone = q.len() < before;
        if q.is_empty() {
            self.by_tenant.remove(tenant);
        }
        if gone {
            self.len -= 1;
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_queue_alternates_tenants_and_honours_priority() {
        let mut q = FairQueue::default();
        let mut rxs = Vec::new();
        for (i, (t, p)) in [("a", 0), ("a", 0), ("a", 0), ("b", 0), ("c", 5)]
            .iter()
            .enumerate()
        {
            let (tx, rx) = oneshot::channel();
            rxs.push(rx);
            q.push(
                t,
                Ticket {
                    id: i as u64,
                    priority: *p,
                    tx,
                },
            );
        }
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|t| t.id)).collect();
        assert_eq!(order, vec![4, 0, 3, 1, 2]);
        assert_eq!(q.len, 0);
    }
}
