//! Ledger administration: reading entries and resolving in-doubt ones.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_store::{Key, Op, Store, StoreError};

use super::{AdminError, Entry, State, ToolGateway, entry_of, index_op, kind, now_ms, to_value};

impl<S: Store> ToolGateway<S> {
    /// Ledger entries of a tenant, optionally of one session and in one state,
    /// oldest first.
    pub async fn ledger(
        &self,
        tenant: &str,
        session_id: Option<&str>,
        state: Option<State>,
    ) -> Result<Vec<Entry>, StoreError> {
        let l = self.inner.store.list(kind::LEDGER, Some(tenant)).await?;
        let mut out: Vec<Entry> = l
            .objects
            .iter()
            .filter_map(|o| entry_of(o).ok())
            .filter(|e| session_id.is_none_or(|s| e.session_id == s))
            .filter(|e| state.is_none_or(|s| e.state == s))
            .collect();
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(out)
    }

    pub async fn entry(&self, tenant: &str, id: &str) -> Result<Option<Entry>, StoreError> {
        if let Some(e) = self
            .inner
            .recent
            .lock()
            .unwrap()
            .get(&(tenant.to_string(), id.to_string()))
        {
            return Ok(Some(e.clone()));
        }
        match self
            .inner
            .store
            .get(&Key::new(kind::LEDGER, tenant, id))
            .await?
        {
            Some(o) => Ok(Some(entry_of(&o)?)),
            None => Ok(None),
        }
    }

    /// Resolves an in-doubt entry after someone checked the tool.
    pub async fn resolve(
        &self,
        tenant: &str,
        id: &str,
        r: Resolution,
        by: &str,
    ) -> Result<Entry, AdminError> {
        let key = Key::new(kind::LEDGER, tenant, id);
        let o = self
            .inner
            .store
            .get(&key)
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("ledger entry {id:?}")))?;
        let mut e = entry_of(&o)?;
        if e.state != State::InDoubt {
            return Err(AdminError::Conflict(format!(
                "ledger entry {id} is {}, not in_doubt: only in-doubt entries are resolved",
                e.state.as_str()
            )));
        }
        let now = now_ms();
        e.updated_at_ms = now;
        match r.outcome {
            ResolvedAs::Completed => {
                e.state = State::Completed;
                e.result = Some(r.result.unwrap_or(Value::Null));
            }
            ResolvedAs::Failed => {
                e.state = State::Failed;
                e.error = Some(r.error.unwrap_or_else(|| "resolved as failed".into()));
            }
            ResolvedAs::Resend => {
                e.state = State::Intended;
                e.approval = None;
            }
        }
        e.note = Some(format!(
            "resolved as {:?} by {by} at {now}{}",
            r.outcome,
            e.note
                .as_deref()
                .map(|n| format!(" (was: {n})"))
                .unwrap_or_default()
        ));
        let index = index_op(tenant, id, Some(State::InDoubt), Some(e.state));
        self.commit_indexed(
            Op::Update {
                key,
                expected: Some(o.version),
                body: to_value(&e),
            },
            index,
        )
        .await
        .map_err(|err| match err {
            StoreError::Conflict { .. } | StoreError::AlreadyExists(_) => {
                AdminError::Conflict(format!("ledger entry {id} changed meanwhile: retry"))
            }
            err => err.into(),
        })?;
        Ok(e)
    }
}

/// How an in-doubt entry was resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resolution {
    pub outcome: ResolvedAs,
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolvedAs {
    /// It happened: record this result.
    Completed,
    /// It did not happen and must not: record a failure.
    Failed,
    /// It did not happen: send it again on the next call with this key.
    Resend,
}
