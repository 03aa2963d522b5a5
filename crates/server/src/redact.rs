//! Redaction of what leaves tenant code, on the server's side of each path, and the
//! audit record of every redaction.
//!
//! The runtime guard redacts in the runtime itself (command output, files, archives,
//! agent replies, tool results); what the server serves from the store (job logs,
//! session memory, history and checkpoints, event payloads, ledger entries, spans) is
//! redacted here, on the way out, with the same guard ([`ControlPlane::guard`]), so a
//! tenant's tighter policy applies. Every redaction, wherever it happens, reaches the
//! guard's observer; [`audit_loop`] writes each as an audit entry of the tenant
//! (`system:guard` `redact`, the location and the rules with their byte offsets —
//! never the secret).

use serde_json::Value;
use tessera_sandbox::{CommandCheck, RedactionEvent};
use tessera_store::Store;
use tokio::sync::mpsc;

use crate::auth::Role;
use crate::plane::{Caller, ControlPlane, SYSTEM_TENANT, now_ms};

/// Redaction events waiting to be audited, at most (more are counted and dropped).
pub const AUDIT_QUEUE: usize = 10_000;

impl ControlPlane {
    /// `text` as it may leave for `tenant`: every secret or personal datum the guard
    /// finds replaced by `[REDACTED:<rule>]` (and audited).
    pub fn redact_text(&self, tenant: &str, location: &str, text: String) -> String {
        match self.guard().redact(Some(tenant), location, text.as_bytes()) {
            Some(b) => String::from_utf8_lossy(&b).into_owned(),
            None => text,
        }
    }

    /// Every string in `v` redacted for `tenant` (see [`ControlPlane::redact_text`]).
    pub fn redact_value(&self, tenant: &str, location: &str, mut v: Value) -> Value {
        tessera_sandbox::redact_json(&**self.guard(), Some(tenant), location, &mut v);
        v
    }
}

/// Applies `f` to every string in `v` (object keys too), replacing those it changes;
/// returns whether any changed.
pub fn redact_strings(v: &mut Value, f: &mut dyn FnMut(&str) -> Option<String>) -> bool {
    match v {
        Value::String(s) => match f(s) {
            Some(n) => {
                *s = n;
                true
            }
            None => false,
        },
        Value::Array(a) => a
            .iter_mut()
            .fold(false, |any, x| redact_strings(x, f) | any),
        Value::Object(m) => {
            let mut any = false;
            let old = std::mem::take(m);
            for (k, mut x) in old {
                any |= redact_strings(&mut x, f);
                let k = match f(&k) {
                    Some(n) => {
                        any = true;
                        n
                    }
                    None => k,
                };
                m.insert(k, x);
            }
            any
        }
        _ => false,
    }
}

/// Connects the guard's observer to a queue and returns the loop that writes the
/// queue into the audit log, until `stop`.
pub(crate) fn start_audit(
    plane: &ControlPlane,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let (tx, rx) = mpsc::channel::<RedactionEvent>(AUDIT_QUEUE);
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let d2 = dropped.clone();
    plane.guard().set_observer(std::sync::Arc::new(move |e| {
        if tx.try_send(e).is_err() {
            d2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }));
    tokio::spawn(audit_loop(plane.clone(), rx, stop, dropped))
}

/// The audit entry of one redaction: `object` names the location and each rule with
/// its byte range, as `LOCATION: rule@start..end, …`.
pub fn audit_object(e: &RedactionEvent) -> String {
    let rules: Vec<String> = e
        .findings
        .iter()
        .map(|(r, s, t)| format!("{r}@{s}..{t}"))
        .collect();
    format!("{}: {}", e.location, rules.join(", "))
}

async fn audit_loop(
    plane: ControlPlane,
    mut rx: mpsc::Receiver<RedactionEvent>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    loop {
        let e = tokio::select! {
            e = rx.recv() => match e { Some(e) => e, None => return },
            _ = stop.wait_for(|s| *s) => return,
        };
        let guard = Caller {
            tenant: e
                .tenant
                .clone()
                .unwrap_or_else(|| SYSTEM_TENANT.to_string()),
            subject: "system:guard".into(),
            key_id: String::new(),
            role: Role::Admin,
        };
        let mut object = audit_object(&e);
        let lost = dropped.swap(0, std::sync::atomic::Ordering::Relaxed);
        if lost > 0 {
            object.push_str(&format!(
                " ({lost} earlier redactions not audited: queue full)"
            ));
        }
        match plane.audit(&guard, "redact", object, now_ms()) {
            Ok(op) => {
                if let Err(err) = plane.store().commit(vec![op]).await {
                    tracing::warn!("guard: writing the audit entry of a redaction failed: {err}");
                }
            }
            Err(err) => tracing::warn!("guard: audit entry of a redaction: {err}"),
        }
    }
}
