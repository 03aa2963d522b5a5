//! Watching the change log: a poll API ([`Watcher::next`]) that wakes on local
//! commits and polls for commits by other replicas.

use std::time::Duration;

use crate::{Change, Store, StoreError};

/// Which changes a watcher reports. `None` matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchFilter {
    pub kind: Option<String>,
    pub tenant: Option<String>,
}

impl WatchFilter {
    pub fn matches(&self, c: &Change) -> bool {
        self.kind.as_ref().is_none_or(|k| *k == c.object.kind)
            && self.tenant.as_ref().is_none_or(|t| *t == c.object.tenant)
    }
}

/// How often a watcher looks for commits made by other processes.
const POLL: Duration = Duration::from_millis(250);
const BATCH: usize = 1000;

/// Follows the change log from a revision on.
pub struct Watcher<S: Store> {
    store: S,
    after: u64,
    filter: WatchFilter,
    wake: tokio::sync::watch::Receiver<u64>,
}

impl<S: Store> Watcher<S> {
    pub fn new(store: S, after: u64, filter: WatchFilter) -> Self {
        let wake = store.notifier();
        Watcher {
            store,
            after,
            filter,
            wake,
        }
    }

    /// The revision of the last change consumed.
    pub fn position(&self) -> u64 {
        self.after
    }

    /// Waits for the next matching changes (at least one) and returns them in
    /// revision order.
    pub async fn next(&mut self) -> Result<Vec<Change>, StoreError> {
        loop {
            self.wake.mark_unchanged();
            let batch = self.store.changes(self.after, BATCH).await?;
            if let Some(last) = batch.last() {
                self.after = last.version();
                let out: Vec<Change> = batch
                    .into_iter()
                    .filter(|c| self.filter.matches(c))
                    .collect();
                if !out.is_empty() {
                    return Ok(out);
                }
                continue;
            }
            // Nothing new: sleep until a local commit or the poll interval.
            if let Ok(Err(_closed)) = tokio::time::timeout(POLL, self.wake.changed()).await {
                tokio::time::sleep(POLL).await;
            }
        }
    }
}
