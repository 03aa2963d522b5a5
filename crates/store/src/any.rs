//! `AnyStore`: either backend behind one concrete type, chosen at run time.

use crate::{Change, Key, Listing, Object, Op, PgStore, SqliteStore, Store, StoreError};

/// One of the backends, for callers that pick the backend from configuration.
#[derive(Clone, Debug)]
pub enum AnyStore {
    Sqlite(SqliteStore),
    Pg(PgStore),
}

impl AnyStore {
    /// A short name for logs: `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self {
            AnyStore::Sqlite(_) => "sqlite",
            AnyStore::Pg(_) => "postgres",
        }
    }
}

/// Held while this process is the one that runs a singleton loop (see
/// [`AnyStore::lead`]).
#[derive(Debug)]
pub enum Leadership {
    /// The embedded store has one process by construction.
    Sole,
    Pg(crate::pg::PgLeadership),
}

impl AnyStore {
    /// Waits until this process may run the singleton identified by `key` (the
    /// scheduler loop): at once for SQLite, through an advisory lock for PostgreSQL,
    /// so that of several replicas exactly one schedules.
    pub async fn lead(&self, key: i64) -> Result<Leadership, StoreError> {
        match self {
            AnyStore::Sqlite(_) => Ok(Leadership::Sole),
            AnyStore::Pg(p) => Ok(Leadership::Pg(p.lead(key).await?)),
        }
    }
}

impl From<SqliteStore> for AnyStore {
    fn from(s: SqliteStore) -> Self {
        AnyStore::Sqlite(s)
    }
}

impl From<PgStore> for AnyStore {
    fn from(s: PgStore) -> Self {
        AnyStore::Pg(s)
    }
}

impl Store for AnyStore {
    async fn get(&self, key: &Key) -> Result<Option<Object>, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.get(key).await,
            AnyStore::Pg(s) => s.get(key).await,
        }
    }

    async fn list(&self, kind: &str, tenant: Option<&str>) -> Result<Listing, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.list(kind, tenant).await,
            AnyStore::Pg(s) => s.list(kind, tenant).await,
        }
    }

    async fn commit(&self, ops: Vec<Op>) -> Result<Vec<Object>, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.commit(ops).await,
            AnyStore::Pg(s) => s.commit(ops).await,
        }
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Vec<Change>, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.changes(after, limit).await,
            AnyStore::Pg(s) => s.changes(after, limit).await,
        }
    }

    async fn revision(&self) -> Result<u64, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.revision().await,
            AnyStore::Pg(s) => s.revision().await,
        }
    }

    async fn compact(&self, through: u64) -> Result<u64, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.compact(through).await,
            AnyStore::Pg(s) => s.compact(through).await,
        }
    }

    async fn compacted(&self) -> Result<u64, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.compacted().await,
            AnyStore::Pg(s) => s.compacted().await,
        }
    }

    fn notifier(&self) -> tokio::sync::watch::Receiver<u64> {
        match self {
            AnyStore::Sqlite(s) => s.notifier(),
            AnyStore::Pg(s) => s.notifier(),
        }
    }
}
