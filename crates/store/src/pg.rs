//! `PgStore`: the PostgreSQL backend, for several control-plane replicas sharing
//! one database.
//!
//! Writers serialise on one counter row (`tessera_revision`): a commit takes the
//! row lock, reserves revisions for its operations, applies them and commits, so
//! revisions become visible in order and a watcher reading "changes after N" never
//! skips a change that commits later with a smaller revision. Bodies are stored as
//! text, byte for byte.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgPool, Row};
use tokio::sync::{mpsc, oneshot};

use crate::sqlite::check_version;
use crate::{Change, ChangeOp, Key, Listing, Object, Op, Store, StoreError, check_ops};

/// The PostgreSQL backend. Cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// Mixed into advisory lock keys, so instances in different schemas of one
    /// database do not contend.
    lock_salt: i64,
    notify: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    writer: mpsc::UnboundedSender<Request>,
}

type Request = (Vec<Op>, oneshot::Sender<Result<Vec<Object>, StoreError>>);

/// Requests one group commit takes at most.
const GROUP: usize = 512;

/// Proof of holding an advisory lock; see [`PgStore::lead`].
pub struct PgLeadership {
    _conn: sqlx::PgConnection,
}

impl std::fmt::Debug for PgLeadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgLeadership")
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

fn be(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS tessera_objects (
        kind TEXT NOT NULL, tenant TEXT NOT NULL, name TEXT NOT NULL,
        version BIGINT NOT NULL, body TEXT NOT NULL,
        PRIMARY KEY (kind, tenant, name))",
    "CREATE TABLE IF NOT EXISTS tessera_changes (
        version BIGINT PRIMARY KEY, op SMALLINT NOT NULL,
        kind TEXT NOT NULL, tenant TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tessera_revision (id INT PRIMARY KEY, version BIGINT NOT NULL)",
    "INSERT INTO tessera_revision (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
    // The revision the change log was compacted through.
    "ALTER TABLE tessera_revision ADD COLUMN IF NOT EXISTS compacted BIGINT NOT NULL DEFAULT 0",
];

/// Change-log rows deleted per statement while compacting.
const COMPACT_CHUNK: i64 = 5000;

/// Advisory lock key that serialises schema creation between replicas.
const MIGRATE_LOCK: i64 = 0x7e55_e7a0;

impl PgStore {
    /// Connects to `url` (`postgres://user:pass@host:port/db`) and creates the tables
    /// if needed, in the connection's default schema.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_in_schema(url, None).await
    }

    /// Like [`PgStore::connect`], inside `schema` (created if needed). Tests use one
    /// schema each so they can run side by side on one database.
    pub async fn connect_in_schema(url: &str, schema: Option<&str>) -> Result<Self, StoreError> {
        let mut opts = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("PostgreSQL URL: {e}")))?;
        if let Some(s) = schema {
            if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(StoreError::Invalid(format!(
                    "schema name {s:?}: use letters, digits and _"
                )));
            }
            let boot = PgPoolOptions::new()
                .max_connections(1)
                .connect_with(opts.clone())
                .await
                .map_err(|e| StoreError::Backend(format!("connecting to PostgreSQL: {e}")))?;
            // The name was checked above: letters, digits and _ only.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS {s}"
            )))
            .execute(&boot)
            .await
            .map_err(be)?;
            boot.close().await;
            opts = opts.options([("search_path", s)]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(opts)
            .await
            .map_err(|e| StoreError::Backend(format!("connecting to PostgreSQL: {e}")))?;
        {
            let mut conn = pool.acquire().await.map_err(be)?;
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(MIGRATE_LOCK)
                .execute(&mut *conn)
                .await
                .map_err(be)?;
            let mut res = Ok(());
            for stmt in SCHEMA {
                if let Err(e) = sqlx::query(*stmt).execute(&mut *conn).await {
                    res = Err(be(e));
                    break;
                }
            }
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(MIGRATE_LOCK)
                .execute(&mut *conn)
                .await
                .map_err(be)?;
            res?;
        }
        let top = revision(&pool).await?;
        let (notify, _) = tokio::sync::watch::channel(top);
        let notify = std::sync::Arc::new(notify);
        let (writer, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(pool.clone(), rx, notify.clone()));
        // FNV-1a of the schema name.
        let lock_salt = schema
            .unwrap_or("")
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            }) as i64;
        Ok(PgStore {
            pool,
            lock_salt,
            notify,
            writer,
        })
    }

    /// Waits until this process holds the PostgreSQL advisory lock `key` (one
    /// holder across all replicas using the same schema), and returns a guard that holds it on its own
    /// connection. Dropping the guard closes that connection, which releases the lock.
    pub async fn lead(&self, key: i64) -> Result<PgLeadership, StoreError> {
        loop {
            let mut conn = self.pool.acquire().await.map_err(be)?;
            let got: bool = sqlx::query("SELECT pg_try_advisory_lock($1)")
                .bind(key ^ self.lock_salt)
                .fetch_one(&mut *conn)
                .await
                .map_err(be)?
                .try_get(0)
                .map_err(be)?;
            if got {
                return Ok(PgLeadership {
                    _conn: conn.detach(),
                });
            }
            drop(conn);
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }

    /// Drops `schema` with everything in it (tests clean up with this).
    pub async fn drop_schema(url: &str, schema: &str) -> Result<(), StoreError> {
        if !schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(StoreError::Invalid(format!("schema name {schema:?}")));
        }
        let opts = PgConnectOptions::from_str(url).map_err(be)?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(opts)
            .await
            .map_err(be)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .execute(&pool)
        .await
        .map_err(be)?;
        pool.close().await;
        Ok(())
    }
}

async fn revision(pool: &PgPool) -> Result<u64, StoreError> {
    let v: i64 = sqlx::query("SELECT version FROM tessera_revision WHERE id = 1")
        .fetch_one(pool)
        .await
        .map_err(be)?
        .try_get(0)
        .map_err(be)?;
    Ok(v as u64)
}

fn to_object(r: &PgRow) -> Result<Object, StoreError> {
    let body: String = r.try_get(4).map_err(be)?;
    Ok(Object {
        kind: r.try_get(0).map_err(be)?,
        tenant: r.try_get(1).map_err(be)?,
        name: r.try_get(2).map_err(be)?,
        version: r.try_get::<i64, _>(3).map_err(be)? as u64,
        body: serde_json::from_str(&body).map_err(be)?,
    })
}

impl Store for PgStore {
    async fn get(&self, key: &Key) -> Result<Option<Object>, StoreError> {
        let row = sqlx::query(
            "SELECT kind, tenant, name, version, body FROM tessera_objects WHERE kind=$1 AND tenant=$2 AND name=$3",
        )
        .bind(&key.kind)
        .bind(&key.tenant)
        .bind(&key.name)
        .fetch_optional(&self.pool)
        .await
        .map_err(be)?;
        row.as_ref().map(to_object).transpose()
    }

    async fn list(&self, kind: &str, tenant: Option<&str>) -> Result<Listing, StoreError> {
        // One REPEATABLE READ transaction: the revision and the rows agree.
        let mut tx = self.pool.begin().await.map_err(be)?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await
            .map_err(be)?;
        let rev: i64 = sqlx::query("SELECT version FROM tessera_revision WHERE id = 1")
            .fetch_one(&mut *tx)
            .await
            .map_err(be)?
            .try_get(0)
            .map_err(be)?;
        let rows = match tenant {
            Some(t) => {
                sqlx::query(
                    "SELECT kind, tenant, name, version, body FROM tessera_objects WHERE kind=$1 AND tenant=$2 ORDER BY tenant COLLATE \"C\", name COLLATE \"C\"",
                )
                .bind(kind)
                .bind(t)
                .fetch_all(&mut *tx)
                .await
            }
            None => {
                sqlx::query(
                    "SELECT kind, tenant, name, version, body FROM tessera_objects WHERE kind=$1 ORDER BY tenant COLLATE \"C\", name COLLATE \"C\"",
                )
                .bind(kind)
                .fetch_all(&mut *tx)
                .await
            }
        }
        .map_err(be)?;
        tx.commit().await.map_err(be)?;
        let objects = rows.iter().map(to_object).collect::<Result<_, _>>()?;
        Ok(Listing {
            objects,
            revision: rev as u64,
        })
    }

    async fn commit(&self, ops: Vec<Op>) -> Result<Vec<Object>, StoreError> {
        check_ops(&ops)?;
        let (tx, rx) = oneshot::channel();
        self.writer
            .send((ops, tx))
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Vec<Change>, StoreError> {
        // One statement, one snapshot: the compaction mark and the rows agree. The
        // outer row is there even when no change is.
        let rows = sqlx::query(
            "SELECT c.kind, c.tenant, c.name, c.version, c.body, c.op, r.compacted
             FROM tessera_revision r LEFT JOIN LATERAL (
                 SELECT kind, tenant, name, version, body, op FROM tessera_changes
                 WHERE version > $1 ORDER BY version LIMIT $2) c ON true
             WHERE r.id = 1",
        )
        .bind(after as i64)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(be)?;
        let compacted = match rows.first() {
            Some(r) => r.try_get::<i64, _>(6).map_err(be)? as u64,
            None => 0,
        };
        if after < compacted {
            return Err(StoreError::Compacted {
                requested: after,
                compacted,
            });
        }
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            if r.try_get::<Option<i64>, _>(3).map_err(be)?.is_none() {
                continue;
            }
            out.push(Change {
                op: ChangeOp::from_code(i64::from(r.try_get::<i16, _>(5).map_err(be)?))?,
                object: to_object(r)?,
            });
        }
        Ok(out)
    }

    async fn revision(&self) -> Result<u64, StoreError> {
        revision(&self.pool).await
    }

    async fn compact(&self, through: u64) -> Result<u64, StoreError> {
        // The mark first (readers refuse what lies below it from then on), then the
        // rows in chunks; old rows and new inserts do not contend.
        let through = i64::try_from(through).unwrap_or(i64::MAX);
        let target: i64 = sqlx::query(
            "UPDATE tessera_revision SET compacted = GREATEST(compacted, LEAST($1, version))
             WHERE id = 1 RETURNING compacted",
        )
        .bind(through)
        .fetch_one(&self.pool)
        .await
        .map_err(be)?
        .try_get(0)
        .map_err(be)?;
        loop {
            let n = sqlx::query(
                "DELETE FROM tessera_changes WHERE version IN
                 (SELECT version FROM tessera_changes WHERE version <= $1 ORDER BY version LIMIT $2)",
            )
            .bind(target)
            .bind(COMPACT_CHUNK)
            .execute(&self.pool)
            .await
            .map_err(be)?
            .rows_affected();
            if (n as i64) < COMPACT_CHUNK {
                return Ok(target as u64);
            }
        }
    }

    async fn compacted(&self) -> Result<u64, StoreError> {
        let v: i64 = sqlx::query("SELECT compacted FROM tessera_revision WHERE id = 1")
            .fetch_one(&self.pool)
            .await
            .map_err(be)?
            .try_get(0)
            .map_err(be)?;
        Ok(v as u64)
    }

    fn notifier(&self) -> tokio::sync::watch::Receiver<u64> {
        self.notify.subscribe()
    }
}

/// The one writer of this process: takes every waiting request into one
/// transaction (a refused request writes nothing, the others go ahead) and commits
/// once.
async fn write_loop(
    pool: PgPool,
    mut rx: mpsc::UnboundedReceiver<Request>,
    notify: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
) {
    while let Some(first) = rx.recv().await {
        let mut group = vec![first];
        while group.len() < GROUP {
            match rx.try_recv() {
                Ok(r) => group.push(r),
                Err(_) => break,
            }
        }
        match commit_group(&pool, &group).await {
            Ok((results, top)) => {
                if let Some(top) = top {
                    notify.send_replace(top);
                }
                for ((_, reply), r) in group.into_iter().zip(results) {
                    let _ = reply.send(r);
                }
            }
            Err(e) => {
                for (_, reply) in group {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

type GroupResult = (Vec<Result<Vec<Object>, StoreError>>, Option<u64>);

async fn commit_group(pool: &PgPool, group: &[Request]) -> Result<GroupResult, StoreError> {
    let mut tx = pool.begin().await.map_err(be)?;
    // The revision row lock serialises writers of all replicas, so revisions commit
    // in order, and nothing else writes objects while this group is applied.
    let top: i64 = sqlx::query("SELECT version FROM tessera_revision WHERE id = 1 FOR UPDATE")
        .fetch_one(&mut *tx)
        .await
        .map_err(be)?
        .try_get(0)
        .map_err(be)?;
    // Every key of the group, read in one statement (after taking the lock, so the
    // rows are current).
    let mut state = read_keys(&mut tx, group).await?;
    // Decide every request in memory, in order, against the state the earlier
    // ones left: a refused request writes nothing, the others go ahead.
    let mut next = top;
    let mut log = ChangeRows::default();
    let mut out = Vec::with_capacity(group.len());
    for (ops, _) in group {
        match apply(&mut state, ops, &mut next, &mut log) {
            Ok(objs) => out.push(Ok(objs)),
            Err(e) => out.push(Err(e)),
        }
    }
    if next != top {
        write_group(&mut tx, &state, &log, next).await?;
    }
    tx.commit().await.map_err(be)?;
    Ok((out, (next != top).then_some(next as u64)))
}

/// A key's stored state while a group is applied: `None` when absent, and whether
/// the group changed it.
struct Slot {
    current: Option<(u64, String)>,
    dirty: bool,
}

type State = std::collections::HashMap<Key, Slot>;

async fn read_keys(tx: &mut sqlx::PgConnection, group: &[Request]) -> Result<State, StoreError> {
    let mut state: State = std::collections::HashMap::new();
    let (mut kinds, mut tenants, mut names) = (Vec::new(), Vec::new(), Vec::new());
    for (ops, _) in group {
        for op in ops {
            let k = op.key();
            if !state.contains_key(k) {
                state.insert(
                    k.clone(),
                    Slot {
                        current: None,
                        dirty: false,
                    },
                );
                kinds.push(k.kind.clone());
                tenants.push(k.tenant.clone());
                names.push(k.name.clone());
            }
        }
    }
    let rows = sqlx::query(
        "SELECT o.kind, o.tenant, o.name, o.version, o.body FROM tessera_objects o
         JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(kind, tenant, name)
           ON o.kind = k.kind AND o.tenant = k.tenant AND o.name = k.name",
    )
    .bind(&kinds)
    .bind(&tenants)
    .bind(&names)
    .fetch_all(&mut *tx)
    .await
    .map_err(be)?;
    for r in &rows {
        let key = Key::new(
            r.try_get::<String, _>(0).map_err(be)?,
            r.try_get::<String, _>(1).map_err(be)?,
            r.try_get::<String, _>(2).map_err(be)?,
        );
        let version = r.try_get::<i64, _>(3).map_err(be)? as u64;
        let body: String = r.try_get(4).map_err(be)?;
        if let Some(slot) = state.get_mut(&key) {
            slot.current = Some((version, body));
        }
    }
    Ok(state)
}

/// The change-log rows of a group, column by column.
#[derive(Default)]
struct ChangeRows {
    version: Vec<i64>,
    op: Vec<i16>,
    kind: Vec<String>,
    tenant: Vec<String>,
    name: Vec<String>,
    body: Vec<String>,
}

/// Applies one request to the in-memory state, all of its operations or none.
fn apply(
    state: &mut State,
    ops: &[Op],
    next: &mut i64,
    log: &mut ChangeRows,
) -> Result<Vec<Object>, StoreError> {
    // Check every operation before changing anything.
    for op in ops {
        let key = op.key();
        let cur = state.get(key).and_then(|s| s.current.as_ref());
        let refused = match (op, cur) {
            (Op::Create { .. }, Some(_)) => Some(StoreError::AlreadyExists(key.clone())),
            (Op::Create { .. }, None) => None,
            (Op::Update { .. } | Op::Delete { .. }, None) => {
                Some(StoreError::NotFound(key.clone()))
            }
            (Op::Update { expected, .. } | Op::Delete { expected, .. }, Some((v, _))) => {
                check_version(key, *expected, *v).err()
            }
        };
        if let Some(e) = refused {
            return Err(e);
        }
    }
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        *next += 1;
        let version = *next;
        let key = op.key();
        let slot = state.get_mut(key).ok_or_else(|| be("key not read"))?;
        let (change, text, body) = match op {
            Op::Create { body, .. } => (ChangeOp::Created, body.to_string(), body.clone()),
            Op::Update { body, .. } => (ChangeOp::Updated, body.to_string(), body.clone()),
            Op::Delete { .. } => {
                let old = slot.current.take().map(|(_, b)| b).unwrap_or_default();
                let body = serde_json::from_str(&old).map_err(be)?;
                (ChangeOp::Deleted, old, body)
            }
        };
        if change != ChangeOp::Deleted {
            slot.current = Some((version as u64, text.clone()));
        }
        slot.dirty = true;
        log.version.push(version);
        log.op.push(change.code() as i16);
        log.kind.push(key.kind.clone());
        log.tenant.push(key.tenant.clone());
        log.name.push(key.name.clone());
        log.body.push(text);
        out.push(Object {
            kind: key.kind.clone(),
            tenant: key.tenant.clone(),
            name: key.name.clone(),
            version: version as u64,
            body,
        });
    }
    Ok(out)
}

/// Writes a group's outcome in one statement: the final state of every key it
/// changed (upserted or deleted), its change-log rows, and the revision.
async fn write_group(
    tx: &mut sqlx::PgConnection,
    state: &State,
    log: &ChangeRows,
    next: i64,
) -> Result<(), StoreError> {
    let (mut pk, mut pt, mut pn, mut pv, mut pb) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut dk, mut dt, mut dn) = (Vec::new(), Vec::new(), Vec::new());
    for (key, slot) in state.iter().filter(|(_, s)| s.dirty) {
        match &slot.current {
            Some((v, body)) => {
                pk.push(key.kind.as_str());
                pt.push(key.tenant.as_str());
                pn.push(key.name.as_str());
                pv.push(*v as i64);
                pb.push(body.as_str());
            }
            None => {
                dk.push(key.kind.as_str());
                dt.push(key.tenant.as_str());
                dn.push(key.name.as_str());
            }
        }
    }
    sqlx::query(
        "WITH put AS (
             INSERT INTO tessera_objects (kind, tenant, name, version, body)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[])
             ON CONFLICT (kind, tenant, name) DO UPDATE SET version = EXCLUDED.version, body = EXCLUDED.body),
         gone AS (
             DELETE FROM tessera_objects o USING unnest($6::text[], $7::text[], $8::text[]) AS k(kind, tenant, name)
             WHERE o.kind = k.kind AND o.tenant = k.tenant AND o.name = k.name),
         rev AS (
             UPDATE tessera_revision SET version = $15 WHERE id = 1)
         INSERT INTO tessera_changes (version, op, kind, tenant, name, body)
         SELECT * FROM unnest($9::bigint[], $10::smallint[], $11::text[], $12::text[], $13::text[], $14::text[])",
    )
    .bind(&pk)
    .bind(&pt)
    .bind(&pn)
    .bind(&pv)
    .bind(&pb)
    .bind(&dk)
    .bind(&dt)
    .bind(&dn)
    .bind(&log.version)
    .bind(&log.op)
    .bind(&log.kind)
    .bind(&log.tenant)
    .bind(&log.name)
    .bind(&log.body)
    .bind(next)
    .execute(&mut *tx)
    .await
    .map_err(be)?;
    Ok(())
}
