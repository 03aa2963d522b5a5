//! Maintenance: the open index's one-time backfill and the periodic sweep.

use serde_json::json;
use tessera_store::{Key, Op, Store, StoreError};

use super::{
    State, ToolGateway, entry_of, index_op, is_open, kind, ledger, now_ms, open_key, to_value,
};

impl<S: Store> ToolGateway<S> {
    /// Puts entries written before the open index existed into it (once per
    /// store: a marker records that it was done). Run at start, before
    /// [`ToolGateway::sweep`].
    pub async fn reindex(&self) -> Result<usize, StoreError> {
        let marker = Key::new(kind::LEDGER_META, "", "indexed");
        if self.inner.store.get(&marker).await?.is_some() {
            return Ok(0);
        }
        let l = self.inner.store.list(kind::LEDGER, None).await?;
        let mut n = 0;
        for o in &l.objects {
            let Ok(e) = entry_of(o) else { continue };
            if !is_open(e.state) {
                continue;
            }
            match self
                .inner
                .store
                .create(open_key(&o.tenant, &o.name), json!({}))
                .await
            {
                Ok(_) => n += 1,
                Err(StoreError::AlreadyExists(_)) => {}
                Err(err) => return Err(err),
            }
        }
        match self
            .inner
            .store
            .create(marker, json!({"at_ms": now_ms()}))
            .await
        {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(n),
            Err(err) => Err(err),
        }
    }

    /// Housekeeping, run at start and then periodically: entries orphaned by a
    /// dead sender are marked in doubt (tools that are not re-send safe); open
    /// approvals past their time are denied. Returns how many entries changed.
    ///
    /// It reads the open index (one object per `intended` or `dispatched`
    /// entry), not the ledger: its cost follows the calls in flight and the
    /// open approvals, not the ledger's size.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        let open = self.inner.store.list(kind::LEDGER_OPEN, None).await?;
        let now = now_ms();
        let mut changed = 0;
        for ix in &open.objects {
            let entry = self
                .inner
                .store
                .get(&Key::new(kind::LEDGER, &ix.tenant, &ix.name))
                .await?;
            let open_entry = entry
                .as_ref()
                .and_then(|o| entry_of(o).ok())
                .is_some_and(|e| is_open(e.state));
            if !open_entry {
                // Not open (written by hand, or half of a lost race): drop the
                // index object, unless it changed meanwhile.
                match self.inner.store.delete(ix.key(), Some(ix.version)).await {
                    Ok(_) | Err(StoreError::NotFound(_) | StoreError::Conflict { .. }) => {}
                    Err(err) => return Err(err),
                }
                continue;
            }
            let Some(o) = entry else { continue };
            let o = &o;
            let Ok(mut e) = entry_of(o) else { continue };
            let before = e.state;
            let fk = (o.tenant.clone(), o.name.clone());
            match e.state {
                State::Dispatched => {
                    let in_flight = self.inner.inflight.lock().unwrap().contains_key(&fk)
                        || self.inner.recent.lock().unwrap().contains_key(&fk);
                    let tool = self
                        .inner
                        .store
                        .get(&Key::new(kind::TOOL, &o.tenant, &e.tool))
                        .await?
                        .and_then(|t| self.compiled(&o.tenant, &t).ok());
                    let traits = ledger::Traits {
                        // A deleted tool is treated as the unsafe kind.
                        resend_safe: tool.as_ref().is_some_and(|t| t.resend_safe()),
                        needs_approval: false,
                    };
                    let here = ledger::Here {
                        owner: &self.inner.owner,
                        exclusive: self.inner.cfg.exclusive,
                        in_flight,
                        now_ms: now,
                    };
                    // Only the in-doubt marking is done here; a re-send-safe call
                    // is re-sent with the same key when the agent calls again.
                    if ledger::decide(
                        Some(&e),
                        &e.tool.clone(),
                        &e.args_hash.clone(),
                        traits,
                        here,
                    ) != ledger::Action::MarkInDoubt
                    {
                        continue;
                    }
                    e.state = State::InDoubt;
                    e.updated_at_ms = now;
                    e.note = Some(format!(
                        "found orphaned after a restart (sent by {}, attempt {}); the tool does not honour idempotency keys, so it is not sent again: check the tool and resolve this entry",
                        e.owner, e.attempts
                    ));
                }
                State::Intended
                    if e.approval
                        .as_ref()
                        .is_some_and(|a| a.decision.is_none() && now >= a.expires_at_ms) =>
                {
                    e.state = State::Denied;
                    e.updated_at_ms = now;
                    e.error = Some("nobody approved the call before its approval expired".into());
                }
                _ => continue,
            }
            let index = index_op(&o.tenant, &o.name, Some(before), Some(e.state));
            let op = Op::Update {
                key: o.key(),
                expected: Some(o.version),
                body: to_value(&e),
            };
            match self.commit_indexed(op, index).await {
                Ok(_) => {
                    changed += 1;
                    if e.state == State::Denied {
                        self.publish(
                            &o.tenant,
                            json!({"approval_id": e.id, "decision": "deny", "by": "timeout"}),
                        )
                        .await;
                    }
                }
                Err(StoreError::Conflict { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(changed)
    }
}
