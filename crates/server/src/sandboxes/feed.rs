//! The sandboxes' change feed: what `/v1/watch?kind=sandbox` streams.
//!
//! API sandboxes live in this server's memory, not in the store, so their changes
//! cannot come from the store's change log. Every change to the listed set goes
//! through [`Listed`] (insert, remove) or [`super::Inner::changed`] (an update), and
//! each one is a [`Change`] here, numbered in order: a watcher resumes after the last
//! number it saw, as with the store's revisions. The numbers start at this process's
//! start time in microseconds, so a number from an earlier run of the server is
//! below every number of this one and is answered 410 (list again), never with a
//! silent gap. The feed keeps the last [`KEPT`] changes; a watcher that fell further
//! behind is answered 410 too.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use serde_json::Value;

use super::Entry;

/// Changes kept for watchers that reconnect.
pub const KEPT: usize = 4096;

/// What happened to a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Created,
    Updated,
    Deleted,
}

impl Op {
    /// The SSE event name, as the store's watch names it.
    pub fn event(self) -> &'static str {
        match self {
            Op::Created => "created",
            Op::Updated => "updated",
            Op::Deleted => "deleted",
        }
    }
}

/// One change: the sandbox as `GET /v1/sandboxes/{id}` shows it after the change (for
/// a delete, as it was last), with `name` and `resource_version` (this change's
/// number) as every watched object has.
#[derive(Debug, Clone)]
pub struct Change {
    pub seq: u64,
    pub tenant: String,
    pub op: Op,
    pub object: Value,
}

/// A watcher asked for changes this feed no longer has (or never had).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone {
    pub requested: u64,
    pub oldest: u64,
}

struct Ring {
    /// The number the next change gets.
    next: u64,
    changes: VecDeque<Change>,
}

/// The numbered changes, and a signal for watchers waiting for the next.
pub struct Feed {
    ring: Mutex<Ring>,
    tick: tokio::sync::watch::Sender<u64>,
}

impl Default for Feed {
    fn default() -> Self {
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        Self::starting_at(start)
    }
}

impl Feed {
    /// A feed whose first change is `start + 1`: watching from `start` misses nothing.
    pub fn starting_at(start: u64) -> Self {
        Self {
            ring: Mutex::new(Ring {
                next: start + 1,
                changes: VecDeque::new(),
            }),
            tick: tokio::sync::watch::channel(start).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The number of the last change (where a new watcher starts).
    pub fn last(&self) -> u64 {
        self.lock().next - 1
    }

    /// Records a change of sandbox `id` of `tenant`; `view(n)` renders it as of
    /// change number `n`. Returns `n`.
    pub fn publish(&self, id: &str, tenant: &str, op: Op, view: impl FnOnce(u64) -> Value) -> u64 {
        let mut r = self.lock();
        let seq = r.next;
        r.next += 1;
        let mut object = view(seq);
        if let Value::Object(m) = &mut object {
            m.insert("name".into(), Value::String(id.to_string()));
            m.insert("resource_version".into(), seq.into());
        }
        r.changes.push_back(Change {
            seq,
            tenant: tenant.to_string(),
            op,
            object,
        });
        while r.changes.len() > KEPT {
            r.changes.pop_front();
        }
        drop(r);
        self.tick.send_replace(seq);
        seq
    }

    /// The changes of `tenant` after `after`, in order; [`Gone`] when some of the
    /// changes after `after` are no longer kept, or `after` is not a number this
    /// feed gave (a later one, or one of an earlier run).
    pub fn since(&self, after: u64, tenant: &str) -> Result<Vec<Change>, Gone> {
        let r = self.lock();
        // The first change still kept; with none dropped yet, the first this feed
        // gave (or the next, before any). Every change after `after` is here when
        // that one is at most `after + 1`.
        let oldest = r.changes.front().map_or(r.next, |c| c.seq);
        // `after` below `next` first: `after + 1` cannot overflow then.
        if after >= r.next || after + 1 < oldest {
            return Err(Gone {
                requested: after,
                oldest: oldest - 1,
            });
        }
        Ok(r.changes
            .iter()
            .filter(|c| c.seq > after && c.tenant == tenant)
            .cloned()
            .collect())
    }

    /// A receiver that wakes when a change is published.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.tick.subscribe()
    }
}

/// The listed sandboxes. The only way to add or remove one, so that every such
/// change is published on the feed: no path can forget it.
pub(super) struct Listed {
    all: HashMap<String, Arc<Entry>>,
    feed: Arc<Feed>,
}

impl Listed {
    pub(super) fn new(feed: Arc<Feed>) -> Self {
        Self {
            all: HashMap::new(),
            feed,
        }
    }

    pub(super) fn get(&self, id: &str) -> Option<&Arc<Entry>> {
        self.all.get(id)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.all.values()
    }

    pub(super) fn len_of(&self, tenant: &str) -> usize {
        self.all.values().filter(|e| e.tenant == tenant).count()
    }

    /// Lists `e` (created, or listed again at start).
    pub(super) fn insert(&mut self, e: Arc<Entry>) {
        changed(&self.feed, &e, Op::Created);
        self.all.insert(e.id.clone(), e);
    }

    /// Takes sandbox `id` off the list.
    pub(super) fn remove(&mut self, id: &str) -> Option<Arc<Entry>> {
        let e = self.all.remove(id)?;
        changed(&self.feed, &e, Op::Deleted);
        Some(e)
    }

    /// Takes every sandbox off the list (the server stops).
    pub(super) fn drain(&mut self) -> Vec<Arc<Entry>> {
        let ids: Vec<String> = self.all.keys().cloned().collect();
        ids.iter().filter_map(|id| self.remove(id)).collect()
    }
}

/// The server-sent events of `tenant`'s changes after `after`, as the store's watch
/// sends them (`event:` created|updated|deleted, `id:` the change's number, `data:`
/// the sandbox); ends with one `event: error` (410 compacted) when the watcher fell
/// behind what the feed keeps, and when `stop` turns true (the server stops).
pub(super) fn events(
    feed: Arc<Feed>,
    tenant: String,
    after: u64,
    stop: tokio::sync::watch::Receiver<bool>,
) -> impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>> + Send
{
    use axum::response::sse::Event;
    let tick = feed.subscribe();
    let state = Some((feed, tenant, after, tick, stop));
    futures_util::stream::unfold(state, |state| async move {
        let (feed, tenant, mut after, mut tick, mut stop) = state?;
        loop {
            // Marked seen before reading: a change published after the read wakes
            // the wait below.
            tick.borrow_and_update();
            match feed.since(after, &tenant) {
                Ok(changes) if !changes.is_empty() => {
                    after = changes.last().map_or(after, |c| c.seq);
                    let out: Vec<Result<Event, std::convert::Infallible>> = changes
                        .into_iter()
                        .map(|c| {
                            Ok(Event::default()
                                .event(c.op.event())
                                .id(c.seq.to_string())
                                .data(c.object.to_string()))
                        })
                        .collect();
                    return Some((out, Some((feed, tenant, after, tick, stop))));
                }
                Ok(_) => {
                    tokio::select! {
                        r = tick.changed() => if r.is_err() { return None },
                        _ = stop.wait_for(|s| *s) => return None,
                    }
                }
                Err(g) => {
                    let e = gone(g);
                    let ev = Event::default()
                        .event("error")
                        .data(crate::problem::problem_json(&e).to_string());
                    return Some((vec![Ok(ev)], None));
                }
            }
        }
    })
    .flat_map(futures_util::stream::iter)
}

/// The 410 a watcher gets for changes the feed does not have.
pub(super) fn gone(g: Gone) -> crate::problem::ApiError {
    crate::problem::ApiError::new(
        crate::problem::Code::Compacted,
        format!(
            "sandbox changes after {} are no longer kept (the oldest kept follows {}), or are of an earlier run of the server: list the sandboxes again and watch from their newest resource_version",
            g.requested, g.oldest
        ),
    )
}

/// Publishes a change of `e`, which takes the change's number as its version.
pub(super) fn changed(feed: &Feed, e: &Entry, op: Op) {
    feed.publish(&e.id, &e.tenant, op, |seq| {
        e.version.store(seq, std::sync::atomic::Ordering::Relaxed);
        super::info(e)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(f: &Feed, id: &str, tenant: &str, op: Op) -> u64 {
        f.publish(id, tenant, op, |_| json!({"sandbox_id": id}))
    }

    #[test]
    fn changes_come_in_order_per_tenant_with_their_numbers() {
        let f = Feed::starting_at(100);
        assert_eq!(f.last(), 100);
        assert_eq!(f.since(100, "a").unwrap().len(), 0);
        assert_eq!(put(&f, "s1", "a", Op::Created), 101);
        put(&f, "s2", "b", Op::Created);
        put(&f, "s1", "a", Op::Deleted);
        let a = f.since(100, "a").unwrap();
        assert_eq!(
            a.iter().map(|c| (c.seq, c.op)).collect::<Vec<_>>(),
            [(101, Op::Created), (103, Op::Deleted)]
        );
        assert_eq!(a[0].object["name"], "s1");
        assert_eq!(a[0].object["resource_version"], 101);
        // Another tenant's changes are never given.
        assert!(f.since(100, "a").unwrap().iter().all(|c| c.tenant == "a"));
        assert_eq!(f.since(101, "a").unwrap().len(), 1);
        assert_eq!(f.since(103, "a").unwrap().len(), 0);
    }

    #[test]
    fn a_number_this_feed_did_not_give_or_no_longer_has_is_gone() {
        let f = Feed::starting_at(100);
        // Of an earlier run (below the start) or from the future.
        assert!(f.since(99, "a").is_err());
        assert!(f.since(101, "a").is_err());
        for i in 0..KEPT + 10 {
            put(&f, &format!("s{i}"), "a", Op::Created);
        }
        // The first ten were dropped: a watcher that saw only up to 105 missed some.
        assert_eq!(
            f.since(105, "a").unwrap_err(),
            Gone {
                requested: 105,
                oldest: 110
            }
        );
        assert_eq!(f.since(110, "a").unwrap().len(), KEPT);
        assert!(f.since(f.last() + 1, "a").is_err());
        // A hostile number is a 410, not an overflow.
        assert!(f.since(u64::MAX, "a").is_err());
    }
}
