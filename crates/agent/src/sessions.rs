//! Session records in the store, their state index, and per-session memory
//! (key-value and an append-only history) and checkpoints. What runs a
//! session (sandboxes, the agent process) is in [`crate::host`]; this module
//! is the source of truth that survives both.
//!
//! Layout (tenant-scoped store kinds):
//! - `session`, name = id: [`Session`] as JSON.
//! - `session_idx.<state>`, name = `<runtime>/<id>`: one entry per session,
//!   moved in the same commit as the state change, so listing the active
//!   sessions costs the number of active sessions, not the tenant's history.
//! - `memory`, name = `<session>/<key>`: `{"value"}`; `memory_keys`, name =
//!   session: `{"keys": [...]}` (the key list, written with each put/delete).
//! - `history_head` / `history`: the session's append-only history, a log
//!   (dense sequence numbers from 1) named by session id.
//! - `checkpoint`, name = `<session>/<ns>/<checkpoint id>`; the order of a
//!   session's checkpoints is the log `checkpoint_head` / `checkpoint_log`
//!   named `<session>/<ns>`; `checkpoint_writes`, name =
//!   `<session>/<ns>/<checkpoint id>`: pending writes.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_store::{Key, Op, Store, StoreError};

use crate::error::{AgentError, check_token};
use crate::events;
use crate::runtimes::RuntimeVersion;

pub const KIND_SESSION: &str = "session";
pub const KIND_MEMORY: &str = "memory";
pub const KIND_MEMORY_KEYS: &str = "memory_keys";
pub const KINDS_HISTORY: (&str, &str) = ("history_head", "history");
pub const KIND_CHECKPOINT: &str = "checkpoint";
pub const KINDS_CHECKPOINT_LOG: (&str, &str) = ("checkpoint_head", "checkpoint_log");
pub const KIND_CHECKPOINT_WRITES: &str = "checkpoint_writes";
/// Most memory keys per session.
pub const MAX_MEMORY_KEYS: usize = 10_000;

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// A sandbox is being claimed and the agent started.
    Starting,
    /// Bound to a running sandbox.
    Active,
    /// No sandbox (idle timeout, crash, server restart): the next invocation
    /// resumes it on a new sandbox.
    Idle,
    /// Reached its maximum lifetime.
    Ended,
    /// Gave up (kept for compatibility with the contract's states; sandbox
    /// faults never lead here, they leave the session resumable).
    Failed,
    /// Killed by a user or a budget; `reason` says which.
    Killed,
}

impl State {
    pub const ALL: [State; 6] = [
        State::Starting,
        State::Active,
        State::Idle,
        State::Ended,
        State::Failed,
        State::Killed,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Active => "active",
            State::Idle => "idle",
            State::Ended => "ended",
            State::Failed => "failed",
            State::Killed => "killed",
        }
    }
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|x| x.as_str() == s)
    }
    /// No more invocations.
    pub fn is_final(self) -> bool {
        matches!(self, State::Ended | State::Failed | State::Killed)
    }
    pub(crate) fn index_kind(self) -> String {
        format!("session_idx.{}", self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    #[serde(default)]
    pub max_cost: Option<f64>,
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    pub runtime: String,
    pub version: u64,
    pub state: State,
    /// The sandbox it is bound to while starting or active.
    pub sandbox: Option<String>,
    /// Host pid of that sandbox's init (to clean up after a server crash).
    #[serde(default)]
    pub sandbox_pid: Option<i32>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    #[serde(default)]
    pub last_invoked_at_ms: Option<u64>,
    pub expires_at_ms: u64,
    pub idle_timeout_s: u64,
    pub budget: Budget,
    /// Why it is idle, ended, failed or killed.
    #[serde(default)]
    pub reason: Option<String>,
    /// Sandboxes it has had.
    #[serde(default)]
    pub starts: u64,
    /// Restarts of its agent after a crash or a failed `/ping`.
    #[serde(default)]
    pub restarts: u64,
    #[serde(default)]
    pub invocations: u64,
    /// The session host (server process) that runs it while it is starting
    /// or active, and until when that claim holds unless renewed: with
    /// several replicas on one store, a replica takes over only sessions
    /// whose owner stopped renewing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default)]
    pub lease_until_ms: u64,
    /// The subject (a user, a service account) whose call created it: whom
    /// the tokens it exchanges act for (`sub`, with the session as `act`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<String>,
}

/// A session to create: its id and who starts it (a bare id: nobody recorded).
#[derive(Debug, Clone, Copy)]
pub struct NewSession<'a> {
    pub id: &'a str,
    pub started_by: Option<&'a str>,
}

impl<'a> From<&'a str> for NewSession<'a> {
    fn from(id: &'a str) -> Self {
        NewSession {
            id,
            started_by: None,
        }
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<Value, AgentError> {
    serde_json::to_value(v).map_err(|e| AgentError::Store(StoreError::Backend(e.to_string())))
}

fn parse(o: &tessera_store::Object) -> Result<Session, AgentError> {
    serde_json::from_value(o.body.clone())
        .map_err(|e| AgentError::Store(StoreError::Backend(format!("session {}: {e}", o.name))))
}

fn index_key(tenant: &str, s: &Session) -> Key {
    Key::new(
        s.state.index_kind(),
        tenant,
        format!("{}/{}", s.runtime, s.id),
    )
}

/// Checks a session id given by a client: 1..=128 of `A-Z a-z 0-9 . _ -`.
pub fn check_id(id: &str) -> Result<(), AgentError> {
    check_token("session_id", id, 128)
}

pub async fn get<S: Store>(
    store: &S,
    tenant: &str,
    id: &str,
) -> Result<Option<Session>, AgentError> {
    match store.get(&Key::new(KIND_SESSION, tenant, id)).await? {
        Some(o) => Ok(Some(parse(&o)?)),
        None => Ok(None),
    }
}

/// The session, creating it (state `idle`, no sandbox yet) on `rv` if it does
/// not exist. Returns it and whether it was created.
pub async fn get_or_create<S: Store>(
    store: &S,
    tenant: &str,
    new: impl Into<NewSession<'_>>,
    rv: &RuntimeVersion,
    now_ms: u64,
) -> Result<(Session, bool), AgentError> {
    let NewSession { id, started_by } = new.into();
    check_id(id)?;
    loop {
        if let Some(s) = get(store, tenant, id).await? {
            if s.runtime != rv.runtime {
                return Err(AgentError::invalid(
                    "session_id",
                    format!(
                        "session {id:?} belongs to runtime {:?}, not {:?}",
                        s.runtime, rv.runtime
                    ),
                ));
            }
            return Ok((s, false));
        }
        let s = Session {
            id: id.into(),
            runtime: rv.runtime.clone(),
            version: rv.version,
            state: State::Idle,
            sandbox: None,
            sandbox_pid: None,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            last_invoked_at_ms: None,
            expires_at_ms: now_ms + rv.spec.max_lifetime_s * 1000,
            idle_timeout_s: rv.spec.idle_timeout_s,
            budget: Budget {
                max_cost: rv.spec.session_budget,
            },
            reason: None,
            starts: 0,
            restarts: 0,
            invocations: 0,
            owner: None,
            lease_until_ms: 0,
            started_by: started_by.map(str::to_string),
        };
        let ops = vec![
            Op::Create {
                key: Key::new(KIND_SESSION, tenant, id),
                body: to_json(&s)?,
            },
            Op::Create {
                key: index_key(tenant, &s),
                body: json!({"id": id}),
            },
        ];
        match store.commit(ops).await {
            Ok(_) => return Ok((s, true)),
            Err(StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Applies `f` to the session with compare-and-swap (re-reading and
/// re-applying on a conflict) and moves its index entry when the state
/// changes. `f` returns `Ok(false)` to leave the session as it is.
pub async fn update<S: Store, F>(
    store: &S,
    tenant: &str,
    id: &str,
    mut f: F,
) -> Result<Session, AgentError>
where
    F: FnMut(&mut Session) -> Result<bool, AgentError>,
{
    let key = Key::new(KIND_SESSION, tenant, id);
    for attempt in 0..200u32 {
        let Some(o) = store.get(&key).await? else {
            return Err(AgentError::NotFound(format!("session {id:?}")));
        };
        let before = parse(&o)?;
        let mut after = before.clone();
        if !f(&mut after)? {
            return Ok(before);
        }
        let mut ops = vec![Op::Update {
            key: key.clone(),
            expected: Some(o.version),
            body: to_json(&after)?,
        }];
        if before.state != after.state {
            ops.push(Op::Delete {
                key: index_key(tenant, &before),
                expected: None,
            });
            ops.push(Op::Create {
                key: index_key(tenant, &after),
                body: json!({"id": id}),
            });
        }
        match store.commit(ops).await {
            Ok(_) => return Ok(after),
            Err(StoreError::Conflict { .. }) | Err(StoreError::AlreadyExists(_)) => {
                tokio::time::sleep(std::time::Duration::from_micros(
                    100 * u64::from(attempt.min(20) + 1),
                ))
                .await;
            }
            // The index entry was already gone: repair by retrying without it.
            Err(StoreError::NotFound(k)) if k.kind.starts_with("session_idx.") => {
                let _ = store
                    .create(index_key(tenant, &before), json!({"id": id}))
                    .await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(format!(
        "session {id:?}: too much contention; retry"
    )))
}

/// Sessions in `states` (all states when empty), of one runtime if given,
/// sorted by id. Reads the state indexes only.
pub async fn list<S: Store>(
    store: &S,
    tenant: &str,
    states: &[State],
    runtime: Option<&str>,
) -> Result<Vec<Session>, AgentError> {
    Ok(list_versioned(store, tenant, states, runtime)
        .await?
        .into_iter()
        .map(|(s, _)| s)
        .collect())
}

/// As [`list`], each session with its record's version (what a watcher of
/// [`KIND_SESSION`] compares events with).
pub async fn list_versioned<S: Store>(
    store: &S,
    tenant: &str,
    states: &[State],
    runtime: Option<&str>,
) -> Result<Vec<(Session, u64)>, AgentError> {
    let states: Vec<State> = if states.is_empty() {
        State::ALL.to_vec()
    } else {
        states.to_vec()
    };
    let mut out = Vec::new();
    for st in states {
        let l = store.list(&st.index_kind(), Some(tenant)).await?;
        for o in l.objects {
            if let Some(r) = runtime {
                if !o.name.starts_with(&format!("{r}/")) {
                    continue;
                }
            }
            let id = o.name.rsplit('/').next().unwrap_or_default();
            if let Some(o) = store.get(&Key::new(KIND_SESSION, tenant, id)).await? {
                out.push((parse(&o)?, o.version));
            }
        }
    }
    out.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    Ok(out)
}

// ---- memory ----

fn check_mem_key(k: &str) -> Result<(), AgentError> {
    check_token("key", k, 256)
}

pub async fn memory_get<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    k: &str,
) -> Result<Value, AgentError> {
    check_mem_key(k)?;
    match store
        .get(&Key::new(KIND_MEMORY, tenant, format!("{session}/{k}")))
        .await?
    {
        Some(o) => Ok(o.body.get("value").cloned().unwrap_or(Value::Null)),
        None => Err(AgentError::NotFound(format!(
            "memory key {k:?} of session {session:?}"
        ))),
    }
}

/// Sets `k` to `value` (and records the key in the session's key list).
pub async fn memory_put<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    k: &str,
    value: Value,
) -> Result<(), AgentError> {
    check_id(session)?;
    check_mem_key(k)?;
    let mkey = Key::new(KIND_MEMORY, tenant, format!("{session}/{k}"));
    let lkey = Key::new(KIND_MEMORY_KEYS, tenant, session);
    for _ in 0..100 {
        let cur = store.get(&mkey).await?;
        let keys = store.get(&lkey).await?;
        let mut ops = vec![match &cur {
            Some(o) => Op::Update {
                key: mkey.clone(),
                expected: Some(o.version),
                body: json!({"value": value}),
            },
            None => Op::Create {
                key: mkey.clone(),
                body: json!({"value": value}),
            },
        }];
        let mut list: Vec<String> = keys
            .as_ref()
            .and_then(|o| serde_json::from_value(o.body["keys"].clone()).ok())
            .unwrap_or_default();
        if let Err(pos) = list.binary_search_by(|x| x.as_str().cmp(k)) {
            if list.len() >= MAX_MEMORY_KEYS {
                return Err(AgentError::Quota(format!(
                    "session {session:?} has {MAX_MEMORY_KEYS} memory keys: delete some"
                )));
            }
            list.insert(pos, k.to_string());
            ops.push(match &keys {
                Some(o) => Op::Update {
                    key: lkey.clone(),
                    expected: Some(o.version),
                    body: json!({"keys": list}),
                },
                None => Op::Create {
                    key: lkey.clone(),
                    body: json!({"keys": list}),
                },
            });
        }
        match store.commit(ops).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(format!(
        "memory of session {session:?}: too much contention; retry"
    )))
}

pub async fn memory_delete<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    k: &str,
) -> Result<(), AgentError> {
    check_mem_key(k)?;
    let mkey = Key::new(KIND_MEMORY, tenant, format!("{session}/{k}"));
    let lkey = Key::new(KIND_MEMORY_KEYS, tenant, session);
    for _ in 0..100 {
        let Some(cur) = store.get(&mkey).await? else {
            return Err(AgentError::NotFound(format!(
                "memory key {k:?} of session {session:?}"
            )));
        };
        let mut ops = vec![Op::Delete {
            key: mkey.clone(),
            expected: Some(cur.version),
        }];
        if let Some(o) = store.get(&lkey).await? {
            let mut list: Vec<String> =
                serde_json::from_value(o.body["keys"].clone()).unwrap_or_default();
            list.retain(|x| x != k);
            ops.push(Op::Update {
                key: lkey.clone(),
                expected: Some(o.version),
                body: json!({"keys": list}),
            });
        }
        match store.commit(ops).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(format!(
        "memory of session {session:?}: too much contention; retry"
    )))
}

/// The session's memory keys, sorted.
pub async fn memory_keys<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
) -> Result<Vec<String>, AgentError> {
    Ok(store
        .get(&Key::new(KIND_MEMORY_KEYS, tenant, session))
        .await?
        .and_then(|o| serde_json::from_value(o.body["keys"].clone()).ok())
        .unwrap_or_default())
}

/// Appends an entry to the session's history; returns its sequence number.
pub async fn history_append<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    entry: Value,
    now_ms: u64,
) -> Result<u64, AgentError> {
    check_id(session)?;
    events::append(store, KINDS_HISTORY, tenant, session, entry, now_ms).await
}

pub async fn history_read<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<events::Event>, AgentError> {
    check_id(session)?;
    events::read_log(store, KINDS_HISTORY, tenant, session, after, limit).await
}

// ---- checkpoints ----

/// One checkpoint (LangGraph's vocabulary: a namespace, an id, a parent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    #[serde(default)]
    pub ns: String,
    pub id: String,
    #[serde(default)]
    pub parent_id: Option<String>,
    /// Opaque to Tessera (the saver's serialized checkpoint).
    pub checkpoint: Value,
    #[serde(default)]
    pub metadata: Value,
    #[serde(default)]
    pub created_at_ms: u64,
    /// Position in the session's checkpoint order (set by the store).
    #[serde(default)]
    pub seq: u64,
}

fn check_ns(ns: &str) -> Result<(), AgentError> {
    if ns.is_empty() {
        return Ok(());
    }
    check_token("ns", ns, 128)
}

fn ns_name(ns: &str) -> &str {
    if ns.is_empty() { "_" } else { ns }
}

/// Stores a checkpoint. Putting the same id again with the same content is a
/// no-op (a retried write); with other content it is a conflict.
pub async fn checkpoint_put<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    mut cp: Checkpoint,
    now_ms: u64,
) -> Result<Checkpoint, AgentError> {
    check_id(session)?;
    check_ns(&cp.ns)?;
    check_token("id", &cp.id, 128)?;
    let key = Key::new(
        KIND_CHECKPOINT,
        tenant,
        format!("{session}/{}/{}", ns_name(&cp.ns), cp.id),
    );
    if let Some(o) = store.get(&key).await? {
        let have: Checkpoint = serde_json::from_value(o.body)
            .map_err(|e| AgentError::Store(StoreError::Backend(e.to_string())))?;
        if have.checkpoint == cp.checkpoint && have.parent_id == cp.parent_id {
            return Ok(have);
        }
        return Err(AgentError::AlreadyExists(format!(
            "checkpoint {:?} of session {session:?} with other content",
            cp.id
        )));
    }
    cp.created_at_ms = now_ms;
    // Order first: a crash between the two writes leaves a log entry whose
    // checkpoint is missing, which readers skip; the retry then writes both.
    let log = format!("{session}/{}", ns_name(&cp.ns));
    cp.seq = events::append(
        store,
        KINDS_CHECKPOINT_LOG,
        tenant,
        &log,
        json!({"id": cp.id}),
        now_ms,
    )
    .await?;
    match store.create(key, to_json(&cp)?).await {
        Ok(_) => Ok(cp),
        Err(StoreError::AlreadyExists(_)) => Ok(cp),
        Err(e) => Err(e.into()),
    }
}

pub async fn checkpoint_get<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    ns: &str,
    id: &str,
) -> Result<Option<Checkpoint>, AgentError> {
    check_ns(ns)?;
    let key = Key::new(
        KIND_CHECKPOINT,
        tenant,
        format!("{session}/{}/{id}", ns_name(ns)),
    );
    match store.get(&key).await? {
        Some(o) => {
            Ok(Some(serde_json::from_value(o.body).map_err(|e| {
                AgentError::Store(StoreError::Backend(e.to_string()))
            })?))
        }
        None => Ok(None),
    }
}

/// Checkpoints of a session's namespace, newest first, older than sequence
/// `before` when given.
pub async fn checkpoint_list<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    ns: &str,
    before: Option<u64>,
    limit: usize,
) -> Result<Vec<Checkpoint>, AgentError> {
    check_id(session)?;
    check_ns(ns)?;
    let log = format!("{session}/{}", ns_name(ns));
    let last = events::last_of(store, KINDS_CHECKPOINT_LOG.0, tenant, &log).await?;
    let mut seq = before
        .map(|b| b.saturating_sub(1))
        .unwrap_or(last)
        .min(last);
    let mut out = Vec::new();
    while seq >= 1 && out.len() < limit.max(1) {
        let items = events::read_log(store, KINDS_CHECKPOINT_LOG, tenant, &log, seq - 1, 1).await?;
        if let Some(e) = items.first() {
            if let Some(id) = e.payload.get("id").and_then(Value::as_str) {
                if let Some(cp) = checkpoint_get(store, tenant, session, ns, id).await? {
                    out.push(cp);
                }
            }
        }
        seq -= 1;
    }
    Ok(out)
}

/// Pending writes of a checkpoint (LangGraph's `put_writes`): a list of
/// `{"task_id", "idx", "channel", "value"}`, one per (task, idx).
pub async fn checkpoint_put_writes<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    ns: &str,
    id: &str,
    writes: Vec<Value>,
) -> Result<(), AgentError> {
    check_id(session)?;
    check_ns(ns)?;
    check_token("id", id, 128)?;
    let key = Key::new(
        KIND_CHECKPOINT_WRITES,
        tenant,
        format!("{session}/{}/{id}", ns_name(ns)),
    );
    for _ in 0..100 {
        let cur = store.get(&key).await?;
        let mut list: Vec<Value> = cur
            .as_ref()
            .and_then(|o| o.body.get("writes").cloned())
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        for (i, w) in writes.iter().enumerate() {
            let same =
                |x: &Value| x.get("task_id") == w.get("task_id") && x.get("idx") == w.get("idx");
            if w.get("task_id").and_then(Value::as_str).is_none()
                || w.get("channel").and_then(Value::as_str).is_none()
            {
                return Err(AgentError::invalid(
                    format!("writes[{i}]"),
                    "needs task_id and channel strings",
                ));
            }
            if !list.iter().any(same) {
                list.push(w.clone());
            }
        }
        let res = match cur {
            Some(o) => {
                store
                    .update(key.clone(), Some(o.version), json!({"writes": list}))
                    .await
            }
            None => store.create(key.clone(), json!({"writes": list})).await,
        };
        match res {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(
        "checkpoint writes: too much contention; retry".into(),
    ))
}

pub async fn checkpoint_writes<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
    ns: &str,
    id: &str,
) -> Result<Vec<Value>, AgentError> {
    let key = Key::new(
        KIND_CHECKPOINT_WRITES,
        tenant,
        format!("{session}/{}/{id}", ns_name(ns)),
    );
    Ok(store
        .get(&key)
        .await?
        .and_then(|o| o.body.get("writes").cloned())
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default())
}
