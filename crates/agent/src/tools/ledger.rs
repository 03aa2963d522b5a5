//! The ledger: one entry per logical tool call (per idempotency key), and the pure
//! rule that decides what a call does given the entry it finds.
//!
//! States: `intended` (waiting for an approval, or for a re-send an operator
//! asked for) -> `dispatched` (the durable write that must precede the side
//! effect; "intended" and "dispatched" are one write when nothing has to wait) ->
//! `completed` | `failed` | `in_doubt`; `denied` when an approval is refused or
//! times out. `completed`, `failed` and `denied` are final; `in_doubt` is final
//! until someone resolves it.
//!
//! A call to a tool that is read-only or honours idempotency keys is *re-send
//! safe*: it is sent without a write before it (a crash simply re-sends it with
//! the same key) and its outcome is recorded afterwards. Any other call is
//! written as `dispatched` before it is sent; if the process dies before the
//! outcome is recorded, the entry is found orphaned and marked `in_doubt`:
//! never sent again without a decision.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Where a logical call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Intended,
    Dispatched,
    Completed,
    Failed,
    InDoubt,
    Denied,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Intended => "intended",
            State::Dispatched => "dispatched",
            State::Completed => "completed",
            State::Failed => "failed",
            State::InDoubt => "in_doubt",
            State::Denied => "denied",
        }
    }

    /// Whether a repeated call just returns what is recorded.
    pub fn is_recorded(self) -> bool {
        matches!(
            self,
            State::Completed | State::Failed | State::InDoubt | State::Denied
        )
    }
}

/// An approval attached to an entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub expires_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Deny,
}

/// One ledger entry (the body of a `ledger` object; its name is `id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub id: String,
    pub session_id: String,
    pub tool_call_id: String,
    pub idempotency_key: String,
    pub tool: String,
    /// The runtime of the session, for reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// sha-256 of the canonical arguments: a key reused with other arguments is refused.
    pub args_hash: String,
    pub arguments: Value,
    pub state: State,
    /// How many times the call was sent.
    pub attempts: u32,
    /// The gateway instance that sent it last, and until when that send may run.
    pub owner: String,
    pub lease_until_ms: u64,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// Why the entry is in doubt, or how it was resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The ledger id of an idempotency key (a store name): `l-` and 32 hex digits of
/// its sha-256, so any key text is a safe name.
pub fn ledger_id(idempotency_key: &str) -> String {
    let h = Sha256::digest(idempotency_key.as_bytes());
    let mut s = String::with_capacity(34);
    s.push_str("l-");
    for b in &h[..16] {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The key used when a call names none.
pub fn default_key(session_id: &str, tool_call_id: &str) -> String {
    format!("{session_id}/{tool_call_id}")
}

/// sha-256 (hex) of the arguments in canonical form (object keys sorted).
pub fn args_hash(args: &Value) -> String {
    let mut out = String::new();
    canonical(args, &mut out);
    let h = Sha256::digest(out.as_bytes());
    h.iter().map(|b| format!("{b:02x}")).collect()
}

fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                canonical(&m[k.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// What the gateway knows about the tool when it decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traits {
    /// Read-only or honours idempotency keys.
    pub resend_safe: bool,
    pub needs_approval: bool,
}

/// What the deciding gateway knows about itself.
#[derive(Debug, Clone, Copy)]
pub struct Here<'a> {
    pub owner: &'a str,
    /// This process is the only writer of the ledger (embedded store): an entry
    /// dispatched by another owner is orphaned at once, not after its lease.
    pub exclusive: bool,
    /// This process has the call in flight right now.
    pub in_flight: bool,
    pub now_ms: u64,
}

/// What to do with a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Return what is recorded.
    Replay,
    /// The key was used for another tool or other arguments.
    KeyReused,
    /// No entry, approval needed: write `intended` with an approval and answer
    /// "pending approval".
    RequestApproval,
    /// The approval is still open: answer "pending approval".
    AwaitApproval,
    /// The approval was refused or timed out: record `denied`.
    Deny { expired: bool },
    /// Send it. `write_first`: write `dispatched` before sending (the side effect
    /// must not happen without a durable record); `from_version` tells whether an
    /// existing entry is taken over (compare-and-swap) or a new one created.
    Dispatch { write_first: bool, takeover: bool },
    /// Someone (this process or a live replica) is sending it: wait for its outcome.
    Wait,
    /// The sender died while the call was out, and re-sending is not safe.
    MarkInDoubt,
}

/// The ledger's rule. Pure: same inputs, same answer.
pub fn decide(entry: Option<&Entry>, tool: &str, hash: &str, t: Traits, here: Here<'_>) -> Action {
    let Some(e) = entry else {
        if t.needs_approval {
            return Action::RequestApproval;
        }
        return Action::Dispatch {
            write_first: !t.resend_safe,
            takeover: false,
        };
    };
    if e.tool != tool || e.args_hash != hash {
        return Action::KeyReused;
    }
    match e.state {
        s if s.is_recorded() => Action::Replay,
        State::Intended => match &e.approval {
            Some(a) => match a.decision {
                Some(Decision::Deny) => Action::Deny { expired: false },
                Some(Decision::Approve) => Action::Dispatch {
                    write_first: true,
                    takeover: true,
                },
                None if here.now_ms >= a.expires_at_ms => Action::Deny { expired: true },
                None => Action::AwaitApproval,
            },
            // An operator asked for a re-send after checking it did not happen.
            None => Action::Dispatch {
                write_first: true,
                takeover: true,
            },
        },
        _ => {
            // Dispatched.
            let alive = if e.owner == here.owner {
                here.in_flight
            } else {
                !here.exclusive && here.now_ms < e.lease_until_ms
            };
            if alive {
                Action::Wait
            } else if t.resend_safe {
                Action::Dispatch {
                    write_first: true,
                    takeover: true,
                }
            } else {
                Action::MarkInDoubt
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ledger_ids_are_stable_names() {
        let a = ledger_id("s1/c1");
        assert_eq!(a.len(), 34);
        assert_eq!(a, ledger_id("s1/c1"));
        assert_ne!(a, ledger_id("s1/c2"));
        assert_eq!(
            args_hash(&json!({"b": 1, "a": [1, {"y": 2, "x": 1}]})),
            args_hash(&json!({"a": [1, {"x": 1, "y": 2}], "b": 1}))
        );
        assert_ne!(args_hash(&json!({"a": 1})), args_hash(&json!({"a": 2})));
    }
}
