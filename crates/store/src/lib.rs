//! `tessera-store`: Tessera's durable state.
//!
//! One backend-neutral trait, [`Store`], over versioned JSON objects named by
//! `(kind, tenant, name)`; a [`conformance`] suite that every backend must pass;
//! and two backends named by prefix: [`SqliteStore`] (embedded, the default, one
//! file under a data folder) and [`PgStore`] (PostgreSQL, for several control-plane
//! replicas).
//!
//! Every write takes the next value of one store-wide counter, the *revision*; an
//! object's resource version is the revision of its last write, and the change log
//! lists every write in revision order, so a watcher resumes with "changes after
//! revision N". Updates and deletes may be compare-and-swap on the resource version:
//! a stale version is a [`StoreError::Conflict`]. A commit returns only after the
//! backend made it durable (SQLite: WAL with `synchronous=FULL`; PostgreSQL: its
//! commit), so what the API acknowledged survives `kill -9`.
//!
//! The store knows SQL and nothing of HTTP, tenants' meaning, or the scheduler:
//! bodies are opaque JSON to it.

mod any;
pub mod conformance;
mod pg;
mod sqlite;
mod watch;

use std::fmt;
use std::future::Future;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use any::{AnyStore, Leadership};
pub use pg::{PgLeadership, PgStore};
pub use sqlite::SqliteStore;
pub use watch::{WatchFilter, Watcher};

/// Names one object. `tenant` is empty for cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    pub kind: String,
    pub tenant: String,
    pub name: String,
}

impl Key {
    pub fn new(
        kind: impl Into<String>,
        tenant: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Key {
            kind: kind.into(),
            tenant: tenant.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tenant.is_empty() {
            write!(f, "{}/{}", self.kind, self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind, self.tenant, self.name)
        }
    }
}

/// A stored object: its key, its resource version, and its JSON body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Object {
    pub kind: String,
    pub tenant: String,
    pub name: String,
    /// The revision of the object's last write.
    pub version: u64,
    pub body: Value,
}

impl Object {
    pub fn key(&self) -> Key {
        Key::new(&self.kind, &self.tenant, &self.name)
    }
}

/// One write inside a [`Store::commit`].
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Creates `key`; fails with [`StoreError::AlreadyExists`] if it exists.
    Create { key: Key, body: Value },
    /// Replaces the body of `key`. With `expected`, only if the object's version is
    /// still that one ([`StoreError::Conflict`] otherwise).
    Update {
        key: Key,
        expected: Option<u64>,
        body: Value,
    },
    /// Deletes `key`, with the same compare-and-swap rule as `Update`.
    Delete { key: Key, expected: Option<u64> },
}

impl Op {
    pub fn key(&self) -> &Key {
        match self {
            Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. } => key,
        }
    }
}

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeOp {
    Created,
    Updated,
    Deleted,
}

impl ChangeOp {
    fn code(self) -> i64 {
        match self {
            ChangeOp::Created => 1,
            ChangeOp::Updated => 2,
            ChangeOp::Deleted => 3,
        }
    }
    fn from_code(c: i64) -> Result<Self, StoreError> {
        match c {
            1 => Ok(ChangeOp::Created),
            2 => Ok(ChangeOp::Updated),
            3 => Ok(ChangeOp::Deleted),
            other => Err(StoreError::Backend(format!(
                "unknown change op code {other}"
            ))),
        }
    }
}

/// One entry of the change log. For a deletion, `object` carries the last body and
/// the revision of the deletion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub op: ChangeOp,
    pub object: Object,
}

impl Change {
    pub fn version(&self) -> u64 {
        self.object.version
    }
}

/// Objects of a list, sorted by (tenant, name), and the revision they were read at.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Listing {
    pub objects: Vec<Object>,
    pub revision: u64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(Key),
    #[error("{0} already exists")]
    AlreadyExists(Key),
    #[error("{key} changed: expected version {expected}, found {actual}")]
    Conflict {
        key: Key,
        expected: u64,
        actual: u64,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("store backend failed: {0}")]
    Backend(String),
    #[error("the store is closed")]
    Closed,
    /// The change log no longer holds the changes after `requested`: they were
    /// compacted through revision `compacted`. A watcher must list again and watch
    /// from the list's revision.
    #[error(
        "changes after revision {requested} were compacted (the log starts after revision {compacted}): list again and watch from the list's revision"
    )]
    Compacted { requested: u64, compacted: u64 },
}

/// The backend-neutral store. Implementations are cheap to clone (handles to shared
/// state). Every method is safe to call concurrently.
pub trait Store: Clone + Send + Sync + 'static {
    /// The object at `key`, if any.
    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Object>, StoreError>> + Send;

    /// Every object of `kind`, of one tenant or (with `None`) of all tenants, sorted
    /// by (tenant, name).
    fn list(
        &self,
        kind: &str,
        tenant: Option<&str>,
    ) -> impl Future<Output = Result<Listing, StoreError>> + Send;

    /// Applies `ops` atomically: all of them or none. Returns the written objects in
    /// the order of `ops` (a deletion returns the deleted object with the revision of
    /// the deletion). Returns after the commit is durable.
    fn commit(&self, ops: Vec<Op>) -> impl Future<Output = Result<Vec<Object>, StoreError>> + Send;

    /// Up to `limit` changes with a revision greater than `after`, in revision order;
    /// [`StoreError::Compacted`] when some of them were compacted away.
    fn changes(
        &self,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Change>, StoreError>> + Send;

    /// The latest revision.
    fn revision(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Drops the change-log entries with a revision up to `through` (at most the
    /// latest revision), so the log does not grow forever. Objects are untouched.
    /// Afterwards, [`Store::changes`] after a revision below the compacted one is
    /// [`StoreError::Compacted`]. Returns the compacted revision (it never goes
    /// down: compacting to an older revision changes nothing).
    fn compact(&self, through: u64) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The revision the change log was compacted through (0: never).
    fn compacted(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Wakes up when this process commits (carries the latest revision known). A
    /// watcher also polls, so commits by other replicas are seen too.
    fn notifier(&self) -> tokio::sync::watch::Receiver<u64>;

    /// Creates one object.
    fn create(
        &self,
        key: Key,
        body: Value,
    ) -> impl Future<Output = Result<Object, StoreError>> + Send {
        async move { one(self.commit(vec![Op::Create { key, body }]).await?) }
    }

    /// Replaces one object's body, if its version is still `expected` (when given).
    fn update(
        &self,
        key: Key,
        expected: Option<u64>,
        body: Value,
    ) -> impl Future<Output = Result<Object, StoreError>> + Send {
        async move {
            one(self
                .commit(vec![Op::Update {
                    key,
                    expected,
                    body,
                }])
                .await?)
        }
    }

    /// Deletes one object, if its version is still `expected` (when given).
    fn delete(
        &self,
        key: Key,
        expected: Option<u64>,
    ) -> impl Future<Output = Result<Object, StoreError>> + Send {
        async move { one(self.commit(vec![Op::Delete { key, expected }]).await?) }
    }

    /// Watches changes after revision `after` that match `filter`.
    fn watch(&self, after: u64, filter: WatchFilter) -> Watcher<Self> {
        Watcher::new(self.clone(), after, filter)
    }
}

fn one(mut v: Vec<Object>) -> Result<Object, StoreError> {
    v.pop()
        .ok_or_else(|| StoreError::Backend("commit returned no object".into()))
}

/// Checks a commit before it reaches a backend: not empty, no key twice.
fn check_ops(ops: &[Op]) -> Result<(), StoreError> {
    if ops.is_empty() {
        return Err(StoreError::Invalid(
            "a commit needs at least one operation".into(),
        ));
    }
    let mut keys: Vec<&Key> = ops.iter().map(Op::key).collect();
    keys.sort();
    for w in keys.windows(2) {
        if w[0] == w[1] {
            return Err(StoreError::Invalid(format!(
                "{} appears twice in one commit",
                w[0]
            )));
        }
    }
    Ok(())
}
