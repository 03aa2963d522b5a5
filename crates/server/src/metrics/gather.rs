//! Gathers the tenants' [`Facts`] from the services that own them: the cluster view
//! (queues, jobs, GPUs), the sandbox API (sandboxes) and the meter's durable totals
//! (tokens and cost). Reads only what the scope may see.

use tessera_agent::meter::{self, UsageKind};
use tessera_store::{AnyStore, Store};

use super::tenants::{Facts, Scope, UsageFacts};
use crate::cluster::ClusterState;
use crate::plane::{Caller, ControlPlane, SYSTEM_TENANT, kind};
use crate::problem::ApiError;
use crate::sandboxes::SandboxesState;

/// Whose series a scrape with `authorization` (the header, if sent) gets: none
/// without a key; a system tenant's key every tenant's; another tenant's key its
/// own. A wrong key is a 401 (not a silent anonymous scrape), a session's key a 403.
pub async fn scope(plane: &ControlPlane, authorization: Option<&str>) -> Result<Scope, ApiError> {
    let Some(h) = authorization else {
        return Ok(Scope::Anonymous);
    };
    let c: Caller = plane.authenticate(Some(h)).await?;
    if let Some(s) = c.session() {
        return Err(ApiError::forbidden(format!(
            "this is the key of session {s:?}: /metrics takes a tenant's or the system's key"
        )));
    }
    Ok(if c.tenant == SYSTEM_TENANT {
        Scope::All
    } else {
        Scope::Tenant(c.tenant)
    })
}

/// Everything the tenants' families show, for the tenants `scope` sees.
pub async fn facts(
    scope: &Scope,
    cluster: &ClusterState,
    sandboxes: &SandboxesState,
    store: &AnyStore,
) -> Result<Facts, ApiError> {
    let mut f = Facts::default();
    if *scope == Scope::Anonymous {
        return Ok(f);
    }
    cluster.metric_facts(scope, &mut f).await?;
    f.sandboxes = sandboxes
        .counts()
        .into_iter()
        .filter(|((t, _, _), _)| scope.sees(t))
        .collect();
    let tenants: Vec<String> = match scope {
        Scope::Tenant(t) => vec![t.clone()],
        _ => store
            .list(kind::TENANT, Some(""))
            .await?
            .objects
            .into_iter()
            .map(|o| o.name)
            .collect(),
    };
    for t in tenants {
        let totals = meter::tenant_totals(store, &t).await?;
        if totals.records == 0 {
            continue;
        }
        let q = |k: UsageKind| totals.quantities.get(&k).copied().unwrap_or(0.0);
        let currency = meter::prices(store, &t).await?.currency;
        f.usage.insert(
            t,
            UsageFacts {
                tokens_in: q(UsageKind::TokensIn),
                tokens_cached: q(UsageKind::TokensCached),
                tokens_out: q(UsageKind::TokensOut),
                gpu_seconds: q(UsageKind::GpuSeconds),
                cpu_seconds: q(UsageKind::CpuSeconds),
                cost: totals.cost,
                currency,
            },
        );
    }
    Ok(f)
}
