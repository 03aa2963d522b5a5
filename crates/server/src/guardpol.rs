//! Per-tenant guard policies: `GET/PUT/DELETE /v1/guard/policy`.
//!
//! The operator's policy (`tessera up --guard-policy FILE`, else the shipped one) is
//! the *floor*. A tenant's admin may add a policy of the tenant's own (the guard's
//! YAML format, docs/guard.md); the server applies it beside the floor on every path
//! (sandboxes, agent sessions, built-in tools, job tasks, output redaction), and the
//! stricter result wins: a tenant can tighten the floor, never loosen it, whatever its
//! policy says. Tenant policies are kept in the store (kind `guardpolicy`, one per
//! tenant) and loaded at start.

use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};
use tessera_store::{Key, Store};

use crate::api::{App, Body, R, ok};
use crate::auth::Role;
use crate::plane::{Caller, ControlPlane, now_ms};
use crate::problem::ApiError;

/// The store kind of a tenant's guard policy.
pub const KIND: &str = "guardpolicy";
const NAME: &str = "policy";
/// Longest tenant policy accepted, in bytes.
pub const MAX_POLICY_BYTES: usize = 256 << 10;

/// `PUT /v1/guard/policy`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantPolicy {
    /// The policy, as guard YAML (`version: 1`, `rules`, `paths`, `decisions`, …).
    pub policy: String,
}

fn parse(tenant: &str, text: &str) -> Result<tessera_sandbox::guard::Policy, ApiError> {
    if text.len() > MAX_POLICY_BYTES {
        return Err(ApiError::invalid(
            "policy",
            format!(
                "policy: {} bytes, over the limit of {MAX_POLICY_BYTES}",
                text.len()
            ),
        ));
    }
    tessera_sandbox::guard::Policy::from_yaml(text, &format!("tenant {tenant} policy"))
        .map_err(|e| ApiError::invalid("policy", format!("policy: {e}")))
}

impl ControlPlane {
    /// Loads every tenant's policy from the store into the guard (at start).
    pub(crate) async fn load_guard_policies(&self) -> Result<usize, ApiError> {
        let mut n = 0;
        for o in self.store().list(KIND, None).await?.objects {
            let Some(text) = o.body.get("policy").and_then(Value::as_str) else {
                continue;
            };
            match parse(&o.tenant, text) {
                Ok(p) => {
                    self.guard().set_tenant_policy(&o.tenant, Some(p));
                    n += 1;
                }
                // A stored policy this version cannot read: the floor still applies.
                Err(e) => tracing::warn!(
                    "guard: tenant {:?}'s policy is not loaded ({}); the floor applies",
                    o.tenant,
                    e.detail
                ),
            }
        }
        Ok(n)
    }

    fn policy_view(&self, c: &Caller, text: Option<String>) -> Value {
        json!({
            "tenant": c.tenant,
            "floor": {"origin": self.guard().floor().origin()},
            "policy": text,
            "note": "the floor (the operator's policy) always applies; this tenant's policy is applied beside it and can only make decisions stricter",
        })
    }

    pub async fn get_guard_policy(&self, c: &Caller) -> Result<Value, ApiError> {
        c.require(Role::Viewer)?;
        let o = self.store().get(&Key::new(KIND, &c.tenant, NAME)).await?;
        let text = o.and_then(|o| {
            o.body
                .get("policy")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        Ok(self.policy_view(c, text))
    }

    pub async fn put_guard_policy(&self, c: &Caller, b: TenantPolicy) -> Result<Value, ApiError> {
        c.require(Role::Admin)?;
        let p = parse(&c.tenant, &b.policy)?;
        let key = Key::new(KIND, &c.tenant, NAME);
        let body = json!({"policy": b.policy, "updated_at_ms": now_ms()});
        let mut ops = vec![match self.store().get(&key).await? {
            Some(o) => tessera_store::Op::Update {
                key: key.clone(),
                expected: Some(o.version),
                body,
            },
            None => tessera_store::Op::Create { key, body },
        }];
        ops.push(self.audit(c, "put", "guard/policy".into(), now_ms())?);
        self.store().commit(ops).await?;
        self.guard().set_tenant_policy(&c.tenant, Some(p));
        Ok(self.policy_view(c, Some(b.policy)))
    }

    pub async fn delete_guard_policy(&self, c: &Caller) -> Result<Value, ApiError> {
        c.require(Role::Admin)?;
        let key = Key::new(KIND, &c.tenant, NAME);
        if let Some(o) = self.store().get(&key).await? {
            self.store()
                .commit(vec![
                    tessera_store::Op::Delete {
                        key,
                        expected: Some(o.version),
                    },
                    self.audit(c, "delete", "guard/policy".into(), now_ms())?,
                ])
                .await?;
        }
        self.guard().set_tenant_policy(&c.tenant, None);
        Ok(self.policy_view(c, None))
    }
}

async fn get_policy(State(a): State<App>, c: Caller) -> R {
    ok(a.plane.get_guard_policy(&c).await?)
}
async fn put_policy(State(a): State<App>, c: Caller, Body(b): Body<TenantPolicy>) -> R {
    ok(a.plane.put_guard_policy(&c, b).await?)
}
async fn delete_policy(State(a): State<App>, c: Caller) -> R {
    ok(a.plane.delete_guard_policy(&c).await?)
}

crate::api::routes! {
    ROUTES, routes;
    get "/v1/guard/policy" get_policy "The guard policy of the caller's tenant, beside the operator's floor" None, 200;
    put "/v1/guard/policy" put_policy "Set the tenant's own guard policy (admins): applied beside the floor, it can only tighten it" Some("TenantPolicy"), 200;
    delete "/v1/guard/policy" delete_policy "Remove the tenant's own guard policy (admins): the floor alone applies" None, 200;
}

/// This module's OpenAPI schemas.
pub fn schemas() -> Vec<(&'static str, Value)> {
    vec![(
        "TenantPolicy",
        json!({"type": "object", "additionalProperties": false, "required": ["policy"], "properties": {
            "policy": {"type": "string", "description": "Guard policy YAML (docs/guard.md); applied beside the operator's floor, it can only tighten it"}}}),
    )]
}
