//! The call path: a call through the ledger, from the caller's checks to the send and
//! the outcome's write.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_store::{Key, Object, Op, Store, StoreError};
use tokio::sync::watch;

use super::{
    Approval, CallError, CallOutcome, CallRequest, CompiledTool, Completion, Entry, Fault,
    FlightKey, Grants, Sent, State, Status, Timing, ToolCaller, ToolGateway, ToolSecrets,
    check_session_caller, dispatch, entry_of, fresh, index_op, kind, ledger, now_ms, outcome_of,
    secrets, to_value,
};

/// The OpenTelemetry GenAI `execute_tool` span of one ended call.
fn tool_span(
    tool: &str,
    session: &str,
    tool_call_id: &str,
    out: &CallOutcome,
    started_ms: u64,
    cost: f64,
) -> crate::trace::Span {
    let status = serde_json::to_value(out.status).unwrap_or_default();
    crate::trace::Span {
        session: session.to_string(),
        span_id: format!("tool-{}", out.ledger_id),
        parent: None,
        name: format!("execute_tool {tool}"),
        operation: "execute_tool".into(),
        start_ms: started_ms,
        duration_ms: out.timing.total_us as f64 / 1e3,
        cost,
        attributes: json!({
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.conversation.id": session,
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": tool_call_id,
            "gen_ai.tool.type": "function",
            "tessera.ledger_id": out.ledger_id,
            "tessera.tool.status": status,
            "tessera.tool.fee": cost,
            "error.type": if out.status == Status::Completed { Value::Null } else { status.clone() },
        }),
    }
}

impl<S: Store> ToolGateway<S> {
    /// Calls a tool through the ledger.
    pub async fn call(
        &self,
        caller: &ToolCaller,
        tool_name: &str,
        req: CallRequest,
    ) -> Result<CallOutcome, CallError> {
        let t0 = Instant::now();
        check_session_caller(caller, &req.session_id)?;
        for (field, v) in [
            ("session_id", &req.session_id),
            ("tool_call_id", &req.tool_call_id),
        ] {
            if v.is_empty() || v.len() > 200 {
                return Err(CallError::Invalid {
                    field: field.into(),
                    message: "use 1 to 200 characters".into(),
                });
            }
        }
        let key = match &req.idempotency_key {
            Some(k) if k.is_empty() || k.len() > 256 => {
                return Err(CallError::Invalid {
                    field: "idempotency_key".into(),
                    message: "use 1 to 256 characters, or leave it out".into(),
                });
            }
            Some(k) => k.clone(),
            None => ledger::default_key(&req.session_id, &req.tool_call_id),
        };
        let id = ledger::ledger_id(&key);
        let tenant = caller.tenant.as_str();
        let store = &self.inner.store;
        let tkey = Key::new(kind::TOOL, tenant, tool_name);
        let gkey = Key::new(kind::GRANT, tenant, tool_name);
        let skey = Key::new(kind::SECRET, tenant, tool_name);
        let tck = (tenant.to_string(), tool_name.to_string());
        let sck = (tenant.to_string(), req.session_id.clone());
        let cached_tool = fresh(&self.inner.tool_cache, &tck);
        let cached_session = fresh(&self.inner.session_cache, &sck);
        let (tool_grants, runtime) = tokio::join!(
            async {
                match cached_tool {
                    Some(tg) => Ok::<_, StoreError>(tg),
                    None => {
                        let (t, g, s) =
                            tokio::join!(store.get(&tkey), store.get(&gkey), store.get(&skey));
                        let tg = (t?, g?, s?);
                        self.inner
                            .tool_cache
                            .lock()
                            .unwrap()
                            .insert(tck.clone(), (Instant::now(), tg.clone()));
                        Ok(tg)
                    }
                }
            },
            async {
                match cached_session {
                    Some(r) => Ok::<_, CallError>(r),
                    None => {
                        let r = self.session_runtime(tenant, &req.session_id).await?;
                        self.inner
                            .session_cache
                            .lock()
                            .unwrap()
                            .insert(sck.clone(), (Instant::now(), r.clone()));
                        Ok(r)
                    }
                }
            }
        );
        let (tool, grants, secrets) = tool_grants?;
        let tool = tool.ok_or_else(|| CallError::ToolNotFound(tool_name.into()))?;
        let runtime = runtime?;
        let grants: Grants = grants
            .and_then(|o| serde_json::from_value(o.body).ok())
            .unwrap_or_default();
        if !grants.admits(runtime.as_deref(), &caller.role) {
            return Err(CallError::NotGranted {
                tool: tool_name.into(),
                runtime,
                role: caller.role.clone(),
            });
        }
        let tool = self.compiled(tenant, &tool)?;
        tool.check_arguments(&req.arguments)
            .map_err(CallError::InvalidArguments)?;
        let secrets = secrets
            .as_ref()
            .map(secrets::secrets_of)
            .transpose()?
            .unwrap_or_default();
        let hash = ledger::args_hash(&req.arguments);
        let started_ms = now_ms();
        let (session, tool_call_id, fee, agent) = (
            req.session_id.clone(),
            req.tool_call_id.clone(),
            tool.spec.fee,
            runtime.clone().unwrap_or_default(),
        );
        let call = Arc::new(Call {
            tenant: tenant.to_string(),
            id,
            key,
            hash,
            runtime,
            req,
            tool,
            secrets,
        });
        let mut out = self.run(call).await?;
        out.timing.total_us = t0.elapsed().as_micros() as u64;
        tracing::info!(
            tenant = %tenant,
            session_id = %session,
            agent_id = %agent,
            tool_call_id = %tool_call_id,
            ledger_id = %out.ledger_id,
            tool = %tool_name,
            status = ?out.status,
            replayed = out.replayed,
            duration_ms = out.timing.total_us as f64 / 1000.0,
            "tool call {tool_call_id} ({tool_name}): {:?}",
            out.status
        );
        // One `execute_tool` span per call that ended (a replay or a call still
        // waiting for its approval adds none), with its fee as its cost.
        if !out.replayed
            && matches!(
                out.status,
                Status::Completed | Status::Failed | Status::Denied | Status::InDoubt
            )
        {
            let span = tool_span(
                tool_name,
                &session,
                &tool_call_id,
                &out,
                started_ms,
                if out.status == Status::Completed {
                    fee
                } else {
                    0.0
                },
            );
            if let Err(e) = crate::trace::record_span(store, tenant, span).await {
                tracing::warn!(
                    session_id = %session,
                    tool_call_id = %tool_call_id,
                    ledger_id = %out.ledger_id,
                    "tool gateway: recording the span of ledger {}: {e}",
                    out.ledger_id
                );
            }
        }
        Ok(out)
    }

    async fn run(&self, call: Arc<Call>) -> Result<CallOutcome, CallError> {
        let fk: FlightKey = (call.tenant.clone(), call.id.clone());
        let traits = ledger::Traits {
            resend_safe: call.tool.resend_safe(),
            needs_approval: call.tool.spec.approval.is_some(),
        };
        let mut optimistic = !traits.resend_safe && !traits.needs_approval;
        for _round in 0..64 {
            // A send of the same key in this process: wait for its outcome.
            let follow = self.inner.inflight.lock().unwrap().get(&fk).cloned();
            if let Some(mut rx) = follow {
                let out = rx
                    .wait_for(|o| o.is_some())
                    .await
                    .ok()
                    .and_then(|o| o.clone());
                match out {
                    Some(mut o) => {
                        o.replayed = true;
                        o.timing = Timing::default();
                        return Ok(o);
                    }
                    None => continue,
                }
            }
            let recent = self.inner.recent.lock().unwrap().get(&fk).cloned();
            // A call that must be written before it is sent skips the read on
            // its first round: creating the entry fails if one exists (then
            // the next round reads it), so the read would only cost time.
            let skip_read = optimistic && recent.is_none();
            optimistic = false;
            let (entry, version) = match recent {
                Some(e) => (Some(e), None),
                None if skip_read => (None, None),
                None => match self
                    .inner
                    .store
                    .get(&Key::new(kind::LEDGER, &call.tenant, &call.id))
                    .await?
                {
                    Some(o) => (Some(entry_of(&o)?), Some(o.version)),
                    None => (None, None),
                },
            };
            if let (None, Some(e)) = (version, entry.as_ref()) {
                // Known from memory, not yet durable: it is final (only outcomes
                // are written in the background).
                if e.tool != call.tool.spec.name || e.args_hash != call.hash {
                    return Err(CallError::KeyReused {
                        key: call.key.clone(),
                        ledger_id: call.id.clone(),
                    });
                }
                return Ok(outcome_of(e, true));
            }
            // Looked at after the store read: a send of this process either is
            // still in flight, or its outcome is in `recent` until durable.
            let in_flight = self.inner.inflight.lock().unwrap().contains_key(&fk)
                || self.inner.recent.lock().unwrap().contains_key(&fk);
            let now = now_ms();
            let action = ledger::decide(
                entry.as_ref(),
                &call.tool.spec.name,
                &call.hash,
                traits,
                ledger::Here {
                    owner: &self.inner.owner,
                    exclusive: self.inner.cfg.exclusive,
                    in_flight,
                    now_ms: now,
                },
            );
            use ledger::Action;
            match action {
                Action::Replay => return Ok(outcome_of(entry.as_ref().unwrap(), true)),
                Action::KeyReused => {
                    return Err(CallError::KeyReused {
                        key: call.key.clone(),
                        ledger_id: call.id.clone(),
                    });
                }
                Action::AwaitApproval => return Ok(outcome_of(entry.as_ref().unwrap(), true)),
                Action::RequestApproval => {
                    let ttl = call
                        .tool
                        .spec
                        .approval
                        .as_ref()
                        .map_or(0, |a| a.ttl_seconds);
                    let mut e = self.new_entry(&call, State::Intended, now);
                    e.approval = Some(Approval {
                        expires_at_ms: now + ttl * 1000,
                        decision: None,
                        by: None,
                    });
                    let mut ops = vec![Op::Create {
                        key: Key::new(kind::LEDGER, &call.tenant, &call.id),
                        body: to_value(&e),
                    }];
                    ops.extend(index_op(&call.tenant, &call.id, None, Some(e.state)));
                    match self.inner.store.commit(ops).await {
                        Ok(_) => {
                            self.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
                            self.publish(
                                &call.tenant,
                                json!({
                                    "approval_id": e.id, "event": "requested", "tool": e.tool,
                                    "session_id": e.session_id, "tool_call_id": e.tool_call_id,
                                    "arguments": e.arguments, "expires_at_ms": now + ttl * 1000,
                                }),
                            )
                            .await;
                            return Ok(outcome_of(&e, false));
                        }
                        Err(StoreError::AlreadyExists(_)) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
                Action::Deny { expired } => {
                    let mut e = entry.unwrap();
                    let before = e.state;
                    e.state = State::Denied;
                    e.updated_at_ms = now;
                    e.error = Some(if expired {
                        "nobody approved the call before its approval expired".into()
                    } else {
                        format!(
                            "denied by {}",
                            e.approval
                                .as_ref()
                                .and_then(|a| a.by.clone())
                                .unwrap_or_default()
                        )
                    });
                    match self.cas(&call.tenant, before, &e, version).await {
                        Ok(()) => {
                            if expired {
                                self.publish(
                                    &call.tenant,
                                    json!({"approval_id": e.id, "decision": "deny", "by": "timeout"}),
                                )
                                .await;
                            }
                            return Ok(outcome_of(&e, true));
                        }
                        Err(StoreError::Conflict { .. }) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
                Action::MarkInDoubt => {
                    let mut e = entry.unwrap();
                    let before = e.state;
                    e.state = State::InDoubt;
                    e.updated_at_ms = now;
                    e.note = Some(format!(
                        "sent by {} (attempt {}), which stopped before recording the outcome; the tool does not honour idempotency keys, so it is not sent again: check the tool and resolve this entry",
                        e.owner, e.attempts
                    ));
                    match self.cas(&call.tenant, before, &e, version).await {
                        Ok(()) => return Ok(outcome_of(&e, true)),
                        Err(StoreError::Conflict { .. }) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
                Action::Wait => {
                    // Another sender holds the lease: poll until it records, or
                    // its lease runs out (then the next round takes over).
                    let e = entry.unwrap();
                    if e.owner == self.inner.owner {
                        // Ours: follow it through `inflight` on the next round.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    let waited = Instant::now();
                    loop {
                        if now_ms() >= e.lease_until_ms {
                            break;
                        }
                        if waited.elapsed() >= Duration::from_secs(5) {
                            return Ok(outcome_of(&e, true));
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let o = self
                            .inner
                            .store
                            .get(&Key::new(kind::LEDGER, &call.tenant, &call.id))
                            .await?;
                        if o.map(|o| o.version) != version {
                            break;
                        }
                    }
                    continue;
                }
                Action::Dispatch {
                    write_first,
                    takeover,
                } => {
                    // Become the one sender of this key in this process.
                    let (tx, rx) = watch::channel(None);
                    {
                        let mut m = self.inner.inflight.lock().unwrap();
                        if m.contains_key(&fk) {
                            continue;
                        }
                        m.insert(fk.clone(), rx);
                    }
                    let me = self.clone();
                    let c = call.clone();
                    let fk2 = fk.clone();
                    // The send runs to its end even if the caller goes away.
                    let h = tokio::spawn(async move {
                        let r = me.lead(&c, entry, version, write_first, takeover).await;
                        if let Ok(Some(o)) = &r {
                            let _ = tx.send(Some(o.clone()));
                        }
                        me.inner.inflight.lock().unwrap().remove(&fk2);
                        r
                    });
                    match h.await {
                        Ok(Ok(Some(o))) => return Ok(o),
                        Ok(Ok(None)) => continue,
                        Ok(Err(e)) => return Err(e),
                        Err(e) => {
                            return Err(CallError::Store(StoreError::Backend(format!(
                                "the call's task stopped: {e}"
                            ))));
                        }
                    }
                }
            }
        }
        Err(CallError::Store(StoreError::Backend(
            "the ledger entry kept changing under this call: retry".into(),
        )))
    }

    fn new_entry(&self, call: &Call, state: State, now: u64) -> Entry {
        Entry {
            id: call.id.clone(),
            session_id: call.req.session_id.clone(),
            tool_call_id: call.req.tool_call_id.clone(),
            idempotency_key: call.key.clone(),
            tool: call.tool.spec.name.clone(),
            runtime: call.runtime.clone(),
            args_hash: call.hash.clone(),
            arguments: call.req.arguments.clone(),
            state,
            attempts: 0,
            owner: self.inner.owner.clone(),
            lease_until_ms: 0,
            created_at_ms: now,
            updated_at_ms: now,
            result: None,
            error: None,
            approval: None,
            note: None,
        }
    }

    /// Writes `e` over the stored entry at `version` (compare-and-swap), with
    /// its open-index change from `before`.
    async fn cas(
        &self,
        tenant: &str,
        before: State,
        e: &Entry,
        version: Option<u64>,
    ) -> Result<(), StoreError> {
        let op = Op::Update {
            key: Key::new(kind::LEDGER, tenant, &e.id),
            expected: version,
            body: to_value(e),
        };
        let index = index_op(tenant, &e.id, Some(before), Some(e.state));
        self.commit_indexed(op, index).await?;
        self.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Commits an entry's write with its open-index change. An index object
    /// found missing (an entry written before the index existed) does not
    /// hold the entry's write back.
    pub(super) async fn commit_indexed(
        &self,
        op: Op,
        index: Option<Op>,
    ) -> Result<Object, StoreError> {
        let Some(index) = index else {
            return Ok(self.inner.store.commit(vec![op]).await?.remove(0));
        };
        let deleting_index = matches!(index, Op::Delete { .. });
        match self.inner.store.commit(vec![op.clone(), index]).await {
            Ok(mut v) => Ok(v.remove(0)),
            Err(StoreError::NotFound(k)) if deleting_index && k.kind == kind::LEDGER_OPEN => {
                Ok(self.inner.store.commit(vec![op]).await?.remove(0))
            }
            Err(e) => Err(e),
        }
    }

    /// Sends a call this process leads. `Ok(None)`: lost a race, decide again.
    async fn lead(
        &self,
        call: &Call,
        entry: Option<Entry>,
        version: Option<u64>,
        write_first: bool,
        takeover: bool,
    ) -> Result<Option<CallOutcome>, CallError> {
        let now = now_ms();
        let lease =
            call.tool.timeout() * self.inner.cfg.max_attempts.max(1) + self.inner.cfg.lease_margin;
        let before = entry.as_ref().map(|e| e.state);
        let mut e = match entry {
            Some(e) => e,
            None => self.new_entry(call, State::Dispatched, now),
        };
        e.state = State::Dispatched;
        e.owner = self.inner.owner.clone();
        e.lease_until_ms = now + lease.as_millis() as u64;
        e.updated_at_ms = now;
        e.attempts += 1;
        let key = Key::new(kind::LEDGER, &call.tenant, &call.id);
        // The durable record that must precede the side effect.
        let mut version = version;
        if write_first {
            let op = if takeover {
                Op::Update {
                    key: key.clone(),
                    expected: version,
                    body: to_value(&e),
                }
            } else {
                Op::Create {
                    key: key.clone(),
                    body: to_value(&e),
                }
            };
            let index = index_op(&call.tenant, &call.id, before, Some(State::Dispatched));
            let r = self.commit_indexed(op, index).await;
            match r {
                Ok(o) => {
                    self.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
                    version = Some(o.version);
                }
                Err(StoreError::AlreadyExists(_) | StoreError::Conflict { .. }) => {
                    return Ok(None);
                }
                Err(err) => return Err(err.into()),
            }
        }
        if self.faulted(Fault::AfterIntent) {
            return Err(crashed());
        }
        let ids = dispatch::CallIds {
            tenant: &call.tenant,
            session_id: &call.req.session_id,
            tool_call_id: &call.req.tool_call_id,
            idempotency_key: &call.key,
        };
        let mut tool_us = 0u64;
        let sent = loop {
            let t = Instant::now();
            let s = self
                .inner
                .dispatcher
                .send(&call.tool, &call.secrets, &ids, &call.req.arguments)
                .await;
            tool_us += t.elapsed().as_micros() as u64;
            match s {
                Sent::Unknown(_)
                    if call.tool.resend_safe() && e.attempts < self.inner.cfg.max_attempts =>
                {
                    e.attempts += 1;
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(e.attempts))).await;
                }
                s => break s,
            }
        };
        if self.faulted(Fault::AfterSend) {
            return Err(crashed());
        }
        let now = now_ms();
        e.updated_at_ms = now;
        e.lease_until_ms = 0;
        let recorded = match sent {
            Sent::Ok(v) => {
                match call.tool.check_result(&v) {
                    Ok(()) => {
                        e.state = State::Completed;
                    }
                    Err(viol) => {
                        e.state = State::Failed;
                        e.error = Some(format!(
                            "the tool's result does not match its output_schema at {}: {}",
                            viol.path, viol.message
                        ));
                    }
                }
                e.result = Some(v);
                true
            }
            Sent::Failed(msg) => {
                e.state = State::Failed;
                e.error = Some(msg);
                true
            }
            Sent::Unknown(msg) if !call.tool.resend_safe() => {
                e.state = State::InDoubt;
                e.note = Some(format!(
                    "the outcome is unknown ({msg}) and the tool does not honour idempotency keys: check the tool and resolve this entry"
                ));
                true
            }
            Sent::Unknown(msg) | Sent::NotSent(msg) => {
                // Surely not executed, or safe to send again: record nothing, so
                // that calling again with the same key sends it again.
                e.state = State::Failed;
                e.error = Some(msg);
                false
            }
        };
        // Whatever the tool said, in a result, an error or an in-doubt note.
        self.redact_outcome(&call.tenant, &mut e);
        let out = {
            let mut o = outcome_of(&e, recorded);
            o.replayed = false;
            o.timing.tool_us = tool_us;
            o
        };
        if !recorded {
            if write_first {
                // Undo the `dispatched` record: back to no entry, or to the
                // approved (or resend-requested) intent it was taken from.
                if takeover {
                    e.state = State::Intended;
                    e.owner = self.inner.owner.clone();
                    self.inner
                        .store
                        .update(key, version, to_value(&e))
                        .await
                        .map_err(CallError::Store)?;
                } else {
                    let index = index_op(&call.tenant, &call.id, Some(State::Dispatched), None);
                    self.commit_indexed(
                        Op::Delete {
                            key,
                            expected: version,
                        },
                        index,
                    )
                    .await
                    .map_err(CallError::Store)?;
                }
                self.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Some(out));
        }
        let fee = call.tool.spec.fee;
        let usage = (e.state == State::Completed && fee > 0.0).then(|| crate::meter::UsageRecord {
            tenant: call.tenant.clone(),
            session: e.session_id.clone(),
            runtime: e.runtime.clone().unwrap_or_default(),
            kind: crate::meter::UsageKind::ToolFee,
            quantity: fee,
            at_ms: now,
            source_id: format!("tool/{}", e.id),
        });
        let (op, index) = if write_first {
            let op = Op::Update {
                key,
                expected: version,
                body: to_value(&e),
            };
            let index = index_op(
                &call.tenant,
                &call.id,
                Some(State::Dispatched),
                Some(e.state),
            );
            (op, index)
        } else {
            let op = Op::Create {
                key,
                body: to_value(&e),
            };
            (op, None)
        };
        self.record(&call.tenant, e, op, index, usage).await;
        Ok(Some(out))
    }

    /// Writes an outcome: in the background (served from memory until durable)
    /// or before the reply, as configured.
    async fn record(
        &self,
        tenant: &str,
        e: Entry,
        op: Op,
        index: Option<Op>,
        usage: Option<crate::meter::UsageRecord>,
    ) {
        let fk: FlightKey = (tenant.to_string(), e.id.clone());
        let me = self.clone();
        let lose = self.faulted(Fault::LoseOutcome);
        let write = async move {
            // The fee first: the tool answered, so the call happened. Were the
            // process to die between the two writes, the fee is kept and the
            // ledger entry is left as it was (replayed or re-sent with the same
            // key, whose fee the meter counts once); the other order would
            // lose the fee of a call the ledger records as completed.
            if let Some(u) = usage.filter(|_| !lose) {
                // Once per ledger entry: the meter counts a source id once.
                if let Err(err) = crate::meter::record(&me.inner.store, u).await {
                    tracing::warn!(
                        ledger_id = %fk.1,
                        "tool gateway: metering ledger {} failed: {err}",
                        fk.1
                    );
                }
            }
            let r = if lose {
                Err(StoreError::Closed)
            } else {
                me.commit_indexed(op, index).await.map(|_| ())
            };
            match r {
                Ok(_) => {
                    me.inner.ledger_writes.fetch_add(1, Ordering::Relaxed);
                }
                Err(StoreError::AlreadyExists(_) | StoreError::Conflict { .. }) => {
                    // Another replica recorded this key meanwhile: its record stands.
                }
                Err(StoreError::Closed) if lose => {}
                Err(err) => {
                    tracing::warn!(
                        ledger_id = %fk.1,
                        "tool gateway: recording ledger {} failed: {err}",
                        fk.1
                    );
                }
            }
            me.inner.recent.lock().unwrap().remove(&fk);
            me.inner.pending_writes.fetch_sub(1, Ordering::AcqRel);
            me.inner.written.notify_waiters();
        };
        self.inner.pending_writes.fetch_add(1, Ordering::AcqRel);
        match self.inner.cfg.completion {
            Completion::Background => {
                self.inner
                    .recent
                    .lock()
                    .unwrap()
                    .insert((tenant.to_string(), e.id.clone()), e);
                tokio::spawn(write);
            }
            Completion::BeforeReply => write.await,
        }
    }

    /// Waits until every outcome written in the background is durable.
    pub async fn flush(&self) {
        loop {
            let n = self.inner.written.notified();
            if self.inner.pending_writes.load(Ordering::Acquire) == 0 {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), n).await;
        }
    }
}

struct Call {
    tenant: String,
    id: String,
    key: String,
    hash: String,
    runtime: Option<String>,
    req: CallRequest,
    tool: CompiledTool,
    /// Its secret header values: put on the outgoing request only.
    secrets: ToolSecrets,
}

fn crashed() -> CallError {
    CallError::Store(StoreError::Backend("injected crash".into()))
}
