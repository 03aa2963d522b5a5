//! `SqliteStore`: the embedded backend, one SQLite file in WAL mode under a data
//! folder.
//!
//! One writer thread owns the write connection and commits in groups: it takes every
//! request waiting in its queue, applies each inside its own savepoint (a failing
//! request rolls back alone), commits once (`synchronous=FULL`: the WAL is fsynced
//! before the commit returns), and only then answers. Reads use a small pool of
//! read connections on the blocking thread pool; WAL lets them run beside the writer.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::{Change, ChangeOp, Key, Listing, Object, Op, Store, StoreError, check_ops};

/// Requests the writer takes into one group commit at most.
const GROUP: usize = 1024;

type Reply = oneshot::Sender<Result<Vec<Object>, StoreError>>;
type Request = (Vec<Op>, Reply);

struct Shared {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<Request>>>,
    readers: Mutex<Vec<Connection>>,
    notify: tokio::sync::watch::Sender<u64>,
}

/// The embedded SQLite backend. Cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.shared.path)
            .finish()
    }
}

fn be(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS objects (
    kind TEXT NOT NULL, tenant TEXT NOT NULL, name TEXT NOT NULL,
    version INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (kind, tenant, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (
    version INTEGER PRIMARY KEY, op INTEGER NOT NULL,
    kind TEXT NOT NULL, tenant TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
";

/// The latest revision: the newest change, or the compacted revision when the
/// whole log was compacted.
const REVISION: &str = "SELECT MAX(COALESCE((SELECT MAX(version) FROM changes), 0),
    COALESCE((SELECT value FROM meta WHERE key = 'compacted'), 0))";
const COMPACTED: &str = "SELECT COALESCE((SELECT value FROM meta WHERE key = 'compacted'), 0)";
/// Change-log rows deleted per transaction while compacting, so writers wait at
/// most for one chunk.
const COMPACT_CHUNK: i64 = 5000;

fn read_u64(c: &Connection, sql: &str) -> Result<u64, StoreError> {
    Ok(c.query_row(sql, [], |r| r.get::<_, i64>(0)).map_err(be)? as u64)
}

/// The database file (and its `-wal`/`-shm`, which SQLite creates with the database's
/// mode) readable and writable by the server's user alone.
fn private_files(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let err = |e: std::io::Error| StoreError::Backend(format!("{}: {e}", path.display()));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    for p in [
        path.to_path_buf(),
        path.with_extension("db-wal"),
        path.with_extension("db-shm"),
    ] {
        if p.exists() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        }
    }
    Ok(())
}

fn open_conn(path: &Path, write: bool) -> Result<Connection, StoreError> {
    let flags = if write {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
    } else {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c = Connection::open_with_flags(path, flags)
        .map_err(|e| StoreError::Backend(format!("opening {}: {e}", path.display())))?;
    c.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(be)?;
    if write {
        c.pragma_update(None, "journal_mode", "WAL").map_err(be)?;
        // Commits never stop to checkpoint; a background thread does it (below), so
        // the write path's latency does not jump every thousand pages.
        c.pragma_update(None, "wal_autocheckpoint", 0).map_err(be)?;
    }
    // FULL: in WAL mode the log is fsynced at every commit, so a commit that returned
    // survives a crash of the process or the machine.
    c.pragma_update(None, "synchronous", "FULL").map_err(be)?;
    Ok(c)
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `dir` (file `tessera.db`).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))?;
        let path = dir.join("tessera.db");
        private_files(&path)?;
        let conn = open_conn(&path, true)?;
        conn.execute_batch(SCHEMA).map_err(be)?;
        let top = read_u64(&conn, REVISION)?;
        let (notify, _) = tokio::sync::watch::channel(top);
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            path: path.clone(),
            writer: Mutex::new(Some(tx)),
            readers: Mutex::new(Vec::new()),
            notify,
        });
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("tessera-sqlite-writer".into())
            .spawn(move || {
                let mut w = Writer { conn, top };
                w.run(rx, |rev| {
                    if let Some(s) = weak.upgrade() {
                        s.notify.send_replace(rev);
                    }
                });
            })
            .map_err(be)?;
        let weak = Arc::downgrade(&shared);
        let ckpt = open_conn(&path, true)?;
        std::thread::Builder::new()
            .name("tessera-sqlite-checkpoint".into())
            .spawn(move || {
                // PASSIVE never blocks the writer or readers; it copies what it can.
                while weak.upgrade().is_some() {
                    let _ = ckpt.execute_batch("PRAGMA wal_checkpoint(PASSIVE)");
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
            })
            .map_err(be)?;
        Ok(SqliteStore { shared })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Runs `f` on a read connection on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let conn = shared.readers.lock().map_err(be)?.pop();
            let conn = match conn {
                Some(c) => c,
                None => open_conn(&shared.path, false)?,
            };
            let out = f(&conn);
            if let Ok(mut pool) = shared.readers.lock()
                && pool.len() < 8
            {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(be)?
    }
}

fn row_object(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, String, i64, String)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn to_object(t: (String, String, String, i64, String)) -> Result<Object, StoreError> {
    let (kind, tenant, name, version, body) = t;
    let body = serde_json::from_str(&body).map_err(be)?;
    Ok(Object {
        kind,
        tenant,
        name,
        version: version as u64,
        body,
    })
}

impl Store for SqliteStore {
    async fn get(&self, key: &Key) -> Result<Option<Object>, StoreError> {
        let key = key.clone();
        self.read(move |c| {
            let mut st = c
                .prepare_cached(
                    "SELECT kind, tenant, name, version, body FROM objects WHERE kind=?1 AND tenant=?2 AND name=?3",
                )
                .map_err(be)?;
            let row = st
                .query_row(params![key.kind, key.tenant, key.name], row_object)
                .optional()
                .map_err(be)?;
            row.map(to_object).transpose()
        })
        .await
    }

    async fn list(&self, kind: &str, tenant: Option<&str>) -> Result<Listing, StoreError> {
        let kind = kind.to_string();
        let tenant = tenant.map(str::to_string);
        self.read(move |c| {
            let tx = c.unchecked_transaction().map_err(be)?;
            let revision = read_u64(&tx, REVISION)?;
            let mut objects = Vec::new();
            {
                let mut st = match &tenant {
                    Some(_) => tx.prepare_cached(
                        "SELECT kind, tenant, name, version, body FROM objects WHERE kind=?1 AND tenant=?2 ORDER BY tenant, name",
                    ),
                    None => tx.prepare_cached(
                        "SELECT kind, tenant, name, version, body FROM objects WHERE kind=?1 ORDER BY tenant, name",
                    ),
                }
                .map_err(be)?;
                let rows = match &tenant {
                    Some(t) => st.query_map(params![kind, t], row_object),
                    None => st.query_map(params![kind], row_object),
                }
                .map_err(be)?;
                for r in rows {
                    objects.push(to_object(r.map_err(be)?)?);
                }
            }
            tx.finish().map_err(be)?;
            Ok(Listing { objects, revision })
        })
        .await
    }

    async fn commit(&self, ops: Vec<Op>) -> Result<Vec<Object>, StoreError> {
        check_ops(&ops)?;
        let (tx, rx) = oneshot::channel();
        {
            let guard = self.shared.writer.lock().map_err(be)?;
            let sender = guard.as_ref().ok_or(StoreError::Closed)?;
            sender.send((ops, tx)).map_err(|_| StoreError::Closed)?;
        }
        rx.await.map_err(|_| StoreError::Closed)?
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Vec<Change>, StoreError> {
        self.read(move |c| {
            let mut st = c
                .prepare_cached(
                    "SELECT kind, tenant, name, version, body, op FROM changes WHERE version > ?1 ORDER BY version LIMIT ?2",
                )
                .map_err(be)?;
            let rows = st
                .query_map(params![after as i64, limit as i64], |r| {
                    Ok((row_object(r)?, r.get::<_, i64>(5)?))
                })
                .map_err(be)?;
            let mut out = Vec::new();
            for r in rows {
                let (o, op) = r.map_err(be)?;
                out.push(Change {
                    op: ChangeOp::from_code(op)?,
                    object: to_object(o)?,
                });
            }
            // Checked after reading: a compaction that removed rows we wanted had
            // committed before the read, so it shows here.
            let compacted = read_u64(c, COMPACTED)?;
            if after < compacted {
                return Err(StoreError::Compacted {
                    requested: after,
                    compacted,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn revision(&self) -> Result<u64, StoreError> {
        self.read(|c| read_u64(c, REVISION)).await
    }

    async fn compact(&self, through: u64) -> Result<u64, StoreError> {
        let path = self.shared.path.clone();
        tokio::task::spawn_blocking(move || {
            let c = open_conn(&path, true)?;
            // First the mark (readers refuse what lies below it from now on), then
            // the rows, a chunk per transaction so that writers are not held up.
            c.execute_batch("BEGIN IMMEDIATE").map_err(be)?;
            let done = (|| {
                let cur = read_u64(&c, COMPACTED)?;
                let target = through.min(read_u64(&c, REVISION)?).max(cur);
                if target > cur {
                    c.execute(
                        "INSERT INTO meta (key, value) VALUES ('compacted', ?1)
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        params![target as i64],
                    )
                    .map_err(be)?;
                }
                Ok(target)
            })();
            let target = match done {
                Ok(t) => {
                    c.execute_batch("COMMIT").map_err(be)?;
                    t
                }
                Err(e) => {
                    let _ = c.execute_batch("ROLLBACK");
                    return Err(e);
                }
            };
            loop {
                let n = c
                    .execute(
                        "DELETE FROM changes WHERE version IN
                         (SELECT version FROM changes WHERE version <= ?1 ORDER BY version LIMIT ?2)",
                        params![target as i64, COMPACT_CHUNK],
                    )
                    .map_err(be)?;
                if (n as i64) < COMPACT_CHUNK {
                    return Ok(target);
                }
            }
        })
        .await
        .map_err(be)?
    }

    async fn compacted(&self) -> Result<u64, StoreError> {
        self.read(|c| read_u64(c, COMPACTED)).await
    }

    fn notifier(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.notify.subscribe()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Dropping the sender ends the writer thread once its queue is empty.
        if let Ok(mut w) = self.writer.lock() {
            w.take();
        }
    }
}

struct Writer {
    conn: Connection,
    top: u64,
}

impl Writer {
    fn run(&mut self, rx: mpsc::Receiver<Request>, notify: impl Fn(u64)) {
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while group.len() < GROUP {
                match rx.try_recv() {
                    Ok(r) => group.push(r),
                    Err(_) => break,
                }
            }
            let before = self.top;
            let results = self.commit_group(&group);
            match results {
                Ok(results) => {
                    notify(self.top);
                    for ((_, reply), r) in group.into_iter().zip(results) {
                        let _ = reply.send(r);
                    }
                }
                Err(e) => {
                    self.top = before;
                    for (_, reply) in group {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Applies a group in one transaction; each request in its own savepoint.
    fn commit_group(
        &mut self,
        group: &[Request],
    ) -> Result<Vec<Result<Vec<Object>, StoreError>>, StoreError> {
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(be)?;
        let mut out = Vec::with_capacity(group.len());
        for (ops, _) in group {
            let mark = self.top;
            if let Err(e) = self.conn.execute_batch("SAVEPOINT req") {
                let _ = self.conn.execute_batch("ROLLBACK");
                return Err(be(e));
            }
            match self.apply(ops) {
                Ok(objs) => {
                    self.conn.execute_batch("RELEASE req").map_err(be)?;
                    out.push(Ok(objs));
                }
                Err(e) => {
                    self.top = mark;
                    self.conn
                        .execute_batch("ROLLBACK TO req; RELEASE req")
                        .map_err(be)?;
                    out.push(Err(e));
                }
            }
        }
        if let Err(e) = self.conn.execute_batch("COMMIT") {
            let _ = self.conn.execute_batch("ROLLBACK");
            return Err(be(e));
        }
        Ok(out)
    }

    fn current(&self, key: &Key) -> Result<Option<(u64, String)>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT version, body FROM objects WHERE kind=?1 AND tenant=?2 AND name=?3",
            )
            .map_err(be)?;
        st.query_row(params![key.kind, key.tenant, key.name], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?))
        })
        .optional()
        .map_err(be)
    }

    fn apply(&mut self, ops: &[Op]) -> Result<Vec<Object>, StoreError> {
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            let key = op.key();
            let cur = self.current(key)?;
            let (change, body_text, body): (ChangeOp, String, Value) = match (op, cur) {
                (Op::Create { .. }, Some(_)) => return Err(StoreError::AlreadyExists(key.clone())),
                (Op::Create { body, .. }, None) => {
                    (ChangeOp::Created, body.to_string(), body.clone())
                }
                (Op::Update { .. } | Op::Delete { .. }, None) => {
                    return Err(StoreError::NotFound(key.clone()));
                }
                (Op::Update { expected, body, .. }, Some((v, _))) => {
                    check_version(key, *expected, v)?;
                    (ChangeOp::Updated, body.to_string(), body.clone())
                }
                (Op::Delete { expected, .. }, Some((v, old))) => {
                    check_version(key, *expected, v)?;
                    let body = serde_json::from_str(&old).map_err(be)?;
                    (ChangeOp::Deleted, old, body)
                }
            };
            self.top += 1;
            let version = self.top as i64;
            match change {
                ChangeOp::Created | ChangeOp::Updated => {
                    self.conn
                        .prepare_cached(
                            "INSERT INTO objects (kind, tenant, name, version, body) VALUES (?1, ?2, ?3, ?4, ?5)
                             ON CONFLICT (kind, tenant, name) DO UPDATE SET version = excluded.version, body = excluded.body",
                        )
                        .map_err(be)?
                        .execute(params![key.kind, key.tenant, key.name, version, body_text])
                        .map_err(be)?;
                }
                ChangeOp::Deleted => {
                    self.conn
                        .prepare_cached(
                            "DELETE FROM objects WHERE kind=?1 AND tenant=?2 AND name=?3",
                        )
                        .map_err(be)?
                        .execute(params![key.kind, key.tenant, key.name])
                        .map_err(be)?;
                }
            }
            self.conn
                .prepare_cached(
                    "INSERT INTO changes (version, op, kind, tenant, name, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(be)?
                .execute(params![version, change.code(), key.kind, key.tenant, key.name, body_text])
                .map_err(be)?;
            out.push(Object {
                kind: key.kind.clone(),
                tenant: key.tenant.clone(),
                name: key.name.clone(),
                version: self.top,
                body,
            });
        }
        Ok(out)
    }
}

pub(crate) fn check_version(
    key: &Key,
    expected: Option<u64>,
    actual: u64,
) -> Result<(), StoreError> {
    match expected {
        Some(e) if e != actual => Err(StoreError::Conflict {
            key: key.clone(),
            expected: e,
            actual,
        }),
        _ => Ok(()),
    }
}
