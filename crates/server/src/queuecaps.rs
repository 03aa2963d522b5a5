//! The operator's caps on a tenant's top-level queues:
//! `GET/PUT /v1/tenants/{name}/queue-caps`.
//!
//! The cluster operator (an operator or admin of the system tenant) sets, per
//! tenant, the most total weight, guarantee and capability of the tenant's
//! top-level queues ([`QueueCaps`]); the tenant's own admins and operators then
//! cannot create or replace a top-level queue past them
//! (`ControlPlane::put_queue_caps`, checked on queue create and update). A
//! tenant's viewers may read their own tenant's caps; only system operators
//! read another's or set any.

use axum::extract::{Path, State};
use serde_json::{Value, json};
use tessera_store::{Key, Store};

use crate::api::{App, Body, R, ok};
use crate::plane::{Caller, ControlPlane, QueueCaps, kind};
use crate::problem::ApiError;

impl ControlPlane {
    /// Sets `tenant`'s caps (system operators); 404 when no such tenant.
    pub async fn set_tenant_queue_caps(
        &self,
        c: &Caller,
        tenant: &str,
        caps: QueueCaps,
    ) -> Result<Value, ApiError> {
        c.require_system(crate::auth::Role::Operator)?;
        if self
            .store()
            .get(&Key::new(kind::TENANT, "", tenant))
            .await?
            .is_none()
        {
            return Err(ApiError::not_found(format!("tenant {tenant:?}")));
        }
        let stored = self.put_queue_caps(c, tenant, caps.clone()).await?;
        Ok(caps_view(
            tenant,
            Some(caps),
            stored.get("resource_version"),
        ))
    }

    /// `tenant`'s caps as the API shows them (`caps` is null when none are set).
    pub async fn tenant_queue_caps(&self, c: &Caller, tenant: &str) -> Result<Value, ApiError> {
        let caps = self.get_queue_caps(c, tenant).await?;
        Ok(caps_view(tenant, caps, None))
    }
}

fn caps_view(tenant: &str, caps: Option<QueueCaps>, version: Option<&Value>) -> Value {
    let mut v = json!({
        "tenant": tenant,
        "caps": caps,
        "note": "the operator's caps on the sum over this tenant's top-level queues; the tenant's admins cannot exceed or change them",
    });
    if let Some(rv) = version {
        v["resource_version"] = rv.clone();
    }
    v
}

async fn get_caps(State(a): State<App>, c: Caller, Path(t): Path<String>) -> R {
    ok(a.plane.tenant_queue_caps(&c, &t).await?)
}
async fn put_caps(
    State(a): State<App>,
    c: Caller,
    Path(t): Path<String>,
    Body(b): Body<QueueCaps>,
) -> R {
    ok(a.plane.set_tenant_queue_caps(&c, &t, b).await?)
}

crate::api::routes! {
    ROUTES, routes;
    get "/v1/tenants/{name}/queue-caps" get_caps "The operator's caps on a tenant's top-level queues (its own viewers, or system operators)" None, 200;
    put "/v1/tenants/{name}/queue-caps" put_caps "Set the caps on a tenant's top-level queues: total weight, guarantee, capability (system operators)" Some("QueueCaps"), 200;
}

/// This module's OpenAPI schemas.
pub fn schemas() -> Vec<(&'static str, Value)> {
    vec![(
        "QueueCaps",
        json!({"type": "object", "additionalProperties": false, "properties": {
            "weight": {"type": "integer", "description": "Most total weight of the tenant's top-level queues"},
            "guarantee": {"$ref": "#/components/schemas/Resources", "description": "Most total guarantee"},
            "capability": {"$ref": "#/components/schemas/Resources", "description": "Most total capability; each top-level queue must then state one"}}}),
    )]
}
