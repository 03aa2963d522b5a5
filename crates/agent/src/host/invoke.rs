//! Invocations: create or resume the session, run it, send `POST /invocations`, and
//! record what the agent reports.

use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{Value, json};

use crate::error::{AgentError, now_ms};
use crate::meter::{self, UsageKind, UsageRecord};
use crate::runtimes;
use crate::sessions::{self, Session, State};
use crate::trace;
use crate::unixhttp;

use super::{Host, Invocation, Invoke};

impl Host {
    /// Refuses to run a session another live host runs (its sandbox is
    /// there). Invocations are not forwarded between replicas: the caller
    /// retries, and after the owner's lease this host takes the session over.
    fn check_owner(&self, s: &Session) -> Result<(), AgentError> {
        if self.inner.cfg.exclusive || !matches!(s.state, State::Starting | State::Active) {
            return Ok(());
        }
        match &s.owner {
            Some(o) if *o != self.inner.owner && now_ms() < s.lease_until_ms => {
                Err(AgentError::Unavailable(format!(
                    "session {:?} is running on another server ({o}); retry there, or in {} s when its lease ends if that server is gone",
                    s.id,
                    (s.lease_until_ms - now_ms()).div_ceil(1000)
                )))
            }
            _ => Ok(()),
        }
    }

    /// Invokes runtime `runtime` (through `endpoint`, `DEFAULT` when `None`)
    /// in session `session_id`, creating or resuming the session.
    pub async fn invoke(
        &self,
        tenant: &str,
        runtime: &str,
        endpoint: Option<&str>,
        session_id: &str,
        payload: &[u8],
        content_type: &str,
    ) -> Result<Invocation, AgentError> {
        self.invoke_with(Invoke {
            tenant,
            runtime,
            endpoint,
            session_id,
            payload,
            content_type,
            started_by: None,
        })
        .await
    }

    /// [`Host::invoke`], saying who starts the session if this call creates it
    /// (kept as its `started_by`: whom its exchanged tokens act for).
    pub async fn invoke_with(&self, call: Invoke<'_>) -> Result<Invocation, AgentError> {
        let Invoke {
            tenant,
            runtime,
            endpoint,
            session_id,
            payload,
            content_type,
            started_by,
        } = call;
        let store = &self.inner.store;
        sessions::check_id(session_id)?;
        let (mut s, created) = match sessions::get(store, tenant, session_id).await? {
            Some(s) => (s, false),
            None => {
                let rv = runtimes::resolve(store, tenant, runtime, endpoint).await?;
                let new = sessions::NewSession {
                    id: session_id,
                    started_by,
                };
                sessions::get_or_create(store, tenant, new, &rv, now_ms()).await?
            }
        };
        if s.runtime != runtime {
            return Err(AgentError::invalid(
                "session_id",
                format!(
                    "session {session_id:?} belongs to runtime {:?}, not {runtime:?}",
                    s.runtime
                ),
            ));
        }
        let rv = runtimes::get_version(store, tenant, &s.runtime, s.version).await?;
        let t0 = Instant::now();
        let started_ms = now_ms();
        let mut last_err = String::new();
        for attempt in 0..2 {
            self.check_runnable(tenant, &s).await?;
            let slot = self.slot(tenant, session_id);
            let mut g = slot.lock().await;
            // Re-read: a kill may have happened while waiting for the slot.
            s = sessions::get(store, tenant, session_id)
                .await?
                .ok_or_else(|| AgentError::NotFound(format!("session {session_id:?}")))?;
            self.check_runnable(tenant, &s).await?;
            self.check_owner(&s)?;
            let alive = g
                .live
                .as_ref()
                .is_some_and(|l| !l.exited.load(Ordering::Acquire));
            if !alive {
                if let Some(old) = g.live.take() {
                    self.release(tenant, &s.id, old, "agent exited").await;
                }
                let live = self.start(tenant, &s, &rv).await?;
                g.live = Some(live);
            }
            let live = g.live.as_mut().expect("just started");
            live.last_used = Instant::now();
            let socket = live.socket.clone();
            let sid = s.id.clone();
            let headers = [
                ("Content-Type", content_type),
                ("X-Tessera-Session-Id", sid.as_str()),
                ("X-Amzn-Bedrock-AgentCore-Runtime-Session-Id", sid.as_str()),
            ];
            let r = unixhttp::request(
                &socket,
                "POST",
                "/invocations",
                &headers,
                payload,
                self.inner.cfg.invoke_timeout,
            )
            .await;
            live.last_used = Instant::now();
            match r {
                Ok(mut reply) => {
                    drop(g);
                    // The agent's reply is output leaving tenant code: redacted.
                    let at = format!("session {} reply", s.id);
                    if let Some(b) = self.inner.cfg.guard.redact(Some(tenant), &at, &reply.body) {
                        reply.body = b;
                        reply.headers.retain(|(k, _)| k != "content-length");
                    }
                    let duration_ms = t0.elapsed().as_secs_f64() * 1e3;
                    let s = self
                        .after_invoke(tenant, &s, &reply, started_ms, duration_ms)
                        .await?;
                    return Ok(Invocation {
                        session: s,
                        created,
                        reply,
                        duration_ms,
                    });
                }
                Err(e) => {
                    // The agent died under the call (its sandbox killed, a
                    // crash): restart it and send the invocation once more.
                    last_err = e;
                    if let Some(old) = g.live.take() {
                        self.release(tenant, &s.id, old, "agent stopped answering")
                            .await;
                    }
                    let _ = attempt;
                }
            }
        }
        Err(AgentError::Unavailable(format!(
            "session {session_id:?}: the agent did not answer /invocations: {last_err}; the session is resumable, retry"
        )))
    }

    async fn check_runnable(&self, tenant: &str, s: &Session) -> Result<(), AgentError> {
        if s.state.is_final() {
            return Err(AgentError::State(format!(
                "session {:?} is {}{}: start a new session",
                s.id,
                s.state.as_str(),
                s.reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )));
        }
        if now_ms() >= s.expires_at_ms {
            self.end(tenant, &s.id, State::Ended, "reached its maximum lifetime")
                .await?;
            return Err(AgentError::State(format!(
                "session {:?} reached its maximum lifetime: start a new session",
                s.id
            )));
        }
        if let Err(e) = meter::check_budget(&self.inner.store, tenant, &s.id).await {
            self.end(tenant, &s.id, State::Killed, &e.to_string())
                .await?;
            return Err(e);
        }
        Ok(())
    }

    async fn after_invoke(
        &self,
        tenant: &str,
        s: &Session,
        reply: &unixhttp::Reply,
        started_ms: u64,
        duration_ms: f64,
    ) -> Result<Session, AgentError> {
        let store = &self.inner.store;
        let s = sessions::update(store, tenant, &s.id, |x| {
            x.invocations += 1;
            x.last_invoked_at_ms = Some(now_ms());
            x.updated_at_ms = now_ms();
            Ok(true)
        })
        .await?;
        let inv = s.invocations;
        // Usage the agent reports: `X-Tessera-Usage: {"tokens_in": 10, ...}`.
        let mut cost = 0.0;
        let mut usage = json!({});
        if let Some(u) = reply.header("x-tessera-usage") {
            if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(u) {
                for (k, v) in m {
                    let (Ok(kind), Some(q)) =
                        (serde_json::from_value::<UsageKind>(json!(k)), v.as_f64())
                    else {
                        continue;
                    };
                    let rec = UsageRecord {
                        tenant: tenant.into(),
                        session: s.id.clone(),
                        runtime: s.runtime.clone(),
                        kind,
                        quantity: q,
                        at_ms: now_ms(),
                        source_id: format!("{}/invocation/{inv}/{}", s.id, kind.as_str()),
                    };
                    if let Ok(r) = meter::record(store, rec).await {
                        cost += r.cost;
                        usage[kind.as_str()] = json!(q);
                        if let Some(why) = r.over_budget {
                            self.kill(tenant, &s.id, &why).await?;
                        }
                    }
                }
            }
        }
        let _ = trace::record_span(
            store,
            tenant,
            trace::Span {
                session: s.id.clone(),
                span_id: format!("inv-{inv:06}"),
                parent: None,
                name: format!("invoke_agent {}", s.runtime),
                operation: "invoke_agent".into(),
                start_ms: started_ms,
                duration_ms,
                cost,
                attributes: json!({
                    "gen_ai.conversation.id": s.id,
                    "gen_ai.agent.id": s.runtime,
                    "gen_ai.agent.version": s.version,
                    "gen_ai.response.id": reply.header("x-tessera-response-id"),
                    "http.response.status_code": reply.status,
                    "gen_ai.usage.input_tokens": usage.get("tokens_in"),
                    "gen_ai.usage.output_tokens": usage.get("tokens_out"),
                    "usage": usage,
                }),
            },
        )
        .await;
        Ok(s)
    }
}
