//! Approvals: deciding a pending call, listing the open ones, and publishing on the
//! approvals topic.

use serde_json::{Value, json};
use tessera_store::{Key, Store, StoreError};

use super::{
    APPROVALS_TOPIC, AdminError, Decision, Entry, State, ToolGateway, entry_of, kind, now_ms,
    to_value,
};

impl<S: Store> ToolGateway<S> {
    /// Publishes on the tenant's `approvals` topic (durable; a failure is logged,
    /// the ledger entry stays the source of truth).
    pub(super) async fn publish(&self, tenant: &str, payload: Value) {
        if let Err(e) = crate::events::publish(
            &self.inner.store,
            tenant,
            APPROVALS_TOPIC,
            payload,
            now_ms(),
        )
        .await
        {
            tracing::warn!("tool gateway: publishing on {tenant}/{APPROVALS_TOPIC} failed: {e}");
        }
    }

    /// Approves or denies a pending approval (its id is the ledger id).
    pub async fn decide_approval(
        &self,
        tenant: &str,
        id: &str,
        decision: Decision,
        by: &str,
    ) -> Result<Entry, AdminError> {
        let key = Key::new(kind::LEDGER, tenant, id);
        let o = self
            .inner
            .store
            .get(&key)
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("approval {id:?}")))?;
        let mut e = entry_of(&o)?;
        let now = now_ms();
        let open = e.state == State::Intended
            && e.approval
                .as_ref()
                .is_some_and(|a| a.decision.is_none() && now < a.expires_at_ms);
        if !open {
            return Err(AdminError::Conflict(format!(
                "approval {id} is not open (the call is {}{})",
                e.state.as_str(),
                if e.approval.as_ref().is_some_and(|a| now >= a.expires_at_ms) {
                    ", and its approval expired"
                } else {
                    ""
                }
            )));
        }
        if let Some(a) = &mut e.approval {
            a.decision = Some(decision);
            a.by = Some(by.to_string());
        }
        e.updated_at_ms = now;
        self.inner
            .store
            .update(key, Some(o.version), to_value(&e))
            .await
            .map_err(|err| match err {
                StoreError::Conflict { .. } => {
                    AdminError::Conflict(format!("approval {id} changed meanwhile: retry"))
                }
                err => err.into(),
            })?;
        let d = match decision {
            Decision::Approve => "approve",
            Decision::Deny => "deny",
        };
        self.publish(tenant, json!({"approval_id": id, "decision": d, "by": by}))
            .await;
        Ok(e)
    }

    /// Open approvals of a tenant.
    pub async fn approvals(&self, tenant: &str) -> Result<Vec<Entry>, StoreError> {
        let open = self
            .inner
            .store
            .list(kind::LEDGER_OPEN, Some(tenant))
            .await?;
        let mut out = Vec::new();
        for o in &open.objects {
            if let Some(e) = self
                .inner
                .store
                .get(&Key::new(kind::LEDGER, tenant, &o.name))
                .await?
            {
                let e = entry_of(&e)?;
                if e.state == State::Intended
                    && e.approval.as_ref().is_some_and(|a| a.decision.is_none())
                {
                    out.push(e);
                }
            }
        }
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(out)
    }
}
