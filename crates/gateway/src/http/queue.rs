//! Admission at the gateway: room in the pool now, or a turn in the per-tenant
//! fair queue.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::Response;
use tokio::sync::oneshot;

use super::pool::Pool;
use super::{InferenceCaller, InferenceGateway, openai_error, too_many};

#[derive(Debug)]
pub(super) struct Ticket {
    id: u64,
    priority: i32,
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
    fn push(&mut self, tenant: &str, t: Ticket) {
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

    fn remove(&mut self, tenant: &str, id: u64) -> bool {
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

impl InferenceGateway {
    /// Admission: the request is granted room in `pool` now (when nobody waits
    /// and there is room), or waits in the fair queue for a grant, up to the
    /// pool's queue timeout. 503 when the pool has no healthy endpoint; 429 when
    /// the queue is full or the wait runs out.
    pub(super) async fn admit(&self, pool: &Pool, who: &InferenceCaller) -> Result<(), Response> {
        let queued_ticket = {
            let Ok(mut g) = pool.inner.lock() else {
                return Err(openai_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "pool state poisoned",
                ));
            };
            let now = Instant::now();
            if g.capacity(now) == 0 {
                return Err(openai_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("pool {:?} has no healthy endpoint", g.spec.name),
                ));
            }
            if g.queue.len == 0 && g.has_room(now) {
                g.granted += 1;
                None
            } else if g.queue.len >= g.spec.max_queue {
                let cap = g.capacity(now).max(1) as u64;
                let wait = (g.queue.len as u64).div_ceil(cap).max(1);
                return Err(too_many(
                    format!(
                        "pool {:?} is saturated: {} requests in flight, {} waiting at the gateway",
                        g.spec.name, g.in_flight, g.queue.len
                    ),
                    wait,
                ));
            } else {
                let (tx, rx) = oneshot::channel();
                let id = self.ids.fetch_add(1, Ordering::Relaxed);
                g.queue.push(
                    &who.tenant,
                    Ticket {
                        id,
                        priority: who.priority,
                        tx,
                    },
                );
                Some((id, rx, Duration::from_millis(g.spec.queue_timeout_ms)))
            }
        };
        if let Some((id, rx, timeout)) = queued_ticket {
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(())) => {}
                _ => {
                    let still_queued = pool
                        .inner
                        .lock()
                        .map(|mut g| g.queue.remove(&who.tenant, id))
                        .unwrap_or(true);
                    if still_queued {
                        return Err(too_many(
                            format!(
                                "waited {} ms at the gateway for room in the pool",
                                timeout.as_millis()
                            ),
                            2,
                        ));
                    }
                    // Granted as the wait ended: go on.
                }
            }
        }
        Ok(())
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
