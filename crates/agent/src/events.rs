//! Durable per-tenant topics in the store: publish, read after an offset,
//! consumer offsets, and a wait for new events (the server streams them as
//! server-sent events).
//!
//! Layout (kinds of `tessera-store` objects, all scoped to the tenant):
//! - `topic`, name = topic: `{"next": N}` — the offset the next event gets.
//! - `topic_event`, name = `<topic>/<offset, 20 digits>`: `{"topic", "offset", "payload", "at_ms"}`.
//! - `consumer_offset`, name = `<topic>/<consumer>`: `{"offset": N}` — the last
//!   offset the consumer processed.
//!
//! Publishing updates the topic head (compare-and-swap on its version) and
//! creates the event in one commit, so offsets are dense (1, 2, 3, ...), never
//! reused and ordered per topic even with several publishers or replicas. A
//! reader fetches events by key (offset after offset), so reading costs the
//! number of events returned, not the size of the topic.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_store::{Key, Op, Store, StoreError};

use crate::error::{AgentError, check_token};

pub const KIND_TOPIC: &str = "topic";
/// Not `event`: the core API already lists cluster events under that kind.
pub const KIND_EVENT: &str = "topic_event";
pub const KIND_OFFSET: &str = "consumer_offset";

/// Longest topic or consumer name.
pub const MAX_NAME: usize = 128;
/// Most events one read returns.
pub const MAX_READ: usize = 1000;

/// One published event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub topic: String,
    /// 1 for the first event of a topic, then +1 per event.
    pub offset: u64,
    pub payload: Value,
    pub at_ms: u64,
}

fn item_key(kind: &str, tenant: &str, topic: &str, offset: u64) -> Key {
    Key::new(kind, tenant, format!("{topic}/{offset:020}"))
}

fn head_next(body: &Value) -> u64 {
    body.get("next").and_then(Value::as_u64).unwrap_or(1)
}

/// Appends `payload` to `topic` and returns its offset. Retries when another
/// publisher wins the race for the same offset.
pub async fn publish<S: Store>(
    store: &S,
    tenant: &str,
    topic: &str,
    payload: Value,
    at_ms: u64,
) -> Result<u64, AgentError> {
    check_token("topic", topic, MAX_NAME)?;
    append(
        store,
        (KIND_TOPIC, KIND_EVENT),
        tenant,
        topic,
        payload,
        at_ms,
    )
    .await
}

/// An append-only log under two store kinds (its heads and its items): topics,
/// and the platform's own logs (session history, checkpoints).
pub(crate) async fn append<S: Store>(
    store: &S,
    kinds: (&str, &str),
    tenant: &str,
    topic: &str,
    payload: Value,
    at_ms: u64,
) -> Result<u64, AgentError> {
    let head = Key::new(kinds.0, tenant, topic);
    for attempt in 0..200u32 {
        let cur = store.get(&head).await?;
        let (next, head_op) = match &cur {
            Some(o) => {
                let next = head_next(&o.body);
                (
                    next,
                    Op::Update {
                        key: head.clone(),
                        expected: Some(o.version),
                        body: json!({"next": next + 1, "created_at_ms": o.body.get("created_at_ms").cloned().unwrap_or(json!(at_ms))}),
                    },
                )
            }
            None => (
                1,
                Op::Create {
                    key: head.clone(),
                    body: json!({"next": 2, "created_at_ms": at_ms}),
                },
            ),
        };
        let ev = Event {
            topic: topic.to_string(),
            offset: next,
            payload: payload.clone(),
            at_ms,
        };
        let body =
            serde_json::to_value(&ev).map_err(|e| AgentError::invalid("payload", e.to_string()))?;
        match store
            .commit(vec![
                head_op,
                Op::Create {
                    key: item_key(kinds.1, tenant, topic, next),
                    body,
                },
            ])
            .await
        {
            Ok(_) => return Ok(next),
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => {
                // Lost the race: back off a little (more the more we lose).
                let us = 50u64 * u64::from(attempt.min(40) + 1);
                tokio::time::sleep(std::time::Duration::from_micros(us)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(format!(
        "topic {topic:?}: too much contention publishing; retry"
    )))
}

/// The offset the next event of `topic` will get minus one: the last offset
/// published (0 for a topic with no events).
pub async fn last_offset<S: Store>(
    store: &S,
    tenant: &str,
    topic: &str,
) -> Result<u64, AgentError> {
    last_of(store, KIND_TOPIC, tenant, topic).await
}

pub(crate) async fn last_of<S: Store>(
    store: &S,
    head_kind: &str,
    tenant: &str,
    topic: &str,
) -> Result<u64, AgentError> {
    Ok(store
        .get(&Key::new(head_kind, tenant, topic))
        .await?
        .map(|o| head_next(&o.body) - 1)
        .unwrap_or(0))
}

/// Up to `limit` events of `topic` with an offset greater than `after`, in order.
pub async fn read<S: Store>(
    store: &S,
    tenant: &str,
    topic: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<Event>, AgentError> {
    check_token("topic", topic, MAX_NAME)?;
    read_log(store, (KIND_TOPIC, KIND_EVENT), tenant, topic, after, limit).await
}

/// Items of a log made by [`append`] after `after`, in order.
pub(crate) async fn read_log<S: Store>(
    store: &S,
    kinds: (&str, &str),
    tenant: &str,
    topic: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<Event>, AgentError> {
    let last = last_of(store, kinds.0, tenant, topic).await?;
    let limit = limit.clamp(1, MAX_READ) as u64;
    let mut out = Vec::new();
    let mut off = after + 1;
    while off <= last && (out.len() as u64) < limit {
        if let Some(o) = store.get(&item_key(kinds.1, tenant, topic, off)).await? {
            let ev: Event = serde_json::from_value(o.body).map_err(|e| {
                AgentError::Store(StoreError::Backend(format!("event {topic}/{off}: {e}")))
            })?;
            out.push(ev);
        }
        off += 1;
    }
    Ok(out)
}

/// Like [`read`], but waits up to `wait` for at least one event.
pub async fn read_wait<S: Store>(
    store: &S,
    tenant: &str,
    topic: &str,
    after: u64,
    limit: usize,
    wait: std::time::Duration,
) -> Result<Vec<Event>, AgentError> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut wake = store.notifier();
    loop {
        wake.mark_unchanged();
        let evs = read(store, tenant, topic, after, limit).await?;
        if !evs.is_empty() {
            return Ok(evs);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(evs);
        }
        // Local commits wake us; other replicas' commits are found by polling.
        let poll = (deadline - now).min(std::time::Duration::from_millis(250));
        let _ = tokio::time::timeout(poll, wake.changed()).await;
    }
}

/// Records that `consumer` processed `topic` up to `offset`. Offsets only move
/// forward: committing an older offset keeps the newer one.
pub async fn commit_offset<S: Store>(
    store: &S,
    tenant: &str,
    topic: &str,
    consumer: &str,
    offset: u64,
) -> Result<u64, AgentError> {
    check_token("topic", topic, MAX_NAME)?;
    check_token("consumer", consumer, MAX_NAME)?;
    let key = Key::new(KIND_OFFSET, tenant, format!("{topic}/{consumer}"));
    for _ in 0..100 {
        let cur = store.get(&key).await?;
        let res = match &cur {
            Some(o) => {
                let have = o.body.get("offset").and_then(Value::as_u64).unwrap_or(0);
                if have >= offset {
                    return Ok(have);
                }
                store
                    .update(key.clone(), Some(o.version), json!({"offset": offset}))
                    .await
            }
            None => store.create(key.clone(), json!({"offset": offset})).await,
        };
        match res {
            Ok(_) => return Ok(offset),
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(format!(
        "offset of {consumer:?} on {topic:?}: too much contention; retry"
    )))
}

/// The last offset `consumer` committed on `topic` (0 if none).
pub async fn committed<S: Store>(
    store: &S,
    tenant: &str,
    topic: &str,
    consumer: &str,
) -> Result<u64, AgentError> {
    check_token("topic", topic, MAX_NAME)?;
    check_token("consumer", consumer, MAX_NAME)?;
    Ok(store
        .get(&Key::new(
            KIND_OFFSET,
            tenant,
            format!("{topic}/{consumer}"),
        ))
        .await?
        .and_then(|o| o.body.get("offset").and_then(Value::as_u64))
        .unwrap_or(0))
}
